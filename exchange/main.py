"""`roq-exchange`: one exchange process, normally spawned by an HCM.

Talks to its parent through stdout, one JSON object per line: first
{"event": "ready", "pub": ..., "sub": ..., "replay": ...} once its sockets are bound, then
{"event": "stats", ...} every `exchange.stats_interval`. Logs go to stderr,
as JSON lines under an HCM (`--json-logs`), which re-logs them.
It dies with its parent: PR_SET_PDEATHSIG on Linux, and EOF on stdin
everywhere (the parent holds the other end). On SIGTERM it asks its
publishers to move, then exits. A configuration it refuses (including CURVE
keys it cannot read) exits with `Exit.CONFIG`, before it reports ready; entry
point, signals and exit codes: roq/daemon.py.
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
from dataclasses import replace

import click
import zmq

from exchange.forwarder import Forwarder
from roq.config import Config, config_from_json, load_config
from roq.daemon import Stop, run_daemon
from roq.errors import Exit
from roq.security import Gatekeeper

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1
STDIN = 0
MOVE_GRACE = 0.5  # time for "move" notices to leave before the sockets close


def die_with_parent(parent_pid: int | None) -> None:
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass  # not Linux: the stdin watch below still applies
    if parent_pid and os.getppid() != parent_pid:
        os._exit(Exit.OK)  # the parent died before prctl took effect: as on stdin EOF, nothing to serve


def watch_stdin(stop: threading.Event) -> None:
    """Our parent holds stdin open; EOF means it is gone.

    Raw reads of fd 0, not sys.stdin: a daemon thread blocked inside a buffered reader's lock
    makes the interpreter abort at exit."""
    def wait_eof() -> None:
        try:
            while os.read(STDIN, 4096):
                pass
        except OSError:
            pass
        log.warning("parent went away (stdin closed); exiting")
        stop.set()
    threading.Thread(target=wait_eof, name="stdin-watch", daemon=True).start()


def read_config_line() -> str:
    """The one JSON line the HCM writes first, read unbuffered so nothing after it is consumed."""
    chunks: list[bytes] = []
    while not chunks or not chunks[-1].endswith(b"\n"):
        chunk = os.read(STDIN, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks).decode()


def _rss_bytes() -> int:
    """This process's resident memory (Linux), so a leak shows in the statistics."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def emit(event: dict) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


@click.command()
@click.option("--queue", required=True)
@click.option("--id", "exchange_id", required=True)
@click.option("--host", default="", help="host name this exchange runs on (for reports)")
@click.option("--config-json", default=None, help="the full configuration as JSON (for manual runs)")
@click.option("--config-stdin", is_flag=True,
              help="read the configuration as one JSON line from stdin, as the HCM passes it "
                   "(never on the command line, where other users could read its secrets)")
@click.option("--parent-pid", type=int, default=None)
@click.option("--watch-stdin/--no-watch-stdin", "watch_parent", default=True)
@click.option("--json-logs", is_flag=True, help="log JSON lines, for the HCM to re-log (as it passes)")
def main(queue: str, exchange_id: str, host: str, config_json: str | None, config_stdin: bool,
         parent_pid: int | None, watch_parent: bool, json_logs: bool) -> None:
    """Run one exchange of QUEUE (normally started by roq-hcm)."""
    die_with_parent(parent_pid)

    def load() -> Config:
        text = read_config_line() if config_stdin else config_json
        return config_from_json(text) if text else load_config()

    def body(config: Config, stop: Stop) -> None:
        if watch_parent:
            watch_stdin(stop)
        serve(config, stop, queue, exchange_id)

    run_daemon("roq-exchange", load, f"exchange {queue}/{exchange_id}", body, json_logs=json_logs)


def serve(config: Config, stop: threading.Event, queue: str, exchange_id: str) -> None:
    """Bind, report ready, forward until `stop` is set, then ask publishers to move and close."""
    context = zmq.Context()
    try:
        gatekeeper = Gatekeeper(context, config, f"exchange {queue}/{exchange_id}")  # ConfigError: bad keys
        advertise = config.hcm.advertise or config.hcm.bind
        forwarder = Forwarder(context, config.exchange, exchange_id, config.hcm.bind, advertise, gatekeeper)
    except BaseException:
        context.destroy(linger=0)  # a socket bound before the failure must not hold up the exit
        raise
    gatekeeper.start()
    interval = config.exchange.stats_interval
    next_report = [time.monotonic() + interval]

    def on_tick() -> None:
        if time.monotonic() >= next_report[0]:
            next_report[0] = time.monotonic() + interval
            retention = forwarder.retention
            report = replace(forwarder.stats.snapshot(), refused_connections=gatekeeper.refused,
                             refused_over_limit=gatekeeper.refused_limit,
                             retained_frames=len(retention), retained_bytes=retention.bytes,
                             evicted_frames=retention.evicted, known_publishers=len(forwarder.sessions.sessions),
                             expired_publishers=forwarder.sessions.expired,
                             tracked_prefixes=len(forwarder.chains.last), replay_held_bytes=forwarder.replay.held,
                             rss_bytes=_rss_bytes())
            emit({"event": "stats", **report.to_dict()})

    try:
        emit({"event": "ready", "pub": forwarder.pub_endpoint, "sub": forwarder.sub_endpoint,
              "replay": forwarder.replay_endpoint, "incarnation": forwarder.incarnation, "pid": os.getpid()})
        log.info("exchange %s/%s ready: publishers %s, subscribers %s", queue, exchange_id,
                 forwarder.pub_endpoint, forwarder.sub_endpoint)
        forwarder.run(stop.is_set, on_tick)
        moved = forwarder.ask_publishers_to_move("exchange shutting down")
        if moved:
            deadline = time.monotonic() + MOVE_GRACE
            forwarder.run(lambda: time.monotonic() > deadline, lambda: None)
    except BrokenPipeError:
        pass  # parent gone
    finally:
        forwarder.close()
        gatekeeper.stop()
        context.term()
    log.info("exchange %s/%s stopped", queue, exchange_id)


if __name__ == "__main__":
    main()
