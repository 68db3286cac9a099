"""The demo: messages from client processes through the daemon and Kafka into a lake, audited.

What a user would run, in order, each stage timed on one line:

1. a Kafka and the demo topics: Apache Kafka itself (KRaft, from the jars ``./dev``
   fetched, by default), librdkafka's mock cluster, Tansu, or the user's cluster;
2. the daemon, as its own process (``pydory serve``) on a generated Dory config;
3. client processes sending over all three transports at once: AnyPartition and
   PartitionKey messages, a flood on a rate-limited topic, oversized messages, messages
   for a topic Kafka does not have, and bytes that are not Dory messages at all;
4. waiting until the daemon has settled every message it received;
5. saving the daemon's books (``/books/json``) and stopping the daemon;
6. the landing job (Spark, Trigger.AvailableNow): Kafka into a Parquet lake;
7. the audit: the lake against the saved books.

It prints the audit's reconciliation table and where everything is, and returns 0 only
if the audit balances. Everything is written under the work directory, which is kept.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import socket
import struct
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from confluent_kafka import KafkaException

from pydory.client import encode_message
from pydory.errors import PydoryError
from pydory.pipeline.audits.reconcile import AuditReport
from pydory.status_client import StatusHttp
from pydory.wording import counted
from pydory_tools.testing.daemon import DaemonConfig
from pydory_tools.testing.daemon_process import DaemonDidNotStart, DaemonProcess
from pydory_tools.testing.kafka_broker import KafkaBrokerError, KafkaCluster
from pydory_tools.testing.kafka_util import admin_create_topic
from pydory_tools.testing.mock_cluster import MockCluster
from pydory_tools.testing.tansu import TansuBroker

if TYPE_CHECKING:
    from pyspark.sql.streaming.query import StreamingQuery

STAGES = 7
#: Every wait in the demo is bounded; the whole demo takes well under this.
SETTLE_TIMEOUT_S = 60.0
DAEMON_START_TIMEOUT_S = 30.0
CLIENT_TIMEOUT_S = 60.0
HTTP_TIMEOUT_S = 10.0
LAND_TIMEOUT_S = 300
SHUTDOWN_MAX_DELAY_MS = 10_000

#: Admission limits the demo's misbehaving clients run into.
MESSAGE_MAX_BYTES = 100_000
OVERSIZED_VALUE_BYTES = 150_000  # above messageMaxBytes, below maxStreamMsgSize: too_long
RATE_LIMIT_INTERVAL_MS = 60_000  # longer than the demo sends for: exactly max_count pass
RATE_LIMIT_MAX_COUNT = 200


@dataclass(frozen=True)
class DemoTopics:
    """The demo's topic names: fixed on a fresh embedded Kafka, unique on the user's."""

    events: str
    keyed: str
    limited: str
    missing: str  # never created: the daemon discards its messages as bad_topic

    @classmethod
    def named(cls, prefix: str) -> DemoTopics:
        return cls(f"{prefix}events", f"{prefix}keyed", f"{prefix}limited", f"{prefix}nowhere")

    @property
    def partitions(self) -> dict[str, int]:
        """The topics to create, with their partition counts."""
        return {self.events: 4, self.keyed: 4, self.limited: 2}

    @property
    def books(self) -> str:
        """The books topic of ``--sigkill``: the daemon's runs' books, beside its data."""
        return self.events.removesuffix("events") + "books"

    def listed(self) -> str:
        """The topics to create, for a person: ``events:4, keyed:4, limited:2``."""
        return ", ".join(f"{name}:{n}" for name, n in self.partitions.items())


@dataclass(frozen=True)
class ClientRun:
    """One client process: what it sends, and how many messages the daemon will receive."""

    label: str
    send_options: tuple[str, ...]  # `pydory send` options; empty for the raw client
    messages: int
    stdin: bytes | None = None


@dataclass
class DemoPaths:
    """Where the demo writes, all under one work directory."""

    workdir: Path
    config: Path = field(init=False)
    daemon_log: Path = field(init=False)
    books: Path = field(init=False)
    lake: Path = field(init=False)
    checkpoint: Path = field(init=False)
    spark_log: Path = field(init=False)
    report_text: Path = field(init=False)
    report_json: Path = field(init=False)
    spool: Path = field(init=False)

    def __post_init__(self) -> None:
        self.config = self.workdir / "pydory.xml"
        self.daemon_log = self.workdir / "daemon.log"
        self.books = self.workdir / "books.json"
        self.lake = self.workdir / "lake"
        self.checkpoint = self.workdir / "checkpoint"
        self.spark_log = self.workdir / "spark.log"
        self.report_text = self.workdir / "audit.txt"
        self.report_json = self.workdir / "audit.json"
        self.spool = self.workdir / "spool"


class DemoFailed(PydoryError):
    """A demo stage could not complete; the message says which and where to look."""


# --- progress -------------------------------------------------------------------------------


class Progress:
    """Prints one line per stage: its number and name when it starts, result and time when done."""

    def __init__(self, stages: int = STAGES) -> None:
        self._stages = stages
        self._number = 0
        self.started = time.monotonic()

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[list[str]]:
        """Yield a list to put the stage's one-line result in."""
        self._number += 1
        print(f"[{self._number}/{self._stages}] {name:<8}", end=" ", flush=True)
        result: list[str] = []
        began = time.monotonic()
        try:
            yield result
        except BaseException:
            print("FAILED", flush=True)
            raise
        print(f"{' '.join(result)}  ({time.monotonic() - began:.1f} s)", flush=True)

    def elapsed(self) -> float:
        return time.monotonic() - self.started


