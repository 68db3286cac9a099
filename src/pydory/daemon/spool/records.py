"""The spool's on-disk format: how records are framed in a segment file, and read back.

Pure: no I/O, no state. A segment is a header (magic ``PDSP``, format version, its id)
followed by frames, one per record. Format version 3 (written since issue 24)::

    header = "PDSP" | u16 version (3) | u16 reserved (0) | u64 segment id
             | u64 incarnation | u32 stream | u32 crc32(the 28 bytes before)  32 bytes
    frame  = sync marker FE D5 0C A7 | u32 sequence | u32 body length
             | u32 crc32(body) XOR sequence | body
    body   = u8 flags | i64 timestamp_ms | u32 partition_key
             | u16 topic length | topic (UTF-8) | u32 key length | key
             | u32 value length | value

Version 3 frames are version 2's; the header adds what names each message durably
(:mod:`pydory.daemon.spool.identity`): the daemon run that wrote the segment
(``incarnation``, random) and its ``stream``, a number that run gives the segment each
time it starts numbering frames from 0 (when it is created, and when it is cut back to
its header). Frame ``n`` of a segment is message ``(incarnation, stream, n)``, unless it
carries ``FLAG_ORIGIN``: a message replayed from an older segment, whose key field then
holds the identity it was first given (16 bytes: incarnation, stream, sequence). A header
whose CRC fails still has readable frames, but no trusted identity: recovery replays
them under fresh identities (possible duplicates, never another message's name).
Version 2's header is the first 16 bytes of version 3's (no identity).

All integers are big-endian (as Dory's wire format). ``sequence`` counts the frames of a
segment from 0 (a segment cut back to its header starts again at 0). The sequence is
XORed into the CRC, so a damaged sequence fails the check as surely as a damaged body
(at no cost: version 1 paid the same CRC); a damaged length puts the CRC over the wrong
bytes, and a damaged marker is not a marker. ``0xFE`` never occurs in UTF-8, so the
marker is rare in text.

Why the marker and the sequence: one bad byte must not lose the rest of a segment.
Recovery (:mod:`pydory.daemon.spool.recovery`) finds the next good frame after a damaged
one by searching for the marker and checking the candidate's CRC (and that its sequence
is one the damaged bytes could have held: at most one frame per ``MIN_FRAME_BYTES``),
and replays from there. What it counts as lost, in messages:

- a good frame follows the damage: its sequence minus the one due. Exact.
- the damage reaches the end of the segment: the last frame header seen in the damage
  (a marker, or the sequence due at the frame's own place) names the last frame lost,
  so its sequence minus the one due, plus one. Exact when that frame ends at the end of
  the file (or is one whole frame whose length field is the damaged part); otherwise
  frames after it lost their headers too, and the count is a lower bound. With no
  readable header at all: one, a lower bound (exact for one whole frame).
- the file ends inside a frame whose header is intact (a crash mid-write): a torn tail,
  never counted (cut; those bytes were never admitted), and so are fewer bytes than any
  frame can be (``MIN_FRAME_BYTES``).

Version 1 (pydory before issue 20) has no marker and no sequence (``frame = u32 body
length | u32 crc32(body) | body``); it is still read, so a spool left by an older pydory
replays. Its resynchronisation looks for the next frame of a client message as read (the
only kind a daemon writes: the payload body below, found by its fixed first 19 bytes).
It counts the frames whose length fields chain from the damage to that frame (exact);
when they do not chain, the frame headers it can still see in the damage, at least one
(a lower bound).

Every length is checked against its frame before anything is allocated, so a corrupt or
hostile file yields a report, never an exception or a huge allocation.

Rule: the byte layout of a segment file is defined here, and read only here. One other
code writes it: ``_cwire.c``'s ``encode_payload_frames`` (``pydory.hotpath.payload_frames``)
and ``write_payload_frames`` (the same frames written to a file in the same call, for
``spool/segments.py``) write the frames of :func:`encode_payloads_reference` byte for byte,
from the marker and the payload head given here (``PAYLOAD_HEAD``, ``PAYLOAD_HEAD_CRC``,
``SYNC_MARKER``; ``tests/test_cwire.py`` holds them equal). A replayed
frame's origin is ``ORIGIN_BYTES`` opaque here: what they hold, a message's first identity,
is :mod:`pydory.daemon.spool.identity`'s (``pack_origin``, ``unpack_origin``).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from pydory.hotpath import payload_frames

MAGIC = b"PDSP"
FORMAT_VERSION = 3
READABLE_VERSIONS = (1, 2, 3)
_HEADER = struct.Struct(">4sHHQ")  # magic, version, reserved (0), segment id
HEADER_BYTES_V2 = _HEADER.size  # 16: versions 1 and 2
_IDENTITY = struct.Struct(">QII")  # version 3: incarnation, stream, crc32(header before it)
HEADER_BYTES = HEADER_BYTES_V2 + _IDENTITY.size  # 32: version 3
SYNC_MARKER = b"\xfe\xd5\x0c\xa7"
_FRAME = struct.Struct(">4sIII")  # sync marker, sequence, body length, crc32(body) ^ sequence
FRAME_HEADER_BYTES = _FRAME.size  # 16
_U32 = struct.Struct(">I")
_FRAME_V1 = struct.Struct(">II")  # version 1: body length, crc32(body)
FRAME_HEADER_BYTES_V1 = _FRAME_V1.size  # 8
_BODY_HEAD = struct.Struct(">BqIH")  # flags, timestamp_ms, partition_key, topic length
MIN_BODY_BYTES = _BODY_HEAD.size + 2 * _U32.size  # 23: every length zero (empty topic)
MIN_FRAME_BYTES = FRAME_HEADER_BYTES + MIN_BODY_BYTES  # 39: no frame is shorter
MAX_BODY_BYTES = 2**32 - 1  # a u32; a frame can never claim more than the file holds
SEQUENCES_PER_SEGMENT = 2**32  # a u32; the spool rotates a segment before it runs out
FLAG_PARTITION_KEY = 0x01
#: The value is a client's message exactly as it was read (Dory's wire bytes: topic, key,
#: value, timestamp and partition key inside), topic and key empty: what the daemon's
#: write-ahead spools, since framing bytes costs a tenth of decoding them.
FLAG_PAYLOAD = 0x02
#: A payload frame replayed from an older segment: its key field holds the identity the
#: message was first given (``ORIGIN_BYTES``), which it keeps (version 3).
FLAG_ORIGIN = 0x04
ORIGIN_BYTES = 16
_KNOWN_FLAGS = FLAG_PARTITION_KEY | FLAG_PAYLOAD | FLAG_ORIGIN
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


def encode_records(records: Sequence[SpoolRecord], first_sequence: int = 0) -> bytes:
    """The records as concatenated frames numbered from ``first_sequence``, ready for one
    write.

    Raises ValueError for a record that cannot be framed (topic longer than 65535 UTF-8
    bytes, key or value of 4 GiB or more, timestamp outside i64, partition key outside
    u32): those are caller bugs, since Dory's wire format cannot carry them either.
    """
    parts: list[bytes] = []
    append = parts.append
    topics: dict[str, bytes] = {}
    crc32 = zlib.crc32
    sequence = first_sequence
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
            append(_FRAME.pack(SYNC_MARKER, sequence, body_length, crc ^ sequence))
            append(head)
            append(topic)
            append(key_length)
            append(key)
            append(value_length)
            append(value)
            sequence += 1
    except struct.error as exc:
        raise ValueError(f"cannot spool record: {exc}") from None
    return b"".join(parts)


_PAYLOAD_HEAD = _BODY_HEAD.pack(FLAG_PAYLOAD, 0, 0, 0) + _U32.pack(0)  # no topic, no key
_PAYLOAD_HEAD_CRC = zlib.crc32(_PAYLOAD_HEAD)
#: A client message's frame body before its value's length (flags, no topic, no key), and
#: its CRC: what the compiled writers put before each payload.
PAYLOAD_HEAD, PAYLOAD_HEAD_CRC = _PAYLOAD_HEAD, _PAYLOAD_HEAD_CRC


def encode_payloads(
    payloads: Sequence[bytes],
    first_sequence: int = 0,
    origins: Sequence[bytes | None] | None = None,
) -> bytes:
    """Client messages as read (opaque bytes), one frame each numbered from
    ``first_sequence``, ready for one write. ``origins`` (replayed messages): the identity
    each was first given (``ORIGIN_BYTES`` each, None for none), kept in its frame
    (``FLAG_ORIGIN``).

    The daemon's hot path: no decoding, one CRC per message over bytes already in hand,
    and as many ``pack`` calls as version 1 made (the marker and the sequence go into
    the pack of the frame header that version 1 made anyway).
    They come back from ``recover()`` as records with ``is_payload`` set.
    """
    if origins is not None:
        return _encode_replayed(payloads, first_sequence, origins)
    if payload_frames is not None:  # pydory.hotpath: the same bytes, in one C call
        return payload_frames(
            payloads, first_sequence, _PAYLOAD_HEAD, _PAYLOAD_HEAD_CRC, SYNC_MARKER
        )
    return encode_payloads_reference(payloads, first_sequence)


def encode_payloads_reference(payloads: Sequence[bytes], first_sequence: int = 0) -> bytes:
    """:func:`encode_payloads` without origins, in Python: the reference."""
    parts: list[bytes] = []
    append = parts.append
    crc32, pack_length, pack_frame = zlib.crc32, _U32.pack, _FRAME.pack
    head, head_crc, marker = _PAYLOAD_HEAD, _PAYLOAD_HEAD_CRC, SYNC_MARKER
    head_bytes = len(head) + _U32.size
    sequence = first_sequence
    for payload in payloads:
        length = pack_length(len(payload))
        crc = crc32(payload, crc32(length, head_crc))
        append(pack_frame(marker, sequence, head_bytes + len(payload), crc ^ sequence))
        append(head)
        append(length)
        append(payload)
        sequence += 1
    return b"".join(parts)


def _encode_replayed(
    payloads: Sequence[bytes], first_sequence: int, origins: Sequence[bytes | None]
) -> bytes:
    """:func:`encode_payloads` with each message's first identity in its key field."""
    if len(origins) != len(payloads) or any(o and len(o) != ORIGIN_BYTES for o in origins):
        raise ValueError(f"one origin of {ORIGIN_BYTES} bytes (or None) per payload expected")
    replayed = _BODY_HEAD.pack(FLAG_PAYLOAD | FLAG_ORIGIN, 0, 0, 0) + _U32.pack(ORIGIN_BYTES)
    parts: list[bytes] = []
    numbered = enumerate(zip(payloads, origins, strict=True), first_sequence)
    for sequence, (payload, origin) in numbered:
        head = _PAYLOAD_HEAD if origin is None else replayed + origin
        body = b"".join((head, _U32.pack(len(payload)), payload))
        crc = zlib.crc32(body)
        parts.append(_FRAME.pack(SYNC_MARKER, sequence, len(body), crc ^ sequence))
        parts.append(body)
    return b"".join(parts)


