"""Build the bytes of one client message: defaults and size checks, then pydory.wire."""

from __future__ import annotations

import time

from pydory import wire
from pydory.errors import MessageTooLarge

INT32_MAX = 2**31 - 1


def now_ms() -> int:
    """Milliseconds since the epoch: the timestamp a message gets when the caller gives none."""
    return time.time_ns() // 1_000_000


def check_wire_limits(
    topic_size: int, key_size: int, value_size: int, *, partition_key: bool
) -> None:
    """Raise ``MessageTooLarge`` if the message would not fit the wire format's int32 Size.

    This also covers a key or value over int32. Checked before any bytes are built.
    """
    size = wire.encoded_size(topic_size, key_size, value_size, partition_key)
    if size > INT32_MAX:
        raise MessageTooLarge(
            f"the message would be {size} bytes (key {key_size}, value {value_size}); "
            f"the wire format's Size field allows at most {INT32_MAX}"
        )


def encode_message(
    topic: str,
    value: bytes,
    key: bytes = b"",
    partition_key: int | None = None,
    timestamp_ms: int | None = None,
) -> bytes:
    """Encode one message exactly as a sender's ``send`` writes it.

    Without ``partition_key`` the message is AnyPartition (the daemon spreads messages
    over the topic's available partitions); with it, PartitionKey (the daemon sends it
    to ``partitions[partition_key % len(partitions)]``, the key taken as unsigned 32-bit;
    -2**31 to 2**32-1 are accepted). ``timestamp_ms`` defaults to now.

    Raises ``MessageTooLarge`` past the wire format's size limit, ``pydory.errors.BadTopic``
    for a topic Kafka would refuse (1 to 249 characters of ``[a-zA-Z0-9._-]``), and
    ``ValueError`` for a partition key or timestamp out of range.
    """
    check_wire_limits(len(topic), len(key), len(value), partition_key=partition_key is not None)
    timestamp = now_ms() if timestamp_ms is None else timestamp_ms
    if partition_key is None:
        return wire.encode_any_partition(topic, value, key, timestamp)
    return wire.encode_partition_key(topic, value, partition_key, key, timestamp)
