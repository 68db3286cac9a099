"""``pydory-kafka``: a Kafka source for Spark on PySpark's Python Data Source API.

Spark's JVM Kafka connector is not installable everywhere; this source reads Kafka
with librdkafka instead, with spark-sql-kafka's options and row schema::

    spark.dataSource.register(KafkaDataSource)
    stream = (
        spark.readStream.format("pydory-kafka")
        .option("kafka.bootstrap.servers", "127.0.0.1:9092")
        .option("subscribe", "events")
        .load()
    )

The name is not ``kafka``: Spark's own source would shadow a Python source of that name.

How a micro-batch runs: on the driver, :meth:`KafkaStreamReader.latestOffset` asks the
brokers for their watermarks and names the batch's end offsets (capped by
``maxOffsetsPerTrigger``); Spark checkpoints them; :meth:`KafkaStreamReader.partitions`
turns the batch's start and end into one :class:`KafkaInputPartition` per
topic-partition; on the executors, :meth:`KafkaStreamReader.read` reads exactly that
range (:mod:`pydory.pipeline.source.range_reader`). Options:
:mod:`pydory.pipeline.source.source_options`; offset arithmetic:
:mod:`pydory.pipeline.source.offsets`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from pydory.pipeline.errors import DataLossError, SourceOptionError
from pydory.pipeline.source.offsets import (
    DataLoss,
    OffsetRange,
    Offsets,
    PartitionId,
    Watermarks,
    find_data_loss,
    next_end_offsets,
    offsets_from_json,
    offsets_to_json,
    plan_ranges,
    resolve_offsets,
    starts_to_look_up,
)
from pydory.pipeline.source.source_options import SourceOptions

# Spark starts a Python worker for each planning step of a query (at .load(), then the
# stream's planner), and gives each a fixed 10 s to connect back: the reading side
# (confluent-kafka, pyarrow) is imported where it is used, not by every planner worker.
if TYPE_CHECKING:
    import pyarrow as pa  # type: ignore[import-untyped]

    from pydory.pipeline.source.broker_offsets import BrokerOffsets
    from pydory.pipeline.source.range_reader import KafkaInputPartition

__all__ = [
    "KAFKA_SCHEMA",
    "KAFKA_SCHEMA_WITH_HEADERS",
    "SOURCE_NAME",
    "KafkaBatchReader",
    "KafkaDataSource",
    "KafkaStreamReader",
]

logger = logging.getLogger(__name__)

SOURCE_NAME = "pydory-kafka"

#: spark-sql-kafka's row schema (without its optional headers column).
KAFKA_SCHEMA = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
)
#: With ``includeHeaders``: spark-sql-kafka's ``headers`` column last.
KAFKA_SCHEMA_WITH_HEADERS = StructType(
    [
        *KAFKA_SCHEMA.fields,
        StructField(
            "headers",
            ArrayType(
                StructType([StructField("key", StringType()), StructField("value", BinaryType())])
            ),
        ),
    ]
)

OffsetJson = dict[str, Any]


class KafkaDataSource(DataSource):
    """The ``pydory-kafka`` format: streams (``readStream``) and batches (``read``).

    Spark builds it with the query's options at ``.load()``, so the options are checked
    here: a bad one fails the ``.load()`` call, naming the option. What applies to one
    kind of read only (``endingOffsets`` to batches) is checked when the query starts.
    """

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        SourceOptions.parse(self.options, streaming=None)

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> StructType:
        include_headers = SourceOptions.parse(self.options, streaming=None).include_headers
        return KAFKA_SCHEMA_WITH_HEADERS if include_headers else KAFKA_SCHEMA

    def streamReader(self, schema: StructType) -> KafkaStreamReader:
        try:
            return KafkaStreamReader(SourceOptions.parse(self.options, streaming=True))
        except SourceOptionError as refusal:
            # Raised from here, PySpark's stream runner hides it behind an error of its
            # own (an UnboundLocalError); raised from the first planning call, it is the
            # query's error as it stands.
            return _RefusingStreamReader(refusal)

    def reader(self, schema: StructType) -> KafkaBatchReader:
        return KafkaBatchReader(SourceOptions.parse(self.options, streaming=False))


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The streaming side: plans micro-batches on the driver, reads ranges on executors.

    Spark builds one instance on the driver for planning and pickles another to the
    executors for :meth:`read`; the broker connection is opened on first use, so
    building and pickling stay cheap.
    """

    def __init__(self, options: SourceOptions) -> None:
        self._options = options
        self._brokers: BrokerOffsets | None = None
        self._available_now_target: dict[PartitionId, int] | None = None
        self._latest_seen: dict[PartitionId, int] | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_brokers"] = None  # a live consumer does not travel; executors never need it
        return state

    # --- planning (driver) ---

    def initialOffset(self) -> OffsetJson:
        """Where a new query starts: ``startingOffsets`` resolved against the brokers."""
        available = self._available()
        return offsets_to_json(resolve_offsets(self._options.starting_offsets, available))

    def getDefaultReadLimit(self) -> ReadLimit:
        """``maxOffsetsPerTrigger`` as Spark's read limit (counted in offsets)."""
        cap = self._options.max_offsets_per_trigger
        return ReadAllAvailable() if cap is None else ReadMaxRows(cap)

    def latestOffset(self, start: OffsetJson, limit: ReadLimit) -> OffsetJson:
        """The next batch's end: what the brokers hold, within ``limit`` and the target.

        Offsets between ``start`` and what the brokers still hold that have aged out
        fail the query, or with ``failOnDataLoss`` false are logged and skipped.
        """
        start_offsets = offsets_from_json(start)
        available = self._available()
        _check_data_loss(find_data_loss(start_offsets, available), self._options.fail_on_data_loss)
        max_offsets = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        end = next_end_offsets(start_offsets, available, max_offsets, self._available_now_target)
        return offsets_to_json(end)

    def prepareForTriggerAvailableNow(self) -> None:
        """Trigger.AvailableNow: read up to what the brokers hold now, and no further."""
        available = self._available()
        self._available_now_target = {
            partition_id: marks.latest for partition_id, marks in available.items()
        }

    def reportLatestOffset(self) -> OffsetJson | None:
        """What the brokers held at the last look (the query's progress shows it)."""
        return None if self._latest_seen is None else offsets_to_json(self._latest_seen)

    def partitions(self, start: OffsetJson, end: OffsetJson) -> Sequence[InputPartition]:
        """One task per topic-partition with records between ``start`` and ``end``."""
        start_offsets = offsets_from_json(start)
        end_offsets = offsets_from_json(end)
        earliest = self._earliest(starts_to_look_up(start_offsets, end_offsets))
        return [
            _task(self._options, offset_range)
            for offset_range in plan_ranges(start_offsets, end_offsets, earliest)
        ]

    def commit(self, end: OffsetJson) -> None:
        """Nothing to do: Spark's checkpoint holds the offsets, Kafka keeps no group state."""

    def stop(self) -> None:
        """Close the broker connection (the query has ended)."""
        if self._brokers is not None:
            self._brokers.close()
            self._brokers = None

    # --- reading (executors) ---

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """The records of one planned range (see :func:`read_range`)."""
        from pydory.pipeline.source.range_reader import KafkaInputPartition, read_range

        if not isinstance(partition, KafkaInputPartition):
            raise TypeError(f"not a pydory-kafka partition: {partition!r}")
        return read_range(partition)

    # --- helpers ---

    def _broker_offsets(self) -> BrokerOffsets:
        from pydory.pipeline.source.broker_offsets import BrokerOffsets

        if self._brokers is None:
            self._brokers = BrokerOffsets(
                self._options.consumer_config(), self._options.poll_timeout_s
            )
        return self._brokers

    def _available(self) -> dict[PartitionId, Watermarks]:
        available = self._broker_offsets().available(self._options.topics)
        self._latest_seen = {
            partition_id: marks.latest for partition_id, marks in available.items()
        }
        return available

    def _earliest(self, partitions: list[PartitionId]) -> dict[PartitionId, int]:
        if not partitions:
            return {}
        marks = self._broker_offsets().watermarks(partitions)
        return {partition_id: mark.earliest for partition_id, mark in marks.items()}