# --- decoding good frames in order ------------------------------------------------------------


@dataclass(slots=True)
class FrameDecoder:
    """Decodes frames from ``data`` one at a time, and remembers where and why it stopped.

    ``version`` is the segment's format. In version 2, ``sequence`` is the sequence the
    next frame must carry (None: whatever the first one carries); it follows the frames.

    After ``records()`` is exhausted: ``offset`` is the end of the last good frame;
    ``problem`` says why decoding stopped early on corrupt data (None otherwise);
    ``needed`` > 0 means the data ends inside a frame that needs that many bytes from
    ``offset`` (more data may complete it: the caller decides whether it is a torn tail).
    """

    data: bytes
    offset: int = 0
    version: int = FORMAT_VERSION
    sequence: int | None = 0
    problem: str | None = None
    needed: int = 0
    topics: dict[bytes, str] = field(default_factory=dict)
    base: int = 0  # the file offset of data[0], for the offsets ``problem`` names

    def _where(self, offset: int) -> str:
        return f"offset {self.base + offset}"

    def records(self) -> Iterator[SpoolRecord]:
        version_1 = self.version == 1
        header_bytes = FRAME_HEADER_BYTES_V1 if version_1 else FRAME_HEADER_BYTES
        read_header = self._header_v1 if version_1 else self._header_v2
        data = self.data
        view = memoryview(data)
        end = len(data)
        offset = self.offset
        topics = self.topics
        crc32 = zlib.crc32
        try:
            while offset < end:
                if end - offset < header_bytes:
                    self.needed = header_bytes
                    return
                header = read_header(data, offset)
                if header is None:
                    return
                length, crc, sequence = header
                if length < MIN_BODY_BYTES:
                    self.problem = f"bad frame length {length} at {self._where(offset)}"
                    return
                body = offset + header_bytes
                frame_end = body + length
                if frame_end > end:
                    self.needed = header_bytes + length
                    return
                if crc32(view[body:frame_end]) != crc:
                    self.problem = f"bad CRC at {self._where(offset)}"
                    return
                record = _record_in(data, body, frame_end, topics)
                if record is None:
                    self.problem = f"inconsistent lengths in the frame at {self._where(offset)}"
                    return
                offset = frame_end
                self.offset = offset
                if sequence is not None:
                    self.sequence = sequence + 1
                yield record
        finally:
            self.offset = offset
            view.release()

    def _header_v2(self, data: bytes, offset: int) -> tuple[int, int, int | None] | None:
        """A frame header's body length, the CRC its body must have, and its number; None
        (the problem said) if it has no marker or is not the frame due."""
        sync, sequence, length, crc = _FRAME.unpack_from(data, offset)
        if sync != SYNC_MARKER:
            self.problem = f"no frame marker at {self._where(offset)}"
            return None
        expected = self.sequence
        if expected is not None and sequence != expected:
            self.problem = f"frame {sequence} at {self._where(offset)} where {expected} was due"
            return None
        return length, crc ^ sequence, sequence

    def _header_v1(self, data: bytes, offset: int) -> tuple[int, int, int | None]:
        """Version 1's frame header: no marker, no number."""
        length, crc = _FRAME_V1.unpack_from(data, offset)
        return length, crc, None


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
        origin_length = ORIGIN_BYTES if flags & FLAG_ORIGIN else 0
        if topic_length or key_length != origin_length or flags & FLAG_PARTITION_KEY:
            return None
        # A replayed message's key field is its first identity (FLAG_ORIGIN).
        return SpoolRecord("", key, data[position:end], 0, None, is_payload=True)
    if flags & FLAG_ORIGIN:
        return None
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


