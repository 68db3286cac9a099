"""Acknowledgement marks: which frames of a spool segment are settled, so that a replay
after a crash resends only the others (at most what was in flight, plus marks not yet
written), instead of the whole segment.

A mark is a side file ``segment-<id>.acks`` beside its segment, appended a record at a
time as groups of messages settle (delivered, discarded after acceptance, possibly
delivered: any final outcome), never once per message::

    header = "PDAK" | u16 version (2) | u16 reserved (0) | u64 segment id
             | u64 incarnation | u32 stream | u32 crc32(the 28 bytes before)   32 bytes
    record = u32 length of the body | body | u32 crc32(length and body,
             seeded with the header's crc)
    body   = u16 ranges | ranges x (u32 first sequence | u32 count)
             | the group's outcome tally (JSON: :mod:`pydory.daemon.spool.tallies`)

(Version 1, written by the first builds of issue 24, has fixed 12-byte records of one
range each and no tally: still read; its groups count as settled but untallied.)

A group is the messages of one write-ahead token (a segment and a commit point
generation: about 10 ms of messages): its frame ranges are marked when its last message
settles, with what became of its messages (delivered, possibly delivered, discarded by
reason, per topic) in the same record, so a group still in flight at a crash is replayed
whole and a marked one is in the rebuilt books of its run (its outcomes counted, its
frames not replayed: never both, never neither). The marks name the
segment's incarnation and stream (:mod:`pydory.daemon.spool.records`): a segment cut
back to its header starts a new stream, and the marks of the old one no longer apply.

When in doubt, replay: a header that is cut, damaged or names another segment or stream
voids the whole file (:class:`AckMarkCorrupt`); a record whose CRC fails (a flipped byte
always fails CRC-32) ends the reading (its length cannot be trusted: what follows is
ignored), a record whose range or tally is impossible is ignored, and so is a torn tail. A
mark can only ever make recovery resend more, never skip a message it did not see
settled. Writing a mark is best effort: a disk that refuses it stops the marks of that
segment (logged once), which only means a fuller replay.

Rule: the only code that knows the acknowledgement mark's layout (``ACK_MAGIC`` and the
rest), and the only code that decides which frames are marked settled
(:class:`SettledGroups`).
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import os
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

from pydory.daemon.spool.disk_worker import DiskWorker, fdatasync_each
from pydory.daemon.spool.errors import SpoolError
from pydory.daemon.spool.tallies import BadTally, Tally, add, decode_tally, encode_tally, merge

log = logging.getLogger(__name__)

ACK_MAGIC = b"PDAK"
ACK_VERSION = 2
_READABLE_VERSIONS = (1, 2)
_ACK_HEAD = struct.Struct(">4sHHQQI")  # magic, version, reserved, segment, incarnation, stream
ACK_HEADER_BYTES = _ACK_HEAD.size + 4  # 32: with the CRC
_RECORD = struct.Struct(">II")  # first sequence, count (version 1: the whole record)
ACK_RECORD_BYTES = _RECORD.size + 4  # 12: with the CRC (version 1)
_U32 = struct.Struct(">I")
_U16 = struct.Struct(">H")
#: Version 2: per frame a mark needs at most a range and a topic's tally (about 1.6 KiB
#: for the longest topic name, escaped), beyond the record's own 10 bytes.
ACK_BYTES_PER_FRAME = 2048
_SEQUENCES = 2**32
ACK_SUFFIX = ".acks"


class AckMarkCorrupt(SpoolError):
    """An acknowledgement mark that cannot be trusted at all (its header): every frame of
    its segment is replayed."""


def ack_path(segment_path: str) -> str:
    """The mark of the segment file ``segment_path``."""
    return segment_path.removesuffix(".spool") + ACK_SUFFIX


# --- the format ---------------------------------------------------------------------------


def ack_size_limit(max_frames: int) -> int:
    """The largest mark a segment of at most ``max_frames`` frames could need."""
    return ACK_HEADER_BYTES + ACK_BYTES_PER_FRAME * max(1, max_frames)


def encode_ack_header(
    segment_id: int, incarnation: int, stream: int, version: int = ACK_VERSION
) -> bytes:
    head = _ACK_HEAD.pack(ACK_MAGIC, version, 0, segment_id, incarnation, stream)
    return head + _U32.pack(zlib.crc32(head))


def encode_ack_records(
    header: bytes, ranges: list[tuple[int, int]], tally: Tally | None = None
) -> bytes:
    """The record marking one group: ``ranges`` (first sequence, count) and ``tally``
    (version 1 headers: one record per range, no tally)."""
    seed = zlib.crc32(header[: _ACK_HEAD.size])
    if _U16.unpack_from(header, 4)[0] == 1:
        parts = []
        for first, count in ranges:
            body = _RECORD.pack(first, count)
            parts.append(body + _U32.pack(zlib.crc32(body, seed)))
        return b"".join(parts)
    body = b"".join(
        [
            _U16.pack(len(ranges)),
            *(_RECORD.pack(f, c) for f, c in ranges),
            encode_tally(tally or {}),
        ]
    )
    framed = _U32.pack(len(body)) + body
    return framed + _U32.pack(zlib.crc32(framed, seed))


@dataclass
class AckedFrames:
    """The frame sequences a mark says are settled: disjoint ranges, sorted."""

    starts: list[int] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)  # exclusive
    ignored_records: int = 0  # damaged or impossible records, and a torn tail
    marked: int = 0  # distinct sequences marked
    tally: Tally = field(default_factory=dict)  # the outcomes of the marked groups
    untallied: int = 0  # frames marked by a version 1 record: outcomes unknown

    def covers(self, sequence: int) -> bool:
        index = bisect.bisect_right(self.starts, sequence) - 1
        return index >= 0 and sequence < self.ends[index]

    @classmethod
    def of(
        cls, ranges: list[tuple[int, int]], ignored: int = 0, tally: Tally | None = None
    ) -> AckedFrames:
        acked = cls(ignored_records=ignored, tally=tally or {})
        for start, end in sorted(ranges):
            if acked.ends and start <= acked.ends[-1]:
                acked.ends[-1] = max(acked.ends[-1], end)
            else:
                acked.starts.append(start)
                acked.ends.append(end)
        acked.marked = sum(e - s for s, e in zip(acked.starts, acked.ends, strict=True))
        return acked


def parse_ack_mark(data: bytes, segment_id: int, incarnation: int, stream: int) -> AckedFrames:
    """The settled frames ``data`` (a whole mark file) records for that segment and stream.

    Raises :class:`AckMarkCorrupt` if the header is cut, damaged or names another segment,
    incarnation or stream; never anything else, whatever the bytes. Damaged records and a
    torn tail are ignored (counted in ``ignored_records``).
    """
    if len(data) < ACK_HEADER_BYTES:
        raise AckMarkCorrupt(f"acknowledgement mark cut inside its header ({len(data)} bytes)")
    head = data[: _ACK_HEAD.size]
    (crc,) = _U32.unpack_from(data, _ACK_HEAD.size)
    if zlib.crc32(head) != crc:
        raise AckMarkCorrupt("acknowledgement mark header fails its CRC")
    magic, version, _reserved, segment, incarnation_, stream_ = _ACK_HEAD.unpack(head)
    if magic != ACK_MAGIC or version not in _READABLE_VERSIONS:
        raise AckMarkCorrupt(f"not an acknowledgement mark of version {ACK_VERSION}")
    if (segment, incarnation_, stream_) != (segment_id, incarnation, stream):
        raise AckMarkCorrupt(
            f"acknowledgement mark of segment {segment} stream {incarnation_:016x}/{stream_}, "
            f"not {segment_id} {incarnation:016x}/{stream}"
        )
    seed = zlib.crc32(head)
    if version == 2:
        return _parse_groups(data, seed)
    ranges: list[tuple[int, int]] = []
    ignored = 0
    end = len(data) - (len(data) - ACK_HEADER_BYTES) % ACK_RECORD_BYTES
    if end < len(data):
        ignored += 1  # a torn last record
    for offset in range(ACK_HEADER_BYTES, end, ACK_RECORD_BYTES):
        first, count = _RECORD.unpack_from(data, offset)
        (record_crc,) = _U32.unpack_from(data, offset + _RECORD.size)
        body = data[offset : offset + _RECORD.size]
        if zlib.crc32(body, seed) != record_crc or count == 0 or first + count > _SEQUENCES:
            ignored += 1
            continue
        ranges.append((first, first + count))
    acked = AckedFrames.of(ranges, ignored)
    acked.untallied = acked.marked
    return acked


def _parse_groups(data: bytes, seed: int) -> AckedFrames:
    """Version 2's records, each a group's ranges and tally, taken or ignored whole."""
    ranges: list[tuple[int, int]] = []
    tally: Tally = {}
    ignored = 0
    offset = ACK_HEADER_BYTES
    while offset < len(data):
        if offset + 4 > len(data):
            ignored += 1  # a torn length
            break
        (length,) = _U32.unpack_from(data, offset)
        end = offset + 4 + length
        if end + 4 > len(data):
            ignored += 1  # torn, or a damaged length: what follows cannot be found
            break
        (crc,) = _U32.unpack_from(data, end)
        if zlib.crc32(data[offset:end], seed) != crc:
            ignored += 1  # the length itself may be wrong: stop here
            break
        group = _group(data[offset + 4 : end])
        if group is None:
            ignored += 1
        else:
            ranges.extend(group[0])
            merge(tally, group[1])
        offset = end + 4
    return AckedFrames.of(ranges, ignored, tally)


def _group(body: bytes) -> tuple[list[tuple[int, int]], Tally] | None:
    """A record's ranges (start, end) and tally; None if either is impossible."""
    if len(body) < _U16.size:
        return None
    (count,) = _U16.unpack_from(body, 0)
    tally_at = _U16.size + count * _RECORD.size
    if count == 0 or tally_at > len(body):
        return None
    ranges = []
    for index in range(count):
        first, n = _RECORD.unpack_from(body, _U16.size + index * _RECORD.size)
        if n == 0 or first + n > _SEQUENCES:
            return None
        ranges.append((first, first + n))
    try:
        tally = decode_tally(body[tally_at:])
    except BadTally:
        return None
    return ranges, tally


