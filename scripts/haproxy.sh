#!/usr/bin/env bash
# HAProxy for the load-balancer bridge's tests, from Debian's packages, without installing anything
# system-wide: `apt-get download` fetches the .deb of haproxy and of the libraries it links that a
# slim Debian lacks (Lua 5.3, the OpenTracing wrapper), and `dpkg -x` unpacks them into
# ~/.cache/skewwatch/haproxy. The wrapper there (bin/haproxy) sets LD_LIBRARY_PATH to the unpacked
# libraries. An haproxy already on PATH is used as it is. Prints the path of the binary to use.
set -euo pipefail
CACHE=${SKEWWATCH_CACHE:-$HOME/.cache/skewwatch}
DEST="$CACHE/haproxy"
PACKAGES="haproxy liblua5.3-0 libopentracing-c-wrapper0 libopentracing1"

if command -v haproxy >/dev/null && [ -z "${SKEWWATCH_HAPROXY_FROM_DEB:-}" ]; then
  command -v haproxy; exit 0
fi
if [ -x "$DEST/bin/haproxy" ] && "$DEST/bin/haproxy" -v >/dev/null 2>&1; then
  echo "$DEST/bin/haproxy"; exit 0
fi
if ! command -v apt-get >/dev/null || ! command -v dpkg >/dev/null; then
  echo "haproxy.sh: no haproxy on PATH and no apt-get/dpkg to fetch Debian's; install HAProxy >= 2.4" >&2
  exit 1
fi
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
download() { (cd "$work" && apt-get download -q $PACKAGES >"$work/apt.log" 2>&1); }
if ! download; then
  # a fresh machine may have no package lists yet; refreshing them needs root
  if [ "$(id -u)" = 0 ]; then
    apt-get update -q >"$work/update.log" 2>&1 || true
  fi
  if ! download; then
    echo "haproxy.sh: apt-get download $PACKAGES failed:" >&2; cat "$work/apt.log" >&2
    echo "haproxy.sh: run 'apt-get update' (as root) or install haproxy" >&2; exit 1
  fi
fi
rm -rf "$DEST.tmp"; mkdir -p "$DEST.tmp/root" "$DEST.tmp/bin"
for deb in "$work"/*.deb; do dpkg -x "$deb" "$DEST.tmp/root"; done
libs=$(find "$DEST.tmp/root" -name '*.so*' -printf '%h\n' | sort -u | sed "s#^$DEST.tmp#$DEST#" | paste -sd:)
cat > "$DEST.tmp/bin/haproxy" <<WRAP
#!/bin/sh
LD_LIBRARY_PATH="$libs\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" exec "$DEST/root/usr/sbin/haproxy" "\$@"
WRAP
chmod +x "$DEST.tmp/bin/haproxy"
rm -rf "$DEST"; mv "$DEST.tmp" "$DEST"
if ! "$DEST/bin/haproxy" -v >/dev/null 2>"$work/err"; then
  echo "haproxy.sh: the unpacked haproxy does not run:" >&2; cat "$work/err" >&2; exit 1
fi
echo "$DEST/bin/haproxy"
