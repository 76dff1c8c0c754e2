"""Replicated exchanges and the journal on a containerised cluster: whole hosts killed, cut off, restarted.

* g: a publisher's container and the host container of its exchange killed at the same
  moment, under load (replicas=2, 3 hosts);
* h: a subscriber's container cut off from the network, its exchange's host killed, the
  subscriber reconnected (replicas=2, 3 hosts; the publisher's replay window is shorter
  than the cut, so only the replica has what the dead exchange confirmed);
* i: every host container restarted with `exchange.journal = fsync`; durable
  subscribers resume from their saved positions (replicas 1 and 2).

Each scenario asserts, for every publisher, lost = 0 (confirmed and never handed to the
application) and duplicated = 0 (handed to the application twice, across a durable
subscriber's lives too), and prints its figures. "Confirmed" is the publisher's own
report: `Publisher.confirmed` after `flush()` for a publisher that lives; for a killed
publisher container, the last `confirmed N` line it printed (a lower bound).

    make docker-images   # the image carries the code: rebuild it after a change
    .venv/bin/python -m pytest tests/docker/test_replication.py -s
"""

from __future__ import annotations

import secrets
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from roq import protocol
from roq.client.subscriber import MessageBatch, Subscriber
from roq.state import read_exchanges, read_hosts, read_live
from tests.support.docker_launcher import last_confirmed, parse_got, publisher_exchange
from tests.support.helpers import PacedPublisher, record_figures, wait_until

pytestmark = [pytest.mark.docker, pytest.mark.timeout(240)]

JOURNAL_ENV = {"ROQ_EXCHANGE_JOURNAL": "fsync", "ROQ_HCM_DATA_DIR": "/var/lib/roq/data"}


class Tally:
    """What reached the application: (publisher, seq) → times handed over. Thread-safe."""

    def __init__(self) -> None:
        self.counts: Counter[tuple[str, int]] = Counter()
        self.per_publisher: Counter[str] = Counter()  # distinct messages
        self._lock = threading.Lock()

    def add(self, publisher: str, seqs: list[int] | range) -> None:
        with self._lock:
            for seq in seqs:
                key = (publisher, seq)
                if not self.counts[key]:
                    self.per_publisher[publisher] += 1
                self.counts[key] += 1

    def on_batch(self, batch: MessageBatch) -> None:
        self.add(batch.publisher, batch.seqs)

    def on_line(self, line: str) -> None:
        """A subscriber program's output line (see tests.support.docker_launcher)."""
        got = parse_got(line)
        if got:
            self.add(*got)

    def received(self, publisher: str) -> int:
        with self._lock:
            return self.per_publisher[publisher]

    def missing(self, publisher: str, confirmed: int) -> list[int]:
        with self._lock:
            return [seq for seq in range(1, confirmed + 1) if not self.counts[(publisher, seq)]]

    def has_all(self, confirmed: dict[str, int]) -> bool:
        with self._lock:
            return all(self.counts[(p, seq)] for p, n in confirmed.items() for seq in range(n, 0, -1))

    def account(self, confirmed: dict[str, int]) -> dict[str, Any]:
        """lost / duplicated of the publishers in `confirmed`, with the first few of each."""
        lost = {p: self.missing(p, n) for p, n in confirmed.items()}
        with self._lock:
            dups = sorted(k for k, c in self.counts.items() if c > 1 and k[0] in confirmed)
            received = sum(self.per_publisher[p] for p in confirmed)
        return {"confirmed": sum(confirmed.values()), "received": received,
                "lost": sum(len(v) for v in lost.values()), "duplicated": len(dups),
                "lost_first": {p[:10]: short(v) for p, v in lost.items() if v},
                "duplicated_first": [f"{p[:10]}/{s}" for p, s in dups[:10]]}

    @classmethod
    def of_lines(cls, lines: list[str]) -> Tally:
        tally = cls()
        for line in lines:
            tally.on_line(line)
        return tally


def short(seqs: list[int]) -> str:
    """A list of sequence numbers as at most a few runs, for a report."""
    if not seqs:
        return ""
    parts, start, prev = [], seqs[0], seqs[0]
    for seq in seqs[1:] + [None]:  # type: ignore[list-item]
        if seq is not None and seq == prev + 1:
            prev = seq
            continue
        parts.append(f"{start}-{prev}" if prev > start else str(start))
        if seq is not None:
            start = prev = seq
    return ",".join(parts[:8]) + (f",... ({len(seqs)} in {len(parts)} runs)" if len(parts) > 8 else "")


