"""Faults are messages (issue 31, item 5): a lake that cannot be written, a full disk, a
corrupt committed Parquet file, Kafka down, HDFS down, a Spark master or every worker
gone: each job ends with one line naming the cause and exit status 2 ("could not run"),
never a traceback, never 1 ("does not balance").

How each fault is made, as root too (where ``chmod`` stops no write):

- a lake that cannot be written: its path runs under a regular file (``ENOTDIR`` for
  every user, root included); where this process may mount (root, as in CI containers),
  also a read-only tmpfs (``EROFS``);
- a full disk: a tmpfs of 256 KiB, where this process may mount (skipped otherwise);
- a corrupt Parquet file: a committed lake file overwritten with other bytes;
- Kafka down: a loopback port nothing listens on;
- every worker gone: the one worker of a Spark standalone cluster of the test's own (never
  the session's, whose other tests would lose it) SIGKILLed while the landing runs on it;
- HDFS gone mid-run: the namenode (and its datanode: one JVM) of an HDFS of the test's own
  SIGKILLed by its PID once the landing's first batch is in, then started again on the
  same data and ports, as an operator brings a namenode back.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from pydory.cli import main
from pydory.commands import pipeline as cli_pipeline
from pydory.pipeline import faults
from pydory.pipeline.faults import ExecutorsGone, fault_line
from pydory.pipeline.landing import land, nothing_new
from pydory.pipeline.landing.land import (
    DEFAULT_EXECUTOR_WAIT_S,
    EXIT_COULD_NOT_RUN,
    LandSettings,
    run_landing,
)
from pydory.pipeline.spark import spark_session
from pydory_tools.testing.hdfs_cluster import HdfsCluster
from pydory_tools.testing.kafka_broker import KafkaCluster
from pydory_tools.testing.lifecycle import SHORT_LIVED_EXECUTOR_CONF
from pydory_tools.testing.spark_cluster import SparkCluster
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


def landing(
    bootstrap: str, topic: str, lake: Path | str, checkpoint: Path | str
) -> tuple[int, str]:
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
    hdfs = "hdfs://nn:8020/lake: java.net.ConnectException: Call From h to nn:8020 failed on "
    assert fault_line(OSError(hdfs + "connection exception: Connection refused")) == (
        "connection refused (hdfs://nn:8020/lake)"
    )
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


def test_a_spark_master_that_is_gone_is_one_line_and_exit_2_before_a_jvm_starts(
    tmp_path: Path,
) -> None:
    """The landing and both audits, each a process of its own (no session to reuse): a
    ``spark://`` master nothing answers at is said at once, not after Spark's three 20 s
    registration attempts and a batch waiting for executors."""
    master = f"spark://127.0.0.1:{closed_port()}"
    books = tmp_path / "books.json"
    books.write_text(json.dumps({"topics": [], "received": {}}))
    lake, checkpoint = str(tmp_path / "lake"), str(tmp_path / "checkpoint")
    (tmp_path / "landed" / "_spark_metadata").mkdir(parents=True)  # a lake to audit
    landed = str(tmp_path / "landed")
    commands = {
        "land": [
            *("--bootstrap-servers", "127.0.0.1:9", "--topics", "t", "--lake", lake),
            *("--checkpoint", checkpoint, "--available-now"),
        ],
        "audit": ["--lake", landed, "--books", str(books)],
        "fleet-audit": ["--lake", landed, "--bootstrap-servers", "127.0.0.1:9"],
    }
    for command, options in commands.items():
        done = subprocess.run(
            [sys.executable, "-m", "pydory", "pipeline", command, "--master", master, *options],
            capture_output=True,
            text=True,
            timeout=120,  # not a deadline: a safety net; it ends in seconds
            check=False,
        )

        said = done.stdout + done.stderr
        assert done.returncode == EXIT_COULD_NOT_RUN, said
        (line,) = [line for line in said.splitlines() if line.startswith("pydory ")]
        assert line.startswith(f"pydory pipeline {command}: could not run: "), said
        assert f"no Spark master answered at {master}" in line, said
        assert "Connection refused" in line
        assert "Traceback" not in said
    assert not (tmp_path / "lake").exists()


def test_hdfs_down_stops_the_landing_and_the_audit_with_one_line_and_exit_2(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A namenode nothing answers at: Hadoop's client retries a refused connection 10
    times a second apart by default; ``ipc.client.connect.max.retries=0`` (Hadoop's own
    setting, ``--conf spark.hadoop.ipc.client.connect.max.retries=0`` for a job) says it
    at once."""
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()  # type: ignore[union-attr]
    hadoop.set("ipc.client.connect.max.retries", "0")
    namenode = f"hdfs://127.0.0.1:{closed_port()}"
    try:
        status, out = landing("127.0.0.1:9", "t", namenode + "/lake", namenode + "/checkpoint")
        books = tmp_path / "books.json"
        books.write_text(json.dumps({"topics": [], "received": {}}))
        audited = main(["pipeline", "audit", "--lake", f"{namenode}/lake", "--books", str(books)])
    finally:
        hadoop.unset("ipc.client.connect.max.retries")

    assert status == EXIT_COULD_NOT_RUN, out
    assert last_line(out).startswith("pydory pipeline land: could not run: "), out
    assert "Connection refused" in last_line(out) or "connection refused" in last_line(out), out
    assert namenode in last_line(out)
    err = capsys.readouterr().err
    assert audited == EXIT_COULD_NOT_RUN, err
    (line,) = [line for line in err.splitlines() if line.startswith("pydory ")]
    assert line.startswith("pydory pipeline audit: could not run: "), line
    assert namenode in line, line


