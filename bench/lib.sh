# Sourced by the benchmarks: the steps they share, taken one way, so that two benchmarks
# measured side by side were also set up alike. They run from the repository's root.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# The release binary and the named examples.
build_release() {
  local ex
  for ex in "$@"; do cargo build --release --quiet --example "$ex"; done
  cargo build --release --quiet
}

# WORK: a fresh directory for one run, under $BENCH_TMP (default /tmp), that the runner's
# unprivileged account can traverse.
make_work() {
  WORK=$(mktemp -d "${BENCH_TMP:-/tmp}/railgrid-$1.XXXXXX")
  chmod 755 "$WORK"
}

# $WORK/railgrid-<version> for each version: the upgrade-fixture builds the tests use
# (unoptimised, stripped), so that two versions of one source are two crate builds, not
# two LTO builds.
fixture_builds() {
  local v
  for v in "$@"; do
    RAILGRID_BUILD_VERSION=$v cargo build --quiet --profile upgrade-fixture --bin railgrid
    cp target/upgrade-fixture/railgrid "$WORK/railgrid-$v"
  done
}

# A release signing key pair, $WORK/k.key and $WORK/k.pub, made by the binary $1; KEY is
# its public key line.
release_key() {
  "$1" release keygen --secret-key "$WORK/k.key" --public-key "$WORK/k.pub" >/dev/null
  KEY=$(sed -n 2p "$WORK/k.pub")
}

# Waits up to 20 s for the hub whose data directory is $1 (default $WORK/hub; its log
# beside it, $1.log) to say where it listens, then sets URL to it.
hub_url() {
  local dir=${1:-$WORK/hub} _
  for _ in $(seq 400); do [ -s "$dir/hub.json" ] && break; sleep 0.05; done
  [ -s "$dir/hub.json" ] || { echo "the hub at $dir did not start" >&2; cat "$dir.log" >&2 2>/dev/null; exit 1; }
  URL=$(sed -n 's/.*"url": *"\([^"]*\)".*/\1/p' "$dir/hub.json")
}

# Starts the binary $1 as a self-signed hub on loopback with data in $WORK/hub and the
# further flags given, behind the command prefix in HUB_PIN (such as `taskset -c 0`) if
# any; `hub` is its pid.
HUB_PIN=()
serve_hub() {
  local bin=$1
  shift
  "${HUB_PIN[@]}" "$bin" hub serve --data-dir "$WORK/hub" --listen 127.0.0.1:0 --tls-self-signed \
    "$@" 2>"$WORK/hub.log" &
  hub=$!
}

# The runner's account for agents started by a benchmark: nobody when run as root.
USER_FLAGS=()
if [ "$(id -u)" = 0 ]; then USER_FLAGS=(--runner-user nobody); fi

# The upgrade benchmarks' start, after `make_work`: the debug binary B, the fixture builds
# of the versions given, a release key (KEY) and a hub that trusts it.
signed_hub() {
  cargo build --quiet
  fixture_builds "$@"
  B=./target/debug/railgrid
  release_key "$B"
  serve_hub "$B" --release-key "$WORK/k.pub"
}

# The hub's admin commands, on its data directory.
H() { "$B" hub --data-dir "$WORK/hub" "$@"; }

# Signs the binary $2 as version $1 and publishes it at the hub.
publish() {
  cp "$2" "$WORK/rel-$1"
  "$B" release sign --secret-key "$WORK/k.key" --version "$1" "$WORK/rel-$1" >/dev/null
  H release publish --version "$1" --binary "$WORK/rel-$1" --signature "$WORK/rel-$1.minisig" >/dev/null
}

# The arguments of the two benchmarks that drive examples/hub_bench (bench/hub.sh on
# SQLite, bench/hub_replicas.sh on PostgreSQL), with the same defaults:
# AGENTS ROUNDS BUSY_CLIENTS BUSY_SECS.
hub_bench_args() {
  AGENTS=${1:-1000}
  ROUNDS=${2:-5}
  BUSY=${3:-64}
  BUSY_SECS=${4:-10}
}
