"""The audit job: reconciliation arithmetic (pure) and lakes written by Spark's file sink.

The lakes here are written the way the landing job writes them: a streaming query into
Parquet through the file sink (with its ``_spark_metadata`` commit log), partitioned by
topic and date. Its source is Parquet files of rows we choose, so a test can land a
duplicate, leave a gap, or plant a file the commit log does not list.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
import threading
from collections.abc import Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from pydory.cli import build_parser, main
from pydory.pipeline.audits.audit import NotALake, audit, load_books, summarize_lake
from pydory.pipeline.audits.reconcile import (
    BooksFormatError,
    DaemonBooks,
    PartitionLanding,
    reconcile,
)

# --- the daemon's books, as /books/json serves them -----------------------------------------


def books_page(*topics: dict[str, Any], received: dict[str, int] | None = None) -> dict[str, Any]:
    """A /books/json document holding ``topics`` (see topic_entry)."""
    return {
        "pid": 4242,
        "version": "0.1.0",
        "since": 1_700_000_000,
        "now": 1_700_000_100,
        "topics": list(topics),
        "received": received or {"unix_dgram": 0, "unix_stream": 0, "tcp": 0},
        "metadata_known": True,
        "waiting_for_metadata": 0,
        "pool": {"budget": 1, "used": 0, "available": 1, "percent_time_depleted": 0.0},
    }


def topic_entry(
    topic: str,
    delivered: int,
    discarded: dict[str, int] | None = None,
    in_flight: int = 0,
    after_acceptance: int = 0,
    possibly_delivered: int = 0,
    left_for_next_start: int = 0,
) -> dict[str, Any]:
    """One topic of /books/json, its ``accepted`` what the daemon's invariant makes it."""
    discarded = discarded or {}
    return {
        "topic": topic,
        "accepted": (
            delivered + possibly_delivered + left_for_next_start + after_acceptance + in_flight
        ),
        "delivered": delivered,
        "discarded": discarded,
        "discarded_after_acceptance": after_acceptance,
        "in_flight": in_flight,
        "possibly_delivered": possibly_delivered,
        "left_for_next_start": left_for_next_start,
    }


def books(*topics: dict[str, Any], received: dict[str, int] | None = None) -> DaemonBooks:
    return DaemonBooks.from_json(books_page(*topics, received=received))


def landing(topic: str, partition: int, offsets: Sequence[int]) -> PartitionLanding:
    return PartitionLanding(
        topic=topic,
        partition=partition,
        rows=len(offsets),
        distinct_offsets=len(set(offsets)),
        first_offset=min(offsets),
        last_offset=max(offsets),
    )


# --- reconciliation (no Spark) ----------------------------------------------------------------


def test_a_lake_holding_exactly_what_was_delivered_balances() -> None:
    report = reconcile(
        books(topic_entry("a", 7, {"rate_limit": 5}), topic_entry("b", 3)),
        [landing("a", 0, range(4)), landing("a", 1, range(3)), landing("b", 0, range(3))],
    )

    assert report.balanced
    assert [(t.topic, t.landed, t.delivered, t.partitions) for t in report.topics] == [
        ("a", 7, 7, 2),
        ("b", 3, 3, 1),
    ]
    assert report.verdict().startswith("AUDIT BALANCED: 10 landed == 10 delivered")


def test_fewer_rows_than_delivered_is_a_mismatch_even_without_gaps() -> None:
    # The last two records never landed: no gap shows inside the lake, only the count does.
    report = reconcile(books(topic_entry("a", 5)), [landing("a", 0, range(3))])

    (topic,) = report.topics
    assert not report.balanced
    assert topic.missing == 0
    assert "landed 3 < delivered 5 (2 fewer rows than delivered)" in topic.problems
    assert report.verdict() == "AUDIT FAILED: 1 of 1 topics do not reconcile (a)"


def test_a_duplicate_fails_even_when_the_counts_agree() -> None:
    # Offsets 0, 1, 1: three rows for three deliveries, but offset 2 is missing and 1 is twice.
    report = reconcile(books(topic_entry("a", 3)), [landing("a", 0, [0, 1, 1])])

    (topic,) = report.topics
    assert (topic.landed, topic.duplicates, topic.missing) == (3, 1, 0)
    assert topic.problems == ("1 duplicate rows (same partition and offset)",)


