"""The pydory-kafka source's readers, driven directly against Apache Kafka.

No Spark session and no running query: these tests build the readers as Spark would,
plan offsets and partitions, and call ``read()`` on a partition like an executor. They
run on the session's Apache Kafka broker (``kafka_broker``), except the faults only
librdkafka's mock cluster makes on demand: a broker down, an injected error code, and
old segments dropped within seconds (data loss).
"""

from __future__ import annotations

import json
import logging
import pickle
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Producer
from pyspark.sql.datasource import InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from pydory.pipeline.errors import DataLossError, KafkaReadError
from pydory.pipeline.source.kafka_source import (
    KAFKA_SCHEMA,
    KAFKA_SCHEMA_WITH_HEADERS,
    KafkaBatchReader,
    KafkaDataSource,
    KafkaStreamReader,
)
from pydory.pipeline.source.range_reader import ARROW_SCHEMA, ARROW_SCHEMA_WITH_HEADERS
from pydory_tools.testing.kafka_broker import KafkaCluster
from pydory_tools.testing.kafka_util import produce_all
from pydory_tools.testing.mock_cluster import ApiKey, ErrorCode, MockCluster

# The mock cluster keeps about 5 MB per partition: 1,500 values of 10 kB push the
# first ~1,000 offsets out of retention.
AGE_OUT_COUNT = 1_500
AGE_OUT_VALUE = b"x" * 10_000


def produce_to(bootstrap: str, topic: str, counts: dict[int, int], **extra: Any) -> None:
    """Produce ``counts[p]`` records to partition ``p``; value ``p:i``, key ``k<i>``."""
    producer = Producer({"bootstrap.servers": bootstrap})
    for partition, count in counts.items():
        for index in range(count):
            value = extra.get("value", f"{partition}:{index}".encode())
            producer.produce(
                topic,
                key=f"k{index}".encode(),
                value=value,
                partition=partition,
                **{key: v for key, v in extra.items() if key != "value"},
            )
            producer.poll(0)
    assert producer.flush(30) == 0


def stream_reader(bootstrap: str, topics: str, **options: str) -> KafkaStreamReader:
    source = KafkaDataSource({"kafka.bootstrap.servers": bootstrap, "subscribe": topics, **options})
    reader = source.streamReader(KAFKA_SCHEMA)
    assert isinstance(reader, KafkaStreamReader)
    return reader


def batch_reader(bootstrap: str, topics: str, **options: str) -> KafkaBatchReader:
    source = KafkaDataSource({"kafka.bootstrap.servers": bootstrap, "subscribe": topics, **options})
    return source.reader(KAFKA_SCHEMA)


def read_rows(reader: Any, partitions: Iterable[Any]) -> list[dict[str, Any]]:
    """What executors would produce for ``partitions``, as row dicts."""
    rows: list[dict[str, Any]] = []
    for partition in partitions:
        for batch in reader.read(partition):
            assert batch.schema.equals(ARROW_SCHEMA) or batch.schema.equals(
                ARROW_SCHEMA_WITH_HEADERS
            )
            rows.extend(batch.to_pylist())
    return rows


def task(topic: str, partition: int, start: int, end: int, bootstrap: str, **kw: Any) -> Any:
    """A hand-made partition, as the driver would plan it."""
    reader = stream_reader(bootstrap, topic, **kw)
    planned = reader.partitions({topic: {str(partition): start}}, {topic: {str(partition): end}})
    assert len(planned) == 1
    return reader, planned[0]


@pytest.fixture
def topic(unique_topic: Callable[[str], str]) -> str:
    return unique_topic("src")


# --- schema --------------------------------------------------------------------------------


def test_arrow_schema_is_what_spark_expects_for_the_kafka_schema() -> None:
    # Spark refuses batches whose Arrow schema differs from its conversion of ours.
    assert ARROW_SCHEMA.equals(to_arrow_schema(KAFKA_SCHEMA, timezone="UTC"))
    assert KAFKA_SCHEMA.fieldNames() == [
        "key",
        "value",
        "topic",
        "partition",
        "offset",
        "timestamp",
        "timestampType",
    ]


