"""Which ended incarnations a subscriber from the beginning (or a time) reads besides the running
ones (roq/client/subscriber/from_time.py `earlier_incarnations`, protocol 4.4 rule 2): those a
replica lists as `stored` and those a running exchange lists as `archived`, found by searching
topologies, never one that runs, never one twice, the replica's order kept."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from roq.client.subscriber.from_time import earlier_incarnations
from tests.profiles import examples

XIDS = ("x1", "x2")
NAMES = st.sampled_from([f"{x}.{n}" for x in XIDS for n in ("a", "b", "c", "d")])
JUNK = st.one_of(st.none(), st.integers(), st.text(max_size=3), st.lists(st.one_of(st.integers(), st.none())))


@st.composite
def topologies(draw: st.DrawFn) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    live: dict[str, dict[str, Any]] = {}
    replicas: dict[str, dict[str, Any]] = {}
    for xid in XIDS:
        if draw(st.booleans()):
            live[xid] = {"incarnation": draw(NAMES), "replay": f"tcp://{xid}:1",
                         "archived": draw(st.one_of(st.lists(NAMES, max_size=4), JUNK))}
        if draw(st.booleans()):
            replicas[xid] = {"replay": draw(st.one_of(st.just(f"tcp://{xid}-r:1"), st.none())),
                             "stored": draw(st.one_of(st.lists(NAMES, max_size=4), JUNK))}
    return live, replicas


@settings(max_examples=examples(300))
@given(topologies())
def test_every_ended_incarnation_served_somewhere_is_read_once_from_a_server_that_lists_it(topology) -> None:
    live, replicas = topology
    found = earlier_incarnations(live, replicas)
    names = [incarnation for _, incarnation, _ in found]
    running = {x["incarnation"] for x in live.values()}
    assert len(names) == len(set(names)), "none twice"
    assert not set(names) & running, "a running incarnation is read live, not as an ended one"
    for xid, incarnation, where in found:
        replica = replicas.get(xid, {})
        if where == replica.get("replay"):
            assert incarnation in replica["stored"]
        else:
            assert where == xid and incarnation in live[xid]["archived"]
    listed = {inc for r in replicas.values() if isinstance(r.get("replay"), str) and isinstance(r["stored"], list)
              for inc in r["stored"]}
    listed |= {inc for x in live.values() if isinstance(x["archived"], list) for inc in x["archived"]}
    listed = {inc for inc in listed if isinstance(inc, str) and inc}  # junk entries are skipped
    assert set(names) == listed - running, "every one listed and not running is read"
    for xid, replica in replicas.items():
        if isinstance(replica.get("replay"), str) and isinstance(replica["stored"], list):
            mine = [inc for _, inc, where in found if where == replica["replay"]]
            assert mine == [inc for inc in dict.fromkeys(replica["stored"]) if inc in mine], "oldest first, kept"


def test_an_exchange_moved_after_its_host_was_lost_has_its_ended_incarnations_read_from_the_replica() -> None:
    live = {"x1": {"incarnation": "x1.c", "replay": "tcp://new:1", "archived": []}}
    replicas = {"x1": {"replay": "tcp://r:1", "stored": ["x1.a", "x1.b"]}}
    assert earlier_incarnations(live, replicas) == [("x1", "x1.a", "tcp://r:1"), ("x1", "x1.b", "tcp://r:1")]
    assert earlier_incarnations(live, {}) == [], "before: the new incarnation lists nothing of them"
