"""Where a subscriber starts: now, the beginning of what the exchanges retain, or a saved position;
and a durable name never replays history from before it existed."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from roq.client.publisher import Publisher
from roq.client.subscriber import Subscriber
from tests.integration.conftest import create

pytestmark = pytest.mark.integration

HISTORY = 300  # messages per exchange published before any subscriber exists


def publish(config, zk, exchange: str, topic: str, payloads: list[bytes]) -> None:
    with Publisher("hist", config, prefer=exchange) as pub:
        for payload in payloads:
            pub.publish(topic, payload)
        pub.flush(30)


def drain(sub: Subscriber, quiet: float = 1.0) -> list[bytes]:
    """Everything the subscriber gets until it has been quiet for `quiet` seconds."""
    got = []
    while (msg := sub.receive(timeout=quiet)) is not None:
        got.append(msg.payload)
    return got


def markers(config, zk, sub: Subscriber, tag: str) -> list[bytes]:
    """Publish one marker through each exchange; what the subscriber gets up to both markers."""
    sub.wait_connected(2)
    expected = {f"{tag}-{x}".encode() for x in ("x1", "x2")}
    for x in ("x1", "x2"):
        publish(config, zk, x, "numbers", [f"{tag}-{x}".encode()])
    got: list[bytes] = []
    while not expected <= set(got):
        msg = sub.receive(timeout=10)
        assert msg is not None, f"markers missing: got {len(got)} messages, last {got[-3:]}"
        got.append(msg.payload)
    return got


@pytest.fixture
def history(config, zk, paths, cluster):
    """Queue hist, 2 exchanges, each holding HISTORY numbered messages no subscriber saw."""
    create(config, zk, paths, "hist", 2)
    for x in ("x1", "x2"):
        publish(config, zk, x, "numbers", [f"{x}:{i}".encode() for i in range(HISTORY)])
    return {f"{x}:{i}".encode() for x in ("x1", "x2") for i in range(HISTORY)}


def test_start_now_or_from_the_beginning(config, zk, history):
    with Subscriber("hist", config, topics=["numbers"]) as now:
        assert sorted(markers(config, zk, now, "m1")) == [b"m1-x1", b"m1-x2"]  # no history before them
    with Subscriber("hist", config, topics=["numbers"], start="beginning") as everything:
        got = drain(everything)
    assert set(got) == history | {b"m1-x1", b"m1-x2"} and len(got) == len(set(got))
    with pytest.raises(ValueError, match="start must be one of"):
        Subscriber("hist", config, start="yesterday")


def test_a_new_durable_name_starts_where_asked_and_never_replays_older_history(config, zk, history, tmp_path):
    durable = config.replace(client={"state_dir": str(tmp_path / "state")})
    # Started "now" (the default), it only ever receives through x1, then stops.
    with Subscriber("hist", durable, topics=["numbers"], durable="audit") as first:
        first.wait_connected(2)
        publish(config, zk, "x1", "numbers", [b"live-1", b"live-2"])
        assert drain(first) == [b"live-1", b"live-2"]
    # Back again: x2's history, from before the name existed, is not its to replay.
    with Subscriber("hist", durable, topics=["numbers"], durable="audit") as again:
        assert again.resumed
        assert sorted(markers(config, zk, again, "m2")) == [b"m2-x1", b"m2-x2"]
    # A new name asked to start at the beginning gets all that is retained, once.
    with Subscriber("hist", durable, topics=["numbers"], durable="full", start="beginning") as full:
        got = drain(full)
    assert set(got) == history | {b"live-1", b"live-2", b"m2-x1", b"m2-x2"} and len(got) == len(set(got))
    with Subscriber("hist", durable, topics=["numbers"], durable="full", start="beginning") as full:
        assert sorted(markers(config, zk, full, "m3")) == [b"m3-x1", b"m3-x2"]  # the saved position wins


def roq(cfg: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "roq.cli", "--config", cfg, *args], capture_output=True,
                          text=True, timeout=timeout, env=dict(os.environ))


def test_roq_subscribe_from(config, zk, history, tmp_path):
    """The README's step: messages published before `roq subscribe --from beginning` are printed."""
    cfg = tmp_path / "roq.toml"
    cfg.write_text(config.replace(client={"state_dir": str(tmp_path / "state")}).to_toml())
    result = roq(str(cfg), "subscribe", "hist", "--topic", "numbers", "--from", "beginning", "--count", "10")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 10 and all(line.encode().split(b"\t")[1] in history for line in lines), lines
    # From a saved position: a subscriber that took half of x1's history and x2's, saved as a file.
    with Subscriber("hist", config, topics=["numbers"], start="beginning") as half:
        taken = [half.receive(timeout=10) for _ in range(HISTORY)]
        position = half.position()
    assert all(msg is not None for msg in taken)
    (tmp_path / "pos.json").write_text(json.dumps(position))
    rest = roq(str(cfg), "subscribe", "hist", "--from", str(tmp_path / "pos.json"), "--count", str(HISTORY))
    assert rest.returncode == 0, rest.stderr
    resumed = {line.split("\t")[1].encode() for line in rest.stdout.splitlines()}
    assert resumed == history - {msg.payload for msg in taken if msg is not None}
    # Piped into a reader that stops early: no traceback, and it ends.
    command = f"{sys.executable} -m roq.cli --config {cfg} subscribe hist --from beginning --timeout 2"
    head = subprocess.run(f"{command} | head -n 3", shell=True, capture_output=True, text=True, timeout=60)
    assert len(head.stdout.splitlines()) == 3 and "Traceback" not in head.stderr, head.stderr
    bad = roq(str(cfg), "subscribe", "hist", "--from", "yesterday")
    assert bad.returncode == 2 and "--from" in bad.stderr and "Traceback" not in bad.stderr
    # A durable name with a saved position resumes from it; --from is noted, not applied.
    first = roq(str(cfg), "subscribe", "hist", "--durable", "audit", "--from", "beginning", "--count", "1")
    assert first.returncode == 0, first.stderr
    again = roq(str(cfg), "subscribe", "hist", "--durable", "audit", "--from", "beginning", "--timeout", "1")
    assert again.returncode == 0 and "resumes from its saved position" in again.stderr
    assert len(again.stdout.splitlines()) == 2 * HISTORY - 1


