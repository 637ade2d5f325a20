#!/usr/bin/env bash
# Builds the Debian package of delay-bridge around an already built binary, with dpkg-deb
# alone (no debhelper, no cargo-deb):
#
#   packaging/deb/build.sh BINARY OUT_DIR
#
# writes OUT_DIR/delay-bridge_<version>_<arch>.deb and prints its path. The version comes
# from Cargo.toml; the architecture from `dpkg --print-architecture`, or DEB_ARCH for a
# cross-built binary (DEB_ARCH=arm64). Depends lists the packages of the shared libraries
# the binary links (none for a static musl binary). The binary is stripped in the package.
# DPKG_DEB_COMPRESSOR_TYPE (e.g. gzip) makes dpkg-deb compress faster than its xz default.
set -euo pipefail

if [ $# -ne 2 ]; then
  echo "usage: $0 BINARY OUT_DIR" >&2
  exit 2
fi
binary=$1
out=$2
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
[ -x "$binary" ] || { echo "$binary: not an executable" >&2; exit 1; }

# `version = "..."` of the [package] table.
version="$(awk '
  /^\[/ { in_package = ($0 == "[package]") }
  in_package && /^version *=/ { gsub(/.*= *"|".*/, ""); print; exit }
' "$repo/Cargo.toml")"
[ -n "$version" ] || { echo "no version in $repo/Cargo.toml" >&2; exit 1; }
arch="${DEB_ARCH:-$(dpkg --print-architecture)}"
maintainer="${DEB_MAINTAINER:-delay-bridge maintainers <maintainers@delay-bridge.invalid>}"

root="$(mktemp -d)"
chmod 0755 "$root"
trap 'rm -rf "$root"' EXIT
install -d "$root/DEBIAN" "$root/usr/bin" "$root/lib/systemd/system" \
  "$root/etc/delay-bridge" "$root/etc/default" "$root/usr/share/doc/delay-bridge"

install -m 0755 "$binary" "$root/usr/bin/delay-bridge"
if command -v strip >/dev/null && [ "$arch" = "$(dpkg --print-architecture)" ]; then
  strip --strip-unneeded "$root/usr/bin/delay-bridge"
fi
install -m 0644 "$here/delay-bridge.service" "$root/lib/systemd/system/delay-bridge.service"
# Mode 0640 and group delay-bridge (set by postinst): the config may hold credentials.
install -m 0640 "$here/config.toml" "$root/etc/delay-bridge/config.toml"
install -m 0600 "$here/default" "$root/etc/default/delay-bridge"
install -m 0644 "$here/copyright" "$root/usr/share/doc/delay-bridge/copyright"
install -m 0644 "$repo/README.md" "$root/usr/share/doc/delay-bridge/README.md"
gzip -9n -c "$repo/CHANGELOG.md" > "$root/usr/share/doc/delay-bridge/changelog.gz"
chmod 0644 "$root/usr/share/doc/delay-bridge/changelog.gz"
install -m 0755 "$here/postinst" "$here/prerm" "$here/postrm" "$root/DEBIAN/"
printf '%s\n' /etc/delay-bridge/config.toml /etc/default/delay-bridge > "$root/DEBIAN/conffiles"

# The packages holding the shared libraries the binary needs, e.g. libc6, libssl3.
depends="passwd"
if [ "$arch" = "$(dpkg --print-architecture)" ] && ldd "$binary" >/dev/null 2>&1; then
  for lib in $(ldd "$binary" | awk '/=> \// { print $3 }'); do
    pkg="$(dpkg -S "$lib" 2>/dev/null || dpkg -S "$(readlink -f "$lib")" 2>/dev/null || true)"
    pkg="${pkg%%:*}"
    [ -n "$pkg" ] && depends="$depends, $pkg"
  done
  depends="$(tr ',' '\n' <<<"$depends" | sed 's/^ *//' | sort -u | paste -sd, | sed 's/,/, /g')"
fi

cat > "$root/DEBIAN/control" <<CONTROL
Package: delay-bridge
Version: $version
Architecture: $arch
Maintainer: $maintainer
Installed-Size: $(du -sk --exclude=DEBIAN "$root" | cut -f1)
Depends: $depends
Section: net
Priority: optional
Description: delayed messages from Redis sorted sets to RabbitMQ, Kafka and HTTP endpoints
 delay-bridge turns Redis sorted sets into delayed message queues: producers
 ZADD a message with its due time as the score, and the daemon forwards it to
 a RabbitMQ exchange or a Kafka topic when it falls due, at least once.
 .
 This package installs the daemon as delay-bridge.service (a sandboxed
 systemd unit running as the delay-bridge system user) with a configuration
 for a Redis and a RabbitMQ on localhost in /etc/delay-bridge/config.toml.
CONTROL

mkdir -p "$out"
deb="$out/delay-bridge_${version}_${arch}.deb"
dpkg-deb --build --root-owner-group "$root" "$deb" >/dev/null
echo "$deb"
