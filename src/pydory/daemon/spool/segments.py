"""The durable spool: every accepted message is written ahead to disk, so nothing the
daemon accepted is lost, even on SIGKILL or a power cut (with an fsync policy).

Storage only: no asyncio, no librdkafka. The daemon appends each burst of accepted
messages (one ``os.write``) before handing them to librdkafka, settles them as delivery
reports come back (delivered or discarded), and on start replays what a previous run
left behind. Single-threaded by design: all calls come from the loop thread.

On disk, ``directory`` holds a ``LOCK`` file (an exclusive ``flock`` held while the spool
is open, so two daemons never share one spool) and segment files
``segment-<20-digit id>.spool``, ids increasing across restarts. A segment is a header
followed by framed, checksummed records numbered from 0 (their layout:
:mod:`pydory.daemon.spool.records`). Appends only ever add whole frames, and a failed
write is truncated away, so a segment is always a run of good frames followed at worst
by one torn frame (a crash mid-write); recovery (:mod:`pydory.daemon.spool.recovery`)
cuts the torn frame, and finds its way past a damaged one (a bad disk, a power cut).

A segment is deleted once every message in it is settled. The segment being written is
never deleted while it is current: when all its messages are settled it is truncated
back to its header instead (no replay of settled messages after a crash, no new file
per burst at low rates), under a new stream number (its frames' identities start
afresh: :mod:`pydory.daemon.spool.identity`), and deleted when it rotates or at
``close()``. Settled frames of a segment still in use are marked in its side file
(:mod:`pydory.daemon.spool.acks`), so a crash replays only the others.

Rule: :class:`Spool` is the only code that holds the spool directory's lock, names its
segment files (``SEGMENT_NAME``), and writes, truncates or deletes this run's segments (when
they are fsynced: :mod:`pydory.daemon.spool.syncing`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import logging
import os
import re
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass

from pydory.daemon.spool.acks import ACK_SUFFIX, AckMarks, ack_path
from pydory.daemon.spool.disk_worker import DiskWorker
from pydory.daemon.spool.errors import SpoolError, SpoolFull, SpoolInUse
from pydory.daemon.spool.identity import new_incarnation
from pydory.daemon.spool.lock_pid import read_pid, write_pid
from pydory.daemon.spool.records import (
    HEADER_BYTES,
    PAYLOAD_HEAD,
    PAYLOAD_HEAD_CRC,
    SEQUENCES_PER_SEGMENT,
    SYNC_MARKER,
    SpoolRecord,
    decode_records,
    encode_header,
    encode_payloads,
    encode_records,
)
from pydory.daemon.spool.recovery import (
    OnCorrupt,
    RecoveredRecord,
    RecoveryReport,
    SegmentRecovery,
    read_exactly,
)
from pydory.daemon.spool.syncing import SegmentSync
from pydory.daemon.spool.tallies import Tally
from pydory.hotpath import write_payload_frames

log = logging.getLogger(__name__)

LOCK_FILE = "LOCK"
SEGMENT_NAME = re.compile(r"segment-([0-9]{20})\.spool", re.ASCII)
ACK_NAME = re.compile(r"segment-([0-9]{20})" + re.escape(ACK_SUFFIX), re.ASCII)


@dataclass(slots=True)
class _Segment:
    """A segment file this process writes or wrote: its size and unsettled messages."""

    id: int
    path: str
    size: int
    outstanding: int = 0
    fd: int | None = None  # open while it is the current segment
    next_sequence: int = 0  # the sequence of the next frame appended to it
    stream: int = 0  # its frames' stream (in its header): new when it is cut back


class Spool:
    """A directory of append-only segment files holding accepted, unsettled messages.

    ``fsync_interval_ms``: None = never, 0 = after every append, N = every N ms, checked on
    append and by ``maybe_fsync()`` (call it from a timer): :mod:`pydory.daemon.spool.syncing`.

    ``max_bytes`` caps the bytes of the segments this process writes. Segments left by a
    previous run are not counted against it while they await replay: their records are
    being moved into the new segments, and refusing them would lose exactly what the
    spool exists to keep (disk use can reach twice the cap until ``finish_recovery()``).
    """

    def __init__(
        self,
        directory: str,
        *,
        segment_bytes: int,
        max_bytes: int,
        fsync_interval_ms: int | None,
        clock: Callable[[], float] = time.monotonic,
        incarnation: int | None = None,
        disk_worker: DiskWorker | None = None,
    ) -> None:
        """``segment_bytes``: a segment rotates once it reaches this size; ``clock``: the
        interval policy's clock; ``incarnation``: this run's (new if None);
        ``disk_worker``: the thread the interval's syncs and the deletions run on (None:
        in the caller)."""
        if segment_bytes < 1 or max_bytes < 1:
            raise ValueError("segment_bytes and max_bytes must be positive")
        # The daemon's worker takes the interval's syncs and the deletions off its loop.
        self._worker = disk_worker
        #: Segments whose sync failed on the worker (an append then takes the slow path,
        #: which retires such a segment: SegmentSync.failed).
        self._failed_syncs: Collection[int] = (
            disk_worker.failed_segments if disk_worker is not None else ()
        )
        self._sync = SegmentSync(directory, fsync_interval_ms, clock, disk_worker)
        self.directory = directory
        self.segment_bytes = segment_bytes
        self.max_bytes = max_bytes
        self.fsync_interval_ms = fsync_interval_ms
        self._clock = clock
        #: This run, in its segments' headers (the identity of their messages).
        self.incarnation = new_incarnation() if incarnation is None else incarnation
        self._next_stream = 1
        self._acks = AckMarks(self.incarnation, disk_worker)
        #: Called just before a stream's marks go (deleted, cut back): its tally folded.
        self.before_fold: Callable[[int, int], None] = lambda segment_id, stream: None
        #: ``(stream, first sequence)`` of the last append's frames.
        self.last_identity = (0, 0)
        self._lock_fd: int | None = None
        self._recovery = SegmentRecovery(directory, self._error, self._make_durable)
        self._segments: dict[int, _Segment] = {}  # this run's segments, by id
        self._current: _Segment | None = None
        self._next_id = 1
        self._live_bytes = 0  # bytes of this run's segment files
        self._outstanding = 0
        #: ``(start, end)`` file offsets of the last append's frames in its segment.
        self.last_append = (0, 0)
        #: Messages appended since open().
        self.appended_total = 0
        #: Bursts refused because the spool was at its size cap.
        self.full_total = 0
        self._errors = 0  # disk errors met here; the syncs count theirs

    # --- lifecycle ----------------------------------------------------------------------------

    def open(self) -> None:
        """Create the directory (mode 0700), lock it, and note the segments already there.

        Raises SpoolInUse if another process holds the lock, SpoolError if the directory
        cannot be created or read. Writing starts with the first ``append()``. Nothing
        here needs free space once the directory exists: a full disk must not stop a
        start (the daemon then runs unprotected until appends succeed again).
        """
        if self._lock_fd is not None:
            raise RuntimeError("spool already open")
        lock_path = os.path.join(self.directory, LOCK_FILE)
        try:
            os.makedirs(self.directory, mode=0o700, exist_ok=True)
            lock_fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise self._error(f"cannot open spool directory [{self.directory}]", exc) from exc
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = read_pid(lock_fd)
            os.close(lock_fd)
            raise SpoolInUse(self.directory, f" (pid {holder})" if holder else "") from None
        except OSError as exc:
            os.close(lock_fd)
            raise self._error(f"cannot lock spool directory [{self.directory}]", exc) from exc
        write_pid(lock_fd, os.path.join(self.directory, LOCK_FILE))
        try:
            found = self._scan()
        except OSError as exc:
            os.close(lock_fd)
            raise self._error(f"cannot read spool directory [{self.directory}]", exc) from exc
        self._lock_fd = lock_fd
        self._recovery.found = found
        self._next_id = max(self._next_id, found[-1][0] + 1 if found else 1)

    def _scan(self) -> list[tuple[int, str]]:
        """The segments an earlier run left, ``(id, path)`` oldest first (their bytes
        counted for the recovery); an acknowledgement mark whose segment is gone deleted,
        and the next id set past every id a segment or a mark has used."""
        found: list[tuple[int, str]] = []
        marks: dict[int, str] = {}
        for name in os.listdir(self.directory):
            match = SEGMENT_NAME.fullmatch(name)
            if match is None:
                if (mark := ACK_NAME.fullmatch(name)) is not None:
                    marks[int(mark.group(1))] = os.path.join(self.directory, name)
                continue
            path = os.path.join(self.directory, name)
            try:
                size = os.stat(path).st_size
            except FileNotFoundError:
                continue
            found.append((int(match.group(1)), path))
            self._recovery.bytes_on_disk += size
        found.sort()
        for segment_id in marks.keys() - {segment_id for segment_id, _ in found}:
            with contextlib.suppress(OSError):  # a mark whose segment is gone
                os.unlink(marks[segment_id])
        if marks:  # never reuse the id of a segment whose mark may linger
            self._next_id = max(marks) + 1
        return found

    def close(self) -> None:
        """fsync (unless the policy is never), close the files, delete settled segments,
        release the lock. Segments with unsettled messages stay for the next start.

        Idempotent. Raises SpoolError only after everything is released.
        """
        if self._lock_fd is None:
            return
        failure: SpoolError | None = None
        current = self._current
        if current is not None and self.fsync_interval_ms is not None:
            try:
                self._fsync(current)
            except SpoolError as exc:
                failure = exc
        if current is not None:
            self._retire(current)
        if self.fsync_interval_ms is not None:
            self._sync.sync(None)  # a current segment that failed, tried once more
            self._sync.counted(self._acks.fsync())
        self._acks.close()
        for segment in list(self._segments.values()):
            if segment.outstanding == 0:
                try:
                    self._delete(segment)
                except SpoolError as exc:
                    failure = failure or exc
        if self._worker is not None:
            self._worker.close()  # its syncs and deletions done before the lock goes
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
        finally:
            os.close(self._lock_fd)
            self._lock_fd = None
        if failure is not None:
            raise failure

    def __enter__(self) -> Spool:
        self.open()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- recovery -----------------------------------------------------------------------------

    def recover(self, on_corrupt: OnCorrupt | None = None) -> Iterator[SpoolRecord]:
        """Every record of the segments present at ``open()``: oldest segment first, in
        write order.

        A torn tail (a crash mid-write) is cut; past a damaged frame (bad CRC, no marker,
        impossible lengths) reading resynchronises on the next good one, and each damaged
        region is counted in messages, copied to ``corrupt/`` and handed to
        ``on_corrupt``; a file without a valid header or frame is removed. All of it is
        in ``recovery_report``, never raised, and neither is a disk that refuses a repair
        or a read (that segment stays for the next start). Reads a segment
        ``RECOVERY_CHUNK_BYTES`` at a time, so memory stays bounded whatever its size.
        A segment fully read is pending replay: ``finish_recovery()`` deletes it.
        """
        self._require_open()
        for record, _origin in self._recovery.records(on_corrupt):
            yield record

    def recover_identified(self, on_corrupt: OnCorrupt | None = None) -> Iterator[RecoveredRecord]:
        """:meth:`recover`, each record with the identity it was first given (packed:
        :func:`pydory.daemon.spool.identity.pack_origin`; None when its segment names
        none). Frames its segment's mark says were settled are skipped (and counted)."""
        self._require_open()
        yield from self._recovery.records(on_corrupt)

    @property
    def recovery_report(self) -> RecoveryReport:
        """What ``recover()`` found so far."""
        return self._recovery.report

    def finish_recovery(self) -> None:
        """Delete the segments ``recover()`` read to the end: their records are now in
        this run's segments (the caller appended them), or settled. Segments not read
        stay, and so does one the disk refuses to delete (reported)."""
        self._require_open()
        self._recovery.delete_recovered()

    def _make_durable(self, fd: int) -> None:
        """fsync a segment recovery repaired, unless the policy is never."""
        if self.fsync_interval_ms is not None:
            os.fsync(fd)
            self._sync.counted(1)

    # --- appending and settling ---------------------------------------------------------------

    def append(self, records: Sequence[SpoolRecord]) -> int:
        """Write a burst of records to the current segment in one ``os.write``; return the
        id of that segment (for ``settle``).

        Rotates first when the current segment has reached ``segment_bytes``. Raises
        SpoolFull (nothing written) if the burst would take this run's segments above
        ``max_bytes``; SpoolError if the disk fails, after cutting any partial write away
        so the segment stays a valid prefix. fsyncs as the policy says.
        """
        return self._append_encoded(functools.partial(encode_records, records), len(records))

    def append_payloads(
        self, payloads: Sequence[bytes], origins: Sequence[bytes | None] | None = None
    ) -> int:
        """:meth:`append` for client messages as read (see :func:`encode_payloads`);
        ``origins``: replayed messages' first identities, kept in their frames."""
        current = self._current
        if (
            origins is None
            and write_payload_frames is not None
            and current is not None
            and payloads
            and current.size < self.segment_bytes
            and current.next_sequence + len(payloads) <= SEQUENCES_PER_SEGMENT
            and not self._failed_syncs
        ):
            return self._append_read(current, payloads)
        encode = functools.partial(encode_payloads, payloads, origins=origins)
        return self._append_encoded(encode, len(payloads))

    def _append_read(self, current: _Segment, payloads: Sequence[bytes]) -> int:
        """:meth:`append_payloads` where nothing is to rotate or retire first (the write
        ahead of a read burst, nearly every time): framed and written in one compiled call
        (``pydory.hotpath.write_payload_frames``), no bytes object of the frames, the size
        cap checked by it before anything is written (issue 34, lever 3)."""
        assert write_payload_frames is not None
        assert current.fd is not None
        before = current.size
        try:
            written = write_payload_frames(
                current.fd,
                payloads,
                current.next_sequence,
                PAYLOAD_HEAD,
                PAYLOAD_HEAD_CRC,
                SYNC_MARKER,
                self.max_bytes - self._live_bytes,
            )
        except OSError as exc:
            self._cut_back(current, before)
            raise self._error(f"cannot write spool segment [{current.path}]", exc) from exc
        if written < 0:
            raise self._full(-written)
        return self._written(current, before, written, len(payloads))

    def _append_encoded(self, encode: Callable[[int], bytes], count: int) -> int:
        """Append the frames ``encode(first sequence)`` makes for ``count`` messages."""
        self._require_open()
        current = self._current
        if current is not None and (
            current.size >= self.segment_bytes
            or current.next_sequence + count > SEQUENCES_PER_SEGMENT
            or self._sync.failed(current.id)  # the worker could not sync it
        ):
            self._retire(current)
            if current.outstanding == 0:
                self._delete(current)
            current = None
        # Numbered in the segment they go to: from 0 in a new one (see records.py).
        data = encode(0 if current is None else current.next_sequence)
        new_bytes = len(data) + (HEADER_BYTES if current is None else 0)
        if self._live_bytes + new_bytes > self.max_bytes:
            raise self._full(new_bytes)
        if current is None:
            current = self._start_segment()
        if not data:
            return current.id
        assert current.fd is not None
        before = current.size
        try:
            written = 0
            while written < len(data):  # a short write is followed by the error, or by more
                written += os.write(current.fd, data[written:] if written else data)
        except OSError as exc:
            self._cut_back(current, before)
            raise self._error(f"cannot write spool segment [{current.path}]", exc) from exc
        return self._written(current, before, written, count)

    def _full(self, new_bytes: int) -> SpoolFull:
        """A burst of ``new_bytes`` refused: it would take the spool above its cap."""
        self.full_total += 1
        return SpoolFull(
            f"spool [{self.directory}] is full: {self._live_bytes} bytes + a burst of "
            f"{new_bytes} > maxSize {self.max_bytes}"
        )

    def _written(self, current: _Segment, before: int, written: int, count: int) -> int:
        """``count`` messages' frames, ``written`` bytes from ``before``, are in
        ``current``: synced if the policy says so now, then counted."""
        current.size += written
        self._live_bytes += written
        self._sync.current_dirty = True
        if self._sync.due():
            try:
                self._fsync(current)
            except SpoolError:
                # Whether the burst reached the disk is unknown: it is not spooled. After
                # a failed fsync the kernel may have dropped other dirty pages of the file
                # and a later fsync may succeed anyway: write no more to it.
                self._cut_back(current, before)
                self._retire(current)
                raise
        self.last_identity = (current.stream, current.next_sequence)
        current.next_sequence += count
        current.outstanding += count
        self._outstanding += count
        self.appended_total += count
        self.last_append = (before, before + written)
        return current.id

    def read_frames(self, segment_id: int, start: int, end: int) -> list[SpoolRecord]:
        """The client messages an earlier ``append_payloads`` wrote at ``[start, end)`` of
        ``segment_id`` (its ``last_append``), read back from the file: for messages kept
        on disk only while memory was short. Raises SpoolError if they cannot be read
        back whole (a failing disk, or a file changed under the daemon)."""
        segment = self._segments.get(segment_id)
        if segment is None or not HEADER_BYTES <= start <= end <= segment.size:
            raise SpoolError(f"spool segment {segment_id} holds no frames at [{start}, {end})")
        try:
            fd = os.open(segment.path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                data = read_exactly(fd, end - start, start)
            finally:
                os.close(fd)
        except OSError as exc:
            raise self._error(f"cannot read spool segment [{segment.path}]", exc) from exc
        records, consumed, problem = decode_records(data)
        if problem is not None or consumed != len(data) or not all(r.is_payload for r in records):
            raise SpoolError(
                f"spool segment {segment.path} at [{start}, {end}): {problem or 'not payloads'}"
            )
        return records

    def maybe_fsync(self) -> bool:
        """fsync the current segment if the interval policy says it is time (written to
        since the last fsync, which was at least ``fsync_interval_ms`` ago). True if it
        did. Call it from a timer so a quiet spool is still synced."""
        if self._lock_fd is None or not self._sync.waiting:
            return False
        if not self.fsync_interval_ms:  # never, or always (then nothing ever waits)
            return False
        self._sync.counted(self._acks.fsync())
        if not self._sync.due():
            return False
        current = self._current
        try:
            self._fsync(current)
        except SpoolError:
            assert current is not None
            self._retire(current)  # after a failed fsync, write no more to that file
            raise
        return True

    def settle(self, segment_id: int, count: int) -> None:
        """``count`` messages appended to ``segment_id`` are settled (delivered or
        discarded). A segment left with nothing outstanding is deleted at once, unless it
        is the current one: that is truncated back to its header and kept for writing.

        Raises ValueError for an unknown segment or more than it holds (a caller bug that
        would delete unsettled messages), SpoolError if the disk refuses the deletion.
        """
        if count == 0:
            return
        segment = self._segments.get(segment_id)
        if segment is None or count < 0 or count > segment.outstanding:
            held = 0 if segment is None else segment.outstanding
            raise ValueError(f"cannot settle {count} of segment {segment_id} (holds {held})")
        segment.outstanding -= count
        self._outstanding -= count
        if segment.outstanding:
            return
        if segment is self._current:
            self._reset(segment)
        else:
            self._delete(segment)

    def acknowledge(
        self, segment_id: int, stream: int, ranges: list[tuple[int, int]], tally: Tally
    ) -> None:
        """Frames ``ranges`` (first sequence, count) of ``stream`` of a segment settled,
        their outcomes ``tally``: marked, so a crash does not replay them. Nothing to mark
        once the segment is gone or cut back (folded). Never raises (best effort)."""
        segment = self._segments.get(segment_id)
        if segment is not None and segment.stream == stream and segment.outstanding:
            self._acks.mark(segment_id, segment.path, stream, ranges, tally)

    @property
    def acknowledgement_records(self) -> int:
        """Acknowledgement mark records written since open()."""
        return self._acks.records_written

    # --- sensors ------------------------------------------------------------------------------

    @property
    def fsyncs_total(self) -> int:
        """fsync calls made (segment data, the directory, acknowledgement marks)."""
        return self._sync.fsyncs_total

    @property
    def errors_total(self) -> int:
        """Disk errors met (each raised as SpoolError, or counted when not raisable)."""
        return self._errors + self._sync.errors_total

    @property
    def bytes_on_disk(self) -> int:
        """Bytes of every segment file: this run's and those awaiting replay."""
        return self._live_bytes + self._recovery.bytes_on_disk

    @property
    def segments(self) -> int:
        """Segment files on disk: this run's and those awaiting replay."""
        return len(self._segments) + self._recovery.segments

    @property
    def outstanding(self) -> int:
        """Messages appended and not yet settled."""
        return self._outstanding

    @property
    def current_segment_id(self) -> int | None:
        """The segment appends go to, None before the first append or after a rotation."""
        return None if self._current is None else self._current.id

    # --- internals ----------------------------------------------------------------------------

    def _require_open(self) -> None:
        if self._lock_fd is None:
            raise RuntimeError("spool is not open")

    def _error(self, what: str, exc: OSError) -> SpoolError:
        self._errors += 1
        return SpoolError(f"{what}: {exc.strerror or exc}")

    def _start_segment(self) -> _Segment:
        segment_id = self._next_id
        path = os.path.join(self.directory, f"segment-{segment_id:020d}.spool")
        try:
            fd = os.open(
                path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC, 0o600
            )
        except OSError as exc:
            raise self._error(f"cannot create spool segment [{path}]", exc) from exc
        self._next_id += 1  # an id is never reused, even for a file that failed
        try:
            stream = self._new_stream()
            _write_header(fd, encode_header(segment_id, self.incarnation, stream))
            # The new name must survive a power cut too, or its records vanish with it.
            self._sync.created(fd)
        except OSError as exc:
            os.close(fd)
            with contextlib.suppress(OSError):  # else the next recovery removes it
                os.unlink(path)
            raise self._error(f"cannot create spool segment [{path}]", exc) from exc
        segment = _Segment(segment_id, path, HEADER_BYTES, fd=fd, stream=stream)
        self._segments[segment_id] = segment
        self._live_bytes += HEADER_BYTES
        self._current = segment
        return segment

    def _new_stream(self) -> int:
        """The stream number of a new segment, or of one cut back: never used before in
        this run, so a frame's (stream, sequence) names one message."""
        stream = self._next_stream
        self._next_stream += 1
        return stream

    def _fsync(self, current: _Segment | None) -> None:
        """Sync what waits (:meth:`SegmentSync.sync`); SpoolError if ``current`` fails."""
        open_current = None
        if current is not None and current.fd is not None:
            open_current = (current.id, current.fd)
        try:
            self._sync.sync(open_current)
        except OSError as exc:
            assert current is not None
            raise self._error(f"cannot fsync spool segment [{current.path}]", exc) from exc

    def _cut_back(self, segment: _Segment, size: int) -> None:
        """Truncate ``segment`` back to ``size`` after a failed write or fsync, so it stays
        a valid prefix; if even that fails, stop writing to it (recovery cuts the tail)."""
        assert segment.fd is not None
        try:
            os.ftruncate(segment.fd, size)
            actual = size
        except OSError:
            self._errors += 1
            try:
                actual = os.fstat(segment.fd).st_size
            except OSError:
                actual = segment.size
            self._retire(segment)
        self._live_bytes += actual - segment.size
        segment.size = actual

    def _retire(self, segment: _Segment) -> None:
        """Stop writing to ``segment`` (it stays until its messages are settled)."""
        fd = segment.fd
        if fd is not None:
            segment.fd = None
            self._sync.retired(segment.id, fd)  # its unsynced writes: with the next sync
        if self._current is segment:
            self._current = None

    def _reset(self, segment: _Segment) -> None:
        """Cut the current segment back to a new header: all its messages are settled. A
        new stream: the next frame 0 is another message than the last one's frame 0 (a
        crash between the cut and the header leaves an empty file, removed at start)."""
        assert segment.fd is not None
        if segment.size == HEADER_BYTES:
            return
        self.before_fold(segment.id, segment.stream)
        self._acks.forget(segment.id, segment.path)
        stream = self._new_stream()
        try:
            os.ftruncate(segment.fd, 0)
            # O_APPEND: written at 0, after the cut.
            _write_header(segment.fd, encode_header(segment.id, self.incarnation, stream))
        except OSError as exc:
            self._retire(segment)
            self._delete(segment)
            raise self._error(f"cannot truncate spool segment [{segment.path}]", exc) from exc
        self._live_bytes -= segment.size - HEADER_BYTES
        self._sync.current_dirty = True  # the cut and the new stream, with the next sync
        segment.size = HEADER_BYTES
        segment.next_sequence = 0  # what recovery expects after the header
        segment.stream = stream

    def _delete(self, segment: _Segment) -> None:
        """Delete a settled segment and then its acknowledgement mark (on the disk worker,
        if there is one), its outcome tally folded first."""
        if segment.fd is not None:
            self._retire(segment)
        self._sync.deleted(segment.id)
        self.before_fold(segment.id, segment.stream)
        del self._segments[segment.id]
        self._live_bytes -= segment.size
        # The segment before its mark: a crash between the two must not leave a segment
        # without the mark of its settled frames (it would be replayed whole).
        self._acks.forget(segment.id, segment.path, unlink=False)
        if self._worker is not None:
            self._worker.unlink([segment.path, ack_path(segment.path)])
            return
        try:
            os.unlink(segment.path)
        except FileNotFoundError:
            pass
        except OSError as exc:  # its mark stays too: a restart replays none of it twice
            raise self._error(f"cannot delete spool segment [{segment.path}]", exc) from exc
        with contextlib.suppress(OSError):
            os.unlink(ack_path(segment.path))


def _write_header(fd: int, header: bytes) -> None:
    """Write a segment's header; OSError (ENOSPC) if it is written short: only a full disk
    writes a few dozen bytes short."""
    if os.write(fd, header) != len(header):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
