"""Recovery past damage: one bad byte or a zeroed page loses only the frames it touches,
and every lost frame is counted (issue 20, item 2); a full disk at start-up is reported,
never fatal (item 3). The storage layer alone; the daemon end to end is in
``test_spool_daemon.py``.

The property tests write a real segment through :class:`Spool` (bursts of random client
messages), damage it, and recover it: the records that come back must be exactly the
frames whose bytes were not changed, in order, and the count of lost messages must be
exact unless the damage reaches the end of the segment and takes its last frame's header
(then it is a lower bound, at least one, and says so).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import random
import tempfile
import zlib
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pydory.daemon.books.accounting import Books
from pydory.daemon.books.commit_point import CommitPoint
from pydory.daemon.books.events import DiscardEvent, DiscardReason
from pydory.daemon.spool import corrupt as corrupt_module
from pydory.daemon.spool import segments
from pydory.daemon.spool.corrupt import CORRUPT_DIRECTORY, CorruptRegion
from pydory.daemon.spool.errors import SpoolError
from pydory.daemon.spool.records import (
    FRAME_HEADER_BYTES,
    HEADER_BYTES,
    HEADER_BYTES_V2,
    MAGIC,
    MIN_BODY_BYTES,
    SpoolRecord,
)
from pydory.daemon.spool.recovery import RecoveryReport
from pydory.daemon.spool.segments import LOCK_FILE, Spool
from pydory.daemon.spool.write_ahead import (
    delete_replayed_segments_when_settled,
    replay_spool,
)

MiB = 1024 * 1024
PAGE = 4096
PAYLOAD_BODY_HEAD = bytes([2]) + bytes(18)  # flags "payload", no timestamp, topic or key


def make_spool(directory: Path, **overrides: object) -> Spool:
    options: dict[str, object] = {
        "segment_bytes": 64 * MiB,
        "max_bytes": 256 * MiB,
        "fsync_interval_ms": None,
    }
    options.update(overrides)
    return Spool(str(directory), **options)  # type: ignore[arg-type]


def write_payload_segment(directory: Path, bursts: Sequence[Sequence[bytes]]) -> Path:
    """One segment of client messages as a daemon writes them, left unsettled."""
    spool = make_spool(directory)
    with spool:
        for burst in bursts:
            segment_id = spool.append_payloads(burst)
    return directory / f"segment-{segment_id:020d}.spool"


def frame_spans(payloads: Sequence[bytes]) -> list[tuple[int, int]]:
    """Where each payload's frame lies in its segment file."""
    spans, offset = [], HEADER_BYTES
    for payload in payloads:
        end = offset + FRAME_HEADER_BYTES + MIN_BODY_BYTES + len(payload)
        spans.append((offset, end))
        offset = end
    return spans


def recover(directory: Path) -> tuple[list[SpoolRecord], RecoveryReport, list[CorruptRegion]]:
    regions: list[CorruptRegion] = []
    spool = make_spool(directory)
    with spool:
        recovered = list(spool.recover(regions.append))
    return recovered, spool.recovery_report, regions


def check_recovery(directory: Path, payloads: list[bytes], original: bytes, damaged: bytes) -> None:
    """The property: only the frames whose bytes changed are lost, every lost one is
    counted (exactly, unless the damage took the last frame), the damaged bytes are kept."""
    spans = frame_spans(payloads)
    assert spans[-1][1] == len(original)
    changed = [original[start:end] != damaged[start:end] for start, end in spans]
    recovered, report, regions = recover(directory)
    untouched = [p for p, c in zip(payloads, changed, strict=True) if not c]
    assert [r.value for r in recovered] == untouched
    assert all(r.is_payload for r in recovered)
    lost = sum(changed)
    counted = report.corrupt_messages
    assert counted == sum(region.messages for region in regions)
    assert report.repaired_segments == 0  # a damaged last frame is not a torn tail
    if not changed[-1]:
        assert counted == lost
        assert all(region.exact for region in regions)
    else:  # the damage reached the end: exact when the last header survived, else a bound
        assert 1 <= counted <= lost
        assert counted == lost or not regions[-1].exact
    for region in regions:  # the bytes recovery could not trust, kept for the operator
        assert region.saved_as is not None
        assert Path(region.saved_as).read_bytes() == damaged[region.start : region.end]
        assert Path(region.saved_as).parent == directory / CORRUPT_DIRECTORY