def decode_records(
    data: bytes, first_sequence: int | None = None, version: int = FORMAT_VERSION
) -> tuple[list[SpoolRecord], int, str | None]:
    """The records framed in ``data``, how many bytes they take (the valid prefix), and
    why decoding stopped before the end (None when all of ``data`` was whole records).

    ``first_sequence``: the sequence the first frame must carry (None: any; the frames
    after it must follow on). Never raises for any input: corrupt or cut data is
    reported, not an exception.
    """
    decoder = FrameDecoder(bytes(data), version=version, sequence=first_sequence)
    records = list(decoder.records())
    reason = decoder.problem
    if reason is None and decoder.needed:
        reason = (
            f"incomplete frame at offset {decoder.offset}: needs {decoder.needed} bytes, "
            f"{len(decoder.data) - decoder.offset} left"
        )
    return records, decoder.offset, reason


# --- finding good frames again after damage ---------------------------------------------------


class FrameCheck(NamedTuple):
    """What the bytes at one offset say about a frame there (:func:`check_frame`).

    ``end``: where the frame ends by its length field (-1: fewer bytes than a frame
    header, or a length shorter than any body); it may lie beyond the data.
    ``sequence``: version 2, the sequence its header names (None in version 1).
    ``record``: the record, if the frame is whole and good (marker, CRC, inner lengths).
    ``marked``: version 2, whether it starts with the sync marker (True in version 1).
    """

    end: int
    sequence: int | None
    record: SpoolRecord | None
    marked: bool = True


