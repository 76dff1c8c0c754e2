"""Who may copy into a replica: the primary incarnations the cluster vouches for.

Every frame a primary sends on `repl` carries its incarnation's copy secret (`proof`, protocol
6.1), of which only the SHA-256 (`copy_digest`) was published, in its live znode. The replica's
HCM follows that znode and writes each `{"primary": {"incarnation", "copy_digest"}}` (or
`{"primary": null}`) to the replica's stdin (`learn`, from the stdin thread: handed to the loop
through a queue). A frame whose proof does not hash to its incarnation's digest is dropped and
counted (`refused_copies`); a `follow` of an incarnation whose digest has not come yet waits (at
most MAX_WAITING) and is released once it comes.
"""

from __future__ import annotations

import hmac
import logging
import queue
import time
from collections import OrderedDict
from typing import Any

from roq import protocol

log = logging.getLogger(__name__)

MAX_DIGESTS = 64  # primary incarnations whose copy digest is remembered (the newest)
MAX_WAITING = 16  # follows waiting for their incarnation's digest; the oldest give way
ProofFrame = (protocol.Follow | protocol.Copy | protocol.GroupState | protocol.GroupsDone | protocol.Mark
              | protocol.Adopt | protocol.Applied | protocol.Fill)


class PrimaryTrust:
    def __init__(self, xid: str, counters: dict[str, int]) -> None:
        """`counters`: the replica's, where refused frames are counted (`refused_copies`)."""
        self.xid = xid
        self.counters = counters
        # What the cluster says of our primary (from our HCM): each incarnation's copy digest, and
        # the incarnation listed as running (None: none; `told` False: nothing heard yet).
        self.digests: OrderedDict[str, str] = OrderedDict()
        self.proven: dict[str, bytes] = {}  # incarnation → its proof, once checked against the digest
        self.running: str | None = None
        self.told = False
        self._news: queue.SimpleQueue[dict[str, Any] | None] = queue.SimpleQueue()  # from the stdin thread
        self.waiting: OrderedDict[str, tuple[bytes, protocol.Follow]] = OrderedDict()  # incarnation → follow
        self._proof_warned = -1e9

    def learn(self, primary: dict[str, Any] | None) -> None:
        """Our HCM's news of the primary's live znode (any thread): `{"incarnation", "copy_digest"}`
        while one runs, None while none does."""
        self._news.put(primary)

    def take_news(self) -> list[tuple[bytes, protocol.Follow]]:
        """Take in what the HCM said (the loop's thread); returns the follows that waited for a
        digest that came, to be answered now if their proof holds."""
        released: list[tuple[bytes, protocol.Follow]] = []
        while True:
            try:
                primary = self._news.get_nowait()
            except queue.Empty:
                return released
            self.told = True
            incarnation = primary.get("incarnation") if isinstance(primary, dict) else None
            digest = primary.get("copy_digest") if isinstance(primary, dict) else None
            if not isinstance(incarnation, str) or not isinstance(digest, str):
                self.running = None
                continue
            self.running = incarnation
            if self.digests.get(incarnation) != digest:
                self.digests[incarnation] = digest
                self.proven.pop(incarnation, None)
            self.digests.move_to_end(incarnation)
            while len(self.digests) > MAX_DIGESTS:
                dropped, _ = self.digests.popitem(last=False)
                self.proven.pop(dropped, None)
            waiting = self.waiting.pop(incarnation, None)
            if waiting is not None:
                released.append(waiting)

    def proof_holds(self, route: bytes, request: ProofFrame) -> bool:
        """Does the frame carry its incarnation's copy secret? A follow of an incarnation whose
        digest we do not know yet waits for it; anything else unproven is dropped and counted."""
        incarnation = request.incarnation
        digest = self.digests.get(incarnation)
        if digest is None:
            if isinstance(request, protocol.Follow) and incarnation.rsplit(".", 1)[0] == self.xid:
                self.waiting.pop(incarnation, None)
                self.waiting[incarnation] = (route, request)
                while len(self.waiting) > MAX_WAITING:
                    self.waiting.popitem(last=False)
            else:
                self._refuse()  # no digest known for that incarnation
            return False
        known = self.proven.get(incarnation)
        if known is not None:
            held = hmac.compare_digest(known, request.proof)
        else:
            held = hmac.compare_digest(protocol.copy_digest(request.proof), digest)
            if held:
                self.proven[incarnation] = request.proof
        if not held:
            self._refuse()
            now = time.monotonic()
            if now >= self._proof_warned + 10:  # a peer sending many must not flood the log
                self._proof_warned = now
                log.warning("dropped a %s frame for %s without its copy secret (%d so far)",
                            type(request).__name__.lower(), incarnation, self.counters["refused_copies"])
        return held

    def _refuse(self) -> None:
        self.counters["refused_copies"] = self.counters.get("refused_copies", 0) + 1
