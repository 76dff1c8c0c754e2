"""Choosing hosts for exchanges and their replicas. Pure functions: no ZooKeeper, easy to test.

Never over a host's capacity; a queue's slots spread over zones, then hosts; an exchange and its
replica never on one host (and in different zones when one has room); primaries before replicas;
no exchange on a full disk; then least loaded, then by name. Placements are keyed by slot:
(queue, "x1") is exchange x1, (queue, "x1~r") its replica (roq.paths.replica_slot). `plan_moves` is
the leader's decision on a tick (gcm.reconciler); `plan_rebalance` evens the spread by a measure
each move lowers strictly, so plans never oscillate. The rules in full: docs/elasticity.md
("Placement", "Rebalancing", "Zones").
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction

from roq.paths import is_replica_slot, primary_of, replica_slot
from roq.state import exchange_order

Slots = Mapping[tuple[str, str], str | None]  # (queue, slot) → host, None while unplaced


@dataclass(frozen=True)
class HostLoad:
    name: str
    capacity: int
    assigned: int
    zone: str = ""  # hcm.zone: "" for none


@dataclass(frozen=True)
class Move:
    """Slot `slot` of `queue` goes from `old` to `new` (None for either: unplaced)."""
    queue: str
    slot: str
    old: str | None
    new: str | None


def choose_hosts(count: int, hosts: Iterable[HostLoad], queue_spread: Mapping[str, int] | None = None,
                 avoid: Collection[str] = (), avoid_zones: Collection[str] = ()) -> list[str]:
    """Up to `count` host names for new slots, none in `avoid`; fewer if capacity runs out. Hosts in
    `avoid_zones` only when no other has room; then the zone with the fewest of the queue's slots
    (`queue_spread`, per host), the host with the fewest, the least loaded, by name."""
    hosts = list(hosts)
    load = {h.name: h.assigned for h in hosts}
    capacity = {h.name: h.capacity for h in hosts}
    zone = {h.name: h.zone for h in hosts}
    spread = Counter(queue_spread or {})
    zones = Counter({z: sum(n for h, n in spread.items() if zone.get(h) == z) for z in set(zone.values())})
    picks: list[str] = []
    for _ in range(count):
        candidates = [name for name in load if load[name] < capacity[name] and name not in avoid]
        if not candidates:
            break
        best = min(candidates, key=lambda n: (zone[n] in avoid_zones, zones[zone[n]], spread[n],
                                              load[n] / capacity[n], load[n], n))
        picks.append(best)
        load[best] += 1
        spread[best] += 1
        zones[zone[best]] += 1
    return picks


def choose_replica_host(hosts: Iterable[HostLoad], primary: str | None,
                        queue_spread: Mapping[str, int] | None = None) -> str | None:
    """A host for the replica of an exchange placed on `primary`: any other, in another zone if one
    has room, by the same rules."""
    hosts = list(hosts)
    zone = {h.name: h.zone for h in hosts}
    picks = choose_hosts(1, hosts, queue_spread, avoid={primary} if primary else (),
                         avoid_zones={zone[primary]} if primary in zone else ())
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
               relocate: Collection[tuple[str, str]] = (), full: Collection[str] = (),
               zones: Mapping[str, str] | None = None) -> list[Move]:
    """Where the slots go that need a host: unplaced ones, those on a host in `evacuate` (lost for
    long enough), replicas that share their primary's host, and the slots in `relocate` (a process
    that must leave a host that stays: an exchange whose journal's disk refuses writes, a replica
    that stopped answering), which go to any other host. No exchange goes to a host in `full`.
    `zones`: host → zone (hcm.zone); a slot goes to another zone than its partner's if it can.
    Primaries first, then replicas, each in queue and id order, each decision seeing the ones
    before it. A replica that shares its primary's host and has nowhere else to go is unplaced;
    any other slot with nowhere to go stays."""
    working = dict(placements)
    zones = zones or {}
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
        hosts = [HostLoad(name, cap, load[name], zones.get(name, "")) for name, cap in sorted(capacities.items())]
        avoid = {partner} if partner else set()
        if moving and old is not None:
            avoid.add(old)
        if not is_replica_slot(slot):
            avoid |= set(full)
        partner_zone = {zones.get(partner, "")} if partner is not None and partner in capacities else set()
        picks = choose_hosts(1, hosts, spread, avoid=avoid, avoid_zones=partner_zone)
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


# The measure a rebalance lowers, compared in this order (gcm.placement module docstring):
Cost = tuple[int, int, int, int, int, Fraction]
ZERO: Cost = (0, 0, 0, 0, 0, Fraction(0))


def spread_cost(capacities: Mapping[str, int], placements: Slots, zones: Mapping[str, str] | None = None) -> Cost:
    """How uneven the slots on live hosts are: exchanges sharing their replica's zone; then, summed
    over queues, the squares of the queue's exchanges per zone and of all its slots per zone, the
    same per host; then the sum over hosts of load² / capacity. Lower is better; slots that are
    unplaced or on a host not in `capacities` do not count."""
    zones = zones or {}
    live = {key: host for key, host in placements.items() if host is not None and host in capacities}
    clashes = sum(1 for (queue, slot), host in live.items()
                  if is_replica_slot(slot) and (queue, primary_of(slot)) in live
                  and zones.get(live[(queue, primary_of(slot))], "") == zones.get(host, ""))
    squares = [sum(n * n for n in c.values()) for c in _queue_counts(live, zones)]
    load = Counter(live.values())
    overall = sum((Fraction(n * n, capacities[h]) for h, n in load.items()), Fraction(0))
    return (clashes, *squares, overall)  # type: ignore[return-value]


def plan_rebalance(capacities: Mapping[str, int], placements: Slots, zones: Mapping[str, str] | None = None,
                   max_moves: int = 2, margin: float = 1.0, queues: Collection[str] | None = None,
                   pinned: Collection[tuple[str, str]] = (), full: Collection[str] = ()) -> list[Move]:
    """Moves of slots between live hosts (`capacities`) that even the spread, best first, at most
    `max_moves` and at most one slot per exchange; each lowers `spread_cost` strictly. Only slots
    of `queues` (None: all) move, never one in `pinned`; no host goes over capacity, no slot goes to
    its partner's host, no exchange to a host in `full`. A move whose only gain is the overall load
    is made only from a host whose load exceeds its fair share (capacity × the cluster's mean load
    ratio) by more than `margin` slots. Unplaced slots and slots on hosts not in `capacities` stay
    (the caller rebalances only once every slot runs on a live host)."""
    zones = zones or {}
    working = dict(placements)
    total_capacity = sum(capacities.values())
    moved: set[tuple[str, str]] = set()  # exchanges with a slot moved by this plan
    moves: list[Move] = []
    while len(moves) < max_moves:
        best = _best_move(capacities, working, zones, margin, queues, pinned, full, moved, total_capacity)
        if best is None:
            break
        queue, slot, old, new = best
        working[(queue, slot)] = new
        moved.add((queue, primary_of(slot)))
        moves.append(Move(queue, slot, old, new))
    return moves


def _best_move(capacities: Mapping[str, int], working: dict[tuple[str, str], str | None], zones: Mapping[str, str],
               margin: float, queues: Collection[str] | None, pinned: Collection[tuple[str, str]],
               full: Collection[str], moved: set[tuple[str, str]],
               total_capacity: int) -> tuple[str, str, str, str] | None:
    """The move that lowers the cost the most (ties: exchanges before replicas, then queue, slot and
    host order), or None if none lowers it. Works on the cost's differences, not on the whole cost."""
    live = {key: host for key, host in working.items() if host is not None and host in capacities}
    load = Counter(live.values())
    mean = Fraction(len(live), total_capacity) if total_capacity else Fraction(0)
    per = _queue_counts(live, zones)
    best: tuple[Cost, tuple[bool, str, tuple[int, str], str], tuple[str, str, str, str]] | None = None
    for (queue, slot), old in sorted(live.items(), key=lambda item: _planning_order(item[0])):
        if (queues is not None and queue not in queues) or (queue, slot) in pinned \
                or (queue, primary_of(slot)) in moved:
            continue
        replica = is_replica_slot(slot)
        partner = live.get((queue, _partner(slot)))
        old_zone = zones.get(old, "")
        over = load[old] > capacities[old] * mean + Fraction(margin)  # beyond its fair share: hysteresis
        for new in sorted(capacities):
            if new == old or new == partner or load[new] >= capacities[new] or (not replica and new in full):
                continue
            new_zone = zones.get(new, "")
            clash = 0
            if partner is not None:
                partner_zone = zones.get(partner, "")
                clash = (new_zone == partner_zone) - (old_zone == partner_zone)
            terms = []
            for index, (a, b) in enumerate(((old_zone, new_zone), (old_zone, new_zone), (old, new), (old, new))):
                if replica and index in (0, 2):
                    terms.append(0)  # the exchanges-only terms do not see a replica
                elif a == b:
                    terms.append(0)
                else:
                    terms.append(2 * (per[index][(queue, b)] - per[index][(queue, a)]) + 2)
            overall = Fraction(2 * load[new] + 1, capacities[new]) - Fraction(2 * load[old] - 1, capacities[old])
            delta: Cost = (clash, *terms, overall)  # type: ignore[assignment]
            if delta >= ZERO:
                continue
            if delta[:5] == ZERO[:5] and not over:
                continue  # only the overall load would gain, from a host within its margin
            candidate = (delta, (replica, queue, exchange_order(primary_of(slot)), new), (queue, slot, old, new))
            if best is None or candidate[:2] < best[:2]:
                best = candidate
    return best[2] if best else None


