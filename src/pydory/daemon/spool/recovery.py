"""Recovery: the segments a previous run left are read back, damage is found past and
counted, and the segments are deleted once replayed.

A segment is normally a run of good frames followed at worst by one torn frame (a crash
mid-write): the torn tail is cut (never counted: those bytes were never admitted). A
damaged frame (a flipped bit, a page zeroed by a power cut) is *not* the end of the
segment: recovery resynchronises on the next good frame (its sync marker, its CRC, a
plausible sequence: :mod:`pydory.daemon.spool.records`) and replays everything after it.
Each damaged region becomes a :class:`CorruptRegion`: how many messages it held (exactly,
from the sequence numbers, whenever a good frame or a readable header follows the damage),
and a copy of its bytes in ``corrupt/`` beside the segments for the operator.

Frames the segment's acknowledgement mark says were settled are not replayed (counted in
``acknowledged``: :mod:`pydory.daemon.spool.acks`); every other frame comes with the
identity it was first given (:mod:`pydory.daemon.spool.identity`), so its replay is
named as its first send was.

Nothing here raises for damage or for a disk that refuses a write (a full disk must not
stop a start): a repair or a copy that fails is reported in the :class:`RecoveryReport`,
a segment that cannot be read is left in place for the next start. The :class:`Spool
<pydory.daemon.spool.segments.Spool>` drives it: ``recover()``, ``recovery_report`` and
``finish_recovery()`` delegate here.

Rule: :class:`SegmentRecovery` is the only code that reads, repairs or removes the segment
files found at ``open()``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field

from pydory.daemon.spool.acks import AckedFrames, ack_size_limit, read_ack_mark
from pydory.daemon.spool.corrupt import (
    CORRUPT_COPY_BYTES,
    CORRUPT_DIRECTORY,
    CorruptCopies,
    CorruptRegion,
)
from pydory.daemon.spool.errors import SpoolError
from pydory.daemon.spool.identity import pack_origin
from pydory.daemon.spool.records import (
    FORMAT_VERSION,
    HEADER_BYTES,
    HEADER_BYTES_V2,
    MIN_FRAME_BYTES,
    SYNC_MARKER,
    FrameCheck,
    FrameDecoder,
    SpoolRecord,
    check_frame,
    find_frame_start,
    frame_header_bytes,
    header_bytes,
    header_identity,
    header_problem,
    header_segment_id,
    header_version,
    min_frame_bytes,
    search_overlap,
    whole_frame_with_a_bad_length,
)
from pydory.daemon.spool.tallies import handed_over_topic

#: A record read back, with the identity it was first given (packed; None: unknown).
RecoveredRecord = tuple[SpoolRecord, "bytes | None"]

RECOVERY_CHUNK_BYTES = 1024 * 1024
"""Recovery reads a segment this much at a time (more only for a single larger frame)."""
CORRUPT_SAMPLE_BYTES = 4096
"""The first bytes of a damaged region handed on with it (the discard log's ``msg``)."""
MAX_PROBLEM_LINES = 100
"""Problem lines kept in a report (one per damaged region or file); then a count."""
_WHOLE_FRAME_CHECK_BYTES = 4 * RECOVERY_CHUNK_BYTES  # a last frame read whole to check it


@dataclass
class RecoveryReport:
    """What ``Spool.recover()`` found. Damage is counted and repaired, never raised.

    ``segments``: segment files read; ``records``: records recovered from them;
    ``repaired_segments``: segments whose torn tail was cut; ``removed_segments``: files
    removed (empty, cut inside the header, or with no readable frame); ``truncated_bytes``:
    bytes cut or removed; ``corrupt_messages``: messages lost to damage (each region's
    count, see :class:`CorruptRegion`), in ``corrupt_regions`` regions of
    ``corrupt_bytes``; ``unreadable_segments``: segments left in place after a read
    error; ``problems``: one line per damaged file or region (the first
    ``MAX_PROBLEM_LINES``, then how many more).
    """

    segments: int = 0
    records: int = 0
    repaired_segments: int = 0
    truncated_bytes: int = 0
    problems: list[str] = field(default_factory=list)
    removed_segments: int = 0
    corrupt_messages: int = 0
    corrupt_regions: int = 0
    corrupt_bytes: int = 0
    unreadable_segments: int = 0
    problems_not_listed: int = 0
    acknowledged: int = 0
    """Frames not replayed: their segment's acknowledgement mark says they settled."""
    settled: dict[tuple[int, int, int], AckedFrames] = field(default_factory=dict)
    """Per segment read, by ``(writer's incarnation, segment id, stream)``: its mark."""
    handed_over: dict[int, dict[str, int]] = field(default_factory=dict)
    """Per writer's incarnation, per topic: the frames replayed (not marked settled)."""

    def note(self, line: str) -> None:
        """Add a problem line, or count it once the list is full."""
        if len(self.problems) < MAX_PROBLEM_LINES:
            self.problems.append(line)
        else:
            self.problems_not_listed += 1


OnCorrupt = Callable[[CorruptRegion], None]


class SegmentRecovery:
    """The segments present at ``open()``, until each is read back and then deleted.

    ``error`` turns a failed disk call into the Spool's SpoolError (counting it);
    ``make_durable`` fsyncs a repaired segment as the Spool's fsync policy says.
    """

    def __init__(
        self,
        directory: str,
        error: Callable[[str, OSError], SpoolError],
        make_durable: Callable[[int], None],
    ) -> None:
        self._error = error
        self._make_durable = make_durable
        self.found: list[tuple[int, str]] = []  # segments present at open(), oldest first
        self._recovered: list[tuple[int, str]] = []  # fully read by records(): to delete
        self.bytes_on_disk = 0  # bytes of the files in found and _recovered
        self.report = RecoveryReport()
        self._copies = CorruptCopies(os.path.join(directory, CORRUPT_DIRECTORY))

    @property
    def segments(self) -> int:
        """Segment files awaiting replay: found and not yet deleted."""
        return len(self.found) + len(self._recovered)

    def records(self, on_corrupt: OnCorrupt | None = None) -> Iterator[RecoveredRecord]:
        """Every record of the found segments, oldest segment first (``Spool.recover()``);
        ``on_corrupt`` hears of each damaged region as it is found."""
        while self.found:
            segment_id, path = self.found[0]
            yield from self._segment_records(segment_id, path, on_corrupt)
            self.found.pop(0)

    def _segment_records(
        self, segment_id: int, path: str, on_corrupt: OnCorrupt | None
    ) -> Iterator[RecoveredRecord]:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            return
        except OSError as exc:
            self._left_unread(path, str(self._error("cannot open it", exc)))
            return
        try:
            read = _SegmentRead(fd, path, segment_id, self, on_corrupt)
            keep_for_replay = yield from read.run()
        except OSError as exc:  # a read failed: what was read is replayed, the file stays
            self._left_unread(path, str(self._error("cannot read it", exc)))
            return
        finally:
            os.close(fd)
        if keep_for_replay:
            self._recovered.append((segment_id, path))

    def _left_unread(self, path: str, why: str) -> None:
        self.report.unreadable_segments += 1
        self.report.note(f"{os.path.basename(path)}: {why}: left in place for the next start")
        with contextlib.suppress(OSError):
            self.bytes_on_disk -= os.stat(path).st_size  # no longer this run's to delete

    def delete_recovered(self) -> None:
        """Delete the segments ``records()`` read to the end (``Spool.finish_recovery()``).
        One the disk refuses to delete stays (replayed again at the next start: its
        messages are counted as possible duplicates then) and is reported."""
        while self._recovered:
            path = self._recovered.pop(0)[1]
            try:
                size = os.stat(path).st_size
                os.unlink(path)
            except FileNotFoundError:
                continue
            except OSError as exc:
                error = self._error(f"cannot delete recovered segment [{path}]", exc)
                self.report.note(str(error))
                continue
            self.bytes_on_disk -= size
            _remove_mark(path)

    # -- what a segment read reports -------------------------------------------------------

    def corrupt(
        self,
        fd: int,
        name: str,
        span: tuple[int, int],
        counted: tuple[int, bool],
        reason: str,
        on_corrupt: OnCorrupt | None,
    ) -> None:
        """A damaged region ``span`` of segment ``name``, holding ``counted`` = (messages,
        exact): counted, copied to ``corrupt/``, reported."""
        start, end = span
        messages, exact = counted
        report = self.report
        report.corrupt_regions += 1
        report.corrupt_messages += messages
        report.corrupt_bytes += end - start
        copy = read_exactly(fd, min(end - start, CORRUPT_COPY_BYTES), start)
        saved_as, not_saved = self._copies.save(name, start, end, copy)
        kept = (
            f"saved as {CORRUPT_DIRECTORY}/{saved_as}"
            if saved_as is not None
            else f"not saved ({not_saved})"
        )
        lost = f"{messages}" if exact else f"at least {messages}"
        report.note(f"{name}: {reason}: {lost} message(s) lost in bytes [{start}, {end}); {kept}")
        if on_corrupt is not None and messages:
            sample = copy[:CORRUPT_SAMPLE_BYTES]
            path = None if saved_as is None else os.path.join(self._copies.directory, saved_as)
            on_corrupt(CorruptRegion(name, start, end, messages, exact, path, sample))

    def cut_torn_tail(self, fd: int, name: str, at: int, size: int, reason: str) -> None:
        """Cut a torn tail (a crash mid-write: never admitted, so never counted). A disk
        that refuses the cut is reported; the segment is deleted after the replay anyway."""
        report = self.report
        try:
            os.ftruncate(fd, at)
            self._make_durable(fd)
        except OSError as exc:
            error = self._error("cannot cut it", exc)
            report.note(f"{name}: {reason}: {error}")
            return
        report.repaired_segments += 1
        report.truncated_bytes += size - at
        report.note(f"{name}: {reason}: truncated to {at} bytes ({size - at} cut)")
        self.bytes_on_disk -= size - at

    def remove(self, fd: int, path: str, size: int, reason: str) -> None:
        """Remove a file that holds no readable frame (counted: ``removed_segments``)."""
        name = os.path.basename(path)
        try:
            os.unlink(path)
        except OSError as exc:
            error = self._error("cannot remove it", exc)
            self.report.note(f"{name}: {reason}: {error}")
            return
        _remove_mark(path)
        self.report.removed_segments += 1
        self.report.truncated_bytes += size
        self.report.note(f"{name}: {reason}: removed")
        self.bytes_on_disk -= size


class _SegmentRead:
    """One segment read from its header to its end, resynchronising past damage."""

    def __init__(
        self,
        fd: int,
        path: str,
        segment_id: int,
        recovery: SegmentRecovery,
        on_corrupt: OnCorrupt | None,
    ) -> None:
        self.fd = fd
        self.path = path
        self.segment_id = segment_id
        self.name = os.path.basename(path)
        self.recovery = recovery
        self.report = recovery.report
        self.on_corrupt = on_corrupt
        self.window = _Window(fd, os.fstat(fd).st_size)
        self.version = FORMAT_VERSION
        self.topics: dict[bytes, str] = {}
        self.identity: tuple[int, int] | None = None  # (incarnation, stream) of its header

    def run(self) -> Generator[RecoveredRecord, None, bool]:
        """Yield the segment's records; return whether it stays pending deletion (False:
        removed here, or left in place for a newer pydory)."""
        size = self.window.size
        header = read_exactly(self.fd, HEADER_BYTES, 0)
        problem = header_problem(header)
        if problem is not None and problem.cut:  # its creation was cut: no frame in it
            self.recovery.remove(self.fd, self.path, size, problem.reason)
            return False
        marker = len(SYNC_MARKER)
        first_is_v3 = read_exactly(self.fd, marker, HEADER_BYTES) == SYNC_MARKER
        first_is_v2 = read_exactly(self.fd, marker, HEADER_BYTES_V2) == SYNC_MARKER
        if problem is None:
            # A marker right after the header outweighs a damaged version field.
            marked = 3 if first_is_v3 else 2 if first_is_v2 else None
            self.version = marked or header_version(header)
            self.identity = header_identity(header) if self.version >= 3 else None
            header_id = header_segment_id(header)
            if header_id != self.segment_id:  # renamed by hand, most likely: frames still good
                self.report.note(f"{self.name}: its header names segment {header_id}")
        else:
            version = 3 if first_is_v3 else 2 if first_is_v2 else self._sniff()
            if version is None and problem.newer:  # leave it for a newer pydory
                self.report.note(f"{self.name}: {problem.reason}: left in place")
                self.recovery.bytes_on_disk -= size
                return False
            if version is None:  # a segment whose every frame is gone, or not ours at all
                if size >= HEADER_BYTES + MIN_FRAME_BYTES:
                    self.recovery.corrupt(
                        self.fd, self.name, (0, size), (1, False), problem.reason, self.on_corrupt
                    )
                self.recovery.remove(self.fd, self.path, size, f"{problem.reason}, no frame")
                return False
            self.version = version
            self.report.note(f"{self.name}: {problem.reason}; frames read as version {version}")
        self.report.segments += 1
        yield from self._unsettled_frames()
        return True

    def _unsettled_frames(self) -> Iterator[RecoveredRecord]:
        """The frames its mark does not say settled, each with its identity."""
        size_limit = ack_size_limit(self.window.size // MIN_FRAME_BYTES)
        acked, problem = read_ack_mark(self.path, self.segment_id, self.identity, size_limit)
        if problem is not None:
            self.report.note(problem)
        identity, report = self.identity, self.report
        writer = identity[0] if identity is not None else 0  # 0: an older, unnamed run
        if identity is not None:
            report.settled[(writer, self.segment_id, identity[1])] = acked
        handed_over = report.handed_over.setdefault(writer, {})
        for sequence, record in self._frames():
            if sequence is not None and acked.starts and acked.covers(sequence):
                report.acknowledged += 1
                continue
            topic = handed_over_topic(record.value) if record.is_payload else record.topic
            if topic is not None:
                handed_over[topic] = handed_over.get(topic, 0) + 1
            if record.is_payload and record.key:  # replayed before: its first identity
                yield record, record.key
            elif identity is None or sequence is None:
                yield record, None
            else:
                yield record, pack_origin(identity[0], identity[1], sequence)

    def _sniff(self) -> int | None:
        """The format of a segment whose header is damaged: 2 if a good version 2 frame is
        anywhere in it, 1 if a good version 1 frame follows the header, else None."""
        self.version = 2
        scan = HEADER_BYTES_V2
        while (candidate := self._find_candidate(scan)) is not None:
            if self._check_at(candidate).record is not None:
                return 2
            scan = candidate + 1
        self.version = 1
        if self._check_at(HEADER_BYTES_V2).record is not None:
            return 1
        return None

    # -- the frames ----------------------------------------------------------------------

    def _frames(self) -> Iterator[tuple[int | None, SpoolRecord]]:
        """Every good frame, with its sequence (None in version 1)."""
        window, report = self.window, self.report
        position = header_bytes(self.version)
        expected: int | None = 0 if self.version != 1 else None
        wanted = RECOVERY_CHUNK_BYTES
        while position < window.size:
            window.cover(position, wanted)
            decoder = FrameDecoder(
                window.data,
                position - window.start,
                version=self.version,
                sequence=expected,
                topics=self.topics,
                base=window.start,
            )
            for record in decoder.records():
                report.records += 1
                yield (None if decoder.sequence is None else decoder.sequence - 1), record
            position, expected = window.start + decoder.offset, decoder.sequence
            wanted = RECOVERY_CHUNK_BYTES
            if decoder.problem is None:
                if not decoder.needed:
                    continue  # this window is read: on to the next
                if position + decoder.needed <= window.size:
                    # A frame beyond this window: read on, it whole however large.
                    wanted = max(RECOVERY_CHUNK_BYTES, decoder.needed)
                    continue
            resynchronised = self._resynchronise(position, expected, decoder.problem)
            if resynchronised is None:
                return
            position, expected = resynchronised

    def _resynchronise(
        self, damaged_at: int, expected: int | None, problem: str | None
    ) -> tuple[int, int | None] | None:
        """The frame due at ``damaged_at`` is bad or torn: find the next good frame, count
        the messages lost in between, and return where reading goes on (None: the damage
        reaches the end of the segment, which is then dealt with too)."""
        version, window = self.version, self.window
        reason = problem or f"the frame at offset {damaged_at} runs past the end of the file"
        due = self._check_at(damaged_at, whole=False)  # known bad: its header will do
        # The last frame header seen in the damage that reads as a plausible frame of this
        # segment: (offset, check). The one at ``damaged_at`` is frame ``expected`` by
        # construction (the first after a good frame or the header), so its header counts
        # if it shows it is one (its marker or its sequence), whatever sequence it names.
        last: tuple[int, FrameCheck] | None = None
        if due.end >= 0 and (due.sequence == expected or due.marked):
            last = (damaged_at, due._replace(sequence=expected))
        chain_end, chain_frames, headers_seen = due.end, 1, 1  # version 1's count
        scan = damaged_at + 1
        while (candidate := self._find_candidate(scan)) is not None:
            check = self._check_at(candidate, whole=False)
            plausible = self._plausible(expected, damaged_at, candidate, check)
            if plausible:  # worth reading whole (a chance marker in a message is not)
                check = self._check_at(candidate)
            if check.record is not None and plausible:
                if version == 1:
                    counted = (
                        (chain_frames, True) if chain_end == candidate else (headers_seen, False)
                    )
                else:
                    counted = ((check.sequence or 0) - (expected or 0), True)
                self.recovery.corrupt(
                    self.fd, self.name, (damaged_at, candidate), counted, reason, self.on_corrupt
                )
                return candidate, check.sequence
            if check.end >= 0 and plausible:
                last = (candidate, check)
                headers_seen += 1
                if candidate == chain_end:
                    chain_end, chain_frames = check.end, chain_frames + 1
            scan = candidate + 1
        # No good frame follows: the damage reaches the end of the segment.
        size = window.size
        if last is not None and last[1].end > size and not self._whole_to_the_end(last[0]):
            torn_at = last[0]  # the file ends inside this frame: a torn tail from here
            if torn_at > damaged_at:
                if version == 1:
                    on_chain = chain_end == last[1].end
                    counted = (chain_frames - 1, True) if on_chain else (headers_seen - 1, False)
                else:
                    counted = ((last[1].sequence or 0) - (expected or 0), True)
                self.recovery.corrupt(
                    self.fd, self.name, (damaged_at, torn_at), counted, reason, self.on_corrupt
                )
            needs = last[1].end - torn_at
            torn = f"torn frame at offset {torn_at}: needs {needs} bytes, {size - torn_at} left"
            self.recovery.cut_torn_tail(self.fd, self.name, torn_at, size, torn)
            return None
        if last is None and size - damaged_at < min_frame_bytes(version):
            torn = f"torn frame at offset {damaged_at}: {size - damaged_at} bytes left"
            self.recovery.cut_torn_tail(self.fd, self.name, damaged_at, size, torn)
            return None
        if last is None:  # exactly one if those bytes are one frame with a bad length field
            counted = (1, self._whole_to_the_end(damaged_at))
        elif version == 1:
            counted = (chain_frames, True) if chain_end == size else (headers_seen, False)
        else:
            offset, check = last
            exact = check.end == size or self._whole_to_the_end(offset)
            counted = ((check.sequence or 0) - (expected or 0) + 1, exact)
        self.recovery.corrupt(
            self.fd, self.name, (damaged_at, size), counted, reason, self.on_corrupt
        )
        return None

    def _plausible(
        self, expected: int | None, damaged_at: int, offset: int, check: FrameCheck
    ) -> bool:
        """Whether a frame header found at ``offset`` can be one of this segment's frames
        after the damage at ``damaged_at``: in version 2 its sequence is at least the one
        due and no more frames ahead than the damaged bytes could hold (a forged frame
        inside a message, or a chance CRC match, cannot inflate the count)."""
        if self.version == 1 or expected is None:
            return True
        if check.sequence is None:
            return False
        gap = check.sequence - expected
        return 0 <= gap <= (offset - damaged_at) // MIN_FRAME_BYTES

    def _whole_to_the_end(self, offset: int) -> bool:
        """Whether the bytes from ``offset`` to the end are one whole frame with a damaged
        length field (checked only for a frame of reasonable size)."""
        size = self.window.size
        if size - offset > _WHOLE_FRAME_CHECK_BYTES:
            return False
        self.window.cover(offset, size - offset)
        data = self.window.data[offset - self.window.start : size - self.window.start]
        return whole_frame_with_a_bad_length(data, 0, self.version)

    def _find_candidate(self, scan: int) -> int | None:
        """The next offset >= ``scan`` where a frame may start, None at the end."""
        window, version = self.window, self.version
        while True:
            window.cover(scan, RECOVERY_CHUNK_BYTES)
            found = find_frame_start(window.data, scan - window.start, version)
            if found >= 0:
                return window.start + found
            if window.end >= window.size:
                return None
            scan = max(scan + 1, window.end - search_overlap(version))

    def _check_at(self, offset: int, *, whole: bool = True) -> FrameCheck:
        """:func:`check_frame` at a file offset, the frame read whole if it is in the
        file (unless ``whole`` is False: its header only); ``end`` as a file offset."""
        window, version = self.window, self.version
        window.cover(offset, frame_header_bytes(version))
        check = check_frame(window.data, offset - window.start, version, self.topics)
        if check.end < 0:
            return check
        end = window.start + check.end
        if whole and window.end < end <= window.size:
            window.cover(offset, end - offset)
            check = check_frame(window.data, offset - window.start, version, self.topics)
        return check._replace(end=window.start + check.end)


class _Window:
    """Part of a segment file in memory: ``data`` holds the bytes from ``start``."""

    def __init__(self, fd: int, size: int) -> None:
        self.fd = fd
        self.size = size
        self.start = 0
        self.data = b""

    @property
    def end(self) -> int:
        return self.start + len(self.data)

    def cover(self, offset: int, count: int) -> None:
        """Hold at least ``[offset, offset + count)`` (less at the end of the file),
        dropping what comes before ``offset`` when more must be read."""
        wanted_end = min(offset + count, self.size)
        if self.start <= offset and wanted_end <= self.end:
            return
        if offset < self.start or offset > self.end:
            self.start, self.data = offset, b""
        elif offset > self.start:
            self.data, self.start = self.data[offset - self.start :], offset
        more = read_exactly(self.fd, wanted_end - self.end, self.end)
        if len(more) < wanted_end - self.end:  # shrunk while being read: its end is here
            self.size = self.end + len(more)
        self.data += more


def _remove_mark(segment_path: str) -> None:
    """A segment is gone: so is its acknowledgement mark (a stale one would be ignored)."""
    with contextlib.suppress(OSError):
        os.unlink(segment_path.removesuffix(".spool") + ".acks")


def read_exactly(fd: int, count: int, offset: int) -> bytes:
    """Up to ``count`` bytes at ``offset`` (fewer only at the end of the file)."""
    parts = []
    while count > 0:
        data = os.pread(fd, count, offset)
        if not data:
            break
        parts.append(data)
        count -= len(data)
        offset += len(data)
    return b"".join(parts)
