"""Dory's settings, mapped onto librdkafka properties (docs/librdkafka-mapping.md).

One place answers "what does this Dory element become in librdkafka?", so the mapping
document and the code can be read side by side.
"""

from __future__ import annotations

from pydory.config import Config
from pydory.config.model import BatchingThresholds, CompressionType, OverloadPolicy
from pydory.daemon.delivery.dispatcher import (
    DISABLED_TIME_LINGER_MS,
    DeliverySettings,
    ProducerProfile,
)
from pydory.daemon.spool.write_ahead import REPLAY_BURST

#: librdkafka's largest accepted batch.num.messages.
MAX_BATCH_MESSAGES = 1_000_000


def delivery_settings(config: Config) -> DeliverySettings:
    """The properties shared by every producer."""
    return DeliverySettings(
        bootstrap_servers=config.bootstrap_servers,
        client_id=config.kafka.client_id,
        replication_timeout_ms=config.kafka.replication_timeout_ms,
        socket_timeout_ms=config.delivery.kafka_socket_timeout_s * 1000,
        message_max_bytes=config.batching.message_max_bytes,
        produce_request_data_limit=config.batching.produce_request_data_limit,
        max_failed_delivery_attempts=config.delivery.max_failed_delivery_attempts,
        queue_max_bytes=config.input_config.max_buffer + held_overshoot_bytes(config),
        extra=dict(config.librdkafka),
    )


def held_overshoot_bytes(config: Config) -> int:
    """How far past maxBuffer the pool may go when messages it refuses are held anyway.

    Under the backpressure policy a read burst already read when the pool runs out is
    charged all the same (``MemoryPool.force_allocate``), and a spool replay charges a
    whole burst of up to :data:`REPLAY_BURST` messages. librdkafka's own byte limit is
    set from the pool's; without this headroom it refused those messages as "queue full"
    and they were discarded ``no_memory`` after all.
    """
    spool = config.spool
    if spool.path is None and spool.overload_policy is not OverloadPolicy.BACKPRESSURE:
        return 0
    read_burst = max(config.input_config.max_stream_msg_size, 256 * 1024)
    return max(REPLAY_BURST * config.batching.message_max_bytes, 2 * read_burst)


def producer_profile(config: Config, topic: str) -> ProducerProfile:
    """The producer settings ``topic`` needs: batching thresholds and compression."""
    batching = config.batching_for(topic)
    thresholds = batching.thresholds
    message_max = config.batching.message_max_bytes
    if thresholds is None:
        # Batching disabled: send as soon as possible, one request per message or so.
        linger_ms, batch_messages, batch_bytes = 0, 1, message_max
    else:
        linger_ms, batch_messages, batch_bytes = _batch_limits(thresholds, message_max)
    codec = config.compression_for(topic)
    compression = codec.type
    if compression is not CompressionType.NONE and codec.min_size > batch_bytes:
        # No batch of this topic can reach minSize: Dory would never compress it.
        compression = CompressionType.NONE
    return ProducerProfile(
        linger_ms=linger_ms,
        batch_messages=batch_messages,
        batch_bytes=batch_bytes,
        compression=str(compression),
        compression_level=codec.level if compression is not CompressionType.NONE else None,
    )


def _batch_limits(thresholds: BatchingThresholds, message_max: int) -> tuple[int, int, int]:
    linger_ms = thresholds.time_ms if thresholds.time_ms is not None else DISABLED_TIME_LINGER_MS
    batch_messages = min(thresholds.messages or MAX_BATCH_MESSAGES, MAX_BATCH_MESSAGES)
    # A batch is one Kafka message set: it must fit the broker's message.max.bytes.
    batch_bytes = min(thresholds.bytes or message_max, message_max)
    return linger_ms, max(1, batch_messages), max(1, batch_bytes)
