"""`roq-exchange`: one exchange process, normally spawned by an HCM.

Talks to its parent through its pipes, one JSON object per line: the configuration, then the
replica's endpoint, the permission table and the queue's admin commands on stdin; `ready`, `stats`
and `command` events on stdout. It dies with its parent (PR_SET_PDEATHSIG, and EOF on stdin); on
SIGTERM it asks its publishers to move, then exits. With `--role replica` it is a replica
(exchange/replica.py). Exit codes that are not crashes: `Exit.ENDED` (its replica sealed the
incarnation) and `Exit.STORAGE` (its journal broke for good; a replica: a copy's store could not
keep it); `Exit.CONFIG` before ready. The
lines and codes in full: docs/architecture.md "An exchange and its HCM"; entry point and signals:
roq/daemon.py.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import zmq

from exchange.forwarder import Forwarder
from exchange.journal import JOURNAL_DIR, load_archives
from exchange.parts import Site
from exchange.replica import Replica, stored
from exchange.replica_disk import REPLICA_SUFFIX
from exchange.retention import Retention
from exchange.stats import rss_bytes
from exchange.store_hooks import store_dir
from roq import protocol
from roq.config import Config, config_from_json, load_config
from roq.daemon import Stop, run_daemon
from roq.errors import ConfigError, Exit, UserError
from roq.permissions import PermissionTable, from_message
from roq.security import Gatekeeper

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1
STDIN = 0
MOVE_GRACE = 0.5  # time for "move" notices to leave before the sockets close
JOURNAL_DOWNTIME = 3600.0  # a journal older than the retention by at most this is reloaded
MAX_PARENT_LINE = 2 << 20  # bytes: the permission table is the longest line a parent writes (512 KiB)
COMMANDS_WAIT = 5.0  # s an exchange under an HCM waits for its admin commands line before reading clients
POLICY_WAIT = 5.0  # s it waits for its queue's storage policy line (right after the configuration)


def die_with_parent(parent_pid: int | None) -> None:
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass  # not Linux: the stdin watch below still applies
    if parent_pid and os.getppid() != parent_pid:
        os._exit(Exit.OK)  # the parent died before prctl took effect: as on stdin EOF, nothing to serve


def watch_stdin(stop: threading.Event, on_line: Callable[[dict[str, Any]], None] | None = None) -> None:
    """Our parent holds stdin open; EOF means it is gone. Lines it writes meanwhile are JSON
    objects handed to `on_line` (anything else is ignored).

    Raw reads of fd 0, not sys.stdin: a daemon thread blocked inside a buffered reader's lock
    makes the interpreter abort at exit."""
    def wait_eof() -> None:
        pending = bytes(_after_config)
        try:
            while True:
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    _hand_over(line, on_line)
                chunk = os.read(STDIN, 4096)
                if not chunk:
                    break
                pending = pending[-MAX_PARENT_LINE:] + chunk  # a parent never writes lines this long
        except OSError:
            pass
        log.warning("parent went away (stdin closed); exiting")
        stop.set()
    threading.Thread(target=wait_eof, name="stdin-watch", daemon=True).start()


def _hand_over(line: bytes, on_line: Callable[[dict[str, Any]], None] | None) -> None:
    try:
        message = json.loads(line)
    except ValueError:
        return
    if on_line is not None and isinstance(message, dict):
        on_line(message)


_after_config = bytearray()  # what followed the configuration line in the same read: the watcher's


def read_config_line() -> str:
    """The one JSON line the HCM writes first, read unbuffered; what follows it (replica lines)
    is kept for watch_stdin."""
    data = b""
    while b"\n" not in data:
        chunk = os.read(STDIN, 1 << 16)
        if not chunk:
            break
        data += chunk
    line, _, rest = data.partition(b"\n")
    _after_config[:] = rest
    return line.decode()


def every(interval: float, action: Callable[[], None]) -> Callable[[], None]:
    """A loop tick that runs `action` once every `interval` seconds."""
    due = [time.monotonic() + interval]

    def tick() -> None:
        if time.monotonic() >= due[0]:
            due[0] = time.monotonic() + interval
            action()
    return tick


def emit(event: dict) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


@click.command()
@click.option("--queue", required=True)
@click.option("--id", "xid", required=True)
@click.option("--host", default="", help="host name this exchange runs on (for reports)")
@click.option("--role", type=click.Choice(["primary", "replica"]), default="primary",
              help="an exchange (primary), or the replica of exchange ID on another host")
@click.option("--replicas", type=click.IntRange(1, 2), default=1,
              help="2: confirm only what the replica holds too (its endpoint comes on stdin)")
@click.option("--config-json", default=None, help="the full configuration as JSON (for manual runs)")
@click.option("--config-stdin", is_flag=True,
              help="read the configuration as one JSON line from stdin, as the HCM passes it "
                   "(never on the command line, where other users could read its secrets)")
@click.option("--parent-pid", type=int, default=None)
@click.option("--watch-stdin/--no-watch-stdin", "watch_parent", default=True)
@click.option("--json-logs", is_flag=True, help="log JSON lines, for the HCM to re-log (as it passes)")
def main(queue: str, xid: str, host: str, role: str, replicas: int, config_json: str | None,
         config_stdin: bool, parent_pid: int | None, watch_parent: bool, json_logs: bool) -> None:
    """Run one exchange of QUEUE (normally started by roq-hcm)."""
    die_with_parent(parent_pid)

    def load() -> Config:
        text = read_config_line() if config_stdin else config_json
        return config_from_json(text) if text else load_config()

    def body(config: Config, stop: Stop) -> Exit:
        if role == "replica":
            return serve_replica(config, stop, queue, xid, watch_parent)
        return serve(config, stop, queue, xid, replicas, watch_parent)

    run_daemon("roq-exchange", load, f"exchange {queue}/{xid}", body, json_logs=json_logs)


def journal_dir(config: Config, queue: str, xid: str) -> Path:
    return Path(config.hcm.data_dir) / JOURNAL_DIR / queue / xid


def load_journal_archives(config: Config, directory: Path) -> dict[str, Retention]:
    """Earlier incarnations' streams from the journal, as retention the replay socket serves. With
    `exchange.journal = off` too: journals an earlier configuration left are served read-only, never
    dropped in silence (a WARNING names them)."""
    ex = config.exchange
    archives: dict[str, Retention] = {}
    if ex.journal == "off" and not directory.is_dir():
        return archives
    # Downtime does not count against the retention (up to JOURNAL_DOWNTIME): a host that was off
    # for a while still serves what it confirmed, for a full retention window after it starts.
    for archive in load_archives(directory, "", ex.retention_seconds + JOURNAL_DOWNTIME, ex.retention_bytes):
        store = Retention(ex.retention_seconds, ex.retention_bytes, first_pos=archive.lost_before)
        stored_at = time.monotonic()
        for frame in archive.frames:
            store.add(frame.topic, frame.body, frame.messages, stored_at, protocol.body_topics(frame.body))
        archives[archive.incarnation] = store
        log.info("journal: incarnation %s reloaded, positions %d-%d", archive.incarnation,
                 store.oldest, store.next_pos - 1)
    if ex.journal == "off" and archives:
        held = ", ".join(f"{name} (positions {store.oldest}-{store.next_pos - 1}, {len(store)} frames)"
                         for name, store in archives.items())
        log.warning("exchange.journal is off, but %s holds the journals of earlier incarnations: %s; served "
                    "read-only on the replay socket for exchange.retention_seconds, never written to (they were "
                    "confirmed with a journal: set exchange.journal back to keep journaling)", directory, held)
    return archives


def serve(config: Config, stop: threading.Event, queue: str, xid: str, replicas: int = 1,
          watch_parent: bool = False) -> Exit:
    """Bind, report ready, forward until `stop` is set, then ask publishers to move and close.
    Returns Exit.ENDED if the replica sealed this incarnation (the HCM starts a new one at once),
    Exit.STORAGE if its journal broke for good (the HCM starts a new one after its backoff)."""
    context = zmq.Context()
    try:
        gatekeeper = Gatekeeper(context, config, f"exchange {queue}/{xid}", queue)  # ConfigError: bad keys
        advertise = config.hcm.advertise or config.hcm.bind
        directory = journal_dir(config, queue, xid)
        archives = load_journal_archives(config, directory)
        site = Site(xid, config.hcm.bind, advertise, gatekeeper, replicas=replicas, cluster_config=config,
                    journal_dir=str(directory), archives=archives,
                    store_root=str(store_dir(config.hcm.data_dir, queue, xid)))
        forwarder = Forwarder.open(context, config.exchange, site)
    except BaseException:
        context.destroy(linger=0)  # a socket bound before the failure must not hold up the exit
        raise
    if watch_parent:
        forwarder.commands.await_first(COMMANDS_WAIT)
        watch_stdin(stop, lambda message: _on_parent_line(gatekeeper, config, forwarder, message))
    disk = forwarder.parts.disk  # the queue's frames beyond the memory tail, if its policy keeps them on disk
    disk.start(disk.inbox.first(POLICY_WAIT) if watch_parent else None)
    forwarder.restore_groups()  # a disk-retained queue's groups, from their cursor files
    gatekeeper.start()

    def report() -> None:
        emit({"event": "stats", **forwarder.report().to_dict()})

    def stats_tick() -> None:
        disk.tick()  # a new storage policy, the store synced and its retention applied
        forwarder.parts.cursors.tick()  # the groups' floors, their cursor files synced
        report()

    on_tick = every(config.exchange.stats_interval, stats_tick)

    def command_done(command_id: str, result: dict[str, Any]) -> None:
        report()  # first the figures the command changed: who sees it done sees them (hcm/supervisor.py)
        emit({"event": "command", "id": command_id, "result": result})

    forwarder.on_command = command_done
    try:
        await_permissions(gatekeeper, config, stop, watch_parent)
        emit({"event": "ready", "pub": forwarder.pub_endpoint, "sub": forwarder.sub_endpoint,
              "replay": forwarder.replay_endpoint, "work": forwarder.work_endpoint,
              "incarnation": forwarder.incarnation, "pid": os.getpid(),
              "replicas": replicas, "archived": sorted(set(forwarder.archives) | set(disk.archived)),
              "copy_digest": protocol.copy_digest(forwarder.copy_secret)})
        log.info("exchange %s/%s ready: publishers %s, subscribers %s", queue, xid,
                 forwarder.pub_endpoint, forwarder.sub_endpoint)
        forwarder.run(stop.is_set, on_tick)
        moved = forwarder.ask_publishers_to_move()  # why: cut off from its replica, its disk, or shutting down
        if moved:
            deadline = time.monotonic() + MOVE_GRACE
            forwarder.run(lambda: time.monotonic() > deadline, lambda: None, until_sealed=False)
    except BrokenPipeError:
        pass  # parent gone
    finally:
        forwarder.close()
        gatekeeper.stop()
        context.term()
    log.info("exchange %s/%s stopped", queue, xid)
    if forwarder.sealed:
        return Exit.ENDED
    return Exit.STORAGE if forwarder.journal_failed else Exit.OK


def _take_permissions(gatekeeper: Gatekeeper, config: Config, message: dict[str, Any]) -> None:
    """The HCM's permission table, if the line holds one (stdin thread): the gatekeeper takes it whole."""
    if "permissions" in message:
        try:
            gatekeeper.set_permissions(from_message(message["permissions"], config.security.default_permissions))
        except UserError as exc:
            log.error("ignored a permission table from the HCM, keeping the previous one: %s", exc)


