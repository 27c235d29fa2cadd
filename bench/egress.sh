#!/usr/bin/env bash
# A job's egress through the runner's proxy (network `allow`) against the host's network
# (`open`) and against a peer proxy (tinyproxy, reached from an `open` job), in one run,
# jobs of one runner taking turns: a 1 GiB HTTPS download from a loopback server
# (examples/tls_serve.rs), ROUNDS times each way, with the CPU time the runner and the
# peer spent on it; SHORT short HTTPS connections each way (one curl each, its own
# time_total); and the runner's memory while CONC tunnels are open at once.
#
#   bash bench/egress.sh [ROUNDS] [SHORT] [CONC]
#
# Run as root: the runner runs as nobody, with the sandbox.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
ROUNDS=${1:-5}
SHORT=${2:-1000}
CONC=${3:-100}
[ "$(id -u)" = 0 ] || { echo "run bench/egress.sh as root" >&2; exit 1; }
command -v tinyproxy >/dev/null || { echo "bench/egress.sh needs tinyproxy: scripts/install-test-prerequisites.sh --bench" >&2; exit 1; }
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
PEER_PORT=$((PORT + 1))
cat >"$WORK/tinyproxy.conf" <<EOF
Port $PEER_PORT
Listen 127.0.0.1
User nobody
Group nogroup
Timeout 600
MaxClients 200
ConnectPort $PORT
LogLevel Error
EOF
tinyproxy -d -c "$WORK/tinyproxy.conf" 2>"$WORK/tinyproxy.log" &
pids+=($!)
peer=$!
for _ in $(seq 200); do curl -s -o /dev/null "http://127.0.0.1:$PEER_PORT/" && break; sleep 0.05; done
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
# CPU time (user and system) process $1 has spent, in clock ticks.
ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
seconds() { awk -v t="$1" -v hz="$(getconf CLK_TCK)" 'BEGIN { printf "%.2f", t / hz }'; }
# The job's network and the curl option that pick the path for mode $1.
path() {
  case $1 in
    open) NET=""; VIA="" ;;
    allow) NET=$ALLOW; VIA="" ;;
    peer) NET=""; VIA="-x http://127.0.0.1:$PEER_PORT" ;;
  esac
}

echo "# railgrid egress benchmark: $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, $(uname -r)"
for r in $(seq "$ROUNDS"); do
  for mode in open allow peer; do
    path "$mode"
    r0=$(ticks "$runner"); p0=$(ticks "$peer")
    speed=$(job "$NET" "$PRE; curl -sS -o /dev/null --cacert ca.pem $VIA -w '%{speed_download}' https://localhost:$PORT/bytes/1073741824")
    echo "download round=$r mode=$mode MiB_per_s=$(awk -v s="$speed" 'BEGIN { printf "%.0f", s / 1048576 }')" \
      "runner_cpu_s=$(seconds $(( $(ticks "$runner") - r0 ))) peer_cpu_s=$(seconds $(( $(ticks "$peer") - p0 )))" \
      | tee -a "$WORK/out"
  done
done
for mode in open allow peer; do
  path "$mode"
  job "$NET" "$PRE; for i in \$(seq $SHORT); do curl -sS -o /dev/null --cacert ca.pem $VIA -w '%{time_total}\n' https://localhost:$PORT/bytes/100; done" \
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
  /^download/ {
    split($2, r, "="); split($3, m, "="); split($4, v, "=")
    speed[r[2], m[2]] = v[2]; sum[m[2]] += v[2]; n[m[2]]++; rounds = r[2]
  }
  /^short/ { split($2, m, "="); split($3, v, "="); p50[m[2]] = v[2] }
  # The median over rounds of a round'"'"'s ratio to its own direct download.
  function median(mode,   i, j, k, x, a) {
    for (i = 1; i <= rounds; i++) a[i] = speed[i, mode] / speed[i, "open"]
    for (i = 2; i <= rounds; i++) { x = a[i]; for (j = i - 1; j >= 1 && a[j] > x; j--) a[j + 1] = a[j]; a[j + 1] = x }
    k = int((rounds + 1) / 2)
    return rounds % 2 ? a[k] : (a[k] + a[k + 1]) / 2
  }
  END {
    printf "download through the proxy: %.2f of direct by means, %.2f the median of rounds (target >= 0.8)\n", (sum["allow"] / n["allow"]) / (sum["open"] / n["open"]), median("allow")
    printf "download through tinyproxy: %.2f of direct by means, %.2f the median of rounds\n", (sum["peer"] / n["peer"]) / (sum["open"] / n["open"]), median("peer")
    printf "added per short connection at p50: %.3f ms through the proxy (target <= 1), %.3f ms through tinyproxy\n", p50["allow"] - p50["open"], p50["peer"] - p50["open"]
  }' "$WORK/out"