def read_ack_mark(
    segment_path: str, segment_id: int, identity: tuple[int, int] | None, size_limit: int
) -> tuple[AckedFrames, str | None]:
    """The settled frames of a segment found at start-up, and a problem line (None when
    the mark is whole or absent). No identity (an older or damaged segment header), an
    unreadable or corrupt mark, or one larger than ``size_limit``: nothing is settled."""
    path = ack_path(segment_path)
    try:
        with open(path, "rb") as file:
            data = file.read(size_limit + 1)
    except FileNotFoundError:
        return AckedFrames(), None
    except OSError as exc:
        return AckedFrames(), f"{os.path.basename(path)}: unreadable ({exc.strerror or exc})"
    name = os.path.basename(path)
    if identity is None:
        return AckedFrames(), f"{name}: its segment's header names no identity: not used"
    if len(data) > size_limit:
        return AckedFrames(), f"{name}: larger than its segment could need: not used"
    try:
        acked = parse_ack_mark(data, segment_id, *identity)
    except AckMarkCorrupt as exc:
        return AckedFrames(), f"{name}: {exc}: every frame replayed"
    if acked.ignored_records:
        return acked, f"{name}: {acked.ignored_records} damaged record(s) ignored"
    return acked, None


# --- writing marks --------------------------------------------------------------------------