def _on_parent_line(gatekeeper: Gatekeeper, config: Config, forwarder: Forwarder, message: dict[str, Any]) -> None:
    """The HCM sends the permission table, the queue's admin commands or its storage policy, or says
    where our replica is (stdin thread: the loop connects, and applies the commands and the policy)."""
    _take_permissions(gatekeeper, config, message)
    forwarder.parts.disk.inbox.deliver(message)
    if "commands" in message:
        forwarder.commands.deliver(message)
    if "replica" not in message:
        return
    replica = message["replica"]
    endpoint = replica.get("repl") if isinstance(replica, dict) else None
    forwarder.replica_target = endpoint if isinstance(endpoint, str) and endpoint.startswith("tcp://") else None


def _on_primary_line(gatekeeper: Gatekeeper, config: Config, replica: Replica, message: dict[str, Any]) -> None:
    """The HCM sends the permission table, or says which incarnation of our primary runs, and its
    copy digest (stdin thread)."""
    _take_permissions(gatekeeper, config, message)
    replica.disk.inbox.deliver(message)
    if "primary" in message:
        primary = message["primary"]
        replica.learn_primary(primary if isinstance(primary, dict) else None)


def await_permissions(gatekeeper: Gatekeeper, config: Config, stop: threading.Event, from_parent: bool) -> None:
    """With CURVE, wait for the HCM's first permission table before reporting ready (it comes right
    after the configuration); ConfigError if it has not come within hcm.ready_timeout. Without a
    parent to send one, every key gets security.default_permissions."""
    if gatekeeper.keys is None:
        return
    if not from_parent:
        gatekeeper.set_permissions(PermissionTable(default=config.security.default_permissions))
        return
    deadline = time.monotonic() + config.hcm.ready_timeout
    while not gatekeeper.wait_permissions(0.1):  # in slices: a SIGTERM meanwhile ends the wait
        if stop.is_set():
            return
        if time.monotonic() > deadline:
            raise ConfigError(f"no permission table from the HCM within {config.hcm.ready_timeout:.0f}s")