payload_bursts = st.lists(
    st.lists(st.binary(max_size=300), min_size=1, max_size=40), min_size=1, max_size=8
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(payload_bursts, st.data())
def test_property_one_flipped_byte_loses_at_most_its_frame_and_counts_it(
    bursts: list[list[bytes]], data: st.DataObject
) -> None:
    payloads = [p for burst in bursts for p in burst]
    with tempfile.TemporaryDirectory() as name:
        directory = Path(name)
        path = write_payload_segment(directory, bursts)
        original = path.read_bytes()
        damaged = bytearray(original)
        offset = data.draw(st.integers(0, len(original) - 1), label="offset")
        damaged[offset] ^= data.draw(st.integers(1, 255), label="xor")
        path.write_bytes(damaged)
        check_recovery(directory, payloads, original, bytes(damaged))
        # One byte touches at most one frame, and a single bad frame is always counted
        # exactly, the last one included.
        recovered, report, regions = recover(directory)  # again: same answer
        touched = offset >= HEADER_BYTES
        assert len(recovered) == len(payloads) - touched
        assert report.corrupt_messages == int(touched)
        assert all(region.exact for region in regions)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(payload_bursts, st.booleans(), st.data())
def test_property_a_zeroed_page_loses_only_the_frames_it_touches_and_counts_them(
    bursts: list[list[bytes]], aligned: bool, data: st.DataObject
) -> None:
    payloads = [p for burst in bursts for p in burst]
    with tempfile.TemporaryDirectory() as name:
        directory = Path(name)
        path = write_payload_segment(directory, bursts)
        original = path.read_bytes()
        if aligned:  # a page of the file, as a power cut leaves it
            offset = PAGE * data.draw(st.integers(0, (len(original) - 1) // PAGE), label="page")
        else:
            offset = data.draw(st.integers(0, len(original) - 1), label="offset")
        damaged = bytearray(original)
        damaged[offset : offset + PAGE] = bytes(len(damaged[offset : offset + PAGE]))
        path.write_bytes(damaged)
        check_recovery(directory, payloads, original, bytes(damaged))


def test_seeded_loop_zeroed_pages_and_flipped_bytes_in_larger_segments(tmp_path: Path) -> None:
    """Hypothesis favours small segments; these are up to ~100 pages, damaged anywhere."""
    rng = random.Random(20)
    for attempt in range(120):
        directory = tmp_path / str(attempt)
        payloads = [rng.randbytes(rng.randrange(0, 300)) for _ in range(rng.randrange(50, 1500))]
        bursts = [payloads[i : i + 64] for i in range(0, len(payloads), 64)]
        path = write_payload_segment(directory, bursts)
        original = path.read_bytes()
        damaged = bytearray(original)
        if attempt % 3:
            offset = PAGE * rng.randrange(0, (len(original) - 1) // PAGE + 1)
            damaged[offset : offset + PAGE] = bytes(len(damaged[offset : offset + PAGE]))
        else:
            damaged[rng.randrange(len(original))] ^= rng.randrange(1, 256)
        path.write_bytes(damaged)
        check_recovery(directory, payloads, original, bytes(damaged))


def test_a_byte_flipped_a_third_into_20000_messages_loses_one(tmp_path: Path) -> None:
    """The issue's case at the storage layer: before, 13,334 were cut as bytes."""
    payloads = [b"message-%06d" % n for n in range(20_000)]
    path = write_payload_segment(tmp_path, [payloads[i : i + 500] for i in range(0, 20_000, 500)])
    data = bytearray(path.read_bytes())
    data[len(data) // 3] ^= 0x10
    path.write_bytes(data)
    recovered, report, regions = recover(tmp_path)
    assert len(recovered) == 19_999
    assert (report.corrupt_messages, report.corrupt_regions, report.truncated_bytes) == (1, 1, 0)
    (region,) = regions
    assert region.exact
    assert region.start <= len(data) // 3 < region.end
    assert region.sample == bytes(data[region.start : region.end])
    lost = {p for p in payloads} - {r.value for r in recovered}
    assert len(lost) == 1
    assert lost.pop() in region.sample  # the damaged frame is the lost message


def test_a_torn_last_frame_is_cut_not_counted_and_a_whole_damaged_one_is_counted(
    tmp_path: Path,
) -> None:
    payloads = [b"p%d" % n * 20 for n in range(5)]
    for case in ("torn", "bad length", "bad crc"):
        directory = tmp_path / case.replace(" ", "-")
        path = write_payload_segment(directory, [payloads])
        data = bytearray(path.read_bytes())
        last = frame_spans(payloads)[-1][0]
        if case == "torn":  # a crash mid-write: the file ends inside the frame
            del data[-7:]
        elif case == "bad length":  # the length field claims more than the file has
            data[last + 8] ^= 0x01
        else:
            data[-1] ^= 0xFF
        path.write_bytes(data)
        recovered, report, _ = recover(directory)
        assert [r.value for r in recovered] == payloads[:-1], case
        if case == "torn":
            assert (report.corrupt_messages, report.repaired_segments) == (0, 1)
            assert report.truncated_bytes == len(data) - last
            assert path.stat().st_size == last
        else:
            assert (report.corrupt_messages, report.repaired_segments) == (1, 0), case
            assert "1 message(s) lost" in report.problems[0]


def test_damage_before_a_torn_tail_is_counted_and_the_tail_cut(tmp_path: Path) -> None:
    payloads = [b"q%d" % n * 30 for n in range(6)]
    path = write_payload_segment(tmp_path, [payloads])
    data = bytearray(path.read_bytes())
    spans = frame_spans(payloads)
    data[spans[2][0] + 20] ^= 0x04  # frame 2 damaged
    data[spans[3][0] + 20] ^= 0x04  # frame 3 too
    data[spans[4][0] + 20] ^= 0x04  # and 4
    del data[spans[5][0] + 30 :]  # frame 5 torn
    path.write_bytes(data)
    recovered, report, regions = recover(tmp_path)
    assert [r.value for r in recovered] == payloads[:2]
    assert [(r.start, r.end, r.messages, r.exact) for r in regions] == [
        (spans[2][0], spans[5][0], 3, True)
    ]
    assert (report.repaired_segments, report.truncated_bytes) == (1, 30)


def test_a_damaged_header_loses_nothing_and_a_zeroed_first_page_is_counted(
    tmp_path: Path,
) -> None:
    payloads = [b"h%04d" % n * 10 for n in range(200)]  # 69-byte frames: many per page
    for where in (0, 5, 9):  # magic, version, segment id
        directory = tmp_path / f"byte-{where}"
        path = write_payload_segment(directory, [payloads])
        data = bytearray(path.read_bytes())
        data[where] ^= 0x01  # version 2 becomes 3 ("newer"), yet the frames are version 2
        path.write_bytes(data)
        recovered, report, _ = recover(directory)
        assert [r.value for r in recovered] == payloads, where
        assert report.corrupt_messages == 0
    directory = tmp_path / "page-0"
    path = write_payload_segment(directory, [payloads])
    data = bytearray(path.read_bytes())
    data[:PAGE] = bytes(PAGE)
    path.write_bytes(data)
    recovered, report, regions = recover(directory)
    first_whole = next(n for n, (start, _) in enumerate(frame_spans(payloads)) if start >= PAGE)
    assert [r.value for r in recovered] == payloads[first_whole:]
    assert report.corrupt_messages == first_whole
    assert regions[0].exact
    assert "bad magic" in report.problems[0]


# --- version 1 segments (a pydory upgraded with a spool on disk) ------------------------------


def v1_segment(directory: Path, segment_id: int, payloads: Sequence[bytes]) -> Path:
    """A segment as pydory wrote it before version 2: no marker, no sequence."""
    frames = []
    for payload in payloads:
        body = PAYLOAD_BODY_HEAD + len(payload).to_bytes(4, "big") + payload
        frames.append(len(body).to_bytes(4, "big") + zlib.crc32(body).to_bytes(4, "big") + body)
    header = MAGIC + (1).to_bytes(2, "big") + bytes(2) + segment_id.to_bytes(8, "big")
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"segment-{segment_id:020d}.spool"
    path.write_bytes(header + b"".join(frames))
    return path


def test_a_version_1_segment_replays_and_is_resynchronised_past_a_bad_frame(
    tmp_path: Path,
) -> None:
    payloads = [b"old-%03d" % n * 4 for n in range(50)]
    path = v1_segment(tmp_path, 3, payloads)
    recovered, report, _ = recover(tmp_path)
    assert [r.value for r in recovered] == payloads
    assert report.problems == []
    path = v1_segment(tmp_path, 3, payloads)
    data = bytearray(path.read_bytes())
    frame = 8 + MIN_BODY_BYTES + len(payloads[0])
    data[HEADER_BYTES_V2 + 20 * frame + 30] ^= 0x80  # inside frame 20's value
    path.write_bytes(data)
    recovered, report, regions = recover(tmp_path)
    assert [r.value for r in recovered] == payloads[:20] + payloads[21:]
    assert [(r.messages, r.exact) for r in regions] == [(1, True)]
    path = v1_segment(tmp_path, 3, payloads)  # a crash mid-write, before the upgrade
    os.truncate(path, path.stat().st_size - 5)
    recovered, report, regions = recover(tmp_path)
    assert [r.value for r in recovered] == payloads[:-1]
    assert (report.repaired_segments, report.truncated_bytes, regions) == (1, frame - 5, [])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.binary(min_size=1, max_size=200), min_size=1, max_size=60), st.data())
def test_property_version_1_one_flipped_byte_loses_one_frame_counted_as_one(
    payloads: list[bytes], data: st.DataObject
) -> None:
    """Version 1 has no sequence: its count is of the frames it can still delimit. One
    damaged frame is always counted as one (flagged a lower bound when its length field
    was the damaged part)."""
    with tempfile.TemporaryDirectory() as name:
        directory = Path(name)
        path = v1_segment(directory, 1, payloads)
        original = path.read_bytes()
        damaged = bytearray(original)
        offset = data.draw(st.integers(HEADER_BYTES_V2, len(original) - 1), label="offset")
        damaged[offset] ^= data.draw(st.integers(1, 255), label="xor")
        path.write_bytes(damaged)
        spans, start = [], HEADER_BYTES_V2  # a version 1 header
        for payload in payloads:
            spans.append((start, start + 8 + MIN_BODY_BYTES + len(payload)))
            start = spans[-1][1]
        touched = next(n for n, (s, e) in enumerate(spans) if s <= offset < e)
        recovered, report, _ = recover(directory)
        assert [r.value for r in recovered] == payloads[:touched] + payloads[touched + 1 :]
        assert report.corrupt_messages == 1


# --- the sequence follows what is really on disk ----------------------------------------------


def test_a_segment_cut_back_to_its_header_numbers_from_0_again(tmp_path: Path) -> None:
    spool = make_spool(tmp_path)
    with spool:
        segment = spool.append_payloads([b"a", b"b"])
        spool.settle(segment, 2)  # the current segment: truncated back to its header
        spool.append_payloads([b"c"])
        spool.append_payloads([b"d", b"e"])
    recovered, report, _ = recover(tmp_path)
    assert [r.value for r in recovered] == [b"c", b"d", b"e"]
    assert (report.corrupt_messages, report.problems) == (0, [])


def test_a_failed_write_does_not_advance_the_sequence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spool = make_spool(tmp_path)
    spool.open()
    spool.append_payloads([b"first"])
    real_write = os.write

    def full_disk(fd: int, data: bytes) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", full_disk)
    if segments.write_payload_frames is not None:  # the compiled write-ahead's one call
        monkeypatch.setattr(segments, "write_payload_frames", lambda fd, *rest: full_disk(fd, b""))
    with pytest.raises(SpoolError):
        spool.append_payloads([b"lost", b"lost too"])
    monkeypatch.setattr(os, "write", real_write)
    monkeypatch.undo()
    spool.append_payloads([b"second"])
    spool.close()
    recovered, report, _ = recover(tmp_path)
    assert [r.value for r in recovered] == [b"first", b"second"]
    assert report.corrupt_messages == 0


def test_many_damaged_regions_are_all_counted_and_the_log_lines_capped(tmp_path: Path) -> None:
    payloads = [b"m%04d" % n * 8 for n in range(600)]
    path = write_payload_segment(tmp_path, [payloads])
    data = bytearray(path.read_bytes())
    spans = frame_spans(payloads)
    for n in range(0, 600, 4):  # 150 regions of one frame each
        data[spans[n][0] + 30] ^= 0x01
    path.write_bytes(data)
    recovered, report, regions = recover(tmp_path)
    assert len(recovered) == 450
    assert (report.corrupt_messages, report.corrupt_regions, len(regions)) == (150, 150, 150)
    assert (len(report.problems), report.problems_not_listed) == (100, 50)


# --- the copies in corrupt/ -------------------------------------------------------------------


def test_the_copies_are_bounded_oldest_first_and_a_large_region_keeps_its_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(corrupt_module, "CORRUPT_COPY_BYTES", 100)
    monkeypatch.setattr(corrupt_module, "CORRUPT_KEEP_BYTES", 250)
    payloads = [bytes([n]) * 150 for n in range(12)]
    path = write_payload_segment(tmp_path, [payloads])
    data = bytearray(path.read_bytes())
    spans = frame_spans(payloads)
    for n in (1, 4, 7, 10):  # four damaged regions, one frame each
        data[spans[n][0] + 40] ^= 0x01
    path.write_bytes(data)
    _, report, regions = recover(tmp_path)
    assert report.corrupt_messages == 4
    copies = sorted((tmp_path / CORRUPT_DIRECTORY).iterdir())
    # Each copy holds the first 100 bytes; 250 bytes keep two: the two newest.
    assert [p.name for p in copies] == [
        f"{path.name}.{spans[n][0]}-{spans[n][1]}.corrupt" for n in (7, 10)
    ]
    for copy, n in zip(copies, (7, 10), strict=True):
        assert copy.read_bytes() == bytes(data[spans[n][0] : spans[n][0] + 100])
    assert [r.saved_as is not None for r in regions] == [True] * 4  # each was written


def test_a_copy_the_disk_refuses_is_reported_and_the_messages_still_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    payloads = [b"x%d" % n * 9 for n in range(5)]
    path = write_payload_segment(tmp_path, [payloads])
    data = bytearray(path.read_bytes())
    data[frame_spans(payloads)[2][0] + 25] ^= 0x01
    path.write_bytes(data)
    real_open = os.open

    def full_disk(file: str, flags: int, mode: int = 0o777, **kwargs: object) -> int:
        if str(file).endswith(".corrupt"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_open(file, flags, mode)

    monkeypatch.setattr(os, "open", full_disk)
    recovered, report, regions = recover(tmp_path)
    assert len(recovered) == 4
    assert [(r.messages, r.saved_as) for r in regions] == [(1, None)]
    assert "not saved (No space left on device)" in report.problems[0]


# --- a full disk at start-up ------------------------------------------------------------------


def test_a_lock_pid_the_disk_refuses_is_logged_not_fatal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def full_disk(fd: int, data: bytes, offset: int) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "pwrite", full_disk)
    spool = make_spool(tmp_path)
    with caplog.at_level(logging.WARNING), spool:
        assert list(spool.recover()) == []
    assert "cannot write the pid" in caplog.text
    assert "No space left on device" in caplog.text
    assert (tmp_path / LOCK_FILE).read_bytes() == b""  # no stale pid either


def test_the_pid_goes_over_the_old_one_before_the_lock_is_cut(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Written first, then cut to length: an existing LOCK needs no new block."""
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / LOCK_FILE).write_bytes(b"4194304\n")
    calls: list[str] = []
    real_pwrite, real_ftruncate = os.pwrite, os.ftruncate

    def pwrite(fd: int, data: bytes, offset: int) -> int:
        calls.append("pwrite")
        return real_pwrite(fd, data, offset)

    def ftruncate(fd: int, length: int) -> None:
        calls.append(f"ftruncate {length}")
        real_ftruncate(fd, length)

    monkeypatch.setattr(os, "pwrite", pwrite)
    monkeypatch.setattr(os, "ftruncate", ftruncate)
    spool = make_spool(tmp_path)
    with spool:
        pid = f"{os.getpid()}\n".encode()
        assert calls == ["pwrite", f"ftruncate {len(pid)}"]
        assert (tmp_path / LOCK_FILE).read_bytes() == pid


def test_repairs_and_reads_the_disk_refuses_are_reported_not_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    torn = write_payload_segment(tmp_path / "a", [[b"one", b"two"]])
    os.truncate(torn, torn.stat().st_size - 3)
    real_ftruncate = os.ftruncate

    def refuse(fd: int, length: int) -> None:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(os, "ftruncate", refuse)
    recovered, report, _ = recover(tmp_path / "a")
    assert [r.value for r in recovered] == [b"one"]
    assert "cannot cut it: Read-only file system" in report.problems[0]
    monkeypatch.setattr(os, "ftruncate", real_ftruncate)

    unreadable = write_payload_segment(tmp_path / "b", [[b"kept"]])
    real_pread = os.pread

    def failing_disk(fd: int, count: int, offset: int) -> bytes:
        if offset >= HEADER_BYTES:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real_pread(fd, count, offset)

    monkeypatch.setattr(os, "pread", failing_disk)
    spool = make_spool(tmp_path / "b")
    with spool:
        assert list(spool.recover()) == []
        spool.finish_recovery()
        report = spool.recovery_report
    assert report.unreadable_segments == 1
    assert "cannot read it: Input/output error: left in place" in report.problems[0]
    assert unreadable.exists()  # for the next start


# --- replay: the books, and the old segments while the disk is full ---------------------------


class FakeIntake:
    """Admits a replayed burst as the write-ahead does: spooled first, if the spool can."""

    hold_when_memory_short = False

    def __init__(self, spool: Spool) -> None:
        self.spool = spool
        self.replayed_messages: list[bytes] = []

    def replayed(
        self, burst: Sequence[bytes], origins: Sequence[bytes | None] | None = None
    ) -> None:
        with contextlib.suppress(SpoolError):  # unprotected, as WriteAhead.begin_burst has it
            self.spool.append_payloads(burst, origins)
        self.replayed_messages += burst


class Sink:
    def __init__(self) -> None:
        self.events: list[DiscardEvent] = []

    def discarded(self, event: DiscardEvent) -> None:
        self.events.append(event)

    def possible_duplicate(self, topic: str, client_timestamp_ms: int) -> None:
        pass


async def no_wait() -> None:
    pass


def test_replay_counts_each_lost_message_as_spool_corrupt(tmp_path: Path) -> None:
    payloads = [b"r%d" % n * 12 for n in range(30)]
    path = write_payload_segment(tmp_path, [payloads])
    data = bytearray(path.read_bytes())
    spans = frame_spans(payloads)
    data[spans[10][0] : spans[13][0] + 5] = bytes(spans[13][0] + 5 - spans[10][0])
    path.write_bytes(data)
    sink = Sink()
    books = Books(0, 256, discard_sink=sink)
    spool = make_spool(tmp_path)
    with spool:
        intake = FakeIntake(spool)
        replay = asyncio.run(replay_spool(spool, intake, no_wait, books))
    assert intake.replayed_messages == payloads[:10] + payloads[14:]
    assert replay.unprotected == 0
    assert not path.exists()  # replayed into this run's segment: the old one is gone
    assert books.lifetime_discards_by_reason()[DiscardReason.SPOOL_CORRUPT] == 4
    assert books.counters.get("discarded_spool_corrupt") == 4
    assert books.per_topic() == {}  # no topic: its bytes cannot be trusted
    report = books.discard_report().unfinished
    assert report.discards_by_reason[DiscardReason.SPOOL_CORRUPT] == 4
    assert len(sink.events) == 4
    event = sink.events[0]
    assert (event.reason, event.topic, event.client_timestamp_ms) == (
        DiscardReason.SPOOL_CORRUPT,
        None,
        None,
    )
    assert event.message == bytes(data[spans[10][0] : spans[14][0]])
    assert f"{path.name} bytes [{spans[10][0]}, {spans[14][0]})" in event.detail
    assert f"{CORRUPT_DIRECTORY}/{path.name}." in event.detail


async def waiting(commit_point: CommitPoint) -> None:
    """Until the deleter waits on the commit point (it only ever waits there)."""
    while not commit_point.waiters:
        await asyncio.sleep(0)  # one loop turn: lets the deleter run up to its wait


def test_replayed_messages_the_full_spool_refuses_keep_the_old_segments_until_settled(
    tmp_path: Path,
) -> None:
    """Their only copy is the old segment: deleted only once they have all settled."""
    payloads = [b"u%d" % n * 50 for n in range(40)]
    old = write_payload_segment(tmp_path, [payloads])
    spool = make_spool(tmp_path, max_bytes=HEADER_BYTES + 1)  # refuses every burst
    books = Books(0, 256)

    async def run() -> None:
        commit_point = CommitPoint()
        token = commit_point.open(len(payloads))  # the replayed messages, accepted
        with spool:
            replay = await replay_spool(spool, FakeIntake(spool), no_wait, books)
            assert (replay.unprotected, replay.old_segments_kept) == (40, True)
            assert old.exists()
            ended = commit_point.wall_now()
            deleting = asyncio.ensure_future(
                delete_replayed_segments_when_settled(spool, commit_point, ended)
            )
            await asyncio.wait_for(waiting(commit_point), 60)
            assert old.exists()  # still unsettled
            commit_point.close(token, len(payloads))
            await asyncio.wait_for(deleting, 60)
            assert not old.exists()

    asyncio.run(run())


def test_a_stop_before_they_settle_leaves_the_old_segments_for_the_next_start(
    tmp_path: Path,
) -> None:
    old = write_payload_segment(tmp_path, [[b"w" * 40] * 5])
    spool = make_spool(tmp_path, max_bytes=HEADER_BYTES + 1)

    async def run() -> None:
        commit_point = CommitPoint()
        commit_point.open(5)
        with spool:
            await replay_spool(spool, FakeIntake(spool), no_wait, Books(0, 256))
            deleting = asyncio.ensure_future(
                delete_replayed_segments_when_settled(spool, commit_point, commit_point.wall_now())
            )
            await asyncio.wait_for(waiting(commit_point), 60)
            commit_point.release_waiters()  # shutdown
            await asyncio.wait_for(deleting, 60)
        assert old.exists()

    asyncio.run(run())
    recovered, _, _ = recover(tmp_path)
    assert len(recovered) == 5  # replayed again next time
