"""The landing job end to end: Apache Kafka → pydory-kafka → Spark file sink → the lake.

The main path runs on the session's Apache Kafka broker (``kafka_broker``); librdkafka's
mock cluster serves only the data-loss test, which needs its habit of dropping old
segments within seconds. Both connectors side by side: test_pipeline_connectors.py.

One SparkSession serves the whole module (starting one takes about ten seconds);
every test uses fresh topics, lake and checkpoint directories.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyspark
import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.listener import StreamingQueryListener

from helpers import wait_until
from pydory.cli import main as cli_main
from pydory.pipeline.landing import land
from pydory.pipeline.landing.land import (
    DATA_COLUMNS,
    EXIT_RECORDS_SKIPPED,
    PARTITION_COLUMNS,
    LandSettings,
    run_landing,
    start_landing,
    utc_date,
)
from pydory.pipeline.spark import WORKER_PYTHON, spark_session, worker_python
from pydory_tools.testing.kafka_broker import KafkaCluster
from pydory_tools.testing.kafka_util import admin_create_topic
from pydory_tools.testing.kill_loop import jvm_child_of
from pydory_tools.testing.lifecycle import SHORT_LIVED_JVM_FLAGS
from pydory_tools.testing.mock_cluster import MockCluster

# 2024-03-01 23:59:59.500 UTC and half a second later, the next UTC day.
LATE_EVENING_MS = 1_709_337_599_500
NEXT_DAY_MS = LATE_EVENING_MS + 1_000
# Timestamps from 2024 are older than Kafka's default retention (7 days): without this,
# the broker's retention check could delete them while the module runs.
KEEP_FOREVER = {"retention.ms": "-1"}


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    session = spark_session(master="local[2]", app_name="pydory-test-land")
    yield session
    session.stop()


def test_spark_s_python_workers_import_pyspark_from_its_installed_package(
    spark: SparkSession,
) -> None:
    """Not from the bytecode-less pyspark.zip Spark puts first on every worker's path,
    where each worker compiled PySpark again at its start (pydory.pipeline.worker_python)."""
    imported = (
        spark.sparkContext.parallelize([0], 1)
        .map(lambda _: __import__("pyspark").__file__)
        .collect()
    )

    assert imported == [pyspark.__file__]


def test_the_jvm_runs_its_own_python_work_through_pydory_spark_python(spark: SparkSession) -> None:
    """``PYSPARK_DRIVER_PYTHON``, which Spark's JVM runs for the Python work it starts itself
    (its lookup of Python data sources when it starts: pydory.pipeline.worker_python)."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None

    assert jvm.java.lang.System.getenv("PYSPARK_DRIVER_PYTHON") == worker_python()
    assert worker_python().endswith("/" + WORKER_PYTHON)