class _RefusingStreamReader(KafkaStreamReader):
    """A stream reader whose options were refused: every planning call raises the refusal."""

    def __init__(self, refusal: SourceOptionError) -> None:
        self._refusal = refusal
        self._brokers = None  # what stop() and reportLatestOffset() read
        self._latest_seen = None

    def initialOffset(self) -> OffsetJson:
        raise self._refusal

    def getDefaultReadLimit(self) -> ReadLimit:
        raise self._refusal

    def latestOffset(self, start: OffsetJson, limit: ReadLimit) -> OffsetJson:
        raise self._refusal

    def prepareForTriggerAvailableNow(self) -> None:
        raise self._refusal

    def partitions(self, start: OffsetJson, end: OffsetJson) -> Sequence[InputPartition]:
        raise self._refusal


class KafkaBatchReader(DataSourceReader):
    """The batch side (``spark.read``): ``startingOffsets`` to ``endingOffsets``, once."""

    def __init__(self, options: SourceOptions) -> None:
        self._options = options

    def partitions(self) -> Sequence[InputPartition]:
        """One task per topic-partition with records in the requested range."""
        from pydory.pipeline.source.broker_offsets import BrokerOffsets

        brokers = BrokerOffsets(self._options.consumer_config(), self._options.poll_timeout_s)
        try:
            available = brokers.available(self._options.topics)
        finally:
            brokers.close()
        start = resolve_offsets(self._options.starting_offsets, available)
        end = resolve_offsets(self._options.ending_offsets, available)
        _check_order(start, end)
        _check_data_loss(find_data_loss(start, available), self._options.fail_on_data_loss)
        return [
            _task(self._options, offset_range)
            for offset_range in plan_ranges(start, end, earliest={})
        ]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """The records of one planned range; nothing for Spark's placeholder partition."""
        from pydory.pipeline.source.range_reader import KafkaInputPartition, read_range

        if not isinstance(partition, KafkaInputPartition):
            return iter(())  # Spark plans one empty partition when there is no range
        return read_range(partition)


