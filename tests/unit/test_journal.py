"""The journal: what an incarnation commits is what the next ones load, whatever the crash left.

Files are real (tmp_path); a crash is simulated by closing the journal and truncating what its
last write produced at any byte, as a process killed in the middle of `write` would leave it.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import stat
import tempfile
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

from exchange import journal as journal_module
from exchange import journal_format
from exchange.journal import RECORD_OVERHEAD, Archive, ArchivedFrame, Journal, load_archives
from tests.profiles import examples

FOREVER = 1e9
UNBOUNDED = 1 << 40
FILE_HEADER_SIZE = len(journal_module.FILE_HEADER)


def make_frames(count: int, start: int = 1, body_size: int = 10) -> list[ArchivedFrame]:
    return [ArchivedFrame(pos, b"t%d" % (pos % 3), bytes([pos % 251]) * body_size, pos % 4 + 1)
            for pos in range(start, start + count)]


def record_size(frame: ArchivedFrame) -> int:
    return RECORD_OVERHEAD + len(frame.topic) + len(frame.body)


def open_journal(root: Path, incarnation: str, mode: str = "async", segment_bytes: int = 1 << 20,
                 retention_seconds: float = FOREVER, retention_bytes: int = UNBOUNDED) -> Journal:
    return Journal(root, incarnation, mode, segment_bytes, retention_seconds, retention_bytes)


def write(root: Path, incarnation: str, frames: list[ArchivedFrame], commit_every: int = 4, **options) -> Journal:
    """Journal `frames` in commits of `commit_every`, then close it."""
    journal = open_journal(root, incarnation, **options)
    for i, frame in enumerate(frames, 1):
        journal.append(*frame)
        if i % commit_every == 0:
            journal.commit()
    journal.close()
    return journal


def segments(root: Path, incarnation: str) -> list[Path]:
    return sorted((root / incarnation).glob("*.seg"))


def load(root: Path, exclude: str = "current", max_age: float = FOREVER, max_bytes: int = UNBOUNDED,
         now: float | None = None) -> dict[str, Archive]:
    return {archive.incarnation: archive for archive in load_archives(root, exclude, max_age, max_bytes, now)}


def test_committed_frames_come_back_after_a_restart_across_segments(tmp_path: Path) -> None:
    frames = make_frames(50)
    write(tmp_path, "x1.old", frames, segment_bytes=300)
    assert len(segments(tmp_path, "x1.old")) > 3
    assert segments(tmp_path, "x1.old")[0].name == "00000000000000000001.seg"
    archive = load(tmp_path)["x1.old"]
    assert archive.frames == frames and archive.lost_before == 1
    assert archive.newest_mtime == max(path.stat().st_mtime for path in segments(tmp_path, "x1.old"))


def test_directories_are_0700_and_files_0600(tmp_path: Path) -> None:
    write(tmp_path / "journal" / "q", "x1.a", make_frames(3))
    for directory in (tmp_path / "journal", tmp_path / "journal" / "q", tmp_path / "journal" / "q" / "x1.a"):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    for path in segments(tmp_path / "journal" / "q", "x1.a"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_restart_loads_every_other_incarnation_oldest_first(tmp_path: Path) -> None:
    write(tmp_path, "x1.b", make_frames(5))
    write(tmp_path, "x1.a", make_frames(7))
    current = open_journal(tmp_path, "x1.current")
    current.append(1, b"t", b"now", 1)
    current.commit()
    for path, mtime in ((segments(tmp_path, "x1.a")[0], 1000.0), (segments(tmp_path, "x1.b")[0], 2000.0)):
        os.utime(path, (mtime, mtime))
    archives = load_archives(tmp_path, "x1.current", FOREVER, UNBOUNDED, now=3000.0)
    assert [archive.incarnation for archive in archives] == ["x1.a", "x1.b"]
    assert [len(archive.frames) for archive in archives] == [7, 5]
    assert [archive.newest_mtime for archive in archives] == [1000.0, 2000.0]
    current.close()


def test_a_torn_tail_is_cut_off_at_every_byte_and_earlier_records_kept(tmp_path: Path,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    frames = make_frames(5)
    write(tmp_path, "x1.old", frames, commit_every=5)
    (segment,) = segments(tmp_path, "x1.old")
    data = segment.read_bytes()
    ends = [FILE_HEADER_SIZE]  # byte offset where each record ends
    for frame in frames:
        ends.append(ends[-1] + record_size(frame))
    assert ends[-1] == len(data)
    for cut in range(ends[-2], len(data) + 1):  # every byte of the last record
        segment.write_bytes(data[:cut])
        caplog.clear()
        assert load(tmp_path)["x1.old"].frames == (frames if cut == len(data) else frames[:-1])
        assert bool(caplog.records) == (cut not in ends), cut
    for cut in range(len(data)):  # and anywhere earlier: whole records before the cut survive
        segment.write_bytes(data[:cut])
        complete = sum(1 for end in ends[1:] if end <= cut)
        assert load(tmp_path)["x1.old"].frames == frames[:complete]


def test_a_damaged_byte_stops_the_incarnation_at_the_last_good_record(tmp_path: Path,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    frames = make_frames(12)
    write(tmp_path, "x1.old", frames, segment_bytes=130)  # 4 frames a segment
    files = segments(tmp_path, "x1.old")
    assert len(files) == 3
    middle = files[1]
    data = middle.read_bytes()
    first_of_middle = int(middle.stem)
    start = FILE_HEADER_SIZE + record_size(frames[first_of_middle - 1])  # the segment's second record
    for offset in range(start, start + record_size(frames[first_of_middle])):
        damaged = bytearray(data)
        damaged[offset] ^= 0x40
        middle.write_bytes(damaged)
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            archive = load(tmp_path)["x1.old"]
        assert archive.frames == frames[:first_of_middle], offset  # the later segment is not used either
        assert any("stops" in record.getMessage() for record in caplog.records)
    middle.write_bytes(data)
    assert load(tmp_path)["x1.old"].frames == frames


def test_a_segment_of_the_older_format_is_left_on_disk_and_not_served(tmp_path: Path,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    """Format 1 held data-path version 2 bodies, which version 3 peers refuse: never served as 3."""
    frames = make_frames(8)
    write(tmp_path, "x1.old", frames, segment_bytes=130)
    files = segments(tmp_path, "x1.old")
    older = b"RoQJ" + (1).to_bytes(4, "little")
    first = files[0].read_bytes()
    files[0].write_bytes(older + first[FILE_HEADER_SIZE:])
    with caplog.at_level(logging.WARNING):
        archive = load(tmp_path).get("x1.old")
    assert archive is None or archive.frames == []
    assert any("format version 1, this exchange reads 2" in record.getMessage() for record in caplog.records)
    assert files[0].read_bytes()[:FILE_HEADER_SIZE] == older  # left as it was


def test_garbage_and_strange_entries_never_make_loading_raise(tmp_path: Path) -> None:
    write(tmp_path, "x1.good", make_frames(3))
    (tmp_path / "stray-file").write_bytes(b"not a directory")
    (tmp_path / "x1.noise").mkdir()
    (tmp_path / "x1.noise" / "00000000000000000001.seg").write_bytes(os.urandom(300))
    (tmp_path / "x1.noise" / "notes.txt").write_text("ignored")
    (tmp_path / "x1.dir" / "00000000000000000001.seg").mkdir(parents=True)
    (tmp_path / "x1.dangling").mkdir()
    (tmp_path / "x1.dangling" / "00000000000000000001.seg").symlink_to(tmp_path / "nowhere")
    (tmp_path / "x1.link").symlink_to(tmp_path / "x1.good")
    (tmp_path / "x1.header").mkdir()
    (tmp_path / "x1.header" / "00000000000000000001.seg").write_bytes(b"RoQJ\x09\x00\x00\x00")  # unknown version
    archives = load(tmp_path)
    assert archives["x1.good"].frames == make_frames(3)
    assert archives["x1.noise"].frames == [] and archives["x1.header"].frames == []
    assert set(archives) == {"x1.good", "x1.noise", "x1.header"}
    assert load_archives(tmp_path / "missing", "x", FOREVER, UNBOUNDED) == []


def test_segments_do_not_skip_positions(tmp_path: Path) -> None:
    frames = make_frames(12)
    write(tmp_path, "x1.old", frames, segment_bytes=130)
    segments(tmp_path, "x1.old")[1].unlink()  # a hole: positions 5..8 missing
    assert load(tmp_path)["x1.old"].frames == frames[:4]
    first = segments(tmp_path, "x1.old")[0]
    first.rename(first.with_name("00000000000000000003.seg"))  # its records are 1..4, not 3..
    assert load(tmp_path)["x1.old"].frames == []


def test_trim_deletes_only_segments_wholly_below_the_oldest_position(tmp_path: Path) -> None:
    journal = open_journal(tmp_path, "x1.old", segment_bytes=100)  # 3 records of 36 bytes a segment
    frames = make_frames(12)
    for frame in frames:
        journal.append(*frame)
    journal.commit()
    assert [path.name[-8:] for path in segments(tmp_path, "x1.old")] == ["0001.seg", "0004.seg", "0007.seg",
                                                                         "0010.seg"]
    journal.trim(6)
    assert [int(path.stem) for path in segments(tmp_path, "x1.old")] == [4, 7, 10]
    journal.trim(7)
    assert [int(path.stem) for path in segments(tmp_path, "x1.old")] == [7, 10]
    journal.trim(12)  # frame 12 is still retained: the current segment stays
    assert [int(path.stem) for path in segments(tmp_path, "x1.old")] == [10]
    journal.trim(13)  # everything evicted, nothing buffered: the current segment goes too
    assert segments(tmp_path, "x1.old") == []
    more = make_frames(2, start=13)
    for frame in more:
        journal.append(*frame)
    journal.close()
    archive = load(tmp_path)["x1.old"]
    assert archive.frames == more and archive.lost_before == 13


def test_the_journal_keeps_no_more_closed_segments_than_the_retention_bytes_need(tmp_path: Path) -> None:
    frames = make_frames(30)  # 12 bytes of topic and body each, 3 a segment
    write(tmp_path, "x1.bytes", frames, segment_bytes=100, retention_bytes=6 * 12)
    archive = load(tmp_path)["x1.bytes"]
    assert archive.frames == frames[-6:]  # the two newest segments hold the retention's 72 bytes


def test_the_journal_deletes_closed_segments_older_than_the_retention_time(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1000.0]
    monkeypatch.setattr(journal_module.time, "monotonic", lambda: clock[0])
    frames = make_frames(10)
    journal = open_journal(tmp_path, "x1.time", segment_bytes=100, retention_seconds=10)
    for frame in frames[:9]:
        journal.append(*frame)
        journal.commit()
    clock[0] += 11
    journal.append(*frames[9])
    journal.commit()  # opens segment 10; 1, 4 and 7 were last written 11 s ago
    assert [int(path.stem) for path in segments(tmp_path, "x1.time")] == [10]
    journal.close()


def test_max_age_deletes_old_incarnations_but_never_the_current_one(tmp_path: Path) -> None:
    for name in ("x1.old", "x1.young", "x1.current"):
        write(tmp_path, name, make_frames(3))
    for name, mtime in (("x1.old", 100.0), ("x1.young", 900.0), ("x1.current", 100.0)):
        for path in segments(tmp_path, name):
            os.utime(path, (mtime, mtime))
    (tmp_path / "x1.empty-old").mkdir()
    os.utime(tmp_path / "x1.empty-old", (100.0, 100.0))
    archives = load(tmp_path, exclude="x1.current", max_age=500, now=1000.0)
    assert set(archives) == {"x1.young"}
    assert sorted(path.name for path in tmp_path.iterdir()) == ["x1.current", "x1.young"]


def test_max_bytes_keeps_the_newest_frames_and_deletes_fully_dropped_segments(tmp_path: Path) -> None:
    older, newer = make_frames(12), make_frames(9)
    write(tmp_path, "x1.older", older, segment_bytes=130)  # segments at 1, 5, 9
    write(tmp_path, "x1.newer", newer, segment_bytes=130)
    for name, mtime in (("x1.older", 100.0), ("x1.newer", 200.0)):
        for path in segments(tmp_path, name):
            os.utime(path, (mtime, mtime))
    frame_bytes = len(older[0].topic) + len(older[0].body)
    for _ in range(2):  # the second load finds what the first one kept
        archives = load(tmp_path, max_bytes=(9 + 5) * frame_bytes, now=1000.0)
        assert archives["x1.newer"].frames == newer
        assert archives["x1.older"].frames == older[7:] and archives["x1.older"].lost_before == 8
        assert [int(path.stem) for path in segments(tmp_path, "x1.older")] == [5, 9]  # 1..4 all dropped, 8 kept
    archives = load(tmp_path, max_bytes=3 * frame_bytes, now=1000.0)
    assert archives["x1.older"].frames == [] and archives["x1.older"].lost_before == 13
    assert archives["x1.newer"].frames == newer[-3:]
    assert not (tmp_path / "x1.older").exists()
    assert "x1.older" not in load(tmp_path, now=1000.0)


@pytest.mark.parametrize("failing_write", range(1, 8))
def test_a_failed_write_leaves_the_files_whole_and_the_commit_can_be_retried(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing_write: int) -> None:
    """The disk fills up in the middle of a commit that rolls over to new segments: the write
    before the failing one is cut short, the failing one raises."""
    real_write, calls = os.write, [0]

    def filling_disk(fd: int, data: bytes) -> int:
        calls[0] += 1
        if calls[0] == failing_write:
            raise OSError(28, "No space left on device")
        if calls[0] == failing_write - 1:
            return real_write(fd, data[:max(1, len(data) // 2)])
        return real_write(fd, data)

    frames = make_frames(12)
    journal = open_journal(tmp_path, "x1.a", segment_bytes=100)  # 3 a segment
    for frame in frames[:2]:
        journal.append(*frame)
    journal.commit()
    monkeypatch.setattr(os, "write", filling_disk)
    calls[0] = 0
    for frame in frames[2:]:
        journal.append(*frame)
    with pytest.raises(OSError):
        journal.commit()
    assert journal.committed_pos == 3
    monkeypatch.setattr(os, "write", real_write)
    journal.commit()
    assert journal.committed_pos == 13
    journal.close()
    assert load(tmp_path)["x1.a"].frames == frames
    assert [int(path.stem) for path in segments(tmp_path, "x1.a")] == [1, 4, 7, 10]


def test_positions_must_be_consecutive(tmp_path: Path) -> None:
    journal = open_journal(tmp_path, "x1.a")
    with pytest.raises(ValueError):
        journal.append(0, b"t", b"b", 1)
    journal.append(5, b"t", b"b", 1)  # the first position may be any
    with pytest.raises(ValueError):
        journal.append(7, b"t", b"b", 1)
    with pytest.raises(ValueError):
        journal.append(5, b"t", b"b", 1)
    journal.append(6, b"t", b"b", 1)
    journal.commit()
    assert journal.committed_pos == 7
    journal.close()
    with pytest.raises(ValueError):
        open_journal(tmp_path, "x1.b", mode="sometimes")
    with pytest.raises(ValueError):
        open_journal(tmp_path, "../escape")


def test_fsync_mode_syncs_once_per_commit_plus_the_directory_for_a_new_file(tmp_path: Path) -> None:
    journal = open_journal(tmp_path, "x1.a", mode="fsync")
    journal.append(1, b"t", b"b", 1)
    assert journal.committed_pos == 1  # buffered only
    journal.commit()
    assert journal.committed_pos == 2 and journal.fsyncs == 2  # the file, and the directory it was made in
    for pos in (2, 3, 4):
        journal.append(pos, b"t", b"b", 1)
    journal.commit()
    journal.commit()  # nothing new: no sync
    assert journal.committed_pos == 5 and journal.fsyncs == 3
    journal.close()


def test_async_mode_syncs_at_most_once_a_second(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1000.0]
    monkeypatch.setattr(journal_module.time, "monotonic", lambda: clock[0])
    journal = open_journal(tmp_path, "x1.a", mode="async")
    for pos in range(1, 11):
        journal.append(pos, b"t", b"b", 1)
        journal.commit()
        assert journal.committed_pos == pos + 1  # handed to the OS
    assert journal.fsyncs == 0
    clock[0] += 1.0
    journal.commit()  # nothing new, but a sync is due
    assert journal.fsyncs == 2
    journal.append(11, b"t", b"b", 1)
    journal.commit()
    assert journal.fsyncs == 2
    journal.close()  # closing syncs whatever the clock says
    assert journal.fsyncs == 3


def test_mode_off_writes_nothing(tmp_path: Path) -> None:
    journal = open_journal(tmp_path / "journal", "x1.a", mode="off")
    journal.append(1, b"t", b"b", 1)
    journal.commit()
    assert journal.committed_pos == 2
    journal.close()
    assert not (tmp_path / "journal").exists()


# -- the model: random appends, commits, trims, crashes and reloads ---------------------------------

class Incarnation:
    """What one incarnation appended, committed and trimmed, as the loader must find it."""

    def __init__(self) -> None:
        self.frames: list[ArchivedFrame] = []  # appended, positions 1..
        self.committed = 1  # next position after the committed frames
        self.durable = 1  # committed before the last write: no crash can take these
        self.trimmed = 1  # highest oldest position passed to trim

    def check(self, archive: Archive | None, live: bool = False) -> None:
        """`live`: the incarnation is still running, so every commit of it is on disk."""
        durable = self.committed if live else self.durable
        must_keep = durable > self.trimmed  # some untrimmed frames are durable
        if archive is None:
            assert not must_keep
            return
        end = archive.lost_before + len(archive.frames)
        assert [frame.pos for frame in archive.frames] == list(range(archive.lost_before, end))
        assert archive.frames == self.frames[archive.lost_before - 1:end - 1]  # nothing invented
        assert end <= self.committed
        if must_keep:
            assert archive.lost_before <= self.trimmed and end >= durable


frame_strategy = st.tuples(st.binary(max_size=12), st.binary(max_size=40), st.integers(1, 1000))


class JournalMachine(RuleBasedStateMachine):
    base: Path | None = None  # the test's tmp_path

    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="example-", dir=self.base))
        self.dead: dict[str, Incarnation] = {}
        self.generation = 0
        self.mode = "async"
        self.segment_bytes = 100
        self.sizes_before_last_write: dict[Path, int] = {}

    @initialize(mode=st.sampled_from(["async", "fsync"]), segment_bytes=st.integers(20, 400))
    def start(self, mode: str, segment_bytes: int) -> None:
        self.mode, self.segment_bytes = mode, segment_bytes
        self.begin_incarnation()

    def begin_incarnation(self) -> None:
        self.generation += 1
        self.name = f"x1.{self.generation:04d}"
        self.model = Incarnation()
        self.sizes_before_last_write = {}
        self.journal = open_journal(self.root, self.name, self.mode, self.segment_bytes)

    def file_sizes(self) -> dict[Path, int]:
        return {path: path.stat().st_size for path in segments(self.root, self.name)}

    @rule(frames=st.lists(frame_strategy, min_size=1, max_size=8), then_commit=st.booleans())
    def append(self, frames: list[tuple[bytes, bytes, int]], then_commit: bool) -> None:
        for topic, body, messages in frames:
            frame = ArchivedFrame(len(self.model.frames) + 1, topic, body, messages)
            self.journal.append(*frame)
            self.model.frames.append(frame)
        if then_commit:
            self.commit()

    def before_a_write(self) -> None:
        if len(self.model.frames) + 1 > self.model.committed:
            self.sizes_before_last_write = self.file_sizes()
            self.model.durable = self.model.committed

    @rule()
    def commit(self) -> None:
        self.before_a_write()
        self.journal.commit()
        self.model.committed = len(self.model.frames) + 1
        assert self.journal.committed_pos == self.model.committed

    @rule(which=st.integers(0, 100), delta=st.integers(-1, 1))
    def trim(self, which: int, delta: int) -> None:
        """Trim at, just before or just after where a segment starts or the frames end."""
        boundaries = [int(path.stem) for path in segments(self.root, self.name)] + [len(self.model.frames) + 1]
        oldest = max(1, boundaries[which % len(boundaries)] + delta)
        self.journal.trim(oldest)
        self.model.trimmed = max(self.model.trimmed, oldest)

    @rule(which=st.integers(0, 10), where=st.floats(0, 1))
    def crash(self, which: int, where: float) -> None:
        """Stop in the middle of the last write: one file it touched cut anywhere in what it
        added, the files it created after that one never made."""
        self.before_a_write()
        self.journal.close()
        self.model.committed = len(self.model.frames) + 1
        touched = [(path, self.sizes_before_last_write.get(path, 0), size)
                   for path, size in self.file_sizes().items() if size != self.sizes_before_last_write.get(path)]
        if touched:
            index = which % len(touched)
            path, before, after = touched[index]
            os.truncate(path, before + int((after - before) * where))
            for later, _, _ in touched[index + 1:]:
                later.unlink()
        self.dead[self.name] = self.model
        self.begin_incarnation()
        self.reload()

    @rule()
    def reload(self) -> None:
        """What the next incarnation would load."""
        archives = load(self.root, exclude=self.name)
        assert set(archives) <= set(self.dead)
        for name, model in self.dead.items():
            model.check(archives.get(name))

    @invariant()
    def the_running_incarnation_is_on_disk(self) -> None:
        if hasattr(self, "model"):
            self.model.check(load(self.root, exclude="").get(self.name), live=True)

    def teardown(self) -> None:
        if hasattr(self, "journal"):
            self.journal.close()
        shutil.rmtree(self.root, ignore_errors=True)


def test_what_is_loaded_is_exactly_what_was_committed_whatever_the_crash(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # Syncs are what a crash of the machine needs; a simulated crash of the process does not
    # (and real ones make this test ten times slower). They are still called, in the same order.
    monkeypatch.setattr(os, "fdatasync", lambda fd: None)
    monkeypatch.setattr(journal_format, "fsync_directory", lambda path: None)
    monkeypatch.setattr(JournalMachine, "base", tmp_path)
    run_state_machine_as_test(JournalMachine, settings=settings(
        max_examples=examples(50), stateful_step_count=30, deadline=None,
        suppress_health_check=[HealthCheck.too_slow]))


def test_a_background_sync_moves_committed_pos_only_once_the_disk_has_it(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """commit_in_background (the exchange's fsync mode): the write is done at once, the fdatasync in
    a thread; committed_pos waits for it, and a failed sync is sticky."""
    import threading
    gate = threading.Event()
    synced = threading.Event()
    real_fdatasync = os.fdatasync

    def slow_fdatasync(fd: int) -> None:
        assert gate.wait(10), "the test never let the sync finish"
        real_fdatasync(fd)

    monkeypatch.setattr(os, "fdatasync", slow_fdatasync)
    journal = open_journal(tmp_path, "current", mode="fsync", segment_bytes=300)
    frames = make_frames(20)
    for frame in frames[:10]:
        journal.append(*frame)
    journal.commit_in_background(synced.set)
    assert journal.committed_pos == 1, "nothing is durable before the sync ends"
    for frame in frames[10:]:
        journal.append(*frame)
    journal.commit_in_background(synced.set)  # written now, synced by the next job
    assert journal.committed_pos == 1
    gate.set()
    assert synced.wait(10)
    synced.clear()
    journal.commit_in_background(synced.set)  # sees the first job done, starts the second
    assert journal.committed_pos == 11
    assert synced.wait(10)
    journal.commit_in_background(synced.set)
    assert journal.committed_pos == 21
    journal.close()
    assert [tuple(f) for f in load(tmp_path, exclude="")["current"].frames] == [tuple(f) for f in frames]

    def failing_fdatasync(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", failing_fdatasync)
    failed = open_journal(tmp_path, "failing", mode="fsync")
    failed.append(*frames[0])
    synced.clear()
    failed.commit_in_background(synced.set)
    assert synced.wait(10)
    with pytest.raises(OSError):
        failed.commit_in_background(synced.set)
    assert failed.committed_pos == 1
    with pytest.raises(OSError):
        failed.commit_in_background(synced.set)  # sticky


# -- a real full disk (tmpfs) ---------------------------------------------------------------------

def fill_until_refused(journal: Journal, frames: list[ArchivedFrame], synced: threading.Event) -> int:
    """Append and commit frames until the disk refuses one; returns how many were appended."""
    for count, frame in enumerate(frames, 1):
        journal.append(*frame)
        if not journal.try_commit(synced.set):
            return count
        wait_synced(journal, frame.pos + 1, synced)
    raise AssertionError("the disk never filled up")


def wait_synced(journal: Journal, pos: int, synced: threading.Event) -> None:
    """Commit until committed_pos reaches `pos` (each background sync sets `synced`)."""
    deadline = time.monotonic() + 10
    while journal.committed_pos < pos:
        assert time.monotonic() < deadline, f"committed_pos stuck at {journal.committed_pos}, wanted {pos}"
        synced.wait(0.5)
        synced.clear()
        journal.try_commit(synced.set)


def test_a_full_disk_holds_the_journal_and_it_resumes_by_itself_when_space_frees(small_disk) -> None:
    disk = small_disk("journal", 1 << 20)
    ballast = disk / "ballast"
    ballast.write_bytes(b"\0" * (256 << 10))
    journal = Journal(disk / "journal" / "q" / "x1", "x1.a", "fsync", 64 << 10, FOREVER, UNBOUNDED)
    synced = threading.Event()
    frames = make_frames(400, body_size=4000)  # 1.6 MB: more than the disk holds
    appended = fill_until_refused(journal, frames, synced)  # no exception, whatever the disk says
    assert journal.error is not None and journal.error.errno == errno.ENOSPC
    assert not journal.broken and journal.pending_bytes > 0
    held = journal.committed_pos
    assert held == appended, "nothing refused counts as committed"
    now = time.monotonic()
    assert not journal.try_commit(synced.set, now=now + journal_module.STORAGE_RETRY / 2), "a retry waits"
    assert journal.try_commit(synced.set, now=now + journal_module.STORAGE_RETRY) is False  # still full
    assert journal.errors >= 2 and journal.committed_pos == held
    ballast.unlink()  # space frees: the next attempt writes what waited, and more
    wait_synced(journal, appended + 1, synced)
    assert journal.error is None and journal.failing_since is None
    for frame in frames[appended:appended + 20]:
        journal.append(*frame)
    wait_synced(journal, appended + 21, synced)
    journal.close()
    assert load(disk / "journal" / "q" / "x1")["x1.a"].frames == frames[:appended + 20]


def test_a_disk_full_from_the_start_is_a_failure_like_any_other_and_heals(small_disk) -> None:
    """No inode left: the journal's directories cannot be made. Nothing raises; once some inodes
    free, the chain of directories is made as far as they go, and finished on a later attempt."""
    disk = small_disk("journal", 1 << 20, inodes=6)  # the root, then journal/q/x1/x1.a and a segment
    ballast = [disk / f"b{i}" for i in range(5)]
    for path in ballast:
        path.write_bytes(b"")
    journal = Journal(disk / "journal" / "q" / "x1", "x1.a", "fsync", 64 << 10, FOREVER, UNBOUNDED)
    synced = threading.Event()
    frames = make_frames(3)
    for frame in frames:
        journal.append(*frame)
    now = time.monotonic()
    assert not journal.try_commit(synced.set, now=now)
    assert journal.error is not None and journal.error.errno == errno.ENOSPC and not journal.broken
    for path in ballast[:2]:
        path.unlink()
    assert not journal.try_commit(synced.set, now=now + journal_module.STORAGE_RETRY)  # two levels made
    assert (disk / "journal" / "q").is_dir() and not (disk / "journal" / "q" / "x1").exists()
    for path in ballast[2:]:
        path.unlink()
    wait_synced(journal, 4, synced)
    journal.close()
    assert load(disk / "journal" / "q" / "x1")["x1.a"].frames == frames
    assert stat.S_IMODE((disk / "journal" / "q").stat().st_mode) == 0o700


def test_trim_and_close_on_a_disk_that_refuses_log_and_never_raise(small_disk, caplog) -> None:
    disk = small_disk("journal", 1 << 20)
    journal = Journal(disk, "x1.a", "fsync", 64 << 10, FOREVER, UNBOUNDED)
    synced = threading.Event()
    frames = make_frames(400, body_size=4000)
    for frame in frames[:40]:
        journal.append(*frame)
    wait_synced(journal, 41, synced)
    first = segments(disk, "x1.a")[0]
    first.rename(disk / "moved.seg")
    first.mkdir()  # a directory where the segment was: deleting it fails (EISDIR)
    (first / "keep").write_bytes(b"")
    with caplog.at_level(logging.WARNING):
        journal.trim(30)  # the first segment cannot be deleted: logged
        appended = 40 + fill_until_refused(journal, frames[40:], synced)
        assert journal.error is not None and journal.error.errno == errno.ENOSPC
        journal.close()  # the disk refuses what is left: logged, not raised
    assert "could not delete" in caplog.text and "not written" in caplog.text
    assert journal.committed_pos == appended, "what waited was never counted as committed"