class AckMarks:
    """The marks of this run's segments: one file per segment, created at its first mark,
    appended with ``os.write``, fsynced on the spool's interval (on the daemon's disk
    worker, if given one), deleted with it."""

    def __init__(self, incarnation: int, worker: DiskWorker | None = None) -> None:
        self.incarnation = incarnation
        self._worker = worker
        self._files: dict[int, _AckFile] = {}
        self.records_written = 0
        self.errors = 0

    def mark(
        self,
        segment_id: int,
        path: str,
        stream: int,
        ranges: list[tuple[int, int]],
        tally: Tally | None = None,
    ) -> None:
        """Mark ``ranges`` of segment ``segment_id``'s ``stream`` settled, with what became
        of their messages (``tally``), in one record (best effort)."""
        file = self._files.get(segment_id)
        if file is None or file.stream != stream:
            if file is not None:
                file.close()
            header = encode_ack_header(segment_id, self.incarnation, stream)
            file = self._files[segment_id] = _AckFile(ack_path(path), stream, header)
        if self._worker is not None and self._worker.failed_marks:
            self._broken_by_worker()
        if file.broken:
            return
        try:
            file.append(encode_ack_records(file.header, ranges, tally))
        except OSError as exc:
            self.errors += 1
            file.broken = True
            log.warning(
                "spool: cannot write the acknowledgement mark [%s] (%s): that "
                "segment's settled messages would be replayed after a crash",
                file.path,
                exc.strerror or exc,
            )
            return
        self.records_written += len(ranges)

    def forget(self, segment_id: int, path: str, *, unlink: bool = True) -> None:
        """Segment ``segment_id`` was deleted or cut back to its header: so is its mark
        (``unlink=False``: its file is the caller's to delete)."""
        file = self._files.pop(segment_id, None)
        if file is not None:
            file.close()
        if unlink:
            with contextlib.suppress(OSError):  # a stale mark names an old stream: ignored
                os.unlink(ack_path(path))

    def fsync(self) -> int:
        """fsync the marks written since the last time; how many fsyncs were made here
        (with a worker: none, the worker syncs duplicates of their descriptors)."""
        if self._worker is not None:
            handed = []
            for segment_id, file in self._files.items():
                if file.dirty and file.fd is not None and not file.broken:
                    try:
                        handed.append((segment_id, os.dup(file.fd)))  # closed by the worker
                    except OSError:  # out of descriptors: synced next time
                        self.errors += 1
                        continue
                    file.dirty = False
            if handed:
                self._worker.sync_marks(handed)
            return 0
        fds = [(i, f.fd) for i, f in self._files.items() if f.dirty and f.fd is not None]
        done, failures = fdatasync_each((i, fd) for i, fd in fds if not self._files[i].broken)
        failed = {segment_id for segment_id, _ in failures}
        for segment_id, _ in fds:
            file = self._files[segment_id]
            if segment_id in failed:
                self.errors += 1
                file.broken = True  # after a failed fsync, write no more to it
            elif not file.broken:
                file.dirty = False
        return done

    def close(self) -> None:
        for file in self._files.values():
            file.close()
        self._files.clear()

    def _broken_by_worker(self) -> None:
        """After a failed fsync, write no more to that mark (the kernel may have dropped
        its dirty pages: a later fsync could succeed over a hole)."""
        assert self._worker is not None
        failed = self._worker.failed_marks
        while failed:
            file = self._files.get(failed.popleft())
            if file is not None:
                file.broken = True


