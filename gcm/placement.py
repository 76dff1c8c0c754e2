"""Choosing hosts for exchanges and their replicas. Pure functions: no ZooKeeper, easy to test.

Rules, in order: never exceed a host's capacity; spread one queue's exchanges
over distinct hosts (so one host loss takes out as little of a queue as
possible); then least loaded (assigned / capacity); then by name, so the
result is deterministic.

Replicas (a queue with replicas 2): every exchange has a second slot, its replica, that runs as a
process on a host like the exchange itself and counts against that host's capacity the same way.
An exchange and its replica never share a host: the replica exists to outlive its primary's host.
So a replica is placed on a host other than its primary's, and a primary that is moved (its host was
lost) goes to a host other than its replica's; with no such host that has room, the slot stays
unplaced (None) until one has. Primaries are placed before replicas: a primary serves without its
replica, a replica serves nobody without its primary.

Full disks: an exchange on a host whose exchanges journal writes to that host's disk; a replica
keeps nothing on disk. A host whose data disk is full (gcm.view `full_hosts`) gets no exchange,
new or moved; an exchange whose journal's disk refuses writes (`relocate`) is moved to another
host that has room, or, with none, stays where it is.

Placements are keyed by slot: (queue, "x1") is exchange x1, (queue, "x1~r") its replica
(roq.paths.replica_slot). `plan_moves` is the leader's whole decision on a tick (gcm.reconciler):
which slots go where after host losses and full disks, given where every slot is.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from roq.paths import is_replica_slot, primary_of, replica_slot
from roq.state import exchange_order

Slots = Mapping[tuple[str, str], str | None]  # (queue, slot) → host, None while unplaced


@dataclass(frozen=True)
class HostLoad:
    name: str
    capacity: int
    assigned: int


@dataclass(frozen=True)
class Move:
    """Slot `slot` of `queue` goes from `old` to `new` (None for either: unplaced)."""
    queue: str
    slot: str
    old: str | None
    new: str | None


def choose_hosts(count: int, hosts: Iterable[HostLoad], queue_spread: Mapping[str, int] | None = None,
                 avoid: Collection[str] = ()) -> list[str]:
    """Up to `count` host names for new slots, none in `avoid`; fewer if capacity runs out."""
    hosts = list(hosts)
    load = {h.name: h.assigned for h in hosts}
    capacity = {h.name: h.capacity for h in hosts}
    spread = Counter(queue_spread or {})
    picks: list[str] = []
    for _ in range(count):
        candidates = [name for name in load if load[name] < capacity[name] and name not in avoid]
        if not candidates:
            break
        best = min(candidates, key=lambda n: (spread[n], load[n] / capacity[n], load[n], n))
        picks.append(best)
        load[best] += 1
        spread[best] += 1
    return picks


def choose_replica_host(hosts: Iterable[HostLoad], primary: str | None,
                        queue_spread: Mapping[str, int] | None = None) -> str | None:
    """A host for the replica of an exchange placed on `primary`: any other, by the same rules."""
    picks = choose_hosts(1, hosts, queue_spread, avoid={primary} if primary else ())
    return picks[0] if picks else None


def place_new_exchanges(count: int, hosts: Iterable[HostLoad], replicas: int,
                        queue_spread: Mapping[str, int] | None = None,
                        full: Collection[str] = ()) -> list[tuple[str | None, str | None]]:
    """(host, replica host) for `count` new exchanges of one queue; None where there is no room, and
    for every replica with `replicas` 1. `queue_spread`: the queue's slots already placed, per host;
    `full`: hosts whose data disk is full (no exchange goes there; a replica may)."""
    hosts = list(hosts)
    spread = Counter(queue_spread or {})
    primaries: list[str | None] = list(choose_hosts(count, hosts, spread, avoid=full))
    primaries += [None] * (count - len(primaries))
    if replicas < 2:
        return [(host, None) for host in primaries]
    load = Counter({h.name: h.assigned for h in hosts})
    spread.update(h for h in primaries if h)
    load.update(h for h in primaries if h)
    result: list[tuple[str | None, str | None]] = []
    for primary in primaries:
        replica = choose_replica_host(_with_load(hosts, load), primary, spread)
        if replica:
            load[replica] += 1
            spread[replica] += 1
        result.append((primary, replica))
    return result


def plan_moves(capacities: Mapping[str, int], placements: Slots, evacuate: Collection[str],
               relocate: Collection[tuple[str, str]] = (), full: Collection[str] = ()) -> list[Move]:
    """Where the slots go that need a host: unplaced ones, those on a host in `evacuate` (lost for
    long enough), replicas that share their primary's host, and the slots in `relocate` (a process
    that must leave a host that stays: an exchange whose journal's disk refuses writes, a replica
    that stopped answering), which go to any other host. No exchange goes to a host in `full`.
    Primaries first, then replicas, each in queue and id order, each decision seeing the ones
    before it. A replica that shares its primary's host and has nowhere else to go is unplaced;
    any other slot with nowhere to go stays."""
    working = dict(placements)
    load = Counter(h for h in working.values() if h is not None and h in capacities)
    moves: list[Move] = []
    for queue, slot in sorted(working, key=_planning_order):
        old = working[(queue, slot)]
        partner = working.get((queue, _partner(slot)))
        doubled = is_replica_slot(slot) and old is not None and old == partner
        moving = old is not None and (queue, slot) in relocate
        if old is not None and old not in evacuate and not doubled and not moving:
            continue
        spread = Counter(h for (q, _), h in working.items() if q == queue and h is not None and h in capacities)
        hosts = [HostLoad(name, cap, load[name]) for name, cap in sorted(capacities.items())]
        avoid = {partner} if partner else set()
        if moving and old is not None:
            avoid.add(old)
        if not is_replica_slot(slot):
            avoid |= set(full)
        picks = choose_hosts(1, hosts, spread, avoid=avoid)
        new = picks[0] if picks else None
        if new is None and not doubled:
            continue  # no room: retried on the next tick
        if old is not None and old in capacities:
            load[old] -= 1
        if new is not None:
            load[new] += 1
        working[(queue, slot)] = new
        moves.append(Move(queue, slot, old, new))
    return moves


def host_loads(capacities: Mapping[str, int], placements: Iterable[str | None]) -> list[HostLoad]:
    """Loads of the live hosts given where every slot (exchange or replica) is placed."""
    counts = Counter(p for p in placements if p in capacities)
    return [HostLoad(name, cap, counts[name]) for name, cap in sorted(capacities.items())]


def _with_load(hosts: list[HostLoad], load: Mapping[str, int]) -> list[HostLoad]:
    return [HostLoad(h.name, h.capacity, load[h.name]) for h in hosts]


def _partner(slot: str) -> str:
    """The other slot of the same exchange: the replica of a primary, the primary of a replica."""
    return primary_of(slot) if is_replica_slot(slot) else replica_slot(slot)


def _planning_order(key: tuple[str, str]) -> tuple[bool, str, tuple[int, str]]:
    queue, slot = key
    return is_replica_slot(slot), queue, exchange_order(primary_of(slot))
