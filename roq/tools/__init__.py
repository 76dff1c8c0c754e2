"""Tooling that ships with RoQ, around it rather than in it: what runs and measures a cluster.

* `cluster` — the whole cluster on one machine (`roq cluster up/down`);
  `zkserver` finds, starts and health-checks a standalone ZooKeeper *server*
  for it and for the tests (unlike `roq.zk`, the client helpers).
* `backup`, `restore` — `roq backup` and `roq restore` (docs/backup.md).
* `views` — the CLI's rich tables; `demo` — `roq demo`; `data_cli`,
  `work_cli` — `roq publish` and `roq subscribe [--group]`'s input and output.
* `bench`, `bench_cli` — the benchmark harness and `roq bench` (bench/ adds
  the peer systems); `own_queue` — a queue a command creates for itself and
  deletes on its way out, Ctrl-C included.

What only the tests use (helpers, the Docker launcher, hostile peers, fuzz
targets) is in tests/support/, outside the installed package. The core and
the roles never import this package; the import-linter contracts in
pyproject.toml check it (`make lint`). The CLI imports it inside the commands
that need it.
"""
