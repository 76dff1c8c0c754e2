#!/usr/bin/env bash
# Make a Docker engine reachable: install Debian's docker.io if needed and start dockerd.
# Idempotent; used by `make test` so the failover suite always has an engine (as root).
set -euo pipefail
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

if docker info >/dev/null 2>&1; then
  exit 0
fi
if ! command -v dockerd >/dev/null 2>&1; then
  echo "docker: installing Debian's docker.io"
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq docker.io >/dev/null
fi
if ! docker info >/dev/null 2>&1; then
  echo "docker: starting dockerd (log: /var/log/roq-dockerd.log)"
  as_root sh -c 'nohup dockerd >/var/log/roq-dockerd.log 2>&1 &'
  for _ in $(seq 1 120); do
    docker info >/dev/null 2>&1 && exit 0
    sleep 0.5
  done
  echo "docker: dockerd did not come up; see /var/log/roq-dockerd.log" >&2
  tail -20 /var/log/roq-dockerd.log >&2 || true
  exit 1
fi
