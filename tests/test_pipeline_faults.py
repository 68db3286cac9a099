"""Faults are messages (issue 31, item 5): a lake that cannot be written, a full disk, a
corrupt committed Parquet file, Kafka down: each job ends with one line naming the cause
and exit status 2 ("could not run"), never a traceback, never 1 ("does not balance").

How each fault is made, as root too (where ``chmod`` stops no write):

- a lake that cannot be written: its path runs under a regular file (``ENOTDIR`` for
  every user, root included); where this process may mount (root, as in CI containers),
  also a read-only tmpfs (``EROFS``);
- a full disk: a tmpfs of 256 KiB, where this process may mount (skipped otherwise);
- a corrupt Parquet file: a committed lake file overwritten with other bytes;
- Kafka down: a loopback port nothing listens on.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import socket
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from pydory.cli import main
from pydory.pipeline import faults
from pydory.pipeline.faults import fault_line
from pydory.pipeline.landing import nothing_new
from pydory.pipeline.landing.land import EXIT_COULD_NOT_RUN, LandSettings, run_landing
from pydory.pipeline.spark import spark_session
from pydory_tools.testing.kafka_broker import KafkaCluster
from test_pipeline_dedup import identity, produce
from test_pipeline_second_copies import file_sink_lake

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    session = spark_session(master="local[2]", app_name="pydory-test-faults")
    yield session
    session.stop()


@pytest.fixture
def kafka_answer_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """The jobs' waits for Kafka's answer, short: where Kafka is down the answer never comes,
    so the jobs' own 30 s (10 s before a landing starts Spark) would only be waited out."""
    # not a deadline: nothing listens, each wait ends at its timeout on any machine
    monkeypatch.setattr(faults, "KAFKA_ANSWER_TIMEOUT_S", 2.0)
    monkeypatch.setattr(nothing_new, "_BROKER_TIMEOUT_S", 2.0)  # not a deadline: as above


def landing(bootstrap: str, topic: str, lake: Path, checkpoint: Path) -> tuple[int, str]:
    out = io.StringIO()
    settings = LandSettings(
        bootstrap_servers=bootstrap,
        topics=(topic,),
        lake=str(lake),
        checkpoint=str(checkpoint),
        available_now=True,
    )
    return run_landing(settings, out), out.getvalue()


def last_line(text: str) -> str:
    return text.strip().splitlines()[-1]


@contextlib.contextmanager
def tmpfs(where: Path, options: str) -> Iterator[Path]:
    """A tmpfs mounted at ``where`` (skips the test where this process may not mount)."""
    where.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)],
        capture_output=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


@pytest.fixture
def topic_with_records(
    kafka_broker: KafkaCluster, unique_topic: Callable[[str], str]
) -> tuple[str, str]:
    topic = unique_topic("faults")
    kafka_broker.create_topic(topic, 1)
    # Random values: Parquet cannot compress them below the full disk's 256 KiB.
    records = [(0, os.urandom(4096), identity(i)) for i in range(200)]
    produce(kafka_broker.bootstrap_servers, topic, records)
    return kafka_broker.bootstrap_servers, topic


@pytest.mark.kafka
def test_a_lake_under_a_regular_file_is_one_line_and_exit_2(
    spark: SparkSession, topic_with_records: tuple[str, str], tmp_path: Path
) -> None:
    bootstrap, topic = topic_with_records
    (tmp_path / "a-file").write_text("not a directory")

    status, out = landing(bootstrap, topic, tmp_path / "a-file" / "lake", tmp_path / "checkpoint")

    assert status == EXIT_COULD_NOT_RUN, out
    assert last_line(out).startswith("pydory pipeline land: could not run: ")
    assert "Traceback" not in out


@pytest.mark.kafka
@pytest.mark.parametrize(
    ("options", "cause"),
    [
        ("ro,size=1m", "read-only file system"),
        ("size=256k", "no space left on the device (the disk is full)"),
    ],
    ids=["read-only", "full"],
)
def test_a_read_only_or_full_lake_is_one_line_and_exit_2(
    options: str,
    cause: str,
    spark: SparkSession,
    topic_with_records: tuple[str, str],
    tmp_path: Path,
) -> None:
    bootstrap, topic = topic_with_records
    with tmpfs(tmp_path / "disk", options) as disk:
        status, out = landing(bootstrap, topic, disk / "lake", tmp_path / "checkpoint")

    assert status == EXIT_COULD_NOT_RUN, out
    assert cause in last_line(out), out[-3000:]
    assert last_line(out).startswith("pydory pipeline land: could not run: ")


