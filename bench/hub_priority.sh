#!/usr/bin/env bash
# Priority under a steady stream, one reference hub per setting of --priority-aging, in
# one run: a priority-0 job submitted into a stream of priority-100 jobs faster than the
# one simulated agent can run them (examples/hub_priority_bench.rs). Strict priority
# (0) starves it until the stream ends and its backlog is done; with aging it waits about
# 100 × the aging step plus the jobs ranked before it.
#
#   bash bench/hub_priority.sh [STREAM_SECS] [RATE_PER_S] [HOLD_MS] [AGING…]
set -euo pipefail
. "$(dirname "$0")/lib.sh"
STREAM=${1:-60}
RATE=${2:-30}
HOLD=${3:-50}
shift $(($# < 3 ? $# : 3))
AGINGS=("${@:-0 100ms 200ms}")
read -r -a AGINGS <<<"${AGINGS[*]}"
build_release hub_priority_bench
echo "# railgrid priority benchmark: $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, a ${STREAM}s stream at $RATE/s, jobs of ${HOLD}ms"
for aging in "${AGINGS[@]}"; do
  make_work priobench
  serve_hub ./target/release/railgrid --priority-aging "$aging"
  hub_url
  echo "--priority-aging $aging: $(./target/release/examples/hub_priority_bench "$WORK/hub" "$STREAM" "$RATE" "$HOLD")"
  kill -TERM "$hub"
  wait "$hub" 2>/dev/null || true
  rm -rf "$WORK"
done
