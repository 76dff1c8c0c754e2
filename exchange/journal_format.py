"""The journal's files (docs/journal.md): the segment format, the purge mark, careful file calls.

A reader never raises on a damaged file: it stops at the first record it cannot verify.
"""

from __future__ import annotations

import contextlib
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple
from zlib import crc32

FORMAT_VERSION = 2  # 2: bodies are data-path version 3 deliveries (frames of many topics); 1 held version 2
FILE_HEADER = b"RoQJ" + struct.pack("<I", FORMAT_VERSION)
RECORD_HEADER = struct.Struct("<II")  # payload length, CRC-32 of payload
PAYLOAD_HEADER = struct.Struct("<QII")  # pos, messages, topic length
RECORD_OVERHEAD = RECORD_HEADER.size + PAYLOAD_HEADER.size  # bytes of a record that are not topic or body
RECORD_FIXED = struct.Struct("<IIQII")  # both headers, read at once
SEGMENT_NAME = re.compile(r"^(\d{20})\.seg$")
JOURNAL_DIR = "journal"  # under hcm.data_dir: <JOURNAL_DIR>/<queue>/<xid>/<incarnation>/
PURGE_MARK = "purged"  # in an incarnation's directory: positions below the number it holds were purged




class ArchivedFrame(NamedTuple):
    pos: int
    topic: bytes
    body: bytes
    messages: int


@dataclass
class Archive:
    """An earlier incarnation's frames, as far as they could be verified."""
    incarnation: str
    frames: list[ArchivedFrame]  # consecutive positions, ascending
    lost_before: int  # position of frames[0] (the next position if empty)
    newest_mtime: float  # wall time its newest segment was last written


def segment_name(first_pos: int) -> str:
    return f"{first_pos:020d}.seg"



def read_segment(path: Path, first_pos: int) -> tuple[list[ArchivedFrame], str | None]:
    """The verified records of one segment file, and why reading stopped early (None: clean end).
    One loop without a call per record: a restart reads millions of them."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        return [], f"unreadable ({exc})"
    if data[:len(FILE_HEADER)] != FILE_HEADER:
        if data[:4] == FILE_HEADER[:4] and len(data) >= len(FILE_HEADER):
            version = struct.unpack_from("<I", data, 4)[0]
            return [], (f"journal format version {version}, this exchange reads {FORMAT_VERSION} (its frames are of "
                        "another data-path version): left on disk, not served")
        return [], "no journal file header (torn at creation)"
    frames: list[ArchivedFrame] = []
    add = frames.append
    view = memoryview(data)
    size = len(data)
    offset = len(FILE_HEADER)
    pos = first_pos
    while offset < size:
        if offset + RECORD_OVERHEAD > size:
            return frames, f"torn record at byte {offset}"
        length, crc, record_pos, messages, topic_len = RECORD_FIXED.unpack_from(data, offset)
        end = offset + RECORD_HEADER.size + length
        if end > size:
            return frames, f"torn record at byte {offset}"
        if length < PAYLOAD_HEADER.size or crc32(view[offset + RECORD_HEADER.size:end]) != crc:
            return frames, f"record fails its CRC at byte {offset}"
        if record_pos != pos:
            return frames, f"record of position {record_pos} where {pos} was due, at byte {offset}"
        topic_end = offset + RECORD_OVERHEAD + topic_len
        if topic_end > end:
            return frames, f"topic longer than its record at byte {offset}"
        add(ArchivedFrame(pos, data[offset + RECORD_OVERHEAD:topic_end], data[topic_end:end], messages))
        offset = end
        pos += 1
    return frames, None



def write_purge_mark(incarnation_dir: Path, upto: int) -> None:
    """The file `purged` of an incarnation's directory, made durable before it replaces the last one."""
    write_whole(incarnation_dir / PURGE_MARK, b"%d\n" % upto)


def write_whole(path: Path, data: bytes) -> None:
    """`path` replaced by `data` atomically (a temporary file, fsync, rename, fsync of the
    directory): a crash leaves the old or the new file, both whole. OSError: the old one stands."""
    tmp = path.with_suffix(".tmp")
    try:
        with open(tmp, "wb", opener=lambda name, flags: os.open(name, flags, 0o600)) as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
    except OSError:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)
    fsync_directory(path.parent)  # the rename itself survives a power cut


def read_purge_mark(incarnation_dir: Path) -> int:
    """The position below which the incarnation was purged (1: never; an unreadable mark counts as none)."""
    try:
        return max(1, int((incarnation_dir / PURGE_MARK).read_text().strip()))
    except (OSError, ValueError):
        return 1



# -- files ---------------------------------------------------------------------------------------

def close_quietly(fd: int) -> None:
    """close(2) can report an earlier write's error (NFS, EIO): what it says is already known or
    will show at the next sync; the descriptor is released either way."""
    with contextlib.suppress(OSError):
        os.close(fd)


def write_all(fd: int, data: memoryview) -> None:
    while data:
        written = os.write(fd, data)
        data = data[written:]


def fsync_directory(path: Path) -> None:
    """Make the directory's entries (a created file) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def missing_dirs(path: Path) -> list[Path]:
    """The levels of `path` that do not exist yet, top down."""
    missing = []
    level = path
    while not level.is_dir():
        missing.append(level)
        level = level.parent
    return missing[::-1]


def make_private_dir(level: Path) -> None:
    """mkdir with mode 0700 (there already: fine), made durable in its parent."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(level, 0o700)
    fsync_directory(level.parent)
