"""The leader's cache of the cluster's tree, kept current by ZooKeeper: reads without a round trip.

One kazoo TreeCache per subtree the leader reads (`hosts`, `queues`, `assignments`, `live`,
`replicas`, `commands`), so its reads follow how often the cluster changes, not how often it ticks;
`ClusterCache` answers roq.state's readers. Built anew in each term and after a SUSPENDED or LOST
connection (a read meanwhile raises ZooKeeperUnavailableError, as a read of ZooKeeper would); a read
waits until the cache shows the leader's own committed writes (CATCH_UP_TIMEOUT, else rebuilt).
Only state is read from the TreeCaches, never their events (python-zk/kazoo#645). Thread-safe.
Consistency and failure in full: docs/leader.md "The cache".
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from typing import Any

from kazoo.client import KazooClient
from kazoo.protocol.serialization import Create, Delete, SetData
from kazoo.protocol.states import KazooState
from kazoo.recipe.cache import TreeCache, TreeEvent

from gcm.fence import LeaderFence
from roq.errors import ZooKeeperUnavailableError
from roq.paths import Paths
from roq.zk import decode

log = logging.getLogger(__name__)

BUILD_TIMEOUT = 30.0  # seconds for the first read of every subtree (about 2 reads per znode, pipelined)
CATCH_UP_TIMEOUT = 2.0  # seconds for the leader's own committed writes to show; usually milliseconds
WAIT_SLICE = 0.1  # connection losses are noticed by polling: kazoo's listeners must not take our lock

_PRESENT, _ABSENT = object(), object()  # what an expectation needs of a znode, besides given data


class ClusterCache:
    def __init__(self, client: KazooClient, paths: Paths, fence: LeaderFence) -> None:
        self.client = client
        self.fence = fence
        self.roots = (paths.hosts, paths.queues, paths.assignments, paths.live, paths.replicas, paths.commands_root)
        self._build_lock = threading.RLock()  # one build or drop at a time; held while building
        self._changed = threading.Condition()  # notified on every change the TreeCaches apply
        self._trees: dict[str, TreeCache] | None = None
        self._loaded: set[str] = set()  # subtrees of the current build that finished their first read
        self._generation = 0  # which build the TreeCaches' events belong to
        self._interruptions = 0  # connection losses so far; the trees are good while it stays as built
        self._built_at_interruption = -1
        self._expected: dict[str, Any] = {}  # path → _PRESENT, _ABSENT or the data written
        self.builds = 0  # how often it was read from ZooKeeper in full (for tests and measurements)
        client.add_listener(self._on_state)
        fence.add_term_listener(lambda _epoch: self.reset())
        fence.add_commit_listener(self.expect)

    # ------------------------------------------------------------ reads (roq.state.Tree)

    def children(self, path: str) -> list[str]:
        found = self._tree(path).get_children(path)
        return sorted(found) if found else []

    def read_json(self, path: str) -> dict[str, Any] | None:
        node = self._tree(path).get_data(path)
        return None if node is None else decode(node.data)

    # ------------------------------------------------------------ lifecycle

    def reset(self) -> None:
        """Drop the cache; the next read builds it from ZooKeeper, which shows every write committed
        so far, so nothing is left to wait for."""
        with self._build_lock:
            with self._changed:
                self._expected.clear()
            self._close()

    def expect(self, operations: list[Any]) -> None:
        """A fenced write committed `operations` (kazoo's Create, SetData, Delete, ...): reads wait
        until the cache shows them."""
        chroot = self.client.chroot or ""
        with self._changed:
            for op in operations:
                path = op.path[len(chroot):] if chroot and op.path.startswith(chroot) else op.path
                if not self._covers(path):
                    continue
                if isinstance(op, Create):
                    self._expected[path] = _PRESENT
                elif isinstance(op, SetData):
                    self._expected[path] = op.data
                elif isinstance(op, Delete):
                    self._expected[path] = _ABSENT

    # ------------------------------------------------------------ internals

    def _tree(self, path: str) -> TreeCache:
        trees = self._current()
        for root, tree in trees.items():
            if path == root or path.startswith(root + "/"):
                return tree
        raise ValueError(f"{path} is not in the leader's cache (it holds {', '.join(self.roots)})")

    def _covers(self, path: str) -> bool:
        return any(path == root or path.startswith(root + "/") for root in self.roots)

    def _current(self) -> dict[str, TreeCache]:
        """The TreeCaches of a build that saw no connection loss, showing the leader's own writes."""
        for _ in range(2):
            with self._build_lock:
                if self._trees is None or self._interruptions != self._built_at_interruption:
                    self._build()
                trees = self._trees
                assert trees is not None
            if self._caught_up(trees):
                return trees
            log.warning("the cache did not show the leader's own writes within %.1fs; reading it again",
                        CATCH_UP_TIMEOUT)
            self.reset()
        raise ZooKeeperUnavailableError("the leader's cache could not follow ZooKeeper; retry shortly")

    def _caught_up(self, trees: dict[str, TreeCache]) -> bool:
        deadline = time.monotonic() + CATCH_UP_TIMEOUT
        with self._changed:
            while True:
                self._expected = {path: want for path, want in self._expected.items()
                                  if not _shows(trees, path, want)}
                if not self._expected:
                    return True
                if self._interruptions != self._built_at_interruption:
                    raise ZooKeeperUnavailableError("the ZooKeeper connection was lost; retry shortly")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._changed.wait(min(remaining, WAIT_SLICE))

    def _build(self) -> None:
        """Start a TreeCache per subtree and wait until each has read its subtree once."""
        self._close()
        interruptions = self._interruptions
        for root in self.roots:
            self.fence.ensure_path(root)  # TreeCache.start would otherwise create it unfenced
        with self._changed:
            self._generation += 1
            self._loaded = set()
            trees = {root: TreeCache(self.client, root) for root in self.roots}
            for root, tree in trees.items():
                tree.listen(functools.partial(self._on_event, self._generation, root))
        self._trees, self._built_at_interruption = trees, interruptions
        started = time.monotonic()
        try:
            for tree in trees.values():
                tree.start()
            self._wait_loaded(len(trees), interruptions, started + BUILD_TIMEOUT)
        except BaseException:
            self._close()  # never read a half-built cache
            raise
        self.builds += 1
        log.info("read the cluster's tree into the leader's cache in %.3fs", time.monotonic() - started)

    def _wait_loaded(self, count: int, interruptions: int, deadline: float) -> None:
        with self._changed:
            while len(self._loaded) < count:
                if self._interruptions != interruptions:
                    raise ZooKeeperUnavailableError("the ZooKeeper connection was lost while the leader's "
                                                    "cache was read; retry shortly")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise ZooKeeperUnavailableError(f"the leader's cache was not read within {BUILD_TIMEOUT:.0f}s")
                self._changed.wait(min(remaining, WAIT_SLICE))

    def _close(self) -> None:
        trees, self._trees = self._trees, None
        for tree in (trees or {}).values():
            tree.close()

    def _on_event(self, generation: int, root: str, event: TreeEvent) -> None:
        """On a TreeCache's own thread: wake whoever waits for a change."""
        with self._changed:
            if event.event_type == TreeEvent.INITIALIZED and generation == self._generation:
                self._loaded.add(root)
            self._changed.notify_all()

    def _on_state(self, state: str) -> None:
        """A kazoo listener: it must not block, so it only counts; readers notice."""
        if state in (KazooState.SUSPENDED, KazooState.LOST):
            self._interruptions += 1


def _shows(trees: dict[str, TreeCache], path: str, want: Any) -> bool:
    """Does the cache show what the leader wrote at `path`?"""
    tree = next(t for root, t in trees.items() if path == root or path.startswith(root + "/"))
    node = tree.get_data(path)
    if want is _ABSENT:
        return node is None
    if want is _PRESENT:
        return node is not None
    return node is not None and node.data == want