def test_with_include_headers_the_rows_end_with_spark_s_headers_column() -> None:
    source = KafkaDataSource(
        {"kafka.bootstrap.servers": "x:1", "subscribe": "a", "includeHeaders": "true"}
    )

    assert source.schema() == KAFKA_SCHEMA_WITH_HEADERS
    assert KAFKA_SCHEMA_WITH_HEADERS.fieldNames() == [*KAFKA_SCHEMA.fieldNames(), "headers"]
    assert ARROW_SCHEMA_WITH_HEADERS.equals(
        to_arrow_schema(KAFKA_SCHEMA_WITH_HEADERS, timezone="UTC")
    )
    assert KafkaDataSource({"kafka.bootstrap.servers": "x:1", "subscribe": "a"}).schema() == (
        KAFKA_SCHEMA
    )


@pytest.mark.kafka
@pytest.mark.slow
def test_include_headers_reads_each_record_s_headers(
    kafka_broker: KafkaCluster, topic: str
) -> None:
    kafka_broker.create_topic(topic, 1)
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap_servers})
    producer.produce(topic, b"a", partition=0, headers=[("pydory-id", b"h/01/1/0"), ("x", None)])
    producer.produce(topic, b"b", partition=0)
    assert producer.flush(30) == 0

    reader, partition = task(topic, 0, 0, 2, kafka_broker.bootstrap_servers, includeHeaders="true")
    rows = read_rows(reader, [partition])

    assert [row["headers"] for row in rows] == [
        [{"key": "pydory-id", "value": b"h/01/1/0"}, {"key": "x", "value": None}],
        [],
    ]


# --- streaming: planning and reading -------------------------------------------------------


@pytest.mark.kafka
@pytest.mark.slow
def test_plan_and_read_a_whole_partition(kafka_broker: KafkaCluster, topic: str) -> None:
    # A timestamp from 2023, past Kafka's default retention: keep it for the test's length.
    kafka_broker.create_topic(topic, 1, config={"retention.ms": "-1"})
    produce_to(kafka_broker.bootstrap_servers, topic, {0: 5}, timestamp=1_700_000_000_123)
    reader = stream_reader(kafka_broker.bootstrap_servers, topic, startingOffsets="earliest")

    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadAllAvailable())
    partitions = reader.partitions(start, end)
    rows = read_rows(reader, partitions)

    assert start == {topic: {"0": 0}}
    assert end == {topic: {"0": 5}}
    assert [(p.topic, p.partition, p.start, p.end) for p in partitions] == [(topic, 0, 0, 5)]
    assert rows[0] == {
        "key": b"k0",
        "value": b"0:0",
        "topic": topic,
        "partition": 0,
        "offset": 0,
        "timestamp": datetime(2023, 11, 14, 22, 13, 20, 123_000, tzinfo=UTC),
        "timestampType": 0,  # CreateTime, in Kafka's numbering
    }
    assert [row["offset"] for row in rows] == [0, 1, 2, 3, 4]
    assert [row["value"] for row in rows] == [f"0:{i}".encode() for i in range(5)]


@pytest.mark.kafka
@pytest.mark.slow
def test_read_returns_exactly_the_range(kafka_broker: KafkaCluster, topic: str) -> None:
    kafka_broker.create_topic(topic, 1)
    produce_to(kafka_broker.bootstrap_servers, topic, {0: 20})

    reader, partition = task(topic, 0, 3, 7, kafka_broker.bootstrap_servers)

    assert [row["offset"] for row in read_rows(reader, [partition])] == [3, 4, 5, 6]


@pytest.mark.kafka
@pytest.mark.slow
def test_null_keys_and_values_survive(kafka_broker: KafkaCluster, topic: str) -> None:
    kafka_broker.create_topic(topic, 1)
    produce_all(kafka_broker.bootstrap_servers, topic, [(None, b"v"), (b"k", b"")])

    reader, partition = task(topic, 0, 0, 2, kafka_broker.bootstrap_servers)
    rows = read_rows(reader, [partition])

    assert [(row["key"], row["value"]) for row in rows] == [(None, b"v"), (b"k", b"")]


@pytest.mark.kafka
@pytest.mark.slow
def test_uneven_partitions_plan_one_range_each_with_data(
    kafka_broker: KafkaCluster, topic: str
) -> None:
    kafka_broker.create_topic(topic, 4)
    counts = {0: 300, 1: 20, 2: 0, 3: 1}
    produce_to(kafka_broker.bootstrap_servers, topic, counts)
    reader = stream_reader(kafka_broker.bootstrap_servers, topic, startingOffsets="earliest")

    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadAllAvailable())
    partitions = reader.partitions(start, end)
    rows = read_rows(reader, partitions)

    assert end == {topic: {"0": 300, "1": 20, "2": 0, "3": 1}}
    assert sorted(p.partition for p in partitions) == [0, 1, 3]
    landed = {(row["partition"], row["offset"]) for row in rows}
    assert len(rows) == len(landed) == 321
    assert landed == {(p, o) for p, count in counts.items() for o in range(count)}