def test_a_gap_inside_a_partition_is_missing() -> None:
    report = reconcile(books(topic_entry("a", 7)), [landing("a", 0, [0, 1, 2, 6, 7, 8, 9])])

    (topic,) = report.topics
    assert topic.missing == 3
    assert "3 offsets missing from the lake" in topic.problems


def test_offsets_below_the_first_count_as_missing_only_from_offset_zero() -> None:
    lake = [landing("a", 0, range(3, 10))]
    daemon = books(topic_entry("a", 7))

    lenient = reconcile(daemon, lake)
    strict = reconcile(daemon, lake, from_offset_zero=True)

    assert (lenient.topics[0].missing, lenient.topics[0].before_first) == (0, 3)
    assert lenient.balanced
    assert (strict.topics[0].missing, strict.topics[0].before_first) == (3, 0)
    assert not strict.balanced


def test_a_topic_the_daemon_never_saw_fails_and_one_it_never_delivered_to_passes() -> None:
    report = reconcile(
        books(topic_entry("only-discarded", 0, {"too_long": 2})),
        [landing("stranger", 0, range(2))],
    )

    by_name = {t.topic: t for t in report.topics}
    assert by_name["only-discarded"].balanced
    assert by_name["stranger"].problems == ("2 rows landed for a topic not in the daemon's books",)


def test_the_topics_option_limits_the_audit() -> None:
    report = reconcile(
        books(topic_entry("a", 1), topic_entry("b", 9)),
        [landing("a", 0, [0])],
        topics=["a", "never-used"],
    )

    assert [(t.topic, t.landed, t.delivered) for t in report.topics] == [
        ("a", 1, 1),
        ("never-used", 0, 0),
    ]
    assert report.balanced


def test_books_that_do_not_balance_fail_the_audit() -> None:
    page = books_page(topic_entry("a", 2))
    page["topics"][0]["accepted"] = 5  # 3 accepted messages unaccounted for

    report = reconcile(DaemonBooks.from_json(page), [landing("a", 0, range(2))])

    assert report.topics[0].problems[0].startswith("the daemon's books do not balance")


def test_messages_in_flight_make_the_verdict_provisional() -> None:
    report = reconcile(books(topic_entry("a", 2, in_flight=4)), [landing("a", 0, range(2))])

    assert report.balanced
    assert report.verdict().endswith("(provisional: 4 still in flight at the daemon)")


def test_discards_without_a_topic_are_what_received_leaves_unexplained() -> None:
    daemon = books(
        topic_entry("a", 10, {"rate_limit": 4, "kafka_error": 1}, after_acceptance=1),
        received={"unix_dgram": 12, "unix_stream": 5, "tcp": 1},
    )

    # 18 received = 11 accepted + 4 rate_limit + 3 without a topic (malformed...)
    assert daemon.discarded_without_topic == 3


def test_the_books_of_several_daemons_add_up() -> None:
    host_1 = books(topic_entry("a", 5, {"rate_limit": 1}), received={"unix_dgram": 7, "tcp": 0})
    host_2 = books(
        topic_entry("a", 2, {"kafka_error": 1}, after_acceptance=1, in_flight=1),
        topic_entry("b", 4),
        received={"unix_dgram": 1, "tcp": 8},
    )

    fleet = DaemonBooks.combined([host_1, host_2])

    a = fleet.topics["a"]
    assert (a.accepted, a.delivered, a.in_flight, a.discarded_after_acceptance) == (9, 7, 1, 1)
    assert a.discarded == {"rate_limit": 1, "kafka_error": 1}
    assert a.balances
    assert fleet.topics["b"].delivered == 4
    assert fleet.received == {"unix_dgram": 8, "tcp": 8}


@pytest.mark.parametrize(
    "page",
    [{}, {"topics": [{"topic": "a"}]}, {"topics": [topic_entry("a", 1) | {"delivered": "x"}]}],
)
def test_a_document_that_is_not_books_is_refused(page: dict[str, Any]) -> None:
    with pytest.raises(BooksFormatError, match="not a /books/json document"):
        DaemonBooks.from_json(page)


