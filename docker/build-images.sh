#!/usr/bin/env bash
# Build roq:test from the local base and a wheelhouse of this checkout. No registry.
# Skips the build when an image of the same sources exists (tag roq:src-<hash>; the hash covers
# untracked source files too, so a new module not yet committed still triggers a build).
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-.venv/bin/python}
source docker/image-cache.sh
bash docker/build-base.sh
hash=$(cat setup.cfg docker/Dockerfile docker/entrypoint.sh tests/support/docker_launcher.py $(git ls-files --cached --others --exclude-standard roq gcm hcm exchange roq_web 2>/dev/null || find roq gcm hcm exchange roq_web -name '*.py') \
       | sha256sum | cut -c1-16)
reuse_image roq "$hash" && exit 0
context=$(mktemp -d /tmp/roq-image.XXXXXX)
trap 'rm -rf "$context"' EXIT
echo "build-images: wheelhouse"
"$python" -m pip wheel -q --wheel-dir "$context/wheelhouse" . >"$context/pip.log" 2>&1 || {
  cat "$context/pip.log" >&2; exit 1; }
cp docker/Dockerfile docker/entrypoint.sh "$context/"
# The client programs the failover tests run in containers: test code, not in the wheel.
cp tests/support/docker_launcher.py "$context/"
chmod +x "$context/entrypoint.sh"
echo "build-images: docker build roq:test"
docker build -q -t "roq:src-$hash" -t roq:test "$context" >"$context/build.log" 2>&1 || {
  cat "$context/build.log" >&2; exit 1; }
prune_images roq "$hash"
echo "build-images: roq:test ready"
