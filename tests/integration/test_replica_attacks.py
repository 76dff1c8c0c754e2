"""The replica's sockets under attack, and a replica that hangs, with real
GCM, HCM, exchange and replica processes.

1. A peer that reaches a replica's `repl` endpoint (it is in ZooKeeper) cannot follow, continue,
   jump or replace the copy of the running incarnation, nor send group state: every frame must
   carry the incarnation's copy secret, of which only a digest is published (protocol 6.1).
2. A `position` request naming the running incarnation at the replica's `replay` socket seals
   nothing (`running`): the exchange keeps its incarnation, and nothing counts as a crash.
3. A replica frozen with SIGSTOP is replaced within seconds, and confirms resume.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from roq import protocol
from roq.client.publisher import Publisher
from roq.state import read_live
from roq.zk import read_json
from tests.integration.test_replication import Collector, create_replicated, start_hosts
from tests.support.helpers import record_figures, wait_until
from tests.support.hostile import attack_replica_copy, dealer, forged_copy_frames

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]


def replica_stats(zk, paths, queue: str) -> dict:
    return (read_json(zk, paths.replica_live(queue, "x1")) or {}).get("stats") or {}


class Victim(Collector):
    """A durable subscriber that also counts the attacker's payloads, should any reach it."""

    def __init__(self, *args, **kwargs) -> None:
        self.forged = 0
        super().__init__(*args, **kwargs)

    def on_message(self, msg) -> None:
        if msg.payload == b"forged":
            self.forged += 1
        else:
            super().on_message(msg)


def test_1_a_forged_copy_replaces_nothing_and_an_away_subscriber_gets_every_confirmed_message(
        config, zk, paths, procs) -> None:
    start_hosts(procs, zk, paths)
    create_replicated(config, zk, paths, "victim")
    config = config.replace(client={"state_dir": str(procs.workdir / "subscribers")})
    away = Victim("victim", config, zk, durable="audit")
    away.sub.wait_connected(timeout=15)
    away.sub.close()  # its position is saved: it resumes from the start of the stream
    with Publisher("victim", config) as pub:
        pub.publish("load", b"-1")  # hello: its id is now in every delivery anyone can read
        pub.flush(15)
        live = read_live(zk, paths, "victim")["x1"]
        replica = read_json(zk, paths.replica_live("victim", "x1"))
        assert replica
        frames = forged_copy_frames("x1", live["incarnation"], live["stats"].get("next_pos", 2), pub.id)
        assert not attack_replica_copy(replica["repl"], frames), "the replica answered a forged frame"
        sent = len(frames)
        for i in range(300):
            pub.publish("load", str(i).encode())
        pub.flush(30)
        assert pub.confirmed == 301
    wait_until(lambda: sum(replica_stats(zk, paths, "victim").get(k, 0) for k in ("malformed", "refused_copies"))
               >= sent,
               timeout=10, message="the replica to count every forged frame as refused")
    os.kill(int(live["pid"]), signal.SIGKILL)  # the exchange dies: only the replica holds what it confirmed
    back = Victim("victim", config, zk, durable="audit")
    try:
        wait_until(lambda: not back.missing(300), timeout=30, message="the 300 confirmed messages, from the replica")
        assert back.forged == 0 and back.sub.stats().gaps == 0 and back.duplicated() == 0
        record_figures("replica attack 1: forged copies", forged_frames_sent=sent, confirmed=300,
                       received=len([i for i in back.counts if i >= 0]), lost=len(back.missing(300)),
                       gaps=back.sub.stats().gaps)
    finally:
        back.sub.close()


