"""Which incarnations a replica takes nothing more of: the sealed ones (protocol 6.3).

A subscriber's position request for an ended incarnation seals its copy, so the copy it drains
cannot grow behind its back; a `follow` of a newer incarnation seals the older ones (that exchange
restarted). Only an ended incarnation is sealed: the one the cluster (the replica's HCM) lists as
running, or any before the HCM said anything, is refused. Copies dropped stay sealed (an old
primary still running must not be followed afresh); the oldest are forgotten past MAX_SEALED.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Mapping

from exchange.replica_trust import PrimaryTrust
from exchange.retention import Retention

log = logging.getLogger(__name__)

MAX_SEALED = 4096  # sealed incarnations remembered


class Seals:
    def __init__(self, copies: Mapping[str, Retention], trust: PrimaryTrust, count: Callable[[str, int], None]) -> None:
        """`copies`: the replica's (read only); `count`: its statistics' counter."""
        self.copies = copies
        self.trust = trust
        self.count = count
        self.sealed: OrderedDict[str, None] = OrderedDict()  # the newest MAX_SEALED, oldest first

    def __contains__(self, incarnation: object) -> bool:
        return incarnation in self.sealed

    def seal_ended(self, incarnation: str) -> bool:
        """A subscriber asks where the copy of `incarnation` ends: seal it, unless the cluster (our
        HCM) still lists it as running, or has told us nothing yet. Returns whether it is sealed."""
        if not self.trust.told or incarnation == self.trust.running:
            self.count("refused_seals", 1)
            return False
        self.seal(incarnation)
        return True

    def seal(self, incarnation: str) -> None:
        """Take nothing more of `incarnation`: it ended, and a subscriber is reading its copy."""
        if incarnation not in self.sealed and incarnation in self.copies:
            log.info("sealed %s at position %d", incarnation, self.copies[incarnation].next_pos)
        self.add(incarnation)

    def add(self, incarnation: str) -> None:
        """Remember a sealed incarnation, copies dropped included."""
        self.sealed[incarnation] = None
        self.sealed.move_to_end(incarnation)
        while len(self.sealed) > MAX_SEALED:
            self.sealed.popitem(last=False)
