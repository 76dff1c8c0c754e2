"""What a subscriber knows of each exchange incarnation's stream, and how it fills holes.

Pure logic, no sockets: the Subscriber feeds it what arrives (live frames, sync answers, beats,
disconnections) and gives it a `ReplayTransport` to reach the exchanges' retention; the
model-based tests give it a simulated exchange instead. Per stream and normalised prefix, `done`
is the position up to which every frame was handed over (or counted lost); a chain's `prev` above
it is a hole, fetched before the frame is handed over; a beat's position check finds a dropped
tail; an ended incarnation is drained from a stored copy before it is forgotten (END_DRAIN_TIMEOUT).
What retention no longer holds is counted in `gaps`, never 0 for a stream that cannot be verified.
The rules, one by one: docs/protocol.md section 4.4.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

from roq import protocol

log = logging.getLogger(__name__)

SYNC_TIMEOUT = 2.0  # no sync answer this long: catch up from the first live frame instead
IN_HAND_LIMIT = 100_000  # frames remembered per prefix in Stream.in_hand; beyond, gaps may count some
ENDED_LIMIT = 1_000  # forgotten incarnations whose late frames are still recognised
END_DRAIN_TIMEOUT = 60.0  # an ended incarnation's copy is asked this long before we give up on it
END_RETRY = 0.5  # seconds between attempts to drain an ended incarnation


class FetchFailed(Exception):
    """The exchange did not answer (gone, or too busy): the hole stays open and is retried."""


class NoCopy(FetchFailed):
    """No server holds a copy of that ended incarnation: nothing more can be fetched of it."""


class ReplayTransport(Protocol):
    def fetch(self, xid: str, incarnation: str, after: int, before: int,
              prefix: bytes) -> Iterator[protocol.Frames]:
        """Pages of frames after < pos < before of `prefix`; raises FetchFailed."""

    def position(self, xid: str, prefixes: list[bytes]) -> protocol.StreamPosition:
        """Where the stream is and where each prefix's chain ends; raises FetchFailed."""

    def ended_position(self, xid: str, incarnation: str, prefixes: list[bytes]) -> protocol.StreamPosition:
        """Where a stored copy of the ended `incarnation` ends (sealing it); later fetches of it go
        to that copy. Raises NoCopy if nothing holds one, FetchFailed if it did not answer."""


Deliver = Callable[["Stream", bytes, protocol.Delivery, bool], None]


def normalise(prefixes: Iterable[bytes]) -> list[bytes]:
    """The prefixes without those another one covers ("a" covers "ab"), sorted."""
    result: list[bytes] = []
    for prefix in sorted(set(prefixes)):
        if not result or not prefix.startswith(result[-1]):
            result.append(prefix)
    return result


def prefix_of(prefixes: list[bytes], topic: bytes) -> bytes | None:
    """The one of the normalised `prefixes` that `topic` starts with, if any."""
    for prefix in prefixes:
        if topic.startswith(prefix):
            return prefix
    return None


