"""A replica whose store cannot keep its copy says so, and gives way to a fresh process.

A `copy` page (or `follow`) of a copy whose segment store refuses writes (a full disk: ENOSPC,
EDQUOT; a failing one: EIO, EROFS) or broke (an fsync was refused: the kernel may have dropped pages
it had taken, so the store takes nothing more) is answered `broken` with the reason (protocol 6.2),
never `copied`: the primary confirms nothing on the strength of this replica, logs why its confirms
wait, and asks again every 2 s. A store that takes writes again (space was freed) answers `copied`
again. A store that broke, or that refused writes for GIVE_UP_AFTER seconds, ends the replica
process with Exit.STORAGE: its HCM starts it again (not counted as a crash); the new process adopts
what its stores hold, and the primary copies its running incarnation afresh, with a state transfer
of its disk: that is the replacement the primary's confirms wait for. Nothing confirmed is lost:
the primary confirmed only what this replica had answered `copied`, and keeps it itself.
"""

from __future__ import annotations

import logging
from collections.abc import Collection

from exchange.replica_disk import ReplicaDisk
from exchange.segment_store import StoreState
from roq import protocol

log = logging.getLogger(__name__)

GIVE_UP_AFTER = 30.0  # s a copy's store may refuse writes before the replica process ends for a restart


class StoreHealth:
    def __init__(self, disk: ReplicaDisk) -> None:
        self.disk = disk
        self.refusing_since: dict[str, float] = {}  # copies whose store refuses writes → since when

    def broken(self, incarnation: str, now: float) -> bytes:
        """The answer to a frame of `incarnation` whose store refuses it."""
        reason = self.disk.problem(incarnation)
        if incarnation not in self.refusing_since:
            self.refusing_since[incarnation] = now
            log.error("the store of the copy of %s refuses writes (%s): answering its primary `broken`; its "
                      "confirms wait until the store takes writes again or this replica is started again",
                      incarnation, reason)
        return protocol.encode_broken(incarnation, reason)

    def took(self, incarnation: str) -> None:
        """A page of `incarnation` was stored: its store is well (again)."""
        if self.refusing_since.pop(incarnation, None) is not None:
            log.warning("the store of the copy of %s takes writes again", incarnation)

    def give_up(self, now: float, sealed: Collection[str]) -> str | None:
        """Why this replica process should end for a restart (None: it should not): the store of a
        copy still followed broke, or has refused writes for GIVE_UP_AFTER."""
        for incarnation, since in list(self.refusing_since.items()):
            store = self.disk.stores.get(incarnation)
            if store is None or incarnation in sealed:
                del self.refusing_since[incarnation]  # dropped or ended: nothing waits for it
                continue
            if store.state is StoreState.BROKEN or now - since >= GIVE_UP_AFTER:
                return f"the store of the copy of {incarnation}: {self.disk.problem(incarnation)}"
        return None
