"""The `roq` source's planning across an exchange's incarnations, without a session or a cluster
(roq.spark.chains): a stream whose offset is in an ended incarnation still served reads the rest of
it, then the later ones, then the running one, each frame once, whatever the trigger sizes and
however often the query restarts from its checkpoint; a batch or a stream from earliest or a time
reads the ended incarnations still served, oldest first; one served nowhere fails the query or is
skipped (failOnDataLoss)."""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from roq.spark.chains import Copies, IncarnationLost, at_time, earliest, offset, segments, step  # noqa: E402
from roq.spark.datasource import _start_of, plan_batch, plan_ranges  # noqa: E402
from roq.spark.exchanges import StreamEnd  # noqa: E402
from roq.spark.options import source_options  # noqa: E402
from tests.profiles import examples  # noqa: E402

BASE = {"seeds": "tcp://127.0.0.1:7000", "queue": "q"}
OPTS = source_options(BASE, True)


@st.composite
def incarnations(draw: st.DrawFn) -> tuple[list[StreamEnd], StreamEnd]:
    """Ended copies of x1, oldest first (some empty: oldest past their end), and the running one."""
    def stream(name: str) -> StreamEnd:
        last = draw(st.integers(0, 30))
        oldest = draw(st.integers(1, last + 1))
        return StreamEnd(name, last, oldest, f"tcp://copy-of-{name}")
    ended = [stream(f"x1.{i}") for i in range(draw(st.integers(0, 4)))]
    return ended, stream("x1.run")


def frames(inc: StreamEnd, after: int) -> set[tuple[str, int]]:
    """What a fetch after `after` returns: the retained frames above it."""
    return {(inc.inc, pos) for pos in range(max(after + 1, inc.oldest), inc.pos + 1)}


def read(ranges: list, streams: dict[str, StreamEnd]) -> list[tuple[str, int]]:
    got = []
    for r in ranges:
        s = streams[r.incarnation]
        got += [(s.inc, pos) for pos in range(max(r.after + 1, s.oldest), r.upto + 1)]
    return got


@settings(max_examples=examples(300), deadline=None)
@given(incarnations(), st.data())
def test_a_stream_in_an_ended_incarnation_reads_its_rest_then_the_later_ones_each_frame_once(chain, data) -> None:
    ended, running = chain
    streams = {s.inc: s for s in [*ended, running]}
    begin = data.draw(st.sampled_from([None, *ended, running]), label="the stream's offset is in")
    if begin is None:  # the exchange did not answer when the query started: from the beginning
        start: dict | None = None
        expected = set().union(*(frames(s, 0) for s in streams.values()))
    else:
        start = offset(begin.inc, data.draw(st.integers(begin.oldest - 1, begin.pos), label="at"), 0, begin.replay)
        expected = frames(begin, start["pos"])
        for later in ended[ended.index(begin) + 1:] if begin in ended else []:
            expected |= frames(later, 0)
        if begin is not running:
            expected |= frames(running, 0)
    latest = offset(running.inc, running.pos, 0, running.replay)
    copies = Copies({"x1": tuple(ended)})
    got: list[tuple[str, int]] = []
    for _ in range(200):  # each turn a micro-batch; the offsets are all a restart from the checkpoint keeps
        if start is not None and start["inc"] == running.inc and start["pos"] == running.pos:
            break
        end = latest if start is not None and start["inc"] == running.inc else step("x1", start, latest, copies, True)
        assert end is not None
        cap = data.draw(st.integers(1, 40), label="maxFramesPerTrigger")
        after, _ = _start_of(start, end["inc"])
        if end["pos"] > after + cap:
            end = offset(end["inc"], after + cap, 0, end["replay"])
        got += read(plan_ranges({"x1": start} if start else {}, {"x1": end}, OPTS), streams)
        names = [c.inc for c in copies.of("x1")]
        if start and start.get("ended") and start["inc"] in names and data.draw(st.booleans(), label="dropped"):
            copies = Copies({"x1": copies.of("x1")[names.index(start["inc"]) + 1:]})  # oldest first
        start = end
    assert sorted(got) == sorted(expected) and len(got) == len(set(got)), "every frame served, once"