# --- 1. kafka ---------------------------------------------------------------------------------


@contextlib.contextmanager
def embedded_kafka(
    kind: str, brokers: int | None, workdir: Path
) -> Iterator[tuple[str, str, DemoTopics]]:
    """Start the chosen Kafka; yield (bootstrap, description, topics) with the topics created."""
    if kind == "kafka":
        with _apache_kafka(brokers or 1, workdir / "kafka") as found:
            yield found
    elif kind == "mock":
        topics = DemoTopics.named("demo.")
        brokers = brokers or 3
        with MockCluster(brokers) as cluster:
            for name, partitions in topics.partitions.items():
                cluster.create_topic(name, partitions)
            described = f"librdkafka mock cluster, {counted(brokers, 'broker')}"
            yield cluster.bootstrap_servers, described, topics
    elif kind == "tansu":
        topics = DemoTopics.named("demo.")
        with TansuBroker() as tansu:
            for name, partitions in topics.partitions.items():
                tansu.create_topic(name, partitions)
            yield tansu.bootstrap_servers, f"Tansu broker (pid {tansu.pid})", topics
    else:
        # The user's cluster may hold earlier demo runs: this run gets its own topics.
        topics = DemoTopics.named(f"pydory-demo-{uuid.uuid4().hex[:8]}.")
        for name, partitions in topics.partitions.items():
            try:
                admin_create_topic(kind, name, partitions)
            except (KafkaException, TimeoutError) as error:
                raise DemoFailed(
                    f"cannot create topic {name} on {kind}: {error or 'no answer in time'} "
                    "(the demo needs the Admin API's CreateTopics)"
                ) from None
        yield kind, "your cluster", topics


@contextlib.contextmanager
def _apache_kafka(brokers: int, base_dir: Path) -> Iterator[tuple[str, str, DemoTopics]]:
    """Apache Kafka on loopback, its directories (and broker logs) kept in the work directory."""
    topics = DemoTopics.named("demo.")
    try:
        cluster = KafkaCluster(brokers, base_dir=base_dir)
    except KafkaBrokerError as error:
        raise DemoFailed(f"cannot start Apache Kafka: {error}") from None
    with cluster:
        for name, partitions in topics.partitions.items():
            cluster.create_topic(name, partitions, replication_factor=min(brokers, 3))
        pids = ", ".join(str(cluster.pid(node)) for node in cluster.broker_ids)
        described = (
            f"Apache Kafka {cluster.version} (KRaft), {counted(brokers, 'broker')} (pid {pids})"
        )
        yield cluster.bootstrap_servers, described, topics


