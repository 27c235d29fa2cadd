#!/usr/bin/env bash
# Jobs routed by labels through one reference hub (SQLite, self-signed TLS on 127.0.0.1)
# against the same jobs pinned to an agent, in one run: AGENTS simulated agents with
# LABEL_SETS label sets (each admitting MAX_JOBS at once and ending a job the moment it
# has it), submit -> the agent has the job on an idle fleet (p50/p99), jobs handed out per
# second with JOBS submitted at once, and the spread. Everything on this machine.
#
#   bash bench/hub_route.sh [AGENTS] [JOBS] [MAX_JOBS] [LABEL_SETS]
set -euo pipefail
cd "$(dirname "$0")/.."
AGENTS=${1:-1000}
JOBS=${2:-10000}
MAX_JOBS=${3:-4}
SETS=${4:-4}
cargo build --release --quiet --example hub_route_bench
cargo build --release --quiet
WORK=$(mktemp -d "${BENCH_TMP:-/tmp}/railgrid-routebench.XXXXXX")
ulimit -n "$(ulimit -Hn)"
./target/release/railgrid hub serve --data-dir "$WORK/hub" --listen 127.0.0.1:0 --tls-self-signed \
  --max-connections $((AGENTS * 2 + 1000)) 2>"$WORK/hub.log" &
hub=$!
trap 'kill -TERM $hub 2>/dev/null; wait $hub 2>/dev/null; rm -rf "$WORK"' EXIT
for _ in $(seq 200); do [ -s "$WORK/hub/hub.json" ] && break; sleep 0.05; done
echo "# railgrid routing benchmark: $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, $AGENTS agents, $JOBS jobs"
./target/release/examples/hub_route_bench "$WORK/hub" "$AGENTS" "$JOBS" "$MAX_JOBS" "$SETS"