def _task(options: SourceOptions, offset_range: OffsetRange) -> KafkaInputPartition:
    from pydory.pipeline.source.range_reader import KafkaInputPartition

    return KafkaInputPartition(
        topic=offset_range.partition.topic,
        partition=offset_range.partition.partition,
        start=offset_range.start,
        end=offset_range.end,
        consumer_config=options.consumer_config(),
        fail_on_data_loss=options.fail_on_data_loss,
        poll_timeout_s=options.poll_timeout_s,
        include_headers=options.include_headers,
    )


def _check_data_loss(losses: list[DataLoss], fail_on_data_loss: bool) -> None:
    """Fail on ``losses``, or log each (a WARN with the count) and let reading skip them."""
    if not losses:
        return
    if fail_on_data_loss:
        details = "\n".join(f"  {loss.describe()}" for loss in losses)
        raise DataLossError(
            "pydory-kafka: offsets the query must read are no longer in Kafka:\n"
            f"{details}\nSet failOnDataLoss=false to continue from the earliest offsets "
            "still available."
        )
    for loss in losses:
        logger.warning("data loss (failOnDataLoss=false, continuing): %s", loss.describe())


def _check_order(start: Offsets, end: Mapping[PartitionId, int]) -> None:
    backwards = [
        str(partition_id) for partition_id in sorted(end) if start[partition_id] > end[partition_id]
    ]
    if backwards:
        raise SourceOptionError(
            "startingOffsets", f"starts after endingOffsets for {', '.join(backwards)}"
        )