@pytest.mark.kafka
@pytest.mark.slow
def test_max_offsets_per_trigger_caps_each_batch_until_caught_up(
    kafka_broker: KafkaCluster, topic: str
) -> None:
    kafka_broker.create_topic(topic, 3)
    produce_to(kafka_broker.bootstrap_servers, topic, {0: 90, 1: 30, 2: 5})
    reader = stream_reader(
        kafka_broker.bootstrap_servers, topic, startingOffsets="earliest", maxOffsetsPerTrigger="40"
    )
    limit = reader.getDefaultReadLimit()
    assert limit == ReadMaxRows(40)

    start = reader.initialOffset()
    batch_sizes = []
    offsets_read: list[tuple[int, int]] = []
    for _ in range(10):
        end = reader.latestOffset(start, limit)
        if end == start:
            break
        rows = read_rows(reader, reader.partitions(start, end))
        batch_sizes.append(len(rows))
        offsets_read.extend((row["partition"], row["offset"]) for row in rows)
        start = end

    assert batch_sizes == [40, 40, 40, 5]
    assert len(set(offsets_read)) == len(offsets_read) == 125


@pytest.mark.kafka
@pytest.mark.slow
def test_read_all_available_overrides_the_configured_cap(
    kafka_broker: KafkaCluster, topic: str
) -> None:
    kafka_broker.create_topic(topic, 1)
    produce_to(kafka_broker.bootstrap_servers, topic, {0: 50})
    reader = stream_reader(
        kafka_broker.bootstrap_servers, topic, startingOffsets="earliest", maxOffsetsPerTrigger="10"
    )

    assert reader.latestOffset(reader.initialOffset(), ReadAllAvailable()) == {topic: {"0": 50}}


@pytest.mark.kafka
@pytest.mark.slow
def test_starting_offsets_latest_and_json(kafka_broker: KafkaCluster, topic: str) -> None:
    kafka_broker.create_topic(topic, 2)
    produce_to(kafka_broker.bootstrap_servers, topic, {0: 10, 1: 4})

    latest = stream_reader(kafka_broker.bootstrap_servers, topic).initialOffset()
    chosen = stream_reader(
        kafka_broker.bootstrap_servers,
        topic,
        startingOffsets=json.dumps({topic: {"0": 7, "1": -2}}),
    ).initialOffset()

    assert latest == {topic: {"0": 10, "1": 4}}
    assert chosen == {topic: {"0": 7, "1": 0}}


@pytest.mark.kafka
@pytest.mark.slow
def test_a_topic_created_later_is_read_from_its_start(
    kafka_broker: KafkaCluster, topic: str
) -> None:
    reader = stream_reader(kafka_broker.bootstrap_servers, topic, startingOffsets="earliest")
    start = reader.initialOffset()
    assert start == {}

    kafka_broker.create_topic(topic, 2)
    produce_to(kafka_broker.bootstrap_servers, topic, {0: 3, 1: 2})
    end = reader.latestOffset(start, ReadAllAvailable())
    rows = read_rows(reader, reader.partitions(start, end))

    assert end == {topic: {"0": 3, "1": 2}}
    assert len(rows) == 5


@pytest.mark.kafka
@pytest.mark.slow
def test_available_now_stops_at_what_was_there_when_it_began(
    kafka_broker: KafkaCluster, topic: str
) -> None:
    kafka_broker.create_topic(topic, 1)
    produce_to(kafka_broker.bootstrap_servers, topic, {0: 10})
    reader = stream_reader(kafka_broker.bootstrap_servers, topic, startingOffsets="earliest")
    start = reader.initialOffset()

    reader.prepareForTriggerAvailableNow()
    produce_to(kafka_broker.bootstrap_servers, topic, {0: 5})
    end = reader.latestOffset(start, ReadAllAvailable())

    assert end == {topic: {"0": 10}}
    assert reader.latestOffset(end, ReadAllAvailable()) == end  # done: Spark stops the query


