#!/usr/bin/env bash
# Installs everything RoQ needs on a Debian machine, idempotently:
# Debian's zookeeper (and its Java), a virtualenv in .venv with RoQ and its extras
# (Java 17, promtool, chromium and chromedriver too when the extras include spark, as the test setup's do).
# Usage: scripts/setup.sh [extras]   (default extras: dev; the tests use dev,spark)
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-dev}"

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

apt_updated=""
apt_install() {
  [ -n "$apt_updated" ] || { as_root apt-get update -qq; apt_updated=1; }
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "$@" >/dev/null
}

if [ -z "${ZOOKEEPER_HOME:-}" ] && [ ! -x /usr/share/zookeeper/bin/zkServer.sh ]; then
  echo "setup: installing Debian's zookeeper package"
  apt_install zookeeper
  # The package's service is not wanted: RoQ starts its own servers on free ports.
  (as_root service zookeeper stop >/dev/null 2>&1 || true)
fi

if [[ ",$extras," == *",spark,"* ]] && ! command -v java >/dev/null 2>&1; then
  echo "setup: installing Java for Spark"
  apt_install openjdk-17-jre-headless
fi

# The test setup (`make test` asks for spark) also needs promtool, from Debian's prometheus package,
# to check the metrics endpoints and monitoring/prometheus.yml.
if [[ ",$extras," == *",spark,"* ]] && ! command -v promtool >/dev/null 2>&1; then
  echo "setup: installing Debian's prometheus package (promtool)"
  apt_install --no-install-recommends prometheus
  # Its service is not wanted: the tests only run promtool.
  (as_root service prometheus stop >/dev/null 2>&1 || true)
fi

# ...and a headless browser for the web console's test (tests/web/test_console_browser.py):
# Debian's chromium and its chromedriver, which selenium drives.
if [[ ",$extras," == *",spark,"* ]] && ! command -v chromedriver >/dev/null 2>&1; then
  echo "setup: installing Debian's chromium and chromium-driver (the console's browser test)"
  apt_install --no-install-recommends chromium chromium-driver
fi

python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  "$python" -m venv .venv
fi
stamp=".venv/.roq-installed-$extras"
# Installed already, since setup.cfg last changed, with these extras or more: `make test` asks for
# dev after dev,spark.
installed() {
  local done extra
  for done in .venv/.roq-installed-*; do
    [ -f "$done" ] && [ ! setup.cfg -nt "$done" ] || continue
    for extra in ${extras//,/ }; do
      [[ ",${done#.venv/.roq-installed-}," == *",$extra,"* ]] || continue 2
    done
    return 0
  done
  return 1
}
if ! installed; then
  echo "setup: installing RoQ into .venv (extras: $extras)"
  .venv/bin/pip install -q --upgrade pip >/dev/null
  .venv/bin/pip install -q -e ".[$extras]"
  touch "$stamp"
fi