@dataclass
class Stream:
    xid: str  # the exchange's id
    incarnation: str
    done: dict[bytes, int]  # per prefix: every frame of it at or below this position is handled
    known: bool = False  # followed before (or resumed from a saved position): catch up from `done`
    synced: bool = False  # our subscriptions are live on it and older frames were caught up
    pending: list[tuple[bytes, protocol.Delivery]] = field(default_factory=list)  # live, before the sync
    unsynced_since: float = field(default_factory=time.monotonic)
    active: set[bytes] = field(default_factory=set)  # prefixes with a verified frame since the last beat
    unverified: set[bytes] = field(default_factory=set)  # prefixes with frames that carried no chain
    high: int = 0  # highest position handed over
    holes: list[tuple[bytes, int, int, bool]] = field(default_factory=list)  # (prefix, after, before, strict) to fetch
    # Per prefix, {pos: messages} of frames handed over that a later fetch may cover (they came
    # without a chain, or inside a hole not yet fetched): it must not count them lost.
    in_hand: dict[bytes, dict[int, int]] = field(default_factory=dict)
    ended_at: float | None = None  # when we saw the incarnation end; drained from its copy since
    next_drain: float = 0.0
    seen: bool = True  # we saw it run (a frame, a sync); False for a stream resumed from a saved position
    drained: bool = False  # a stored copy answered for it after it ended
    # Every frame of our prefixes at or below `floor` was handed over (or counted lost): where a saved
    # position may resume. Read by the application's thread: it may lag (raised at quiet moments,
    # `refresh_floor`), never lead (lowered at once when a hole stays open).
    floor: int = 0

    def refresh_floor(self) -> None:
        """Raise the floor to what is handled now (the I/O thread, between frames)."""
        if self.known:
            self.floor = min([*self.done.values(), *(hole[1] for hole in self.holes)])

    def in_hole(self, prefix: bytes, pos: int) -> bool:
        """Whether `pos` lies inside a remembered hole of `prefix` (not fetched yet, or never)."""
        return any(p == prefix and after < pos < before for p, after, before, _ in self.holes)

    def keep_if_in_hole(self, prefix: bytes | None, d: protocol.Delivery) -> bool:
        """A frame from inside a hole (held up on the way) is handed over late rather than dropped:
        keep it in hand, so that the hole's fetch does not count it lost."""
        if prefix is None or not self.in_hole(prefix, d.pos):
            return False
        self.keep(prefix, d)
        return True

    def take_late(self, prefix: bytes | None, d: protocol.Delivery) -> bool:
        """Whether a frame of this forgotten stream is handed over: newer than what was handled,
        or from a hole never filled (late, not lost). No chain can be followed any more."""
        if prefix is None:
            return False
        if d.pos > self.done[prefix]:
            self.done[prefix] = d.pos
            return True
        return self.in_hole(prefix, d.pos)

    def keep(self, prefix: bytes, d: protocol.Delivery) -> None:
        """A frame handed over that a later fetch may cover: that fetch must not count it lost."""
        in_hand = self.in_hand.setdefault(prefix, {})
        if len(in_hand) < IN_HAND_LIMIT:
            in_hand[d.pos] = len(d.seqs)

    def held(self, prefix: bytes, after: int, handled: int, fetched: set[int]) -> int:
        """Messages of the frames kept at after < pos <= handled that a fetch did not bring again
        (evicted since we handed them over: not lost); they are no longer kept."""
        in_hand = self.in_hand.get(prefix, {})
        held = 0
        for pos in [p for p in in_hand if after < p <= handled]:
            count = in_hand.pop(pos)
            if pos not in fetched:
                held += count
        return held


