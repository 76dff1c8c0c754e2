"""Leader election with kazoo's Election recipe, and what leadership means here.

`Leadership.run()` contends in a loop. When elected it claims a new epoch
(`LeaderFence.claim`) and calls the leader loop, which must return soon after
`should_lead()` turns false; the term ends with `LeaderFence.release` whatever
happened. Connection states (kazoo's advice, kept):
SUSPENDED pauses leader-only work (`can_write()` is false) without giving up;
LOST ends the leadership — the session and its lock node are gone — and the
loop contends again once reconnected. Listeners only set flags. Whether a
write may be made is the fence's answer (`LeaderFence.may_write`), not ours.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException
from kazoo.protocol.states import KazooState

from gcm.fence import LeaderFence
from roq.paths import Paths

log = logging.getLogger(__name__)


class Leadership:
    def __init__(self, client: KazooClient, paths: Paths, identity: dict[str, Any],
                 stopping: threading.Event) -> None:
        self.client = client
        self.identity = identity
        self.fence = LeaderFence(client, paths)
        self.election = client.Election(paths.election, json.dumps(identity, sort_keys=True))
        self.stopping = stopping
        self._leading = threading.Event()
        self._connected = threading.Event()
        self._lost = threading.Event()
        if client.connected:
            self._connected.set()
        client.add_listener(self._on_state)

    # ------------------------------------------------------------ state

    def _on_state(self, state: str) -> None:
        if state == KazooState.CONNECTED:
            self._connected.set()
        elif state == KazooState.SUSPENDED:
            self._connected.clear()
        elif state == KazooState.LOST:
            self._connected.clear()
            self._lost.set()

    @property
    def is_leader(self) -> bool:
        return self._leading.is_set()

    @property
    def epoch(self) -> int | None:
        return self.fence.epoch if self.is_leader else None

    def can_write(self) -> bool:
        """Leader-only work may run now: the fence holds a term and ZooKeeper is connected."""
        return self.fence.may_write()

    def should_lead(self) -> bool:
        return not self.stopping.is_set() and not self._lost.is_set()

    def wait_connected(self, timeout: float) -> bool:
        return self._connected.wait(timeout)

    def contenders(self) -> list[dict[str, Any]]:
        result = []
        for raw in self.election.contenders():
            try:
                result.append(json.loads(raw))
            except (TypeError, ValueError):
                continue
        return result

    # ------------------------------------------------------------ loop

    def run(self, lead: Callable[[int], None]) -> None:
        """Contend until stopping; call `lead(epoch)` whenever elected."""
        while not self.stopping.is_set():
            if not self._connected.wait(0.5):
                continue
            self._lost.clear()
            try:
                self.election.run(self._lead, lead)
            except KazooException as exc:
                log.warning("election interrupted (%s: %s); contending again", type(exc).__name__, exc)
                self.stopping.wait(0.5)

    def cancel(self) -> None:
        self.election.cancel()

    def _lead(self, lead: Callable[[int], None]) -> None:
        if not self.should_lead():
            return
        epoch = self.fence.claim(self.identity)
        self._leading.set()
        log.info("elected leader, epoch %d", epoch)
        try:
            lead(epoch)
        finally:
            self._leading.clear()
            # Without a connection the record cannot be removed, but the term still ends here.
            self.fence.release(remove_record=self._connected.is_set())
            log.info("no longer leader (epoch %d)", epoch)
