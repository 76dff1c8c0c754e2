"""The exchange's view of its journal's disk (exchange/storage.py): when it is full, why, when it
writes again, and when a journal broken for good must end the incarnation. On a real tmpfs."""

from __future__ import annotations

import logging
import os
import threading

import pytest

from exchange.journal import Journal
from exchange.storage import RESTART_AFTER, STORAGE_FULL, JournalHealth

FOREVER = 1e9


def test_full_then_writing_again_each_said_once(small_disk, caplog: pytest.LogCaptureFixture) -> None:
    disk = small_disk("journal", 1 << 20)
    ballast = disk / "ballast"
    ballast.write_bytes(b"\0" * (900 << 10))
    journal = Journal(disk / "q" / "x1", "x1.a", "fsync", 64 << 10, FOREVER, 1 << 40)
    health = JournalHealth(journal, "q/x1")
    synced = threading.Event()
    assert health.commit(0.0, synced.set) is None and not health.full and health.error_text == ""
    journal.append(1, b"t", b"\0" * (200 << 10), 1)
    with caplog.at_level(logging.ERROR):
        assert health.commit(1.0, synced.set) is True  # the disk just refused
    assert health.full and health.error_text.startswith("ENOSPC: ")
    assert health.reason.startswith(f"{STORAGE_FULL}: exchange q/x1 cannot write its journal (ENOSPC")
    assert "journal of q/x1 cannot write: ENOSPC" in caplog.text
    assert health.commit(1.1, synced.set) is None  # still full (and not tried again yet)
    assert health.commit(2.0, synced.set) is None
    assert not health.must_restart(1.0 + RESTART_AFTER), "a full disk never ends the process"
    ballast.unlink()
    with caplog.at_level(logging.INFO):
        assert health.commit(3.0, synced.set) is False  # writes again
    assert not health.full and "writes again after 2.0s" in caplog.text
    journal.close()


def test_a_journal_broken_for_good_ends_the_incarnation_after_a_while(tmp_path, monkeypatch) -> None:
    def failing_fdatasync(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", failing_fdatasync)
    journal = Journal(tmp_path, "x1.a", "fsync", 64 << 10, FOREVER, 1 << 40)
    health = JournalHealth(journal, "q/x1")
    synced = threading.Event()
    journal.append(1, b"t", b"body", 1)
    health.commit(0.0, synced.set)  # written; the sync thread fails
    assert synced.wait(10)
    assert health.commit(1.0, synced.set) is True and journal.broken
    assert health.error_text.startswith("EIO: ")
    assert not health.must_restart(1.0 + RESTART_AFTER - 0.1)
    assert health.must_restart(1.0 + RESTART_AFTER)
    monkeypatch.setattr(os, "fdatasync", os.fdatasync)
    journal.close()  # logged, never raised
