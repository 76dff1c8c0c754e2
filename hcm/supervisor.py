"""Supervision of the exchange processes of one host: desired vs actual, on a tick.

Each tick: reap exited children (their endpoint is removed at once), stop children no longer
assigned (SIGTERM, `hcm.stop_grace`, SIGKILL), start assigned ones whose restart is due
(hcm/restarts.py), tell running ones what changed (hcm/channel.py), publish the endpoints and
statistics of children that reported ready (hcm/endpoints.py), kill children that never became
ready. A ready child that sends no report for `hcm.hung_timeout` (stopped, frozen, stuck: the
znode already says `silent`) is killed, which counts as a crash, and started again: a frozen
replica would stall its primary's confirms for as long as it hangs.

Replicas: an assignment of a replica slot (`x1~r`, roq.paths.replica_slot) runs `exchange.main
--role replica --id x1`. Its ready event carries `repl` and `replay` (no pub/sub), and it is
published at `replicas/<q>/<x>` instead of `live/<q>/<x>`, with the same lifecycle. A primary reads
its queue's settings once at each start; with replicas 2 it gets `--replicas 2`. The two halves
follow each other through a peer watch (hcm/peers.py).

Children are started from the thread that runs `tick()` — the daemon's main thread — because
PR_SET_PDEATHSIG fires when the spawning thread exits. Their stdout (ready and stats events) and
stderr (logs) are read by one thread each. Logs go through this process's logging
(`_forward_logs`): the child writes one JSON record per line (`--json-logs`), re-logged here at its
level under its logger's name, prefixed with the child's queue/id[pid]; so lines, tracebacks
included, never interleave.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from typing import IO

from kazoo.client import KazooClient

from hcm.channel import ChildChannel
from hcm.child import Child, Key
from hcm.endpoints import Endpoints
from hcm.peers import watch_peer
from hcm.restarts import RestartPolicy
from roq.config import Config
from roq.paths import Paths, primary_of
from roq.state import replica_count
from roq.zk import read_json

log = logging.getLogger(__name__)


class Supervisor:
    """Keeps one process running per assigned slot of this host. `client` may be None (unit tests
    with stand-in processes): then nothing is read, followed or published."""

    def __init__(self, client: KazooClient, paths: Paths, config: Config, host: str) -> None:
        self.client = client
        self.paths = paths
        self.config = config
        self.hcm = config.hcm
        self.host = host
        self.children: dict[Key, Child] = {}
        self.desired: set[Key] = set()
        self._lock = threading.Lock()  # guards `desired` (set from a kazoo watch)
        self.stopping = False
        self.changed = threading.Event()
        self.channel = ChildChannel(client, paths, config, self.changed)
        self.endpoints = Endpoints(client, paths, config, host)
        self.restarts = RestartPolicy(config.hcm)
        self._last_tick: float | None = None

    # ------------------------------------------------------------ inputs

    def set_desired(self, keys: set[Key]) -> None:
        """The slots this host should run now (from the assignment watch); ignored once stopping."""
        with self._lock:
            if self.stopping:
                return  # shutting down: an assignment arriving now must not start anything
            self.desired = set(keys)
        self.changed.set()

    def session_lost(self) -> None:
        """Our ephemeral endpoints died with the session: publish them again."""
        for child in self.children.values():
            child.published = False

    # ------------------------------------------------------------ tick

    def tick(self, now: float | None = None) -> None:
        """One comparison of desired with actual; `now` (time.monotonic()) is for tests."""
        now = time.monotonic() if now is None else now
        # A tick a report interval later than hcm.tick after the previous one: this process was held up.
        self.endpoints.late = self._last_tick is not None and \
            now - self._last_tick > self.hcm.tick + self.config.exchange.stats_interval
        self._last_tick = now
        with self._lock:
            desired = set(self.desired)
        for child in list(self.children.values()):
            self._reap(child, now)
        for key in desired - set(self.children):
            self.children[key] = Child(key)
        self.channel.refresh_commands({queue for (queue, _), child in self.children.items() if not child.is_replica})
        self.channel.storage.keep_only({queue for queue, _ in self.children})
        for key, child in list(self.children.items()):
            if key in desired:
                self._keep_running(child, now)
            else:
                self._drive_stop(child, now)
                if child.process is None:
                    if child.peer_watch:
                        child.peer_watch.stop()
                    del self.children[key]

    def _reap(self, child: Child, now: float) -> None:
        if child.process is None or child.process.poll() is None:
            return
        code = child.process.returncode
        self.endpoints.unpublish(child)
        uptime = now - child.started
        expected = child.stop_deadline is not None
        child.process, child.ready, child.stop_deadline = None, None, None
        if expected:
            log.info("exchange %s/%s stopped", *child.key)
            return
        self.restarts.exited(child, code, now, uptime)

    def _keep_running(self, child: Child, now: float) -> None:
        if child.process is None:
            if self.restarts.may_start(child, now):
                self._spawn(child, now)
            return
        self.channel.send_changes(child)
        if self.endpoints.due(child, now):
            self.endpoints.publish(child, now)
        elif not child.ready and now - child.started > self.hcm.ready_timeout:
            log.error("exchange %s/%s not ready after %.0fs; killing it", *child.key, self.hcm.ready_timeout)
            child.process.kill()
        self.channel.record_commands(child)  # after the figures it reported with them: whoever sees it done sees those
        if child.ready and self._hung(child, now):
            log.error("exchange %s/%s has sent nothing for %.1fs (hung: stopped, frozen or stuck); killing it "
                      "so that it starts again (hcm.hung_timeout = %.0fs)", *child.key, now - child.reported,
                      self.hcm.hung_timeout)
            child.process.kill()

    def _hung(self, child: Child, now: float) -> bool:
        """Has a ready child sent nothing (no report) for `hcm.hung_timeout`? Not judged on a late
        tick (this process was held up itself). A frozen replica would stall every confirm of its
        primary, a frozen exchange its publishers: replaced like a dead one."""
        timeout = self.hcm.hung_timeout
        return timeout > 0 and not self.endpoints.late and now - child.reported > timeout

    def _drive_stop(self, child: Child, now: float) -> None:
        if child.process is None:
            return
        if child.stop_deadline is None:
            self.endpoints.unpublish(child)
            child.stop_deadline = now + self.hcm.stop_grace
            _signal(child.process, signal.SIGTERM)
        elif now >= child.stop_deadline:
            _signal(child.process, signal.SIGKILL)
        self._reap(child, now)

    # ------------------------------------------------------------ processes

    def _spawn(self, child: Child, now: float) -> None:
        queue, slot = child.key
        self.channel.storage.follow(queue)  # read now: the lines right after the configuration carry it
        command = [sys.executable, "-m", "exchange.main", "--queue", queue, "--id", primary_of(slot),
                   *self._role_arguments(child),
                   "--host", self.host, "--config-stdin", "--parent-pid", str(os.getpid()), "--json-logs"]
        child.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, close_fds=True)
        self.channel.open(child)
        child.started, child.ready, child.published = now, None, False
        child.written_at, child.written_stats, child.written_silent = None, None, False
        if child.next_start:
            child.restarts += 1
        log.info("started exchange %s/%s (pid %d)", queue, slot, child.process.pid)
        threading.Thread(target=self.channel.read_events, args=(child, child.process.stdout),
                         name=f"events-{queue}-{slot}", daemon=True).start()
        threading.Thread(target=_forward_logs, args=(child.key, child.process.pid, child.process.stderr),
                         name=f"logs-{queue}-{slot}", daemon=True).start()

    def _role_arguments(self, child: Child) -> list[str]:
        """`--role replica` for a replica slot, with the watch that follows its primary; for a
        primary, `--replicas N` from its queue's settings (read once per start), and with N = 2 the
        watch that follows its replica. Read before the process starts: a ZooKeeper error leaves
        the start to the next tick."""
        queue, slot = child.key
        if child.is_replica:
            if child.peer_watch is None and self.client is not None:
                child.peer_watch = watch_peer(self.client, self.paths, queue, slot, self.changed)
            return ["--role", "replica"]
        replicas = self._queue_replicas(queue)
        self.channel.follow_queue(queue)
        if replicas == 2 and child.peer_watch is None:
            child.peer_watch = watch_peer(self.client, self.paths, queue, slot, self.changed)
        return ["--role", "primary", "--replicas", str(replicas)]

    def _queue_replicas(self, queue: str) -> int:
        """Processes per exchange of `queue`, from its settings in ZooKeeper. Without a client (a
        supervisor driven by unit tests with stand-in processes) there is nothing to read: 1."""
        if self.client is None:
            return 1
        return replica_count(read_json(self.client, self.paths.queue(queue)) or {})

    def stop_all(self) -> None:
        """SIGTERM every child, wait out the grace period, SIGKILL the rest."""
        with self._lock:
            self.desired, self.stopping = set(), True  # together: a late assignment changes nothing
        self.changed.set()
        deadline = time.monotonic() + self.hcm.stop_grace + 1
        while self.children and time.monotonic() < deadline:
            self.tick()
            time.sleep(0.05)
        for child in self.children.values():
            if child.process and child.process.poll() is None:
                child.process.kill()
                child.process.wait()


def _signal(process: subprocess.Popen[bytes], sig: int) -> None:
    try:
        process.send_signal(sig)
    except ProcessLookupError:
        pass


def _forward_logs(key: Key, pid: int, stream: IO[bytes]) -> None:
    """Re-log a child's stderr through our logging, one record per line it writes.

    A JSON record (roq/daemon.py `JsonLinesFormatter`) keeps its level and logger name; any
    other line (a failure before the child's logging was set up, a C library's complaint) is
    a warning of the `exchange` logger."""
    prefix = f"{key[0]}/{key[1]}[{pid}]"
    for line in stream:
        text = line.decode(errors="replace").rstrip()
        if not text:
            continue
        try:
            record = json.loads(text)
        except ValueError:
            record = None
        if not isinstance(record, dict) or not isinstance(record.get("msg"), str):
            logging.getLogger("exchange").warning("%s %s", prefix, text)
            continue
        level = logging.getLevelName(str(record.get("level")))
        name = record.get("name")
        message = "\n".join(str(record[k]) for k in ("msg", "exc", "stack") if record.get(k))
        logging.getLogger(name if isinstance(name, str) and name else "exchange").log(
            level if isinstance(level, int) else logging.WARNING, "%s %s", prefix, message)