def test_the_tests_spark_driver_runs_without_the_optimising_jit(spark: SparkSession) -> None:
    """The suite's drivers are short-lived: C2 cost more CPU than it won back (lifecycle.py),
    and the flags reach the JVM through Spark's launcher, not only the environment."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    runtime = jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
    arguments = list(runtime.getInputArguments())

    assert set(SHORT_LIVED_JVM_FLAGS) <= set(arguments), arguments


@pytest.fixture
def lake_paths(tmp_path: Path) -> tuple[str, str]:
    return str(tmp_path / "lake"), str(tmp_path / "checkpoint")


def produce(
    bootstrap: str,
    topic: str,
    counts: dict[int, int],
    timestamp_ms: int | None = None,
    value: bytes | None = None,
) -> None:
    """Produce ``counts[p]`` records to partition ``p`` (value ``p:i`` unless given)."""
    producer = Producer({"bootstrap.servers": bootstrap})
    extra = {} if timestamp_ms is None else {"timestamp": timestamp_ms}
    for partition, count in counts.items():
        for index in range(count):
            payload = value if value is not None else f"{partition}:{index}".encode()
            producer.produce(topic, value=payload, partition=partition, **extra)
            producer.poll(0)
    assert producer.flush(30) == 0


def settings(
    bootstrap: str,
    topics: tuple[str, ...],
    paths: tuple[str, str],
    connector: str = "python",
    **kw: Any,
) -> LandSettings:
    """The job's settings; through ``pydory-kafka`` unless a test names the connector
    (this module tests pydory's source end to end; the default, native, is compared
    with it in test_pipeline_connectors.py)."""
    lake, checkpoint = paths
    return LandSettings(
        bootstrap_servers=bootstrap,
        topics=topics,
        lake=lake,
        checkpoint=checkpoint,
        connector=connector,  # type: ignore[arg-type]
        **kw,
    )


def landed_offsets(spark: SparkSession, lake: str) -> dict[tuple[str, int], list[int]]:
    """Every landed offset per (topic, partition), sorted, duplicates kept.

    Collecting offsets is fine in a test of a few thousand records.
    """
    rows = spark.read.parquet(lake).select("topic", "partition", "offset").collect()
    offsets: dict[tuple[str, int], list[int]] = {}
    for row in rows:
        offsets.setdefault((row.topic, row.partition), []).append(row.offset)
    return {key: sorted(values) for key, values in offsets.items()}


class BatchWatcher(StreamingQueryListener):
    """Sets ``reached`` (and calls ``on_reached``) after ``batches`` non-empty batches."""

    def __init__(self, batches: int, on_reached: Callable[[], object] = lambda: None) -> None:
        self._batches = batches
        self._seen = 0
        self._on_reached = on_reached
        self.reached = threading.Event()

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        if event.progress.numInputRows > 0:
            self._seen += 1
            if self._seen == self._batches:
                self.reached.set()
                self._on_reached()

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        self.reached.set()


@pytest.mark.kafka
@pytest.mark.slow
def test_lands_every_record_once_partitioned_by_topic_and_utc_date(
    spark: SparkSession,
    kafka_broker: KafkaCluster,
    unique_topic: Callable[[str], str],
    lake_paths: tuple[str, str],
) -> None:
    uneven, single = unique_topic("land-a"), unique_topic("land-b")
    kafka_broker.create_topic(uneven, 4, config=KEEP_FOREVER)
    kafka_broker.create_topic(single, 1, config=KEEP_FOREVER)
    produce(kafka_broker.bootstrap_servers, uneven, {0: 400, 1: 30, 2: 0, 3: 1}, LATE_EVENING_MS)
    produce(kafka_broker.bootstrap_servers, single, {0: 20}, NEXT_DAY_MS)
    out = io.StringIO()

    status = run_landing(
        settings(kafka_broker.bootstrap_servers, (uneven, single), lake_paths, available_now=True),
        out=out,
    )

    assert status == 0, out.getvalue()
    lake = Path(lake_paths[0])
    assert (lake / "_spark_metadata").is_dir()
    assert {path.relative_to(lake).as_posix() for path in lake.glob("topic=*/date=*")} == {
        f"topic={uneven}/date=2024-03-01",
        f"topic={single}/date=2024-03-02",
    }
    offsets = landed_offsets(spark, lake_paths[0])
    assert offsets == {
        (uneven, 0): list(range(400)),
        (uneven, 1): list(range(30)),
        (uneven, 3): [0],
        (single, 0): list(range(20)),
    }
    columns = spark.read.parquet(lake_paths[0]).columns
    assert columns == [*DATA_COLUMNS, *PARTITION_COLUMNS]
    assert DATA_COLUMNS == (
        "key",
        "value",
        "partition",
        "offset",
        "timestamp",
        "timestampType",
        "pydory_id",
    )
    assert PARTITION_COLUMNS == ("topic", "date")
    assert "landing finished: 451 records" in out.getvalue()


@pytest.mark.kafka
@pytest.mark.slow
@pytest.mark.parametrize(
    ("connector", "restart_with"),
    [
        ("python", "python"),
        ("native", "native"),
        # A lake landed before native became the default, continued by the default.
        ("python", "native"),
    ],
)
def test_stop_and_restart_mid_stream_lands_no_duplicate_and_no_gap(
    connector: str,
    restart_with: str,
    spark: SparkSession,
    kafka_broker: KafkaCluster,
    unique_topic: Callable[[str], str],
    lake_paths: tuple[str, str],
) -> None:
    topic = unique_topic("restart")
    kafka_broker.create_topic(topic, 3)
    produce(kafka_broker.bootstrap_servers, topic, {0: 1200, 1: 600, 2: 200})
    capped = settings(
        kafka_broker.bootstrap_servers,
        (topic,),
        lake_paths,
        connector,
        trigger_interval_s=0.1,
        max_offsets_per_trigger=250,
    )
    watcher = BatchWatcher(batches=2)
    spark.streams.addListener(watcher)
    try:
        query = start_landing(spark, capped)
        assert watcher.reached.wait(timeout=120), "the landing query made no progress"
        query.stop()  # usually in the middle of the next batch
    finally:
        spark.streams.removeListener(watcher)
    # Spark gives a Python worker it starts a fixed 10 s to connect back; on a loaded host
    # one can miss it mid-batch, failing the query as a stop would end it (the batch in
    # flight uncommitted): the job restarts from its checkpoint (land.py), as run_landing
    # below does here. Any other failure fails the test.
    assert query.exception() is None or land._worker_failed(query), query.exception()
    first_run = sum(len(offsets) for offsets in landed_offsets(spark, lake_paths[0]).values())
    assert 0 < first_run < 2000

    produce(kafka_broker.bootstrap_servers, topic, {0: 100, 1: 100, 2: 100})
    status = run_landing(
        settings(
            kafka_broker.bootstrap_servers, (topic,), lake_paths, restart_with, available_now=True
        ),
        out=io.StringIO(),
    )

    assert status == 0
    assert landed_offsets(spark, lake_paths[0]) == {
        (topic, 0): list(range(1300)),
        (topic, 1): list(range(700)),
        (topic, 2): list(range(300)),
    }


@pytest.mark.kafka
@pytest.mark.slow
def test_max_offsets_per_trigger_caps_every_batch(
    spark: SparkSession,
    kafka_broker: KafkaCluster,
    unique_topic: Callable[[str], str],
    lake_paths: tuple[str, str],
) -> None:
    topic = unique_topic("capped")
    kafka_broker.create_topic(topic, 3)
    produce(kafka_broker.bootstrap_servers, topic, {0: 700, 1: 250, 2: 50})

    query = start_landing(
        spark,
        settings(
            kafka_broker.bootstrap_servers,
            (topic,),
            lake_paths,
            available_now=True,
            max_offsets_per_trigger=300,
        ),
    )
    query.awaitTermination()

    batch_rows = [progress.numInputRows for progress in query.recentProgress]
    assert [rows for rows in batch_rows if rows] == [300, 300, 300, 100]
    assert spark.read.parquet(lake_paths[0]).count() == 1000


def earliest_offset(bootstrap: str, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "test-earliest"})
    try:
        low, _high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=60)
    finally:
        consumer.close()
    return int(low)


@pytest.mark.slow
def test_offsets_aged_out_before_landing_fail_the_job_unless_loss_is_allowed(
    spark: SparkSession,
    mock_cluster: MockCluster,
    unique_topic: Callable[[str], str],
    lake_paths: tuple[str, str],
) -> None:
    topic = unique_topic("aged")
    mock_cluster.create_topic(topic, 1)
    bootstrap = mock_cluster.bootstrap_servers
    produce(bootstrap, topic, {0: 10})
    assert (
        run_landing(settings(bootstrap, (topic,), lake_paths, available_now=True), io.StringIO())
        == 0
    )
    # About 5 MB stay per mock partition: 1,500 records of 10 kB push out the oldest,
    # including offsets 10 on that the lake has not seen yet.
    produce(bootstrap, topic, {0: 1_500}, value=b"x" * 10_000)
    earliest = earliest_offset(bootstrap, topic)
    assert earliest > 10
    out = io.StringIO()

    strict = run_landing(settings(bootstrap, (topic,), lake_paths, available_now=True), out)

    assert strict == 1
    assert f"{topic}/0: offset 10 aged out of retention" in out.getvalue()
    assert f"({earliest - 10} offsets lost)" in out.getvalue()

    # The operator accepts the loss and runs the same job again.
    out = io.StringIO()
    lenient = run_landing(
        settings(bootstrap, (topic,), lake_paths, available_now=True, fail_on_data_loss=False),
        out,
    )

    assert lenient == EXIT_RECORDS_SKIPPED == 3
    assert f"SKIPPED {earliest - 10:,} records (--fail-on-data-loss false)" in out.getvalue()
    assert f"{topic}/0: {earliest - 10:,} offsets aged out of Kafka" in out.getvalue()
    assert landed_offsets(spark, lake_paths[0]) == {
        (topic, 0): list(range(10)) + list(range(earliest, 1_510))
    }


@pytest.mark.parametrize(
    "arguments",
    [
        ["--available-now", "--trigger-interval", "5"],
        ["--trigger-interval", "0"],
        ["--max-offsets-per-trigger", "0"],
        ["--connector", "jvm"],
    ],
)
def test_land_refuses_bad_arguments(
    arguments: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["pipeline", "land", "--bootstrap", "b:1", "--topics", "t"]
    paths = ["--lake", str(tmp_path / "l"), "--checkpoint", str(tmp_path / "c")]

    with pytest.raises(SystemExit) as exit_info:
        cli_main([*base, *paths, *arguments])

    assert exit_info.value.code == 2
    assert "usage: pydory pipeline land" in capsys.readouterr().err


@pytest.mark.slow
def test_the_lake_date_column_is_the_utc_day(spark: SparkSession) -> None:
    spark.conf.set("spark.sql.session.timeZone", "America/Los_Angeles")
    try:
        days = (
            spark.createDataFrame([(LATE_EVENING_MS,), (NEXT_DAY_MS,)], "ms long")
            .select(utc_date(F.timestamp_millis("ms")).alias("date"))
            .collect()
        )
    finally:
        spark.conf.set("spark.sql.session.timeZone", "UTC")

    assert [row.date for row in days] == ["2024-03-01", "2024-03-02"]


@pytest.mark.kafka
@pytest.mark.slow
def test_an_interval_run_stops_on_sigterm_and_summarises(
    spark: SparkSession,
    kafka_broker: KafkaCluster,
    unique_topic: Callable[[str], str],
    lake_paths: tuple[str, str],
) -> None:
    topic = unique_topic("sigterm")
    kafka_broker.create_topic(topic, 2)
    produce(kafka_broker.bootstrap_servers, topic, {0: 30, 1: 12})
    # SIGTERM this process once the first batch has landed, as a supervisor would.
    watcher = BatchWatcher(batches=1, on_reached=lambda: os.kill(os.getpid(), signal.SIGTERM))
    spark.streams.addListener(watcher)
    out = io.StringIO()
    try:
        status = run_landing(
            settings(kafka_broker.bootstrap_servers, (topic,), lake_paths, trigger_interval_s=0.5),
            out=out,
        )
    finally:
        spark.streams.removeListener(watcher)

    assert status == 0
    assert "batch 0: 42 records" in out.getvalue()
    assert "landing stopped by signal: 42 records in 1 batch" in out.getvalue()


@pytest.mark.kafka
@pytest.mark.slow
def test_spark_batch_read_through_the_source(
    spark: SparkSession, kafka_broker: KafkaCluster, unique_topic: Callable[[str], str]
) -> None:
    topic = unique_topic("batch")
    kafka_broker.create_topic(topic, 2)
    produce(kafka_broker.bootstrap_servers, topic, {0: 50, 1: 20})

    records = (
        spark.read.format("pydory-kafka")
        .option("kafka.bootstrap.servers", kafka_broker.bootstrap_servers)
        .option("subscribe", topic)
        .option("endingOffsets", json.dumps({topic: {"0": 40}}))
        .load()
    )
    per_partition = {
        row.partition: (row["count"], row.first, row.last)
        for row in records.groupBy("partition")
        .agg(
            F.count("*").alias("count"),
            F.min("offset").alias("first"),
            F.max("offset").alias("last"),
        )
        .collect()
    }

    assert records.columns == [
        "key",
        "value",
        "topic",
        "partition",
        "offset",
        "timestamp",
        "timestampType",
    ]
    assert per_partition == {0: (40, 0, 39), 1: (20, 0, 19)}


@pytest.mark.kafka
@pytest.mark.slow
@pytest.mark.parametrize("connector", ["python", "native"])
def test_a_new_checkpoint_on_a_landed_lake_is_refused_until_its_offsets_are_chosen(
    connector: str,
    spark: SparkSession,
    kafka_broker: KafkaCluster,
    unique_topic: Callable[[str], str],
    tmp_path: Path,
) -> None:
    topic = unique_topic("rebind")
    kafka_broker.create_topic(topic, 2)
    bootstrap = kafka_broker.bootstrap_servers
    lake, old, new = (str(tmp_path / name) for name in ("lake", "old", "new"))
    produce(bootstrap, topic, {0: 5, 1: 5})
    land = run_landing(
        settings(bootstrap, (topic,), (lake, old), connector, available_now=True), io.StringIO()
    )
    assert land == 0
    produce(bootstrap, topic, {0: 3, 1: 2})
    refused = io.StringIO()

    # The old checkpoint is lost: a new one would silently land nothing.
    status = run_landing(
        settings(bootstrap, (topic,), (lake, new), connector, available_now=True), refused
    )

    assert status == 1
    assert f"refused: the lake {lake} already holds batch 0 (landed" in refused.getvalue()
    assert f"landed by checkpoint {old}" in refused.getvalue()
    assert "--starting-offsets earliest|latest|JSON" in refused.getvalue()
    assert landed_offsets(spark, lake) == {(topic, 0): list(range(5)), (topic, 1): list(range(5))}

    # The operator chooses: from the earliest, without what the lake already holds.
    out = io.StringIO()
    status = run_landing(
        settings(
            bootstrap,
            (topic,),
            (lake, new),
            connector,
            available_now=True,
            starting_offsets="earliest",
        ),
        out,
    )

    assert status == 0, out.getvalue()
    assert "(10 offsets skipped that the lake already holds)" in out.getvalue()
    assert "landing finished: 5 records" in out.getvalue()
    assert landed_offsets(spark, lake) == {(topic, 0): list(range(8)), (topic, 1): list(range(7))}


@pytest.mark.kafka
@pytest.mark.slow
def test_the_job_exits_non_zero_soon_after_spark_s_jvm_dies(
    kafka_broker: KafkaCluster, unique_topic: Callable[[str], str], tmp_path: Path
) -> None:
    topic = unique_topic("jvm-dies")
    kafka_broker.create_topic(topic, 1)
    produce(kafka_broker.bootstrap_servers, topic, {0: 3})
    command = [
        sys.executable, "-m", "pydory", "pipeline", "land",
        "--bootstrap", kafka_broker.bootstrap_servers, "--topics", topic,
        "--lake", str(tmp_path / "lake"), "--checkpoint", str(tmp_path / "cp"),
        "--trigger-interval", "1", "--master", "local[1]",
    ]  # fmt: skip
    with (tmp_path / "stderr").open("wb") as stderr:
        job = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, text=True)
    try:
        assert job.stdout is not None
        lines = []
        for line in job.stdout:  # the job runs on, waiting for its next trigger
            lines.append(line)
            if line.startswith("batch 0:"):
                break
        jvm = jvm_child_of(job.pid)
        assert jvm is not None, "".join(lines)

        os.kill(jvm, signal.SIGKILL)

        # A generous bound for a loaded machine; before the fix the job never ended.
        status = job.wait(timeout=60)
        output = "".join(lines) + job.stdout.read()
        assert status == 1, output
        assert f"landing FAILED: Spark's JVM (pid {jvm}) exited (killed by signal 9)" in output
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("option", "value"),
    [("minOffsetsPerTrigger", "100"), ("maxOffsetsPerTrigger", "many"), ("subscribe", " ")],
)
def test_a_bad_source_option_fails_at_load_naming_it(
    spark: SparkSession, option: str, value: str
) -> None:
    reader = (
        spark.readStream.format("pydory-kafka")
        .option("kafka.bootstrap.servers", "127.0.0.1:9")
        .option("subscribe", "events")
        .option(option, value)
    )

    with pytest.raises(PySparkException) as refusal:
        reader.load()

    assert f"pydory-kafka source option {option!r}" in str(refusal.value)


@pytest.mark.slow
def test_an_option_for_batch_reads_only_fails_the_stream_naming_it(
    spark: SparkSession, tmp_path: Path
) -> None:
    stream = (
        spark.readStream.format("pydory-kafka")
        .option("kafka.bootstrap.servers", "127.0.0.1:9")
        .option("subscribe", "events")
        .option("endingOffsets", "latest")
        .load()
    )
    query = (
        stream.writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .start()
    )

    with pytest.raises(PySparkException) as refusal:
        query.awaitTermination(120)

    assert "pydory-kafka source option 'endingOffsets': applies to batch reads only" in str(
        refusal.value
    )
    assert "UnboundLocalError" not in str(refusal.value)


def recreate_topic(bootstrap: str, topic: str, partitions: int) -> None:
    """Delete ``topic`` and create it again (offsets start at 0 again)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_topics([topic])[topic].result(timeout=60)

    def created() -> bool:
        try:  # refused while the broker still deletes the old topic
            admin_create_topic(bootstrap, topic, partitions)
        except KafkaException:
            return False
        return True

    wait_until(created, timeout_s=60, what=f"{topic} created again")


