# The two commands of the README. Each sets up what it needs first.
.PHONY: demo test test-thorough lint setup setup-test docker-images deploy-images bench-servers clean

demo: setup
	.venv/bin/roq demo

# Three workers (tests/conftest.py says which tests share one, and which start first), then the `solo`
# tests alone: they measure times. Both runs report; the target fails if either failed.
# `make test WORKERS=2` tries another count (the summary's "seconds per worker" shows the balance).
WORKERS ?= 3
test: setup-test lint docker-images deploy-images bench-servers
	.venv/bin/python -m pytest -n $(WORKERS) --dist loadgroup --no-loadscope-reorder -m "not solo"; parallel=$$?; \
	.venv/bin/python -m pytest -m solo; solo=$$?; \
	exit $$(( parallel || solo ))

# The searching tests with ten times their examples (tests/profiles.py): for a night, not for CI.
test-thorough: setup-test
	HYPOTHESIS_PROFILE=thorough .venv/bin/python -m pytest -p no:cacheprovider tests/unit --timeout 3600

# Lint (ruff: errors, warnings, import order), types (mypy on the core and the roles) and the
# layers (lint-imports: the contracts in pyproject.toml).
lint: setup-test
	.venv/bin/ruff check .
	.venv/bin/mypy
	.venv/bin/lint-imports

# The failover suite needs a Docker engine and the roq:test image, both made here.
docker-images: setup
	bash docker/ensure-engine.sh
	bash docker/build-images.sh

# The deployment test needs the systemd host image, and the wheelhouse site.yml copies to the
# hosts, fetched here once as on a controller (roles/roq does the same): the test runs offline.
deploy-images: setup
	bash docker/ensure-engine.sh
	bash docker/build-host-image.sh
	test -d ansible/.build/wheelhouse || .venv/bin/python -m pip wheel -q --wheel-dir ansible/.build/wheelhouse 'setuptools>=68' wheel .

# Debian's nats-server, redis-server and rabbitmq-server, for the benchmark comparison (and its smoke test).
bench-servers: setup
	.venv/bin/python bench/servers.py

setup:
	bash scripts/setup.sh dev

# The tests also need PySpark (and Java) for the Spark source, sink and statistics pipeline.
setup-test:
	bash scripts/setup.sh dev,spark

clean:
	-.venv/bin/roq cluster down
	rm -rf .venv .roq .pytest_cache
