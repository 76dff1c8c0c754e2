"""The endpoints of the HCM's ready children in ZooKeeper, with their statistics.

A ready exchange is published at `live/<q>/<x>`, a ready replica at `replicas/<q>/<x>`: ephemeral
znodes of the HCM's session, created once the child reported ready, removed at once when it exits
or is stopped, created again after a session loss.

Statistics: each ready child's znode is written again when its report changed materially, when it
stopped (or resumed) reporting, and otherwise once every `hcm.stats_heartbeat` seconds (the rule:
hcm/heartbeat.py); never every report.
"""

from __future__ import annotations

import logging

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError, NoNodeError

from hcm.child import Child
from hcm.heartbeat import SILENT_AFTER, exchange_changed, write_due
from roq.config import Config
from roq.paths import Paths, primary_of
from roq.zk import create_ephemeral, encode

log = logging.getLogger(__name__)


class Endpoints:
    """Publishes and removes the children's znodes. `late` is set by the supervisor on a tick that
    came a report interval late: then this process was held up itself, and silence is not judged."""

    def __init__(self, client: KazooClient, paths: Paths, config: Config, host: str) -> None:
        self.client = client
        self.paths = paths
        self.config = config
        self.host = host
        self.late = False

    def path(self, child: Child) -> str:
        """Where the child is published: `replicas/<q>/<x>` for a replica, `live/<q>/<x>` otherwise."""
        queue, slot = child.key
        if child.is_replica:
            return self.paths.replica_live(queue, primary_of(slot))
        return self.paths.live_exchange(queue, slot)

    def silent(self, child: Child, now: float) -> bool:
        """Has the child stopped reporting (frozen, stuck)? Not judged on a late tick: the reports
        that came meanwhile may not be read yet."""
        if self.late:
            return child.written_silent
        return now - child.reported > SILENT_AFTER * self.config.exchange.stats_interval

    def due(self, child: Child, now: float) -> bool:
        """Should a ready child's znode be written now: not published yet, or its statistics due?"""
        return child.ready is not None and (not child.published or self._stats_due(child, now))

    def _stats_due(self, child: Child, now: float) -> bool:
        """Write the published child's statistics again now? On a material change of its report, on
        its silence starting or ending, else on the heartbeat; a silent child's once (hcm/heartbeat.py)."""
        silent = self.silent(child, now)
        if silent or child.written_silent:
            return silent != child.written_silent
        if child.stats_forced:
            return True
        return write_due(child.written_at, now, exchange_changed(child.written_stats, child.stats),
                         self.config.hcm.stats_heartbeat, self.config.exchange.stats_interval)

    def publish(self, child: Child, now: float) -> None:
        """Create or refresh a ready child's znode; one a lost session left behind is retried next tick."""
        assert child.ready is not None
        report, silent = child.stats, self.silent(child, now)
        stats = report.to_dict() if report else {}  # {} until the first report
        # `heartbeat`: the longest this znode goes unwritten while the child reports (its stats.at at
        # most that old); `stats_interval`: how often it reports, so clients can judge that age too;
        # `silent`: it stopped reporting (stats.at is its last report's).
        data = dict(child.ready, host=self.host, stats=stats, restarts=child.restarts,
                    heartbeat=self.config.hcm.stats_heartbeat, stats_interval=self.config.exchange.stats_interval,
                    silent=silent)
        path = self.path(child)
        try:
            if child.published:
                self.client.set(path, encode(data))
            else:
                create_ephemeral(self.client, path, data)
                log.info("exchange %s/%s live at %s", *child.key, child.ready.get("pub") or child.ready.get("repl"))
            if silent != child.written_silent:
                log.warning("exchange %s/%s %s", *child.key,
                            f"has sent no statistics for {now - child.reported:.1f}s: published as silent"
                            if silent else "reports again")
            child.published = True
            child.written_at, child.written_stats, child.written_silent = now, report, silent
            child.stats_forced = False
        except NodeExistsError:
            pass  # an older session's endpoint, about to expire: retry next tick
        except NoNodeError:
            child.published = False

    def unpublish(self, child: Child) -> None:
        """Remove a published child's znode at once; on connection trouble the session's end removes it."""
        if not child.published:
            return
        child.published = False
        try:
            self.client.delete(self.path(child))
        except NoNodeError:
            pass
        except Exception as exc:  # connection trouble: the session's end removes it
            log.warning("could not remove endpoint of %s/%s: %s", *child.key, exc)
