"""Admin commands at the exchange (exchange/commands.py, the groups' reset and delete, the journal's
purge mark) and between an exchange and its replica (protocol 7.6 `applied` / `recorded`): real
ZeroMQ sockets on 127.0.0.1, the loop driven step by step as in tests/unit/test_replication.py."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from exchange.commands import Commands
from exchange.groups import Groups, GroupSettings
from exchange.journal import Journal, load_archives
from roq import protocol
from roq.errors import ProtocolError
from tests.unit.test_journal import make_frames
from tests.unit.test_replication import INC, TOPIC, WAIT, Exchange, batch, dealer

SETTINGS = GroupSettings((b"jobs",), 30.0, 5, b"dead")


def working_group(now: list[float]) -> Groups:
    """A group with 10 messages: 3 in flight at member m1, 5 ready, 2 not before a later time."""
    groups = Groups(clock=lambda: now[0], wall=lambda: 1_000.0)
    group, _ = groups.join("workers", b"m1", SETTINGS, prefetch=3)
    assert group is not None
    groups.offer(1, b"jobs", "p-a", 0, list(range(1, 9)), [b"x"] * 8)
    groups.offer(2, b"jobs", "p-a", 0, [9, 10], [b"yy", b"yy"], [(0, 0, 5_000_000, b""), (1, 0, 5_000_000, b"")])
    assert sum(u.count for _, units in groups.dispatch(group) for u in units) == 3
    return groups


def test_a_reset_drops_what_waits_and_members_keep_what_they_hold() -> None:
    now = [100.0]
    groups = working_group(now)
    assert groups.reset("workers") == 7  # 5 ready, 2 delayed
    group = groups.groups["workers"]
    assert (group.ready, group.delayed_count, group.in_flight_count) == (0, 0, 3)
    assert groups.held_bytes == group.held_bytes == 3  # the payloads in flight only
    assert groups.ack("workers", b"m1", [(1, 0, 3)]) == 3  # their acks count as ever
    assert groups.reset("workers") == 0 and groups.reset("nobody") is None


def test_a_group_is_deleted_only_without_members_and_with_everything_it_held() -> None:
    now = [100.0]
    groups = working_group(now)
    with pytest.raises(ValueError, match="1 members"):
        groups.delete("workers")
    assert groups.groups["workers"].ready == 5  # refused: nothing changed
    groups.leave("workers", b"m1")  # its 3 come back
    assert groups.delete("workers") == 10
    assert "workers" not in groups.groups and groups.held_bytes == 0


def test_each_command_is_handed_out_once_and_what_does_not_parse_is_skipped() -> None:
    commands = Commands(purge_memory=600.0)
    commands.await_first(60.0)
    assert not commands.ready  # nothing heard yet: the loop holds publishers and members
    line = {"commands": [{"id": "c-1", "op": "group.reset", "group": "workers"}, {"id": "c-2", "op": "queue.purge"},
                         {"id": "bad id!", "op": "queue.purge"}, {"id": "c-3", "op": "rm -rf"},
                         {"id": "c-4", "op": "group.delete"}, "junk"], "purged": {"p-a": 7, "p-b": "x", "p-c": True}}
    commands.deliver(line)
    commands.deliver(line)  # the HCM writes again: nothing twice
    assert [(c.id, c.op, c.group) for c in commands.take()] == [("c-1", "group.reset", "workers"),
                                                               ("c-2", "queue.purge", None)]
    assert commands.ready and commands.take() == []
    commands.mark_applied(["c-1", "c-2"])
    commands.deliver(line)
    assert commands.take() == []  # applied: never again
    commands.mark_applied(["c-9"])  # an earlier incarnation's, as its replica said
    commands.deliver({"commands": [{"id": "c-9", "op": "queue.purge"}]})
    assert commands.take() == []
    assert commands.purged_through("p-a") == 7 and commands.purged_through("p-b") == 0


def test_purge_marks_are_forgotten_once_no_resend_can_reach_back() -> None:
    commands = Commands(purge_memory=-1.0)  # a mark already past its time when it comes
    commands.deliver({"commands": [], "purged": {"p-a": 7}})
    commands.take()
    assert commands.purged_through("p-a") == 0 and commands.purged == {}
    kept = Commands(purge_memory=600.0)
    kept.deliver({"commands": [], "purged": {"p-a": 7}})
    kept.deliver({"commands": [], "purged": {"p-a": 5}})  # a lower mark of another purge: the higher stands
    kept.take()
    assert kept.purged_through("p-a") == 7


def test_applied_recorded_and_the_adoption_s_commands_on_the_wire() -> None:
    state = [protocol.GroupRecord("workers", (b"jobs",), 30_000, 5, b"dead", 9, [(3, 0, 2, 1)])]
    proof = b"p" * 32
    decoded = protocol.decode_replica_request(protocol.encode_applied(INC, "k-abc", state, 9, proof))
    assert decoded == protocol.Applied(INC, "k-abc", state, 9, proof)
    assert protocol.decode_replica_reply(protocol.encode_recorded(INC, "k-abc")) == protocol.Recorded(INC, "k-abc")
    adoption = protocol.decode_replica_reply(protocol.encode_adoption(INC, "", [], {}, [], ("c-1", "k-abc")))
    assert isinstance(adoption, protocol.Adoption) and adoption.applied == ("c-1", "k-abc")
    # a replica from before commands: no `applied` field
    older = protocol.pack([protocol.ADOPTION, protocol.DATA_VERSION, INC, "", [], [], []])
    assert protocol.decode_replica_reply(older).applied == ()  # type: ignore[union-attr]
    for bad in (protocol.pack([protocol.APPLIED, 2, INC, "no spaces!", [], 0, proof]),
                protocol.pack([protocol.APPLIED, 2, INC, "k-abc", [], -1, proof]),
                protocol.pack([protocol.RECORDED, 2, INC, 7])):
        with pytest.raises(ProtocolError):
            try:
                protocol.decode_replica_request(bad)
            except ProtocolError:
                protocol.decode_replica_reply(bad)


@contextlib.contextmanager
def replicated_exchange(replicas: int = 2) -> Iterator[Exchange]:
    """A forwarder with replicas 2 and its replica (tests/unit/test_replication.py), in a context of its own."""
    context = zmq.Context()
    made = Exchange(context, replicas)
    try:
        yield made
    finally:
        made.close()
        context.destroy(linger=0)


def step_until(e: Exchange, done: Any) -> None:
    """Turn the exchange's command step and the replica until `done()`."""
    deadline = time.monotonic() + WAIT
    while not done():
        assert time.monotonic() < deadline, "no progress"
        e.turn(replicate=True)
        e.fw.admin.step(time.monotonic())
        if e.fw.link is not None and e.fw.link.sock is not None and e.fw.link.sock.poll(5):
            e.fw.durability.drain_replica(e.fw.link.sock)


