#!/usr/bin/env bash
# Build the base image `roq-base:bookworm` with no container registry:
# debootstrap Debian bookworm (from this machine's own Debian mirror, as apt is
# configured) with Python 3.11, Java and ZooKeeper, trim it, `docker import` it.
set -euo pipefail
image=${ROQ_BASE_IMAGE:-roq-base:bookworm}
if docker image inspect "$image" >/dev/null 2>&1; then
  exit 0
fi
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
command -v debootstrap >/dev/null 2>&1 || {
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq debootstrap >/dev/null
}

mirror_of_this_machine() {
  # The first Debian archive apt uses here (deb822 or one-line format).
  local uri=""
  if [ -f /etc/apt/sources.list.d/debian.sources ]; then
    uri=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources)
  fi
  if [ -z "$uri" ] && [ -f /etc/apt/sources.list ]; then
    uri=$(awk '$1 == "deb" && $0 !~ /security/ {print $2; exit}' /etc/apt/sources.list)
  fi
  echo "$uri"
}

mirror=${DEBIAN_MIRROR:-$(mirror_of_this_machine)}
[ -n "$mirror" ] || { echo "build-base: no Debian mirror found in apt's sources; set DEBIAN_MIRROR" >&2; exit 1; }
root=$(mktemp -d /tmp/roq-rootfs.XXXXXX)
trap 'as_root rm -rf "$root"' EXIT
echo "build-base: debootstrap bookworm (about a minute)"
as_root debootstrap --variant=minbase \
  --include=python3,python3-venv,default-jre-headless,zookeeper,iproute2,procps,netbase \
  bookworm "$root" "$mirror" >/tmp/roq-debootstrap.log 2>&1 || {
    tail -20 /tmp/roq-debootstrap.log >&2; exit 1; }
as_root rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* \
  "$root"/usr/share/doc "$root"/usr/share/man "$root"/usr/share/locale
as_root tar -C "$root" -c . | docker import -c 'ENV LANG=C.UTF-8' - "$image" >/dev/null
echo "build-base: $image imported"