@dataclass
class StreamSet:
    prefixes: list[bytes]
    replay: ReplayTransport
    deliver: Deliver
    start_at_sync: set[str] = field(default_factory=set)  # incarnations running when we started ("now")
    # Told (incarnation, pos) when a stream is started past its beginning: frames at or below pos
    # were never ours, so a saved position must say so (else a resume would fetch them).
    started: Callable[[str, int], None] | None = None
    streams: dict[str, Stream] = field(default_factory=dict)
    ended: dict[str, Stream] = field(default_factory=dict)  # forgotten incarnations, oldest first
    gaps: int = 0  # messages of our prefixes evicted before we could fetch them
    unknown_gaps: int = 0  # holes whose size the exchange no longer knew (counted at least 1 in gaps)
    fetches: int = 0
    fetch_failures: int = 0
    resyncs: int = 0
    position_checks: int = 0

    def __post_init__(self) -> None:
        self.prefixes = normalise(self.prefixes)

    def resume(self, incarnation: str, pos: int) -> None:
        """Continue a stream from a saved position (every frame at or below `pos` was taken)."""
        self.streams[incarnation] = Stream(incarnation.rsplit(".", 1)[0], incarnation,
                                           {p: pos for p in self.prefixes}, known=True, high=pos, floor=pos,
                                           seen=False)

    def stream(self, incarnation: str, xid: str) -> Stream:
        stream = self.streams.get(incarnation)
        if stream is None:
            stream = self.streams[incarnation] = Stream(xid, incarnation, {p: 0 for p in self.prefixes})
        return stream

    # ------------------------------------------------------------ events

    def on_live(self, topic: bytes, d: protocol.Delivery) -> None:
        ended = self.ended.get(d.incarnation)
        if ended is not None:  # read from the socket after its incarnation was forgotten
            self._late(ended, topic, d)
            return
        stream = self.stream(d.incarnation, d.exchange)
        stream.seen = True
        if not stream.synced:
            stream.pending.append((topic, d))
            return
        self._accept(stream, topic, d)

    def on_sync(self, sync: protocol.Sync) -> None:
        if sync.incarnation in self.ended:
            return
        stream = self.stream(sync.incarnation, sync.exchange)
        stream.seen = True
        if not stream.synced and stream.ended_at is None:
            self._catch_up(stream, sync.next_pos)

    def on_disconnect(self, xid: str) -> None:
        """A dropped connection loses what was in flight: catch up at the next sync."""
        for stream in self.streams.values():
            if stream.xid == xid and stream.synced:
                stream.synced = False
                stream.unsynced_since = time.monotonic()

    def expire_syncs(self, now: float) -> None:
        """No sync answer (it was dropped): the first live frame shows where live begins."""
        for stream in list(self.streams.values()):
            if not stream.synced and stream.pending and stream.ended_at is None \
                    and now - stream.unsynced_since > SYNC_TIMEOUT:
                log.info("no sync from %s; catching up to its first live frame", stream.incarnation)
                self._catch_up(stream, stream.pending[0][1].pos)

    def on_beat(self, beat: protocol.Sync) -> None:
        """Prefixes quiet since the last beat (or whose frames carried no chain) while the stream
        moved on: ask where their chains end, and fetch what never reached us."""
        stream = self.streams.get(beat.incarnation)
        if stream is None or not stream.synced:
            return
        holes, stream.holes = stream.holes, []
        for prefix, after, before, strict in holes:  # the exchange did not answer then: try again
            self._fill_or_remember(stream, prefix, after, before, strict)
        check = [p for p in self.prefixes if p in stream.unverified
                 or (p not in stream.active and stream.done[p] < beat.next_pos - 1)]
        stream.active.clear()
        if check:
            self.check(stream, check)
        stream.refresh_floor()

    def refresh_floors(self) -> None:
        for stream in list(self.streams.values()):
            stream.refresh_floor()

    def check(self, stream: Stream, prefixes: list[bytes]) -> None:
        self.position_checks += 1
        try:
            answer = self.replay.position(stream.xid, prefixes)
        except FetchFailed:
            self.fetch_failures += 1
            return
        if answer.incarnation != stream.incarnation or len(answer.last) != len(prefixes):
            return  # the exchange restarted: this stream has ended
        for prefix, last in zip(prefixes, answer.last):
            if last > stream.done[prefix] and self._fill(stream, prefix, stream.done[prefix], last + 1) < last:
                self.fetch_failures += 1
                continue  # not all fetched: the rest is still open, checked again at the next beat
            # No frame of the prefix lies in (last, next_pos): what is still in flight to us is handled.
            stream.done[prefix] = max(stream.done[prefix], answer.next_pos - 1)
            stream.unverified.discard(prefix)

    # ------------------------------------------------------------ internals

    def _catch_up(self, stream: Stream, live_from: int) -> None:
        """Fetch what came before `live_from`, then hand over the frames held meanwhile."""
        pending, stream.pending = sorted(stream.pending, key=lambda item: item[1].pos), []
        if pending:
            # Frames in hand need no fetch (one evicted meanwhile would be counted lost although we
            # have it): catch up to the first of them, their chains show what is missing after it.
            live_from = min(live_from, pending[0][1].pos)
        if stream.known:
            self.resyncs += 1
            starts = dict(stream.done)  # continue where we left off
            strict = True
        else:
            if stream.incarnation in self.start_at_sync:
                self.start_at_sync.discard(stream.incarnation)
                after = live_from - 1
                if self.started is not None and after > 0:
                    self.started(stream.incarnation, after)
            else:
                after = 0  # an exchange new to us: all it retains may be ours
            starts = {p: after for p in self.prefixes}
            strict = False  # what was evicted before we knew the exchange was never ours to lose
        for prefix, after in starts.items():
            if after < live_from - 1:
                self._fill_or_remember(stream, prefix, after, live_from, strict)
            stream.done[prefix] = max(stream.done[prefix], live_from - 1)
        stream.synced = stream.known = True
        for topic, d in pending:
            self._accept(stream, topic, d)
        stream.refresh_floor()

    def _accept(self, stream: Stream, topic: bytes, d: protocol.Delivery) -> None:
        """A live frame: fill the hole before it in its prefix's chain, then hand it over."""
        prefix = prefix_of(self.prefixes, topic)
        if prefix is None:
            return  # not ours (another subscriber's marker)
        if d.pos <= stream.done[prefix]:
            if stream.keep_if_in_hole(prefix, d):  # a hole the exchange did not answer for
                self._hand_over(stream, topic, d, recovered=False)
            return  # else fetched already
        prev = d.chains.get(len(prefix))
        if prev is None:
            stream.unverified.add(prefix)  # the exchange was not following our prefix: check at the beat
            stream.keep(prefix, d)
        else:
            if prev > stream.done[prefix]:
                self._fill_or_remember(stream, prefix, stream.done[prefix], d.pos)
            stream.active.add(prefix)
            stream.done[prefix] = d.pos
        self._hand_over(stream, topic, d, recovered=False)

    def _fill_or_remember(self, stream: Stream, prefix: bytes, after: int, before: int,
                          strict: bool = True) -> None:
        """Fill a hole now, or remember what is left of it for the next beat when the exchange
        does not answer (later frames are handed over meanwhile: better late than lost)."""
        handled = self._fill(stream, prefix, after, before, strict)
        if handled < before - 1:
            self.fetch_failures += 1
            # From where the fetch stopped: the pages before were handed over and counted.
            stream.holes.append((prefix, handled, before, strict))
            stream.floor = min(stream.floor, handled)

    def _fill(self, stream: Stream, prefix: bytes, after: int, before: int, strict: bool = True) -> int:
        """Hand over the retained frames of `prefix` after < pos < before, and count what was
        evicted (unless not `strict`). Returns the position up to which the range was handled:
        before - 1, or less when the exchange stopped answering (the rest stays open)."""
        self.fetches += 1
        handled, lost, inexact, unknown, fetched = after, 0, 0, 0, set()
        try:
            for page in self.replay.fetch(stream.xid, stream.incarnation, after, before, prefix):
                lost += page.lost
                if not page.lost_exact:
                    inexact += 1
                    unknown += 0 if page.lost else 1  # the size is unknown: at least one
                for topic, body in page.frames:
                    try:
                        d = protocol.decode_delivery(body)
                    except protocol.ProtocolError:
                        continue
                    # A frame of many topics may hold messages of other prefixes: only ours go on.
                    mine = d.matching(topic, (prefix,)) if after < d.pos < before else None
                    if mine is not None:
                        fetched.add(d.pos)
                        self._hand_over(stream, topic, mine, recovered=True)
                handled = before - 1 if page.done else min(max(handled, page.scanned_to), before - 1)
        except FetchFailed:
            pass
        held = stream.held(prefix, after, handled, fetched)
        if not inexact:
            lost -= held  # handed over before, evicted since: counted in `lost`, yet not lost
        lost = max(lost, 0)
        if strict and (lost or inexact):
            self.gaps += lost + unknown
            self.unknown_gaps += inexact
            log.warning("%s: %d messages of prefix %r were evicted before we fetched them",
                        stream.incarnation, lost + unknown, prefix)
        stream.done[prefix] = max(stream.done[prefix], handled)
        return handled

    def end(self, incarnation: str, now: float | None = None) -> None:
        """The incarnation is no longer running: drain it from a stored copy, then forget it."""
        stream = self.streams.get(incarnation)
        if stream is None or stream.ended_at is not None:
            return
        stream.ended_at = time.monotonic() if now is None else now
        stream.synced = False
        stream.next_drain = 0.0

    def drain_ended(self, now: float | None = None) -> None:
        """Try each ended incarnation whose turn it is (see `end`)."""
        now = time.monotonic() if now is None else now
        for stream in [s for s in self.streams.values() if s.ended_at is not None and s.next_drain <= now]:
            stream.next_drain = now + END_RETRY
            ended_at = now if stream.ended_at is None else stream.ended_at
            if self._drain(stream) or now - ended_at >= END_DRAIN_TIMEOUT:
                self.forget(stream.incarnation)

    def _drain(self, stream: Stream) -> bool:
        """Fetch what a stored copy holds beyond what we handled; True when nothing is left to try."""
        try:
            answer = self.replay.ended_position(stream.xid, stream.incarnation, self.prefixes)
        except NoCopy:
            return True
        except FetchFailed:
            self.fetch_failures += 1
            return False
        if answer.incarnation != stream.incarnation or len(answer.last) != len(self.prefixes):
            return True
        stream.drained = True
        self.position_checks += 1
        pending = []
        for topic, d in sorted(stream.pending, key=lambda item: item[1].pos):
            if stream.keep_if_in_hole(prefix_of(self.prefixes, topic), d):  # before the hole's retry
                self._hand_over(stream, topic, d, recovered=False)  # (the copy may have evicted it)
            else:
                pending.append((topic, d))
        stream.pending = []
        holes, stream.holes = stream.holes, []
        for prefix, after, before, strict in holes:  # holes the exchange did not fill while it ran
            self._fill_or_remember(stream, prefix, after, before, strict)
        if pending:
            # Frames read after the end are in hand: fetch up to the first of them, then take them
            # as live frames (their chains show what is missing between): never counted lost.
            first = pending[0][1].pos
            for prefix in self.prefixes:
                if first - 1 > stream.done[prefix]:
                    self._fill_or_remember(stream, prefix, stream.done[prefix], first, strict=stream.known)
            for topic, d in pending:
                self._accept(stream, topic, d)
        end = answer.next_pos
        for prefix in self.prefixes:
            if end - 1 > stream.done[prefix] and not any(h[0] == prefix and h[2] >= end for h in stream.holes):
                # What we never followed (an exchange that died before we synced) was not ours to lose.
                self._fill_or_remember(stream, prefix, stream.done[prefix], end, strict=stream.known)
        stream.refresh_floor()
        if not stream.holes:
            log.info("%s ended: drained from its copy up to position %d", stream.incarnation, end - 1)
        return not stream.holes

    def forget(self, incarnation: str) -> None:
        """The exchange incarnation is gone: its open holes can never be filled now. Its frames
        still in hand, or read later, are handed over if they are newer than what was handled."""
        stream = self.streams.pop(incarnation, None) or Stream(
            incarnation.rsplit(".", 1)[0], incarnation, {p: 0 for p in self.prefixes})
        open_holes = sum(1 for hole in stream.holes if hole[3])  # the others were never ours to lose
        if not stream.seen and not stream.drained and stream.known:
            log.warning("%s ended while this subscriber was away and no copy of it is left (no replica, no "
                        "journal that holds it): what it held after position %d is lost or cannot be verified; "
                        "counted as one unknown gap", incarnation, min(stream.done.values(), default=0))
            open_holes += 1
        self.unknown_gaps += open_holes
        self.gaps += open_holes
        pending = sorted(stream.pending, key=lambda item: item[1].pos)
        # The holes stay, to recognise a late frame from inside one (handed over, not dropped).
        stream.synced, stream.pending, stream.in_hand = False, [], {}
        self.ended[incarnation] = stream
        if len(self.ended) > ENDED_LIMIT:
            del self.ended[next(iter(self.ended))]
        for topic, d in pending:
            self._late(stream, topic, d)

    def _late(self, stream: Stream, topic: bytes, d: protocol.Delivery) -> None:
        """A frame of a forgotten incarnation (see Stream.take_late)."""
        if stream.take_late(prefix_of(self.prefixes, topic), d):
            self._hand_over(stream, topic, d, recovered=False)

    def _hand_over(self, stream: Stream, topic: bytes, d: protocol.Delivery, recovered: bool) -> None:
        if d.pos > stream.high:
            stream.high = d.pos
        self.deliver(stream, topic, d, recovered)