@pytest.mark.kafka
@pytest.mark.usefixtures("kafka_answer_timeout")
def test_kafka_down_is_one_line_and_exit_2_before_any_file_is_written(
    spark: SparkSession, tmp_path: Path
) -> None:
    # The module's session (the landing uses the one running, as a notebook's would): the
    # fault is found on Kafka, not in a Spark start of its own.
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    # Nothing listens there now (the socket never listened).

    status, out = landing(f"127.0.0.1:{port}", "t", tmp_path / "lake", tmp_path / "checkpoint")

    assert status == EXIT_COULD_NOT_RUN, out
    assert f"could not run: Kafka at 127.0.0.1:{port} did not answer" in last_line(out)
    assert not (tmp_path / "lake").exists()


def test_a_corrupt_committed_parquet_file_stops_the_audit_with_one_line_and_exit_2(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lake = file_sink_lake(spark, tmp_path, [("a", 0, n, f"h/{n:016x}/1/{n}") for n in range(5)])
    (committed,) = sorted(lake.glob("topic=*/date=*/*.parquet"))[:1]
    committed.write_bytes(b"these bytes are not Parquet" * 10)
    books = tmp_path / "books.json"
    entry = {"topic": "a", "accepted": 5, "delivered": 5, "discarded": {}}
    entry |= {"discarded_after_acceptance": 0, "in_flight": 0}
    books.write_text(json.dumps({"topics": [entry], "received": {}}))

    status = main(["pipeline", "audit", "--lake", str(lake), "--books", str(books)])

    err = capsys.readouterr().err
    assert status == 2, err
    (line,) = [line for line in err.splitlines() if line.startswith("pydory ")]
    assert line.startswith("pydory pipeline audit: could not run: ")
    assert "Parquet" in line or "could not be read" in line, line
    assert "Traceback" not in err


def test_faults_are_named_from_python_and_from_jvm_errors() -> None:
    assert fault_line(OSError(30, "Read-only file system", "/lake")) == (
        "read-only file system (/lake)"
    )
    jvm = "java.io.IOException: No space left on device\n\tat file:/lake/x.parquet"
    assert fault_line(RuntimeError(jvm)) == (
        "no space left on the device (the disk is full) (file:/lake/x.parquet)"
    )
    assert fault_line(RuntimeError("a bug of ours")) is None
    assert os.strerror(30)  # the errno above is EROFS on this platform


def closed_port() -> int:
    """A loopback port nothing listens on (the socket bound, never listening, closed)."""
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        return int(unused.getsockname()[1])


@pytest.mark.usefixtures("kafka_answer_timeout")
def test_kafka_down_stops_both_audits_with_one_line_and_exit_2(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The fleet audit reads the books topic; the audit reads a gap's records: with no
    Kafka at the address, each says so in one line and exits 2."""
    lake = file_sink_lake(spark, tmp_path, [("a", 0, n, f"h/{n:016x}/1/{n}") for n in (0, 2)])
    kafka = f"127.0.0.1:{closed_port()}"

    fleet = main(["pipeline", "fleet-audit", "--lake", str(lake), "--bootstrap-servers", kafka])

    err = capsys.readouterr().err
    assert fleet == 2, err
    (line,) = [line for line in err.splitlines() if line.startswith("pydory ")]
    assert line.startswith("pydory pipeline fleet-audit: cannot read books topic pydory.books")

    books = tmp_path / "books.json"
    entry = {"topic": "a", "accepted": 2, "delivered": 2, "discarded": {}}
    entry |= {"discarded_after_acceptance": 0, "in_flight": 0}
    books.write_text(json.dumps({"topics": [entry], "received": {}}))
    command = ["pipeline", "audit", "--lake", str(lake), "--books", str(books)]

    single = main([*command, "--bootstrap-servers", kafka])  # offset 1 is a gap to read

    err = capsys.readouterr().err
    assert single == 2, err
    (line,) = [line for line in err.splitlines() if line.startswith("pydory ")]
    assert line.startswith(f"pydory pipeline audit: could not run: Kafka at {kafka} did not")
