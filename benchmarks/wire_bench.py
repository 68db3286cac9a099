"""Micro-benchmark of pydory.wire's hot path: decode and StreamFramer, 100-byte values.

Not a test. Run: .venv/bin/python benchmarks/wire_bench.py [--messages N]
"""

from __future__ import annotations

import argparse
import time

from pydory import wire

CHUNK_SIZE = 256 * 1024  # a typical stream read size


def sample_messages(count: int) -> list[bytes]:
    """A realistic mix: a few repeating topics, both message types, 100-byte values."""
    messages = []
    for i in range(count):
        topic = f"topic_{i % 8}"
        value = bytes([i % 256]) * 100
        if i % 2:
            messages.append(wire.encode_partition_key(topic, value, i, b"key", i))
        else:
            messages.append(wire.encode_any_partition(topic, value, b"", i))
    return messages


def bench_decode(messages: list[bytes]) -> float:
    decode = wire.decode
    start = time.perf_counter()
    for data in messages:
        decode(data)
    return len(messages) / (time.perf_counter() - start)


def bench_framer(messages: list[bytes], *, decode_frames: bool) -> float:
    """Frame a stream delivered in CHUNK_SIZE reads, optionally decoding each frame."""
    stream = b"".join(messages)
    chunks = [stream[i : i + CHUNK_SIZE] for i in range(0, len(stream), CHUNK_SIZE)]
    framer = wire.StreamFramer(max_message_size=1024 * 1024)
    decode = wire.decode
    frames = 0
    start = time.perf_counter()
    for chunk in chunks:
        framer.feed(chunk)
        while (frame := framer.next_frame()) is not wire.NEED_DATA:
            if decode_frames:
                decode(frame)
            frames += 1
    elapsed = time.perf_counter() - start
    assert frames == len(messages), frames
    return frames / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=500_000)
    args = parser.parse_args()
    messages = sample_messages(args.messages)
    print(f"{args.messages} messages of {len(messages[0])}-{len(messages[1])} bytes")
    print(f"decode:           {bench_decode(messages):>12,.0f} msgs/s")
    print(f"framer:           {bench_framer(messages, decode_frames=False):>12,.0f} msgs/s")
    print(f"framer + decode:  {bench_framer(messages, decode_frames=True):>12,.0f} msgs/s")


if __name__ == "__main__":
    main()
