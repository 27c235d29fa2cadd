#!/usr/bin/env bash
# A job's sandbox against its peers, in one run: the start of a bare program (a fork/exec
# loop), of one under bubblewrap with the same namespaces (and with --unshare-all, a
# network namespace too), and of a podman container (runc, a local image); then the
# runner's job start (submit to first byte) and throughput with the sandbox off and on.
#
#   bash bench/sandbox.sh [STARTS] [JOBS] [CONCURRENCY]
#
# Run as root: programs, bubblewrap and the runners run as nobody, podman as root. The
# podman image is imported from the Debian root file system the tests under a real
# systemd build (`cargo test --test it systemd` makes it once).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
STARTS=${1:-300}
JOBS=${2:-2000}
CONC=${3:-4}
PODMAN_STARTS=10
IMAGE=localhost/railgrid-bench:debian
[ "$(id -u)" = 0 ] || { echo "run bench/sandbox.sh as root" >&2; exit 1; }
for tool in bwrap podman runc; do
  command -v "$tool" >/dev/null || {
    echo "$tool is missing: bash scripts/install-test-prerequisites.sh --bench" >&2
    exit 1
  }
done
build_release job_bench
make_work sandbox
AS_NOBODY=(setpriv --reuid=nobody --regid=nogroup --clear-groups)
runners=()
cleanup() {
  for pid in "${runners[@]}"; do kill -TERM "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

# Milliseconds per run of the command given, run STARTS times in a row by one shell.
per_start() {
  local n=$1
  shift
  "$@" bash -c '
    n=$1; shift
    t0=$(date +%s%N)
    for _ in $(seq "$n"); do "$@" >/dev/null || exit 1; done
    t1=$(date +%s%N)
    awk -v d=$((t1 - t0)) -v n="$n" "BEGIN { printf \"%.3f\", d / n / 1e6 }"' _ "$n" "${CMD[@]}"
}

echo "# railgrid sandbox benchmark: $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, $(uname -r)"
CMD=(/bin/true)
raw=$(per_start "$STARTS" "${AS_NOBODY[@]}")
CMD=(bwrap --unshare-user --unshare-pid --unshare-ipc --unshare-uts --unshare-cgroup-try
  --ro-bind / / --dev /dev --proc /proc --tmpfs /tmp --tmpfs /var/tmp --tmpfs /dev/shm
  --die-with-parent /bin/true)
bwrap=$(per_start "$STARTS" "${AS_NOBODY[@]}")
CMD=(bwrap --unshare-all --ro-bind / / --dev /dev --proc /proc --tmpfs /tmp --tmpfs /var/tmp
  --tmpfs /dev/shm --die-with-parent /bin/true)
bwrap_all=$(per_start "$STARTS" "${AS_NOBODY[@]}")
if ! podman image exists "$IMAGE"; then
  rootfs=$(ls -d /var/cache/railgrid-test/rootfs-* 2>/dev/null | head -1 || true)
  [ -n "$rootfs" ] || {
    echo "no Debian root file system in /var/cache/railgrid-test: cargo test --test it systemd makes it" >&2
    exit 1
  }
  tar -C "$rootfs" -c . | podman import -q - "$IMAGE" >/dev/null
fi
CMD=(podman --runtime runc run --rm --ulimit nofile=1024:1024 --ulimit nproc=1024:1024 "$IMAGE" /bin/true)
podman=$(per_start "$PODMAN_STARTS" env)
echo "start_ms raw=$raw bwrap=$bwrap bwrap_unshare_all=$bwrap_all podman=$podman"

# One runner per mode, as nobody, measured by the same client one after the other.
for mode in off required; do
  state="$WORK/$mode"
  mkdir -p "$state/runner"
  chmod 700 "$state/runner"
  chown nobody "$state/runner"
  "${AS_NOBODY[@]}" ./target/release/railgrid runner run --state-dir "$state" --sandbox "$mode" \
    --max-finished-jobs 100000 --max-jobs "$CONC" 2>"$WORK/runner-$mode.log" &
  runners+=($!)
  sock="$state/runner/runner.sock"
  for _ in $(seq 200); do curl -sf --unix-socket "$sock" http://localhost/v1/health >/dev/null && break; sleep 0.05; done
  echo "sandbox=$mode health: $(curl -s --unix-socket "$sock" http://localhost/v1/health | sed 's/.*"sandbox":"\(\([^"\\]\|\\.\)*\)".*/\1/')"
  ./target/release/examples/job_bench "$sock" "$JOBS" "$CONC" | sed "s/^/$mode /" | tee "$WORK/$mode.out"
done

get() { sed -n "s/^$1 $2=//p" "$WORK/$1.out"; }
awk -v raw="$raw" -v bw="$bwrap" -v pm="$podman" \
  -v off="$(get off latency_p50_ms)" -v on="$(get required latency_p50_ms)" \
  -v ratio="$(get required ratio)" -v ratio_off="$(get off ratio)" 'BEGIN {
  added = on - off; bw_added = bw - raw
  printf "sandbox adds %.2f ms to a job start (p50 to first byte); bubblewrap adds %.2f ms to a bare start: %.2f of it (target <= 0.5)\n", added, bw_added, added / bw_added
  printf "throughput with the sandbox: %.2f of a raw fork/exec/wait loop (target >= 0.5; without it %.2f)\n", ratio, ratio_off
  printf "podman start / sandboxed job start: %.0fx (target >= 50)\n", pm / on
}'
