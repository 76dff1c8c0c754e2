# Sourced by the image build scripts: images are tagged IMAGE:src-<hash of their inputs>, so an
# unchanged checkout reuses its image instead of building it again.

# Tag IMAGE:src-HASH as IMAGE:test if it exists; true when it did (nothing to build).
reuse_image() {
  docker image inspect "$1:src-$2" >/dev/null 2>&1 && docker tag "$1:src-$2" "$1:test"
}

# Remove the IMAGE:src-* tags of other hashes: older builds are of no further use.
prune_images() {
  docker images "$1" --format '{{.Tag}}' | grep '^src-' | grep -v "^src-$2$" | sed "s/^/$1:/" \
    | xargs -r docker rmi -f >/dev/null 2>&1 || true
}
