"""The spool's on-disk format: how records are framed in a segment file, and read back.

Pure: no I/O, no state. A segment is a header (magic ``PDSP``, format version, its id)
followed by records, each framed by its length and a CRC-32 of its body::

    frame  = u32 body length | u32 crc32(body) | body
    body   = u8 flags | i64 timestamp_ms | u32 partition_key
             | u16 topic length | topic (UTF-8) | u32 key length | key
             | u32 value length | value

All integers are big-endian (as Dory's wire format). Every length is checked against its
frame before anything is allocated, so a corrupt or hostile file yields a truncation
report, never an exception or a huge allocation.

Rule: this is the only module that knows the byte layout of a segment file.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

MAGIC = b"PDSP"
FORMAT_VERSION = 1
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
class FrameDecoder:
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
    key_end = position + key_length
    if key_end + 4 > end:
        return None
    key = data[position:key_end]
    (value_length,) = _U32.unpack_from(data, key_end)
    position = key_end + 4
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
    decoder = FrameDecoder(bytes(data))
    records = list(decoder.records())
    reason = decoder.problem
    if reason is None and decoder.needed:
        reason = (
            f"incomplete frame at offset {decoder.offset}: needs {decoder.needed} bytes, "
            f"{len(decoder.data) - decoder.offset} left"
        )
    return records, decoder.offset, reason


# --- the segment header -----------------------------------------------------------------------


def encode_header(segment_id: int) -> bytes:
    """A new segment file's header: the magic, this format's version and its id."""
    return _HEADER.pack(MAGIC, FORMAT_VERSION, 0, segment_id)


def header_problem(header: bytes) -> tuple[str, bool] | None:
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


def header_segment_id(header: bytes) -> int:
    """The segment id a good header names (see :func:`header_problem`)."""
    segment_id: int = _HEADER.unpack(header)[3]
    return segment_id
