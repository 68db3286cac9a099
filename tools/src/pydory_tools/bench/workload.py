"""What the load generator sends: values, pre-encoded messages, latency probes. No I/O.

Values are log-like text (words and numbers from a seeded random generator), so that
lz4 and snappy see something they can compress about 2x, as with real events; identical
or random bytes would flatter or defeat compression. A few thousand distinct messages are
encoded up front and cycled: the generator's own Python work per message is one socket
write, so it can outrun the daemon it measures.

A probe is an ordinary message to a separate one-partition topic whose value starts with
the generator's wall clock (ns) at the moment of sending. A consumer reading that topic
turns it into a latency sample (pydory_tools.bench.latency).
"""

from __future__ import annotations

import random
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

from pydory import wire

#: Distinct pre-encoded messages (or stream writes) a generator cycles through.
POOL_SIZE: Final = 4096
#: A probe's value starts with its send time: 8 bytes, big-endian nanoseconds since the epoch.
PROBE_STAMP: Final = struct.Struct(">q")
#: The smallest value the harness accepts (a probe must hold its stamp).
MIN_VALUE_BYTES: Final = PROBE_STAMP.size

_VOCABULARY: Final = (
    "GET POST PUT user session order cart item checkout payment login logout search "
    "render cache miss hit timeout retry ok error warning info debug host web db queue "
    "worker request response latency bytes status region eu us ap shard replica"
)


def make_values(value_bytes: int, count: int, seed: int) -> list[bytes]:
    """``count`` distinct values of exactly ``value_bytes`` bytes of log-like ASCII text."""
    rng = random.Random(seed)
    words = _VOCABULARY.split()
    return [_log_line(rng, words, value_bytes) for _ in range(count)]


def _log_line(rng: random.Random, words: list[str], size: int) -> bytes:
    parts: list[str] = []
    length = 0
    while length < size:
        part = str(rng.randrange(1_000_000)) if rng.random() < 0.3 else rng.choice(words)
        parts.append(part)
        length += len(part) + 1
    return " ".join(parts).encode("ascii")[:size].ljust(size, b".")


def encoded_messages(
    topic: str, value_bytes: int, seed: int, count: int = POOL_SIZE
) -> list[bytes]:
    """Distinct AnyPartition messages to ``topic``, ready to write to a daemon socket."""
    timestamp_ms = 1_700_000_000_000  # fixed: latency comes from probes, not these stamps
    return [
        wire.encode_any_partition(topic, value, b"", timestamp_ms)
        for value in make_values(value_bytes, count, seed)
    ]


def stream_writes(messages: list[bytes], batch: int) -> list[bytes]:
    """Join consecutive messages ``batch`` at a time: what one stream write carries.

    The pool wraps around, so every write holds exactly ``batch`` messages.
    """
    total = len(messages)
    return [
        b"".join(messages[(start + i) % total] for i in range(batch))
        for start in range(0, total, batch)
    ]


def encode_probe(topic: str, value_bytes: int, send_time_ns: int) -> bytes:
    """A probe message stamped with ``send_time_ns``, padded to ``value_bytes``."""
    stamp = PROBE_STAMP.pack(send_time_ns)
    value = stamp + b"p" * (value_bytes - len(stamp))
    return wire.encode_any_partition(topic, value, b"", send_time_ns // 1_000_000)


def probe_send_time_ns(value: bytes) -> int:
    """The send time stamped into a probe's value (ValueError if it is too short)."""
    if len(value) < PROBE_STAMP.size:
        raise ValueError(f"a probe value needs {PROBE_STAMP.size} bytes, got {len(value)}")
    (send_time_ns,) = PROBE_STAMP.unpack_from(value)
    return int(send_time_ns)


@dataclass(frozen=True, slots=True)
class Share:
    """One generator process's part of the run."""

    index: int
    messages: int
    probes: int


def split_messages(messages: int, processes: int, probe_every: int) -> list[Share]:
    """Split ``messages`` over ``processes`` as evenly as possible (the first ones get the
    remainder); each process sends one probe after every ``probe_every`` of its messages
    (0: no probes)."""
    base, extra = divmod(messages, processes)
    shares = []
    for index in range(processes):
        count = base + (1 if index < extra else 0)
        probes = count // probe_every if probe_every > 0 else 0
        shares.append(Share(index, count, probes))
    return shares


def write_sizes(messages: int, batch: int) -> Iterator[int]:
    """How many messages each write carries: full batches, then the remainder."""
    full, rest = divmod(messages, batch)
    for _ in range(full):
        yield batch
    if rest:
        yield rest
