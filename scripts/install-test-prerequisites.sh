#!/usr/bin/env bash
# Installs every tool the test suite uses, by Debian package name (Debian 12, Ubuntu), and
# only what is missing. Run it once as root before `cargo test`; `.ci/run` runs it too.
#
#   bash scripts/install-test-prerequisites.sh [--bench]
#
# `--bench` also installs the benchmarks' peers and build tools (the `bench_need` lines),
# which the tests do not use.
#
# Each `need TOOL PACKAGE…` line below is also read by the test suite
# (tests/it/prerequisites.rs), which fails naming this script when a tool is missing: the
# list here is the one list.
set -euo pipefail

bench=0
[ "${1:-}" = --bench ] && bench=1

missing=()
need() {
    local tool=$1
    shift
    if ! command -v "$tool" >/dev/null 2>&1 && ! ls /usr/lib/postgresql/*/bin/"$tool" >/dev/null 2>&1; then
        missing+=("$@")
    fi
}

# The README's examples and the tests' HTTP client; a C compiler for them and for SQLite.
need curl curl
need cc gcc libc6-dev
# Process tests: flock, setpriv and prlimit (util-linux), a shell, perl for setpgrp in a job.
need flock util-linux
need setpriv util-linux
need prlimit util-linux
need bash bash
need perl perl-base
# Sandboxed jobs build for real (git, make), and a runner whose kernel refuses user
# namespaces is made with bubblewrap's --disable-userns.
need git git
# Egress tests: a TLS handshake naming another host than its CONNECT (s_client -proxy).
need openssl openssl
need make make
need bwrap bubblewrap
# Release signing interoperates with the minisign tool.
need minisign minisign
# Upgrade tests strip the binary they copy and mount a small tmpfs.
need strip binutils
need mount mount
# Install tests: the rendered unit (systemd-analyze), the runner's account in an image
# (useradd), a mount namespace of their own (unshare).
need systemd-analyze systemd
need useradd passwd
need unshare util-linux
# The tests under a real systemd boot a container (systemd-nspawn) of a Debian root file
# system they build once (debootstrap).
need systemd-nspawn systemd-container
need debootstrap debootstrap
need nsenter util-linux
# Hub replica tests start a PostgreSQL cluster of their own (initdb, pg_ctl; psql).
need initdb postgresql
need psql postgresql-client
# The Debian package is checked with lintian, and taken apart with dpkg-deb (dpkg) and
# objdump (binutils) as it is built.
need lintian lintian
need dpkg-deb dpkg
need objdump binutils
# Metrics tests check the exposition with promtool and scrape it with a real Prometheus.
need promtool prometheus
need prometheus prometheus
# The dashboard is tested in a real headless Chromium through WebDriver.
need chromium chromium
need chromedriver chromium-driver

bench_need() {
    [ "$bench" = 1 ] && need "$@"
    return 0
}

# bench/supervise.sh beside s6, runit and supervisord; bench/hub.sh beside etcd, whose
# client (examples/etcd_bench.rs) compiles its protocol with protoc.
bench_need s6-svscan s6
bench_need runsv runit
bench_need supervisord supervisor
bench_need etcd etcd-server
bench_need protoc protobuf-compiler libprotobuf-dev
# bench/sandbox.sh beside bubblewrap (a test prerequisite already) and podman, whose
# default runtime (crun) refuses a hybrid cgroup layout: runc.
bench_need podman podman
bench_need runc runc
# bench/egress.sh builds its jobs' specs with jq, beside tinyproxy.
bench_need jq jq
bench_need tinyproxy tinyproxy

if [ "${#missing[@]}" -eq 0 ]; then
    echo "every test prerequisite is installed"
    exit 0
fi
# One package may be named by several tools.
mapfile -t packages < <(printf '%s\n' "${missing[@]}" | sort -u)
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "missing test prerequisites: ${packages[*]}" >&2
    echo "install them as root: apt-get install -y ${packages[*]}" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends "${packages[@]}"
echo "installed: ${packages[*]}"