def test_a_replicated_exchange_reports_a_command_once_its_replica_recorded_it() -> None:
    """The replica holds the state the command left, and the command's id for the next incarnation,
    before the exchange says it is done; a purge hides the copy below its point there too."""
    with replicated_exchange() as e:
        check_commands_recorded(e)


def check_commands_recorded(e: Exchange) -> None:
    fw = e.fw
    assert fw.link is not None
    fw.link.point_to(e.replica.repl_endpoint)
    member = dealer(e.ctx, fw.work_endpoint)
    member.send(protocol.encode_join("workers", [TOPIC], 2, 30_000, 5, b"dead", False))
    deadline = time.monotonic() + WAIT
    while not member.poll(5):
        assert time.monotonic() < deadline, "no answer to the join"
        fw.work.drain()
    assert protocol.decode_work_reply(member.recv(), 1 << 20).kind == protocol.JOINED
    pub, _ = e.publisher(1)
    pub.send(batch(e, 1, 10))
    assert e.answer(pub, replicate=True).seq == 10  # held by the replica: confirmed
    fw.work.pump()  # 2 go to the member, 8 wait
    reported: list[tuple[str, dict[str, Any]]] = []
    fw.on_command = lambda command_id, result: reported.append((command_id, result))
    fw.commands.deliver({"commands": [{"id": "c-reset", "op": "group.reset", "group": "workers"}]})
    fw.admin.step(time.monotonic())
    assert reported == [] and fw.groups.groups["workers"].ready == 0  # applied here, not yet recorded there
    step_until(e, lambda: reported)
    assert reported == [("c-reset", {"dropped": 8})]
    (state,) = e.replica.group_state[fw.incarnation]
    assert sum(p[2] for p in state.pending) == 2 and "c-reset" in e.replica.applied
    fw.commands.deliver({"commands": [{"id": "c-reset", "op": "group.reset", "group": "workers"}]})
    fw.admin.step(time.monotonic())
    assert len(reported) == 1  # heard again: applied once

    fw.commands.deliver({"commands": [{"id": "c-purge", "op": "queue.purge"}]})
    step_until(e, lambda: len(reported) == 2)
    result = reported[1][1]
    assert (result["upto"], result["frames"], result["messages"], result["publishers"]) == (2, 1, 10, {e.pid: 10})
    copy = e.replica.copies[fw.incarnation]
    assert copy.served_from == 2 and copy.served_frames == 0
    # The next incarnation learns what was applied, and keeps the publisher's resends out.
    asker = dealer(e.ctx, e.replica.repl_endpoint)
    asker.send(protocol.encode_adopt("x1.next", "x1", b"q" * 32))
    e.replica.learn_primary({"incarnation": "x1.next", "copy_digest": protocol.copy_digest(b"q" * 32)})
    e.replica._take_news()
    deadline = time.monotonic() + WAIT
    while not asker.poll(10):
        assert time.monotonic() < deadline
        if e.replica.repl.poll(0):
            e.replica._drain_primary()
    adoption = protocol.decode_replica_reply(asker.recv())
    assert isinstance(adoption, protocol.Adoption) and set(adoption.applied) == {"c-reset", "c-purge"}
    asker.close(linger=0)
    member.close(linger=0)


def test_resends_at_or_below_a_purge_mark_are_duplicates_and_the_rest_is_new() -> None:
    with replicated_exchange(replicas=1) as e:  # unreplicated: acks at once
        fw = e.fw
        fw.commands.deliver({"commands": [], "purged": {e.pid: 6}})
        fw.admin.step(time.monotonic())
        pub, _ = e.publisher(1)
        pub.send(batch(e, 1, 10))  # a publisher resending its window to an exchange that never had it
        assert e.answer(pub).seq == 10  # confirmed whole
        totals = fw.stats.totals
        assert (totals.msgs_in, totals.duplicates, fw.retention.messages_total) == (4, 6, 4)


def test_a_journal_s_purge_mark_keeps_purged_frames_out_of_a_restart(tmp_path: Path) -> None:
    journal = Journal(tmp_path, "x1.old", "fsync", 100, 1e9, 1 << 40)  # 3 records a segment
    for frame in make_frames(10):
        journal.append(*frame)
    journal.commit()
    journal.purge(8)
    assert sorted(int(p.stem) for p in (tmp_path / "x1.old").glob("*.seg")) == [7, 10]
    journal.close()
    (archive,) = load_archives(tmp_path, "x1.new", 1e9, 1 << 40)
    assert [f.pos for f in archive.frames] == [8, 9, 10] and archive.lost_before == 8
