"""The HCM's part in storage policies: each exchange hears its queue's policy, and hears it change.

A queue's policy (`retention`, `retention_bytes`: roq/storage_policy.py) lives in its settings
znode, which the leader writes at `queue.create` and `queue.set`. For each queue with an exchange
or a replica on this host a `QueuePolicyWatch` follows that znode with a kazoo DataWatch: kazoo's
thread only records the policy and wakes the tick, which writes `{"storage": {"retention",
"retention_bytes"}}` to each child of the queue right after its configuration and again whenever the
policy changes (hcm/channel.py). Nothing is restarted for a change: the exchange applies the new
bounds to its store as it runs. A znode that cannot be decoded keeps the last policy heard (logged);
a queue deleted meanwhile keeps it too (its exchanges are being stopped).
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

from kazoo.client import KazooClient

from roq.paths import Paths
from roq.storage_policy import StoragePolicy, policy_of

log = logging.getLogger(__name__)


class QueuePolicyWatch:
    """The storage policy of one queue as ZooKeeper has it; None until first read."""

    def __init__(self, client: KazooClient, paths: Paths, queue: str, wake: threading.Event) -> None:
        self.queue = queue
        self.policy: StoragePolicy | None = None
        self.stopped = False
        self._wake = wake
        client.DataWatch(paths.queue(queue), self._on_data)

    def _on_data(self, data: bytes | None, _stat: Any, _event: Any = None) -> bool | None:
        if self.stopped:
            return False
        if data is None:
            return None
        try:
            settings = json.loads(data)
        except ValueError:
            log.warning("settings of queue %s are not JSON; its exchanges keep the storage policy they have",
                        self.queue)
            return None
        if isinstance(settings, dict):
            self.policy = policy_of(settings)
            self._wake.set()
        return None

    def stop(self) -> None:
        """The watch ends at its next event (kazoo has no other way to drop one)."""
        self.stopped = True


class StoragePolicies:
    """A watch per queue served on this host; without a client (unit tests) there is nothing to follow."""

    def __init__(self, client: KazooClient | None, paths: Paths, wake: threading.Event) -> None:
        self.client = client
        self.paths = paths
        self.wake = wake
        self.watches: dict[str, QueuePolicyWatch] = {}

    def follow(self, queue: str) -> None:
        """Follow `queue`'s policy (before a child of it starts, so its first lines can carry it)."""
        if queue not in self.watches and self.client is not None:
            self.watches[queue] = QueuePolicyWatch(self.client, self.paths, queue, self.wake)

    def keep_only(self, served: set[str]) -> None:
        """Stop following queues no child of which runs here any more."""
        for queue in list(self.watches):
            if queue not in served:
                self.watches.pop(queue).stop()

    def policy(self, queue: str) -> StoragePolicy | None:
        watch = self.watches.get(queue)
        return watch.policy if watch is not None else None