# --- 2. the daemon ----------------------------------------------------------------------------


def start_daemon(config: DaemonConfig, paths: DemoPaths) -> DaemonProcess:
    """``pydory serve`` (the one :class:`DaemonProcess`) on the demo's config, its log lines
    in the work directory as they come; returned once it is ready."""
    daemon = DaemonProcess(
        config, paths.config, paths.daemon_log, wait_ready=False, arguments=["--log-stderr"]
    )
    try:
        daemon.wait_ready(DAEMON_START_TIMEOUT_S)
    except DaemonDidNotStart as error:
        why = str(error).partition(":")[0]  # the log follows: the user is pointed to it
        raise DemoFailed(f"{why}; see {paths.daemon_log}") from None
    return daemon


def stop_daemon(daemon: DaemonProcess) -> int:
    """SIGTERM (the daemon's graceful shutdown); its exit status (killed if it outlasts its
    shutdown delay). Stopping twice is fine."""
    try:
        return daemon.stop(SHUTDOWN_MAX_DELAY_MS / 1000 + 10)
    except subprocess.TimeoutExpired:
        return daemon.process.wait()


# --- 3. the clients ---------------------------------------------------------------------------


def client_plan(config: DaemonConfig, topics: DemoTopics, count: int) -> list[ClientRun]:
    """The client processes, all started at once."""
    datagram = ("--socket-path", config.datagram_path)
    stream = ("--stream-socket-path", config.stream_path)
    tcp = ("--port", str(config.tcp_port))
    misbehaving = 10
    return [
        ClientRun("datagram, AnyPartition", (*datagram, "--topic", topics.events), count),
        ClientRun("stream, AnyPartition", (*stream, "--topic", topics.events), count),
        ClientRun("tcp, AnyPartition", (*tcp, "--topic", topics.events), count),
        ClientRun(
            "tcp, PartitionKey 7", (*tcp, "--topic", topics.keyed, "--partition-key", "7"), count
        ),
        ClientRun(
            "stream, PartitionKey 2",
            (*stream, "--topic", topics.keyed, "--partition-key", "2"),
            count,
        ),
        ClientRun("datagram, rate-limited", (*datagram, "--topic", topics.limited), count),
        ClientRun(
            "stream, oversized",
            (*stream, "--topic", topics.events, "--stdin"),
            3,
            stdin=b"x" * OVERSIZED_VALUE_BYTES,
        ),
        ClientRun("datagram, unknown topic", (*datagram, "--topic", topics.missing), misbehaving),
        ClientRun("datagram, not Dory messages", (), 3 * misbehaving),
    ]