def test_an_ended_incarnation_served_nowhere_fails_the_query_or_is_skipped() -> None:
    latest = offset("x1.run", 9, 0, "tcp://run")
    start = offset("x1.gone", 4, 0, "tcp://old")
    with pytest.raises(IncarnationLost, match="exchange x1: incarnation x1.gone has ended and no copy .* after "
                                              "position 4 cannot be read .*failOnDataLoss"):
        step("x1", start, latest, Copies(), True)
    assert step("x1", start, latest, Copies(), False) == latest  # logged, and on with the running one
    later = StreamEnd("x1.later", 3, 1, "tcp://run")
    assert step("x1", start, latest, Copies({"x1": (later,)}), False) == offset("x1.later", 3, 0, "tcp://run", True)
    # A copy that may come back (a replica restarting, a copy that did not answer): wait for it.
    assert step("x1", start, latest, Copies(waiting=frozenset({"x1"})), True) == start
    drained = {**start, "ended": True}
    assert step("x1", drained, latest, Copies(waiting=frozenset({"x1"})), True) == drained, "not past it"
    assert step("x1", None, latest, Copies(waiting=frozenset({"x1"})), True) is None  # a query's first: wait too
    # Read to its end before its copy went: nothing lost.
    assert step("x1", {**start, "ended": True}, latest, Copies(), True) == latest


@settings(max_examples=examples(200), deadline=None)
@given(incarnations())
def test_a_batch_from_earliest_reads_every_incarnation_still_served(chain) -> None:
    ended, running = chain
    streams = {s.inc: s for s in [*ended, running]}
    copies = Copies({"x1": tuple(ended)})
    start = earliest("x1", running, copies)
    parts = plan_batch({"x1": start}, {"x1": offset(running.inc, running.pos, 0, running.replay)}, OPTS, copies)
    everything = set().union(*(frames(s, 0) for s in streams.values()))
    got = read(parts, streams)
    assert sorted(got) == sorted(everything) and len(got) == len(set(got))
    assert list(dict.fromkeys(inc for inc, _ in got)) == [s.inc for s in [*ended, running] if frames(s, 0)], \
        "oldest first"
    assert all(p.replay == streams[p.incarnation].replay for p in parts), "each read where its copy is served"


@settings(max_examples=examples(200), deadline=None)
@given(incarnations(), st.data())
def test_from_a_time_each_incarnation_is_read_from_its_first_frame_stored_since(chain, data) -> None:
    ended, running = chain
    streams = [*ended, running]
    # position_at's answers, minus one, as time goes on: past every earlier incarnation's end.
    cut = data.draw(st.integers(0, len(streams) - 1), label="the time falls in")
    before = {s.inc: s.pos for s in streams[:cut]}
    before[streams[cut].inc] = data.draw(st.integers(streams[cut].oldest - 1, streams[cut].pos))
    before.update({s.inc: s.oldest - 1 for s in streams[cut + 1:] if data.draw(st.booleans())})
    expected = set().union(*(frames(s, before.get(s.inc, 0)) for s in streams))
    copies = Copies({"x1": tuple(ended)})
    start = at_time("x1", running, copies, before)
    end = offset(running.inc, running.pos, 0, running.replay)
    got = read(plan_batch({"x1": start}, {"x1": end}, OPTS, copies, before=before), {s.inc: s for s in streams})
    assert sorted(got) == sorted(expected) and len(got) == len(set(got))
    if expected:  # a stream starts in the first incarnation holding something since the time
        first = min(expected, key=lambda f: ([s.inc for s in streams].index(f[0]), f[1]))
        assert start["inc"] == first[0] and start["pos"] < first[1]


def test_a_batch_from_an_ended_incarnation_no_longer_served_fails_or_reads_the_running_one() -> None:
    end = offset("x1.run", 5, 0, "tcp://run")
    with pytest.raises(IncarnationLost, match="incarnation x1.gone"):
        segments("x1", offset("x1.gone", 2, 0, "tcp://old"), end, Copies(), True)
    rest = segments("x1", offset("x1.gone", 2, 0, "tcp://old"), end, Copies(), False)
    assert [(s.inc, s.after, s.upto) for s in rest] == [("x1.run", 0, 5)]
    ended = {**offset("x1.gone", 2, 0, "tcp://old"), "ended": True}  # read to its end: no loss
    later = StreamEnd("x1.later", 3, 2, "tcp://run")
    assert [(s.inc, s.after, s.upto) for s in segments("x1", ended, end, Copies({"x1": (later,)}), True)] == \
        [("x1.later", 1, 3), ("x1.run", 0, 5)]
