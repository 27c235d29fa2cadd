#!/usr/bin/env bash
# Job throughput of the runner (trivial `true` jobs through the full API path, with durable
# records) against a raw fork/exec/wait loop in the same run, and the latency from submit to
# a job's first output byte.
#
#   bash bench/jobs.sh [JOBS] [CONCURRENCY]
set -euo pipefail
. "$(dirname "$0")/lib.sh"
JOBS=${1:-2000}
CONC=${2:-4}
build_release job_bench
make_work jobbench
mkdir -p "$WORK/state/runner"
chmod 700 "$WORK/state/runner"
RUN=()
if [ "$(id -u)" = 0 ]; then
  chown nobody "$WORK/state/runner"
  RUN=(setpriv --reuid=nobody --regid=nogroup --clear-groups)
fi
"${RUN[@]}" ./target/release/railgrid runner run --state-dir "$WORK/state" --max-finished-jobs 100000 --max-jobs "$CONC" 2>"$WORK/runner.log" &
runner=$!
trap 'kill -TERM $runner 2>/dev/null; wait $runner 2>/dev/null; rm -rf "$WORK"' EXIT
for _ in $(seq 100); do [ -S "$WORK/state/runner/runner.sock" ] && break; sleep 0.05; done
echo "# railgrid job benchmark: $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, $JOBS jobs, $CONC clients"
./target/release/examples/job_bench "$WORK/state/runner/runner.sock" "$JOBS" "$CONC"
