"""pydory.wire.StreamFramer: cutting a client byte stream into frames by Size."""

from __future__ import annotations

import itertools
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hotpaths import module_fixture
from pydory import wire
from pydory.errors import (
    BadTopic,
    MalformedMessage,
    OversizedFrame,
    UnsupportedApiKey,
    UnsupportedApiVersion,
)

# Every test here runs on the compiled hot path and on the pure-Python one (issue 25).
implementation = module_fixture()

VALID = [
    wire.encode_any_partition("orders", b"o" * 100, b"k", 1),
    wire.encode_partition_key("clicks", b"", 0xFFFFFFFF),
    wire.encode_any_partition("t", b"v" * 1000),
]
UNKNOWN_API_KEY = struct.pack(">ihh", 12, 999, 0) + b"body"
UNKNOWN_VERSION = struct.pack(">ihh", 8, 256, 3)
SIZE_FOUR = struct.pack(">i", 4)  # framed (Size >= 4) but shorter than any header
BAD_FLAGS = bytearray(VALID[0])
struct.pack_into(">h", BAD_FLAGS, 8, 1)
BAD_TOPIC = bytearray(VALID[0])
BAD_TOPIC[12:18] = b"or/ers"

# A stream mixing valid messages with invalid ones that are still correctly framed,
# and the error decode() must give each frame (None for a valid message).
STREAM_FRAMES = [
    (VALID[0], None),
    (UNKNOWN_API_KEY, UnsupportedApiKey),
    (VALID[1], None),
    (SIZE_FOUR, MalformedMessage),
    (bytes(BAD_FLAGS), MalformedMessage),
    (UNKNOWN_VERSION, UnsupportedApiVersion),
    (VALID[2], None),
    (bytes(BAD_TOPIC), BadTopic),
    (VALID[0], None),
]
FRAMES = [frame for frame, _ in STREAM_FRAMES]
STREAM = b"".join(FRAMES)
MAX_SIZE = max(len(frame) for frame in FRAMES)


def drain(framer: wire.StreamFramer) -> list[bytes]:
    """Every whole frame the framer holds now."""
    frames = []
    while (frame := framer.next_frame()) is not wire.NEED_DATA:
        assert isinstance(frame, bytes)
        frames.append(frame)
    return frames


def feed_in_chunks(framer: wire.StreamFramer, chunks: list[bytes]) -> list[bytes]:
    """Feed chunk by chunk, draining after each, checking the memory bound throughout."""
    frames = []
    for chunk in chunks:
        assert framer.buffered <= framer.max_message_size - 1
        framer.feed(chunk)
        assert framer.buffered <= framer.max_message_size - 1 + len(chunk)
        frames.extend(drain(framer))
    return frames


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    bounds = [0, *sorted(set(cuts)), len(data)]
    return [data[start:end] for start, end in itertools.pairwise(bounds)]


def test_each_frame_gets_its_own_verdict_from_decode() -> None:
    framer = wire.StreamFramer(MAX_SIZE)
    framer.feed(STREAM)
    for frame, expected_error in zip(drain(framer), [e for _, e in STREAM_FRAMES], strict=True):
        if expected_error is None:
            assert isinstance(wire.decode(frame), wire.Message)
        else:
            with pytest.raises(expected_error):
                wire.decode(frame)


def test_stream_fed_whole() -> None:
    framer = wire.StreamFramer(MAX_SIZE)
    framer.feed(STREAM)
    assert drain(framer) == FRAMES
    assert framer.buffered == 0
    assert framer.unclean_remainder() == b""


def test_stream_fed_one_byte_at_a_time() -> None:
    framer = wire.StreamFramer(MAX_SIZE)
    one_byte_chunks = [STREAM[i : i + 1] for i in range(len(STREAM))]
    assert feed_in_chunks(framer, one_byte_chunks) == FRAMES
    assert framer.buffered == 0
    assert framer.unclean_remainder() == b""


@given(cuts=st.lists(st.integers(min_value=1, max_value=len(STREAM) - 1), max_size=40))
def test_stream_fed_in_random_splits(cuts: list[int]) -> None:
    framer = wire.StreamFramer(MAX_SIZE)
    assert feed_in_chunks(framer, split(STREAM, cuts)) == FRAMES
    assert framer.unclean_remainder() == b""


