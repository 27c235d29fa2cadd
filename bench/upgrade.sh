#!/usr/bin/env bash
# Self-upgrade through the reference hub (self-signed TLS on 127.0.0.1), in one run:
#  1. one real host: desired version set -> the new version running (agent and runner),
#     and -> committed less the settle period; against the peer, a by-hand upgrade of the
#     same host (stop the agent, copy the binary over, start it, until its runner runs);
#  2. a release that crashes at start: desired version set -> the previous binary's agent
#     running again (the DESIGN target: within the deadline + 10 s);
#  3. N simulated agents: desired version set -> every one downloaded, checked and
#     committed, against the same N downloads alone (examples/upgrade_bench.rs).
# The binaries are the upgrade-fixture builds the tests use (unoptimised, stripped), so
# that two versions of the same source take two crate builds, not two LTO builds.
#
#   bash bench/upgrade.sh [AGENTS]
set -euo pipefail
. "$(dirname "$0")/lib.sh"
N=${1:-50}
cargo build --release --quiet --example upgrade_bench
make_work upgradebench
signed_hub 1.0.0 1.0.1
agent=
cleanup() {
  for p in $(cat "$WORK"/pids 2>/dev/null) $agent $hub; do kill -TERM "$p" 2>/dev/null || true; done
  sleep 1
  pkill -KILL -f "$WORK/bin/railgrid" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
hub_url
H agent add host --token-out "$WORK/host.token" >/dev/null
mkdir -m 755 "$WORK/bin"
: >"$WORK/agent.toml"
start_agent() {
  RAILGRID_UPGRADE_SETTLE=1s RAILGRID_UPGRADE_DEADLINE=10s RAILGRID_RUNNER_STOP_GRACE=2s \
  setsid "$WORK/bin/railgrid" agent run --config "$WORK/agent.toml" --state-dir "$WORK/state" \
    --log-dir "$WORK/log" "${USER_FLAGS[@]}" --hub "$URL" --agent-id host \
    --token-file "$WORK/host.token" --ca-file "$WORK/hub/ca.pem" --trusted-key "$KEY" \
    2>>"$WORK/agent.stderr" &
  agent=$!
}
status() { $B agent status --state-dir "$WORK/state" --json 2>/dev/null || true; }
now() { date +%s.%N; }
wait_for() { # JQ-LIKE GREP PATTERNS… (all must match the status)
  for _ in $(seq 1200); do
    s=$(status | tr -d ' \n')
    ok=1
    for p in "$@"; do echo "$s" | grep -q -- "$p" || ok=0; done
    [ $ok = 1 ] && return 0
    sleep 0.01
  done
  echo "timed out waiting for $*; status: $(status)" >&2; tail -5 "$WORK/agent.stderr" >&2; exit 1
}
ms() { awk "BEGIN { printf \"%.0f\", ($2 - $1) * 1000 }"; }

echo "# railgrid upgrade benchmark: $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores"
size=$(stat -c %s "$WORK/railgrid-1.0.1")
echo "artifact: $((size / 1024 / 1024)) MiB (upgrade-fixture build)"

# 1. One host, by the hub.
cp "$WORK/railgrid-1.0.0" "$WORK/bin/railgrid"
start_agent
wait_for '"version":"1.0.0"' '"state":"running"' '"connected":true'
publish 1.0.1 "$WORK/railgrid-1.0.1"
t0=$(now)
H desired set --fleet --version 1.0.1 >/dev/null
wait_for '"version":"1.0.1"' '"state":"running"'
t_run=$(now)
wait_for '"state":"committed"'
t_commit=$(now)
up_run=$(ms "$t0" "$t_run")
up_commit=$(( $(ms "$t0" "$t_commit") - 1000 ))

# The peer: the same host upgraded by hand (stop, copy, start, until the runner runs).
H desired set --fleet --clear version >/dev/null
t0=$(now)
kill -TERM "$agent"; while kill -0 "$agent" 2>/dev/null; do sleep 0.01; done
cp "$WORK/railgrid-1.0.0" "$WORK/bin/.railgrid.new" && mv "$WORK/bin/.railgrid.new" "$WORK/bin/railgrid"
start_agent
wait_for '"version":"1.0.0"' '"state":"running"'
t_hand=$(now)
hand=$(ms "$t0" "$t_hand")
echo "one host: desired version set -> new version running ${up_run} ms, committed (less the 1 s settle) ${up_commit} ms; by hand (stop, copy, start) ${hand} ms; ratio $(awk "BEGIN { printf \"%.2f\", $up_run / $hand }")"

# 2. A release that crashes at start, rolled back.
printf '#!/bin/sh\nif [ "$1 $2" = "version --json" ]; then echo "{\\"version\\":\\"1.0.2\\"}"; exit 0; fi\nexit 1\n' >"$WORK/crash"
chmod 755 "$WORK/crash"
publish 1.0.2 "$WORK/crash"
t0=$(now)
H desired set --fleet --version 1.0.2 >/dev/null
wait_for '"state":"rolled_back"' '"version":"1.0.0"' '"state":"running"'
t_back=$(now)
grep -o '"watcher_pid": *[0-9]*' "$WORK/state/upgrade.json" | grep -o '[0-9]*$' >>"$WORK/pids" || true
st=$(status); echo "$st" | grep -o '"pid": *[0-9]*' | head -1 | grep -o '[0-9]*$' >>"$WORK/pids" || true
echo "crash at start: desired version set -> previous version running again $(ms "$t0" "$t_back") ms (deadline 10 s)"
H release resume 1.0.2 >/dev/null

# 3. N simulated agents.
publish 1.0.3 "$WORK/railgrid-1.0.1"
./target/release/examples/upgrade_bench "$WORK/hub" "$N" 1.0.3
