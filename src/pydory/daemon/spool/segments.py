"""The durable spool: every accepted message is written ahead to disk, so nothing the
daemon accepted is lost, even on SIGKILL or a power cut (with an fsync policy).

Storage only: no asyncio, no librdkafka. The daemon appends each burst of accepted
messages (one ``os.write``) before handing them to librdkafka, settles them as delivery
reports come back (delivered or discarded), and on start replays what a previous run
left behind. Single-threaded by design: all calls come from the loop thread.

On disk, ``directory`` holds a ``LOCK`` file (an exclusive ``flock`` held while the spool
is open, so two daemons never share one spool) and segment files
``segment-<20-digit id>.spool``, ids increasing across restarts. A segment is a header
(magic ``PDSP``, format version, its id) followed by records, each framed by its length
and a CRC-32 of its body::

    frame  = u32 body length | u32 crc32(body) | body
    body   = u8 flags | i64 timestamp_ms | u32 partition_key
             | u16 topic length | topic (UTF-8) | u32 key length | key
             | u32 value length | value

All integers are big-endian (as Dory's wire format). Appends only ever add whole frames,
and a failed write is truncated away, so a segment is always a valid prefix followed at
worst by one torn frame (a crash mid-write); recovery keeps the valid prefix and cuts
the rest. Every length is checked against its frame before anything is allocated, so a
corrupt or hostile file yields a truncation report, never an exception or a huge
allocation.

A segment is deleted once every message in it is settled. The segment being written is
never deleted while it is current: when all its messages are settled it is truncated
back to its header instead (no replay of settled messages after a crash, no new file
per burst at low rates), and deleted when it rotates or at ``close()``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import struct
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from pydory.errors import ConfigError, PydoryError

SPOOL_PATH_ELEMENT = "/doryConfig/spool/path"
"""The config element naming the spool directory (errors about the directory name it)."""

MAGIC = b"PDSP"
FORMAT_VERSION = 1
LOCK_FILE = "LOCK"
SEGMENT_NAME = re.compile(r"segment-([0-9]{20})\.spool", re.ASCII)

RECOVERY_CHUNK_BYTES = 1024 * 1024
"""Recovery reads a segment this much at a time (more only for a single larger frame)."""

_HEADER = struct.Struct(">4sHHQ")  # magic, version, reserved (0), segment id
HEADER_BYTES = _HEADER.size  # 16
_FRAME = struct.Struct(">II")  # body length, crc32(body)
FRAME_HEADER_BYTES = _FRAME.size  # 8
_BODY_HEAD = struct.Struct(">BqIH")  # flags, timestamp_ms, partition_key, topic length
_U32 = struct.Struct(">I")
MIN_BODY_BYTES = _BODY_HEAD.size + 2 * _U32.size  # 23: every length zero (empty topic)
MAX_BODY_BYTES = 2**32 - 1  # a u32; a frame can never claim more than the file holds
FLAG_PARTITION_KEY = 0x01
#: The value is a client's message exactly as it was read (Dory's wire bytes: topic, key,
#: value, timestamp and partition key inside), topic and key empty: what the daemon's
#: write-ahead spools, since framing bytes costs a tenth of decoding them.
FLAG_PAYLOAD = 0x02
_KNOWN_FLAGS = FLAG_PARTITION_KEY | FLAG_PAYLOAD
MAX_TOPIC_BYTES = 2**16 - 1
MAX_PARTITION_KEY = 2**32 - 1


# --- errors -----------------------------------------------------------------------------------


class SpoolError(PydoryError):
    """The disk refused a spool operation (ENOSPC, EIO, EACCES...).

    The burst that raised it is not in the spool: the caller applies its overload policy
    to it, exactly as if memory had run out.
    """


class SpoolFull(SpoolError):
    """Appending this burst would take the spool above its size cap (``max_bytes``)."""


class SpoolInUse(ConfigError):
    """Another process holds the spool directory's lock: refuse to start.

    Two daemons sharing one spool would replay and delete each other's messages, so this
    is treated like a socket path a live daemon listens on: a configuration problem.
    """

    def __init__(self, directory: str, detail: str = "") -> None:
        reason = f"Spool directory [{directory}] is locked by a running process{detail}"
        super().__init__(reason, path=SPOOL_PATH_ELEMENT)
        self.directory = directory


# --- records and their encoding ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SpoolRecord:
    """One accepted message, as much of it as is needed to produce it again.

    ``partition_key`` is Dory's PartitionKey (unsigned 32-bit), None for AnyPartition.
    """

    topic: str
    key: bytes
    value: bytes
    timestamp_ms: int
    partition_key: int | None = None
    is_payload: bool = False  # ``value`` is a client's raw message (see encode_payloads)


def encode_records(records: Sequence[SpoolRecord]) -> bytes:
    """The records as concatenated frames (length- and CRC-framed), ready for one write.

    Raises ValueError for a record that cannot be framed (topic longer than 65535 UTF-8
    bytes, key or value of 4 GiB or more, timestamp outside i64, partition key outside
    u32): those are caller bugs, since Dory's wire format cannot carry them either.
    """
    parts: list[bytes] = []
    append = parts.append
    topics: dict[str, bytes] = {}
    crc32 = zlib.crc32
    try:
        for record in records:
            topic = topics.get(record.topic)
            if topic is None:
                topic = record.topic.encode("utf-8")
                if len(topic) > MAX_TOPIC_BYTES:
                    raise ValueError(f"topic is {len(topic)} bytes: at most {MAX_TOPIC_BYTES}")
                topics[record.topic] = topic
            key, value, partition_key = record.key, record.value, record.partition_key
            if partition_key is None:
                head = _BODY_HEAD.pack(0, record.timestamp_ms, 0, len(topic))
            else:
                head = _BODY_HEAD.pack(
                    FLAG_PARTITION_KEY, record.timestamp_ms, partition_key, len(topic)
                )
            key_length = _U32.pack(len(key))
            value_length = _U32.pack(len(value))
            crc = crc32(
                value, crc32(value_length, crc32(key, crc32(key_length, crc32(topic, crc32(head)))))
            )
            body_length = len(head) + len(topic) + 8 + len(key) + len(value)
            append(_FRAME.pack(body_length, crc))
            append(head)
            append(topic)
            append(key_length)
            append(key)
            append(value_length)
            append(value)
    except struct.error as exc:
        raise ValueError(f"cannot spool record: {exc}") from None
    return b"".join(parts)


_PAYLOAD_HEAD = _BODY_HEAD.pack(FLAG_PAYLOAD, 0, 0, 0) + _U32.pack(0)  # no topic, no key
_PAYLOAD_HEAD_CRC = zlib.crc32(_PAYLOAD_HEAD)


def encode_payloads(payloads: Sequence[bytes]) -> bytes:
    """Client messages as read (opaque bytes), one frame each, ready for one write.

    The daemon's hot path: no decoding, one CRC per message over bytes already in hand.
    They come back from ``recover()`` as records with ``is_payload`` set.
    """
    parts: list[bytes] = []
    append = parts.append
    crc32, pack_length, pack_frame = zlib.crc32, _U32.pack, _FRAME.pack
    head, head_crc = _PAYLOAD_HEAD, _PAYLOAD_HEAD_CRC
    head_bytes = len(head) + _U32.size
    for payload in payloads:
        length = pack_length(len(payload))
        append(pack_frame(head_bytes + len(payload), crc32(payload, crc32(length, head_crc))))
        append(head)
        append(length)
        append(payload)
    return b"".join(parts)


@dataclass(slots=True)
class _FrameDecoder:
    """Decodes frames from ``data`` one at a time, and remembers where and why it stopped.

    After ``records()`` is exhausted: ``offset`` is the end of the last good frame;
    ``problem`` says why decoding stopped early on corrupt data (None otherwise);
    ``needed`` > 0 means the data ends inside a frame that needs that many bytes from
    ``offset`` (more data may complete it: the caller decides whether it is a torn tail).
    """

    data: bytes
    offset: int = 0
    problem: str | None = None
    needed: int = 0
    topics: dict[bytes, str] = field(default_factory=dict)

    def records(self) -> Iterator[SpoolRecord]:
        data = self.data
        view = memoryview(data)
        end = len(data)
        offset = self.offset
        topics = self.topics
        unpack_frame = _FRAME.unpack_from
        crc32 = zlib.crc32
        try:
            while offset < end:
                if end - offset < FRAME_HEADER_BYTES:
                    self.needed = FRAME_HEADER_BYTES
                    return
                length, crc = unpack_frame(data, offset)
                if length < MIN_BODY_BYTES:
                    self.problem = f"bad frame length {length} at offset {offset}"
                    return
                body = offset + FRAME_HEADER_BYTES
                frame_end = body + length
                if frame_end > end:
                    self.needed = FRAME_HEADER_BYTES + length
                    return
                if crc32(view[body:frame_end]) != crc:
                    self.problem = f"bad CRC at offset {offset}"
                    return
                record = _record_in(data, body, frame_end, topics)
                if record is None:
                    self.problem = f"inconsistent lengths in the frame at offset {offset}"
                    return
                offset = frame_end
                self.offset = offset
                yield record
        finally:
            self.offset = offset
            view.release()


def _record_in(data: bytes, start: int, end: int, topics: dict[bytes, str]) -> SpoolRecord | None:
    """The record whose body is ``data[start:end]``, or None if its inner lengths or fields
    are wrong (a CRC-valid frame that this code did not write)."""
    flags, timestamp_ms, partition_key, topic_length = _BODY_HEAD.unpack_from(data, start)
    if flags & ~_KNOWN_FLAGS:
        return None
    position = start + _BODY_HEAD.size
    if position + topic_length + 4 > end:
        return None
    topic_bytes = data[position : position + topic_length]
    position += topic_length
    (key_length,) = _U32.unpack_from(data, position)
    position += 4
    if position + key_length + 4 > end:
        return None
    key = data[position : position + key_length]
    position += key_length
    (value_length,) = _U32.unpack_from(data, position)
    position += 4
    if position + value_length != end:
        return None
    if flags & FLAG_PAYLOAD:
        if topic_length or key_length or flags & FLAG_PARTITION_KEY:
            return None
        return SpoolRecord("", b"", data[position:end], 0, None, is_payload=True)
    topic = topics.get(topic_bytes)
    if topic is None:
        try:
            topic = topic_bytes.decode("utf-8")
        except UnicodeDecodeError:
            return None
        if len(topics) < 1024:  # a cache of the few topics there are, bounded
            topics[topic_bytes] = topic
    return SpoolRecord(
        topic,
        key,
        data[position:end],
        timestamp_ms,
        partition_key if flags & FLAG_PARTITION_KEY else None,
    )


def decode_records(data: bytes) -> tuple[list[SpoolRecord], int, str | None]:
    """The records framed in ``data``, how many bytes they take (the valid prefix), and
    why decoding stopped before the end (None when all of ``data`` was whole records).

    Never raises for any input: corrupt or cut data is reported, not an exception.
    """
    decoder = _FrameDecoder(bytes(data))
    records = list(decoder.records())
    reason = decoder.problem
    if reason is None and decoder.needed:
        reason = (
            f"incomplete frame at offset {decoder.offset}: needs {decoder.needed} bytes, "
            f"{len(decoder.data) - decoder.offset} left"
        )
    return records, decoder.offset, reason


# --- the spool --------------------------------------------------------------------------------


@dataclass
class RecoveryReport:
    """What ``Spool.recover()`` found. Corrupt data is repaired and counted, never raised.

    ``segments``: segment files read; ``records``: records recovered from them;
    ``repaired_segments``: segments cut at their last good record (torn tail, bad CRC);
    ``removed_segments``: files removed because they held no header (empty, cut inside
    the header, or not a spool file); ``truncated_bytes``: bytes cut or removed;
    ``problems``: one line per file about what was wrong.
    """

    segments: int = 0
    records: int = 0
    repaired_segments: int = 0
    truncated_bytes: int = 0
    problems: list[str] = field(default_factory=list)
    removed_segments: int = 0


@dataclass(slots=True)
class _Segment:
    """A segment file this process writes or wrote: its size and unsettled messages."""

    id: int
    path: str
    size: int
    outstanding: int = 0
    fd: int | None = None  # open while it is the current segment


class Spool:
    """A directory of append-only segment files holding accepted, unsettled messages.

    ``fsync_interval_ms``: None = never fsync (the OS writes back: survives SIGKILL, not
    a power cut); 0 = after every append; N = when N ms have passed since the last fsync,
    checked on append and by ``maybe_fsync()`` (call it from a timer).

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
    ) -> None:
        if segment_bytes < 1 or max_bytes < 1:
            raise ValueError("segment_bytes and max_bytes must be positive")
        if fsync_interval_ms is not None and fsync_interval_ms < 0:
            raise ValueError("fsync_interval_ms must be None or >= 0")
        self.directory = directory
        self.segment_bytes = segment_bytes
        self.max_bytes = max_bytes
        self.fsync_interval_ms = fsync_interval_ms
        self._clock = clock
        self._lock_fd: int | None = None
        self._found: list[tuple[int, str]] = []  # segments present at open(), oldest first
        self._recovered: list[tuple[int, str]] = []  # fully read by recover(): to delete
        self._found_bytes = 0  # bytes of the files in _found and _recovered
        self._segments: dict[int, _Segment] = {}  # this run's segments, by id
        self._current: _Segment | None = None
        self._next_id = 1
        self._live_bytes = 0  # bytes of this run's segment files
        self._outstanding = 0
        self._dirty = False  # written since the last fsync
        self._last_fsync = clock()
        self._report = RecoveryReport()
        #: ``(start, end)`` file offsets of the last append's frames in its segment.
        self.last_append = (0, 0)
        self.appended_total = 0
        """Messages appended since open()."""
        self.fsyncs_total = 0
        """fsync calls made (segment data and the directory)."""
        self.errors_total = 0
        """Disk errors met (each raised as SpoolError, or counted when not raisable)."""
        self.full_total = 0
        """Bursts refused because the spool was at its size cap."""

    # --- lifecycle ----------------------------------------------------------------------------

    def open(self) -> None:
        """Create the directory (mode 0700), lock it, and note the segments already there.

        Raises SpoolInUse if another process holds the lock, SpoolError if the directory
        cannot be created or read. Writing starts with the first ``append()``.
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
            holder = _read_pid(lock_fd)
            os.close(lock_fd)
            raise SpoolInUse(self.directory, f" (pid {holder})" if holder else "") from None
        except OSError as exc:
            os.close(lock_fd)
            raise self._error(f"cannot lock spool directory [{self.directory}]", exc) from exc
        try:
            # The holder's pid, for the message a second daemon prints (advisory only).
            os.ftruncate(lock_fd, 0)
            os.pwrite(lock_fd, f"{os.getpid()}\n".encode(), 0)
            found = self._scan()
        except OSError as exc:
            os.close(lock_fd)
            raise self._error(f"cannot read spool directory [{self.directory}]", exc) from exc
        self._lock_fd = lock_fd
        self._found = found
        self._next_id = found[-1][0] + 1 if found else 1

    def _scan(self) -> list[tuple[int, str]]:
        found = []
        for name in os.listdir(self.directory):
            match = SEGMENT_NAME.fullmatch(name)
            if match is None:
                continue
            path = os.path.join(self.directory, name)
            try:
                size = os.stat(path).st_size
            except FileNotFoundError:
                continue
            found.append((int(match.group(1)), path))
            self._found_bytes += size
        found.sort()
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
        if current is not None:
            try:
                if self._dirty and self.fsync_interval_ms is not None:
                    self._fsync(current)
            except SpoolError as exc:
                failure = exc
            self._retire(current)
        for segment in list(self._segments.values()):
            if segment.outstanding == 0:
                try:
                    self._delete(segment)
                except SpoolError as exc:
                    failure = failure or exc
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

    def recover(self) -> Iterator[SpoolRecord]:
        """Every record of the segments present at ``open()``: oldest segment first, in
        write order.

        A segment that ends in a torn frame or holds a corrupt one (bad CRC, impossible
        lengths) is truncated at its last good record; a file without a valid header is
        removed; both are counted in ``recovery_report``, never raised. Reads a segment
        ``RECOVERY_CHUNK_BYTES`` at a time, so memory stays bounded whatever its size.
        A segment fully read is pending replay: ``finish_recovery()`` deletes it. Raises
        SpoolError only when the disk fails a read or a repair.
        """
        self._require_open()
        while self._found:
            segment_id, path = self._found[0]
            yield from self._recover_segment(segment_id, path)
            self._found.pop(0)

    def _recover_segment(self, segment_id: int, path: str) -> Iterator[SpoolRecord]:
        report = self._report
        name = os.path.basename(path)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise self._error(f"cannot open spool segment [{path}]", exc) from exc
        try:
            size = os.fstat(fd).st_size
            header = _read_exactly(fd, HEADER_BYTES, 0)
            problem = _header_problem(header)
            if problem is not None and problem[1]:  # not a usable spool file: remove it
                report.problems.append(f"{name}: {problem[0]}: removed")
                report.removed_segments += 1
                report.truncated_bytes += size
                os.close(fd)
                fd = -1
                os.unlink(path)
                self._found_bytes -= size
                return
            if problem is not None:  # a newer format: leave it for a newer pydory
                report.problems.append(f"{name}: {problem[0]}: left in place")
                self._found_bytes -= size
                return
            report.segments += 1
            header_id = _HEADER.unpack(header)[3]
            if header_id != segment_id:  # renamed by hand, most likely: records still good
                report.problems.append(f"{name}: its header names segment {header_id}")
            decoder_topics: dict[bytes, str] = {}
            start = HEADER_BYTES  # file offset of buffer[0]
            buffer = b""
            wanted = RECOVERY_CHUNK_BYTES
            while True:
                remaining = size - start - len(buffer)
                if remaining > 0:
                    data = _read_exactly(fd, min(wanted, remaining), start + len(buffer))
                    if not data:  # shrunk while being read: its end is here
                        size = start + len(buffer)
                    buffer += data
                decoder = _FrameDecoder(buffer, topics=decoder_topics)
                for record in decoder.records():
                    report.records += 1
                    yield record
                start += decoder.offset
                buffer = buffer[decoder.offset :]
                at_end = start + len(buffer) >= size
                reason = decoder.problem
                if reason is None and decoder.needed:
                    if not at_end:
                        wanted = max(RECOVERY_CHUNK_BYTES, decoder.needed - len(buffer))
                        continue
                    reason = (
                        f"torn frame at offset {start}: needs {decoder.needed} bytes, "
                        f"{size - start} left"
                    )
                if reason is None and at_end:
                    break
                if reason is not None:
                    os.ftruncate(fd, start)
                    if self.fsync_interval_ms is not None:
                        os.fsync(fd)
                        self.fsyncs_total += 1
                    report.repaired_segments += 1
                    report.truncated_bytes += size - start
                    report.problems.append(
                        f"{name}: {reason}: truncated to {start} bytes ({size - start} cut)"
                    )
                    self._found_bytes -= size - start
                    break
                wanted = RECOVERY_CHUNK_BYTES
        except OSError as exc:
            raise self._error(f"cannot recover spool segment [{path}]", exc) from exc
        finally:
            if fd >= 0:
                os.close(fd)
        self._recovered.append((segment_id, path))

    @property
    def recovery_report(self) -> RecoveryReport:
        """What ``recover()`` found so far."""
        return self._report

    def finish_recovery(self) -> None:
        """Delete the segments ``recover()`` read to the end: their records are now in
        this run's segments (the caller appended them). Segments not read stay."""
        self._require_open()
        while self._recovered:
            path = self._recovered[0][1]
            try:
                size = os.stat(path).st_size
                os.unlink(path)
            except FileNotFoundError:
                size = 0
            except OSError as exc:
                raise self._error(f"cannot delete recovered segment [{path}]", exc) from exc
            self._found_bytes -= size
            self._recovered.pop(0)

    # --- appending and settling ---------------------------------------------------------------

    def append(self, records: Sequence[SpoolRecord]) -> int:
        """Write a burst of records to the current segment in one ``os.write``; return the
        id of that segment (for ``settle``).

        Rotates first when the current segment has reached ``segment_bytes``. Raises
        SpoolFull (nothing written) if the burst would take this run's segments above
        ``max_bytes``; SpoolError if the disk fails, after cutting any partial write away
        so the segment stays a valid prefix. fsyncs as the policy says.
        """
        return self._append_encoded(encode_records(records), len(records))

    def append_payloads(self, payloads: Sequence[bytes]) -> int:
        """:meth:`append` for client messages as read (see :func:`encode_payloads`)."""
        return self._append_encoded(encode_payloads(payloads), len(payloads))

    def _append_encoded(self, data: bytes, count: int) -> int:
        self._require_open()
        current = self._current
        if current is not None and current.size >= self.segment_bytes:
            self._retire(current)
            if current.outstanding == 0:
                self._delete(current)
            current = None
        new_bytes = len(data) + (HEADER_BYTES if current is None else 0)
        if self._live_bytes + new_bytes > self.max_bytes:
            self.full_total += 1
            raise SpoolFull(
                f"spool [{self.directory}] is full: {self._live_bytes} bytes + a burst of "
                f"{new_bytes} > maxSize {self.max_bytes}"
            )
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
        current.size += written
        self._live_bytes += written
        self._dirty = True
        if self.fsync_interval_ms == 0 or (
            self.fsync_interval_ms is not None
            and (self._clock() - self._last_fsync) * 1000 >= self.fsync_interval_ms
        ):
            try:
                self._fsync(current)
            except SpoolError:
                # Whether the burst reached the disk is unknown: it is not spooled. After
                # a failed fsync the kernel may have dropped other dirty pages of the file
                # and a later fsync may succeed anyway: write no more to it.
                self._cut_back(current, before)
                self._retire(current)
                raise
        current.outstanding += count
        self._outstanding += count
        self.appended_total += count
        self.last_append = (before, before + written)
        return current.id

    def read_payloads(self, segment_id: int, start: int, end: int) -> list[bytes]:
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
                data = _read_exactly(fd, end - start, start)
            finally:
                os.close(fd)
        except OSError as exc:
            raise self._error(f"cannot read spool segment [{segment.path}]", exc) from exc
        records, consumed, problem = decode_records(data)
        if problem is not None or consumed != len(data) or not all(r.is_payload for r in records):
            raise SpoolError(
                f"spool segment {segment.path} at [{start}, {end}): {problem or 'not payloads'}"
            )
        return [record.value for record in records]

    def maybe_fsync(self) -> bool:
        """fsync the current segment if the interval policy says it is time (written to
        since the last fsync, which was at least ``fsync_interval_ms`` ago). True if it
        did. Call it from a timer so a quiet spool is still synced."""
        if self._lock_fd is None or self._current is None or not self._dirty:
            return False
        if not self.fsync_interval_ms:  # never, or always (then nothing is ever dirty)
            return False
        if (self._clock() - self._last_fsync) * 1000 < self.fsync_interval_ms:
            return False
        current = self._current
        try:
            self._fsync(current)
        except SpoolError:
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

    # --- sensors ------------------------------------------------------------------------------

    @property
    def bytes_on_disk(self) -> int:
        """Bytes of every segment file: this run's and those awaiting replay."""
        return self._live_bytes + self._found_bytes

    @property
    def segments(self) -> int:
        """Segment files on disk: this run's and those awaiting replay."""
        return len(self._segments) + len(self._found) + len(self._recovered)

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
        self.errors_total += 1
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
            header = _HEADER.pack(MAGIC, FORMAT_VERSION, 0, segment_id)
            if os.write(fd, header) != len(header):  # only a full disk writes short here
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # noqa: TRY301
            if self.fsync_interval_ms is not None:
                # The new name must survive a power cut too, or its records vanish with it.
                os.fsync(fd)
                _fsync_directory(self.directory)
                self.fsyncs_total += 2
                self._last_fsync = self._clock()
        except OSError as exc:
            os.close(fd)
            with contextlib.suppress(OSError):  # else the next recovery removes it
                os.unlink(path)
            raise self._error(f"cannot create spool segment [{path}]", exc) from exc
        segment = _Segment(segment_id, path, HEADER_BYTES, fd=fd)
        self._segments[segment_id] = segment
        self._live_bytes += HEADER_BYTES
        self._current = segment
        self._dirty = False
        return segment

    def _fsync(self, segment: _Segment) -> None:
        assert segment.fd is not None
        try:
            os.fdatasync(segment.fd)
        except OSError as exc:
            raise self._error(f"cannot fsync spool segment [{segment.path}]", exc) from exc
        self.fsyncs_total += 1
        self._dirty = False
        self._last_fsync = self._clock()

    def _cut_back(self, segment: _Segment, size: int) -> None:
        """Truncate ``segment`` back to ``size`` after a failed write or fsync, so it stays
        a valid prefix; if even that fails, stop writing to it (recovery cuts the tail)."""
        assert segment.fd is not None
        try:
            os.ftruncate(segment.fd, size)
            actual = size
        except OSError:
            self.errors_total += 1
            try:
                actual = os.fstat(segment.fd).st_size
            except OSError:
                actual = segment.size
            self._retire(segment)
        self._live_bytes += actual - segment.size
        segment.size = actual

    def _retire(self, segment: _Segment) -> None:
        """Stop writing to ``segment`` (it stays until its messages are settled)."""
        if segment.fd is not None:
            fd, segment.fd = segment.fd, None
            if self._dirty and self.fsync_interval_ms is not None:
                try:
                    os.fdatasync(fd)
                    self.fsyncs_total += 1
                except OSError:
                    self.errors_total += 1
                self._dirty = False
                self._last_fsync = self._clock()
            os.close(fd)
        if self._current is segment:
            self._current = None

    def _reset(self, segment: _Segment) -> None:
        """Cut the current segment back to its header: all its messages are settled."""
        assert segment.fd is not None
        if segment.size == HEADER_BYTES:
            return
        try:
            os.ftruncate(segment.fd, HEADER_BYTES)
        except OSError as exc:
            self._retire(segment)
            self._delete(segment)
            raise self._error(f"cannot truncate spool segment [{segment.path}]", exc) from exc
        self._live_bytes -= segment.size - HEADER_BYTES
        segment.size = HEADER_BYTES

    def _delete(self, segment: _Segment) -> None:
        if segment.fd is not None:
            self._retire(segment)
        try:
            os.unlink(segment.path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise self._error(f"cannot delete spool segment [{segment.path}]", exc) from exc
        del self._segments[segment.id]
        self._live_bytes -= segment.size


def _header_problem(header: bytes) -> tuple[str, bool] | None:
    """What is wrong with a segment's header, and whether the file is to be removed
    (True: not a spool file, or cut inside its header); None if it is good."""
    if len(header) == 0:
        return "empty file", True
    if len(header) < HEADER_BYTES:
        return f"cut inside its header ({len(header)} bytes)", True
    magic, version, _reserved, _segment_id = _HEADER.unpack(header)
    if magic != MAGIC:
        return "not a spool segment (bad magic)", True
    if version != FORMAT_VERSION:
        return f"format version {version} (this pydory reads {FORMAT_VERSION})", False
    return None


def _read_exactly(fd: int, count: int, offset: int) -> bytes:
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


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _fsync_directory(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