def test_the_text_report_has_the_table_the_problems_and_the_verdict() -> None:
    report = reconcile(
        books(topic_entry("a", 2, {"rate_limit": 5, "too_long": 1}), topic_entry("b", 1)),
        [landing("a", 0, range(2)), landing("b", 0, [0, 0])],
    )

    text = report.render()

    lines = [" ".join(line.split()) for line in text.splitlines()]  # columns -> one space
    assert lines[0] == "topic accepted delivered landed dup missing discarded"
    assert lines[2] == "a 2 2 2 0 0 rate_limit 5, too_long 1 ok"
    assert lines[3] == "b 1 1 2 1 0 none MISMATCH"
    assert lines[5].startswith("total 3 3 4 1 0")
    assert "b: landed 2 > delivered 1 (1 more rows than delivered)" in text
    assert lines[-1] == report.verdict()


def test_the_json_report_carries_every_number() -> None:
    report = reconcile(books(topic_entry("a", 2)), [landing("a", 0, [0, 1])])

    document = json.loads(report.to_json())

    assert document["balanced"] is True
    assert document["topics"] == [
        {
            "topic": "a",
            "accepted": 2,
            "delivered": 2,
            "discarded": {},
            "in_flight": 0,
            "possibly_delivered": 0,
            "left_for_next_start": 0,
            "possibly_delivered_landed": 0,
            "partitions": 1,
            "landed": 2,
            "duplicates": 0,
            "missing": 0,
            "second_copies_dropped": 0,
            "before_first": 0,
            "balanced": True,
            "problems": [],
        }
    ]


def test_gap_offsets_that_are_dropped_second_copies_are_not_missing() -> None:
    """1,000 messages, the same 1,000 again (a replay), 500 new: the lake holds offsets
    0-999 and 2000-2499. Kafka shows the 1,000 in the gap are second copies; one more
    offset not landed is still missing, and more rows than delivered still fail."""
    lake = [landing("a", 0, [*range(1_000), *range(2_000, 2_500)])]

    report = reconcile(books(topic_entry("a", 1_500)), lake, second_copies={"a": 1_000})

    assert report.balanced, report.render()
    assert (report.topics[0].missing, report.topics[0].second_copies) == (0, 1_000)
    assert report.gaps == ()
    one_lost = reconcile(books(topic_entry("a", 1_500)), lake, second_copies={"a": 999})
    assert one_lost.topics[0].problems == ("1 offsets missing from the lake",)
    not_told = reconcile(books(topic_entry("a", 1_500)), lake)
    assert not_told.topics[0].missing == 1_000
    assert "gaps not read from Kafka" in not_told.render()
    twice = [landing("a", 0, [*range(1_000), *range(1_000), *range(2_000, 2_500)])]
    assert not reconcile(books(topic_entry("a", 1_500)), twice, second_copies={"a": 1_000}).balanced


# --- possibly delivered and left for the next start (issue 20) --------------------------------


