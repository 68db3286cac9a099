"""Read one partition's offset range from Kafka into Arrow record batches (a Spark task).

The range is exact: a librdkafka consumer is ``assign()``-ed at the range's start (no
consumer-group offsets, nothing committed) and reading stops at its end. Every wait is
bounded: by the range end, by the partition's end (librdkafka's end-of-partition
event, so an empty partition or a range past the broker's end cannot hang the task),
and by ``poll_timeout_s`` without progress.

Errors fail the task rather than skip records, with one exception the user opts into:
with ``fail_on_data_loss`` false, offsets that have aged out of retention are skipped
(and the gap logged) and reading goes on from the earliest offset still there.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]
from confluent_kafka import (
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME,
    Consumer,
    KafkaError,
    Message,
    TopicPartition,
)
from pyspark.sql.datasource import InputPartition

from pydory.pipeline.errors import DataLossError, KafkaReadError
from pydory.pipeline.source.offsets import DataLoss, LossKind, PartitionId, Watermarks

__all__ = ["ARROW_SCHEMA", "ARROW_SCHEMA_WITH_HEADERS", "KafkaInputPartition", "read_range"]

logger = logging.getLogger(__name__)

#: The rows' Arrow schema: spark-sql-kafka's columns, as Spark converts its schema to Arrow.
ARROW_SCHEMA = pa.schema(
    [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("timestampType", pa.int32()),
    ]
)
#: spark-sql-kafka's ``headers`` column (``includeHeaders``): each header a key and a value.
ARROW_HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
#: The rows' Arrow schema with the ``headers`` column, last, as spark-sql-kafka places it.
ARROW_SCHEMA_WITH_HEADERS = ARROW_SCHEMA.append(pa.field("headers", ARROW_HEADERS))

# Kafka's timestampType numbers (what spark-sql-kafka reports), from librdkafka's.
_KAFKA_TIMESTAMP_TYPE = {TIMESTAMP_CREATE_TIME: 0, TIMESTAMP_LOG_APPEND_TIME: 1}
_NO_TIMESTAMP_TYPE = -1

_ROWS_PER_BATCH = 10_000
# consume() returns when it has the messages asked for or after this wait; the loop
# then checks the range's deadline. Short, because a range ending in offsets that hold
# no message (transaction markers) is only known complete at the partition's end event.
_CONSUME_WAIT_S = 0.1

# librdkafka reports these while it reconnects or a leader moves; it retries the fetch
# at the same offset by itself, so they cost time (bounded by poll_timeout_s), not data.
_TRANSIENT = {
    KafkaError._TRANSPORT,
    KafkaError._ALL_BROKERS_DOWN,
    KafkaError._RESOLVE,
    KafkaError._TIMED_OUT,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.REQUEST_TIMED_OUT,
}


@dataclass(frozen=True)
class KafkaInputPartition(InputPartition):
    """Everything one Spark task needs to read ``[start, end)`` of one partition.

    Spark pickles it from the driver to an executor.
    """

    topic: str
    partition: int
    start: int
    end: int
    consumer_config: dict[str, Any] = field(hash=False)
    fail_on_data_loss: bool
    poll_timeout_s: float
    include_headers: bool = False


def read_range(task: KafkaInputPartition) -> Iterator[pa.RecordBatch]:
    """Yield the records of ``task``'s range as Arrow batches in :data:`ARROW_SCHEMA`
    (:data:`ARROW_SCHEMA_WITH_HEADERS` when ``task.include_headers``).

    Raises :class:`KafkaReadError` when Kafka fails or stalls, and :class:`DataLossError`
    when offsets of the range are gone and ``task.fail_on_data_loss`` is true.
    """
    if task.start >= task.end:
        return
    consumer = Consumer(task.consumer_config)
    try:
        yield from _RangeReader(task, consumer).batches()
    finally:
        consumer.close()


class _RangeReader:
    """The reading loop of one range, with where it has got to."""

    def __init__(self, task: KafkaInputPartition, consumer: Any) -> None:
        self._task = task
        self._consumer = consumer
        self._next_offset = task.start
        self._at_partition_end = False

    def batches(self) -> Iterator[pa.RecordBatch]:
        self._seek(self._task.start)
        rows = _Rows(self._task.topic, self._task.partition, self._task.include_headers)
        deadline = time.monotonic() + self._task.poll_timeout_s
        while not self._done():
            wanted = min(self._task.end - self._next_offset, _ROWS_PER_BATCH)
            messages = self._consumer.consume(wanted, timeout=_CONSUME_WAIT_S)
            if messages:
                deadline = time.monotonic() + self._task.poll_timeout_s
            elif time.monotonic() > deadline:
                raise self._stalled()
            for message in messages:
                self._take(message, rows)
                if self._done():
                    break
            if len(rows) >= _ROWS_PER_BATCH:
                yield rows.to_batch()
        if len(rows):
            yield rows.to_batch()

    def _done(self) -> bool:
        return self._next_offset >= self._task.end or self._at_partition_end

    def _take(self, message: Message, rows: _Rows) -> None:
        error = message.error()
        offset = message.offset()
        if offset is None:  # librdkafka sets it on every message and partition event
            raise KafkaReadError(f"{self._where()}: librdkafka returned an event without offset")
        if error is None:
            if offset < self._next_offset:
                return  # already read: librdkafka re-delivers after a re-assign
            if offset >= self._task.end:
                self._next_offset = offset  # past the range: it is complete
                return
            rows.add(message, offset)
            self._next_offset = offset + 1
        elif error.code() == KafkaError._PARTITION_EOF:
            self._reached_partition_end(offset)
        elif error.code() == KafkaError._AUTO_OFFSET_RESET:
            self._offset_gone()
        elif error.code() in _TRANSIENT and not error.fatal():
            logger.info("%s: %s (librdkafka retries)", self._where(), error.str())
        else:
            raise KafkaReadError(f"{self._where()}: reading failed: {error.str()}")

    def _reached_partition_end(self, end_of_partition: int) -> None:
        """The broker has nothing at or after ``end_of_partition``."""
        self._next_offset = max(self._next_offset, end_of_partition)
        if end_of_partition >= self._task.end:
            return  # the rest of the range held no records (e.g. transaction markers)
        self._at_partition_end = True
        message = (
            f"{self._where()}: the broker's log ends at offset {end_of_partition}, before "
            f"the range's end {self._task.end}: offsets {end_of_partition} to "
            f"{self._task.end - 1} are not there (log truncated?)"
        )
        if self._task.fail_on_data_loss:
            raise DataLossError(message + ". Set failOnDataLoss=false to continue.")
        logger.warning("%s; continuing", message)

    def _offset_gone(self) -> None:
        """The next offset is below the broker's earliest: retention removed it."""
        earliest, latest = self._consumer.get_watermark_offsets(
            TopicPartition(self._task.topic, self._task.partition),
            timeout=self._task.poll_timeout_s,
            cached=False,
        )
        loss = DataLoss(
            PartitionId(self._task.topic, self._task.partition),
            LossKind.AGED_OUT,
            self._next_offset,
            Watermarks(earliest, latest),
        )
        if self._task.fail_on_data_loss:
            raise DataLossError(loss.describe() + ". Set failOnDataLoss=false to skip them.")
        logger.warning("data loss: %s; continuing from offset %d", loss.describe(), earliest)
        self._next_offset = max(self._next_offset, earliest)
        if not self._done():
            self._seek(self._next_offset)

    def _seek(self, offset: int) -> None:
        self._consumer.assign([TopicPartition(self._task.topic, self._task.partition, offset)])

    def _stalled(self) -> KafkaReadError:
        return KafkaReadError(
            f"{self._where()}: no progress for {self._task.poll_timeout_s:g} s "
            "(kafkaConsumer.pollTimeoutMs): is the partition's leader reachable?"
        )

    def _where(self) -> str:
        task = self._task
        return (
            f"{task.topic}/{task.partition} range [{task.start}, {task.end}) "
            f"at offset {self._next_offset}"
        )