@pytest.mark.kafka
@pytest.mark.slow
@pytest.mark.parametrize("connector", ["python", "native"])
def test_offsets_that_went_backwards_are_named_and_what_was_skipped_is_reported(
    connector: str,
    spark: SparkSession,
    kafka_broker: KafkaCluster,
    unique_topic: Callable[[str], str],
    lake_paths: tuple[str, str],
) -> None:
    topic = unique_topic("recreated")
    bootstrap = kafka_broker.bootstrap_servers
    kafka_broker.create_topic(topic, 1)
    produce(bootstrap, topic, {0: 6})
    once = settings(bootstrap, (topic,), lake_paths, connector, available_now=True)
    assert run_landing(once, io.StringIO()) == 0
    recreate_topic(bootstrap, topic, 1)
    kafka_broker.wait_for_leaders(topic, 1)
    produce(bootstrap, topic, {0: 4})
    strict = io.StringIO()

    assert run_landing(once, strict) == 1
    assert "offsets went backwards (the topic was deleted and recreated" in strict.getvalue()
    assert "aged out" not in strict.getvalue()

    lenient = io.StringIO()
    status = run_landing(
        settings(
            bootstrap, (topic,), lake_paths, connector, available_now=True, fail_on_data_loss=False
        ),
        lenient,
    )

    jump = f"{topic}/0: offsets went backwards from 6 to 4 (topic recreated or log truncated)"
    assert jump in lenient.getvalue()
    if connector == "native":  # Spark's source moves on to the new end unread
        assert status == EXIT_RECORDS_SKIPPED
        assert "SKIPPED 4 records" in lenient.getvalue()
        assert f"{jump}: up to 4 records below offset 4 not read" in lenient.getvalue()
    else:  # pydory-kafka reads the new log from its start
        assert status == 0
        assert "nothing was skipped" in lenient.getvalue()
        assert len(landed_offsets(spark, lake_paths[0])[(topic, 0)]) == 10


STOPS_ITS_SESSION = """
import sys
from pyspark import SparkContext
from pydory.pipeline.landing.land import LandSettings, run_landing

bootstrap, topic, lake, checkpoint = sys.argv[1:]
status = run_landing(LandSettings(
    bootstrap_servers=bootstrap, topics=(topic,), lake=lake, checkpoint=checkpoint,
    available_now=True, master="local[1]",
))
print("status", status, "session stopped", SparkContext._active_spark_context is None)
"""


@pytest.mark.kafka
@pytest.mark.slow
def test_the_job_stops_the_spark_session_it_started(
    kafka_broker: KafkaCluster, unique_topic: Callable[[str], str], tmp_path: Path
) -> None:
    topic = unique_topic("stops")
    kafka_broker.create_topic(topic, 1)
    produce(kafka_broker.bootstrap_servers, topic, {0: 2})
    arguments = [kafka_broker.bootstrap_servers, topic, str(tmp_path / "l"), str(tmp_path / "c")]

    finished = subprocess.run(
        [sys.executable, "-c", STOPS_ITS_SESSION, *arguments],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )

    assert "status 0 session stopped True" in finished.stdout, finished.stdout + finished.stderr