def settle(tally: Tally, confirmed: dict[str, int], timeout: float, since: float | None = None) -> float | None:
    """Wait until every confirmed message reached the application; the seconds since `since`
    (default: now) when it had, or None at the deadline (the accounting then says what is missing)."""
    return settle_all({"": tally}, confirmed, timeout, since)[""]


def settle_all(tallies: dict[str, Tally], confirmed: dict[str, int], timeout: float,
               since: float | None = None) -> dict[str, float | None]:
    """settle() for several tallies at once, under one deadline: name → seconds or None."""
    return times_until({name: (lambda t=tally: t.has_all(confirmed)) for name, tally in tallies.items()},
                       timeout, since)


def times_until(conditions: dict[str, Callable[[], bool]], timeout: float,
                since: float | None = None) -> dict[str, float | None]:
    """Poll every condition until all hold or the deadline: name → seconds since `since`
    (default: now) when it first held, None if it never did."""
    started = time.monotonic() if since is None else since
    done: dict[str, float | None] = {}

    def all_done() -> bool:
        for name, condition in conditions.items():
            if name not in done and condition():
                done[name] = time.monotonic() - started
        return len(done) == len(conditions)

    try:
        wait_until(all_done, timeout=timeout, interval=0.1, message=f"{', '.join(conditions)}")
    except AssertionError:
        pass
    return {name: done.get(name) for name in conditions}


