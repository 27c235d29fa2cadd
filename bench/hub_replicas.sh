#!/usr/bin/env bash
# The hub benchmark (bench/hub.sh) against two hub replicas on one PostgreSQL, all on
# this machine: a PostgreSQL 15 cluster made for the run (initdb + pg_ctl, as the
# postgres account when root, on a Unix socket, default durability), two `hub serve
# --store postgres://…`, and N simulated agents split between them. Fleet changes are
# made through the first replica; half the agents learn of them through the second.
#
#   bash bench/hub_replicas.sh [AGENTS] [ROUNDS] [BUSY_CLIENTS] [BUSY_SECS]
set -euo pipefail
. "$(dirname "$0")/lib.sh"
hub_bench_args "$@"
PGBIN=$(dirname "$(command -v initdb || ls -d /usr/lib/postgresql/*/bin/initdb | sort -V | tail -1)")
[ -x "$PGBIN/initdb" ] || { echo "PostgreSQL is not installed (apt-get install postgresql)" >&2; exit 1; }
build_release hub_bench
make_work replicabench
mkdir "$WORK/sock"
AS=()
if [ "$(id -u)" = 0 ]; then
  chown postgres "$WORK/sock"
  install -d -o postgres "$WORK/pg"
  AS=(runuser -u postgres --)
fi
"${AS[@]}" "$PGBIN/initdb" -D "$WORK/pg/data" -U postgres -A trust >/dev/null
cat >>"$WORK/pg/data/postgresql.conf" <<CONF
listen_addresses = ''
unix_socket_directories = '$WORK/sock'
max_connections = 200
CONF
"${AS[@]}" "$PGBIN/pg_ctl" -D "$WORK/pg/data" -l "$WORK/pg/log" -w start >/dev/null
PSQL=(psql -X -q -At -h "$WORK/sock" -U postgres)
"${PSQL[@]}" -d postgres -c "CREATE DATABASE railgrid"
STORE="postgresql:///railgrid?host=$WORK/sock&user=postgres"
ulimit -n "$(ulimit -Hn)"
hubs=()
cleanup() {
  for h in "${hubs[@]}"; do kill -TERM "$h" 2>/dev/null || true; done
  for h in "${hubs[@]}"; do wait "$h" 2>/dev/null || true; done
  "${AS[@]}" "$PGBIN/pg_ctl" -D "$WORK/pg/data" -m fast -w stop >/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
for r in a b; do
  ./target/release/railgrid hub serve --data-dir "$WORK/$r" --listen 127.0.0.1:0 --tls-self-signed \
    --store "$STORE" --max-connections $((AGENTS + 1000)) 2>"$WORK/$r.log" &
  hubs+=($!)
done
for r in a b; do hub_url "$WORK/$r"; done
# One replica made the admin token: the other's data dir gets a copy, as an operator's would.
for r in a b; do [ -s "$WORK/$r/admin.token" ] && token="$WORK/$r/admin.token"; done
for r in a b; do [ "$WORK/$r/admin.token" = "$token" ] || install -m 600 "$token" "$WORK/$r/admin.token"; done
export BENCH_DB_XACTS="${PSQL[*]} -d railgrid -c \"SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = 'railgrid'\""
echo "# railgrid hub benchmark, 2 replicas on PostgreSQL $("$PGBIN/postgres" --version | awk '{print $3}'): $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, $AGENTS agents"
./target/release/examples/hub_bench "$WORK/a,$WORK/b" "$AGENTS" "$ROUNDS" "$BUSY" "$BUSY_SECS"
echo "postgres RSS (all its processes): $(ps -u postgres -o rss= | awk '{s+=$1} END {printf "%.1f MiB", s/1024}')"
