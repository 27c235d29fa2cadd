#!/usr/bin/env bash
# Wrong tokens from many sources against one reference hub: how they are answered (401,
# then 429 past each source's burst), what they cost the hub's database (audit lines and
# bytes), and whether an admin with the right token is served meanwhile.
#
#   bash bench/auth_flood.sh [SOURCES] [REQUESTS_PER_SOURCE]
#
# Each source is a loopback address of its own (127.0.x.y; curl --interface) sending its
# requests on one kept-alive connection. RAILGRID_BIN=path runs another build of the hub
# (an older one, say) against the same flood.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
SOURCES=${1:-200}
PER=${2:-100}
build_release
BIN=${RAILGRID_BIN:-./target/release/railgrid}
make_work authflood
serve_hub "$BIN"
trap 'kill -TERM $hub 2>/dev/null; wait $hub 2>/dev/null; rm -rf "$WORK"' EXIT
hub_url
# The database and its write-ahead log (SQLite reuses the log's pages once checkpointed).
db_bytes() { cat "$WORK"/hub/hub.db* 2>/dev/null | wc -c; }
"$BIN" hub --data-dir "$WORK/hub" agent list >/dev/null
before=$(db_bytes)
urls=$(for _ in $(seq "$PER"); do printf -- '-o /dev/null %s/v1/admin/agents ' "$URL"; done)
export URL WORK urls
start=$(date +%s.%N)
seq 0 $((SOURCES - 1)) | xargs -P 8 -I{} bash -c '
  n={}; addr="127.0.$((n / 250 + 1)).$((n % 250 + 2))"
  curl -sS --cacert "$WORK/hub/ca.pem" --interface "$addr" -w "%{http_code}\n" \
    -H "Authorization: Bearer rgh_wrong" $urls' >"$WORK/codes"
end=$(date +%s.%N)
# An admin with the right token, right after the flood.
admin_start=$(date +%s.%N)
"$BIN" hub --data-dir "$WORK/hub" agent list >/dev/null
admin_end=$(date +%s.%N)
# The refusals' counts reach their lines within 5 s.
sleep 6
lines=$("$BIN" hub --data-dir "$WORK/hub" audit list --json | grep -o '"seq":' | wc -l)
after=$(db_bytes)
total=$(wc -l <"$WORK/codes")
n401=$(grep -c '^401$' "$WORK/codes" || true)
n429=$(grep -c '^429$' "$WORK/codes" || true)
echo "# railgrid auth flood: $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, hub $("$BIN" version)"
awk -v t="$total" -v a="$n401" -v b="$n429" -v s="$start" -v e="$end" -v src="$SOURCES" \
  -v l="$lines" -v db0="$before" -v db1="$after" -v as="$admin_start" -v ae="$admin_end" 'BEGIN {
  secs = e - s
  printf "requests %d from %d sources in %.1f s (%.0f/s): %d answered 401, %d answered 429\n", t, src, secs, t / secs, a, b
  printf "audit lines after the flood: %d (listing shows at most 10000)\n", l
  printf "database growth: %d bytes (%.1f bytes per refused request)\n", db1 - db0, (db1 - db0) / t
  printf "an admin command with the right token right after: %.0f ms\n", (ae - as) * 1000
}'
