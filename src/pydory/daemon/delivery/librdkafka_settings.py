"""Dory's settings, mapped onto librdkafka properties (docs/librdkafka-mapping.md).

One place answers "what does this Dory element become in librdkafka?", so the mapping
document and the code can be read side by side: :func:`delivery_settings` and
:func:`producer_profile` read the config, :func:`producer_properties` makes one
producer's properties from them.

Every librdkafka client pydory makes takes its properties from here: the producers
(:func:`producer_properties`), the metadata client (:func:`metadata_client_properties`)
and the books' publisher and its admin client (:func:`books_producer_properties`,
:func:`books_admin_properties`).

Rule: every librdkafka property pydory sets is set here alone, from the config (the
callbacks aside, which each backend binds to itself, and ``log.queue``, which
``_cproducer.c`` sets because its poll reads log lines from the main queue: how it
serves events, not a setting), and a property of the config's <librdkafka> section
that pydory owns (``pydory.config.librdkafka``) is refused here too
(``DeliverySettings`` cannot hold one), as a second line of defence behind the config
loader.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydory.config import Config
from pydory.config.librdkafka import librdkafka_property_problem
from pydory.config.model import BatchingThresholds, CompressionType, OverloadPolicy
from pydory.daemon.delivery.kafka_stats import STATS_INTERVAL_MS
from pydory.daemon.spool.write_ahead import REPLAY_BURST
from pydory.errors import ConfigError

#: librdkafka's largest accepted batch.num.messages.
MAX_BATCH_MESSAGES = 1_000_000
#: librdkafka's per-attempt deadline for a message (``message.timeout.ms``) unless the
#: config's <librdkafka> section sets one. A message whose partition has no leader waits
#: this long in librdkafka before coming back to us for a reroute.
DEFAULT_MESSAGE_TIMEOUT_MS = 30_000
#: Used for ``linger.ms`` when Dory's batching ``time`` is "disable": librdkafka needs a
#: finite linger, smaller than message.timeout.ms.
DISABLED_TIME_LINGER_MS = 10_000
#: Added to Dory's produceRequestDataLimit (key+value bytes) to allow for protocol overhead.
REQUEST_OVERHEAD_BYTES = 64 * 1024
#: Where a refused <librdkafka> property is reported.
LIBRDKAFKA_ELEMENT = "/doryConfig/librdkafka"


@dataclass(frozen=True, slots=True)
class ProducerProfile:
    """The librdkafka settings that differ between topics: one producer per distinct profile."""

    linger_ms: int
    batch_messages: int
    batch_bytes: int
    compression: str = "none"
    compression_level: int | None = None

    def properties(self) -> dict[str, Any]:
        props: dict[str, Any] = {
            "linger.ms": self.linger_ms,
            # A message gets DEFAULT_MESSAGE_TIMEOUT_MS beyond its linger: librdkafka insists
            # that a message may wait longer than it lingers.
            "message.timeout.ms": self.linger_ms + DEFAULT_MESSAGE_TIMEOUT_MS,
            "batch.num.messages": self.batch_messages,
            "batch.size": self.batch_bytes,
            "compression.type": self.compression,
        }
        if self.compression_level is not None:
            props["compression.level"] = self.compression_level
        return props


@dataclass(frozen=True, slots=True)
class DeliverySettings:
    """Settings common to every producer (from <kafkaConfig>, <msgDelivery>, <batching>)."""

    bootstrap_servers: str
    client_id: str = "pydory"
    replication_timeout_ms: int = 10_000
    socket_timeout_ms: int = 60_000
    message_max_bytes: int = 1_000_000
    produce_request_data_limit: int = 1024 * 1024
    max_failed_delivery_attempts: int = 5
    queue_max_bytes: int = 128 * 1024 * 1024
    extra: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        refuse_owned_properties(self.extra)

    def properties(self) -> dict[str, Any]:
        props: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap_servers,
            "client.id": self.client_id,
            "enable.idempotence": True,
            "request.timeout.ms": self.replication_timeout_ms,
            "socket.timeout.ms": self.socket_timeout_ms,
            "message.max.bytes": self.produce_request_data_limit + REQUEST_OVERHEAD_BYTES,
            "retries": max(1, self.max_failed_delivery_attempts),
            # The memory pool (maxBuffer) is the real limit; librdkafka's queue must never
            # refuse before it does.
            "queue.buffering.max.messages": 2_147_483_647,
            "queue.buffering.max.kbytes": min(2_147_483_647, 2 * self.queue_max_bytes // 1024),
            "logger": logging.getLogger("pydory.librdkafka"),
        }
        props.update(self.extra)  # TLS, SASL, ...: every client of the cluster needs them
        return props


def refuse_owned_properties(extra: Mapping[str, str]) -> None:
    """Raise ConfigError if the config's <librdkafka> section sets a property pydory owns
    (the loader refused it already: settings built otherwise get the same answer)."""
    for name in extra:
        problem = librdkafka_property_problem(name)
        if problem is not None:
            raise ConfigError(problem, LIBRDKAFKA_ELEMENT)


def producer_properties(
    settings: DeliverySettings, profile: ProducerProfile, *, statistics: bool
) -> dict[str, Any]:
    """Everything one producer is created with, but its callbacks: the shared settings,
    the profile's, and (with ``statistics``) librdkafka's statistics every
    STATS_INTERVAL_MS. The config's <librdkafka> section has the last word (e.g.
    message.timeout.ms)."""
    properties = {**settings.properties(), **profile.properties(), **settings.extra}
    if statistics:
        properties = {"statistics.interval.ms": STATS_INTERVAL_MS, **properties}
    return properties


def metadata_client_properties(cluster: Mapping[str, Any]) -> dict[str, Any]:
    """The metadata client's: the cluster's, and a topic it asks about auto-created (how
    Dory requests topic creation: list_topics(topic) on a producer)."""
    return {**cluster, "allow.auto.create.topics": True}


def books_producer_properties(cluster: Mapping[str, Any]) -> dict[str, Any]:
    """The books' publisher's producer: the cluster's, each record written once and
    acknowledged by every in-sync replica, a few records per request, and the books'
    topic never auto-created (it is created compacted, or not at all)."""
    return {
        **cluster,
        "enable.idempotence": True,
        "linger.ms": 50,
        "acks": "all",
        "allow.auto.create.topics": False,
    }


def books_admin_properties(cluster: Mapping[str, Any]) -> dict[str, Any]:
    """The admin client that looks the books' topic up (and creates it)."""
    return {**cluster, "allow.auto.create.topics": False}


def delivery_settings(config: Config) -> DeliverySettings:
    """The properties shared by every producer (and the metadata client). Raises
    ConfigError if <librdkafka> sets a property pydory owns."""
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
        # (max 1: a file without <batching> has messageMaxBytes 0, and librdkafka's
        # batch.size starts at 1; every message is too long for it then anyway.)
        linger_ms, batch_messages, batch_bytes = 0, 1, max(1, message_max)
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