def seconds(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def figures(name: str, **values: object) -> None:
    record_figures(name, **values)


def check(report: dict[str, Any]) -> None:
    assert report["lost"] == 0 and report["duplicated"] == 0, (
        f"lost {report['lost']} {report['lost_first']}, duplicated {report['duplicated']} "
        f"{report['duplicated_first']}")


def placements(lab, queue: str) -> dict[str, str]:
    """Exchange id → "host" or "host+replica host", as the leader placed them."""
    return {x.id: f"{x.host}" + (f"+{x.replica}" if x.replica else "")
            for x in read_exchanges(lab.zk, lab.paths, queue, live=False)}


def where(lab, queue: str, xid: str) -> tuple[str, str | None]:
    """(host of exchange xid, host of its replica or None)."""
    host = read_live(lab.zk, lab.paths, queue)[xid]["host"]
    replica = lab.replicas_live(queue).get(xid, {}).get("host")
    return host, replica


# ---------------------------------------------------------------- g


STALL_GAP = 2000  # "behind": confirmed messages of the victim the stalled subscriber has not received at the kill


@pytest.mark.parametrize("subscriber", ["keeping-up", "behind"])
def test_g_publisher_killed_with_its_exchange_host(lab, subscriber):
    """The victim publisher runs in a container; it and its exchange's host are SIGKILLed at
    once while a second publisher (in the test process, on the same exchange) keeps going.
    "behind": the subscriber's callback is stalled (and its socket queue short) from before
    the kill until after it, so the dead exchange's last confirmed frames never reached it:
    with the victim dead too, only the replica still has them."""
    lab.start(gcms=1, hcms=3)
    lab.create_queue("g", exchanges=2, replicas=2)
    tally = Tally()
    flowing = threading.Event()
    flowing.set()

    def on_batch(batch: MessageBatch) -> None:
        flowing.wait(60)  # stalled while cleared: the subscriber's I/O thread waits here
        tally.on_batch(batch)

    config = lab.config.replace(client={"receive_hwm": 50}) if subscriber == "behind" else lab.config
    sub = Subscriber("g", config, batch_callback=on_batch)
    survivor = None
    try:
        sub.wait_connected(timeout=30)
        survivor = PacedPublisher("g", lab.config, rate=500, start=False)
        xid = wait_until(lambda: survivor.pub.exchange, timeout=30, message="the survivor's exchange")
        token = secrets.token_bytes(16)
        victim = protocol.publisher_id_for(token)
        # On the survivor's exchange: the survivor has to move when that host dies.
        lab.launcher.start_client("pub", "publish", "--queue", "g", "--rate", "1000", "--token", token.hex(),
                                  "--subscribers", "1", "--prefer", xid, "--size", "2000")
        out = lab.launcher.output("pub")
        survivor.start()
        wait_until(lambda: last_confirmed(out.snapshot()) >= 3000 and survivor.pub.confirmed >= 1000,
                   timeout=60, message="both publishers under way")
        assert publisher_exchange(out.snapshot()) == xid == survivor.pub.exchange, "not on one exchange"
        host, replica = where(lab, "g", xid)
        if subscriber == "behind":
            flowing.clear()
            wait_until(lambda: last_confirmed(out.snapshot()) - tally.received(victim) >= STALL_GAP, timeout=30,
                       message=f"the stalled subscriber {STALL_GAP} confirmed messages behind")
        skew = lab.launcher.kill_together("pub", host)
        killed = time.monotonic()
        behind_by = last_confirmed(out.snapshot()) - tally.received(victim)
        flowing.set()
        survivor_at_kill = survivor.pub.confirmed
        lab.launcher.wait_exit("pub", timeout=30)
        lines = out.final()
        confirmed = last_confirmed(lines)
        sent = max([int(line.split()[3]) for line in lines if line.startswith("confirmed ")] or [0])
        times = times_until({"victim": lambda: tally.has_all({victim: confirmed}),
                             "survivor": lambda: tally.received(survivor.pub.id) >= survivor_at_kill + 1000},
                            timeout=45, since=killed)
        victim_all, resumed = times["victim"], times["survivor"]
        survivor.stop(flush_timeout=30)
        expected = {victim: confirmed, survivor.pub.id: survivor.pub.confirmed}
        settle(tally, expected, timeout=10 if victim_all is None else 30)
        victim_report = tally.account({victim: confirmed})
        survivor_report = tally.account({survivor.pub.id: survivor.pub.confirmed})
        moves = survivor.pub.moves
    finally:
        flowing.set()
        if survivor is not None:
            survivor.close()
        sub.close()
    figures(f"publisher + exchange host killed, subscriber {subscriber}", exchange=xid, host=host,
            replica=replica, kill_skew_s=round(skew, 3), subscriber_behind_by=behind_by,
            victim_sent_at_least=sent, victim_confirmed=confirmed,
            victim_received=victim_report["received"], victim_lost=victim_report["lost"],
            victim_duplicated=victim_report["duplicated"], victim_all_received_s=seconds(victim_all),
            survivor_confirmed=survivor_report["confirmed"], survivor_lost=survivor_report["lost"],
            survivor_duplicated=survivor_report["duplicated"], survivor_moves=moves,
            traffic_resumed_s=seconds(resumed), dropped_duplicates=sub.duplicates, gaps=sub.gaps,
            recovered_frames=sub.recovered_frames)
    check(victim_report)
    check(survivor_report)
    assert moves >= 1


# ---------------------------------------------------------------- h

REPLAY_SECONDS = 3.0  # the publisher's replay window in h: shorter than the subscriber's absence


def test_h_cut_off_subscriber_returns_after_its_exchange_host_died(lab):
    lab.start(gcms=1, hcms=3)
    lab.create_queue("h", exchanges=1, replicas=2)
    tally = Tally()
    lab.launcher.start_client("sub", "subscribe", "--queue", "h")
    out = lab.launcher.output("sub", on_line=tally.on_line)
    wait_until(lambda: "ready" in out.snapshot(), timeout=60, message="the subscriber container to connect")
    config = lab.config.replace(client={"replay_seconds": REPLAY_SECONDS})
    load = PacedPublisher("h", config, rate=1000, start=False)
    pub = load.pub
    try:
        pub.wait_for_subscribers(1, timeout=30)
        load.start()
        wait_until(lambda: tally.received(pub.id) >= 1000, timeout=30, message="1000 messages at the subscriber")
        host, replica = where(lab, "h", "x1")
        lab.launcher.disconnect("sub")
        cut = time.monotonic()
        at_cut = pub.confirmed
        wait_until(lambda: pub.confirmed >= at_cut + 1000, timeout=30, message="1000 confirmed while it is away")
        lab.launcher.kill(host)
        killed = time.monotonic()
        at_kill = pub.confirmed
        wait_until(lambda: pub.confirmed >= at_kill + 1000, timeout=60,
                   message="1000 confirmed by the exchange's next incarnation")
        during = time.monotonic() - killed
        # Past the publisher's replay window: what the dead exchange confirmed is only on its replica.
        wait_until(lambda: time.monotonic() - killed > REPLAY_SECONDS + 2, timeout=30,
                   message="the replay window to pass")
        at_reconnect = pub.confirmed
        lab.launcher.reconnect("sub")
        back = time.monotonic()
        away_s = back - cut
        caught_up = settle(tally, {pub.id: at_reconnect}, timeout=45)
        load.stop(flush_timeout=30)
        confirmed = pub.confirmed
        settle(tally, {pub.id: confirmed}, timeout=10 if caught_up is None else 30)
        moves = pub.moves
    finally:
        load.close()
    lab.launcher.stop("sub", timeout=10)  # a clean close; then its whole output is the record
    final = Tally.of_lines(out.final())
    report = final.account({pub.id: confirmed})
    stats = [line for line in out.final() if line.startswith("stats ")]
    figures("cut-off subscriber, exchange host killed", host=host, replica=replica, away_s=round(away_s, 2),
            confirmed_before_cut=at_cut, confirmed_before_kill=at_kill, confirmed_before_reconnect=at_reconnect,
            new_incarnation_confirming_s=round(during, 2), sent=load.sent, confirmed=confirmed,
            received=report["received"], lost=report["lost"], duplicated=report["duplicated"],
            caught_up_after_reconnect_s=seconds(caught_up),
            publisher_moves=moves, subscriber=stats[-1][6:] if stats else "")
    check(report)


# ---------------------------------------------------------------- i


class PreferringPublisher(PacedPublisher):
    """PacedPublisher on a chosen exchange (`prefer`), not started until start()."""

    def __init__(self, queue: str, config, rate: float, prefer: str) -> None:
        from roq.client.publisher import Publisher
        self.pub = Publisher(queue, config, prefer=prefer)
        self.prefer = prefer
        self.rate, self.max_messages, self.sent = rate, 10**7, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"paced-publisher-{prefer}", daemon=True)


