#!/usr/bin/env bash
# Build roq-host:test (docker/Dockerfile.host) FROM the local roq-base:bookworm, with no
# registry; the packages come from the Debian mirror the base was bootstrapped from, at
# build time only. Skips the build when an image of this Dockerfile and base exists
# (tag roq-host:src-<hash>).
set -euo pipefail
cd "$(dirname "$0")"
source image-cache.sh
bash build-base.sh
base=$(docker image inspect -f '{{.Id}}' roq-base:bookworm)
hash=$( (cat Dockerfile.host; echo "$base") | sha256sum | cut -c1-16)
reuse_image roq-host "$hash" && exit 0
log=$(mktemp /tmp/roq-host-build.XXXXXX)
trap 'rm -f "$log"' EXIT
echo "build-host-image: docker build roq-host:test"
# No context: the Dockerfile copies nothing in.
docker build -q -t "roq-host:src-$hash" -t roq-host:test - <Dockerfile.host >"$log" 2>&1 || {
  cat "$log" >&2; exit 1; }
prune_images roq-host "$hash"
echo "build-host-image: roq-host:test ready"
