#!/usr/bin/env bash
# Jobs through the reference hub (self-signed TLS on 127.0.0.1) against the same jobs on
# the agent's runner socket, in one run: throughput of trivial jobs (`true`), CONCURRENCY
# clients each submitting and waiting, and all JOBS submitted at once; and submit -> first
# output byte (p50/p99). Hub, agent, runner and clients all on this machine.
#
#   bash bench/hub_jobs.sh [JOBS] [CONCURRENCY]
set -euo pipefail
. "$(dirname "$0")/lib.sh"
JOBS=${1:-500}
CONC=${2:-4}
build_release hub_job_bench
BIN=./target/release/railgrid
make_work hubjobbench
serve_hub "$BIN" --max-open-jobs $((JOBS + 100))
agent=
trap 'kill -TERM $agent $hub 2>/dev/null; wait $agent $hub 2>/dev/null; rm -rf "$WORK"' EXIT
hub_url
$BIN hub --data-dir "$WORK/hub" agent add bench --token-out "$WORK/bench.token" >/dev/null
printf '[runner]\nmax_jobs = %s\n' "$CONC" >"$WORK/agent.toml"
chmod 600 "$WORK/agent.toml"
$BIN agent run --config "$WORK/agent.toml" --state-dir "$WORK/state" --log-dir "$WORK/log" \
  "${USER_FLAGS[@]}" --hub "$URL" --agent-id bench --token-file "$WORK/bench.token" \
  --ca-file "$WORK/hub/ca.pem" 2>/dev/null &
agent=$!
for _ in $(seq 400); do
  $BIN hub --data-dir "$WORK/hub" agent show bench --json 2>/dev/null | grep -q '"connected":true' \
    && [ -S "$WORK/state/runner/runner.sock" ] && break
  sleep 0.05
done
echo "# railgrid hub job benchmark: $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, $JOBS jobs, $CONC clients"
./target/release/examples/hub_job_bench "$WORK/hub" bench "$WORK/state/runner/runner.sock" "$JOBS" "$CONC"
