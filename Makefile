# The two commands of the README. Each sets up what it needs first.
.PHONY: demo test setup clean

demo: setup
	.venv/bin/roq demo

test: setup
	.venv/bin/python -m pytest

setup:
	bash scripts/setup.sh dev

clean:
	-.venv/bin/roq cluster down
	rm -rf .venv .roq .pytest_cache
