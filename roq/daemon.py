"""The entry point every RoQ daemon shares: `roq-gcm`, `roq-hcm` and `roq-exchange`.

`run_daemon()` does, in order: build the configuration (a `RoqError` here is
printed as one line on stderr, before any logging exists, and the process
exits with `Exit.for_error`, i.e. `Exit.CONFIG` for a bad configuration);
set up logging once (roq/logs.py); install SIGTERM/SIGINT handlers that only
set a `Stop` event handed to the daemon's loop; run the daemon; exit with the
code it returns. A `RoqError` that ends the daemon is logged on one line and
mapped by `Exit.for_error` (ZooKeeper unreachable: `Exit.UNAVAILABLE`); any
other exception is logged with its traceback and exits `Exit.INTERNAL`, so a
bug never looks like a clean stop or a configuration mistake.

A daemon started by an HCM logs JSON lines (`json_logs=True`): one record per
line, traceback included, which the HCM re-logs through its own logging
(hcm/supervisor.py `_forward_logs`), so a child's lines keep their level and
never interleave with anyone else's.

To run one role under a debugger, skip this module: build a `Config` and call
`Gcm(config).run()` (or `Hcm`), which makes its own `Stop`.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
from collections.abc import Callable
from typing import NoReturn

from roq.config import Config
from roq.errors import Exit, RoqError
from roq.logs import configure

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Stop(threading.Event):
    """A daemon's stop request: set by SIGTERM/SIGINT, by a managed thread that failed, or by the
    daemon itself (an exchange whose parent went away).

    Loops wait on it, or on an event of their own named with `also_wake()`: setting the stop
    request sets those too, so a loop blocked on one notices at once."""

    def __init__(self) -> None:
        super().__init__()
        self._wakes: list[threading.Event] = []
        self.signal: int | None = None  # the signal that asked, if one did

    def also_wake(self, *events: threading.Event) -> None:
        self._wakes.extend(events)
        if self.is_set():
            for event in events:
                event.set()

    def set(self) -> None:
        super().set()
        for event in list(self._wakes):
            event.set()


def install_signal_handlers(stop: Stop) -> None:
    """SIGTERM and SIGINT set `stop`; nothing else happens in the handler."""
    def handler(signum: int, _frame: object) -> None:
        stop.signal = signum
        # Set from a thread: the handler runs in the main thread between two bytecodes, possibly
        # inside Event.wait() holding the very lock that set() needs.
        threading.Thread(target=stop.set, name="stop-request", daemon=True).start()
    for sig in STOP_SIGNALS:
        signal.signal(sig, handler)


class JsonLinesFormatter(logging.Formatter):
    """One JSON object per record: {"level", "name", "msg"[, "exc"]}, for a supervising HCM."""

    def format(self, record: logging.LogRecord) -> str:
        data = {"level": record.levelname, "name": record.name, "msg": record.getMessage()}
        if record.exc_info:
            data["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            data["stack"] = self.formatStack(record.stack_info)
        return json.dumps(data)


def setup_logging(config: Config, role: str, json_logs: bool = False) -> None:
    configure(config.log.level, role)
    if json_logs:
        for handler in logging.getLogger().handlers:
            handler.setFormatter(JsonLinesFormatter())


def more_open_files() -> None:
    """The soft limit of open files raised to the hard one: a GCM or an exchange holds a descriptor
    per client connection, and the soft limit is often 1,024 (systemd's default)."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = 1 << 20
    if soft != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open files limit from %d to %d: %s", soft, hard, exc)


def run_daemon(name: str, load: Callable[[], Config], role: str | Callable[[Config], str],
               body: Callable[[Config, Stop], int | None], *, json_logs: bool = False) -> NoReturn:
    """Run one daemon from its console script `name` to its exit code; see the module docstring.

    `load` builds the configuration, `role` names the process in log lines, `body` runs the
    daemon until `stop` is set and returns its exit code (None = `Exit.OK`)."""
    try:
        config = load()
    except RoqError as exc:
        sys.stderr.write(f"{name}: {exc}\n")
        sys.exit(Exit.for_error(exc))
    setup_logging(config, role(config) if callable(role) else role, json_logs)
    more_open_files()
    stop = Stop()
    install_signal_handlers(stop)
    try:
        code = body(config, stop)
    except RoqError as exc:
        log.error("%s: %s", name, exc)
        code = Exit.for_error(exc)
    except Exception:
        log.exception("%s stopped by an unexpected error", name)
        code = Exit.INTERNAL
    if stop.signal is not None:
        log.info("%s stopped by %s", name, signal.Signals(stop.signal).name)
    sys.exit(Exit.OK if code is None else code)
