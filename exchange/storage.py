"""An exchange's journal on a disk that refuses writes: backpressure with a reason, never a crash.

With `exchange.journal = fsync` an ack waits until the journal holds what it covers. While the disk
refuses writes the exchange is **storage full**: acks wait, no publisher frame is read, publishers
are told `move storage_full: ...`, the statistics say so (the leader moves it after
`gcm.storage_full_grace`), and `Journal.try_commit` retries every `STORAGE_RETRY` seconds; a write
that goes through ends it by itself. A journal broken for good (a failed fsync) ends the incarnation
with `Exit.STORAGE` after RESTART_AFTER seconds unmoved, not counted as a crash. Failures are logged
when they start, every LOG_EVERY seconds while they last, and when they end. The rules and why:
docs/guarantees.md "A full disk".
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Callable

from exchange.journal import STORAGE_RETRY, Journal

log = logging.getLogger(__name__)

STORAGE_FULL = "storage_full"  # the code in `move` reasons (protocol 3.3) and the statistics' flag
LOG_EVERY = 10.0  # seconds between two ERROR lines while the disk refuses
RESTART_AFTER = 30.0  # seconds a journal broken for good waits to be moved before its process ends


class JournalHealth:
    """Commits the journal and tracks whether its disk takes the writes (one per exchange)."""

    def __init__(self, journal: Journal, name: str) -> None:
        self.journal = journal
        self.name = name  # "queue/exchange", for the log
        self._logged = -1e9
        self._was_full = False  # as the previous commit left it (a failed sync breaks it in between)

    @property
    def full(self) -> bool:
        """The disk refuses the journal's writes now (or broke it for good)."""
        return self.journal.error is not None or self.journal.broken

    @property
    def error_text(self) -> str:
        """"ENOSPC: No space left on device" while full, else ""."""
        error = self.journal.error
        if error is None:
            return "broken: a sync failed, nothing more can be confirmed here" if self.journal.broken else ""
        code = errno.errorcode.get(error.errno or 0, "E?")
        return f"{code}: {error.strerror or error}"

    @property
    def reason(self) -> str:
        """What publishers are told in `move` (protocol 3.3)."""
        return f"{STORAGE_FULL}: exchange {self.name} cannot write its journal ({self.error_text})"

    def commit(self, now: float, on_synced: Callable[[], None]) -> bool | None:
        """Write what the journal buffered (retrying a refused write every STORAGE_RETRY s). Returns
        True when the disk just started to refuse, False when it just took writes again, else None."""
        was_full, since = self._was_full, self.journal.failing_since
        self.journal.try_commit(on_synced, now)
        self._was_full = self.full
        if self.full:
            self._log_failure(now, started=not was_full)
            return True if not was_full else None
        if was_full:
            lasted = now - since if since is not None else 0.0
            log.info("journal of %s writes again after %.1fs; the confirms that waited leave now", self.name, lasted)
            return False
        return None

    def must_restart(self, now: float) -> bool:
        """Broken for good for RESTART_AFTER seconds: only a new incarnation can confirm again."""
        since = self.journal.failing_since
        return self.journal.broken and since is not None and now - since >= RESTART_AFTER

    def _log_failure(self, now: float, started: bool) -> None:
        if not started and now < self._logged + LOG_EVERY:
            return
        self._logged = now
        journal = self.journal
        if journal.broken:
            log.error("journal of %s is broken (%s): confirms wait; the leader moves this exchange, or it "
                      "restarts as a new incarnation in %.0fs", self.name, self.error_text, RESTART_AFTER)
            return
        log.error("journal of %s cannot write: %s; %s (%d attempts, %d bytes waiting): confirms wait, publishers "
                  "are held and told %s, retried every %.1fs, until the disk has room or the leader moves this "
                  "exchange", self.name, self.error_text, "started now" if started else "still",
                  journal.errors, journal.pending_bytes, STORAGE_FULL, STORAGE_RETRY)