def dense(topic: str, rows: int, partitions: int = 2) -> list[PartitionLanding]:
    """``rows`` records of ``topic`` spread over ``partitions``, each from offset 0, no gap."""
    per_partition = [rows // partitions + (p < rows % partitions) for p in range(partitions)]
    return [landing(topic, p, range(n)) for p, n in enumerate(per_partition) if n]


@pytest.mark.parametrize(
    ("landed", "of_them"),
    [(10, 0), (12, 2), (14, 4)],
    ids=["none-landed", "some-landed", "all-landed"],
)
def test_possibly_delivered_messages_may_be_in_the_lake_or_not(landed: int, of_them: int) -> None:
    # 4 messages whose last attempt timed out after the request left: Kafka may hold any of them.
    report = reconcile(books(topic_entry("a", 10, possibly_delivered=4)), dense("a", landed))

    (topic,) = report.topics
    assert report.balanced, topic.problems
    assert topic.possibly_delivered_landed == of_them
    assert report.verdict() == (
        f"AUDIT BALANCED: {landed} landed over 1 topics: 10 delivered, 4 possibly delivered, "
        f"{of_them} of them landed; no duplicate, no missing offset"
    )
    assert f"a: 4 possibly delivered, {of_them} of them landed" in report.render()


def test_fewer_rows_than_delivered_fail_whatever_was_possibly_delivered() -> None:
    report = reconcile(books(topic_entry("a", 10, possibly_delivered=4)), dense("a", 9))

    (topic,) = report.topics
    assert topic.problems == ("landed 9 < delivered 10 (1 fewer rows than delivered)",)
    assert topic.possibly_delivered_landed is None
    assert report.verdict() == "AUDIT FAILED: 1 of 1 topics do not reconcile (a)"
    assert "a: 4 possibly delivered\n" in report.render()  # how many landed: not theirs to say


def test_more_rows_than_delivered_and_possibly_delivered_fail() -> None:
    report = reconcile(books(topic_entry("a", 10, possibly_delivered=4)), dense("a", 15))

    (topic,) = report.topics
    assert topic.problems == (
        "landed 15 > delivered 10 + 4 possibly delivered (1 more rows than the books allow)",
    )
    assert json.loads(report.to_json())["topics"][0]["possibly_delivered_landed"] is None


def test_left_for_the_next_start_is_shown_and_never_counted_missing() -> None:
    # A graceful stop during an outage: 5 accepted messages stay in the spool for the next start.
    report = reconcile(books(topic_entry("a", 10, left_for_next_start=5)), dense("a", 10))

    (topic,) = report.topics
    assert report.balanced, topic.problems
    assert (topic.missing, topic.left_for_next_start) == (0, 5)
    assert report.verdict() == (
        "AUDIT BALANCED: 10 landed over 1 topics: 10 delivered, 5 left for the next start, "
        "0 of them landed; no duplicate, no missing offset; the 5 left for the next start "
        "stay in the spool, unacknowledged: the next start accepts them again and counts "
        "them in its own books"
    )
    lines = [" ".join(line.split()) for line in report.render().splitlines()]
    assert lines[0] == "topic accepted delivered left landed dup missing discarded"
    assert lines[2] == "a 15 10 5 10 0 0 none ok"
    document = json.loads(report.to_json())
    assert document["left_for_next_start"] == 5
    assert document["topics"][0]["left_for_next_start"] == 5


def test_one_left_for_the_next_start_may_have_landed_if_purged_in_flight() -> None:
    # The shutdown deadline purges what librdkafka holds, in flight too (_PURGE_INFLIGHT):
    # such a message stays in the spool and may already be in Kafka.
    report = reconcile(books(topic_entry("a", 10, left_for_next_start=5)), dense("a", 12))

    assert report.balanced, report.render()
    assert report.topics[0].possibly_delivered_landed == 2


def test_books_combined_over_a_restart_count_the_replayed_messages_in_the_later_run() -> None:
    # Run 1 stops with 5 left in the spool; run 2 replays them (accepted again) and delivers
    # them with 3 new ones. The lake holds both runs' records.
    run_1 = books(topic_entry("a", 10, left_for_next_start=5))
    run_2 = books(topic_entry("a", 8))
    both = DaemonBooks.combined([run_1, run_2])

    assert (both.topics["a"].accepted, both.topics["a"].delivered) == (23, 18)
    assert both.topics["a"].balances
    assert reconcile(both, dense("a", 18)).balanced
    # Two of the five were purged in flight and had reached Kafka in run 1 as well.
    assert reconcile(both, dense("a", 20)).balanced
    # Run 1's books alone cannot explain run 2's deliveries, and say where to look.
    (alone,) = reconcile(run_1, dense("a", 18)).topics
    assert alone.problems == (
        "landed 18 > delivered 10 + 5 left for the next start (3 more rows than the books "
        "allow); the next start delivers those left for it: audit with its books too "
        "(--books/--status for every run)",
    )


def test_the_table_shows_possibly_delivered_and_the_json_carries_it() -> None:
    report = reconcile(
        books(topic_entry("a", 6, possibly_delivered=3), topic_entry("b", 2)),
        [*dense("a", 7), *dense("b", 2)],
    )

    lines = [" ".join(line.split()) for line in report.render().splitlines()]
    assert lines[0] == "topic accepted delivered possibly landed dup missing discarded"
    assert lines[2] == "a 9 6 3 7 0 0 none ok"
    assert lines[3] == "b 2 2 0 2 0 0 none ok"
    assert lines[5] == "total 11 8 3 9 0 0 none ok"
    document = json.loads(report.to_json())
    assert (document["possibly_delivered"], document["left_for_next_start"]) == (3, 0)
    assert {
        key: document["topics"][0][key]
        for key in ("possibly_delivered", "left_for_next_start", "possibly_delivered_landed")
    } == {"possibly_delivered": 3, "left_for_next_start": 0, "possibly_delivered_landed": 1}


def test_books_balance_with_the_new_outcomes_and_say_so_when_not() -> None:
    entry = topic_entry("a", 5, possibly_delivered=2, left_for_next_start=1, in_flight=1)
    assert books(entry).topics["a"].balances

    page = books_page(entry | {"accepted": 10})
    report = reconcile(DaemonBooks.from_json(page), dense("a", 5))

    assert report.topics[0].problems[0] == (
        "the daemon's books do not balance: accepted 10 != delivered 5 + possibly delivered "
        "2 + left for the next start 1 + discarded after acceptance 0 + in flight 1"
    )


def test_the_books_of_several_daemons_add_the_new_outcomes_up() -> None:
    host_1 = books(topic_entry("a", 5, possibly_delivered=2))
    host_2 = books(topic_entry("a", 1, left_for_next_start=3, possibly_delivered=1))

    a = DaemonBooks.combined([host_1, host_2]).topics["a"]

    assert (a.accepted, a.possibly_delivered, a.left_for_next_start) == (12, 3, 3)
    assert a.balances


def test_books_saved_by_an_older_pydory_still_parse() -> None:
    page = books_page(topic_entry("a", 4, {"kafka_error": 1}, after_acceptance=1))
    for key in ("metadata_known", "waiting_for_metadata"):
        del page[key]
    for key in ("possibly_delivered", "left_for_next_start"):
        del page["topics"][0][key]

    daemon = DaemonBooks.from_json(page)

    a = daemon.topics["a"]
    assert (a.possibly_delivered, a.left_for_next_start, daemon.waiting_for_metadata) == (0, 0, 0)
    assert a.balances
    assert (
        reconcile(daemon, dense("a", 4))
        .verdict()
        .startswith("AUDIT BALANCED: 4 landed == 4 delivered over 1 topics")
    )


def test_messages_waiting_for_metadata_are_not_discards_and_make_the_verdict_provisional() -> None:
    page = books_page(topic_entry("a", 2), received={"unix_dgram": 9})
    page["waiting_for_metadata"] = 7  # received, held until a broker answers

    report = reconcile(DaemonBooks.from_json(page), dense("a", 2))

    assert report.discarded_without_topic == 0
    assert report.verdict().endswith("(provisional: 7 waiting for metadata at the daemon)")


@given(
    delivered=st.integers(0, 40),
    possibly=st.integers(0, 10),
    left=st.integers(0, 10),
    landed=st.integers(0, 70),
)
def test_the_audit_balances_exactly_when_landed_is_within_the_bounds(
    delivered: int, possibly: int, left: int, landed: int
) -> None:
    entry = topic_entry("a", delivered, possibly_delivered=possibly, left_for_next_start=left)

    report = reconcile(books(entry), dense("a", landed, partitions=3))

    within = delivered <= landed <= delivered + possibly + left
    assert report.balanced == within, report.render()
    assert report.topics[0].possibly_delivered_landed == (landed - delivered if within else None)
    if left == 0:  # without a restart in between: delivered <= landed <= delivered + possibly
        assert report.balanced == (delivered <= landed <= delivered + possibly)


# --- lakes written by Spark's file sink -------------------------------------------------------

_SOURCE_SCHEMA = StructType(
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
_DAY = dt.datetime(2025, 3, 1, 12, tzinfo=dt.UTC)


@pytest.fixture(scope="module")
def spark() -> SparkSession:
    from pydory.pipeline.spark import spark_session

    return spark_session(master="local[2]", app_name="test-pipeline-audit")


class SinkLake:
    """A lake written through Spark's Parquet file sink, one committed batch per :meth:`land`."""

    def __init__(self, spark: SparkSession, root: Path) -> None:
        self.spark = spark
        self.path = root / "lake"
        self._source = root / "source"
        self._checkpoint = root / "checkpoint"
        self._batches = 0

    def land(self, records: Sequence[tuple[str, int, int]]) -> None:
        """Land ``(topic, partition, offset)`` records as one streaming micro-batch."""
        rows = [
            (b"k", b"v%d" % offset, topic, partition, offset, _DAY, 0)
            for topic, partition, offset in records
        ]
        self._batches += 1
        new_file = self._source / f"batch-{self._batches}"
        self.spark.createDataFrame(rows, _SOURCE_SCHEMA).write.parquet(str(new_file))
        stream = (
            self.spark.readStream.schema(_SOURCE_SCHEMA)
            .parquet(str(self._source / "*"))
            .withColumn("date", F.date_format("timestamp", "yyyy-MM-dd"))
        )
        query = (
            stream.writeStream.format("parquet")
            .option("path", str(self.path))
            .option("checkpointLocation", str(self._checkpoint))
            .partitionBy("topic", "date")
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()

    def committed_files(self) -> list[Path]:
        return sorted(self.path.glob("topic=*/date=*/*.parquet"))


def offsets(topic: str, partition: int, numbers: Sequence[int]) -> list[tuple[str, int, int]]:
    return [(topic, partition, n) for n in numbers]


@pytest.fixture
def lake(spark: SparkSession, tmp_path: Path) -> SinkLake:
    return SinkLake(spark, tmp_path)


@pytest.mark.slow
def test_a_lake_landed_in_several_batches_balances(spark: SparkSession, lake: SinkLake) -> None:
    lake.land(offsets("a", 0, range(5)) + offsets("a", 1, range(3)))
    lake.land(offsets("a", 0, range(5, 8)) + offsets("b", 0, range(4)))

    report = audit(spark, lake.path, books(topic_entry("a", 11), topic_entry("b", 4)))

    assert report.balanced, report.render()
    assert [(t.topic, t.landed, t.partitions) for t in report.topics] == [("a", 11, 2), ("b", 4, 1)]


@pytest.mark.slow
def test_a_record_landed_twice_is_a_duplicate(spark: SparkSession, lake: SinkLake) -> None:
    lake.land(offsets("a", 0, range(10)))
    lake.land(offsets("a", 0, [5, 6, 7]))  # a second batch re-reading offsets 5-7

    report = audit(spark, lake.path, books(topic_entry("a", 10)))

    (topic,) = report.topics
    assert (topic.landed, topic.duplicates, topic.missing) == (13, 3, 0)
    assert [(d.offset, d.copies) for d in report.duplicate_offsets] == [(5, 2), (6, 2), (7, 2)]
    assert not report.balanced


@pytest.mark.slow
def test_offsets_skipped_between_batches_are_missing(spark: SparkSession, lake: SinkLake) -> None:
    lake.land(offsets("a", 0, range(5)) + offsets("a", 1, range(4)))
    lake.land(offsets("a", 0, range(8, 10)) + offsets("a", 1, [6]))

    report = audit(spark, lake.path, books(topic_entry("a", 12)))

    (topic,) = report.topics
    assert (topic.landed, topic.missing) == (12, 5)
    assert [str(gap) for gap in report.gaps] == ["a[0] offsets 5-7", "a[1] offsets 4-5"]
    assert not report.balanced


@pytest.mark.slow
def test_files_outside_the_commit_log_are_ignored(spark: SparkSession, lake: SinkLake) -> None:
    lake.land(offsets("a", 0, range(6)))
    committed = lake.committed_files()[0]
    orphan = committed.with_name("part-99999-orphan.c000.snappy.parquet")
    shutil.copy(committed, orphan)  # what a batch that died before its commit leaves

    report = audit(spark, lake.path, books(topic_entry("a", 6)))

    assert pq.read_table(orphan).num_rows > 0  # a readable file, just not committed
    assert report.balanced, report.render()
    assert report.topics[0].duplicates == 0


@pytest.mark.slow
def test_a_lake_missing_its_start_fails_only_when_it_should_start_at_zero(
    spark: SparkSession, lake: SinkLake
) -> None:
    lake.land(offsets("a", 0, range(2, 6)))

    summary = summarize_lake(spark, lake.path, from_offset_zero=True)
    report = audit(spark, lake.path, books(topic_entry("a", 4)), from_offset_zero=True)

    assert [str(gap) for gap in summary.gaps] == ["a[0] offsets 0-1"]
    assert report.topics[0].missing == 2
    assert not report.balanced


@pytest.mark.slow
def test_a_directory_without_a_commit_log_is_refused(spark: SparkSession, tmp_path: Path) -> None:
    spark.createDataFrame([("a", 0, 0)], "topic string, partition int, offset long").write.parquet(
        str(tmp_path / "plain")
    )

    with pytest.raises(NotALake, match="no _spark_metadata/ commit log"):
        summarize_lake(spark, tmp_path / "plain")


# --- the command line -------------------------------------------------------------------------


@pytest.fixture
def status_server() -> Iterator[tuple[str, dict[str, Any]]]:
    """A stand-in for the daemon's status server: serves ``page`` at /books/json."""
    page: dict[str, Any] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps(page).encode()
            self.send_response(200 if self.path == "/books/json" else 404)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", page
    server.shutdown()
    server.server_close()


@pytest.mark.slow
def test_the_command_reads_the_books_from_the_status_server(
    lake: SinkLake,
    status_server: tuple[str, dict[str, Any]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    lake.land(offsets("a", 0, range(3)))
    url, page = status_server
    page.update(books_page(topic_entry("a", 3, {"rate_limit": 2})))

    status = main(["pipeline", "audit", "--lake", str(lake.path), "--status", url])

    out = capsys.readouterr().out
    assert status == 0
    assert "rate_limit 2" in out
    assert "AUDIT BALANCED: 3 landed == 3 delivered over 1 topics" in out


@pytest.mark.slow
def test_the_command_exits_1_on_a_mismatch_and_prints_json(
    lake: SinkLake, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lake.land(offsets("a", 0, range(3)))
    host_1, host_2 = tmp_path / "books-1.json", tmp_path / "books-2.json"
    host_1.write_text(json.dumps(books_page(topic_entry("a", 2))))
    host_2.write_text(json.dumps(books_page(topic_entry("a", 2))))

    books_options = ["--books", str(host_1), "--books", str(host_2)]
    status = main(["pipeline", "audit", "--lake", str(lake.path), "--json", *books_options])

    document = json.loads(capsys.readouterr().out)
    assert status == 1
    assert document["balanced"] is False
    assert document["topics"][0]["problems"] == [
        "landed 3 < delivered 4 (1 fewer rows than delivered)"
    ]


def test_the_command_exits_2_without_books(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["pipeline", "audit", "--lake", str(tmp_path)]) == 2
    assert "give the daemon's books" in capsys.readouterr().err


def test_the_command_exits_2_when_the_books_cannot_be_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "no-such-books.json"

    status = main(["pipeline", "audit", "--lake", str(tmp_path), "--books", str(missing)])

    assert status == 2
    assert f"cannot read saved books {missing}" in capsys.readouterr().err


def test_load_books_reads_a_saved_page(tmp_path: Path) -> None:
    saved = tmp_path / "books.json"
    saved.write_text(json.dumps(books_page(topic_entry("a", 4))))

    assert load_books(books_file=str(saved)).topics["a"].delivered == 4


@pytest.mark.parametrize("spelling", ["--bootstrap-servers", "--bootstrap"])
@pytest.mark.parametrize(
    "command",
    [
        ["land", "--topics", "t", "--lake", "l", "--checkpoint", "c"],
        ["audit", "--lake", "l"],
        ["fleet-audit", "--lake", "l"],
    ],
    ids=lambda command: command[0],
)
def test_the_three_commands_spell_kafka_s_address_alike(spelling: str, command: list[str]) -> None:
    """Issue 31, item 7: ``--bootstrap-servers`` in each, its first spelling kept."""
    argv = ["pipeline", command[0], spelling, "kafka1:9092,kafka2:9092", *command[1:]]

    args = build_parser("pipeline").parse_args(argv)

    assert args.bootstrap_servers == "kafka1:9092,kafka2:9092"
