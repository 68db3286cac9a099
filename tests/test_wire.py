"""pydory.wire: golden bytes, one test per discard reason, round trips, and fuzzing.

The golden vectors are written by hand, field by field, from spec/dory-compat.md
section 1; they are never produced by the encoder under test.
"""

from __future__ import annotations

import random
import struct
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pydory import wire
from pydory.errors import (
    BadTopic,
    ClientProtocolError,
    MalformedMessage,
    UnsupportedApiKey,
    UnsupportedApiVersion,
)


def fields(*hex_fields: str) -> bytes:
    """Concatenate hex-written fields into one message."""
    return bytes.fromhex("".join(hex_fields))


# --- golden vectors ----------------------------------------------------------------------

ANY_PARTITION_FULL = fields(
    "0000002d",  # Size 45 = 28 fixed + 10 topic + 2 key + 5 value
    "0100",  # ApiKey 256 AnyPartition
    "0000",  # ApiVersion 0
    "0000",  # Flags
    "000a",  # TopicSize 10
    "746573745f746f706963",  # "test_topic"
    "0000018bcfe5687b",  # Timestamp 1_700_000_000_123
    "00000002",  # KeySize 2
    "6b31",  # "k1"
    "00000005",  # ValueSize 5
    "68656c6c6f",  # "hello"
)

ANY_PARTITION_EMPTY_KEY_AND_VALUE = fields(
    "0000001d",  # Size 29 = 28 + 1 topic
    "0100",  # ApiKey 256
    "0000",  # ApiVersion 0
    "0000",  # Flags
    "0001",  # TopicSize 1
    "74",  # "t"
    "0000000000000000",  # Timestamp 0
    "00000000",  # KeySize 0
    "00000000",  # ValueSize 0
)

ANY_PARTITION_MAX_TOPIC = fields(
    "00000116",  # Size 278 = 28 + 249 topic + 1 value
    "0100",  # ApiKey 256
    "0000",  # ApiVersion 0
    "0000",  # Flags
    "00f9",  # TopicSize 249
    "61" * 249,  # "aaa...a"
    "0000000000000000",  # Timestamp 0
    "00000000",  # KeySize 0
    "00000001",  # ValueSize 1
    "78",  # "x"
)

PARTITION_KEY_ALL_ONES = fields(
    "00000022",  # Size 34 = 32 fixed + 1 topic + 1 value
    "0101",  # ApiKey 257 PartitionKey
    "0000",  # ApiVersion 0
    "0000",  # Flags
    "ffffffff",  # PartitionKey 0xFFFFFFFF
    "0001",  # TopicSize 1
    "74",  # "t"
    "ffffffffffffffff",  # Timestamp -1
    "00000000",  # KeySize 0
    "00000001",  # ValueSize 1
    "76",  # "v"
)

PARTITION_KEY_WITH_KEY = fields(
    "00000028",  # Size 40 = 32 + 7 topic + 1 key + 0 value
    "0101",  # ApiKey 257
    "0000",  # ApiVersion 0
    "0000",  # Flags
    "00000007",  # PartitionKey 7
    "0007",  # TopicSize 7
    "612e622d435f39",  # "a.b-C_9"
    "0000000000000001",  # Timestamp 1
    "00000001",  # KeySize 1
    "4b",  # "K"
    "00000000",  # ValueSize 0
)

GOLDEN = [
    pytest.param(
        ANY_PARTITION_FULL,
        wire.Message("test_topic", b"hello", b"k1", 1_700_000_000_123),
        id="any-partition",
    ),
    pytest.param(
        ANY_PARTITION_EMPTY_KEY_AND_VALUE,
        wire.Message("t", b""),
        id="any-partition-empty-key-and-value",
    ),
    pytest.param(
        ANY_PARTITION_MAX_TOPIC,
        wire.Message("a" * 249, b"x"),
        id="any-partition-249-byte-topic",
    ),
    pytest.param(
        PARTITION_KEY_ALL_ONES,
        wire.Message("t", b"v", b"", -1, 0xFFFFFFFF),
        id="partition-key-0xffffffff",
    ),
    pytest.param(
        PARTITION_KEY_WITH_KEY,
        wire.Message("a.b-C_9", b"", b"K", 1, 7),
        id="partition-key-empty-value",
    ),
]