def check_frame(data: bytes, offset: int, version: int, topics: dict[bytes, str]) -> FrameCheck:
    """Read the frame header at ``offset`` and, if its frame is within ``data``, check it
    whole. Never raises. Used only on the slow path, after damage was found."""
    header_bytes = FRAME_HEADER_BYTES if version != 1 else FRAME_HEADER_BYTES_V1
    if len(data) - offset < header_bytes:
        return FrameCheck(-1, None, None, marked=False)
    if version == 1:
        length, crc = _FRAME_V1.unpack_from(data, offset)
        sequence: int | None = None
        marker_ok = True
    else:
        sync, sequence, length, crc = _FRAME.unpack_from(data, offset)
        marker_ok = sync == SYNC_MARKER
    if length < MIN_BODY_BYTES:
        return FrameCheck(-1, sequence, None, marker_ok)
    end = offset + header_bytes + length
    if not marker_ok or end > len(data) or not _crc_matches(data, offset, end, sequence, crc):
        return FrameCheck(end, sequence, None, marker_ok)
    return FrameCheck(
        end, sequence, _record_in(data, offset + header_bytes, end, topics), marker_ok
    )


def _crc_matches(data: bytes, offset: int, end: int, sequence: int | None, crc: int) -> bool:
    """Whether ``data[offset:end]`` is a frame with checksum ``crc``, whatever its length
    field says (``sequence`` None: version 1)."""
    with memoryview(data) as view:
        if sequence is None:
            return zlib.crc32(view[offset + FRAME_HEADER_BYTES_V1 : end]) == crc
        return zlib.crc32(view[offset + FRAME_HEADER_BYTES : end]) ^ sequence == crc


def whole_frame_with_a_bad_length(data: bytes, offset: int, version: int) -> bool:
    """Whether ``data[offset:]`` is one whole frame whose only damage is its length field
    (the CRC matches with the length the bytes have): a damaged last frame, not a torn
    one. Never raises."""
    header_bytes = FRAME_HEADER_BYTES if version != 1 else FRAME_HEADER_BYTES_V1
    if len(data) - offset < header_bytes + MIN_BODY_BYTES:
        return False
    if version == 1:
        _length, crc = _FRAME_V1.unpack_from(data, offset)
        return _crc_matches(data, offset, len(data), None, crc)
    _sync, sequence, _length, crc = _FRAME.unpack_from(data, offset)
    return _crc_matches(data, offset, len(data), sequence, crc)


