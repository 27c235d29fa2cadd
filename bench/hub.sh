#!/usr/bin/env bash
# N simulated agents long-polling one reference hub (SQLite, self-signed TLS on 127.0.0.1),
# both on this machine: polls held, hub RSS and CPU at idle, fleet change -> every agent
# (p50/p99), reconciles/s with the hub's CPU per reconcile, and the cost of a metrics scrape.
#
#   bash bench/hub.sh [AGENTS] [ROUNDS] [BUSY_CLIENTS] [BUSY_SECS]
#
# PIN=1 puts the hub on CPU 0 and the simulated agents on CPU 1 (taskset), so that the
# agents' own TLS and JSON work does not delay the hub's answers.
set -euo pipefail
cd "$(dirname "$0")/.."
AGENTS=${1:-1000}
ROUNDS=${2:-5}
BUSY=${3:-64}
BUSY_SECS=${4:-10}
cargo build --release --quiet --example hub_bench
cargo build --release --quiet
WORK=$(mktemp -d "${BENCH_TMP:-/tmp}/railgrid-hubbench.XXXXXX")
ulimit -n "$(ulimit -Hn)"
HUB_PIN=()
CLIENT_PIN=()
if [ "${PIN:-0}" = 1 ]; then
  HUB_PIN=(taskset -c 0)
  CLIENT_PIN=(taskset -c 1)
fi
"${HUB_PIN[@]}" ./target/release/railgrid hub serve --data-dir "$WORK/hub" --listen 127.0.0.1:0 --tls-self-signed \
  --max-connections $((AGENTS + 1000)) 2>"$WORK/hub.log" &
hub=$!
trap 'kill -TERM $hub 2>/dev/null; wait $hub 2>/dev/null; rm -rf "$WORK"' EXIT
for _ in $(seq 200); do [ -s "$WORK/hub/hub.json" ] && break; sleep 0.05; done
echo "# railgrid hub benchmark: $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, $AGENTS agents, pinned: ${PIN:-0}"
"${CLIENT_PIN[@]}" ./target/release/examples/hub_bench "$WORK/hub" "$AGENTS" "$ROUNDS" "$BUSY" "$BUSY_SECS"
