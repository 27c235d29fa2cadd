#!/usr/bin/env bash
# N simulated agents long-polling one reference hub (SQLite, self-signed TLS on 127.0.0.1),
# both on this machine: polls held, hub RSS and CPU at idle, fleet change -> every agent
# (p50/p99), reconciles/s with the hub's CPU per reconcile, and the cost of a metrics scrape.
#
#   bash bench/hub.sh [AGENTS] [ROUNDS] [BUSY_CLIENTS] [BUSY_SECS]
#
# PIN=1 puts the hub on CPU 0 and the simulated agents on CPU 1 (taskset), so that the
# agents' own TLS and JSON work does not delay the hub's answers.
#
# Then its peer, in the same run: etcd 3.4 (`etcd` on PATH; Debian `etcd-server`) with as
# many watchers of one key over TLS, one Put at a time (examples/etcd_bench.rs, built with
# `--features etcd-bench`, which needs `protoc`: Debian `protobuf-compiler` and
# `libprotobuf-dev`). ETCD_CONNECTIONS spreads the watchers over that many connections
# (default: one each, as the agents have). ETCD=0 leaves etcd out. The last line is one
# JSON object with both.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
hub_bench_args "$@"
ETCD=${ETCD:-1}
if [ "$ETCD" = 1 ]; then
  for tool in etcd protoc; do
    if ! command -v "$tool" >/dev/null; then
      echo "bench/hub.sh: $tool is missing: apt-get install -y etcd-server protobuf-compiler libprotobuf-dev (or ETCD=0)" >&2
      exit 1
    fi
  done
  # One build of everything with the feature, rather than two of the crate.
  cargo build --release --quiet --features etcd-bench --bin railgrid --example hub_bench --example etcd_bench
else
  cargo build --release --quiet --bin railgrid --example hub_bench
fi
make_work hubbench
ulimit -n "$(ulimit -Hn)"
CLIENT_PIN=()
if [ "${PIN:-0}" = 1 ]; then
  HUB_PIN=(taskset -c 0)
  CLIENT_PIN=(taskset -c 1)
fi
serve_hub ./target/release/railgrid --max-connections $((AGENTS + 1000))
# The hub is stopped before etcd starts: the trap must not fail on a hub already gone.
trap 'kill -TERM $hub 2>/dev/null || true; wait $hub 2>/dev/null || true; rm -rf "$WORK"' EXIT
hub_url
echo "# railgrid hub benchmark: $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, $AGENTS agents, pinned: ${PIN:-0}"
"${CLIENT_PIN[@]}" ./target/release/examples/hub_bench "$WORK/hub" "$AGENTS" "$ROUNDS" "$BUSY" "$BUSY_SECS" \
  | tee "$WORK/hub.out"
kill -TERM $hub 2>/dev/null && wait $hub 2>/dev/null || true
hub_json=$(grep '^{.*"bench":"hub"' "$WORK/hub.out")
field() { sed -n "s/.*\"$1\":\([^,}]*\).*/\1/p" <<<"$2"; }
if [ "$ETCD" != 1 ]; then
  echo "$hub_json"
  exit 0
fi
echo "# etcd beside it: $AGENTS watchers, $ROUNDS Puts"
BENCH_TMP=${BENCH_TMP:-/tmp} ./target/release/examples/etcd_bench "$AGENTS" "$ROUNDS" "${ETCD_CONNECTIONS:-$AGENTS}" \
  | tee "$WORK/etcd.out"
etcd_json=$(grep '^{.*"bench":"etcd"' "$WORK/etcd.out")
printf '{"bench":"hub","agents":%s,"p50_ms":%s,"p99_ms":%s,"etcd_p50_ms":%s,"etcd_p99_ms":%s,"rss_per_1000_mib":%s,"etcd_rss_per_1000_mib":%s,"etcd_connections":%s}\n' \
  "$AGENTS" "$(field p50_ms "$hub_json")" "$(field p99_ms "$hub_json")" \
  "$(field p50_ms "$etcd_json")" "$(field p99_ms "$etcd_json")" \
  "$(field rss_per_1000_mib "$hub_json")" "$(field rss_per_1000_mib "$etcd_json")" \
  "$(field connections "$etcd_json")"