@pytest.mark.parametrize(("golden", "message"), GOLDEN)
def test_golden_vector_decodes_to_message(golden: bytes, message: wire.Message) -> None:
    assert wire.decode(golden) == message


@pytest.mark.parametrize(("golden", "message"), GOLDEN)
def test_golden_vector_is_what_encode_writes(golden: bytes, message: wire.Message) -> None:
    assert wire.encode(message) == golden
    assert len(golden) == wire.encoded_size(
        len(message.topic), len(message.key), len(message.value), message.partition_key is not None
    )


def test_convenience_encoders_write_the_golden_bytes() -> None:
    assert (
        wire.encode_any_partition("test_topic", b"hello", b"k1", 1_700_000_000_123)
        == ANY_PARTITION_FULL
    )
    assert wire.encode_any_partition(b"t", b"") == ANY_PARTITION_EMPTY_KEY_AND_VALUE
    assert wire.encode_partition_key("t", b"v", 0xFFFFFFFF, timestamp_ms=-1) == (
        PARTITION_KEY_ALL_ONES
    )
    assert wire.encode_partition_key(b"a.b-C_9", b"", 7, b"K", 1) == PARTITION_KEY_WITH_KEY


def test_negative_partition_key_is_sent_as_its_unsigned_32_bits() -> None:
    assert wire.encode_partition_key("t", b"v", -1, timestamp_ms=-1) == PARTITION_KEY_ALL_ONES
    decoded = wire.decode(wire.encode_partition_key("t", b"v", -(2**31)))
    assert decoded.partition_key == 0x80000000


def test_decode_accepts_bytearray_and_memoryview() -> None:
    expected = wire.decode(ANY_PARTITION_FULL)
    assert wire.decode(bytearray(ANY_PARTITION_FULL)) == expected
    assert wire.decode(memoryview(ANY_PARTITION_FULL)) == expected


def test_message_properties() -> None:
    any_partition = wire.Message("t", b"value", b"key")
    partition_key = wire.Message("t", b"value", partition_key=0)
    assert any_partition.api_key == wire.ANY_PARTITION_API_KEY == 256
    assert partition_key.api_key == wire.PARTITION_KEY_API_KEY == 257
    assert any_partition.data_size == 8
    assert partition_key.data_size == 5


def test_overheads_match_the_field_list() -> None:
    # Size 4 + ApiKey 2 + ApiVersion 2 + Flags 2 + TopicSize 2 + Timestamp 8 + KeySize 4
    # + ValueSize 4; PartitionKey adds its 4 bytes.
    assert wire.ANY_PARTITION_OVERHEAD == 28
    assert wire.PARTITION_KEY_OVERHEAD == 32
    assert wire.encoded_size(1, 0, 0, partition_key=False) == len(ANY_PARTITION_EMPTY_KEY_AND_VALUE)


# --- decode errors, one per discard reason -----------------------------------------------

# Field offsets in ANY_PARTITION_FULL (see its comments).
SIZE, API_KEY, API_VERSION, FLAGS, TOPIC_SIZE = 0, 4, 6, 8, 10
KEY_SIZE, VALUE_SIZE = 30, 36
# ... and in PARTITION_KEY_WITH_KEY.
PK_FLAGS, PK_TOPIC_SIZE = 8, 14


def rewrite(message: bytes, offset: int, fmt: str, value: int) -> bytes:
    """``message`` with the big-endian field at ``offset`` set to ``value``."""
    buf = bytearray(message)
    struct.pack_into(">" + fmt, buf, offset, value)
    return bytes(buf)


def with_size(message: bytes) -> bytes:
    """``message`` with its Size field set to its real length."""
    return rewrite(message, SIZE, "i", len(message))


def decode_error(data: bytes, prefix_size: int = wire.DEFAULT_PREFIX_SIZE) -> ClientProtocolError:
    with pytest.raises(ClientProtocolError) as caught:
        wire.decode(data, prefix_size)
    return caught.value