def test_a_cluster_with_no_executor_for_the_wait_stops_the_landing_a_lost_worker_does_not() -> None:
    """Spark waits forever for executors when every worker is gone; the landing's watch
    (checked every half second while a query runs) stops it after its wait, exit 2."""
    now, executors = [0.0], [2]
    no_spark: Any = SimpleNamespace(sparkContext=None)
    watch = land._ExecutorWatch(no_spark, "spark://m:7077", 5.0, clock=lambda: now[0])
    watch.executors = lambda: executors[0]
    watch.check()
    executors[0], now[0] = 1, 100.0  # one worker lost: its tasks run on the other
    watch.check()
    executors[0], now[0] = 0, 101.0  # none: the wait starts
    watch.check()
    now[0] = 105.9
    watch.check()
    executors[0], now[0] = 1, 106.0  # a worker came back: the wait starts over
    watch.check()
    executors[0], now[0] = 0, 107.0
    watch.check()
    now[0] = 111.9
    watch.check()
    now[0] = 112.0
    with pytest.raises(ExecutorsGone) as gone:
        watch.check()
    assert fault_line(gone.value) == (
        "no Spark executor for 5 s on spark://m:7077: the cluster's workers are gone or have "
        "no cores or memory left for the job; the batch in flight is redone by the next run"
    )
    local = land._ExecutorWatch(no_spark, "local[2]", 5.0, clock=lambda: now[0])
    local.executors = lambda: 0  # local mode: the driver runs the tasks
    now[0] = 1_000.0
    local.check()
    # Dynamic allocation may release every executor of an idle job: no fault either.
    dynamic: Any = SimpleNamespace(
        sparkContext=SimpleNamespace(
            getConf=lambda: {"spark.dynamicAllocation.enabled": "true"}, _jsc=None
        )
    )
    elastic = land._ExecutorWatch(dynamic, "spark://m:7077", 5.0, clock=lambda: now[0])
    elastic.executors = lambda: 0
    elastic.check()
    now[0] = 2_000.0
    elastic.check()
    assert LandSettings("b:1", ("t",), "l", "c").executor_wait_s == DEFAULT_EXECUTOR_WAIT_S
    assert cli_pipeline.DEFAULT_EXECUTOR_WAIT_S == DEFAULT_EXECUTOR_WAIT_S


