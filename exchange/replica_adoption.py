"""What a replica answers a restarted exchange that asks for its predecessor's consumer groups.

The newest group state held of an earlier incarnation, brought up to the copy's end (what left the
groups since is taken out, what came since is pending whole), with the frames of its pending
messages and each publisher's highest sequence number in that copy (protocol section 7.6). With a
disk storage policy a group's backlog may lie below the copy's memory tail (the primary's groups
read it from disk: exchange/group_spill.py): those frames are read from the copy's segment store
on this host (exchange/replica_disk.py).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from exchange.retention import Retention
from exchange.segment_store import SegmentStore
from roq import protocol
from roq.errors import ProtocolError

log = logging.getLogger(__name__)

READ_PAGE_BYTES = 4 << 20  # read from the copy's store at a time


def adoption_reply(adopt: protocol.Adopt, copies: Mapping[str, Retention],
                   group_state: Mapping[str, list[protocol.GroupRecord]],
                   group_done: Mapping[str, dict[str, list[tuple[int, int, int]]]], applied: tuple[str, ...],
                   stores: Mapping[str, SegmentStore] | None = None) -> bytes:
    """The groups the incarnation before `adopt.incarnation` left (the newest copy with a state),
    and the admin commands applied (`applied`): the adopting exchange applies none of them again."""
    ended = next((inc for inc in reversed(list(copies)) if inc != adopt.incarnation and inc in group_state
                  and inc.rsplit(".", 1)[0] == adopt.exchange), "")
    if not ended:
        return protocol.encode_adoption(adopt.incarnation, "", [], {}, [], applied)
    copy = copies[ended]
    lowest = min((needed_from(g) for g in group_state[ended]), default=copy.oldest)
    store = (stores or {}).get(ended)
    entries = stored_entries(store, lowest, copy.oldest) if store is not None else []
    for pos, (topic, body, messages) in enumerate(copy.entries(copy.oldest, 1 << 62), copy.oldest):
        assert isinstance(topic, bytes) and isinstance(body, bytes) and isinstance(messages, int)
        entries.append((pos, topic, body, messages))
    index = [(pos, topic, messages) for pos, topic, _, messages in entries]
    done = group_done.get(ended, {})
    groups = [_final(g, done.get(g.name, []), index, copy.next_pos) for g in group_state[ended]]
    pending = {p[0] for g in groups for p in g.pending}
    high: dict[str, int] = {}
    frames = []
    for pos, topic, body, _ in entries:
        try:
            delivery = protocol.decode_delivery(body)
        except ProtocolError:
            continue
        if delivery.seqs:
            high[delivery.publisher] = max(high.get(delivery.publisher, 0), delivery.seqs[-1])
        if pos in pending:
            frames.append((pos, topic, body))
    log.info("%s adopts the %d consumer groups of %s (%d frames)", adopt.incarnation, len(groups), ended,
             len(frames))
    return protocol.encode_adoption(adopt.incarnation, ended, groups, high, frames, applied)


def _final(record: protocol.GroupRecord, done: list[tuple[int, int, int]],
           frames: list[tuple[int, bytes, int]], next_pos: int) -> protocol.GroupRecord:
    """A group's state as the adopting exchange reads it: every pending message listed, up to the
    copy's end. Frames from the state's `upto` on were pending whole (those of the group's topics);
    what left the group since the state (acked, dead-lettered) is taken out."""
    gone: dict[int, list[tuple[int, int]]] = {}
    for pos, idx, count in done:
        gone.setdefault(pos, []).append((idx, idx + count))
    pending = list(record.pending)
    pending += [(pos, 0, messages, 0) for pos, topic, messages in frames
                if record.is_pending_whole(pos) and messages and topic.startswith(record.prefixes)]
    kept = []
    for pos, idx, count, deliveries in pending:
        for start, end in _minus((idx, idx + count), sorted(gone.get(pos, ()))):
            kept.append((pos, start, end - start, deliveries))
    return protocol.GroupRecord(record.name, record.prefixes, record.ack_timeout_ms, record.max_deliveries,
                                record.dead_letter, max(next_pos, record.upto), kept)


def needed_from(record: protocol.GroupRecord) -> int:
    """The lowest position holding a message the group may still hand out."""
    return min([p[0] for p in record.pending], default=record.upto)


def stored_entries(store: SegmentStore, first: int, end: int) -> list[tuple[int, bytes, bytes, int]]:
    """(pos, topic, body, messages) of the frames the store holds at first <= pos < end (a group's
    backlog below the copy's memory tail). Positions its retention deleted are passed over: the
    queue's policy let them go."""
    entries: list[tuple[int, bytes, bytes, int]] = []
    if store.first_pos > first:
        log.warning("adoption: the copy's store starts at %d, the groups' backlog at %d (retention deleted "
                    "the rest, or a state transfer is under way): those messages are gone", store.first_pos, first)
    pos, end = max(first, store.first_pos), min(end, store.end_pos)
    while pos < end:
        page = store.read(pos, end, READ_PAGE_BYTES)
        if page.damaged:
            log.warning("adoption: damaged records in the copy's store at %s; passed over", page.damaged)
        entries += [(f.pos, f.topic, f.body, f.messages) for f in page.frames]
        if page.next_pos <= pos:
            break
        pos = page.next_pos
    return entries


def _minus(span: tuple[int, int], holes: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """`span` without the (sorted) `holes`."""
    out, start = [], span[0]
    for lo, hi in holes:
        if hi <= start or lo >= span[1]:
            continue
        if lo > start:
            out.append((start, lo))
        start = max(start, hi)
    if start < span[1]:
        out.append((start, span[1]))
    return out
