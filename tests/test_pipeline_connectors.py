"""Both Spark connectors of the landing job on Apache Kafka: the same lake, the same audit.

The records come through a real pydory daemon into the session's Apache Kafka broker, so
the audit has real books. ``pydory pipeline land`` then lands the topics twice, once
through pydory's ``pydory-kafka`` source (``--connector python``) and once through
Spark's own ``kafka`` source (``--connector native``, its jars from ``.jars/spark-kafka``,
put on ``spark.jars`` by :func:`pydory.pipeline.spark.spark_session`), into two lakes
that must hold the same rows, in the same layout, and both balance the audit.

One SparkSession serves the module (starting one takes ten seconds or more).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.listener import StreamingQueryListener

from helpers import settled, wait_until
from pydory.cli import build_parser
from pydory.cli import main as cli_main
from pydory.client import DatagramSender, UnixStreamSender
from pydory.pipeline.audits.audit import fetch_books
from pydory.pipeline.landing.land import (
    DATA_COLUMNS,
    DEFAULT_CONNECTOR,
    PARTITION_COLUMNS,
    LandSettings,
)
from pydory.pipeline.spark import (
    SPARK_KAFKA_JARS_ENV,
    find_spark_kafka_jars,
    spark_kafka_connector_jar,
    spark_kafka_connector_may_load,
    spark_session,
    with_spark_kafka_jars,
)
from pydory_tools.testing.daemon import DaemonConfig, running_daemon
from pydory_tools.testing.kafka_broker import KafkaCluster

# 2024-03-01 23:59:59.500 UTC and a second later, the next UTC day.
LATE_EVENING_MS = 1_709_337_599_500
NEXT_DAY_MS = LATE_EVENING_MS + 1_000
KEYED_PARTITIONS = 4
KEYED_MESSAGES = 400
SPREAD_MESSAGES = 120
# Timestamps from 2024 are older than Kafka's default retention (7 days): without this,
# the broker's retention check could delete them in the middle of the module.
KEEP_FOREVER = {"retention.ms": "-1"}
_SOURCE_OF = {"python": "PythonMicroBatchStream", "native": "KafkaV2[Subscribe["}


@pytest.fixture(scope="module")
def spark() -> SparkSession:
    # Not stopped: the next module's spark_session() reuses it (the audit tests do the same).
    return spark_session(master="local[2]", app_name="pydory-test-connectors")


@pytest.fixture
def socket_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    # UNIX socket paths are limited to ~108 bytes: keep them short.
    return str(tmp_path_factory.mktemp("s", numbered=True))


class SourceRecorder(StreamingQueryListener):
    """Records the source description of every batch, until a query terminates."""

    def __init__(self) -> None:
        self.descriptions: list[str] = []
        self.batches = 0
        self.terminated = threading.Event()

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        if event.progress.numInputRows:
            self.batches += 1
            self.descriptions.extend(source.description for source in event.progress.sources)

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        self.terminated.set()


def land_with(
    spark: SparkSession, connector: str, bootstrap: str, topics: list[str], root: Path
) -> SourceRecorder:
    """``pydory pipeline land --connector CONNECTOR --available-now`` into ROOT/lake."""
    recorder = SourceRecorder()
    spark.streams.addListener(recorder)
    try:
        status = cli_main(
            [
                "pipeline",
                "land",
                "--bootstrap",
                bootstrap,
                "--topics",
                ",".join(topics),
                "--lake",
                str(root / "lake"),
                "--checkpoint",
                str(root / "checkpoint"),
                "--available-now",
                "--max-offsets-per-trigger",
                "150",
                "--master",
                "local[2]",
                "--connector",
                connector,
            ]
        )
        assert recorder.terminated.wait(timeout=60), "the landing query never terminated"
    finally:
        spark.streams.removeListener(recorder)
    assert status == 0, f"the {connector} landing failed"
    return recorder


def lake_rows(spark: SparkSession, lake: Path) -> list[tuple[Any, ...]]:
    """Every row of the lake (through its commit log), as sorted tuples, duplicates kept."""
    columns = ["topic", "partition", "offset", "key", "value", "timestamp", "timestampType"]
    rows = (
        spark.read.parquet(str(lake))
        .select(*columns, F.col("date").cast("string").alias("date"))
        .collect()
    )
    return sorted(tuple(row) for row in rows)


def layout(lake: Path) -> set[str]:
    return {path.relative_to(lake).as_posix() for path in lake.glob("topic=*/date=*")}


def file_schema(lake: Path) -> Any:
    """The Parquet schema (with Spark's row metadata) of one committed file of ``lake``."""
    return pq.read_schema(sorted(lake.glob("topic=*/date=*/*.parquet"))[0])


def audit_json(lake: Path, books: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    capsys.readouterr()
    options = ["--books", str(books), "--from-offset-zero", "--master", "local[2]", "--json"]
    status = cli_main(["pipeline", "audit", "--lake", str(lake), *options])
    document: dict[str, Any] = json.loads(capsys.readouterr().out)
    document["exit_status"] = status
    return document


@pytest.mark.kafka
@pytest.mark.slow
def test_both_connectors_land_the_same_lake_and_both_balance_the_audit(
    spark: SparkSession,
    kafka_broker: KafkaCluster,
    unique_topic: Callable[[str], str],
    socket_dir: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    keyed, spread = unique_topic("conn-keyed"), unique_topic("conn-spread")
    kafka_broker.create_topic(keyed, KEYED_PARTITIONS, config=KEEP_FOREVER)
    kafka_broker.create_topic(spread, 1, config=KEEP_FOREVER)
    config = DaemonConfig(kafka_broker.bootstrap_servers, socket_dir, message_max_bytes=2000)
    with running_daemon(config) as daemon:
        with UnixStreamSender(config.stream_path) as stream:
            for i in range(KEYED_MESSAGES):
                stamp = LATE_EVENING_MS if i % 2 else NEXT_DAY_MS
                stream.send(keyed, b"value-%d" % i, b"key-%d" % i, i, timestamp_ms=stamp)
            stream.send(keyed, b"x" * 5000, b"too-long")  # discarded on arrival: never in Kafka
        with DatagramSender(config.datagram_path) as dgram:
            for i in range(SPREAD_MESSAGES):
                dgram.send(spread, b"spread-%d" % i, b"s-%d" % i, timestamp_ms=NEXT_DAY_MS)
        wait_until(settled(daemon, keyed, KEYED_MESSAGES), what="the keyed topic settled")
        wait_until(settled(daemon, spread, SPREAD_MESSAGES), what="the spread topic settled")
        books = fetch_books(f"http://127.0.0.1:{config.http_port}")
    saved_books = tmp_path / "books.json"
    saved_books.write_text(json.dumps(books))
    delivered = {entry["topic"]: entry["delivered"] for entry in books["topics"]}
    assert delivered == {keyed: KEYED_MESSAGES, spread: SPREAD_MESSAGES}
    assert [entry["discarded"] for entry in books["topics"] if entry["topic"] == keyed] == [
        {"too_long": 1}
    ]

    lakes = {}
    for connector in ("python", "native"):
        recorder = land_with(
            spark, connector, kafka_broker.bootstrap_servers, [keyed, spread], tmp_path / connector
        )
        # Each ran through the source it names, in several capped batches.
        assert recorder.descriptions
        assert all(_SOURCE_OF[connector] in d for d in recorder.descriptions), recorder.descriptions
        assert recorder.batches >= 3
        lakes[connector] = tmp_path / connector / "lake"

    python_rows = lake_rows(spark, lakes["python"])
    native_rows = lake_rows(spark, lakes["native"])
    assert python_rows == native_rows
    # ... and they are what was sent: every record once, offsets dense from 0.
    assert len(python_rows) == KEYED_MESSAGES + SPREAD_MESSAGES
    sent_keyed = {
        (
            i % KEYED_PARTITIONS,
            b"key-%d" % i,
            b"value-%d" % i,
            "2024-03-01" if i % 2 else "2024-03-02",
        )
        for i in range(KEYED_MESSAGES)
    }
    landed_keyed = {(row[1], row[3], row[4], row[7]) for row in python_rows if row[0] == keyed}
    assert landed_keyed == sent_keyed
    landed_spread = {(row[1], row[3], row[4], row[7]) for row in python_rows if row[0] == spread}
    assert landed_spread == {
        (0, b"s-%d" % i, b"spread-%d" % i, "2024-03-02") for i in range(SPREAD_MESSAGES)
    }
    offsets = Counter((row[0], row[1]) for row in python_rows)
    for (topic, partition), count in offsets.items():
        landed = sorted(row[2] for row in python_rows if (row[0], row[1]) == (topic, partition))
        assert landed == list(range(count)), (topic, partition)
    assert {row[6] for row in python_rows} == {0}  # CreateTime: the client's timestamps

    # The same layout, columns and Parquet schema, committed through the file sink's log.
    assert (
        layout(lakes["python"])
        == layout(lakes["native"])
        == {
            f"topic={keyed}/date=2024-03-01",
            f"topic={keyed}/date=2024-03-02",
            f"topic={spread}/date=2024-03-02",
        }
    )
    for lake in lakes.values():
        assert (lake / "_spark_metadata" / "0").is_file()
        assert spark.read.parquet(str(lake)).columns == [*DATA_COLUMNS, *PARTITION_COLUMNS]
    assert file_schema(lakes["python"]).equals(file_schema(lakes["native"]), check_metadata=True)

    for connector, lake in lakes.items():
        report = audit_json(lake, saved_books, capsys)
        assert report["exit_status"] == 0, (connector, report)
        assert report["balanced"] is True
        assert {
            (t["topic"], t["landed"], t["duplicates"], t["missing"]) for t in report["topics"]
        } == {
            (keyed, KEYED_MESSAGES, 0, 0),
            (spread, SPREAD_MESSAGES, 0, 0),
        }


# --- where the connector's jars come from ---------------------------------------------------


@pytest.mark.slow
def test_the_session_has_the_connector_jars_on_spark_jars(spark: SparkSession) -> None:
    jars = spark.conf.get("spark.jars") or ""

    assert spark_kafka_connector_jar() in jars
    assert {Path(jar).name for jar in jars.split(",")} == {
        jar.name for jar in find_spark_kafka_jars()
    }


def test_the_connector_jars_are_found_in_the_checkout_by_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(SPARK_KAFKA_JARS_ENV, raising=False)

    jars = find_spark_kafka_jars()

    assert {jar.parent.name for jar in jars} == {"spark-kafka"}
    names = {jar.name for jar in jars}
    assert spark_kafka_connector_jar() in names
    assert any(name.startswith("kafka-clients-") for name in names)


def test_the_environment_variable_names_another_directory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name in (spark_kafka_connector_jar(), "kafka-clients-3.9.2.jar", "README.txt"):
        (tmp_path / name).write_bytes(b"")
    monkeypatch.setenv(SPARK_KAFKA_JARS_ENV, str(tmp_path))

    assert [jar.name for jar in find_spark_kafka_jars()] == [
        "kafka-clients-3.9.2.jar",
        spark_kafka_connector_jar(),
    ]


@pytest.mark.parametrize("present", [[], ["spark-sql-kafka-0-10_2.13-3.5.1.jar", "x.jar"]])
def test_no_jars_without_the_connector_for_this_spark(
    present: list[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name in present:
        (tmp_path / name).write_bytes(b"")
    monkeypatch.setenv(SPARK_KAFKA_JARS_ENV, str(tmp_path / "missing" if not present else tmp_path))

    assert find_spark_kafka_jars() == ()
    assert with_spark_kafka_jars({"spark.jars": "/opt/mine.jar"}) == {"spark.jars": "/opt/mine.jar"}


def test_the_connector_jars_join_a_spark_jars_setting_of_the_user(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / spark_kafka_connector_jar()).write_bytes(b"")
    monkeypatch.setenv(SPARK_KAFKA_JARS_ENV, str(tmp_path))
    connector = str(tmp_path / spark_kafka_connector_jar())

    assert with_spark_kafka_jars({}) == {"spark.jars": connector}
    assert with_spark_kafka_jars({"spark.jars": "/opt/mine.jar", "a": "b"}) == {
        "spark.jars": f"{connector},/opt/mine.jar",
        "a": "b",
    }


@pytest.mark.slow
def test_native_without_the_jars_fails_clearly_and_lands_nothing(tmp_path: Path) -> None:
    # A process of its own: this one's JVM already has the jars.
    empty = tmp_path / "no-jars"
    empty.mkdir()
    command = [sys.executable, "-m", "pydory", "pipeline", "land", "--bootstrap", "127.0.0.1:9"]
    command += ["--topics", "t", "--lake", str(tmp_path / "lake")]
    command += ["--checkpoint", str(tmp_path / "checkpoint"), "--available-now"]
    command += ["--master", "local[1]", "--connector", "native"]

    finished = subprocess.run(
        command,
        env={**os.environ, SPARK_KAFKA_JARS_ENV: str(empty)},
        capture_output=True,
        text=True,
        timeout=240,
    )

    assert finished.returncode == 1, finished.stderr[-2000:]
    message = " ".join(finished.stdout.split())
    assert "--connector native needs Spark's kafka source" in message
    assert f"no {spark_kafka_connector_jar()} in {empty}." in message
    assert "Run ./dev jars" in message
    assert "or use --connector python" in message
    assert not (tmp_path / "lake").exists()
    # Said before Spark started (and before Kafka, which is not there, was asked).
    assert "Spark's default log4j profile" not in finished.stderr, finished.stderr[-2000:]


def test_the_connector_may_load_wherever_spark_could_take_it_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only where nothing could put Spark's kafka source on a new JVM's classpath does
    the landing refuse before starting Spark; a setting naming it leaves it to the JVM."""
    empty = tmp_path / "no-jars"
    empty.mkdir()
    monkeypatch.setenv(SPARK_KAFKA_JARS_ENV, str(empty))
    for name in ("SPARK_HOME", "SPARK_CONF_DIR", "PYSPARK_SUBMIT_ARGS", "SPARK_CLASSPATH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("SPARK_DIST_CLASSPATH", raising=False)

    assert not spark_kafka_connector_may_load({"spark.executor.memory": "512m"})
    package = "org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0"
    assert spark_kafka_connector_may_load({"spark.jars.packages": package})
    monkeypatch.setenv("PYSPARK_SUBMIT_ARGS", f"--packages {package} pyspark-shell")
    assert spark_kafka_connector_may_load({})
    monkeypatch.delenv("PYSPARK_SUBMIT_ARGS")
    conf_dir = tmp_path / "conf"
    conf_dir.mkdir()
    (conf_dir / "spark-defaults.conf").write_text(f"spark.jars.packages {package}\n")
    monkeypatch.setenv("SPARK_CONF_DIR", str(conf_dir))
    assert spark_kafka_connector_may_load({})
    monkeypatch.delenv("SPARK_CONF_DIR")
    (empty / spark_kafka_connector_jar()).write_bytes(b"")
    assert spark_kafka_connector_may_load({})


def test_both_connectors_get_the_same_options() -> None:
    def options(connector: str) -> dict[str, str]:
        return LandSettings(
            bootstrap_servers="b:1",
            topics=("a", "b"),
            lake="l",
            checkpoint="c",
            connector=connector,  # type: ignore[arg-type]
            max_offsets_per_trigger=10,
            fail_on_data_loss=False,
        ).source_options()

    assert (
        options("python")
        == options("native")
        == {
            "kafka.bootstrap.servers": "b:1",
            "subscribe": "a,b",
            "startingOffsets": "earliest",
            "failOnDataLoss": "false",
            "includeHeaders": "true",
            "maxOffsetsPerTrigger": "10",
        }
    )


def test_native_is_the_default_of_the_job_and_of_the_command() -> None:
    required = ["--bootstrap", "b:1", "--topics", "t", "--lake", "l", "--checkpoint", "c"]

    args = build_parser().parse_args(["pipeline", "land", *required])

    assert args.connector == DEFAULT_CONNECTOR == "native"
    settings = LandSettings(bootstrap_servers="b:1", topics=("t",), lake="l", checkpoint="c")
    assert settings.connector == "native"