def _queue_counts(live: Mapping[tuple[str, str], str], zones: Mapping[str, str]) -> list[Counter[tuple[str, str]]]:
    """The cost's middle terms' counts: per (queue, zone) its exchanges, then all its slots; per
    (queue, host) the same."""
    counts: list[Counter[tuple[str, str]]] = [Counter(), Counter(), Counter(), Counter()]
    for (queue, slot), host in live.items():
        zone = zones.get(host, "")
        if not is_replica_slot(slot):
            counts[0][(queue, zone)] += 1
            counts[2][(queue, host)] += 1
        counts[1][(queue, zone)] += 1
        counts[3][(queue, host)] += 1
    return counts


def host_loads(capacities: Mapping[str, int], placements: Iterable[str | None],
               zones: Mapping[str, str] | None = None) -> list[HostLoad]:
    """Loads of the live hosts given where every slot (exchange or replica) is placed."""
    counts = Counter(p for p in placements if p in capacities)
    return [HostLoad(name, cap, counts[name], (zones or {}).get(name, "")) for name, cap in sorted(capacities.items())]


def _with_load(hosts: list[HostLoad], load: Mapping[str, int]) -> list[HostLoad]:
    return [HostLoad(h.name, h.capacity, load[h.name], h.zone) for h in hosts]


def _partner(slot: str) -> str:
    """The other slot of the same exchange: the replica of a primary, the primary of a replica."""
    return primary_of(slot) if is_replica_slot(slot) else replica_slot(slot)


def _planning_order(key: tuple[str, str]) -> tuple[bool, str, tuple[int, str]]:
    queue, slot = key
    return is_replica_slot(slot), queue, exchange_order(primary_of(slot))
