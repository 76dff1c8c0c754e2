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