@pytest.mark.kafka
@pytest.mark.slow
def test_stream_reader_and_partitions_pickle_after_planning(
    kafka_broker: KafkaCluster, topic: str
) -> None:
    # Spark pickles the reader to executors; the live metadata consumer must not travel.
    kafka_broker.create_topic(topic, 1)
    produce_to(kafka_broker.bootstrap_servers, topic, {0: 3})
    reader = stream_reader(kafka_broker.bootstrap_servers, topic, startingOffsets="earliest")
    start = reader.initialOffset()
    partitions = reader.partitions(start, reader.latestOffset(start, ReadAllAvailable()))

    copy = pickle.loads(pickle.dumps(reader))
    partition_copy = pickle.loads(pickle.dumps(partitions[0]))

    assert partition_copy == partitions[0]
    assert len(read_rows(copy, [partition_copy])) == 3
    reader.stop()


# --- bounded waits -------------------------------------------------------------------------


@pytest.mark.kafka
@pytest.mark.slow
def test_a_range_past_the_end_of_an_empty_partition_does_not_hang(
    kafka_broker: KafkaCluster, topic: str
) -> None:
    kafka_broker.create_topic(topic, 1)
    reader, partition = task(
        topic, 0, 0, 10, kafka_broker.bootstrap_servers, failOnDataLoss="false"
    )

    assert read_rows(reader, [partition]) == []


@pytest.mark.kafka
@pytest.mark.slow
def test_a_range_past_the_end_fails_when_data_loss_is_fatal(
    kafka_broker: KafkaCluster, topic: str
) -> None:
    kafka_broker.create_topic(topic, 1)
    produce_to(kafka_broker.bootstrap_servers, topic, {0: 4})
    reader, partition = task(topic, 0, 0, 10, kafka_broker.bootstrap_servers)

    with pytest.raises(DataLossError, match=rf"{topic}/0 .*offsets 4 to 9 are not there"):
        read_rows(reader, [partition])


def test_an_unreachable_partition_fails_the_task_after_the_poll_timeout(
    mock_cluster: MockCluster, topic: str
) -> None:
    mock_cluster.create_topic(topic, 1)
    produce_to(mock_cluster.bootstrap_servers, topic, {0: 4})
    reader, partition = task(
        topic, 0, 0, 4, mock_cluster.bootstrap_servers, **{"kafkaConsumer.pollTimeoutMs": "1500"}
    )
    for broker_id in mock_cluster.broker_ids:
        mock_cluster.broker_down(broker_id)

    with pytest.raises(KafkaReadError, match=r"no progress for 1\.5 s"):
        read_rows(reader, [partition])


def test_a_kafka_error_fails_the_task_instead_of_skipping(
    mock_cluster: MockCluster, topic: str
) -> None:
    mock_cluster.create_topic(topic, 1)
    produce_to(mock_cluster.bootstrap_servers, topic, {0: 4})
    reader, partition = task(topic, 0, 0, 4, mock_cluster.bootstrap_servers)
    mock_cluster.push_request_errors(ApiKey.FETCH, [ErrorCode.TOPIC_AUTHORIZATION_FAILED] * 5)

    with pytest.raises(KafkaReadError, match=rf"{topic}/0 .*Topic authorization failed"):
        read_rows(reader, [partition])


# --- data loss -----------------------------------------------------------------------------


@pytest.fixture
def aged_topic(mock_cluster: MockCluster, topic: str) -> str:
    """A one-partition topic whose first offsets have aged out of retention."""
    mock_cluster.create_topic(topic, 1)
    produce_all(
        mock_cluster.bootstrap_servers, topic, ((None, AGE_OUT_VALUE) for _ in range(1_500))
    )
    return topic


def earliest_offset(bootstrap: str, topic: str) -> int:
    reader = stream_reader(bootstrap, topic, startingOffsets="earliest")
    offset: int = reader.initialOffset()[topic]["0"]
    reader.stop()
    return offset


def test_read_fails_on_aged_out_offsets_naming_them(
    mock_cluster: MockCluster, aged_topic: str
) -> None:
    earliest = earliest_offset(mock_cluster.bootstrap_servers, aged_topic)
    assert earliest > 0, "the mock cluster kept every offset: produce more to age some out"
    reader, partition = task(aged_topic, 0, 0, AGE_OUT_COUNT, mock_cluster.bootstrap_servers)

    with pytest.raises(DataLossError) as caught:
        read_rows(reader, [partition])

    message = str(caught.value)
    assert f"{aged_topic}/0: offset 0 aged out of retention" in message
    assert f"({earliest} offsets lost)" in message


