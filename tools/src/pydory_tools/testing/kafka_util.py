"""Small Kafka helpers shared by the tests and the demo: topic names, topic creation, read-back.

They work against any Kafka-protocol broker. Reading uses ``assign()`` over every
partition from the beginning, never consumer-group ``subscribe()``, because Tansu
does not support group subscription (design.md, "Kafka for development").
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import TypeVar

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

# confluent_kafka.admin re-exports NewTopic without declaring it; import the definition.
from confluent_kafka.cimpl import NewTopic

from pydory.errors import PydoryError

__all__ = [
    "ConsumedRecord",
    "Delivered",
    "DeliveryFailed",
    "admin_create_topic",
    "consume_all",
    "produce_all",
    "unique_topic",
]

# Consumers need a group.id even with assign(); nothing is ever committed to it.
_READER_GROUP = "pydory-testing-reader"
_T = TypeVar("_T")


@dataclass(frozen=True)
class ConsumedRecord:
    """One message read back from Kafka."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int


@dataclass(frozen=True)
class Delivered:
    """A delivery report: where the broker stored a message, or why it did not."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    error: KafkaError | None


class DeliveryFailed(PydoryError):
    """Some messages were not acknowledged by the broker; ``failures`` holds their reports."""

    def __init__(self, failures: list[Delivered], undelivered: int) -> None:
        first = ", ".join(str(report.error) for report in failures[:3])
        super().__init__(
            f"{len(failures)} messages failed ({first}), {undelivered} still unreported"
        )
        self.failures = failures
        self.undelivered = undelivered


def unique_topic(prefix: str = "test") -> str:
    """A topic name no other test uses, so tests can share one broker."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def admin_create_topic(
    bootstrap_servers: str,
    name: str,
    partitions: int,
    replication_factor: int = 1,
    timeout_s: float = 60.0,
    config: Mapping[str, str] | None = None,
) -> None:
    """Create ``name`` through the Kafka Admin API and wait until the broker confirms.

    ``config`` sets topic-level properties (``min.insync.replicas``, ``max.message.bytes``...).
    """
    # log_level 4 (warning): the client's destruction logs an info line about its
    # background queue that would land in the middle of the demo's progress line.
    admin = AdminClient({"bootstrap.servers": bootstrap_servers, "log_level": 4})
    futures = admin.create_topics(
        [NewTopic(name, partitions, replication_factor, config=dict(config or {}))],
        operation_timeout=timeout_s,
    )
    futures[name].result(timeout=timeout_s)


def produce_all(
    bootstrap_servers: str,
    topic: str,
    messages: Iterable[tuple[bytes | None, bytes]],
    config: Mapping[str, object] | None = None,
    timeout_s: float = 60.0,
) -> list[Delivered]:
    """Produce ``(key, value)`` pairs to ``topic`` and return their delivery reports.

    ``config`` adds or overrides librdkafka producer settings. Raises
    :class:`DeliveryFailed` unless every message is acknowledged within ``timeout_s``.
    """
    reports: list[Delivered] = []
    producer = Producer({"bootstrap.servers": bootstrap_servers, **(config or {})})
    on_delivery = partial(_record_delivery, reports)
    for key, value in messages:
        producer.produce(topic, key=key, value=value, on_delivery=on_delivery)
        producer.poll(0)  # serve delivery reports so the local queue never fills up
    undelivered = producer.flush(timeout_s)
    failures = [report for report in reports if report.error is not None]
    if failures or undelivered:
        raise DeliveryFailed(failures, undelivered)
    return reports


def _record_delivery(reports: list[Delivered], error: KafkaError | None, message: Message) -> None:
    partition = message.partition()
    reports.append(
        Delivered(
            # A message that failed before a partition was chosen (no metadata) has none.
            partition=-1 if partition is None else partition,
            offset=-1 if error is not None else _required(message.offset()),
            key=message.key(),
            value=message.value(),
            error=error,
        )
    )


def consume_all(
    bootstrap_servers: str, topic: str, expected: int, timeout_s: float = 60.0
) -> list[ConsumedRecord]:
    """Read ``topic`` from the beginning of every partition, in partition order per partition.

    Stops once at least ``expected`` records are read *and* every partition has been
    read to its end, so duplicates beyond ``expected`` are returned too. On timeout
    it returns what it has: the caller's assertion then shows what is missing.
    Partition ends come from fetch responses, not from high watermarks, which Tansu
    under-reports.
    """
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap_servers,
            "group.id": _READER_GROUP,
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    try:
        partitions = _partitions_of(consumer, topic, timeout_s)
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        return _read_until_complete(consumer, set(partitions), expected, timeout_s)
    finally:
        consumer.close()


def _partitions_of(consumer: Consumer, topic: str, timeout_s: float) -> list[int]:
    metadata = consumer.list_topics(topic, timeout=timeout_s)
    topic_metadata = metadata.topics[topic]
    if topic_metadata.error is not None:
        raise KafkaException(topic_metadata.error)
    return sorted(topic_metadata.partitions)


def _read_until_complete(
    consumer: Consumer, partitions: set[int], expected: int, timeout_s: float
) -> list[ConsumedRecord]:
    records: list[ConsumedRecord] = []
    at_end: set[int] = set()
    deadline = time.monotonic() + timeout_s
    while len(records) < expected or at_end != partitions:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        # poll() returns as soon as one event is ready; consume(n) would wait for n.
        message = consumer.poll(remaining)
        if message is None:
            continue
        error = message.error()
        partition = _required(message.partition())
        if error is None:
            at_end.discard(partition)
            records.append(_record(message))
        elif error.code() == KafkaError._PARTITION_EOF:
            at_end.add(partition)
        else:
            raise KafkaException(error)
    return records


def _record(message: Message) -> ConsumedRecord:
    _timestamp_type, timestamp_ms = message.timestamp()
    return ConsumedRecord(
        topic=_required(message.topic()),
        partition=_required(message.partition()),
        offset=_required(message.offset()),
        key=message.key(),
        value=message.value(),
        timestamp_ms=timestamp_ms,
    )


def _required(value: _T | None) -> _T:
    """Unwrap a field confluent_kafka types as optional but always sets on fetched messages."""
    if value is None:
        raise KafkaException(KafkaError(KafkaError._BAD_MSG, "fetched message lacks a field"))
    return value
