"""The segment store's files (docs/segment-store.md): records of frames, and the sparse index beside them.

A store's frames are opaque records to it: position, when it was stored, routing topic, body, message
count and a small metadata blob. The framing (length + CRC-32 per record, a versioned file header,
careful writes) is the journal's (exchange/journal_format.py); the payload adds the time and the
metadata, so the header's magic differs and neither reader takes the other's files for its own.
Readers never raise on a damaged file: they stop at the first record they cannot verify and say why.
"""

from __future__ import annotations

import re
import struct
from typing import NamedTuple
from zlib import crc32

from exchange.journal_format import RECORD_HEADER

SEGMENT_HEADER = b"RoQS" + struct.pack("<I", 1)
INDEX_HEADER = b"RoQX" + struct.pack("<I", 1)
PAYLOAD_HEADER = struct.Struct("<QdIII")  # pos, stored_at (Unix time), messages, topic length, meta length
RECORD_FIXED = struct.Struct("<IIQdIII")  # RECORD_HEADER then PAYLOAD_HEADER, read at once
RECORD_OVERHEAD = RECORD_HEADER.size + PAYLOAD_HEADER.size  # bytes of a record beyond topic, meta and body
INDEX_ENTRY = struct.Struct("<QQdI")  # pos, file offset, stored_at, CRC-32 of the 24 bytes before it
INDEX_FIELDS = struct.Struct("<QQd")
MAX_RECORD = 256 << 20  # a length field above this is damage, not a frame (frames are <= exchange.max_batch_bytes)
SEGMENT_FILE = re.compile(r"^(\d{20})\.seg$")


class StoredFrame(NamedTuple):
    pos: int
    stored_at: float  # Unix time, never decreasing along the store
    topic: bytes
    body: bytes
    messages: int
    meta: bytes = b""

    @property
    def record_size(self) -> int:
        return RECORD_OVERHEAD + len(self.topic) + len(self.meta) + len(self.body)


class IndexEntry(NamedTuple):
    """The record at `offset` of a segment has position `pos` (at the segment's end: the next record
    written will); `stored_at` is a lower bound of that record's time."""
    pos: int
    offset: int
    stored_at: float


def segment_name(first_pos: int) -> str:
    return f"{first_pos:020d}.seg"


def index_name(first_pos: int) -> str:
    return f"{first_pos:020d}.idx"


def encode_record(frame: StoredFrame) -> bytes:
    payload = PAYLOAD_HEADER.pack(frame.pos, frame.stored_at, frame.messages, len(frame.topic),
                                  len(frame.meta)) + frame.topic + frame.meta + frame.body
    return RECORD_HEADER.pack(len(payload), crc32(payload)) + payload


def encode_entry(entry: IndexEntry) -> bytes:
    fields = INDEX_FIELDS.pack(*entry)
    return fields + struct.pack("<I", crc32(fields))


def decode_index(data: bytes) -> tuple[list[IndexEntry], str | None]:
    """The entries of an index file up to the first that fails its CRC or goes backwards, and why it
    stopped (None: clean end)."""
    if data[:len(INDEX_HEADER)] != INDEX_HEADER:
        return [], "no index file header"
    entries: list[IndexEntry] = []
    body = memoryview(data)[len(INDEX_HEADER):]
    whole = len(body) - len(body) % INDEX_ENTRY.size
    last = IndexEntry(0, 0, float("-inf"))
    for offset in range(0, whole, INDEX_ENTRY.size):
        pos, at, stored_at, crc = INDEX_ENTRY.unpack_from(body, offset)
        if crc32(body[offset:offset + INDEX_FIELDS.size]) != crc:
            return entries, f"index entry {len(entries)} fails its CRC"
        if pos < last.pos or at < last.offset or stored_at < last.stored_at:
            return entries, f"index entry {len(entries)} goes backwards"
        last = IndexEntry(pos, at, stored_at)
        entries.append(last)
    return entries, None if whole == len(body) else "torn index entry"


class Scan(NamedTuple):
    frames: list[StoredFrame]
    consumed: int  # bytes of whole verified records from the start of the data
    needed: int  # > 0: the next record is whole only with this many bytes from `consumed` on
    damage: str | None  # why the next record cannot be trusted (None: none found)


def scan_records(data: bytes | memoryview, pos: int, file_offset: int, limit: int = 1 << 62) -> Scan:
    """Verified records from the start of `data` (which is at `file_offset` in its file), the first
    at position `pos`, at most `limit` bytes of topics, metas and bodies (at least one record)."""
    view = memoryview(data)
    size = len(view)
    offset = 0
    frames: list[StoredFrame] = []
    taken = 0
    while offset < size:
        if offset + RECORD_OVERHEAD > size:
            return Scan(frames, offset, RECORD_OVERHEAD, None)
        length, crc, record_pos, stored_at, messages, topic_len, meta_len = RECORD_FIXED.unpack_from(view, offset)
        where = f"at byte {file_offset + offset}"
        if length < PAYLOAD_HEADER.size or length > MAX_RECORD \
                or PAYLOAD_HEADER.size + topic_len + meta_len > length:
            return Scan(frames, offset, 0, f"record lengths do not add up {where}")
        end = offset + RECORD_HEADER.size + length
        if end > size:
            return Scan(frames, offset, RECORD_HEADER.size + length, None)
        if frames and taken + length - PAYLOAD_HEADER.size > limit:
            return Scan(frames, offset, 0, None)
        if crc32(view[offset + RECORD_HEADER.size:end]) != crc:
            return Scan(frames, offset, 0, f"record fails its CRC {where}")
        if record_pos != pos:
            return Scan(frames, offset, 0, f"record of position {record_pos} where {pos} was due {where}")
        topic_at = offset + RECORD_OVERHEAD
        meta_at = topic_at + topic_len
        body_at = meta_at + meta_len
        frames.append(StoredFrame(pos, stored_at, bytes(view[topic_at:meta_at]), bytes(view[body_at:end]), messages,
                                  bytes(view[meta_at:body_at])))
        taken += length - PAYLOAD_HEADER.size
        offset = end
        pos += 1
    return Scan(frames, offset, 0, None)
