#!/usr/bin/env bash
# A job's egress through the runner's proxy (network `allow`) against the host's network
# (`open`), in one run, jobs of one runner taking turns: a 1 GiB HTTPS download from a
# loopback server (examples/tls_serve.rs), ROUNDS times each way; SHORT short HTTPS
# connections each way (one curl each, its own time_total); and the runner's memory while
# CONC tunnels are open at once.
#
#   bash bench/egress.sh [ROUNDS] [SHORT] [CONC]
#
# Run as root: the runner runs as nobody, with the sandbox.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
ROUNDS=${1:-3}
SHORT=${2:-1000}
CONC=${3:-100}
[ "$(id -u)" = 0 ] || { echo "run bench/egress.sh as root" >&2; exit 1; }
build_release tls_serve
make_work egress
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

./target/release/examples/tls_serve "$WORK/ca.pem" >"$WORK/port" &
pids+=($!)
for _ in $(seq 200); do [ -s "$WORK/port" ] && break; sleep 0.05; done
PORT=$(head -1 "$WORK/port")
state="$WORK/state"
mkdir -p "$state/runner"
chmod 700 "$state/runner"
chown nobody "$state/runner"
setpriv --reuid=nobody --regid=nogroup --clear-groups ./target/release/railgrid runner run \
  --state-dir "$state" --sandbox required --max-finished-jobs 100000 2>"$WORK/runner.log" &
runner=$!
pids+=($runner)
sock="$state/runner/runner.sock"
for _ in $(seq 200); do [ -S "$sock" ] && [ -s "$state/runner/api.token" ] && break; sleep 0.05; done
TOKEN=$(cat "$state/runner/api.token")
api() { curl -sS --unix-socket "$sock" -H "Authorization: Bearer $TOKEN" "$@"; }

# Submits the shell script $2 as a job with network $1; ID is its id.
submit() {
  local spec
  spec=$(jq -n --arg s "$2" --arg n "$1" --rawfile ca "$WORK/ca.pem" \
    '{argv: ["sh", "-c", $s], env: {CA_PEM: $ca}} + (if $n == "" then {} else {network: $n} end)')
  ID=$(api -X POST -H 'Content-Type: application/json' -d "$spec" http://localhost/v1/jobs | jq -r .id)
}
# Waits for job $1 to succeed; its stdout.
finish() {
  api "http://localhost/v1/jobs/$1/wait?timeout_secs=600" | jq -e '.state == "succeeded"' >/dev/null || {
    echo "job $1 failed: $(api "http://localhost/v1/jobs/$1" | jq -c '{state, error, exit_code}')" >&2
    api "http://localhost/v1/jobs/$1/output/stderr" >&2
    exit 1
  }
  api "http://localhost/v1/jobs/$1/output/stdout"
}
job() { submit "$@"; finish "$ID"; }
ALLOW="allow localhost:$PORT 127.0.0.1:$PORT"
PRE='unset NO_PROXY no_proxy; printf "%s\n" "$CA_PEM" > ca.pem'
rss() { awk '/^VmRSS/ { print $2 }' "/proc/$runner/status"; }

echo "# railgrid egress benchmark: $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, $(uname -r)"
for r in $(seq "$ROUNDS"); do
  for mode in open allow; do
    net=""; [ "$mode" = allow ] && net=$ALLOW
    speed=$(job "$net" "$PRE; curl -sS -o /dev/null --cacert ca.pem -w '%{speed_download}' https://localhost:$PORT/bytes/1073741824")
    echo "download round=$r mode=$mode MiB_per_s=$(awk -v s="$speed" 'BEGIN { printf "%.0f", s / 1048576 }')" | tee -a "$WORK/out"
  done
done
for mode in open allow; do
  net=""; [ "$mode" = allow ] && net=$ALLOW
  job "$net" "$PRE; for i in \$(seq $SHORT); do curl -sS -o /dev/null --cacert ca.pem -w '%{time_total}\n' https://localhost:$PORT/bytes/100; done" \
    | sort -n | awk -v m="$mode" '{ t[NR] = $1 } END { printf "short mode=%s p50_ms=%.3f p90_ms=%.3f n=%d\n", m, t[int(NR * 0.5)] * 1000, t[int(NR * 0.9)] * 1000, NR }' \
    | tee -a "$WORK/out"
done
# CONC slow downloads at once: the runner's memory once all their tunnels are open (two
# sockets each in the runner), against before.
before=$(rss)
fds=$(ls "/proc/$runner/fd" | wc -l)
submit "$ALLOW" "$PRE; for i in \$(seq $CONC); do curl -sS -o /dev/null --cacert ca.pem --limit-rate 32k https://localhost:$PORT/bytes/1048576 & done; wait"
for _ in $(seq 400); do
  [ "$(ls "/proc/$runner/fd" | wc -l)" -ge $((fds + 2 * CONC)) ] && break
  sleep 0.05
done
during=$(rss)
finish "$ID" >/dev/null
echo "memory runner_rss_kib_idle=$before runner_rss_kib_with_${CONC}_tunnels=$during per_tunnel_kib=$(( (during - before) / CONC ))" | tee -a "$WORK/out"

awk '
  /^download/ { split($3, m, "="); split($4, v, "="); sum[m[2]] += v[2]; n[m[2]]++ }
  /^short/ { split($2, m, "="); split($3, v, "="); p50[m[2]] = v[2] }
  END {
    printf "download through the proxy: %.2f of direct (target >= 0.8)\n", (sum["allow"] / n["allow"]) / (sum["open"] / n["open"])
    printf "added per short connection at p50: %.3f ms (target <= 1)\n", p50["allow"] - p50["open"]
  }' "$WORK/out"
