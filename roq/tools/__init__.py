"""Tooling around RoQ, not RoQ itself: what runs, tests and measures a cluster.

* `cluster` — the whole cluster on one machine (`roq cluster up/down`);
  `zkserver` finds, starts and health-checks a standalone ZooKeeper *server*
  for it and for the tests (unlike `roq.zk`, the client helpers).
* `views` — the CLI's rich tables; `demo` — `roq demo`.
* `bench`, `bench_cli` — the benchmark harness and `roq bench` (bench/ adds
  the peer systems).
* `testing` — test helpers (`wait_until`, `Processes`, traffic generators);
  `docker_launcher` — the cluster in containers, with faults (needs docker,
  from the dev extra); `fuzz_targets` — the fuzzed decoders (imports gcm and
  exchange).

The core (configuration, paths, protocol, ZooKeeper client, security, client
library, errors, records, state, names, logs, metrics, daemon entry) never
imports this package, a role package (gcm, hcm, exchange) or a dev-only
dependency; the import-linter contracts in pyproject.toml check it (`make lint`). Modules here may import
any of them, and the CLI imports them inside the commands that need them.
"""
