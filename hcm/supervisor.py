"""Supervision of the exchange processes of one host: desired vs actual, on a tick.

Each tick: reap exited children (their live endpoint is removed at once),
stop children no longer assigned, start assigned ones whose backoff has
elapsed, publish endpoints of children that reported ready, kill children
that never became ready. Restarts back off exponentially up to a cap and the
backoff resets once a child has stayed up `stable_after` seconds.

Flapping (like circus's `max_retry`): every exit the HCM did not ask for is a
crash, whatever its code (`Exit.CONFIG` included), a signal, or a kill for not
becoming ready; except `Exit.ENDED` (below) and `Exit.STORAGE`, an exchange whose
journal's disk broke for good and that ended its incarnation to start afresh
(exchange/storage.py): it is restarted with the same backoff but never counts
towards FAILED (a disk is not a bug in the exchange, and the leader moves
exchanges off a host whose disk refuses).
An exchange that crashes more than `hcm.max_restarts` times within
`hcm.restart_window` seconds (so was restarted `max_restarts` times already)
is marked failed: one ERROR line, no live endpoint, no restart, and the
`roq_exchange_failed` gauge at 1. It is left alone for `hcm.failed_cooloff`
seconds (at least the window), then started again with a fresh budget; or
sooner if its assignment changes: once unassigned, its record is dropped, and
a later assignment starts from scratch. The GCM is not told; clients see the
exchange as not running.

Replicas: an assignment of a replica slot (`x1~r`, roq.paths.replica_slot) runs
`exchange.main --role replica --id x1`. Its ready event carries `repl` and `replay`
(no pub/sub), and it is published at `replicas/<q>/<x>` instead of `live/<q>/<x>`,
with the same lifecycle (removed when it exits or is stopped, published again after
a session loss, its statistics refreshed). The two halves of a replicated exchange
hear of each other through a `PeerWatch` (a kazoo DataWatch, kept across restarts,
stopped when the child is dropped), as JSON lines on their stdin: right after the
configuration line, and again whenever what they need changes (not on a statistics
refresh). A primary reads its queue's settings once at each start; with replicas 2
it gets `--replicas 2` and hears where its replica is, from `replicas/<q>/<x>`:
`{"replica": {"repl": endpoint, "incarnation": R}}` or `{"replica": null}`. A
replica hears which incarnation of its primary runs and the digest of that
incarnation's copy secret, from `live/<q>/<x>`: `{"primary": {"incarnation": I,
"copy_digest": D}}` or `{"primary": null}` (exchange/replica.py: only copies proved
by that secret are taken, only ended incarnations are sealed). The watch only
records the value and wakes the tick; the tick thread writes to the pipe.

Two exits are not crashes: one we asked for (a stop), and `Exit.ENDED`, an
exchange whose replica sealed its incarnation (the cluster saw it end): it
starts again at once. A ready child that sends no report for `hcm.hung_timeout`
(stopped, frozen, stuck: the znode already says `silent`) is killed, which counts
as a crash, and started again: a frozen replica would stall its primary's
confirms for as long as it hangs.

Permissions: with CURVE on, the HCM follows the permission table (hcm/permissions.py) and every
child, exchange or replica, hears it as `{"permissions": {"version": N, "table": {...}}}` right
after its configuration (and peer) line, and again whenever the table changes; the tick writes
it, as it does the peer lines.

Admin commands: every primary child hears its queue's admin commands (a group reset or deleted, the
queue purged) as `{"commands": [...], "purged": {...}}` right after its configuration (and peer and
permission) lines, and again whenever what it must hear changes; a `QueueCommands` per queue follows
them (hcm/commands.py). A child's `{"event": "command", "id", "result"}` report is recorded in
ZooKeeper by the tick, which then stops handing it that command.

Statistics: each ready child's znode is written again when its report changed
materially, when it stopped (or resumed) reporting, and otherwise once every
`hcm.stats_heartbeat` seconds (the rule: hcm/heartbeat.py); never every report.

Children are started from the thread that runs `tick()` — the daemon's main
thread — because PR_SET_PDEATHSIG fires when the spawning thread exits.
Their stdout (ready and stats events) and stderr (logs) are read by one
thread each. Logs go through this process's logging (`_forward_logs`): the
child writes one JSON record per line (`--json-logs`), re-logged here at its
level under its logger's name, prefixed with the child's queue/id[pid]; so
lines, tracebacks included, never interleave.
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
from dataclasses import dataclass, field, replace
from typing import IO, Any

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError, NoNodeError

from hcm.commands import QueueCommands
from hcm.heartbeat import SILENT_AFTER, exchange_changed, write_due
from hcm.permissions import PermissionsWatch
from roq.config import Config
from roq.errors import Exit
from roq.paths import Paths, is_replica_slot, primary_of
from roq.permissions import PermissionTable, to_message
from roq.records import ExchangeStats
from roq.state import replica_count
from roq.zk import create_ephemeral, decode, encode, read_json

log = logging.getLogger(__name__)

Key = tuple[str, str]  # (queue, slot): an exchange id ("x1") or a replica slot ("x1~r")
# What is published of an exchange's ready event, at live/<q>/<x>; it counts only if it names the
# first two (its endpoints).
READY_FIELDS = ("pub", "sub", "replay", "work", "incarnation", "pid", "replicas", "archived", "copy_digest")
REPLICA_READY_FIELDS = ("repl", "replay", "incarnation", "pid")  # of a replica, at replicas/<q>/<x>
_UNSENT = object()  # no replica line written to this process yet


class PeerWatch:
    """The other half of a replicated exchange, followed by a kazoo DataWatch: for a primary child
    its replica (`replicas/<q>/<x>`: where to copy), for a replica child its primary (`live/<q>/<x>`:
    which incarnation runs, and the digest of its copy secret).

    The callback runs in kazoo's thread (the first one in the constructor's): it only records the
    target and wakes the tick, which writes it to the child as `{line: target}`."""

    def __init__(self, client: KazooClient, path: str, line: str, fields: tuple[str, ...],
                 wake: threading.Event) -> None:
        self.line = line
        self.fields = fields  # what the child hears of the znode; the first must be present
        self.target: dict[str, Any] | None = None  # while the peer runs
        self.stopped = False
        self._wake = wake
        client.DataWatch(path, self._on_data)

    def _on_data(self, data: bytes | None, _stat: Any, _event: Any = None) -> bool | None:
        if self.stopped:
            return False  # kazoo drops the watch
        found = decode(data) if data is not None else {}
        target = {key: found.get(key) for key in self.fields} if found.get(self.fields[0]) else None
        if target != self.target:
            self.target = target
            self._wake.set()
        return None

    def stop(self) -> None:
        """The watch ends at its next event (kazoo has no other way to drop one)."""
        self.stopped = True


@dataclass
class Child:
    key: Key
    process: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    ready: dict[str, Any] | None = None
    stats: ExchangeStats | None = None  # the latest report, None until the first
    reported: float = 0.0  # monotonic: when the latest report (or the ready event) arrived
    published: bool = False
    written_at: float | None = None  # monotonic: when the znode was last written (hcm/heartbeat.py)
    written_stats: ExchangeStats | None = None  # the report it holds
    written_silent: bool = False  # whether it says the child stopped reporting
    failures: int = 0
    next_start: float = 0.0
    stop_deadline: float | None = None
    restarts: int = 0
    crashes: tuple[float, ...] = ()  # when it crashed, within the last restart_window
    failed_until: float | None = None  # crashed too often: left alone until then
    peer_watch: PeerWatch | None = None  # a replicated exchange's other half (its replica, or its primary)
    peer_sent: Any = _UNSENT  # the peer target last written to this process
    permissions_sent: PermissionTable | None = None  # the permission table last written to it
    commands_sent: dict[str, Any] | None = None  # the admin commands line last written to it
    command_reports: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # from its events, to record
    stats_forced: bool = False  # it reported a command done: its figures changed, write them at once

    @property
    def is_replica(self) -> bool:
        return is_replica_slot(self.key[1])


class Supervisor:
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
        # With CURVE the children judge keys by the permission table, which they hear from us (without a
        # client, a supervisor driven by unit tests, there is none to follow).
        self.permissions = PermissionsWatch(client, paths.permissions, config.security.default_permissions,
                                            self.changed) if config.security.curve and client is not None else None
        self.commands: dict[str, QueueCommands] = {}  # by queue, while a primary of it runs here
        self._last_tick: float | None = None
        self._late = False  # this tick came a report interval later than hcm.tick after the previous one

    # ------------------------------------------------------------ inputs

    def set_desired(self, keys: set[Key]) -> None:
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
        self._late = self._last_tick is not None and \
            now - self._last_tick > self.hcm.tick + self.config.exchange.stats_interval
        self._last_tick = now
        with self._lock:
            desired = set(self.desired)
        for child in list(self.children.values()):
            self._reap(child, now)
        for key in desired - set(self.children):
            self.children[key] = Child(key)
        self._refresh_commands()
        for key, child in list(self.children.items()):
            if key in desired:
                self._keep_running(child, now)
            else:
                self._drive_stop(child, now)
                if child.process is None:
                    if child.peer_watch:
                        child.peer_watch.stop()
                    del self.children[key]

    def _refresh_commands(self) -> None:
        """Read the queues' admin commands that changed; stop following a queue no primary runs here."""
        served = {queue for (queue, slot), child in self.children.items() if not child.is_replica}
        for queue in list(self.commands):
            if queue in served:
                self.commands[queue].refresh()
            else:
                self.commands.pop(queue).stop()

    def _reap(self, child: Child, now: float) -> None:
        if child.process is None or child.process.poll() is None:
            return
        code = child.process.returncode
        self._unpublish(child)
        uptime = now - child.started
        expected = child.stop_deadline is not None
        child.process, child.ready, child.stop_deadline = None, None, None
        if expected:
            log.info("exchange %s/%s stopped", *child.key)
            return
        if code == Exit.ENDED:  # its replica sealed it: the cluster had seen it end, not a crash
            child.next_start = now
            log.info("exchange %s/%s ended its incarnation (sealed by its replica); starting a new one",
                     *child.key)
            return
        if code == Exit.STORAGE:
            self._restart_later(child, now, uptime)
            log.warning("exchange %s/%s ended its incarnation after %.1fs: its journal's disk failed (exit %d, "
                        "not counted as a crash); restarting in %.1fs", *child.key, uptime, code,
                        child.next_start - now)
            return
        child.crashes = tuple(t for t in child.crashes if now - t < self.hcm.restart_window) + (now,)
        if len(child.crashes) > self.hcm.max_restarts:
            child.failed_until = now + self.hcm.failed_cooloff
            log.error("exchange %s/%s exited with code %s after %.1fs: FAILED, %d crashes within %.0fs "
                      "(hcm.max_restarts = %d); not restarted for %.0fs or until it is reassigned",
                      *child.key, code, uptime, len(child.crashes), self.hcm.restart_window,
                      self.hcm.max_restarts, self.hcm.failed_cooloff)
            return
        self._restart_later(child, now, uptime)
        log.warning("exchange %s/%s exited with code %s after %.1fs; restarting in %.1fs",
                    *child.key, code, uptime, child.next_start - now)

    def _restart_later(self, child: Child, now: float, uptime: float) -> None:
        """Back off exponentially, from the start again once it had stayed up `stable_after`."""
        child.failures = 0 if uptime >= self.hcm.stable_after else child.failures + 1
        child.next_start = now + min(self.hcm.restart_backoff * 2 ** max(child.failures - 1, 0),
                                     self.hcm.restart_backoff_max)

    def _keep_running(self, child: Child, now: float) -> None:
        if child.process is None:
            if child.failed_until is not None:
                if now < child.failed_until:
                    return
                log.warning("exchange %s/%s: cool-off over, starting it again", *child.key)
                child.failed_until, child.crashes, child.failures = None, (), 0
                child.next_start = now
            if now >= child.next_start:
                self._spawn(child, now)
            return
        self._send_peer(child)
        self._send_permissions(child)
        self._send_commands(child)
        if child.ready and (not child.published or self._stats_due(child, now)):
            self._publish(child, now)
        elif not child.ready and now - child.started > self.hcm.ready_timeout:
            log.error("exchange %s/%s not ready after %.0fs; killing it", *child.key, self.hcm.ready_timeout)
            child.process.kill()
        self._record_commands(child)  # after the figures it reported with them: whoever sees it done sees those
        if child.ready and self._hung(child, now):
            log.error("exchange %s/%s has sent nothing for %.1fs (hung: stopped, frozen or stuck); killing it "
                      "so that it starts again (hcm.hung_timeout = %.0fs)", *child.key, now - child.reported,
                      self.hcm.hung_timeout)
            child.process.kill()

    def _drive_stop(self, child: Child, now: float) -> None:
        if child.process is None:
            return
        if child.stop_deadline is None:
            self._unpublish(child)
            child.stop_deadline = now + self.hcm.stop_grace
            _signal(child.process, signal.SIGTERM)
        elif now >= child.stop_deadline:
            _signal(child.process, signal.SIGKILL)
        self._reap(child, now)

    # ------------------------------------------------------------ processes

    def _spawn(self, child: Child, now: float) -> None:
        queue, slot = child.key
        command = [sys.executable, "-m", "exchange.main", "--queue", queue, "--id", primary_of(slot),
                   *self._role_arguments(child),
                   "--host", self.host, "--config-stdin", "--parent-pid", str(os.getpid()), "--json-logs"]
        child.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, close_fds=True)
        # The configuration goes through the pipe, not argv (which every local user can read);
        # the pipe then stays open: its EOF tells the child that we are gone.
        child.peer_sent, child.permissions_sent, child.commands_sent = _UNSENT, None, None
        _write_line(child, self.config.to_json().encode())
        self._send_peer(child)
        self._send_permissions(child)
        self._send_commands(child)
        child.started, child.ready, child.published = now, None, False
        child.written_at, child.written_stats, child.written_silent = None, None, False
        if child.next_start:
            child.restarts += 1
        log.info("started exchange %s/%s (pid %d)", queue, slot, child.process.pid)
        threading.Thread(target=self._read_events, args=(child, child.process.stdout),
                         name=f"events-{queue}-{slot}", daemon=True).start()
        threading.Thread(target=_forward_logs, args=(child.key, child.process.pid, child.process.stderr),
                         name=f"logs-{queue}-{slot}", daemon=True).start()

    def _role_arguments(self, child: Child) -> list[str]:
        """`--role replica` for a replica slot, with the watch that follows its primary; for a
        primary, `--replicas N` from its queue's settings (read once per start), and with N = 2 the
        watch that follows its replica. Read before the process starts: a ZooKeeper error leaves
        the start to the next tick."""
        queue, slot = child.key
        xid = primary_of(slot)
        if child.is_replica:
            if child.peer_watch is None and self.client is not None:
                child.peer_watch = PeerWatch(self.client, self.paths.live_exchange(queue, xid), "primary",
                                             ("incarnation", "copy_digest"), self.changed)
            return ["--role", "replica"]
        replicas = self._queue_replicas(queue)
        if queue not in self.commands and self.client is not None:
            self.commands[queue] = QueueCommands(self.client, self.paths, queue, self.changed,
                                                 self.config.exchange.publisher_ttl)
            self.commands[queue].refresh()  # the first line goes right after the configuration
        if replicas == 2 and child.peer_watch is None:
            child.peer_watch = PeerWatch(self.client, self.paths.replica_live(queue, xid), "replica",
                                         ("repl", "incarnation"), self.changed)
        return ["--role", "primary", "--replicas", str(replicas)]

    def _queue_replicas(self, queue: str) -> int:
        """Processes per exchange of `queue`, from its settings in ZooKeeper. Without a client (a
        supervisor driven by unit tests with stand-in processes) there is nothing to read: 1."""
        if self.client is None:
            return 1
        return replica_count(read_json(self.client, self.paths.queue(queue)) or {})

    def _send_peer(self, child: Child) -> None:
        """Tell a replicated exchange where its other half is, if that changed since it last heard."""
        if child.peer_watch is None or child.process is None:
            return
        target = child.peer_watch.target
        if target != child.peer_sent:
            child.peer_sent = target
            _write_line(child, json.dumps({child.peer_watch.line: target}).encode())

    def _send_permissions(self, child: Child) -> None:
        """Give a child the permission table, if it changed since the child last heard."""
        table = self.permissions.table if self.permissions is not None else None
        if table is not None and child.process is not None and table is not child.permissions_sent:
            child.permissions_sent = table
            _write_line(child, json.dumps(to_message(table), separators=(",", ":")).encode())

    def _send_commands(self, child: Child) -> None:
        """Give a primary child its queue's admin commands, if what it must hear changed."""
        commands = self.commands.get(child.key[0])
        if commands is None or child.process is None or child.is_replica:
            return
        line = commands.line(child.key[1])
        if line != child.commands_sent:
            child.commands_sent = line
            _write_line(child, json.dumps(line, separators=(",", ":")).encode())

    def _record_commands(self, child: Child) -> None:
        """Record the commands the child reported done; what ZooKeeper refuses now waits for the next tick."""
        commands = self.commands.get(child.key[0])
        while child.command_reports and commands is not None:
            command_id, result = child.command_reports[0]
            if not commands.record(child.key[1], command_id, result):
                return
            child.command_reports.pop(0)

    def _read_events(self, child: Child, stream: IO[bytes]) -> None:
        fields = REPLICA_READY_FIELDS if child.is_replica else READY_FIELDS
        for line in stream:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event.get("event") == "ready" and all(event.get(key) for key in fields[:2]):  # its endpoints
                child.reported = time.monotonic()
                child.ready = {key: event.get(key) for key in fields}
                self.changed.set()
            elif event.get("event") == "command" and isinstance(event.get("id"), str):
                child.command_reports.append((event["id"], event.get("result") or {}))
                child.stats_forced = True  # the report it sent just before shows what the command did
                self.changed.set()
            elif event.get("event") == "stats":
                # When it arrived: a frozen exchange stops reporting, and clients see its figures age.
                child.stats = replace(ExchangeStats.from_dict(event), at=round(time.time(), 3))
                child.reported = time.monotonic()

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

    # ------------------------------------------------------------ endpoints

    def _endpoint_path(self, child: Child) -> str:
        queue, slot = child.key
        if child.is_replica:
            return self.paths.replica_live(queue, primary_of(slot))
        return self.paths.live_exchange(queue, slot)

    def _silent(self, child: Child, now: float) -> bool:
        """Has the child stopped reporting (frozen, stuck)? Not judged on a late tick: then this
        process was held up itself, and the reports that came meanwhile may not be read yet."""
        if self._late:
            return child.written_silent
        return now - child.reported > SILENT_AFTER * self.config.exchange.stats_interval

    def _hung(self, child: Child, now: float) -> bool:
        """Has a ready child sent nothing (no report) for `hcm.hung_timeout`? Not judged on a late
        tick (this process was held up itself). A frozen replica would stall every confirm of its
        primary, a frozen exchange its publishers: replaced like a dead one."""
        timeout = self.hcm.hung_timeout
        return timeout > 0 and not self._late and now - child.reported > timeout

    def _stats_due(self, child: Child, now: float) -> bool:
        """Write the published child's statistics again now? On a material change of its report, on
        its silence starting or ending, else on the heartbeat; a silent child's once (hcm/heartbeat.py)."""
        silent = self._silent(child, now)
        if silent or child.written_silent:
            return silent != child.written_silent
        if child.stats_forced:
            return True
        return write_due(child.written_at, now, exchange_changed(child.written_stats, child.stats),
                         self.hcm.stats_heartbeat, self.config.exchange.stats_interval)

    def _publish(self, child: Child, now: float) -> None:
        assert child.ready is not None
        report, silent = child.stats, self._silent(child, now)
        stats = report.to_dict() if report else {}  # {} until the first report
        # `heartbeat`: the longest this znode goes unwritten while the child reports (its stats.at at
        # most that old); `stats_interval`: how often it reports, so clients can judge that age too;
        # `silent`: it stopped reporting (stats.at is its last report's).
        data = dict(child.ready, host=self.host, stats=stats, restarts=child.restarts,
                    heartbeat=self.hcm.stats_heartbeat, stats_interval=self.config.exchange.stats_interval,
                    silent=silent)
        path = self._endpoint_path(child)
        try:
            if child.published:
                self.client.set(path, encode(data))
            else:
                create_ephemeral(self.client, path, data)
                log.info("exchange %s/%s live at %s", *child.key, child.ready.get("pub") or child.ready.get("repl"))
            if silent != child.written_silent:
                log.warning("exchange %s/%s %s", *child.key,
                            f"has sent no statistics for {now - child.reported:.1f}s: published as silent"
                            if silent else "reports again")
            child.published = True
            child.written_at, child.written_stats, child.written_silent = now, report, silent
            child.stats_forced = False
        except NodeExistsError:
            pass  # an older session's endpoint, about to expire: retry next tick
        except NoNodeError:
            child.published = False

    def _unpublish(self, child: Child) -> None:
        if not child.published:
            return
        child.published = False
        try:
            self.client.delete(self._endpoint_path(child))
        except NoNodeError:
            pass
        except Exception as exc:  # connection trouble: the session's end removes it
            log.warning("could not remove endpoint of %s/%s: %s", *child.key, exc)


def _write_line(child: Child, line: bytes) -> None:
    """One line to the child's stdin; a child that died meanwhile is reaped on the next tick."""
    assert child.process is not None and child.process.stdin is not None
    try:
        child.process.stdin.write(line + b"\n")
        child.process.stdin.flush()
    except (BrokenPipeError, ValueError):  # ValueError: its pipe is closed already
        pass


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