class DurableReader:
    """A durable subscriber in iterator style (what `receive()` returned is what the
    application took), taking at most `limit` messages, recorded in a Tally shared by its
    lives (a reader opened again with the same name resumes from its saved position)."""

    def __init__(self, name: str, queue: str, config, zk, tally: Tally, limit: int | None = None) -> None:
        self.name, self.queue, self.config, self.zk, self.tally = name, queue, config, zk, tally
        self.taken = 0
        self.limit = limit
        self.lives = 0
        self.sub: Subscriber | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def open(self, limit: int | None = None) -> None:
        self.limit = limit
        self.taken = 0
        self.lives += 1
        self._stop.clear()
        self.sub = Subscriber(self.queue, self.config, durable=self.name)
        self._thread = threading.Thread(target=self._take, name=f"reader-{self.name}", daemon=True)
        self._thread.start()

    def _take(self) -> None:
        assert self.sub is not None
        while not self._stop.is_set():
            if self.limit is not None and self.taken >= self.limit:
                self._stop.wait(0.05)  # took enough: the rest stays in the inbox, not taken
                continue
            msg = self.sub.receive(timeout=0.1)
            if msg is not None:
                self.tally.add(msg.publisher, [msg.seq])
                self.taken += 1

    def close(self) -> dict[str, int]:
        """Close cleanly (the position is saved); the subscriber's counters."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        stats: dict[str, int] = {}
        if self.sub is not None:
            stats = self.sub.stats().as_dict()
            self.sub.close()
            self.sub = None
        return stats


@pytest.mark.parametrize("restart", ["graceful", "crash"])
@pytest.mark.parametrize("replicas", [1, 2])
def test_i_every_host_restarted_with_the_journal(lab, tmp_path, replicas, restart):
    """Three durable subscribers: "caught-up" takes everything and closes; "behind" takes 500
    messages, leaves the rest in its inbox and closes; "through" (callback style) stays open.
    The publisher flushes and closes (no replay window left anywhere), then every host
    container is restarted at once: `docker restart` ("graceful": SIGTERM, the HCMs stop
    their exchanges; "crash": -t 0, SIGKILL). The two closed readers resume, a new publisher
    sends more: each reader must get every confirmed message once over its lives."""
    lab.start(gcms=1, hcms=3, env=JOURNAL_ENV)
    lab.create_queue("i", exchanges=2, replicas=replicas)
    config = lab.config.replace(client={"state_dir": str(tmp_path / "state"), "position_save_interval": 0.2})
    tallies = {name: Tally() for name in ("caught-up", "behind", "through")}
    readers = {name: DurableReader(name, "i", config, lab.zk, tallies[name]) for name in ("caught-up", "behind")}
    through = Subscriber("i", config, durable="through", batch_callback=tallies["through"].on_batch)
    first: list[PreferringPublisher] = []
    second = None
    try:
        readers["caught-up"].open()
        readers["behind"].open(limit=500)
        for reader in readers.values():
            assert reader.sub is not None
            reader.sub.wait_connected(timeout=30)
        through.wait_connected(timeout=30)
        # One publisher on each exchange, so that both exchanges' streams must survive.
        first = [PreferringPublisher("i", lab.config, 500, xid) for xid in ("x1", "x2")]
        for load in first:
            load.pub.wait_for_subscribers(3, timeout=30)
            assert load.pub.exchange == load.prefer
        for load in first:
            load.start()

        def confirmed() -> int:
            return sum(load.pub.confirmed for load in first)

        wait_until(lambda: confirmed() >= 1500 and readers["behind"].taken >= 500, timeout=30,
                   message="1500 confirmed, 500 taken by 'behind'")
        behind_stats = readers["behind"].close()
        wait_until(lambda: confirmed() >= 2000, timeout=30, message="2000 confirmed")
        caught_stats = readers["caught-up"].close()
        wait_until(lambda: confirmed() >= 3000, timeout=30, message="3000 confirmed")
        for load in first:
            load.stop(flush_timeout=30)
        c1 = {load.pub.id: load.pub.confirmed for load in first}
        for load in first:
            load.close()  # no replay window left: what they confirmed lives only on the exchanges' side
        first = []
        settle(tallies["through"], c1, timeout=30)  # the open subscriber has it all before the restart
        before = {name: t.account(c1)["received"] for name, t in tallies.items()}
        placed_before = placements(lab, "i")
        old = lab.incarnations("i")
        restarted = time.monotonic()
        lab.launcher.restart_together(lab.hosts, timeout=10 if restart == "graceful" else 0)
        wait_until(lambda: len(read_hosts(lab.zk, lab.paths)) == len(lab.hosts), timeout=60,
                   message="every host to register again")
        lab.wait_serving("i", 2, replicas, replacing=old)
        placed_serving = placements(lab, "i")
        serving_at = time.monotonic()
        serving = serving_at - restarted
        for reader in readers.values():
            reader.open()
        second = PacedPublisher("i", lab.config, rate=1000, max_messages=1000)
        resumed = settle_all(tallies, c1, timeout=45, since=serving_at)
        wait_until(lambda: second.sent >= 1000, timeout=30, message="1000 more published")
        second.stop(flush_timeout=30)
        expected = {**c1, second.pub.id: second.pub.confirmed}
        settle_all(tallies, expected, timeout=30 if all(v is not None for v in resumed.values()) else 5)
        stats = {name: reader.close() for name, reader in readers.items()}
        stats["through"] = through.stats().as_dict()
    finally:
        for reader in readers.values():
            reader.close()
        through.close()
        for load in [*first, second]:
            if load is not None:
                load.close()
    reports = {name: t.account(expected) for name, t in tallies.items()}
    figures(f"every host restarted ({restart}), journal fsync, replicas {replicas}",
            placed_before=placed_before, placed_when_serving=placed_serving, placed_at_end=placements(lab, "i"),
            restart_to_serving_s=round(serving, 2),
            confirmed_before_restart=sum(c1.values()), confirmed_after=expected[second.pub.id],
            **{f"{name}_before_restart": before[name] for name in tallies},
            **{f"{name}_resumed_s": seconds(resumed[name]) for name in tallies},
            **{f"{name}_lost": r["lost"] for name, r in reports.items()},
            **{f"{name}_duplicated": r["duplicated"] for name, r in reports.items()},
            behind_first_life=behind_stats.get("received"), caught_up_first_life=caught_stats.get("received"),
            gaps={name: s.get("gaps") for name, s in stats.items()})
    for name, report in reports.items():
        assert report["lost"] == 0 and report["duplicated"] == 0, (
            f"{name}: lost {report['lost']} {report['lost_first']}, duplicated {report['duplicated']} "
            f"{report['duplicated_first']}")