def serve_replica(config: Config, stop: threading.Event, queue: str, xid: str,
                  watch_parent: bool = False) -> Exit:
    """Bind, report ready, keep copies of xid's stream until `stop` is set. Returns Exit.STORAGE if
    a copy's store could not keep it (exchange/replica_health.py: the HCM starts the replica again)."""
    context = zmq.Context()
    try:
        gatekeeper = Gatekeeper(context, config, f"replica {queue}/{xid}", queue)
        advertise = config.hcm.advertise or config.hcm.bind
        replica = Replica(context, config, xid, config.hcm.bind, advertise, gatekeeper,
                          store_root=store_dir(config.hcm.data_dir, queue, xid + REPLICA_SUFFIX))
    except BaseException:
        context.destroy(linger=0)
        raise
    if watch_parent:
        watch_stdin(stop, lambda message: _on_primary_line(gatekeeper, config, replica, message))
    replica.disk.start(replica.disk.inbox.first(POLICY_WAIT) if watch_parent else None)
    gatekeeper.start()

    announced: list[list[str]] = []  # the `stored` of the last ready event

    def announce() -> None:
        """The ready event, again whenever the ended incarnations we serve change: our HCM writes
        them to our znode (`stored`), where subscribers starting from the beginning find them."""
        announced[:] = [stored(replica)]
        emit({"event": "ready", "repl": replica.repl_endpoint, "replay": replica.replay_endpoint,
              "incarnation": replica.incarnation, "pid": os.getpid(), "stored": announced[0]})

    def report() -> None:
        replica.disk.tick()  # written frames synced before the report, as an exchange's store
        replica.group_files.sync()
        emit({"event": "stats", **replica.report(), **gatekeeper.snapshot(), "rss_bytes": rss_bytes()})
        if announced and stored(replica) != announced[0]:
            announce()
    on_tick = every(config.exchange.stats_interval, report)
    try:
        await_permissions(gatekeeper, config, stop, watch_parent)
        announce()
        log.info("replica of %s/%s ready: copies at %s, fetches at %s", queue, xid,
                 replica.repl_endpoint, replica.replay_endpoint)
        replica.run(stop.is_set, on_tick)
    except BrokenPipeError:
        pass
    finally:
        replica.close()
        gatekeeper.stop()
        context.term()
    log.info("replica of %s/%s stopped", queue, xid)
    return Exit.STORAGE if replica.gave_up else Exit.OK


if __name__ == "__main__":
    main()