MALFORMED = [
    pytest.param(b"", id="empty"),
    pytest.param(b"\x00\x00\x00\x07\x01\x00\x00", id="shorter-than-header"),
    pytest.param(rewrite(ANY_PARTITION_FULL, SIZE, "i", 46), id="size-above-length"),
    pytest.param(rewrite(ANY_PARTITION_FULL, SIZE, "i", 44), id="size-below-length"),
    pytest.param(rewrite(ANY_PARTITION_FULL, SIZE, "i", -45), id="size-negative"),
    pytest.param(ANY_PARTITION_FULL + b"\x00", id="buffer-longer-than-size"),
    pytest.param(with_size(ANY_PARTITION_FULL + b"!"), id="trailing-byte-after-value"),
    pytest.param(with_size(ANY_PARTITION_FULL[:27]), id="any-partition-shorter-than-fixed-part"),
    pytest.param(with_size(PARTITION_KEY_WITH_KEY[:31]), id="partition-key-shorter-than-fixed"),
    pytest.param(rewrite(ANY_PARTITION_FULL, FLAGS, "h", 1), id="flags-1"),
    pytest.param(rewrite(ANY_PARTITION_FULL, FLAGS, "H", 0x8000), id="flags-high-bit"),
    pytest.param(rewrite(PARTITION_KEY_WITH_KEY, PK_FLAGS, "h", 2), id="partition-key-flags"),
    pytest.param(rewrite(ANY_PARTITION_FULL, TOPIC_SIZE, "h", -1), id="topic-size-negative"),
    pytest.param(rewrite(ANY_PARTITION_FULL, TOPIC_SIZE, "h", -(2**15)), id="topic-size-int16-min"),
    pytest.param(rewrite(ANY_PARTITION_FULL, TOPIC_SIZE, "h", 20), id="topic-size-too-long"),
    pytest.param(rewrite(ANY_PARTITION_FULL, TOPIC_SIZE, "h", 9), id="topic-size-too-short"),
    pytest.param(rewrite(PARTITION_KEY_WITH_KEY, PK_TOPIC_SIZE, "h", 99), id="pk-topic-size-long"),
    pytest.param(rewrite(ANY_PARTITION_FULL, KEY_SIZE, "i", -1), id="key-size-minus-1"),
    pytest.param(rewrite(ANY_PARTITION_FULL, KEY_SIZE, "i", -(2**31)), id="key-size-int32-min"),
    pytest.param(rewrite(ANY_PARTITION_FULL, KEY_SIZE, "i", 8), id="key-size-too-long"),
    pytest.param(rewrite(ANY_PARTITION_FULL, KEY_SIZE, "i", 2**31 - 1), id="key-size-int32-max"),
    pytest.param(rewrite(ANY_PARTITION_FULL, VALUE_SIZE, "i", -5), id="value-size-negative"),
    pytest.param(rewrite(ANY_PARTITION_FULL, VALUE_SIZE, "i", -(2**31)), id="value-size-int32-min"),
    pytest.param(rewrite(ANY_PARTITION_FULL, VALUE_SIZE, "i", 6), id="value-size-too-long"),
    pytest.param(rewrite(ANY_PARTITION_FULL, VALUE_SIZE, "i", 4), id="value-size-too-short"),
]


@pytest.mark.parametrize("data", MALFORMED)
def test_malformed_message(data: bytes) -> None:
    error = decode_error(data)
    assert type(error) is MalformedMessage
    assert error.reason == "malformed"
    assert error.prefix == data  # shorter than the default prefix size


def test_empty_topic_is_malformed_as_in_dory() -> None:
    empty_topic = fields(
        "0000001c",  # Size 28: no topic, key or value
        "0100",  # ApiKey 256
        "0000",  # ApiVersion 0
        "0000",  # Flags
        "0000",  # TopicSize 0
        "0000000000000000",  # Timestamp
        "00000000",  # KeySize 0
        "00000000",  # ValueSize 0
    )
    error = decode_error(empty_topic)
    assert type(error) is MalformedMessage
    assert error.prefix == empty_topic


@pytest.mark.parametrize("api_key", [0, 1, 255, 258, -1, 0x7FFF])
def test_unsupported_api_key(api_key: int) -> None:
    data = rewrite(ANY_PARTITION_FULL, API_KEY, "h", api_key)
    error = decode_error(data)
    assert type(error) is UnsupportedApiKey
    assert error.api_key == api_key
    assert error.prefix == data


def test_api_key_is_checked_before_version() -> None:
    data = rewrite(rewrite(ANY_PARTITION_FULL, API_KEY, "h", 300), API_VERSION, "h", 9)
    assert type(decode_error(data)) is UnsupportedApiKey


