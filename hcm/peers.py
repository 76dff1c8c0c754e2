"""The two halves of a replicated exchange, told where the other is.

Each half hears of the other through a `PeerWatch` (a kazoo DataWatch, kept across restarts of the
child, stopped when the child is dropped), as JSON lines on its stdin: right after the
configuration line, and again whenever what it needs changes (not on a statistics refresh). A
primary of a queue with replicas 2 hears where its replica is, from `replicas/<q>/<x>`:
`{"replica": {"repl": endpoint, "incarnation": R}}` or `{"replica": null}`. A replica hears which
incarnation of its primary runs and the digest of that incarnation's copy secret, from
`live/<q>/<x>`: `{"primary": {"incarnation": I, "copy_digest": D}}` or `{"primary": null}`
(exchange/replica.py: only copies proved by that secret are taken, only ended incarnations are
sealed). The watch only records the value and wakes the tick; the tick thread writes to the pipe
(hcm/channel.py).
"""

from __future__ import annotations

import threading
from typing import Any

from kazoo.client import KazooClient

from roq.paths import Paths, is_replica_slot, primary_of
from roq.zk import decode


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


def watch_peer(client: KazooClient, paths: Paths, queue: str, slot: str, wake: threading.Event) -> PeerWatch:
    """Follow the other half of the exchange in `slot`: a replica follows its primary's live znode,
    a primary its replica's. Needs a connected client; the first value arrives before it returns."""
    xid = primary_of(slot)
    if is_replica_slot(slot):
        return PeerWatch(client, paths.live_exchange(queue, xid), "primary", ("incarnation", "copy_digest"), wake)
    return PeerWatch(client, paths.replica_live(queue, xid), "replica", ("repl", "incarnation"), wake)