def run_clients(runs: Sequence[ClientRun], datagram_path: str, topic: str) -> None:
    """Start every client process, then wait for all; raise if any failed or hung."""
    senders: list[tuple[ClientRun, subprocess.Popen[bytes]]] = []
    misbehaving: list[tuple[ClientRun, multiprocessing.process.BaseProcess]] = []
    try:
        for run in runs:
            if run.send_options:
                sender = subprocess.Popen(_send_command(run), stdin=subprocess.PIPE)
                senders.append((run, sender))
            else:
                raw = multiprocessing.get_context("spawn").Process(
                    target=send_not_dory_messages, args=(datagram_path, topic, run.messages // 3)
                )
                raw.start()
                misbehaving.append((run, raw))
        for run, sender in senders:
            sender.communicate(run.stdin, timeout=CLIENT_TIMEOUT_S)
            _check_client(run, sender.returncode)
        for run, process in misbehaving:
            process.join(CLIENT_TIMEOUT_S)
            _check_client(run, process.exitcode)
    except subprocess.TimeoutExpired as timeout:
        command = " ".join(timeout.cmd)
        raise DemoFailed(f"a client did not finish in {CLIENT_TIMEOUT_S:g} s: {command}") from None
    finally:  # after a failure, no client outlives the demo
        for _, sender in senders:
            if sender.poll() is None:
                sender.kill()
                sender.wait()
        for _, process in misbehaving:
            if process.is_alive():
                process.kill()
                process.join()


def _send_command(run: ClientRun) -> list[str]:
    command = [sys.executable, "-m", "pydory", "send", *run.send_options]
    command += ["--count", str(run.messages)]
    if run.stdin is None:
        command += ["--value", f"hello from {run.label}"]
    return command


def _check_client(run: ClientRun, status: int | None) -> None:
    if status is None:
        raise DemoFailed(f"client {run.label!r} did not finish in {CLIENT_TIMEOUT_S:g} s")
    if status != 0:
        raise DemoFailed(f"client {run.label!r} exited with status {status}")


def send_not_dory_messages(datagram_path: str, topic: str, each: int) -> None:
    """A misbehaving client: ``each`` datagrams each of a malformed message, an unknown
    ApiKey and an unknown ApiVersion. The daemon counts and discards them."""
    good = encode_message(topic, b"almost a message")
    truncated = good[:-5]
    unknown_api_key = good[:4] + struct.pack(">h", 300) + good[6:]
    unknown_version = good[:6] + struct.pack(">h", 9) + good[8:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as client:
        for message in (truncated, unknown_api_key, unknown_version):
            for _ in range(each):
                client.sendto(message, datagram_path)


# --- 4 and 5. settle, save the books ----------------------------------------------------------


def get_json(status_url: str, path: str, timeout_s: float = HTTP_TIMEOUT_S, **query: str) -> Any:
    """The JSON page at ``path`` of the daemon's status server ``status_url``."""
    return StatusHttp(status_url, timeout_s).get_json(path, query)


def wait_settled(status_url: str, expected_received: int) -> str:
    """Wait until the daemon has settled every message the clients sent; say what it holds.

    Called after every client has exited, so every message is in a daemon socket by now.
    The commit point's long poll (``/commit_point/json?after=now``) answers once every
    message received before the request is acknowledged by Kafka or discarded.
    """
    answer = get_json(
        status_url,
        "/commit_point/json",
        timeout_s=SETTLE_TIMEOUT_S + HTTP_TIMEOUT_S,
        after="now",
        timeout=f"{SETTLE_TIMEOUT_S:g}",
    )
    if not answer["passed"]:
        raise DemoFailed(
            f"the daemon had not settled every message after {SETTLE_TIMEOUT_S:g} s "
            f"({answer['open_messages']} still open)"
        )
    books = get_json(status_url, "/books/json")
    received = sum(books["received"].values())
    in_flight = sum(topic["in_flight"] for topic in books["topics"])
    if received != expected_received or in_flight:
        raise DemoFailed(
            f"after the commit point passed, the daemon had received {received} of "
            f"{expected_received} messages, {in_flight} in flight"
        )
    # A settled message may also be possibly delivered (Kafka may hold it or not): the
    # audit allows for it, and this line names it rather than calling it delivered.
    possibly = sum(topic["possibly_delivered"] for topic in books["topics"])
    outcomes = "delivered or discarded"
    if possibly:
        outcomes = f"delivered, discarded or possibly delivered ({possibly})"
    return f"{received} received, each {outcomes} (the commit point passed)"


# --- 6 and 7. land and audit ------------------------------------------------------------------


@contextlib.contextmanager
def stderr_to(path: Path) -> Iterator[None]:
    """Send this process's stderr (fd 2) to ``path``: the Spark JVM inherits it when it starts,
    so its log lines land in the file instead of breaking the progress lines."""
    sys.stderr.flush()
    saved = os.dup(2)
    with path.open("ab") as log:
        os.dup2(log.fileno(), 2)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def land(bootstrap: str, topics: DemoTopics, paths: DemoPaths, master: str, kafka: str) -> str:
    """Run the landing job with Trigger.AvailableNow to its end; describe what landed."""
    query = landed_query(bootstrap, topics, paths, master, kafka)
    batches = [p for p in query.recentProgress if p.numInputRows]
    records = sum(p.numInputRows for p in batches)
    return (
        f"Spark AvailableNow query: {counted(records, 'record')} in "
        f"{counted(len(batches), 'batch')}"
    )


def landing_connector(kafka: str) -> Literal["native", "python"]:
    """The Kafka connector the demo's Spark jobs read with.

    Spark's own (the default) needs a Kafka its Java admin client can talk to, and its
    jars (an installed pydory has none unless the user points PYDORY_SPARK_KAFKA_JARS at
    them); librdkafka's mock cluster and Tansu are read with pydory's, and so is any
    Kafka when those jars are missing.
    """
    from pydory.pipeline.spark import find_spark_kafka_jars

    return "native" if kafka not in ("mock", "tansu") and find_spark_kafka_jars() else "python"


def landed_query(
    bootstrap: str, topics: DemoTopics, paths: DemoPaths, master: str, kafka: str
) -> StreamingQuery:
    """The landing query (Trigger.AvailableNow, second copies dropped), run to its end."""
    from pydory.pipeline.landing.land import LandSettings, start_landing
    from pydory.pipeline.spark import spark_session

    settings = LandSettings(
        connector=landing_connector(kafka),
        bootstrap_servers=bootstrap,
        topics=tuple(topics.partitions),
        lake=str(paths.lake),
        checkpoint=str(paths.checkpoint),
        available_now=True,
        master=master,
    )
    spark = spark_session(master=master, app_name="pydory-demo")
    query = start_landing(spark, settings)
    if not query.awaitTermination(LAND_TIMEOUT_S):
        query.stop()
        raise DemoFailed(f"the landing job did not finish in {LAND_TIMEOUT_S} s")
    error = query.exception()
    if error is not None:
        raise DemoFailed(f"the landing job failed: {error}; see {paths.spark_log}")
    return query


def audit(topics: DemoTopics, paths: DemoPaths, master: str) -> AuditReport:
    """Reconcile the lake with the saved books; write the report in text and JSON."""
    from pydory.pipeline.audits.audit import audit as audit_lake
    from pydory.pipeline.audits.audit import load_books
    from pydory.pipeline.spark import spark_session

    spark = spark_session(master=master, app_name="pydory-demo")
    report = audit_lake(
        spark,
        paths.lake,
        load_books(books_file=str(paths.books)),
        from_offset_zero=True,  # the demo's topics were created empty for this run
        books_source=str(paths.books),
    )
    paths.report_text.write_text(report.render(), encoding="utf-8")
    paths.report_json.write_text(report.to_json(), encoding="utf-8")
    return report


# --- the whole demo ---------------------------------------------------------------------------


def demo_daemon_config(bootstrap: str, paths: DemoPaths, **knobs: Any) -> DaemonConfig:
    """The demo daemon's config: its sockets in the work directory, every message it reads
    written ahead to ``paths.spool`` until settled, the demo's shutdown delay, and
    ``knobs``: what one demo sets besides."""
    return DaemonConfig(
        bootstrap,
        str(paths.workdir),
        shutdown_max_delay_ms=SHUTDOWN_MAX_DELAY_MS,
        spool_path=str(paths.spool),
        **knobs,
    )


def require_clean_exit(status: int, paths: DemoPaths) -> None:
    """The daemon's exit status once the demo stopped it: anything but 0 fails the demo
    (the daemon's log says why)."""
    if status != 0:
        raise DemoFailed(f"the daemon exited with status {status}; see {paths.daemon_log}")


def verdict(progress: Progress, balanced: bool, success: str, failure: str) -> int:
    """Print the demo's last line, its verdict (``success`` or ``failure``: what the
    audit found) and how long it took; the exit status (0: the audit balanced)."""
    outcome = f"OK, {success}" if balanced else f"FAILED, {failure}"
    print(f"demo: {outcome} ({progress.elapsed():.0f} s)", flush=True)
    return 0 if balanced else 1


def prepare_workdir(workdir: str | None) -> DemoPaths:
    if workdir is None:
        return DemoPaths(Path(tempfile.mkdtemp(prefix="pydory-demo-")))
    path = Path(workdir).resolve()
    if path.exists() and any(path.iterdir()):
        raise DemoFailed(f"--workdir {path} is not empty: give a new or empty directory")
    path.mkdir(parents=True, exist_ok=True)
    return DemoPaths(path)


def run_demo(
    kafka: str = "kafka",
    brokers: int | None = None,
    count: int = 2000,
    workdir: str | None = None,
    master: str = "local[2]",
) -> int:
    """Run the demo; returns 0 when the audit balances."""
    progress = Progress()
    try:
        paths = prepare_workdir(workdir)
        print(f"pydory demo: work directory {paths.workdir} (kept)", flush=True)
        report = _run_stages(progress, paths, kafka, brokers, count, master)
    except DemoFailed as error:
        print(f"demo: FAILED: {error}", flush=True)
        return 1
    print()
    print(report.render(), end="")
    print()
    print(f"lake:    {paths.lake}  (Parquet, partitioned by topic and date)")
    print(f"reports: {paths.report_text}, {paths.report_json}")
    print(f"daemon:  {paths.books} (its books), {paths.daemon_log}, {paths.config}")
    print(f"spark:   {paths.spark_log}")
    print(f"spool:   {paths.spool} (the daemon's write-ahead; empty once all settled)")
    if (paths.workdir / "kafka").is_dir():
        print(f"kafka:   {paths.workdir / 'kafka'} (the broker's data and broker.log)")
    return verdict(
        progress,
        report.balanced,
        "the lake holds exactly what the daemon delivered",
        "the audit does not balance",
    )


def _run_stages(
    progress: Progress, paths: DemoPaths, kafka: str, brokers: int | None, count: int, master: str
) -> AuditReport:
    # Everything started is stopped on the way out, in reverse order, even on failure.
    with contextlib.ExitStack() as running:
        with progress.stage("kafka") as result:
            bootstrap, described, topics = running.enter_context(
                embedded_kafka(kafka, brokers, paths.workdir)
            )
            result.append(f"{described} at {bootstrap}; topics {topics.listed()}")
        with progress.stage("daemon") as result:
            config = demo_daemon_config(
                bootstrap,
                paths,
                message_max_bytes=MESSAGE_MAX_BYTES,
                rate_limits={topics.limited: (RATE_LIMIT_INTERVAL_MS, RATE_LIMIT_MAX_COUNT)},
                spool_fsync="1000",
            )
            daemon = start_daemon(config, paths)
            running.callback(stop_daemon, daemon)
            status_url = f"http://127.0.0.1:{config.http_port}"
            result.append(f"pydory serve (pid {daemon.process.pid}), status {status_url}")
        runs = client_plan(config, topics, count)
        with progress.stage("clients") as result:
            run_clients(runs, config.datagram_path, topics.events)
            result.append(
                f"{counted(len(runs), 'process')} sent "
                f"{counted(sum(r.messages for r in runs), 'message')} "
                "over unix datagram, unix stream and tcp"
            )
        with progress.stage("settle") as result:
            result.append(wait_settled(status_url, sum(r.messages for r in runs)))
        with progress.stage("books") as result:
            books = get_json(status_url, "/books/json")
            paths.books.write_text(json.dumps(books, indent=2) + "\n", encoding="utf-8")
            require_clean_exit(stop_daemon(daemon), paths)
            result.append(f"saved to {paths.books.name}; daemon stopped (exit 0)")
        with stderr_to(paths.spark_log):
            with progress.stage("land") as result:
                result.append(land(bootstrap, topics, paths, master, kafka))
            with progress.stage("audit") as result:
                report = audit(topics, paths, master)
                landed = sum(topic.landed for topic in report.topics)
                verdict = "balanced" if report.balanced else "DOES NOT BALANCE"
                read = counted(landed, "row")
                result.append(f"{read} read through the lake's commit log: {verdict}")
    return report
