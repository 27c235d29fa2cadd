#!/usr/bin/env bash
# Rollouts through one reference hub (SQLite, self-signed TLS on 127.0.0.1), side by side
# with the same versions set for the whole fleet at once, in one run: AGENTS simulated
# agents (examples/rollout_bench.rs) that report each upgrade as a real agent does and
# take SETTLE_MS from download to commit (or to a rollback, for a release that crashes
# at start). Measured: start -> 100 % committed and the most agents upgrading at once
# (default waves 1,10%,50%,100%, soak 0), and for a crash-at-start release the agents
# that were ever sent it and the time to the halt. The artifacts are 1 MiB files: the
# download path is bench/upgrade.sh's; this one measures the waves.
#
#   bash bench/rollout.sh [AGENTS] [SETTLE_MS] [MAX_PARALLEL]
set -euo pipefail
. "$(dirname "$0")/lib.sh"
AGENTS=${1:-200}
SETTLE=${2:-1000}
PARALLEL=${3:-10}
build_release rollout_bench
B=./target/release/railgrid
make_work rolloutbench
ulimit -n "$(ulimit -Hn)"
release_key "$B"
serve_hub "$B" --release-key "$WORK/k.pub" --max-connections $((AGENTS * 2 + 100))
trap 'kill -TERM $hub 2>/dev/null; wait $hub 2>/dev/null; rm -rf "$WORK"' EXIT
hub_url
for v in 1.0.1 1.0.2 1.0.3 1.0.4; do
  head -c 1048576 /dev/urandom >"$WORK/rel-$v"
  $B release sign --secret-key "$WORK/k.key" --version "$v" "$WORK/rel-$v" >/dev/null
  $B hub --data-dir "$WORK/hub" release publish --version "$v" --binary "$WORK/rel-$v" \
    --signature "$WORK/rel-$v.minisig" >/dev/null
done
echo "# railgrid rollout benchmark: $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, $AGENTS agents"
./target/release/examples/rollout_bench "$WORK/hub" "$AGENTS" "$SETTLE" "$PARALLEL" \
  1.0.1 1.0.2 1.0.3 1.0.4
