"""When a supervised exchange that exited starts again: backoff, flapping, the cool-off.

Restarts back off exponentially up to a cap, and the backoff resets once a child has stayed up
`hcm.stable_after` seconds.

Flapping (like circus's `max_retry`): every exit the HCM did not ask for is a crash, whatever its
code (`Exit.CONFIG` included), a signal, or a kill for not becoming ready or for hanging; except
`Exit.ENDED`, an exchange whose replica sealed its incarnation (the cluster saw it end: it starts
again at once), and `Exit.STORAGE`, an exchange whose journal's disk broke for good and that ended
its incarnation to start afresh (exchange/storage.py), or a replica whose store refused writes
for 30 s (exchange/replica_health.py): it is restarted with the same backoff but
never counts towards FAILED (a disk is not a bug in the exchange, and the leader moves exchanges
off a host whose disk refuses). An exchange that crashes more than `hcm.max_restarts` times within
`hcm.restart_window` seconds (so was restarted `max_restarts` times already) is marked failed: one
ERROR line, no live endpoint, no restart, and the `roq_exchange_failed` gauge at 1. It is left
alone for `hcm.failed_cooloff` seconds (at least the window), then started again with a fresh
budget; or sooner if its assignment changes: once unassigned, its record is dropped, and a later
assignment starts from scratch. The GCM is not told; clients see the exchange as not running.
"""

from __future__ import annotations

import logging

from hcm.child import Child
from roq.config import HcmConfig
from roq.errors import Exit

log = logging.getLogger(__name__)


class RestartPolicy:
    """Judges the exits the HCM did not ask for and says when each child may start again."""

    def __init__(self, hcm: HcmConfig) -> None:
        self.hcm = hcm

    def may_start(self, child: Child, now: float) -> bool:
        """May the stopped `child` start now? Ends a cool-off that is over (with a fresh budget)."""
        if child.failed_until is not None:
            if now < child.failed_until:
                return False
            log.warning("exchange %s/%s: cool-off over, starting it again", *child.key)
            child.failed_until, child.crashes, child.failures = None, (), 0
            child.next_start = now
        return now >= child.next_start

    def exited(self, child: Child, code: int, now: float, uptime: float) -> None:
        """Schedule the next start of `child`, which exited with `code` after `uptime` seconds
        unasked, or mark it failed."""
        if code == Exit.ENDED:  # its replica sealed it: the cluster had seen it end, not a crash
            child.next_start = now
            log.info("exchange %s/%s ended its incarnation (sealed by its replica); starting a new one",
                     *child.key)
            return
        if code == Exit.STORAGE:
            self._restart_later(child, now, uptime)
            what = ("replica %s/%s gave up on its store's disk" if child.is_replica
                    else "exchange %s/%s ended its incarnation: its journal's disk failed")
            log.warning(what + " after %.1fs (exit %d, not counted as a crash); restarting in %.1fs",
                        *child.key, uptime, code, child.next_start - now)
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
