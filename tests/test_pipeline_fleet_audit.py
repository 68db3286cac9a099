"""The fleet audit job on Apache Kafka and a real landing job's lake: books read from the
books topic as the daemons publish them, identities from the lake, incrementally.

The records a crash and its replay leave are produced by hand (what each run sent, with
its ``pydory-id``), landed by ``pydory pipeline land`` (second copies dropped within its
window), and the books records are the daemon's own (``RunBooks.record()``), published
as its books publisher does. The daemons themselves, SIGKILLed, are in
tests/test_fleet_exactly_once.py.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import Producer
from pyspark.sql import SparkSession

from pydory.cli import main
from pydory.daemon.books.durable import CLEAN, REBUILT, RUNNING, RunBooks
from pydory.daemon.books.publisher import books_value
from pydory.pipeline import spark as spark_module
from pydory.pipeline.audits import fleet_nothing_new
from pydory.pipeline.audits.fleet_audit import BooksTopicUnavailable, fleet_audit
from pydory.pipeline.landing.land import LandSettings, run_landing
from pydory.pipeline.spark import spark_session
from pydory_tools.testing.kafka_broker import KafkaCluster
from test_pipeline_dedup import produce as produce_records

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

A, B, C, D = 0xA, 0xB, 0xC, 0xD


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    session = spark_session(master="local[2]", app_name="pydory-test-fleet-audit")
    yield session
    session.stop()


def name(host: str, incarnation: int, sequence: int) -> str:
    return f"{host}/{incarnation:016x}/1/{sequence}"


def produce(bootstrap: str, topic: str, identities: list[str]) -> None:
    """Each identity as its message's value and header, spread over 3 partitions."""
    produce_records(
        bootstrap, topic, [(n % 3, i.encode(), i.encode()) for n, i in enumerate(identities)]
    )


