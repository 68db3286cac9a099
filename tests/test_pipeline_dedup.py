"""The landing job lands each message once: second copies dropped by their ``pydory-id``.

A daemon's replay after a crash resends a message under the identity its first send
carried (same value, same header, a later offset, maybe another partition). Here the
records are produced by hand on the session's Apache Kafka broker, as such a replay
sends them, and landed through both connectors, the landing job stopped between the
two copies and restarted from its checkpoint. The job's restart after Spark's Python
worker timeout is tested here too.

One SparkSession serves the module.
"""

from __future__ import annotations

import io
import json
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from pydory.pipeline.landing import land
from pydory.pipeline.landing.dedup import (
    DEFAULT_WINDOW_S,
    IDENTITY_COLUMN,
    SESSION_CONF,
    STATE_MEMORY_MB,
    STATE_STORE_CONF,
)
from pydory.pipeline.landing.land import LandSettings, run_landing
from pydory.pipeline.spark import spark_session
from pydory_tools.testing.kafka_broker import KafkaCluster

HOST = "host-a"
INCARNATION = "00000000000000aa"
#: Spark's own words when a Python worker it started did not connect back in time.
WORKER_TIMEOUT = (
    "org.apache.spark.SparkException: Python worker failed to connect back.\n"
    "Caused by: java.net.SocketTimeoutException: Timed out while waiting for the Python "
    "worker to connect back"
)


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    session = spark_session(master="local[2]", app_name="pydory-test-dedup")
    yield session
    session.stop()


def identity(sequence: int, stream: int = 1) -> bytes:
    return f"{HOST}/{INCARNATION}/{stream}/{sequence}".encode()


def produce(bootstrap: str, topic: str, records: list[tuple[int, bytes, bytes | None]]) -> None:
    """Produce ``(partition, value, identity or None)`` records, in order."""
    producer = Producer({"bootstrap.servers": bootstrap})
    for partition, value, name in records:
        headers = None if name is None else [("pydory-id", name)]
        producer.produce(topic, value=value, partition=partition, headers=headers)
    assert producer.flush(30) == 0


def land_once(
    bootstrap: str,
    topics: tuple[str, ...],
    root: Path,
    connector: str,
    conf: dict[str, str] | None = None,
) -> str:
    """An ``--available-now`` run on ROOT's lake and checkpoint; its output."""
    out = io.StringIO()
    settings = LandSettings(
        bootstrap_servers=bootstrap,
        topics=topics,
        lake=str(root / "lake"),
        checkpoint=str(root / "checkpoint"),
        available_now=True,
        connector=connector,  # type: ignore[arg-type]
        max_offsets_per_trigger=25,
        spark_conf=conf or {},
    )
    assert run_landing(settings, out) == 0, out.getvalue()
    return out.getvalue()


def lake(spark: SparkSession, root: Path) -> list[Any]:
    return spark.read.parquet(str(root / "lake")).collect()


@pytest.mark.kafka
@pytest.mark.slow
@pytest.mark.parametrize("connector", ["python", "native"])
def test_second_copies_are_dropped_across_batches_and_a_restart_and_headerless_records_kept(
    connector: str,
    spark: SparkSession,
    kafka_broker: KafkaCluster,
    unique_topic: Callable[[str], str],
    tmp_path: Path,
) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    events, logs = unique_topic("dedup-events"), unique_topic("dedup-logs")
    kafka_broker.create_topic(events, 3)
    kafka_broker.create_topic(logs, 1)
    # The first run: 30 named messages, and 6 records without the header, some alike.
    first = [(i % 3, b"event-%d" % i, identity(i)) for i in range(30)]
    first += [(0, b"same", None)] * 4 + [(1, b"other", None)] * 2
    produce(bootstrap, events, first)
    produce(bootstrap, logs, [(0, b"log-%d" % i, identity(i, stream=2)) for i in range(5)])
    first_run = land_once(bootstrap, (events, logs), tmp_path, connector)
    assert "; 0 second copies dropped" in first_run

    # The job is stopped; the daemon crashes and replays: events 10-19 again (some into
    # another partition, as AnyPartition does), log 3 again, then new messages, one of them
    # sent twice before the job runs again; and more records without the header, alike.
    replay = [((i + 1) % 3, b"event-%d" % i, identity(i)) for i in range(10, 20)]
    replay += [(0, b"event-30", identity(30)), (2, b"event-30", identity(30))]
    replay += [(i % 3, b"event-%d" % i, identity(i)) for i in range(31, 40)]
    replay += [(0, b"same", None)] * 3
    produce(bootstrap, events, replay)
    produce(bootstrap, logs, [(0, b"log-3", identity(3, stream=2)), (0, b"log-5", identity(5, 2))])
    second_run = land_once(bootstrap, (events, logs), tmp_path, connector)

    rows = lake(spark, tmp_path)
    named = Counter((row.topic, row[IDENTITY_COLUMN]) for row in rows if row[IDENTITY_COLUMN])
    assert set(named.values()) == {1}, [name for name, n in named.items() if n > 1]
    assert set(named) == {(events, identity(i).decode()) for i in range(40)} | {
        (logs, identity(i, stream=2).decode()) for i in range(6)
    }
    for row in rows:  # each named row is the message its identity names
        if row.topic == events and row[IDENTITY_COLUMN]:
            assert row.value == b"event-%s" % row[IDENTITY_COLUMN].rsplit("/", 1)[1].encode()
    headerless = Counter(row.value for row in rows if row[IDENTITY_COLUMN] is None)
    assert headerless == {b"same": 7, b"other": 2}
    assert f"; 12 second copies dropped ({events} 11, {logs} 1)" in second_run


