from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gcm.placement import HostLoad, choose_hosts, host_loads
from gcm.view import full_hosts
from roq.state import HostInfo


def test_least_loaded_first() -> None:
    hosts = [HostLoad("a", 4, 3), HostLoad("b", 4, 1), HostLoad("c", 4, 2)]
    # b is least loaded; the second exchange of the same queue then goes to another host, and of
    # a and c, c is less loaded.
    assert choose_hosts(2, hosts) == ["b", "c"]
    assert choose_hosts(1, hosts) == ["b"]


def test_spreads_a_queue_before_loading() -> None:
    hosts = [HostLoad("a", 8, 0), HostLoad("b", 8, 5)]
    assert choose_hosts(2, hosts) == ["a", "b"]  # distinct hosts first, for availability
    assert choose_hosts(1, hosts, {"a": 1}) == ["b"]


def test_capacity_is_honoured() -> None:
    hosts = [HostLoad("a", 1, 1), HostLoad("b", 2, 0)]
    assert choose_hosts(5, hosts) == ["b", "b"]
    assert choose_hosts(1, [HostLoad("a", 1, 1)]) == []


def test_host_loads_counts_only_live_hosts() -> None:
    loads = host_loads({"a": 2, "b": 3}, ["a", "a", "gone", None, "b"])
    assert loads == [HostLoad("a", 2, 2), HostLoad("b", 3, 1)]


@given(st.lists(st.tuples(st.integers(1, 5), st.integers(0, 5)), min_size=0, max_size=6), st.integers(0, 30))
def test_never_over_capacity(specs, count) -> None:
    hosts = [HostLoad(f"h{i}", cap, min(used, cap)) for i, (cap, used) in enumerate(specs)]
    picks = choose_hosts(count, hosts)
    free = sum(h.capacity - h.assigned for h in hosts)
    assert len(picks) == min(count, free)
    for h in hosts:
        assert h.assigned + picks.count(h.name) <= h.capacity


def test_avoided_hosts_are_never_chosen() -> None:
    hosts = [HostLoad("a", 4, 0), HostLoad("b", 4, 3)]
    assert choose_hosts(2, hosts, avoid={"a"}) == ["b"]  # b has room for one
    assert choose_hosts(1, hosts, avoid={"a", "b"}) == []


def test_full_hosts_are_the_journaling_ones_short_of_space_and_those_refusing() -> None:
    def host(name: str, journal: str, free: int, total: int = 1 << 30) -> HostInfo:
        return HostInfo(name, "", 4, stats={"data_free_bytes": free, "data_total_bytes": total}, journal=journal)

    hosts = {h.name: h for h in (host("a", "fsync", 10 << 20), host("b", "fsync", 100 << 20),
                                 host("c", "off", 0), host("d", "async", 0, total=0))}
    assert full_hosts(hosts, 64 << 20) == {"a"}  # c keeps no journal; d reports no disk (an older HCM)
    assert full_hosts(hosts, 64 << 20, refusing={"b"}) == {"a", "b"}
    assert full_hosts(hosts, 0) == set()
