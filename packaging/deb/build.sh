#!/usr/bin/env bash
# Builds railgrid's Debian package from a built binary, with dpkg-deb alone (no debhelper,
# no cargo-deb: the package is a few files and three maintainer scripts, each written here
# where a reader sees it, and the binary is the one the tests or the release build made,
# never built a second time).
#
#   bash packaging/deb/build.sh BINARY OUT_DIR [MAN_GENERATOR]
#
# BINARY: the railgrid executable to package (stripped into the package, never changed in
# place); its `version` names the package's version. MAN_GENERATOR: the `man` example
# built beside it (default: BINARY's directory/examples/man). Prints the .deb's path.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
bin=$1
out=$2
man=${3:-$(dirname "$bin")/examples/man}
[ -x "$bin" ] || { echo "build.sh: $bin is not an executable" >&2; exit 2; }
[ -x "$man" ] || { echo "build.sh: $man (cargo build --example man) is missing" >&2; exit 2; }

version=$("$bin" version | sed -n 's/^railgrid \([^ ]*\).*/\1/p')
[ -n "$version" ] || { echo "build.sh: $bin does not say its version" >&2; exit 2; }
case $(uname -m) in
  x86_64) arch=amd64 ;;
  aarch64) arch=arm64 ;;
  *) arch=$(dpkg --print-architecture) ;;
esac
# The newest glibc symbol version the binary needs is its libc6 floor.
glibc=$(objdump -T "$bin" | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -Vu | tail -1)

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
root=$stage/root
umask 022
install -d "$root/DEBIAN" "$root/usr/bin" "$root/lib/systemd/system" \
  "$root/usr/share/man/man1" "$root/usr/share/doc/railgrid/examples" \
  "$root/usr/share/bash-completion/completions" "$root/usr/share/zsh/vendor-completions" \
  "$root/usr/share/fish/vendor_completions.d"

install -m 0755 "$bin" "$root/usr/bin/railgrid"
strip --strip-unneeded --remove-section=.comment --remove-section=.note "$root/usr/bin/railgrid"

"$man" "$stage/man" >/dev/null
for page in "$stage"/man/*.1; do
  gzip -9n -c "$page" >"$root/usr/share/man/man1/$(basename "$page").gz"
done
"$bin" completions bash >"$root/usr/share/bash-completion/completions/railgrid"
"$bin" completions zsh >"$root/usr/share/zsh/vendor-completions/_railgrid"
"$bin" completions fish >"$root/usr/share/fish/vendor_completions.d/railgrid.fish"

# The unit as `agent install` writes it, for the binary in /usr/bin; the package's
# binary is dpkg's, so the service may not write beside it (docs/upgrade.md).
{
  echo "# railgrid agent: keeps one runner alive on this host. Installed by the railgrid"
  echo "# package and not enabled: write /etc/railgrid/agent.toml, then"
  echo "# systemctl enable --now railgrid-agent (docs/operations.md)."
  # The template without its own header, for /usr/bin.
  sed -e '1,/^\[Unit\]$/{/^\[Unit\]$/!d}' -e 's|/usr/local/bin/|/usr/bin/|g' \
    -e '/^ReadWritePaths=\/usr\/local\/bin$/d' \
    -e "s|^# - /usr, /boot and /etc read-only, except the binary's directory: the self-upgrade$|# - /usr, /boot and /etc read-only, the binary's directory too: the package manager,|" \
    -e 's|^#   renames the new binary over the old one there and keeps railgrid.prev beside it.$|#   not the agent, replaces the binary (docs/upgrade.md).|' \
    "$repo/packaging/systemd/railgrid-agent.service"
} >"$root/lib/systemd/system/railgrid-agent.service"
chmod 0644 "$root/lib/systemd/system/railgrid-agent.service"
install -m 0644 "$repo/packaging/agent.toml.example" "$root/usr/share/doc/railgrid/examples/agent.toml"

cat >"$root/usr/share/doc/railgrid/copyright" <<COPYRIGHT
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: railgrid
Source: https://github.com/railgrid/railgrid

Files: *
Copyright: 2026 the railgrid authors
License: Apache-2.0
 On Debian systems, the full text of the Apache License, Version 2.0 can be found
 in /usr/share/common-licenses/Apache-2.0.
COPYRIGHT
{
  echo "railgrid ($version) unstable; urgency=medium"
  echo
  echo "  * Release $version (the project's history is in its repository)."
  echo
  echo " -- railgrid maintainers <maintainers@railgrid.invalid>  $(date -uR -d @"${SOURCE_DATE_EPOCH:-0}")"
} | gzip -9n >"$root/usr/share/doc/railgrid/changelog.gz"

for script in postinst prerm postrm; do
  install -m 0755 "$here/$script" "$root/DEBIAN/$script"
done
size=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
cat >"$root/DEBIAN/control" <<CONTROL
Package: railgrid
Version: $version
Architecture: $arch
Maintainer: railgrid maintainers <maintainers@railgrid.invalid>
Installed-Size: $size
Depends: libc6 (>= $glibc), libgcc-s1 (>= 4.2), passwd, init-system-helpers (>= 1.52)
Section: admin
Priority: optional
Homepage: https://github.com/railgrid/railgrid
Description: fleet agent, job runner and process supervisor
 railgrid runs on every build host of a fleet as a systemd service: the agent
 keeps one job runner alive under a supervisor and is reconciled by a hub, and
 the runner runs jobs (builds, AI coding agents) each in a sandbox of its own,
 with durable records and spooled output. The same binary is the reference hub.
 .
 The service is installed but not enabled: write /etc/railgrid/agent.toml
 (an example is in /usr/share/doc/railgrid/examples), then
 systemctl enable --now railgrid-agent.
CONTROL
(cd "$root" && find usr lib -type f -exec md5sum {} + | sort -k2) >"$root/DEBIAN/md5sums"
chmod 0644 "$root/DEBIAN/md5sums" "$root/DEBIAN/control"

mkdir -p "$out"
deb="$out/railgrid_${version}_${arch}.deb"
# xz as Debian ships packages; DEB_COMPRESSION=gzip builds faster (the tests).
dpkg-deb --root-owner-group --build -Z"${DEB_COMPRESSION:-xz}" "$root" "$deb" >/dev/null
echo "$deb"
