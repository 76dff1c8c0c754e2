"""The GCM's metadata service (gcm/metadata.py) driven by searched schedules of watches, gets and
cache changes: versions only grow and move exactly when the topology does, a push reaches exactly
the connections watching its queue (also when a request read the change before the push thread
did), the limits hold and a refused request changes nothing."""

from __future__ import annotations

import itertools
import time
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gcm.metadata import MetadataService
from roq.config import Config
from roq.errors import LimitExceededError
from roq.protocol.metadata import decode_push
from tests.profiles import examples

QUEUES = ["a", "b", "c"]
PEERS = [b"p0", b"p1", b"p2", b"p3"]


class World:
    """What the cache would hold: per queue, whether it exists and its exchanges' incarnations."""

    def __init__(self) -> None:
        self.queues: dict[str, dict[str, str]] = {"a": {"x1": "x1.0"}, "b": {}}
        self.publishers = 0  # a figure that moves without being pushed

    def body(self, queue: str) -> dict[str, Any]:
        live = self.queues.get(queue, {})
        return {"queue": queue, "exists": queue in self.queues, "leader": None, "gcms": [], "replicas": {},
                "relocations": {},
                "exchanges": {x: {"pub": f"tcp://h:{i}", "incarnation": inc, "stats": {"publishers": self.publishers}}
                              for i, (x, inc) in enumerate(sorted(live.items()))}}


step = st.one_of(
    st.tuples(st.just("watch"), st.sampled_from(PEERS), st.lists(st.sampled_from(QUEUES), min_size=1, max_size=4)),
    st.tuples(st.just("get"), st.sampled_from(PEERS), st.sampled_from(QUEUES)),
    st.tuples(st.just("restart"), st.sampled_from(QUEUES), st.integers(0, 3)),
    st.tuples(st.just("figures"), st.just(None), st.just(None)),
    st.tuples(st.just("delete"), st.sampled_from(QUEUES), st.just(None)),
)


@settings(max_examples=examples(200))
@given(st.lists(st.tuples(step, st.booleans()), max_size=40))
def test_versions_pushes_and_limits_follow_the_topology(steps: list[tuple[tuple[Any, Any, Any], bool]]) -> None:
    config = Config().replace(gcm={"metadata_max_queues": 3, "metadata_max_watchers": 3, "metadata_rate": 1000})
    world, pushed = World(), []
    service = MetadataService("gcm-1", config.gcm, world.body, lambda: True, lambda p, f: pushed.append((p, f)))
    watching: dict[bytes, set[str]] = {}
    seen: dict[str, int] = {}  # the last version any answer or push gave per queue
    incarnations = itertools.count()
    for (kind, a, b), peek in steps:
        pushed.clear()
        if kind == "watch":
            before = dict(watching)
            try:
                answer = service.watch({"queues": b}, a)
            except LimitExceededError:
                assert len(b) > 3 or (a not in before and len(before) >= 3)
                assert watching == before and service.watchers == len(before)  # nothing registered
                continue
            watching[a] = set(b)
            for queue, body in answer["queues"].items():
                assert body["version"] >= seen.get(queue, 0)
                seen[queue] = body["version"]
        elif kind == "get":
            body = service.get({"queue": b}, a)
            assert body["version"] >= seen.get(b, 0) and body["gcm"] == "gcm-1"
            seen[b] = body["version"] if body["exists"] or b in {q for qs in watching.values() for q in qs} \
                else seen.get(b, 0)
        else:
            topology_changes = kind != "figures"
            if kind == "restart":
                world.queues.setdefault(a, {})[f"x{b}"] = f"x{b}.r{next(incarnations)}"
            elif kind == "delete":
                topology_changes = world.queues.pop(a, None) is not None
            else:
                world.publishers += 1
            for queue in QUEUES:
                service.dirty(queue)
            if peek:  # another connection's request reads the change before the push thread does
                for queue in QUEUES:
                    service.get({"queue": queue}, b"peeker")
            service._flush()
            got: dict[str, set[bytes]] = {}
            for peer, frame in pushed:
                push = decode_push(frame)
                assert push is not None and push["version"] > seen.get(push["queue"], 0)
                got.setdefault(push["queue"], set()).add(peer)
            for queue, peers in got.items():
                assert peers == {p for p, qs in watching.items() if queue in qs}
                assert service.get({"queue": queue}, b"checker")["version"] == \
                    decode_push(next(f for p, f in pushed if decode_push(f)["queue"] == queue))["version"]
                seen[queue] = max(seen.get(queue, 0), service.get({"queue": queue}, b"checker")["version"])
            if not topology_changes:
                assert not pushed  # figures alone are not pushed
            elif kind in ("restart", "delete"):  # every watcher of the changed queue hears of it
                assert got.get(a, set()) == {p for p, qs in watching.items() if a in qs}
        assert service.watchers <= 3


def test_renewals_cost_the_same_with_many_watchers_and_read_the_cache_only_after_a_change() -> None:
    """A renewal neither walks every watcher (10,000 idle clients once cost the GCMs most of a
    core: each request swept all watches and rate buckets) nor re-reads the cache while nothing
    changed; the sweep still ends exactly the watches that lapsed."""
    world, reads = World(), []
    config = Config().replace(gcm={"metadata_max_watchers": 30_000, "metadata_lease": 30.0})
    service = MetadataService("gcm-1", config.gcm, lambda q: reads.append(q) or world.body(q), lambda: True,
                              lambda p, f: None)
    peers = [b"p%d" % i for i in range(20_000)]
    for peer in peers:
        service.watch({"queues": ["a"]}, peer)
    started = time.monotonic()
    for peer in peers:
        service.watch({"queues": ["a"]}, peer)
    # Linear: well under a second here; the old quadratic sweep took minutes for 20,000.
    assert time.monotonic() - started < 15
    assert len(reads) == 1  # read once, then answered from what was read
    world.publishers += 1
    service.dirty("a")
    assert service.get({"queue": "a"}, b"checker")["exchanges"]["x1"]["stats"]["publishers"] == 1
    assert len(reads) == 2
    service._watchers[peers[0]].expires = 0.0  # the oldest lapses; the others are within their lease
    service._expire(time.monotonic())
    assert service.watchers == len(peers) - 1