def test_unsupported_api_key_with_too_short_body_is_still_unsupported_key() -> None:
    data = fields("00000008", "0200", "0000")  # Size 8, ApiKey 512, ApiVersion 0, no body
    assert type(decode_error(data)) is UnsupportedApiKey


@pytest.mark.parametrize("golden", [ANY_PARTITION_FULL, PARTITION_KEY_WITH_KEY])
@pytest.mark.parametrize("version", [1, -1, 0x7FFF])
def test_unsupported_api_version(golden: bytes, version: int) -> None:
    data = rewrite(golden, API_VERSION, "h", version)
    error = decode_error(data)
    assert type(error) is UnsupportedApiVersion
    assert error.api_version == version
    assert error.api_key == struct.unpack_from(">h", golden, API_KEY)[0]
    assert error.prefix == data


def any_partition_with_topic(topic: bytes) -> bytes:
    """A hand-built AnyPartition message, empty key and value, with this raw topic."""
    return fields(
        f"{28 + len(topic):08x}",  # Size
        "0100",  # ApiKey 256
        "0000",  # ApiVersion 0
        "0000",  # Flags
        f"{len(topic):04x}",  # TopicSize
        topic.hex(),  # Topic
        "0000000000000000",  # Timestamp
        "00000000",  # KeySize 0
        "00000000",  # ValueSize 0
    )


@pytest.mark.parametrize(
    "topic",
    [
        pytest.param(b"a" * 250, id="250-bytes"),
        pytest.param(b"a b", id="space"),
        pytest.param(b"a/b", id="slash"),
        pytest.param(b"t\x00", id="nul"),
        pytest.param("tópico".encode(), id="utf8"),
        pytest.param(b"\xff", id="high-byte"),
        pytest.param(b".", id="dot"),
        pytest.param(b"..", id="dot-dot"),
    ],
)
def test_bad_topic(topic: bytes) -> None:
    data = any_partition_with_topic(topic)
    error = decode_error(data)
    assert type(error) is BadTopic
    assert error.topic == topic
    assert error.prefix == data[: wire.DEFAULT_PREFIX_SIZE]


def test_topic_legality_is_judged_only_once_sizes_are_consistent() -> None:
    value_size_at = 12 + 3 + 8 + 4  # after header, Flags, TopicSize, topic, Timestamp, KeySize
    data = rewrite(any_partition_with_topic(b"a b"), value_size_at, "i", 1)  # no value byte
    assert type(decode_error(data)) is MalformedMessage


def test_prefix_is_cut_to_prefix_size() -> None:
    long_message = wire.encode_any_partition("t", b"v" * 1000)
    bad_flags = rewrite(long_message, FLAGS, "h", 1)
    assert decode_error(bad_flags).prefix == bad_flags[:256]
    assert decode_error(bad_flags, prefix_size=10).prefix == bad_flags[:10]
    assert decode_error(bad_flags, prefix_size=0).prefix == b""


# --- encoder input validation ------------------------------------------------------------


@pytest.mark.parametrize("topic", ["", "a" * 250, "a b", "é", b"", b"a*b"])
def test_encoders_refuse_bad_topics(topic: str | bytes) -> None:
    with pytest.raises(BadTopic):
        wire.encode_any_partition(topic, b"v")
    with pytest.raises(BadTopic):
        wire.encode_partition_key(topic, b"v", 1)


@pytest.mark.parametrize("partition_key", [2**32, -(2**31) - 1])
def test_partition_key_out_of_range(partition_key: int) -> None:
    with pytest.raises(ValueError, match="partition_key"):
        wire.encode_partition_key("t", b"v", partition_key)


def test_message_refuses_out_of_range_fields() -> None:
    with pytest.raises(ValueError, match="partition_key"):
        wire.Message("t", b"v", partition_key=-1)
    with pytest.raises(ValueError, match="timestamp_ms"):
        wire.Message("t", b"v", timestamp_ms=2**63)
    with pytest.raises(BadTopic):
        wire.Message("", b"v")


def test_validate_topic() -> None:
    assert wire.validate_topic(b"Orders.v2-eu_1") == "Orders.v2-eu_1"
    assert wire.validate_topic(b"x" * 249) == "x" * 249
    assert wire.validate_topic(b"...") == "..."
    for bad in (b"", b"x" * 250, b"a:b"):
        with pytest.raises(BadTopic) as caught:
            wire.validate_topic(bad)
        assert caught.value.topic == bad


