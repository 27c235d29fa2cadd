#!/usr/bin/env bash
# Jobs routed by labels through one reference hub (SQLite, self-signed TLS on 127.0.0.1)
# against the same jobs pinned to an agent, in one run: AGENTS simulated agents with
# LABEL_SETS label sets (each admitting MAX_JOBS at once and ending a job the moment it
# has it), submit -> the agent has the job on an idle fleet (p50/p99), jobs handed out per
# second with JOBS submitted at once, and the spread. Everything on this machine.
#
#   bash bench/hub_route.sh [AGENTS] [JOBS] [MAX_JOBS] [LABEL_SETS]
set -euo pipefail
. "$(dirname "$0")/lib.sh"
AGENTS=${1:-1000}
JOBS=${2:-10000}
MAX_JOBS=${3:-4}
SETS=${4:-4}
build_release hub_route_bench
make_work routebench
ulimit -n "$(ulimit -Hn)"
serve_hub ./target/release/railgrid --max-connections $((AGENTS * 2 + 1000))
trap 'kill -TERM $hub 2>/dev/null; wait $hub 2>/dev/null; rm -rf "$WORK"' EXIT
hub_url
echo "# railgrid routing benchmark: $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, $AGENTS agents, $JOBS jobs"
./target/release/examples/hub_route_bench "$WORK/hub" "$AGENTS" "$JOBS" "$MAX_JOBS" "$SETS"
