"""A consumer group member's container killed under work: its unacked messages go to the others.

Three member containers share a queue's work; the publisher runs in the test process. One member's
container is killed (SIGKILL to the whole container: its network namespace goes with it, so the
exchange may learn of it only from the member timeout, set to 3 s here). Every message must be
processed, and the messages the dead member held unacked must go to the others.
"""

from __future__ import annotations

import time

import pytest

from roq.client.publisher import Publisher
from tests.support.helpers import record_figures, wait_until

pytestmark = [pytest.mark.docker, pytest.mark.timeout(240)]

MESSAGES = 3000
MEMBERS = ("w1", "w2", "w3")


def done(outputs: dict, name: str) -> list[tuple[str, int]]:
    """(message id, deliveries) of what member `name` printed as processed."""
    lines = outputs[name].snapshot()
    return [(parts[1], int(parts[2])) for parts in (line.split() for line in lines)
            if len(parts) == 3 and parts[0] == "did"]


def test_a_group_members_container_killed_under_work_loses_nothing(lab) -> None:
    lab.start(gcms=1, hcms=2, env={"ROQ_EXCHANGE_GROUP_MEMBER_TIMEOUT": "3"})
    lab.create_queue("work")
    outputs = {}
    for name in MEMBERS:
        lab.launcher.start_client(name, "work", "--queue", "work", "--topic", "jobs", "--prefetch", "20",
                                  "--pause", "0.004")
        outputs[name] = lab.launcher.output(name)
    for name in MEMBERS:
        wait_until(lambda name=name: "ready" in outputs[name].snapshot(), timeout=60, message=f"{name} joined")
    with Publisher("work", lab.config) as pub:
        seqs = pub.publish_many("jobs", [b"%d" % i for i in range(MESSAGES)])
        pub.flush(timeout=60)
    ids = {f"{pub.id}:{seq}" for seq in seqs}
    wait_until(lambda: len(done(outputs, "w1")) >= 100, timeout=60, message="w1 at work")
    lab.launcher.kill("w1")
    killed = time.monotonic()
    victim = {i for i, _ in done(outputs, "w1")}

    def processed() -> set[str]:
        return {i for name in MEMBERS for i, _ in done(outputs, name)}
    wait_until(lambda: any(d > 1 for name in MEMBERS[1:] for _, d in done(outputs, name)), timeout=30,
               message="the dead member's messages redelivered")
    redelivered_after = time.monotonic() - killed
    wait_until(lambda: processed() >= ids, timeout=90, message="every message processed")
    survivors = [entry for name in MEMBERS[1:] for entry in done(outputs, name)]
    again = [i for i, d in survivors if d > 1]
    figures = {"messages": MESSAGES, "processed_by_victim": len(victim), "redelivered": len(again),
               "redelivered_after_s": round(redelivered_after, 2), "lost": len(ids - processed()),
               "processed_twice": len(set(again) & victim)}
    record_figures("docker-work-member-killed", **figures)
    assert processed() == ids
    assert 1 <= len(again) <= 20, figures  # what the victim held unacked: at most its prefetch
