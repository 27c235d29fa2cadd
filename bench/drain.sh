#!/usr/bin/env bash
# Drains through the reference hub (self-signed TLS on 127.0.0.1), in one run:
#  1. two real agents (queue=build, one slot each) and a stream of selected jobs of 2 s;
#     one agent is drained while both run: every job must succeed, none may start on the
#     drained agent after the drain, and the other agent must take the next job within one
#     dispatch of its slot opening (the gap between its jobs is reported);
#  2. one real host running a 20 s job when a new version is set: the job must succeed
#     whole, and the time from the desired version to the new version running is
#     compared with the job's remaining time plus the switch time of the same upgrade on
#     an idle host, measured first.
# The binaries of part 2 are the upgrade-fixture builds the tests use.
#
#   bash bench/drain.sh [JOBS]
set -euo pipefail
. "$(dirname "$0")/lib.sh"
JOBS=${1:-12}
make_work drainbench
signed_hub 1.0.0 1.0.1 1.0.2
agents=()
cleanup() {
  for p in "${agents[@]}" $hub; do kill -TERM "$p" 2>/dev/null || true; done
  sleep 1
  pkill -KILL -f "$WORK/" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
hub_url
now_ms() { date +%s%3N; }
start_agent() { # ID BINARY [ARGS…]
  local id=$1 bin=$2
  shift 2
  mkdir -p -m 755 "$WORK/$id/bin"
  [ -e "$WORK/$id/bin/railgrid" ] || cp "$bin" "$WORK/$id/bin/railgrid"
  : >"$WORK/$id/agent.toml"
  [ -e "$WORK/$id.token" ] || H agent add "$id" --token-out "$WORK/$id.token" >/dev/null
  RAILGRID_UPGRADE_SETTLE=1s RAILGRID_UPGRADE_DEADLINE=10s RAILGRID_RUNNER_STOP_GRACE=2s \
  setsid "$WORK/$id/bin/railgrid" agent run --config "$WORK/$id/agent.toml" \
    --state-dir "$WORK/$id/state" --log-dir "$WORK/$id/log" "${USER_FLAGS[@]}" \
    --hub "$URL" --agent-id "$id" --token-file "$WORK/$id.token" --ca-file "$WORK/hub/ca.pem" \
    --trusted-key "$KEY" "$@" 2>>"$WORK/$id.stderr" &
  agents+=($!)
}
status() { $B agent status --state-dir "$WORK/$1/state" --json 2>/dev/null | tr -d ' \n' || true; }
wait_status() { # ID PATTERN…
  local id=$1
  shift
  for _ in $(seq 3000); do
    s=$(status "$id")
    ok=1
    for p in "$@"; do echo "$s" | grep -q -- "$p" || ok=0; done
    [ $ok = 1 ] && return 0
    sleep 0.01
  done
  echo "timed out waiting for $*: $(status "$id")" >&2; exit 1
}
job_field() { # ID FIELD
  H job status "$1" --json | tr -d ' \n' | sed -n "s/.*\"$2\":\([^,}]*\).*/\1/p" | tr -d '"'
}
wait_job() { # ID FIELD VALUE
  for _ in $(seq 6000); do
    [ "$(job_field "$1" "$2")" = "$3" ] && return 0
    sleep 0.01
  done
  echo "timed out waiting for job $1 $2=$3" >&2; exit 1
}

echo "# railgrid drain benchmark: $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores"

# 1. Two agents, a stream of selected 2 s jobs, one drained.
H desired set --fleet --max-jobs 1 >/dev/null
for id in a b; do start_agent "$id" "$B" --label queue=build; done
for id in a b; do wait_status "$id" '"connected":true' '"state":"running"'; done
for i in $(seq "$JOBS"); do
  H job submit --select queue=build --id "s$i" -- sleep 2 >/dev/null
done
wait_job s1 state running
wait_job s2 state running
t_drain=$(now_ms)
H agent drain a --wait >/dev/null 2>&1
for i in $(seq "$JOBS"); do wait_job "s$i" done true; done
bad=0 late=0 prev_end= gaps=()
for i in $(seq "$JOBS"); do
  [ "$(job_field "s$i" state)" = succeeded ] || bad=$((bad + 1))
done
# b's jobs in the order they started: the gap from each one's end to the next one's start.
for i in $(seq "$JOBS"); do
  echo "$(job_field "s$i" started_ms) $(job_field "s$i" finished_ms) $(job_field "s$i" agent)"
done | sort -n >"$WORK/runs"
while read -r start end agent; do
  if [ "$agent" = a ] && [ "$start" -gt "$t_drain" ]; then late=$((late + 1)); fi
  if [ "$agent" = b ]; then
    if [ -n "$prev_end" ] && [ "$start" -gt "$t_drain" ]; then gaps+=($((start - prev_end))); fi
    prev_end=$end
  fi
done <"$WORK/runs"
sorted=$(printf '%s\n' "${gaps[@]}" | sort -n)
echo "drain: $JOBS jobs of 2 s, $bad not succeeded, $late started on the drained agent after the drain"
echo "drain: the other agent took its next job $(echo "$sorted" | head -1)-$(echo "$sorted" | tail -1) ms after its previous one ended (${#gaps[@]} jobs)"
H agent resume a >/dev/null
for p in "${agents[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
for p in "${agents[@]}"; do while kill -0 "$p" 2>/dev/null; do sleep 0.05; done; done
agents=()

# 2. One host upgraded while a 20 s job runs, beside the same upgrade of an idle host.
publish 1.0.1 "$WORK/railgrid-1.0.1"
publish 1.0.2 "$WORK/railgrid-1.0.2"
start_agent u "$WORK/railgrid-1.0.0"
wait_status u '"version":"1.0.0"' '"connected":true' '"state":"running"'
t0=$(now_ms)
H desired set --agent u --version 1.0.1 >/dev/null
wait_status u '"version":"1.0.1"' '"state":"running"'
idle=$(( $(now_ms) - t0 ))
wait_status u '"state":"committed"'
H job submit --agent u --id long -- sh -c 'for i in $(seq 20); do echo "line $i"; sleep 1; done' >/dev/null
wait_job long state running
started=$(job_field long started_ms)
sleep 5
t0=$(now_ms)
H desired set --agent u --version 1.0.2 >/dev/null
wait_status u '"version":"1.0.2"' '"state":"running"'
busy=$(( $(now_ms) - t0 ))
wait_job long done true
state=$(job_field long state)
lines=$(H job logs long | wc -l)
finished=$(job_field long finished_ms)
remaining=$(( finished - t0 ))
echo "upgrade: idle host, desired version -> running ${idle} ms; with a 20 s job (${remaining} ms of it left), ${busy} ms; the job ${state} with ${lines}/20 lines; busy - (remaining + idle) = $(( busy - remaining - idle )) ms"
echo "{\"bench\":\"drain\",\"jobs\":$JOBS,\"upgrade_idle_ms\":$idle,\"upgrade_busy_ms\":$busy,\"job_left_ms\":$remaining,\"job_state\":\"$state\",\"job_lines\":$lines,\"job_started_ms\":$started}"