def test_encoded_size_refuses_negative_lengths() -> None:
    with pytest.raises(ValueError, match="negative"):
        wire.encoded_size(1, -1, 0, partition_key=False)


# --- round trips -------------------------------------------------------------------------

TOPIC_ALPHABET = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-"
RESERVED_TOPICS = (".", "..")  # legal characters, but Kafka refuses these two names
topics = st.text(alphabet=TOPIC_ALPHABET, min_size=1, max_size=wire.MAX_TOPIC_LENGTH).filter(
    lambda topic: topic not in RESERVED_TOPICS
)
timestamps = st.integers(min_value=-(2**63), max_value=2**63 - 1)
payloads = st.binary(max_size=300)


@given(topic=topics, value=payloads, key=payloads, timestamp_ms=timestamps)
def test_any_partition_round_trip(topic: str, value: bytes, key: bytes, timestamp_ms: int) -> None:
    data = wire.encode_any_partition(topic, value, key, timestamp_ms)
    assert len(data) == wire.encoded_size(len(topic), len(key), len(value), partition_key=False)
    assert wire.decode(data) == wire.Message(topic, value, key, timestamp_ms)
    # Once decode has seen the topic, the daemon's hot path reads the same fields.
    assert wire.parse_any_partition(data) == (topic, key, value, timestamp_ms)


def test_the_hot_path_leaves_unseen_topics_and_partition_keys_to_decode() -> None:
    topic = b"never-seen-before"  # built by hand: encoding would validate (and cache) it
    head = struct.pack(">ihhhh", wire.ANY_PARTITION_OVERHEAD + len(topic) + 1, 256, 0, 0, 17)
    unseen = head + topic + struct.pack(">qi", 0, 0) + struct.pack(">i", 1) + b"v"
    assert wire.parse_any_partition(unseen) is None
    assert wire.decode(unseen) == wire.Message("never-seen-before", b"v")
    assert wire.parse_any_partition(unseen) == ("never-seen-before", b"", b"v", 0)
    assert wire.parse_any_partition(wire.encode_partition_key(topic, b"v", 7)) is None


@given(
    topic=topics,
    value=payloads,
    key=payloads,
    timestamp_ms=timestamps,
    partition_key=st.integers(min_value=-(2**31), max_value=2**32 - 1),
)
def test_partition_key_round_trip(
    topic: str, value: bytes, key: bytes, timestamp_ms: int, partition_key: int
) -> None:
    data = wire.encode_partition_key(topic, value, partition_key, key, timestamp_ms)
    assert len(data) == wire.encoded_size(len(topic), len(key), len(value), partition_key=True)
    decoded = wire.decode(data)
    assert decoded == wire.Message(topic, value, key, timestamp_ms, partition_key % 2**32)
    assert wire.encode(decoded) == data


# --- fuzzing: decode returns a Message or raises ClientProtocolError, nothing else --------


def decode_outcome(data: bytes) -> str:
    """Decode; return the outcome's name. Any exception but ClientProtocolError escapes.

    The wire format leaves no freedom (flags 0, every size implied), so whatever
    decodes must re-encode to the very same bytes. The daemon's hot path,
    ``parse_any_partition``, must agree with decode whenever it answers at all.
    """
    hot_path = wire.parse_any_partition(data)
    try:
        message = wire.decode(data)
    except ClientProtocolError as error:
        rejection = error
    else:
        assert wire.encode(message) == data
        if hot_path is not None:
            assert message.partition_key is None
            assert hot_path == (message.topic, message.key, message.value, message.timestamp_ms)
        return "Message"
    assert hot_path is None, f"the hot path accepted what decode refuses: {rejection!r}"
    assert data.startswith(rejection.prefix)
    return type(rejection).__name__


def size_field_offsets(data: bytes) -> list[tuple[int, str]]:
    """(offset, struct format) of every size field in a valid encoding."""
    (api_key,) = struct.unpack_from(">h", data, 4)
    topic_size_at = 10 if api_key == wire.ANY_PARTITION_API_KEY else 14
    (topic_size,) = struct.unpack_from(">h", data, topic_size_at)
    key_size_at = topic_size_at + 2 + topic_size + 8
    (key_size,) = struct.unpack_from(">i", data, key_size_at)
    value_size_at = key_size_at + 4 + key_size
    return [(0, "i"), (topic_size_at, "h"), (key_size_at, "i"), (value_size_at, "i")]


