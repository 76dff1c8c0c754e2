# The two commands of the README. Each sets up what it needs first.
.PHONY: demo test setup docker-images clean

demo: setup
	.venv/bin/roq demo

test: setup docker-images
	.venv/bin/python -m pytest

# The failover suite needs a Docker engine and the roq:test image, both made here.
docker-images: setup
	bash docker/ensure-engine.sh
	bash docker/build-images.sh

setup:
	bash scripts/setup.sh dev

clean:
	-.venv/bin/roq cluster down
	rm -rf .venv .roq .pytest_cache
