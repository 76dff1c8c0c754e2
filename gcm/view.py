"""Where every exchange is placed: (queue, exchange) → host, or None while unplaced.

`PlacementView` reads the placements from the leader's cache (gcm.cache), kept current by
ZooKeeper and showing the leader's own committed writes, so `queue.create`, `queue.scale` and the
reconcile tick read them without a round trip (from ZooKeeper they cost two reads per queue and
one per exchange). `read_placements(source)` reads the same from any source: the reconciler reads
ZooKeeper itself with it before it repairs anything.
"""

from __future__ import annotations

from gcm.cache import ClusterCache
from roq.paths import Paths
from roq.state import Source, queue_names, read_exchanges

Placements = dict[tuple[str, str], str | None]


class PlacementView:
    def __init__(self, cache: ClusterCache, paths: Paths) -> None:
        self.cache = cache
        self.paths = paths

    def get(self) -> Placements:
        """A dict the caller may change."""
        return read_placements(self.cache, self.paths)

    def invalidate(self) -> None:
        """Read everything from ZooKeeper again at the next use (a new term, a doubt)."""
        self.cache.reset()


def read_placements(source: Source, paths: Paths) -> Placements:
    found: Placements = {}
    for queue in queue_names(source, paths):
        for x in read_exchanges(source, paths, queue, live=False):
            found[(queue, x.id)] = x.host
    return found