def mutate(rng: random.Random, data: bytes) -> bytes:
    """One random corruption of a valid encoding."""
    kind = rng.randrange(5)
    if kind == 0:  # bit flips
        buf = bytearray(data)
        for _ in range(rng.randint(1, 3)):
            bit = rng.randrange(len(buf) * 8)
            buf[bit // 8] ^= 1 << (bit % 8)
        return bytes(buf)
    if kind == 1:  # truncation, Size left as it was or fixed up
        cut = data[: rng.randrange(len(data))]
        return with_size(cut) if len(cut) >= 4 and rng.random() < 0.5 else cut
    if kind == 2:  # extension, Size left as it was or fixed up
        longer = data + rng.randbytes(rng.randint(1, 8))
        return with_size(longer) if rng.random() < 0.5 else longer
    if kind == 3:  # a size field rewritten to an edge or random value
        offset, fmt = rng.choice(size_field_offsets(data))
        bits = 16 if fmt == "h" else 32
        edges = [0, 1, -1, len(data), len(data) - 1, len(data) + 1, 2 ** (bits - 1) - 1]
        edges.append(-(2 ** (bits - 1)))
        value = rng.choice([*edges, rng.randrange(-(2 ** (bits - 1)), 2 ** (bits - 1))])
        return rewrite(data, offset, fmt, value)
    buf = bytearray(data)  # header field overwritten: ApiKey, ApiVersion or Flags
    offset = rng.choice([4, 6, 8])
    struct.pack_into(">h", buf, offset, rng.choice([0, 1, 255, 256, 257, 258, -1]))
    return bytes(buf)


def random_valid_encoding(rng: random.Random) -> bytes:
    topic = "".join(rng.choices(TOPIC_ALPHABET, k=rng.randint(1, 20)))
    if topic in RESERVED_TOPICS:
        topic = "reserved" + topic
    key = rng.randbytes(rng.randint(0, 8))
    value = rng.randbytes(rng.randint(0, 40))
    timestamp = rng.randrange(-(2**63), 2**63)
    if rng.random() < 0.5:
        return wire.encode_any_partition(topic, value, key, timestamp)
    return wire.encode_partition_key(topic, value, rng.randrange(2**32), key, timestamp)


def random_framed_bytes(rng: random.Random) -> bytes:
    """Random bytes behind a header that gets past the first checks more often than not."""
    body = rng.randbytes(rng.randint(0, 60))
    api_key = rng.choice([256, 257, 256, 257, rng.randrange(-(2**15), 2**15)])
    return struct.pack(">ihh", 8 + len(body), api_key, rng.choice([0, 0, 0, 1])) + body


FUZZ_CASES = 100_000


def test_fuzz_decode_never_raises_anything_but_client_protocol_errors() -> None:
    rng = random.Random(20240611)
    outcomes: Counter[str] = Counter()
    valid = [random_valid_encoding(rng) for _ in range(500)]
    count = 0
    while count < FUZZ_CASES:
        choice = count % 4
        if choice == 0:
            data = rng.randbytes(rng.randint(0, 48))
        elif choice == 1:
            data = random_framed_bytes(rng)
        else:
            data = mutate(rng, rng.choice(valid))
        outcomes[decode_outcome(data)] += 1
        count += 1
    assert count == FUZZ_CASES
    # The corpus reaches every outcome, so the loop is not exercising one path only.
    for outcome in ("Message", "MalformedMessage", "UnsupportedApiKey", "UnsupportedApiVersion"):
        assert outcomes[outcome] > 100, outcomes
    assert outcomes["BadTopic"] > 0, outcomes


@settings(max_examples=2000)
@given(st.binary(max_size=200))
def test_fuzz_random_bytes(data: bytes) -> None:
    decode_outcome(data)


@settings(max_examples=2000)
@given(
    topic=topics,
    value=payloads,
    key=payloads,
    partition_key=st.none() | st.integers(min_value=0, max_value=2**32 - 1),
    seed=st.integers(min_value=0, max_value=2**32),
)
def test_fuzz_mutated_encodings(
    topic: str, value: bytes, key: bytes, partition_key: int | None, seed: int
) -> None:
    data = wire.encode(wire.Message(topic, value, key, 0, partition_key))
    decode_outcome(mutate(random.Random(seed), data))