def test_a_durable_name_closed_before_its_first_sync_still_starts_now(config, zk, history, tmp_path):
    """Closed at once (a script checking a name): the exchanges it had not synced with yet are saved
    as "start at the sync", so the next start does not read their history."""
    durable = config.replace(client={"state_dir": str(tmp_path / "state")})
    Subscriber("hist", durable, topics=["numbers"], durable="quick").close()
    saved = json.loads((tmp_path / "state" / "hist" / "quick.json").read_text())
    assert saved["streams"] or saved["start_at_sync"]
    with Subscriber("hist", durable, topics=["numbers"], durable="quick") as again:
        assert again.resumed
        assert sorted(markers(config, zk, again, "m4")) == [b"m4-x1", b"m4-x2"]


def test_a_hole_open_when_the_position_is_saved_is_fetched_on_resume(config, zk, history, tmp_path, monkeypatch):
    """The exchange does not answer fetches (a busy replay socket: the fault is injected in the
    client) while a durable subscriber resumes and takes a live frame: its saved position stays
    below the hole, so the next resume fetches what it missed while away."""
    from roq.client.subscriber.replay import ReplayClient
    from roq.client.subscriber.streams import FetchFailed

    durable = config.replace(client={"state_dir": str(tmp_path / "state"), "position_save_interval": 0.2})
    with Subscriber("hist", durable, topics=["numbers"], durable="audit") as first:
        first.wait_connected(2)
    away = [f"away-{i}".encode() for i in range(50)]
    publish(config, zk, "x1", "numbers", away)

    def busy(self, *args, **kwargs):
        raise FetchFailed("replay socket busy")
        yield  # a generator, as ReplayClient.fetch

    real_fetch = ReplayClient.fetch
    monkeypatch.setattr(ReplayClient, "fetch", busy)
    with Subscriber("hist", durable, topics=["numbers"], durable="audit") as second:
        second.wait_connected(2)
        publish(config, zk, "x1", "numbers", [b"live"])
        got = drain(second)
        assert b"live" in got and not set(away) & set(got)
    monkeypatch.setattr(ReplayClient, "fetch", real_fetch)
    with Subscriber("hist", durable, topics=["numbers"], durable="audit") as third:
        got += drain(third)
        assert third.stats().gaps == 0
    assert set(away) <= set(got) and not set(got) & history
