"""Second copies the landing job dropped are never counted as skipped or missing, and a
real missing record is still caught (issue 31, item 3).

The issue's case on Apache Kafka: a topic holding 1,000 messages, the same 1,000 again (a
crash's replay: same ``pydory-id`` headers) and 500 new, landed with
``--fail-on-data-loss false``. Before, the landing printed ``SKIPPED 1,000 records … aged
out of Kafka`` and exited 3, and ``pipeline audit`` printed ``missing 1000 … AUDIT
FAILED``. The audit reads the gaps' records from Kafka (where the landing job recorded
it) to tell a dropped second copy (its identity is in the lake) from a missing record.
"""

from __future__ import annotations

import io
import json
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from pydory.cli import main
from pydory.pipeline.audits.audit import audit
from pydory.pipeline.audits.reconcile import DaemonBooks, TopicBooks
from pydory.pipeline.landing.dedup import IDENTITY_COLUMN
from pydory.pipeline.landing.land import LandSettings, run_landing
from pydory.pipeline.spark import spark_session
from pydory_tools.testing.kafka_broker import KafkaCluster
from test_pipeline_dedup import identity, produce

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    session = spark_session(master="local[2]", app_name="pydory-test-second-copies")
    yield session
    session.stop()


def delivered(topic: str, count: int) -> DaemonBooks:
    """The books of the run that replayed: every message accepted and delivered."""
    return DaemonBooks(
        topics={topic: TopicBooks(topic, count, count, {}, 0, 0)}, received={"tcp": count}
    )


