"""The replica's note that a copy's store lacks what lies below its start (protocol section 6.5).

A copy that starts at a jump (the primary's memory had moved on) holds positions from `J` on; the
frames below `J` come by state transfer. Until that transfer joined the store, the store's
directory holds a file `transfer.missing` (the text of `J` in decimal), so that a replica process
started again, or asked for that incarnation by a restarted primary (`fill_ended`), knows the store
is not whole and takes the transfer of what lies below instead of answering it complete.

The file is written whole or not at all (a temporary file, fsync'ed, renamed, the directory
fsync'ed) before the store writes its first frame, and removed (directory fsync'ed) only once the
transfer's segments are in the store. A file whose content cannot be read (damaged) still says the
store is not whole: what is missing is then taken to lie below the store's first position.
"""

from __future__ import annotations

import os
from pathlib import Path

from exchange.journal_format import fsync_directory, make_private_dir, missing_dirs, write_whole

MISSING_FILE = "transfer.missing"
TORN = 0  # read_missing: a marker is there but its position cannot be read


def write_missing(directory: Path, below: int) -> None:
    """Note durably that the store in `directory` lacks the positions below `below` (raises OSError)."""
    for level in missing_dirs(directory):  # 0700, each made durable in its parent, as a store's own
        make_private_dir(level)
    write_whole(directory / MISSING_FILE, str(below).encode())


def read_missing(directory: Path) -> int | None:
    """Below which position the store in `directory` lacks frames: None when it is whole (no
    marker), TORN when a marker is there but unreadable."""
    try:
        text = (directory / MISSING_FILE).read_bytes()
    except FileNotFoundError:
        return None
    except OSError:
        return TORN
    try:
        below = int(text.decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        return TORN
    return below if below > 1 else TORN


def clear_missing(directory: Path) -> None:
    """The store in `directory` is whole now (raises OSError)."""
    try:
        os.unlink(directory / MISSING_FILE)
    except FileNotFoundError:
        return
    fsync_directory(directory)
