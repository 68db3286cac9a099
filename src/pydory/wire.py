"""Dory's client wire format: bytes <-> Message, and stream framing. No I/O here.

Format (spec/dory-compat.md, section 1; all integers big-endian)::

    GenericMessage    => Size:int32 ApiKey:int16 ApiVersion:int16 Body
    AnyPartition body => Flags:int16 TopicSize:int16 Topic Timestamp:int64
                         KeySize:int32 Key ValueSize:int32 Value
    PartitionKey body => Flags:int16 PartitionKey:int32 TopicSize:int16 Topic
                         Timestamp:int64 KeySize:int32 Key ValueSize:int32 Value

``Size`` counts the whole message, itself included. The fixed fields add up to 28 bytes
for AnyPartition and 32 for PartitionKey (the spec text says 26 and 30, but its own field
list, and Dory's client library, give 28 and 32).

``decode`` judges one whole message and raises exactly one typed error per discard
reason. It checks, in this order, so that each bad message gets the reason a reader
of the bytes would give it:

1. at least the 8 header bytes are present, else ``MalformedMessage``;
2. ``Size`` equals the buffer length, else ``MalformedMessage``;
3. ``ApiKey`` is 256 or 257, else ``UnsupportedApiKey``;
4. ``ApiVersion`` is 0, else ``UnsupportedApiVersion``;
5. the body, field by field left to right, as Dory reads it (``MalformedMessage``):
   the fixed fields fit, Flags is 0, TopicSize > 0 (an empty topic is malformed, as in
   Dory) and fits, KeySize >= 0 and fits, ValueSize >= 0 and ends exactly at ``Size``;
6. only then the topic's characters and length, else ``BadTopic``.

``StreamFramer`` cuts a byte stream into frames by ``Size``; each frame goes to
``decode``, so one bad message in a stream costs only that message.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass
from typing import Final

from pydory.errors import (
    BadTopic,
    MalformedMessage,
    OversizedFrame,
    UnsupportedApiKey,
    UnsupportedApiVersion,
)

__all__ = [
    "ANY_PARTITION_API_KEY",
    "ANY_PARTITION_OVERHEAD",
    "API_VERSION",
    "DEFAULT_PREFIX_SIZE",
    "MAX_TOPIC_LENGTH",
    "NEED_DATA",
    "PARTITION_KEY_API_KEY",
    "PARTITION_KEY_OVERHEAD",
    "Message",
    "NeedData",
    "StreamFramer",
    "decode",
    "encode",
    "encode_any_partition",
    "encode_partition_key",
    "encoded_size",
    "parse_any_partition",
    "topic_name_problem",
    "validate_topic",
]

ANY_PARTITION_API_KEY: Final = 256
PARTITION_KEY_API_KEY: Final = 257
API_VERSION: Final = 0
# Size 4 + ApiKey 2 + ApiVersion 2 + Flags 2 + TopicSize 2 + Timestamp 8 + KeySize 4 + ValueSize 4
ANY_PARTITION_OVERHEAD: Final = 28
# ... plus PartitionKey 4
PARTITION_KEY_OVERHEAD: Final = 32
MAX_TOPIC_LENGTH: Final = 249
DEFAULT_PREFIX_SIZE: Final = 256

_INT32_MAX: Final = 2**31 - 1
_UINT32_MODULUS: Final = 2**32
_INT64_MIN: Final = -(2**63)
_INT64_MAX: Final = 2**63 - 1

_HEADER = struct.Struct(">ihh")  # Size ApiKey ApiVersion
_SIZE = struct.Struct(">i")
_ANY_PARTITION_START = struct.Struct(">hh")  # Flags TopicSize
_PARTITION_KEY_START = struct.Struct(">hIh")  # Flags PartitionKey TopicSize
_TIMESTAMP_KEY_SIZE = struct.Struct(">qi")  # Timestamp KeySize (right after the topic)
_VALUE_SIZE = struct.Struct(">i")
_ANY_PARTITION_HEAD = struct.Struct(">ihhhh")  # header + Flags TopicSize
_PARTITION_KEY_HEAD = struct.Struct(">ihhhIh")  # header + Flags PartitionKey TopicSize

_HEADER_SIZE: Final = _HEADER.size  # 8
_ANY_PARTITION_TOPIC_OFFSET: Final = _HEADER_SIZE + _ANY_PARTITION_START.size  # 12
_PARTITION_KEY_TOPIC_OFFSET: Final = _HEADER_SIZE + _PARTITION_KEY_START.size  # 16
_AFTER_TOPIC_SIZE: Final = _TIMESTAMP_KEY_SIZE.size  # 12

# --- topics ------------------------------------------------------------------------------

_LEGAL_TOPIC_BYTES: Final = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-"
# Topics repeat across messages, so legal ones are remembered: a dict hit is far cheaper
# than re-checking characters. The caches are cleared when full, which bounds memory
# against a client cycling through endless distinct topics.
_TOPIC_CACHE_LIMIT: Final = 10_000
_topic_by_bytes: dict[bytes, str] = {}
_legal_topic_names: set[str] = set()


def _topic_problem(topic: bytes) -> str | None:
    """Why Kafka would refuse this topic name, or None if it is legal."""
    if not topic:
        return "the topic is empty"
    if len(topic) > MAX_TOPIC_LENGTH:
        return f"the topic is {len(topic)} bytes long; Kafka allows at most {MAX_TOPIC_LENGTH}"
    if topic.translate(None, _LEGAL_TOPIC_BYTES):
        return f"the topic {topic!r} has characters outside [a-zA-Z0-9._-]"
    if topic in (b".", b".."):
        return f"the topic {topic!r} is reserved; Kafka refuses '.' and '..'"
    return None


def _remember_topic(topic: bytes) -> str:
    """Cache a topic already known to be legal and return it as str."""
    if len(_topic_by_bytes) >= _TOPIC_CACHE_LIMIT:
        _topic_by_bytes.clear()
    name = topic.decode("ascii")
    _topic_by_bytes[topic] = name
    return name


def validate_topic(topic: bytes) -> str:
    """Return ``topic`` as str if Kafka accepts it as a topic name, else raise BadTopic.

    Legal: 1 to 249 bytes of ``[a-zA-Z0-9._-]``, except "." and ".." (Kafka refuses
    those two as well). The error's ``prefix`` and ``topic``
    hold the offending bytes (the prefix cut to DEFAULT_PREFIX_SIZE).
    """
    topic = bytes(topic)  # a bytearray would be unhashable; bytes(bytes) is free
    name = _topic_by_bytes.get(topic)
    if name is not None:
        return name
    problem = _topic_problem(topic)
    if problem is not None:
        raise BadTopic(problem, prefix=topic[:DEFAULT_PREFIX_SIZE], topic=topic)
    return _remember_topic(topic)


def topic_name_problem(topic: str) -> str | None:
    """Why Kafka would refuse ``topic`` (a name typed by a person: a URL, a config) as a
    topic name, or None if it is legal; the rules of :func:`validate_topic`."""
    try:
        raw = topic.encode("ascii")
    except UnicodeEncodeError:
        return "the topic has characters outside [a-zA-Z0-9._-]"
    return _topic_problem(raw)


def _validate_topic_name(topic: str) -> None:
    """Raise BadTopic unless ``topic`` is a legal topic name."""
    if topic in _legal_topic_names:
        return
    try:
        raw = topic.encode("ascii")
    except UnicodeEncodeError:
        raw = topic.encode("utf-8", "backslashreplace")
        raise BadTopic(
            f"the topic {topic!r} has characters outside [a-zA-Z0-9._-]",
            prefix=raw[:DEFAULT_PREFIX_SIZE],
            topic=raw,
        ) from None
    validate_topic(raw)
    if len(_legal_topic_names) >= _TOPIC_CACHE_LIMIT:
        _legal_topic_names.clear()
    _legal_topic_names.add(topic)


# --- the message -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Message:
    """One client message, as decoded from or encoded to the wire.

    ``partition_key`` None means AnyPartition (the daemon picks the partition); an int
    means PartitionKey, taken as unsigned 32-bit. Construction validates every field:
    BadTopic for an illegal topic, ValueError for a timestamp outside int64 or a
    partition key outside 0..2**32-1.
    """

    topic: str
    value: bytes
    key: bytes = b""
    timestamp_ms: int = 0
    partition_key: int | None = None

    def __post_init__(self) -> None:
        _validate_topic_name(self.topic)
        if not _INT64_MIN <= self.timestamp_ms <= _INT64_MAX:
            raise ValueError(f"timestamp_ms {self.timestamp_ms} does not fit in a signed int64")
        key = self.partition_key
        if key is not None and not 0 <= key < _UINT32_MODULUS:
            raise ValueError(f"partition_key {key} is outside the unsigned 32-bit range")

    @property
    def api_key(self) -> int:
        """The wire ApiKey: 256 for AnyPartition, 257 for PartitionKey."""
        if self.partition_key is None:
            return ANY_PARTITION_API_KEY
        return PARTITION_KEY_API_KEY

    @property
    def data_size(self) -> int:
        """Bytes of message content, key plus value (what Dory's data limits count)."""
        return len(self.key) + len(self.value)


# --- encoding ----------------------------------------------------------------------------


def encoded_size(topic_len: int, key_len: int, value_len: int, partition_key: bool) -> int:
    """Byte length of the encoded message (its Size field) for these field lengths."""
    if topic_len < 0 or key_len < 0 or value_len < 0:
        raise ValueError("field lengths must not be negative")
    overhead = PARTITION_KEY_OVERHEAD if partition_key else ANY_PARTITION_OVERHEAD
    return overhead + topic_len + key_len + value_len


def encode(message: Message) -> bytes:
    """The wire bytes of ``message``. ValueError if it exceeds the int32 Size field."""
    topic = message.topic.encode("ascii")  # Message guarantees an ASCII topic
    key = message.key
    value = message.value
    partition_key = message.partition_key
    size = encoded_size(len(topic), len(key), len(value), partition_key is not None)
    if size > _INT32_MAX:
        raise ValueError(f"the message would be {size} bytes; Size allows at most {_INT32_MAX}")
    if partition_key is None:
        head = _ANY_PARTITION_HEAD.pack(size, ANY_PARTITION_API_KEY, API_VERSION, 0, len(topic))
    else:
        head = _PARTITION_KEY_HEAD.pack(
            size, PARTITION_KEY_API_KEY, API_VERSION, 0, partition_key, len(topic)
        )
    return b"".join(
        (
            head,
            topic,
            _TIMESTAMP_KEY_SIZE.pack(message.timestamp_ms, len(key)),
            key,
            _VALUE_SIZE.pack(len(value)),
            value,
        )
    )


def _topic_name(topic: str | bytes) -> str:
    if isinstance(topic, str):
        return topic  # Message validates it
    return validate_topic(topic)


def encode_any_partition(
    topic: str | bytes, value: bytes, key: bytes = b"", timestamp_ms: int = 0
) -> bytes:
    """Encode an AnyPartition message. BadTopic or ValueError on invalid input."""
    return encode(Message(_topic_name(topic), value, key, timestamp_ms))


def encode_partition_key(
    topic: str | bytes,
    value: bytes,
    partition_key: int,
    key: bytes = b"",
    timestamp_ms: int = 0,
) -> bytes:
    """Encode a PartitionKey message. BadTopic or ValueError on invalid input.

    ``partition_key`` may be given signed (-2**31 and up, as Dory's C client takes an
    int32_t) or unsigned (up to 2**32-1); it travels as the same 32 bits either way.
    """
    if not -(2**31) <= partition_key < _UINT32_MODULUS:
        raise ValueError(f"partition_key {partition_key} fits neither int32 nor uint32")
    return encode(
        Message(_topic_name(topic), value, key, timestamp_ms, partition_key % _UINT32_MODULUS)
    )


# --- decoding ----------------------------------------------------------------------------


def _malformed(buf: bytes, prefix_size: int, detail: str) -> MalformedMessage:
    return MalformedMessage(detail, prefix=buf[:prefix_size])


def decode(data: bytes | bytearray | memoryview, prefix_size: int = DEFAULT_PREFIX_SIZE) -> Message:
    """Decode exactly one whole message: a datagram, or one frame from StreamFramer.

    Raises MalformedMessage, UnsupportedApiKey, UnsupportedApiVersion or BadTopic (one
    per discard reason, checked in the order given in the module docstring), each
    carrying the first ``prefix_size`` bytes of ``data``. Never raises anything else.
    """
    # Datagrams and frames arrive as bytes: unpack_from reads them in place and each
    # field is sliced (copied) once, straight into the Message. Any other buffer is
    # copied once up front, so no view of the caller's memory outlives this call (a
    # live view would stop the caller resizing its bytearray, e.g. via a traceback).
    buf = data if type(data) is bytes else bytes(data)
    length = len(buf)
    if length < _HEADER_SIZE:
        raise _malformed(buf, prefix_size, f"{length} bytes is shorter than the 8-byte header")
    size, api_key, api_version = _HEADER.unpack_from(buf)
    if size != length:
        raise _malformed(buf, prefix_size, f"Size field says {size} but the message is {length}")

    if api_key == ANY_PARTITION_API_KEY:
        minimum = ANY_PARTITION_OVERHEAD
    elif api_key == PARTITION_KEY_API_KEY:
        minimum = PARTITION_KEY_OVERHEAD
    else:
        raise UnsupportedApiKey(
            f"ApiKey {api_key} is neither AnyPartition (256) nor PartitionKey (257)",
            prefix=buf[:prefix_size],
            api_key=api_key,
        )
    if api_version != API_VERSION:
        raise UnsupportedApiVersion(
            f"ApiVersion {api_version} is not supported for ApiKey {api_key} (only 0 is)",
            prefix=buf[:prefix_size],
            api_key=api_key,
            api_version=api_version,
        )
    if length < minimum:
        raise _malformed(
            buf, prefix_size, f"{length} bytes is shorter than the {minimum}-byte fixed part"
        )
    return _decode_body(buf, api_key, prefix_size)


def _decode_body(buf: bytes, api_key: int, prefix_size: int) -> Message:
    """Steps 5 and 6 of the module docstring, on a buffer holding all fixed fields."""
    length = len(buf)
    partition_key: int | None
    if api_key == ANY_PARTITION_API_KEY:
        flags, topic_size = _ANY_PARTITION_START.unpack_from(buf, _HEADER_SIZE)
        partition_key = None
        topic_start = _ANY_PARTITION_TOPIC_OFFSET
    else:
        flags, partition_key, topic_size = _PARTITION_KEY_START.unpack_from(buf, _HEADER_SIZE)
        topic_start = _PARTITION_KEY_TOPIC_OFFSET
    if flags != 0:
        raise _malformed(buf, prefix_size, f"Flags is {flags:#06x}; it must be 0")
    if topic_size <= 0:
        raise _malformed(buf, prefix_size, f"TopicSize is {topic_size}; a topic must be non-empty")

    topic_end = topic_start + topic_size
    if topic_end + _AFTER_TOPIC_SIZE > length:
        raise _malformed(buf, prefix_size, f"TopicSize {topic_size} runs past Size {length}")
    timestamp_ms, key_size = _TIMESTAMP_KEY_SIZE.unpack_from(buf, topic_end)
    if key_size < 0:
        raise _malformed(buf, prefix_size, f"KeySize is negative ({key_size})")

    key_start = topic_end + _AFTER_TOPIC_SIZE
    key_end = key_start + key_size
    if key_end + _VALUE_SIZE.size > length:
        raise _malformed(buf, prefix_size, f"KeySize {key_size} runs past Size {length}")
    (value_size,) = _VALUE_SIZE.unpack_from(buf, key_end)
    if value_size < 0:
        raise _malformed(buf, prefix_size, f"ValueSize is negative ({value_size})")

    value_start = key_end + _VALUE_SIZE.size
    if value_start + value_size != length:
        where = "runs past" if value_start + value_size > length else "stops short of"
        raise _malformed(buf, prefix_size, f"ValueSize {value_size} {where} Size {length}")

    return Message(
        _decoded_topic(buf, topic_start, topic_end, prefix_size),
        buf[value_start:],
        buf[key_start:key_end],
        timestamp_ms,
        partition_key,
    )


def _decoded_topic(buf: bytes, start: int, end: int, prefix_size: int) -> str:
    """The topic at buf[start:end] as str, or BadTopic carrying the message's prefix."""
    raw_topic = buf[start:end]
    topic = _topic_by_bytes.get(raw_topic)
    if topic is None:
        problem = _topic_problem(raw_topic)
        if problem is not None:
            raise BadTopic(problem, prefix=buf[:prefix_size], topic=raw_topic)
        topic = _remember_topic(raw_topic)
    return topic


def parse_any_partition(data: bytes) -> tuple[str, bytes, bytes, int] | None:
    """The daemon's hot path: ``(topic, key, value, timestamp_ms)`` of a well-formed
    AnyPartition message whose topic is already known to be legal; None for any other
    bytes, which :func:`decode` must then judge (it gives the exact discard reason).

    Whenever this returns fields, ``decode(data)`` returns a Message with the same ones:
    the checks are the same, done with fewer steps and no Message object.
    """
    length = len(data)
    if length < ANY_PARTITION_OVERHEAD:
        return None
    size, api_key, api_version, flags, topic_size = _ANY_PARTITION_HEAD_UNPACK(data)
    if (
        size != length
        or api_key != ANY_PARTITION_API_KEY
        or api_version != API_VERSION
        or flags != 0
        or topic_size <= 0
    ):
        return None
    topic_end = _ANY_PARTITION_TOPIC_OFFSET + topic_size
    key_start = topic_end + _AFTER_TOPIC_SIZE
    if key_start > length:
        return None
    timestamp_ms, key_size = _TIMESTAMP_KEY_SIZE_UNPACK(data, topic_end)
    key_end = key_start + key_size
    if key_size < 0 or key_end + 4 > length:
        return None
    (value_size,) = _VALUE_SIZE_UNPACK(data, key_end)
    if key_end + 4 + value_size != length:  # so value_size >= 0 too
        return None
    topic = _topic_by_bytes.get(data[_ANY_PARTITION_TOPIC_OFFSET:topic_end])
    if topic is None:
        return None
    return topic, data[key_start:key_end], data[key_end + 4 :], timestamp_ms


_ANY_PARTITION_HEAD_UNPACK = _ANY_PARTITION_HEAD.unpack_from
_TIMESTAMP_KEY_SIZE_UNPACK = _TIMESTAMP_KEY_SIZE.unpack_from
_VALUE_SIZE_UNPACK = _VALUE_SIZE.unpack_from


# --- stream framing ----------------------------------------------------------------------


class NeedData(enum.Enum):
    """Type of the NEED_DATA sentinel: StreamFramer holds no whole frame yet."""

    NEED_DATA = "NEED_DATA"

    def __repr__(self) -> str:
        return "NEED_DATA"


NEED_DATA: Final = NeedData.NEED_DATA


class StreamFramer:
    """Cuts a client byte stream into frames by their Size field.

    Feed it what the socket delivers and call ``next_frame()`` until it returns NEED_DATA.
    A frame is returned whole, Size field included, even if it is not a valid message:
    ``decode`` judges it, so a bad message costs only itself. Two framing errors are
    fatal, because the stream cannot be resynchronised, and the connection must close:

    - OversizedFrame as soon as the 4 Size bytes announce more than ``max_message_size``
      (the client is buggy; its body is never waited for);
    - MalformedMessage if Size < 4 (a frame cannot be shorter than its own Size field).

    The error is sticky: ``next_frame`` raises it again, and ``feed`` drops new data.

    Memory bound: once ``next_frame`` has returned NEED_DATA, ``buffered`` is at most
    ``max_message_size - 1`` (a partial frame, or fewer than 4 bytes of one), and a
    ``feed(chunk)`` raises it by ``len(chunk)`` until the next drain. So a connection
    holds at most ``max_message_size - 1 + len(chunk)`` bytes whatever the peer sends,
    as long as its reader drains after every feed.
    """

    def __init__(self, max_message_size: int, prefix_size: int = DEFAULT_PREFIX_SIZE) -> None:
        if max_message_size < _SIZE.size:
            raise ValueError(f"max_message_size must be at least 4, got {max_message_size}")
        if prefix_size < 0:
            raise ValueError(f"prefix_size must not be negative, got {prefix_size}")
        self.max_message_size = max_message_size
        self.prefix_size = prefix_size
        # Unconsumed bytes are _data[_pos:]. _data is the caller's chunk itself while whole
        # frames are being cut from it (no copy in), and becomes a bytearray only while a
        # frame spans several chunks, so each byte is appended once (never quadratic).
        self._data: bytes | bytearray = b""
        self._pos = 0
        self._error: OversizedFrame | MalformedMessage | None = None

    @property
    def buffered(self) -> int:
        """Bytes received and not yet returned as a frame."""
        return len(self._data) - self._pos

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Append bytes received from the stream."""
        if self._error is not None or not data:
            return
        if self._pos == len(self._data):
            self._data = bytes(data)  # nothing held: take the chunk as is (bytes: no copy)
            self._pos = 0
            return
        if isinstance(self._data, bytes):
            self._data = bytearray(self._data[self._pos :])
        elif self._pos:
            del self._data[: self._pos]  # CPython drops a bytearray's head in O(1)
        self._pos = 0
        self._data += data

    def next_frame(self) -> bytes | NeedData:
        """Return the next whole frame, or NEED_DATA. Raises on a fatal framing error."""
        if self._error is not None:
            raise self._error.with_traceback(None)  # don't grow the traceback on each call
        data = self._data
        start = self._pos
        available = len(data) - start
        if available < _SIZE.size:
            return self._need_data()
        (size,) = _SIZE.unpack_from(data, start)
        if size > self.max_message_size:
            self._error = OversizedFrame(
                f"Size {size} exceeds the stream limit of {self.max_message_size} bytes",
                prefix=self._held_prefix(),
                size=size,
            )
            raise self._error
        if size < _SIZE.size:
            self._error = MalformedMessage(
                f"Size {size} is less than 4; the stream cannot be resynchronised",
                prefix=self._held_prefix(),
            )
            raise self._error
        if available < size:
            return self._need_data()
        end = start + size
        self._pos = end
        if start == 0 and end == len(data) and type(data) is bytes:
            return data  # the chunk was exactly one frame
        return bytes(data[start:end])

    @property
    def error(self) -> OversizedFrame | MalformedMessage | None:
        """The fatal framing error met, or None while the stream can be framed."""
        return self._error

    def drain(self) -> list[bytes]:
        """Every whole frame held, in order, in one call (the daemon's way: one call per
        read). A fatal framing error ends the list: the frames before it are returned and
        the error is kept in ``error`` (sticky: ``next_frame`` raises it, and from then on
        ``drain`` returns no frames)."""
        frames: list[bytes] = []
        if self._error is not None:
            return frames
        keep = frames.append
        try:
            while (frame := self.next_frame()) is not NEED_DATA:
                keep(frame)
        except (OversizedFrame, MalformedMessage):
            pass  # kept in self._error, to be read after the frames before it
        return frames

    def unclean_remainder(self) -> bytes:
        """At end of stream: the first ``prefix_size`` bytes of the partial frame held.

        Empty if the stream ended cleanly, on a frame boundary. Call it after draining
        ``next_frame`` to NEED_DATA.
        """
        return self._held_prefix()

    def _held_prefix(self) -> bytes:
        return bytes(self._data[self._pos : self._pos + self.prefix_size])

    def _need_data(self) -> NeedData:
        # Let go of the consumed part now, so that the memory really held while waiting
        # is the partial frame only (see the class docstring's bound).
        if self._pos:
            if isinstance(self._data, bytes):
                self._data = self._data[self._pos :]
            else:
                del self._data[: self._pos]
            self._pos = 0
        return NEED_DATA