@pytest.mark.kafka
@pytest.mark.slow
def test_a_checkpoint_landed_before_deduplication_keeps_landing_every_copy(
    spark: SparkSession,
    kafka_broker: KafkaCluster,
    unique_topic: Callable[[str], str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    topic = unique_topic("dedup-legacy")
    kafka_broker.create_topic(topic, 1)
    produce(bootstrap, topic, [(0, b"a", identity(0)), (0, b"b", identity(1))])
    # The stateless query of before: its checkpoint has batches and no state.
    with monkeypatch.context() as old:
        old.setattr(land, "drops_second_copies", lambda _checkpoint, _files=None: False)
        land_once(bootstrap, (topic,), tmp_path, "python")
    produce(bootstrap, topic, [(0, b"b", identity(1))])

    output = land_once(bootstrap, (topic,), tmp_path, "python")

    assert "second copies are not dropped: the checkpoint" in output
    assert "second copies not dropped (the checkpoint predates it)" in output
    assert sorted(row.value for row in lake(spark, tmp_path)) == [b"a", b"b", b"b"]


PROVIDER = "spark.sql.streaming.stateStore.providerClass"
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
HEAP = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"


def provider_of(checkpoint: Path) -> str:
    """The state store provider the checkpoint's last batch ran with (its offset log)."""
    batches = [path for path in (checkpoint / "offsets").iterdir() if path.name.isdigit()]
    last = max(batches, key=lambda path: int(path.name))
    metadata = json.loads(last.read_text().splitlines()[1])
    return str(metadata["conf"][PROVIDER])


@pytest.mark.kafka
@pytest.mark.slow
def test_a_new_checkpoint_keeps_its_state_in_rocksdb_with_bounded_memory_an_old_one_its_own(
    spark: SparkSession,
    kafka_broker: KafkaCluster,
    unique_topic: Callable[[str], str],
    tmp_path: Path,
) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    topic = unique_topic("dedup-state")
    kafka_broker.create_topic(topic, 1)
    produce(bootstrap, topic, [(0, b"a", identity(0)), (0, b"b", identity(1))])
    old, new = tmp_path / "old", tmp_path / "new"
    # A checkpoint started before the state moved to RocksDB: on Spark's heap provider.
    land_once(bootstrap, (topic,), old, "native", conf={PROVIDER: HEAP})
    land_once(bootstrap, (topic,), new, "native")

    assert provider_of(new / "checkpoint") == ROCKSDB
    assert STATE_STORE_CONF[PROVIDER] == ROCKSDB
    rocksdb = "spark.sql.streaming.stateStore.rocksdb."
    assert spark.conf.get(rocksdb + "boundedMemoryUsage") == "true"
    assert spark.conf.get(rocksdb + "maxMemoryUsageMB") == str(STATE_MEMORY_MB)
    # Changelog checkpointing: each batch writes the keys it changed, not a snapshot.
    assert list((new / "checkpoint" / "state").rglob("*.changelog"))

    # Both resume on their own provider and keep dropping second copies.
    produce(bootstrap, topic, [(0, b"b", identity(1)), (0, b"c", identity(2))])
    for root in (old, new):
        assert "; 1 second copies dropped" in land_once(bootstrap, (topic,), root, "native")
        assert sorted(row.value for row in lake(spark, root)) == [b"a", b"b", b"c"]
    assert provider_of(old / "checkpoint") == HEAP
    assert provider_of(new / "checkpoint") == ROCKSDB


def failing_query(spark: SparkSession, checkpoint: Path) -> Any:
    """A real query that fails as Spark's Python worker timeout fails one."""

    def worker_timeout(_value: Any) -> str:
        raise RuntimeError(WORKER_TIMEOUT)

    failing = F.udf(worker_timeout, "string", useArrow=False)
    stream = spark.readStream.format("rate").load().select(failing("value"))
    return stream.writeStream.format("noop").option("checkpointLocation", str(checkpoint)).start()


@pytest.mark.kafka
@pytest.mark.slow
@pytest.mark.parametrize("when", ["at start", "mid-query"])
def test_the_job_restarts_its_query_when_a_python_worker_did_not_connect_back(
    when: str,
    spark: SparkSession,
    kafka_broker: KafkaCluster,
    unique_topic: Callable[[str], str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    topic = unique_topic("dedup-worker")
    kafka_broker.create_topic(topic, 2)
    produce(bootstrap, topic, [(i % 2, b"v%d" % i, identity(i)) for i in range(20)])
    real_start = land.start_landing
    calls: list[int] = []

    def start_failing_once(session: SparkSession, settings: LandSettings) -> Any:
        calls.append(1)
        if len(calls) > 1:
            return real_start(session, settings)
        if when == "at start":
            raise PySparkException(message=WORKER_TIMEOUT)
        return failing_query(session, tmp_path / "elsewhere")

    monkeypatch.setattr(land, "start_landing", start_failing_once)

    output = land_once(bootstrap, (topic,), tmp_path, "python")

    assert "did not connect back within Spark's fixed 10 s" in output
    assert "restarting it from its checkpoint (restart 1 of at most 3)" in output
    # The injected failure is restarted once. A loaded host may need more: a real Python
    # worker of the restarted query can itself take longer than Spark's fixed 10 s to
    # connect back (seen beside a CPU hog per core: 3 starts), which the job restarts the
    # same way. So: at least the one restart, each start after the first one the job said
    # was a restart (none unexplained), and never more than its limit. The records land
    # exactly once however many restarts it took.
    restarts = len(calls) - 1
    assert 1 <= restarts <= land._WORKER_RESTARTS
    for restart in range(1, restarts + 1):
        assert f"(restart {restart} of at most 3)" in output, output
    assert f"(restart {restarts + 1} of" not in output, output
    assert sorted(row.value for row in lake(spark, tmp_path)) == sorted(
        b"v%d" % i for i in range(20)
    )


@pytest.mark.slow
def test_other_failures_are_not_restarted(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []

    def start_failing(session: SparkSession, settings: LandSettings) -> Any:
        calls.append(1)
        raise PySparkException(message="Python worker exited unexpectedly (crashed)")

    monkeypatch.setattr(land, "start_landing", start_failing)
    # No Kafka here: the query is what fails, so the job's Kafka check is passed over.
    monkeypatch.setattr(land, "require_kafka", lambda *_args: None)
    out = io.StringIO()
    settings = LandSettings(
        bootstrap_servers="127.0.0.1:9",
        topics=("t",),
        lake=str(tmp_path / "lake"),
        checkpoint=str(tmp_path / "checkpoint"),
        available_now=True,
    )

    assert run_landing(settings, out) == 1
    assert calls == [1]
    assert "cannot start: Python worker exited unexpectedly" in out.getvalue()


def test_the_command_s_window_is_the_job_s_default() -> None:
    from pydory.cli import build_parser

    required = ["--bootstrap", "b:1", "--topics", "t", "--lake", "l", "--checkpoint", "c"]
    args = build_parser().parse_args(["pipeline", "land", *required])
    assert (
        args.dedup_window
        == DEFAULT_WINDOW_S
        == LandSettings("b:1", ("t",), "l", "c").dedup_window_s
    )
    window = build_parser().parse_args(["pipeline", "land", *required, "--dedup-window", "90"])
    assert window.dedup_window == 90


@pytest.mark.parametrize(
    ("given", "fraction"), [({}, "0.3"), ({"spark.memory.fraction": "0.5"}, "0.5")]
)
def test_the_session_the_job_starts_spills_its_shuffle_at_a_third_of_the_heap_unless_told(
    given: dict[str, str], fraction: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[dict[str, str]] = []

    def start(master: str, app_name: str, conf: dict[str, str]) -> SparkSession:
        started.append(conf)
        raise PySparkException(message="no JVM in this test")

    monkeypatch.setattr(land, "spark_session", start)
    settings = LandSettings(
        "127.0.0.1:9", ("t",), str(tmp_path / "lake"), str(tmp_path / "ckpt"), spark_conf=given
    )

    assert run_landing(settings, io.StringIO()) == 1
    assert started == [{**SESSION_CONF, **land.SINK_CONF, **given}]
    assert started[0]["spark.sql.streaming.fileSink.log.cleanupDelay"] == "10m"
    assert started[0]["spark.memory.fraction"] == fraction