def test_a_replay_dropped_on_landing_is_neither_skipped_nor_missing(
    spark: SparkSession,
    kafka_broker: KafkaCluster,
    unique_topic: Callable[[str], str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    topic = unique_topic("replayed")
    kafka_broker.create_topic(topic, 1)
    first = [(0, b"m%d" % i, identity(i)) for i in range(1_000)]
    produce(bootstrap, topic, first)
    produce(bootstrap, topic, first)  # the crash's replay: the same identities again
    produce(bootstrap, topic, [(0, b"m%d" % i, identity(i)) for i in range(1_000, 1_500)])
    lake = tmp_path / "lake"
    out = io.StringIO()
    settings = LandSettings(
        bootstrap_servers=bootstrap,
        topics=(topic,),
        lake=str(lake),
        checkpoint=str(tmp_path / "checkpoint"),
        available_now=True,
        max_offsets_per_trigger=700,  # the replay read in batches that have a start
        fail_on_data_loss=False,
    )

    status = run_landing(settings, out)

    assert status == 0, out.getvalue()
    assert "SKIPPED" not in out.getvalue()
    assert "1,000 second copies dropped" in out.getvalue()
    assert spark.read.parquet(str(lake)).count() == 1_500

    report = audit(spark, lake, delivered(topic, 1_500))  # Kafka: the lake's record of it

    assert report.balanced, report.render()
    (row,) = report.topics
    assert (row.landed, row.missing, row.second_copies) == (1_500, 0, 1_000)
    assert "1000 offsets not landed are second copies the landing job dropped" in report.render()

    # The command: the same verdict, exit 0; --bootstrap-servers names Kafka explicitly.
    books = tmp_path / "books.json"
    entry = {"topic": topic, "accepted": 1500, "delivered": 1500, "discarded": {}}
    entry |= {"discarded_after_acceptance": 0, "in_flight": 0}
    books.write_text(json.dumps({"topics": [entry], "received": {}}))
    command = ["pipeline", "audit", "--lake", str(lake), "--books", str(books)]
    assert main([*command, "--bootstrap-servers", bootstrap]) == 0, capsys.readouterr()
    assert "AUDIT BALANCED: 1500 landed == 1500 delivered" in capsys.readouterr().out


def test_a_gap_whose_record_is_not_in_the_lake_is_still_missing(
    spark: SparkSession,
    kafka_broker: KafkaCluster,
    unique_topic: Callable[[str], str],
    tmp_path: Path,
) -> None:
    """Kafka holds 10 messages, 5 of them again, 5 new; the lake lacks one first copy
    (offset 7) besides the 5 replayed: 5 second copies, 1 missing, the audit fails."""
    bootstrap = kafka_broker.bootstrap_servers
    topic = unique_topic("lost-one")
    kafka_broker.create_topic(topic, 1)
    records = [(0, b"m%d" % i, identity(i)) for i in range(10)]
    records += [(0, b"m%d" % i, identity(i)) for i in range(5)]  # offsets 10-14: replayed
    records += [(0, b"m%d" % i, identity(i)) for i in range(10, 15)]  # offsets 15-19
    produce(bootstrap, topic, records)
    landed = [
        (topic, 0, offset, identity(number).decode())
        for offset, number in [
            *((o, o) for o in range(10) if o != 7),
            *zip(range(15, 20), range(10, 15), strict=True),
        ]
    ]
    lake = file_sink_lake(spark, tmp_path, landed)

    report = audit(spark, lake, delivered(topic, 15), bootstrap_servers=bootstrap)

    assert not report.balanced
    (row,) = report.topics
    assert (row.landed, row.second_copies, row.missing) == (14, 5, 1)
    assert f"{topic}[0] offsets 7" in report.render()
    # Without Kafka every gap counts, and the report says why.
    blind = audit(spark, lake, delivered(topic, 15))
    assert blind.topics[0].missing == 6
    assert "gaps not read from Kafka" in blind.render()


def file_sink_lake(spark: SparkSession, root: Path, rows: list[tuple[str, int, int, str]]) -> Path:
    """A lake of ``(topic, partition, offset, pydory_id)`` rows, written through Spark's
    file sink (its commit log) as the landing job writes one."""
    source = root / "source"
    spark.createDataFrame(
        rows, f"topic string, partition int, offset long, {IDENTITY_COLUMN} string"
    ).write.parquet(str(source))
    stream = (
        spark.readStream.schema(spark.read.parquet(str(source)).schema)
        .parquet(str(source))
        .withColumn("date", F.lit("2025-03-01"))
    )
    query = (
        stream.writeStream.format("parquet")
        .option("path", str(root / "lake"))
        .option("checkpointLocation", str(root / "checkpoint"))
        .partitionBy("topic", "date")
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return root / "lake"


def test_a_lake_continued_with_a_new_checkpoint_keeps_dropping_second_copies(
    spark: SparkSession,
    kafka_broker: KafkaCluster,
    unique_topic: Callable[[str], str],
    tmp_path: Path,
) -> None:
    """Issue 31, point 7: the old checkpoint's state holds the lake's identities, not the
    new one's. Land 40 messages; the daemon replays 20 of them (some into the other
    partition) between 10 new ones; a new checkpoint re-lands the topic from the earliest
    offsets into the same lake: the replay is dropped, the new messages land, the audit
    balances. A second run of that checkpoint drops a replay of both what the old
    checkpoint landed and what the new one did."""
    bootstrap = kafka_broker.bootstrap_servers
    topic = unique_topic("continued")
    kafka_broker.create_topic(topic, 2)
    lake = tmp_path / "lake"

    def land(checkpoint: str, starting_offsets: str | None = None) -> str:
        out = io.StringIO()
        settings = LandSettings(
            bootstrap_servers=bootstrap,
            topics=(topic,),
            lake=str(lake),
            checkpoint=str(tmp_path / checkpoint),
            available_now=True,
            starting_offsets=starting_offsets,
        )
        assert run_landing(settings, out) == 0, out.getvalue()
        return out.getvalue()

    produce(bootstrap, topic, [(i % 2, b"m%d" % i, identity(i)) for i in range(40)])
    assert "; 0 second copies dropped" in land("old")

    replay = [((i + 1) % 2, b"m%d" % i, identity(i)) for i in range(10, 30)]
    new = [(i % 2, b"m%d" % i, identity(i)) for i in range(40, 50)]
    produce(bootstrap, topic, [*replay[:10], *new[:5], *replay[10:], *new[5:]])
    continued = land("new", starting_offsets="earliest")

    assert "continues the lake after its batch 0" in continued
    assert "20 second copies dropped" in continued
    assert "not dropped" not in continued
    assert landed_identities(spark, lake) == Counter(identity(i).decode() for i in range(50))

    # Its next run: a replay of what the old checkpoint landed and of what it landed.
    again = [(0, b"m%d" % i, identity(i)) for i in [*range(5), *range(45, 50)]]
    produce(bootstrap, topic, [*again, (0, b"m50", identity(50))])  # a gap, not a tail
    assert "10 second copies dropped" in land("new")
    assert landed_identities(spark, lake) == Counter(identity(i).decode() for i in range(51))

    report = audit(spark, lake, delivered(topic, 51), bootstrap_servers=bootstrap)
    assert report.balanced, report.render()
    (row,) = report.topics
    assert (row.landed, row.missing, row.second_copies) == (51, 0, 30)


def landed_identities(spark: SparkSession, lake: Path) -> Counter[str]:
    rows = spark.read.parquet(str(lake)).select(IDENTITY_COLUMN).collect()
    return Counter(row[IDENTITY_COLUMN] for row in rows)
