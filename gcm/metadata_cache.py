"""Every GCM's read-only cache of what clients need: queues, live exchanges, replicas, relocations,
the leader and the GCMs. Leader and backups alike, so any GCM answers metadata requests.

One kazoo TreeCache per subtree; their events only mark a queue dirty (`on_dirty(queue)`, or None
for "every queue": the leader or the GCMs changed), the state is read from the caches
(python-zk/kazoo#645). The TreeCaches keep their last state through a lost ZooKeeper connection and
refresh it when the session is back, so answers go on from the last view while ZooKeeper is down:
the cluster does not change meanwhile. Nothing here writes. Thread-safe (kazoo's caches are).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from kazoo.client import KazooClient
from kazoo.recipe.cache import TreeCache, TreeEvent

from roq.paths import Paths
from roq.protocol.metadata import REPLICA_KEYS, client_view
from roq.zk import decode

log = logging.getLogger(__name__)


class MetadataCache:
    def __init__(self, client: KazooClient, paths: Paths, on_dirty: Callable[[str | None], None]) -> None:
        self.paths = paths
        self._on_dirty = on_dirty
        self._roots = {"queues": paths.queues, "live": paths.live, "replicas": paths.replicas,
                       "relocations": paths.relocations_root, "election": paths.election}
        self._client = client
        self._leader: dict[str, Any] = {}
        self._loaded: set[str] = set()
        self._trees: dict[str, TreeCache] = {}
        for name, root in self._roots.items():
            tree = TreeCache(client, root)
            tree.listen(lambda event, name=name: self._on_event(name, event))
            self._trees[name] = tree

    def start(self) -> None:
        for tree in self._trees.values():
            tree.start()
        self._client.DataWatch(self.paths.leader, self._on_leader)

    def close(self) -> None:
        for tree in self._trees.values():
            tree.close()

    @property
    def ready(self) -> bool:
        """Has every subtree been read once? Until then no answer can be trusted."""
        return len(self._loaded) == len(self._trees)

    # ------------------------------------------------------------ reads

    def body(self, queue: str) -> dict[str, Any]:
        """A queue's metadata, without `version` and `gcm` (the service adds them)."""
        exists = self._data("queues", self.paths.queue(queue)) is not None
        exchanges = {xid: client_view(data) for xid, data in self._children("live", self.paths.live_queue(queue))}
        replicas = {xid: {k: data[k] for k in REPLICA_KEYS if k in data}
                    for xid, data in self._children("replicas", self.paths.replica_queue(queue))}
        relocations = self._json("relocations", self.paths.relocations(queue)) or {}
        return {"queue": queue, "exists": exists, "exchanges": exchanges, "replicas": replicas,
                "relocations": relocations, **self.gcms()}

    def gcms(self) -> dict[str, Any]:
        """The leader's control endpoint (None while none is elected) and every GCM's."""
        leader = self._leader
        endpoints = sorted({data["endpoint"] for _, data in self._children("election", self.paths.election)
                            if isinstance(data.get("endpoint"), str)})
        return {"leader": leader.get("endpoint"), "gcms": endpoints}

    def _children(self, name: str, path: str) -> list[tuple[str, dict[str, Any]]]:
        tree = self._trees[name]
        out = []
        for child in sorted(tree.get_children(path) or ()):
            data = self._json(name, f"{path}/{child}")
            if data:
                out.append((child, data))
        return out

    def _json(self, name: str, path: str) -> dict[str, Any] | None:
        raw = self._data(name, path)
        try:
            data = decode(raw) if raw else None
        except ValueError:
            return None
        return data if isinstance(data, dict) else None

    def _data(self, name: str, path: str) -> bytes | None:
        node = self._trees[name].get_data(path)
        return None if node is None else (node.data or b"")

    # ------------------------------------------------------------ events

    def _on_event(self, name: str, event: TreeEvent) -> None:
        """On a TreeCache's thread: mark the queue the event touched (never block here)."""
        if event.event_type in (TreeEvent.INITIALIZED, TreeEvent.CONNECTION_RECONNECTED):
            if event.event_type == TreeEvent.INITIALIZED:
                self._loaded.add(name)
            self._on_dirty(None)
            return
        path = event.event_data.path if event.event_data is not None else None
        if name == "election":
            self._on_dirty(None)
            return
        queue = self._queue_of(self._roots[name], path)
        if queue is not None:
            self._on_dirty(queue)

    def _on_leader(self, data: bytes | None, _stat: Any) -> None:
        """kazoo's DataWatch: the leader's record changed (empty while none is elected)."""
        try:
            leader = decode(data) if data else {}
        except ValueError:
            leader = {}
        self._leader = leader if isinstance(leader, dict) else {}
        self._on_dirty(None)

    @staticmethod
    def _queue_of(root: str, path: str | None) -> str | None:
        if not path or not path.startswith(root + "/"):
            return None
        return path[len(root) + 1:].split("/", 1)[0]