class _AckFile:
    __slots__ = ("broken", "dirty", "fd", "header", "path", "stream")

    def __init__(self, path: str, stream: int, header: bytes) -> None:
        self.path = path
        self.stream = stream
        self.header = header
        self.fd: int | None = None
        self.broken = False
        self.dirty = False

    def append(self, records: bytes) -> None:
        if self.fd is None:
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_CLOEXEC
            self.fd = os.open(self.path, flags, 0o600)
            records = self.header + records
        written = os.write(self.fd, records)
        if written != len(records):  # only a full disk writes short: the rest is torn
            raise OSError(28, os.strerror(28))
        self.dirty = True

    def close(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = None


# --- which frames settled -------------------------------------------------------------------


@dataclass(slots=True)
class _Group:
    segment: int
    stream: int
    outstanding: int = 0
    ranges: list[tuple[int, int]] = field(default_factory=list)  # first sequence, count
    void: bool = False  # never marked (see SettledGroups.joined)
    tally: Tally = field(default_factory=dict)  # its settled messages' outcomes


class SettledGroups:
    """The write-ahead's tokens as groups of frames: a group's frame ranges are marked
    (``mark(segment, stream, ranges)``) when its last message settles.

    A burst joins the group of its first accepted message's token with all its frames
    (those never accepted settle at the end of the burst); every settlement under the
    token counts down. A token names one segment, and a segment with unsettled messages
    is never cut back, so a group's ranges share one stream. Kept messages (shutdown)
    never count down: never marked.
    """

    def __init__(self, mark: Callable[[int, int, list[tuple[int, int]], Tally], None]) -> None:
        self._mark = mark
        self._groups: dict[int, _Group] = {}

    def joined(self, token: int, segment: int, stream: int, first: int, count: int) -> None:
        group = self._groups.get(token)
        if group is None:
            group = self._groups[token] = _Group(segment, stream)
        elif group.stream != stream:  # impossible (see above); if it were, mark nothing
            group.void = True
        group.outstanding += count
        ranges = group.ranges
        if ranges and ranges[-1][0] + ranges[-1][1] == first:  # the burst after the last
            ranges[-1] = (ranges[-1][0], ranges[-1][1] + count)
        else:
            ranges.append((first, count))

    def tally(self, token: int, topic: str, outcome: str, n: int) -> None:
        """``n`` messages of ``topic`` under ``token`` met ``outcome`` (before their
        :meth:`settled`, which may mark the group with it)."""
        group = self._groups.get(token)
        if group is not None:
            add(group.tally, topic, outcome, n)

    def settled(self, token: int, n: int) -> None:
        group = self._groups.get(token)
        if group is None:
            return
        group.outstanding -= n
        if group.outstanding > 0:
            return
        del self._groups[token]
        if not group.void:
            self._mark(group.segment, group.stream, group.ranges, group.tally)

    def __len__(self) -> int:
        return len(self._groups)