def publish(bootstrap: str, books_topic: str, runs: list[RunBooks]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for books in runs:
        producer.produce(books_topic, books_value(books), books.key)
    assert producer.flush(30) == 0


def run_books(
    host: str,
    incarnation: int,
    ended: str,
    topics: Mapping[str, Mapping[str, Any]],
    replayed_from: Mapping[str, Mapping[str, int]] | None = None,
) -> RunBooks:
    books = RunBooks(host, incarnation, started_ms=incarnation, ended=ended)
    books.final = ended != RUNNING
    entries = {
        topic: {
            "accepted": 0,
            "delivered": 0,
            "possibly_delivered": 0,
            "discarded": {},
            "left_for_next_start": 0,
            "in_flight": 0,
            "replayed": 0,
            **values,
        }
        for topic, values in topics.items()
    }
    if ended == REBUILT:
        books.rebuilt = entries
    else:
        books.live = entries
    books.replayed_from = {k: dict(v) for k, v in (replayed_from or {}).items()}
    return books


def land(bootstrap: str, topic: str, root: Path) -> None:
    out = io.StringIO()
    settings = LandSettings(
        bootstrap_servers=bootstrap,
        topics=(topic,),
        lake=str(root / "lake"),
        checkpoint=str(root / "checkpoint"),
        available_now=True,
        dedup_window_s=0.5,  # so that a copy landing runs later is NOT dropped (step 3)
    )
    assert run_landing(settings, out) == 0, out.getvalue()


def test_the_fleet_audit_proves_each_hosts_books_from_the_books_topic_and_reads_only_what_is_new(
    spark: SparkSession,
    kafka_broker: KafkaCluster,
    unique_topic: Callable[[str], str],
    tmp_path: Path,
) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    events, books_topic = unique_topic("fleet-events"), unique_topic("fleet-books")
    kafka_broker.create_topic(events, 3)
    kafka_broker.create_topic(books_topic, 1, config={"cleanup.policy": "compact"})
    lake, state = str(tmp_path / "lake"), str(tmp_path / "state")

    # Host h1: run A sent 10 messages and was SIGKILLed with 7..9 unsettled (7 and 8 had
    # reached Kafka already); run B replayed them under A's names, then sent 5 new ones,
    # the last discarded. Host h2: run C sent 6, one possibly delivered (it landed).
    produce(bootstrap, events, [name("h1", A, n) for n in range(9)])
    produce(bootstrap, events, [name("h1", A, n) for n in (7, 8, 9)])
    produce(bootstrap, events, [name("h1", B, n) for n in range(4)])
    produce(bootstrap, events, [name("h2", C, n) for n in range(6)])
    maybe = name("h2", C, 5)
    a_running = run_books("h1", A, RUNNING, {events: {"accepted": 9, "delivered": 6}})
    a_rebuilt = run_books(
        "h1", A, REBUILT, {events: {"accepted": 10, "delivered": 7, "handed_over": 3}}
    )
    b_clean = run_books(
        "h1",
        B,
        CLEAN,
        {events: {"accepted": 8, "delivered": 7, "discarded": {"kafka_error": 1}, "replayed": 3}},
        replayed_from={f"{A:016x}": {events: 3}},
    )
    c_clean = run_books(
        "h2",
        C,
        CLEAN,
        {
            events: {
                "accepted": 6,
                "delivered": 5,
                "possibly_delivered": 1,
                "possibly_delivered_ids": [maybe],
            }
        },
    )
    publish(bootstrap, books_topic, [a_running, a_rebuilt, b_clean, c_clean])
    land(bootstrap, events, tmp_path)

    first = fleet_audit(
        spark, lake, bootstrap_servers=bootstrap, books_topic=books_topic, state_dir=state
    )
    assert first.balanced, first.render()
    assert first.second_copies_in_lake == 0
    by_host = {host.host: host.topics[0] for host in first.hosts}
    assert (by_host["h1"].new, by_host["h1"].landed, by_host["h1"].exact) == (15, 14, True)
    assert by_host["h1"].discarded == {"kafka_error": 1}
    assert (by_host["h2"].new, by_host["h2"].landed, by_host["h2"].possibly_found) == (6, 6, 1)
    assert first.sources["books_records_read"] == 4  # a's first record: replaced by its last
    assert first.sources["runs"] == 3

    # Step 2: h2's next run D sends 2 more. Only the new lake files and the new books
    # record are read, and the books still balance.
    produce(bootstrap, events, [name("h2", D, n) for n in range(2)])
    publish(
        bootstrap,
        books_topic,
        [run_books("h2", D, CLEAN, {events: {"accepted": 2, "delivered": 2}})],
    )
    land(bootstrap, events, tmp_path)
    second = fleet_audit(
        spark, lake, bootstrap_servers=bootstrap, books_topic=books_topic, state_dir=state
    )
    assert second.balanced, second.render()
    assert second.sources["books_records_read"] == 1
    assert 0 < second.sources["lake_files_read"] < second.sources["lake_files_audited"]
    assert {host.host: host.topics[0].landed for host in second.hosts} == {"h1": 14, "h2": 8}

    # Step 3: a second copy of one of A's messages lands after the landing job's window
    # (Spark evicts an identity at the end of a batch with data after the window: one
    # record without a header first): in a file this audit has not read, found by the
    # ranges kept. The headerless record is counted apart, not audited.
    headerless = Producer({"bootstrap.servers": bootstrap})
    headerless.produce(events, b"no header")
    assert headerless.flush(30) == 0
    land(bootstrap, events, tmp_path)
    produce(bootstrap, events, [name("h1", A, 0)])
    land(bootstrap, events, tmp_path)
    third = fleet_audit(
        spark, lake, bootstrap_servers=bootstrap, books_topic=books_topic, state_dir=state
    )
    assert not third.balanced
    assert third.second_copies_in_lake == 1
    assert "1 second copies landed" in third.render()
    assert third.sources["books_records_read"] == 0
    assert third.as_dict()["rows_without_identity"] == {events: 1}


def test_a_books_topic_that_does_not_exist_stops_the_audit_naming_it_and_is_not_created(
    spark: SparkSession,
    kafka_broker: KafkaCluster,
    unique_topic: Callable[[str], str],
    tmp_path: Path,
) -> None:
    """The broker auto-creates topics (Kafka's default): looking must not create it."""
    (tmp_path / "lake" / "_spark_metadata").mkdir(parents=True)
    missing = unique_topic("no-such-books")
    for _ in range(2):  # the second look would find a topic the first one created
        with pytest.raises(BooksTopicUnavailable, match=rf"{missing}.*no such topic"):
            fleet_audit(
                spark,
                tmp_path / "lake",
                bootstrap_servers=kafka_broker.bootstrap_servers,
                books_topic=missing,
            )


def test_a_host_that_never_came_back_and_a_tombstoned_run_balance_and_a_loss_still_fails(
    spark: SparkSession,
    kafka_broker: KafkaCluster,
    unique_topic: Callable[[str], str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Issue 31, item 3. Host h-b crashed and never came back: its last books record
    (written every 5 s) counts 6 accepted, 8 of its messages landed. Host h-c's run C was
    deleted from the books topic (a tombstone after its record), run D's record was only
    ever a tombstone. The lake lands one topic of two the daemons sent (--topics)."""
    bootstrap = kafka_broker.bootstrap_servers
    events, other = unique_topic("gone-events"), unique_topic("gone-other")
    books_topic = unique_topic("gone-books")
    kafka_broker.create_topic(events, 3)
    kafka_broker.create_topic(books_topic, 1, config={"cleanup.policy": "compact"})
    produce(bootstrap, events, [name("h-b", A, n) for n in range(8)])
    produce(bootstrap, events, [name("h-c", C, n) for n in range(3)])
    produce(bootstrap, events, [name("h-c", D, n) for n in range(2)])
    b_last = run_books(
        "h-b",
        A,
        RUNNING,
        {events: {"accepted": 6, "delivered": 5, "in_flight": 1}, other: {"accepted": 4}},
    )
    c_clean = run_books("h-c", C, CLEAN, {events: {"accepted": 3, "delivered": 3}})
    publish(bootstrap, books_topic, [b_last, c_clean])
    tombstones = Producer({"bootstrap.servers": bootstrap})
    for key in (c_clean.key, f"h-c/{D:016x}"):
        tombstones.produce(books_topic, None, key)
    assert tombstones.flush(30) == 0
    land(bootstrap, events, tmp_path)
    lake = str(tmp_path / "lake")

    report = fleet_audit(
        spark, lake, bootstrap_servers=bootstrap, books_topic=books_topic, topics=[events]
    )

    assert report.balanced, report.render()
    hosts = {host.host: host for host in report.hosts}
    assert hosts["h-b"].topics[0].after_record == 2
    assert any("2 of its identities landed beyond the 6" in note for note in hosts["h-b"].notes)
    assert hosts["h-c"].runs[0].record.tombstoned
    assert any("no earlier record left): 2 of its identities" in n for n in hosts["h-c"].notes)
    # Without --topics the other topic's 4 messages are missing from this lake.
    assert not fleet_audit(
        spark, lake, bootstrap_servers=bootstrap, books_topic=books_topic
    ).balanced

    # A real loss of h-b's is still caught: a delivered message that never landed.
    publish(
        bootstrap,
        books_topic,
        [run_books("h-b", A, RUNNING, {events: {"accepted": 9, "delivered": 9}})],
    )
    command = ["pipeline", "fleet-audit", "--lake", lake, "--bootstrap", bootstrap]
    command += ["--books-topic", books_topic, "--topics", events]
    assert main(command) == 1
    assert "NOT OK: landed 8, the books say 9" in capsys.readouterr().out


def test_an_incremental_run_with_nothing_new_reports_from_its_state_without_spark(
    spark: SparkSession,
    kafka_broker: KafkaCluster,
    unique_topic: Callable[[str], str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The run after one that read everything finds the books topic's offsets and the lake
    files' times where its state left them: the same report, Spark not asked for. A new
    books record, or a new lake file, is read with Spark again."""
    bootstrap = kafka_broker.bootstrap_servers
    events, books_topic = unique_topic("still-events"), unique_topic("still-books")
    kafka_broker.create_topic(events, 3)
    kafka_broker.create_topic(books_topic, 2, config={"cleanup.policy": "compact"})
    produce(bootstrap, events, [name("h1", A, n) for n in range(5)])
    publish(
        bootstrap,
        books_topic,
        [run_books("h1", A, CLEAN, {events: {"accepted": 5, "delivered": 5}})],
    )
    land(bootstrap, events, tmp_path)
    command = ["pipeline", "fleet-audit", "--lake", str(tmp_path / "lake"), "--json"]
    command += ["--bootstrap", bootstrap, "--books-topic", books_topic]
    command += ["--state", str(tmp_path / "state")]

    def audited(*, with_spark: bool) -> dict[str, Any]:
        refused: list[str] = []

        def no_spark(*_args: Any, **_kwargs: Any) -> Any:
            refused.append("job_session")
            raise AssertionError("Spark was asked for")

        with monkeypatch.context() as patch:
            if not with_spark:
                patch.setattr(spark_module, "job_session", no_spark)
            status = main(command)
        out, err = capsys.readouterr()
        assert refused == [], err
        report: dict[str, Any] = json.loads(out)
        assert status == (0 if report["balanced"] else 1), out + err
        assert report["sources"]["read_with_spark"] is with_spark
        return report

    first = audited(with_spark=True)
    assert first["balanced"] is True
    assert first["sources"]["lake_files_read"] > 0

    still = audited(with_spark=False)
    assert (still["sources"]["lake_files_read"], still["sources"]["books_records_read"]) == (0, 0)
    for report in (first, still):
        del report["sources"]["read_with_spark"]
        report["sources"]["lake_files_read"] = report["sources"]["books_records_read"] = 0
    assert still == first

    # A new books record (on the partition the first had nothing on, or the other).
    publish(
        bootstrap,
        books_topic,
        [run_books("h1", B, CLEAN, {events: {"accepted": 2, "delivered": 2}})],
    )
    books = audited(with_spark=True)
    assert books["sources"]["books_records_read"] == 1
    assert books["balanced"] is False  # B's 2 have not landed yet
    audited(with_spark=False)

    # New lake files.
    produce(bootstrap, events, [name("h1", B, n) for n in range(2)])
    land(bootstrap, events, tmp_path)
    files = audited(with_spark=True)
    assert files["sources"]["lake_files_read"] > 0
    assert files["balanced"] is True
    assert audited(with_spark=False)["balanced"] is True


def test_a_lake_file_younger_than_the_mark_or_at_it_unread_is_new(tmp_path: Path) -> None:
    """Times as Spark's local file system gives them (milliseconds), names as Spark gives
    the files it read (URIs)."""
    day = tmp_path / "lake" / "topic=t" / "date=2026-11-28"
    day.mkdir(parents=True)
    (tmp_path / "lake" / "_spark_metadata").mkdir()
    (tmp_path / "lake" / "_spark_metadata" / "0").write_text("v1")
    mark_ms = 1_764_300_000_123

    def file(name: str, ms: int, extra_ns: int = 0) -> None:
        (day / name).write_bytes(b"PAR1")
        os.utime(day / name, ns=(ms * 1_000_000 + extra_ns,) * 2)

    file("part-0.parquet", mark_ms - 5)
    file("part-1.parquet", mark_ms, extra_ns=999_999)  # the same millisecond
    file(".part-1.parquet.crc", mark_ms + 9)  # Spark lists no hidden file
    read_at_mark = {f"file:{day}/part-1.parquet"}
    state = SimpleNamespace(
        lake=str(tmp_path / "lake"), read_through_us=mark_ms * 1000, files_at_mark=read_at_mark
    )

    assert fleet_nothing_new._no_new_files(state)
    file("part-2.parquet", mark_ms)
    assert not fleet_nothing_new._no_new_files(state)
    state.files_at_mark = {*read_at_mark, f"file://{day}/part-2.parquet"}
    assert fleet_nothing_new._no_new_files(state)
    file("part-3.parquet", mark_ms + 1)
    assert not fleet_nothing_new._no_new_files(state)