def test_an_audit_s_session_is_stopped_when_the_job_started_it_and_only_then(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Both audits run in ``spark.job_session`` (commands/pipeline_audit.py,
    pipeline_fleet_audit.py): it stops the session it started, also when the job fails,
    and leaves running one it found (a test's, a notebook's)."""
    from pydory.pipeline import spark as spark_module

    stopped: list[str] = []
    session = SimpleNamespace(stop=lambda: stopped.append("stopped"))
    monkeypatch.setattr(spark_module, "spark_session", lambda *args: session)
    monkeypatch.setattr(spark_module.SparkContext, "_active_spark_context", None)
    with pytest.raises(RuntimeError), spark_module.job_session("local[1]", "audit"):
        raise RuntimeError("the job failed")
    assert stopped == ["stopped"]
    monkeypatch.setattr(spark_module.SparkContext, "_active_spark_context", object())
    with spark_module.job_session("local[1]", "audit") as found:
        assert found is session
    assert stopped == ["stopped"]
    for command in ("pipeline_audit", "pipeline_fleet_audit"):
        source = Path(cli_pipeline.__file__).with_name(f"{command}.py").read_text()
        assert "job_session(master=args.master" in source, command


# The CLI's landing in a process of its own (no session of this one to reuse), then whether
# it left its Spark session running: the one state the exit code does not tell.
_LAND_THEN_TELL_SESSION = """
import sys
from pyspark import SparkContext
from pydory.cli import main
status = main(sys.argv[1:])
print("spark session left active:", SparkContext._active_spark_context is not None)
sys.exit(status)
"""


@pytest.mark.kafka
@pytest.mark.spark_cluster
def test_every_worker_gone_while_the_landing_runs_is_one_line_and_exit_2(
    kafka_broker: KafkaCluster, unique_topic: Callable[[str], str], tmp_path: Path
) -> None:
    """The one worker of a cluster SIGKILLed after the landing's first batch: its executor
    goes with it, Spark would wait for another forever; the landing says so after its
    ``--executor-wait`` and stops its session."""
    topic = unique_topic("workergone")
    kafka_broker.create_topic(topic, 1)
    produce(kafka_broker.bootstrap_servers, topic, [(0, b"v", identity(i)) for i in range(20)])
    lake = tmp_path / "lake"
    with SparkCluster(1, base_dir=tmp_path / "spark") as cluster:
        command = [
            *("pipeline", "land", "--bootstrap-servers", kafka_broker.bootstrap_servers),
            *("--topics", topic, "--lake", str(lake), "--checkpoint", str(tmp_path / "cp")),
            *("--master", cluster.master_url, "--trigger-interval", "1", "--executor-wait", "5"),
            *("--conf", "spark.executor.memory=512m", "--conf", "spark.sql.shuffle.partitions=2"),
            *(f"--conf={key}={value}" for key, value in SHORT_LIVED_EXECUTOR_CONF.items()),
        ]

        def kill_the_worker(said: str) -> None:
            assert cluster.worker_executors(1) == 1, said
            cluster.kill_worker(1)  # SIGKILL, by its PID

        # It ends seconds after the wait of 5 s.
        status, said, err = _land_until_a_batch_then(
            [sys.executable, "-c", _LAND_THEN_TELL_SESSION, *command], tmp_path, kill_the_worker
        )

    assert status == EXIT_COULD_NOT_RUN, said + err[-3000:]
    (line,) = [line for line in (said + err).splitlines() if line.startswith("pydory ")]
    assert line == (
        f"pydory pipeline land: could not run: no Spark executor for 5 s on "
        f"{cluster.master_url}: the cluster's workers are gone or have no cores or memory "
        "left for the job; the batch in flight is redone by the next run"
    ), said
    assert "spark session left active: False" in said.splitlines(), said
    assert "Traceback" not in said + err, err[-3000:]
    assert any(lake.glob("topic=*/date=*/*.parquet"))


def _land_until_a_batch_then(
    command: list[str], tmp_path: Path, fault: Callable[[str], None]
) -> tuple[int, str, str]:
    """Run the landing ``command`` as a process, call ``fault`` with its output once its
    first batch has landed, and wait for its end: its exit status, all its output, and
    its stderr (Spark's log: kept in a file, which cannot fill as a pipe no one reads)."""
    with (tmp_path / "stderr").open("w+") as stderr:
        landing = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, text=True)
        try:
            said = _until_a_batch_landed(landing)
            fault(said)
            out, _ = landing.communicate(timeout=600)  # not a deadline: a safety net
        finally:
            if landing.poll() is None:
                landing.kill()
                landing.wait()
        stderr.seek(0)
        return landing.returncode, said + out, stderr.read()


def _until_a_batch_landed(landing: subprocess.Popen[str]) -> str:
    """The landing's output up to its first progress line (``batch N: ...``), which it
    prints once the sink has committed the batch."""
    assert landing.stdout is not None
    said = ""
    for line in landing.stdout:
        said += line
        if line.startswith("batch "):
            return said
    raise AssertionError(f"the landing ended before a batch landed:\n{said}")


@pytest.mark.hdfs
@pytest.mark.kafka
def test_the_namenode_dying_mid_run_is_one_line_and_exit_2_and_a_rerun_lands_the_rest(
    spark: SparkSession,
    kafka_broker: KafkaCluster,
    unique_topic: Callable[[str], str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A landing into a lake on HDFS, in batches of 40, loses its namenode (SIGKILLed by
    the PID its launcher started) once its first batch is in: it ends with one line naming
    the cause, exit 2. HDFS started again on the same data and ports, a re-run lands what
    was left: every record once, the audit balanced, each batch's files within the shuffle
    partitions; a run after that has nothing new to land and starts no query."""
    bootstrap, count = kafka_broker.bootstrap_servers, 600
    topic = unique_topic("namenode")
    kafka_broker.create_topic(topic, 2)
    produce(bootstrap, topic, [(n % 2, b"v%d" % n, identity(n)) for n in range(count)])
    with HdfsCluster(1, base_dir=tmp_path / "hdfs") as hdfs:
        lake, checkpoint = f"{hdfs.uri}/lake", f"{hdfs.uri}/checkpoint"
        command = [
            *(sys.executable, "-m", "pydory", "pipeline", "land", "--bootstrap-servers"),
            *(bootstrap, "--topics", topic, "--lake", lake, "--checkpoint", checkpoint),
            *("--available-now", "--max-offsets-per-trigger", "40", "--master", "local[2]"),
            # Told at once, not after Hadoop's 10 retries a second apart (docs/pipeline.md).
            *("--conf", "spark.hadoop.ipc.client.connect.max.retries=0"),
        ]
        namenode = hdfs.pid
        # SIGKILL, by the PID the launcher started; the landing ends seconds after it.
        status, said, err = _land_until_a_batch_then(command, tmp_path, lambda _: hdfs.kill())

        assert status == EXIT_COULD_NOT_RUN, said + err[-3000:]
        lines = said.strip().splitlines()
        assert [line for line in lines if "could not run" in line] == lines[-1:], said
        assert lines[-1].startswith("pydory pipeline land: could not run: "), said
        assert "connection refused" in lines[-1].lower(), said
        assert hdfs.uri in lines[-1], said
        assert "Traceback" not in said + err, err[-3000:]
        (tmp_path / "landing.out").write_text(f"namenode pid {namenode} SIGKILLed\n{said}")

        hdfs.start_again()
        before = spark.read.parquet(lake).count()
        assert 0 < before < count, said
        rerun = io.StringIO()
        settings = LandSettings(
            bootstrap_servers=bootstrap,
            topics=(topic,),
            lake=lake,
            checkpoint=checkpoint,
            available_now=True,
        )
        assert run_landing(settings, rerun) == 0, rerun.getvalue()

        rows = spark.read.parquet(lake)
        assert rows.count() == count, rerun.getvalue()
        assert rows.select("pydory_id").distinct().count() == count
        assert rows.select("partition", "offset").distinct().count() == count
        books = tmp_path / "books.json"
        entry = {"topic": topic, "accepted": count, "delivered": count, "discarded": {}}
        entry |= {"discarded_after_acceptance": 0, "in_flight": 0}
        books.write_text(json.dumps({"topics": [entry], "received": {}}))
        audit = ["pipeline", "audit", "--lake", lake, "--books", str(books), "--from-offset-zero"]
        assert main(audit) == 0, capsys.readouterr()
        assert "AUDIT BALANCED" in capsys.readouterr().out

        # The small files' bound (docs/pipeline.md, "Files it keeps"): each committed batch
        # wrote at most one file per shuffle partition into each topic and date.
        batches = 1 + max(
            int(name.split(".")[0])
            for name in hdfs.list_names(f"{lake}/_spark_metadata")
            if name.split(".")[0].isdigit()
        )
        partitions = int(spark.conf.get("spark.sql.shuffle.partitions") or 0)
        files = rows.select("date", F.input_file_name().alias("file")).distinct()
        per_date = files.groupBy("date").count().collect()
        assert per_date, files
        assert all(row["count"] <= batches * partitions for row in per_date), (batches, per_date)

        again = io.StringIO()
        assert run_landing(settings, again) == 0, again.getvalue()
        assert "nothing new to land: the checkpoint holds every offset; no query started" in (
            again.getvalue()
        )