@given(
    cuts=st.lists(st.integers(min_value=1, max_value=len(STREAM) - 1), max_size=10),
    partial_length=st.integers(min_value=1, max_value=len(VALID[2]) - 1),
    prefix_size=st.integers(min_value=0, max_value=300),
)
def test_stream_ending_mid_message_leaves_an_unclean_remainder(
    cuts: list[int], partial_length: int, prefix_size: int
) -> None:
    partial = VALID[2][:partial_length]
    framer = wire.StreamFramer(MAX_SIZE, prefix_size=prefix_size)
    assert feed_in_chunks(framer, [*split(STREAM, cuts), partial]) == FRAMES
    assert framer.buffered == partial_length
    assert framer.unclean_remainder() == partial[:prefix_size]


def test_feeding_several_chunks_before_draining() -> None:
    framer = wire.StreamFramer(MAX_SIZE)
    for chunk in split(STREAM, [3, 50, 51, 400]):
        framer.feed(chunk)
    assert drain(framer) == FRAMES


def test_frame_is_a_copy_of_a_mutable_input() -> None:
    framer = wire.StreamFramer(MAX_SIZE)
    received = bytearray(VALID[0])
    framer.feed(memoryview(received)[:10])
    framer.feed(received[10:])
    received[:] = b"\x00" * len(received)  # the caller reuses its receive buffer
    assert framer.next_frame() == VALID[0]


def test_frame_of_exactly_max_message_size_is_accepted() -> None:
    framer = wire.StreamFramer(len(VALID[2]))
    framer.feed(VALID[2])
    assert framer.next_frame() == VALID[2]


def test_oversized_frame_is_refused_right_after_its_size_field() -> None:
    framer = wire.StreamFramer(max_message_size=100)
    framer.feed(b"\x00\x00\x00")
    assert framer.next_frame() is wire.NEED_DATA
    framer.feed(b"\x65")  # Size 101: nothing of the body has been sent
    with pytest.raises(OversizedFrame) as caught:
        framer.next_frame()
    assert caught.value.size == 101
    assert caught.value.prefix == b"\x00\x00\x00\x65"
    assert framer.buffered == 4


def test_fatal_framing_error_is_sticky() -> None:
    framer = wire.StreamFramer(max_message_size=100)
    framer.feed(struct.pack(">i", 2**31 - 1))
    with pytest.raises(OversizedFrame):
        framer.next_frame()
    framer.feed(VALID[0])  # dropped: the connection is to be closed
    assert framer.buffered == 4
    with pytest.raises(OversizedFrame):
        framer.next_frame()


@pytest.mark.parametrize("size", [0, 3, -1, -(2**31)])
def test_size_below_four_cannot_be_resynchronised(size: int) -> None:
    framer = wire.StreamFramer(MAX_SIZE, prefix_size=6)
    framer.feed(VALID[0] + struct.pack(">i", size) + b"garbage")
    assert framer.next_frame() == VALID[0]
    with pytest.raises(MalformedMessage) as caught:
        framer.next_frame()
    assert caught.value.prefix == struct.pack(">i", size) + b"ga"


def test_memory_stays_bounded_while_a_peer_dribbles_a_maximal_frame() -> None:
    max_size = 1000
    framer = wire.StreamFramer(max_size)
    frame = struct.pack(">ihh", max_size, 256, 0) + b"\x00" * (max_size - 8)
    for i in range(max_size - 1):
        framer.feed(frame[i : i + 1])
        assert framer.next_frame() is wire.NEED_DATA
        assert framer.buffered == i + 1 <= max_size - 1
    framer.feed(frame[-1:])
    assert framer.next_frame() == frame
    assert framer.buffered == 0


def test_memory_bound_after_a_large_chunk_of_small_frames() -> None:
    framer = wire.StreamFramer(MAX_SIZE)
    chunk = STREAM * 50 + VALID[2][:-1]  # ends one byte short of a whole frame
    framer.feed(chunk)
    assert framer.buffered == len(chunk)  # within the bound: max - 1 + len(chunk)
    assert drain(framer) == FRAMES * 50
    assert framer.buffered == len(VALID[2]) - 1 <= MAX_SIZE - 1


def test_need_data_sentinel() -> None:
    assert isinstance(wire.NEED_DATA, wire.NeedData)
    assert repr(wire.NEED_DATA) == "NEED_DATA"
    assert wire.StreamFramer(100).next_frame() is wire.NEED_DATA


def test_framer_settings_are_validated() -> None:
    with pytest.raises(ValueError, match="max_message_size"):
        wire.StreamFramer(3)
    with pytest.raises(ValueError, match="prefix_size"):
        wire.StreamFramer(100, prefix_size=-1)