def find_frame_start(data: bytes, start: int, version: int) -> int:
    """The first offset >= ``start`` where a frame may begin, or -1. Version 2: the next
    sync marker. Version 1: the next frame whose body starts like a client message as
    read (the only frames a daemon wrote). A candidate still needs :func:`check_frame`."""
    if version == 1:
        found = data.find(_PAYLOAD_HEAD, start + FRAME_HEADER_BYTES_V1)
        return found - FRAME_HEADER_BYTES_V1 if found >= 0 else -1
    return data.find(SYNC_MARKER, start)


def search_overlap(version: int) -> int:
    """Bytes to keep from the end of a searched window when the search goes on in the
    next one: a candidate may straddle the two."""
    if version == 1:
        return FRAME_HEADER_BYTES_V1 + len(_PAYLOAD_HEAD) - 1
    return len(SYNC_MARKER) - 1


def frame_header_bytes(version: int) -> int:
    """The bytes of a frame header in ``version``."""
    return FRAME_HEADER_BYTES_V1 if version == 1 else FRAME_HEADER_BYTES


def min_frame_bytes(version: int) -> int:
    """No frame of ``version`` is shorter: fewer bytes cannot be a whole frame."""
    return frame_header_bytes(version) + MIN_BODY_BYTES


# --- the segment header -----------------------------------------------------------------------


def encode_header(segment_id: int, incarnation: int = 0, stream: int = 0) -> bytes:
    """A new segment file's header: the magic, this format's version, its id, and the
    identity of its frames (the run that writes it, the stream it numbers them in)."""
    head = _HEADER.pack(MAGIC, FORMAT_VERSION, 0, segment_id)
    identity = struct.pack(">QI", incarnation, stream)
    return head + identity + _U32.pack(zlib.crc32(identity, zlib.crc32(head)))


def header_bytes(version: int) -> int:
    """The bytes of a segment header of ``version`` (where its frames begin)."""
    return HEADER_BYTES if version >= 3 else HEADER_BYTES_V2


def header_identity(header: bytes) -> tuple[int, int] | None:
    """``(incarnation, stream)`` of a version 3 header whose CRC holds; None otherwise
    (an older version, or a damaged header: its frames get fresh identities)."""
    if len(header) < HEADER_BYTES or header_version(header) < 3:
        return None
    incarnation, stream, crc = _IDENTITY.unpack_from(header, HEADER_BYTES_V2)
    if zlib.crc32(header[: HEADER_BYTES - 4]) != crc:
        return None
    return incarnation, stream


class HeaderProblem(NamedTuple):
    """What is wrong with a segment's header (:func:`header_problem`).

    ``cut``: the file ends inside its header (or is empty): a segment whose creation was
    cut, with no frame in it. ``newer``: the magic is right and the version is above
    any this pydory reads (frames it cannot read must be left for a newer pydory).
    """

    reason: str
    cut: bool = False
    newer: bool = False


def header_problem(header: bytes) -> HeaderProblem | None:
    """What is wrong with a segment's header, or None if it is good."""
    if len(header) == 0:
        return HeaderProblem("empty file", cut=True)
    if len(header) < HEADER_BYTES_V2:
        return HeaderProblem(f"cut inside its header ({len(header)} bytes)", cut=True)
    magic, version, _reserved, _segment_id = _HEADER.unpack_from(header)
    if version >= 3 and len(header) < HEADER_BYTES and magic == MAGIC:
        return HeaderProblem(f"cut inside its header ({len(header)} bytes)", cut=True)
    if magic != MAGIC:
        return HeaderProblem("not a spool segment (bad magic)")
    if version not in READABLE_VERSIONS:
        *before, last = (str(v) for v in READABLE_VERSIONS)
        reads = f"{', '.join(before)} and {last}"
        return HeaderProblem(
            f"format version {version} (this pydory reads {reads})",
            newer=version > FORMAT_VERSION,
        )
    return None


def header_version(header: bytes) -> int:
    """The format version a good header names (see :func:`header_problem`)."""
    version: int = _HEADER.unpack_from(header)[1]
    return version


def header_segment_id(header: bytes) -> int:
    """The segment id a good header names (see :func:`header_problem`)."""
    segment_id: int = _HEADER.unpack_from(header)[3]
    return segment_id