def test_read_skips_aged_out_offsets_when_allowed_and_logs_the_gap(
    mock_cluster: MockCluster, aged_topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    earliest = earliest_offset(mock_cluster.bootstrap_servers, aged_topic)
    reader, partition = task(
        aged_topic, 0, 0, AGE_OUT_COUNT, mock_cluster.bootstrap_servers, failOnDataLoss="false"
    )

    with caplog.at_level(logging.WARNING):
        rows = read_rows(reader, [partition])

    assert [row["offset"] for row in rows] == list(range(earliest, AGE_OUT_COUNT))
    assert any(
        f"({earliest} offsets lost)" in record.getMessage() and record.levelno == logging.WARNING
        for record in caplog.records
    )


def test_planning_fails_on_aged_out_start_offsets(
    mock_cluster: MockCluster, aged_topic: str
) -> None:
    reader = stream_reader(
        mock_cluster.bootstrap_servers,
        aged_topic,
        startingOffsets=json.dumps({aged_topic: {"0": 0}}),
    )
    start = reader.initialOffset()

    with pytest.raises(DataLossError, match=rf"{aged_topic}/0: offset 0 aged out"):
        reader.latestOffset(start, ReadAllAvailable())


def test_planning_continues_from_the_earliest_when_loss_is_allowed(
    mock_cluster: MockCluster, aged_topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    earliest = earliest_offset(mock_cluster.bootstrap_servers, aged_topic)
    reader = stream_reader(
        mock_cluster.bootstrap_servers,
        aged_topic,
        startingOffsets=json.dumps({aged_topic: {"0": 0}}),
        failOnDataLoss="false",
        maxOffsetsPerTrigger="100",
    )
    start = reader.initialOffset()

    with caplog.at_level(logging.WARNING):
        end = reader.latestOffset(start, reader.getDefaultReadLimit())
        rows = read_rows(reader, reader.partitions(start, end))

    # The cap counts from the earliest offset still there, not from the lost start.
    assert end == {aged_topic: {"0": earliest + 100}}
    assert [row["offset"] for row in rows] == list(range(earliest, earliest + 100))
    assert any("data loss" in record.getMessage() for record in caplog.records)


# --- batch reads ---------------------------------------------------------------------------


@pytest.mark.kafka
@pytest.mark.slow
def test_batch_read_between_starting_and_ending_offsets(
    kafka_broker: KafkaCluster, topic: str
) -> None:
    kafka_broker.create_topic(topic, 2)
    produce_to(kafka_broker.bootstrap_servers, topic, {0: 10, 1: 10})
    reader = batch_reader(
        kafka_broker.bootstrap_servers,
        topic,
        startingOffsets=json.dumps({topic: {"0": 2, "1": -2}}),
        endingOffsets=json.dumps({topic: {"0": 5, "1": -1}}),
    )

    rows = read_rows(reader, reader.partitions())

    got = sorted((row["partition"], row["offset"]) for row in rows)
    assert got == [(0, 2), (0, 3), (0, 4)] + [(1, offset) for offset in range(10)]


@pytest.mark.kafka
@pytest.mark.slow
def test_batch_read_of_nothing_plans_no_partition(kafka_broker: KafkaCluster, topic: str) -> None:
    kafka_broker.create_topic(topic, 1)
    reader = batch_reader(kafka_broker.bootstrap_servers, topic)

    assert reader.partitions() == []
    # Spark then plans one placeholder partition; reading it yields nothing.
    assert list(reader.read(InputPartition(None))) == []


@pytest.mark.kafka
@pytest.mark.slow
def test_rows_batch_in_bounded_arrow_batches(kafka_broker: KafkaCluster, topic: str) -> None:
    kafka_broker.create_topic(topic, 1)
    produce_to(kafka_broker.bootstrap_servers, topic, {0: 25_000}, value=b"v")
    reader, partition = task(topic, 0, 0, 25_000, kafka_broker.bootstrap_servers)

    batches: list[pa.RecordBatch] = list(reader.read(partition))

    assert sum(batch.num_rows for batch in batches) == 25_000
    assert max(batch.num_rows for batch in batches) <= 10_000