class _Rows:
    """Column buffers for one Arrow batch of a single partition's records."""

    def __init__(self, topic: str, partition: int, include_headers: bool = False) -> None:
        self._topic = topic
        self._partition = partition
        self._include_headers = include_headers
        self._clear()

    def _clear(self) -> None:
        self._keys: list[bytes | None] = []
        self._values: list[bytes | None] = []
        self._offsets: list[int] = []
        self._timestamps_us: list[int] = []
        self._timestamp_types: list[int] = []
        self._headers: list[list[dict[str, str | bytes | None]]] = []

    def __len__(self) -> int:
        return len(self._offsets)

    def add(self, message: Message, offset: int) -> None:
        timestamp_type, timestamp_ms = message.timestamp()
        self._keys.append(message.key())
        self._values.append(message.value())
        self._offsets.append(offset)
        self._timestamps_us.append(timestamp_ms * 1000)
        self._timestamp_types.append(_KAFKA_TIMESTAMP_TYPE.get(timestamp_type, _NO_TIMESTAMP_TYPE))
        if self._include_headers:
            self._headers.append(_headers_of(message))

    def to_batch(self) -> pa.RecordBatch:
        """The buffered rows as one batch; the buffers start empty again."""
        count = len(self)
        columns = [
            pa.array(self._keys, pa.binary()),
            pa.array(self._values, pa.binary()),
            pa.array([self._topic] * count, pa.string()),
            pa.array([self._partition] * count, pa.int32()),
            pa.array(self._offsets, pa.int64()),
            pa.array(self._timestamps_us, pa.timestamp("us", tz="UTC")),
            pa.array(self._timestamp_types, pa.int32()),
        ]
        schema = ARROW_SCHEMA
        if self._include_headers:
            columns.append(pa.array(self._headers, ARROW_HEADERS))
            schema = ARROW_SCHEMA_WITH_HEADERS
        batch = pa.RecordBatch.from_arrays(columns, schema=schema)
        self._clear()
        return batch


def _headers_of(message: Message) -> list[dict[str, str | bytes | None]]:
    """A record's headers as spark-sql-kafka gives them (an empty list when it has none)."""
    # librdkafka hands a consumed record's headers as a list of (key, value) pairs.
    headers: Any = message.headers() or []
    return [{"key": key, "value": value} for key, value in headers]
