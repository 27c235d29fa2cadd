#!/usr/bin/env bash
# Secrets' costs, in one run, on one hub with one agent (self-signed TLS on 127.0.0.1):
# - output: a job printing 1 GiB of text with ten secrets given (every byte through the
#   runner's masking) against the same job with none, ROUNDS times each way, taking turns;
#   once with the job and the runner free on every core, once with both on one core
#   (`taskset` on the runner, whose jobs inherit it), where every cycle of masking is on
#   the output's path and the scheduler's placement of three processes on two cores,
#   which moves a free round by up to a third, no longer does;
# - `hub secret set` (seal, compared write) against `hub desired set` (a store write of the
#   same admin API), SETS times each, one CLI process a call;
# - dispatch: `hub job submit --wait -- true` with ten secrets (unsealed as the answer
#   leaves, an audit line) against none, JOBS times each, taking turns.
#
# Output is also measured as the runner's own CPU time (user + system, from /proc) for
# each job: what masking costs the host. Ratios are of medians.
#
#   [ONE_WRITER=1] bash bench/secrets.sh [ROUNDS] [SETS] [JOBS]
set -euo pipefail
. "$(dirname "$0")/lib.sh"
ROUNDS=${1:-5}
SETS=${2:-50}
JOBS=${3:-30}
build_release
BIN=./target/release/railgrid
make_work secrets
serve_hub "$BIN"
agent=
trap 'kill -TERM $agent $hub 2>/dev/null; wait $agent $hub 2>/dev/null; rm -rf "$WORK"' EXIT
hub_url
H() { "$BIN" hub --data-dir "$WORK/hub" "$@"; }
H agent add bench --token-out "$WORK/bench.token" >/dev/null
"$BIN" agent run --state-dir "$WORK/state" --log-dir "$WORK/log" "${USER_FLAGS[@]}" \
  --hub "$URL" --agent-id bench --token-file "$WORK/bench.token" \
  --ca-file "$WORK/hub/ca.pem" 2>/dev/null &
agent=$!
for _ in $(seq 400); do
  H agent show bench --json 2>/dev/null | grep -q '"connected":true' \
    && [ -S "$WORK/state/runner/runner.sock" ] && break
  sleep 0.05
done
ms() { echo $(( $(date +%s%N) / 1000000 )); }
p50() { sort -n | awk '{ t[NR] = $1 } END { print t[int((NR + 1) / 2)] }'; }

echo "# railgrid secrets benchmark: $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, $(uname -r)"
flags=()
for i in $(seq 10); do
  head -c 15 /dev/urandom | base64 >"$WORK/s$i"
  H secret set "S$i" --from-file "$WORK/s$i" >/dev/null
  flags+=(--secret-file "S$i=$WORK/s$i")
done

# Output: 1 GiB of build-log-like text, through the runner's own socket.
J() { "$BIN" job --state-dir "$WORK/state" "$@"; }
LINE='"   Compiling railgrid v0.1.0 (/work/src/runner/job/spool.rs:139) in 0.42s"'
PRINT="yes $LINE | head -c 1073741824"
# ONE_WRITER=1: the job writes from one process (`cat` of 64 MiB, 16 times), so the free
# cores hold two busy processes, the writer and the runner, rather than three.
[ "${ONE_WRITER:-0}" = 1 ] && PRINT="yes $LINE | head -c 67108864 >log && for i in \$(seq 16); do cat log; done"
runner=$(head -n1 "$WORK/state/runner/runner.lock")
tick=$(getconf CLK_TCK)
cpu_ms() { awk -v t="$tick" '{ print int(($14 + $15) * 1000 / t) }' "/proc/$runner/stat"; }
all_cores=0-$(( $(nproc) - 1 ))
for place in free one; do
  case $place in
    free) taskset -a -cp "$all_cores" "$runner" >/dev/null ;;
    one) taskset -a -cp 1 "$runner" >/dev/null ;;
  esac
  for r in $(seq "$ROUNDS"); do
    for mode in none ten; do
      args=(); [ "$mode" = ten ] && args=("${flags[@]}")
      t0=$(ms); c0=$(cpu_ms)
      id=$(J submit "${args[@]}" --detach -- sh -c "$PRINT")
      J wait "$id" >/dev/null
      echo "output place=$place round=$r mode=$mode ms=$(( $(ms) - t0 ))" \
        "runner_cpu_ms=$(( $(cpu_ms) - c0 ))" | tee -a "$WORK/out"
    done
  done
done
taskset -a -cp "$all_cores" "$runner" >/dev/null

# The admin API's writes.
for i in $(seq "$SETS"); do
  t0=$(ms); H secret set S1 --from-file "$WORK/s$(( i % 10 + 1 ))" >/dev/null; echo $(( $(ms) - t0 ))
done | p50 | sed 's/^/set secret_set_p50_ms=/' | tee -a "$WORK/out"
for i in $(seq "$SETS"); do
  t0=$(ms); H desired set --agent bench --max-jobs $(( i % 5 + 4 )) >/dev/null; echo $(( $(ms) - t0 ))
done | p50 | sed 's/^/set desired_set_p50_ms=/' | tee -a "$WORK/out"
H secret set S1 --from-file "$WORK/s1" >/dev/null

# Dispatch: submit to the end of a trivial job, through the hub and the agent.
named=()
for i in $(seq 10); do named+=(--secret "S$i"); done
for mode in none ten; do : >"$WORK/dispatch-$mode"; done
for i in $(seq "$JOBS"); do
  for mode in none ten; do
    args=(); [ "$mode" = ten ] && args=("${named[@]}")
    t0=$(ms)
    H job submit --agent bench "${args[@]}" --wait -- true >/dev/null
    echo $(( $(ms) - t0 )) >>"$WORK/dispatch-$mode"
  done
done
for mode in none ten; do
  echo "dispatch mode=$mode p50_ms=$(p50 <"$WORK/dispatch-$mode")" | tee -a "$WORK/out"
done

# The median of one field over the output rounds of a placement and mode.
median() {
  awk -v p="place=$1" -v m="mode=$2" -v f="$3" '$1 == "output" && $2 == p && $4 == m {
    for (i = 5; i <= NF; i++) if (index($i, f "=") == 1) print substr($i, length(f) + 2)
  }' "$WORK/out" | p50
}
for place in free one; do
  none=$(median "$place" none ms) ten=$(median "$place" ten ms)
  echo "output ($place): ten secrets $ten ms, none $none ms at the median:" \
    "$(awk -v a="$none" -v b="$ten" 'BEGIN { printf "%.2f", a / b }') of the throughput (target >= 0.9);" \
    "runner CPU $(median "$place" ten runner_cpu_ms) against $(median "$place" none runner_cpu_ms) ms"
done
awk '
  /^set/ { split($2, v, "="); set[v[1]] = v[2] }
  /^dispatch/ { split($2, m, "="); split($3, v, "="); d[m[2]] = v[2] }
  END {
    printf "secret set: %d ms at p50 (desired set: %d ms)\n", set["secret_set_p50_ms"], set["desired_set_p50_ms"]
    printf "dispatch with ten secrets: %+d ms at p50 (%d against %d)\n", d["ten"] - d["none"], d["ten"], d["none"]
  }' "$WORK/out"