def test_2_position_requests_for_the_running_incarnation_seal_nothing(config, zk, paths, procs) -> None:
    start_hosts(procs, zk, paths)
    create_replicated(config, zk, paths, "steady")
    live = read_live(zk, paths, "steady")["x1"]
    replica = read_json(zk, paths.replica_live("steady", "x1"))
    assert replica
    sock = dealer(replica["replay"])
    try:
        with Publisher("steady", config) as pub:
            pub.publish("t", b"first")
            pub.flush(15)  # the replica follows, and holds a copy of the running incarnation
            for attempt in range(6):  # six seals in 22 s once made the exchange FAILED (counted as crashes)
                sock.send(protocol.encode_position_request(attempt + 1, [b"t"], live["incarnation"]))
                assert sock.poll(5000), "no answer from the replica"
                with pytest.raises(protocol.ReplayRefused) as refused:
                    protocol.decode_replay_reply(sock.recv(), 1 << 30)
                assert refused.value.refusal == "running"
                pub.publish("t", b"%d" % attempt)
                pub.flush(15)  # confirms go on: the copy was not sealed
            assert pub.confirmed == 7
    finally:
        sock.close()
    now = read_live(zk, paths, "steady")["x1"]
    assert (now["incarnation"], now["pid"], now["restarts"]) == (live["incarnation"], live["pid"], 0)
    wait_until(lambda: (replica_stats(zk, paths, "steady").get("refused_seals"),
                        replica_stats(zk, paths, "steady").get("copies")) == (6, 1), timeout=10,
               message="the six refused seals counted, and one copy held")


def test_3_a_frozen_replica_is_replaced_and_confirms_resume_within_seconds(config, zk, paths, procs) -> None:
    start_hosts(procs, zk, paths)
    create_replicated(config, zk, paths, "frozen")
    old = read_json(zk, paths.replica_live("frozen", "x1"))
    assert old
    collector = Collector("frozen", config, zk)
    collector.sub.wait_connected(timeout=15)
    try:
        with Publisher("frozen", config) as pub:
            pub.wait_for_subscribers(1, timeout=15)
            for i in range(1000):
                pub.publish("load", str(i).encode())
            pub.flush(30)
            os.kill(int(old["pid"]), signal.SIGSTOP)  # a stuck disk or a paused VM look the same
            frozen_at = time.monotonic()
            try:
                for i in range(1000, 2000):
                    pub.publish("load", str(i).encode())
                pub.flush(60)
                resumed_in = time.monotonic() - frozen_at
            finally:
                try:
                    os.kill(int(old["pid"]), signal.SIGCONT)  # a no-op once it was killed
                except ProcessLookupError:
                    pass
            new = read_json(zk, paths.replica_live("frozen", "x1"))
            assert new and new["pid"] != old["pid"] and new["incarnation"] != old["incarnation"]
        wait_until(lambda: not collector.missing(2000), timeout=30, message="every confirmed message")
        record_figures("replica frozen (SIGSTOP)", confirmed=2000, lost=len(collector.missing(2000)),
                       duplicated=collector.duplicated(), confirms_resumed_in_s=round(resumed_in, 2))
        assert collector.duplicated() == 0
    finally:
        collector.sub.close()


def test_3_a_replica_its_hcm_cannot_revive_is_moved_by_the_leader(config, zk, paths, procs) -> None:
    """The HCMs' kill of a hung child is off here (as if SIGKILL could not reach a process stuck
    in the kernel): the leader sees the replica's znode silent and moves it to the third host."""
    start_hosts(procs, zk, paths, "hcm.hung_timeout=0")
    create_replicated(config, zk, paths, "stuck")
    old = read_json(zk, paths.replica_live("stuck", "x1"))
    assert old
    primary_host = read_live(zk, paths, "stuck")["x1"]["host"]
    with Publisher("stuck", config) as pub:
        pub.publish("load", b"0")
        pub.flush(15)
        os.kill(int(old["pid"]), signal.SIGSTOP)
        frozen_at = time.monotonic()
        try:
            pub.publish("load", b"1")
            pub.flush(60)
            resumed_in = time.monotonic() - frozen_at
        finally:
            try:
                os.kill(int(old["pid"]), signal.SIGCONT)
            except ProcessLookupError:
                pass
        new = read_json(zk, paths.replica_live("stuck", "x1"))
        assert new and new["host"] not in (old["host"], primary_host)
    record_figures("replica stuck, moved by the leader", confirms_resumed_in_s=round(resumed_in, 2))
