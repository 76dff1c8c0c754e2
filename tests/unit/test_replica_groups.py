"""A replica's group file (exchange/replica_groups.py): what it reads back is the newest state and
the acks since, and a file cut at any byte reads back as a prefix of what was written."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from exchange.replica_groups import FILE_NAME, GroupFiles, load
from roq import protocol
from tests.profiles import examples

INCARNATION = "x1.000000042"


def record(upto: int, pending: list[tuple[int, int, int, int]]) -> protocol.GroupRecord:
    return protocol.GroupRecord("w", (b"t",), 30_000, 5, b"dl", upto, pending)


def test_the_newest_state_and_the_acks_since_are_read_back(tmp_path: Path) -> None:
    files = GroupFiles()
    files.state(tmp_path, INCARNATION, [record(10, [(3, 0, 2, 1)])])
    files.done(tmp_path, INCARNATION, {"w": [(3, 0, 1)]})
    files.state(tmp_path, INCARNATION, [record(20, [(12, 0, 4, 0)])])
    files.done(tmp_path, INCARNATION, {"w": [(12, 1, 2)]})
    files.done(tmp_path, INCARNATION, {"w": [(21, 0, 1)]})
    files.sync()
    found = load(tmp_path)
    assert found is not None
    groups, done = found
    assert groups == [record(20, [(12, 0, 4, 0)])]
    assert done == {"w": [(12, 1, 2), (21, 0, 1)]}
    files.forget(tmp_path)
    assert load(tmp_path) is None


def test_a_file_that_grew_past_its_state_is_rewritten_as_the_state() -> None:
    with tempfile.TemporaryDirectory() as directory:
        root, files = Path(directory), GroupFiles()
        state = [record(10, [(pos, 0, 1, 0) for pos in range(1, 10)])]
        for _ in range(50):
            files.state(root, INCARNATION, state)
            files.done(root, INCARNATION, {"w": [(pos, 0, 1) for pos in range(1, 2_000)]})
        assert (root / FILE_NAME).stat().st_size < 200_000
        assert load(root) is not None


@settings(max_examples=examples(50), deadline=None)
@given(acks=st.lists(st.integers(1, 9), min_size=1, max_size=6), cut=st.integers(0, 10_000))
def test_a_file_cut_anywhere_reads_back_a_prefix(acks: list[int], cut: int) -> None:
    with tempfile.TemporaryDirectory() as directory:
        root, files = Path(directory), GroupFiles()
        files.state(root, INCARNATION, [record(10, [(pos, 0, 1, 0) for pos in range(1, 10)])])
        for pos in acks:
            files.done(root, INCARNATION, {"w": [(pos, 0, 1)]})
        path = root / FILE_NAME
        data = path.read_bytes()
        path.write_bytes(data[:cut % (len(data) + 1)])
        found = load(root)
        if found is None:
            return  # cut inside the state record: nothing
        groups, done = found
        assert groups[0].upto == 10
        assert done.get("w", []) == [(pos, 0, 1) for pos in acks][:len(done.get("w", []))]


def test_a_store_wiped_under_its_group_file_gets_the_state_again_never_acks_alone(tmp_path: Path) -> None:
    """A copy that starts afresh (a new follow, a jump) wipes its store's directory, group file
    included: acks that come next are not written alone (a file without a state reads as nothing),
    and the next state, or the copy's reopening, writes the file again, directory included."""
    import shutil

    from exchange.replica_groups import HeldGroups
    from exchange.segment_store import SegmentStore, StoreLimits
    directory = tmp_path / INCARNATION
    files = GroupFiles()
    files.state(directory, INCARNATION, [record(10, [(3, 0, 2, 1)])])
    shutil.rmtree(directory)
    files.done(directory, INCARNATION, {"w": [(3, 0, 1)]})
    assert not (directory / FILE_NAME).exists(), "acks written without a state"
    files.state(directory, INCARNATION, [record(20, [(12, 0, 4, 0)])])
    found = load(directory)
    assert found is not None and found[0] == [record(20, [(12, 0, 4, 0)])]
    held = HeldGroups()
    held.state[INCARNATION], held.done[INCARNATION] = [record(30, [(31, 0, 1, 0)])], {"w": [(31, 0, 1)]}
    shutil.rmtree(directory)
    held.reopened(INCARNATION, SegmentStore(directory, StoreLimits()))
    assert load(directory) == ([record(30, [(31, 0, 1, 0)])], {"w": [(31, 0, 1)]})


def test_acks_before_the_first_state_are_skipped_not_the_end_of_the_file(tmp_path: Path) -> None:
    from exchange.group_cursor import framed
    from exchange.replica_groups import STORED_PROOF
    done = framed(protocol.encode_done(INCARNATION, {"w": [(1, 0, 1)]}, STORED_PROOF))
    state = framed(protocol.encode_groups(INCARNATION, [record(5, [(4, 0, 1, 0)])], STORED_PROOF))
    (tmp_path / FILE_NAME).write_bytes(done + state)
    assert load(tmp_path) == ([record(5, [(4, 0, 1, 0)])], {})


def test_acks_with_no_state_to_compact_them_stop_at_the_files_bound(tmp_path: Path, monkeypatch) -> None:
    """A state too big to copy sends acks alone: the file stops growing at MAX_FILE_BYTES (what it
    holds still reads back), and the next state rewrites it."""
    import exchange.replica_groups as module
    monkeypatch.setattr(module, "MAX_FILE_BYTES", 4096)
    files = GroupFiles()
    files.state(tmp_path, INCARNATION, [record(10, [(3, 0, 2, 1)])])
    for pos in range(11, 500):
        files.done(tmp_path, INCARNATION, {"w": [(pos, 0, 1)]})
    assert (tmp_path / FILE_NAME).stat().st_size <= 4096
    assert load(tmp_path) is not None
    files.state(tmp_path, INCARNATION, [record(600, [])])
    assert load(tmp_path) == ([record(600, [])], {})
