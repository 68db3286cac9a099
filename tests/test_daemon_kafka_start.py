"""A daemon started while Kafka is unreachable: it serves at once and loses nothing.

Dory opens its sockets and its status port at once and buffers what clients send until
its first metadata comes. Here ``pydory serve`` (a process of its own) starts while the
only broker of an Apache Kafka cluster (the project's launcher) is stopped: its three
inputs must take messages, its status port must answer and say there is no metadata
yet, and once the broker is back every message must be in Kafka exactly once (read back
by value), with the books balanced. Before this, the daemon opened nothing until a
broker answered: clients met ENOENT / ECONNREFUSED, and the status port refused
connections (Dory's Nagios checks: "Failed to open URL").

The cluster is the module's own, not the session's: the tests stop its only broker.
"""

from __future__ import annotations

import subprocess
import sys
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import producer_backends
from daemon_process import DaemonProcess
from helpers import assert_balanced, wait_until
from pydory.client import DatagramSender, TcpSender, UnixStreamSender
from pydory_tools.testing.daemon import DaemonConfig
from pydory_tools.testing.kafka_broker import KafkaCluster
from pydory_tools.testing.kafka_util import consume_all

pytestmark = [pytest.mark.kafka, pytest.mark.slow, pytest.mark.timeout(300)]
# A fault test on Apache Kafka: on both producer backends (issue 30, point 1).
producer_backend = producer_backends.module_fixture()

PARTITIONS = 3
PER_TRANSPORT = 150
TRANSPORTS = ("unix_dgram", "unix_stream", "tcp")
#: How long the status port may take to answer: the daemon opens it at start-up, with
#: no broker to wait for (before, it never answered while the broker was down).
OPENS_WITHIN_S = 30.0
#: After the broker is back: its start, the daemon's next metadata attempt (the test
#: config's pause doubles from 0.5 s up to 8 s) and librdkafka's reconnect backoff.
DELIVERED_WITHIN_S = 120.0
NODE = 1


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    with KafkaCluster(1, base_dir=tmp_path_factory.mktemp("kafka-down")) as kafka:
        yield kafka


@pytest.fixture
def socket_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    # UNIX socket paths are limited to ~108 bytes: keep them short.
    return str(tmp_path_factory.mktemp("s", numbered=True))


@pytest.fixture
def broker_down(cluster: KafkaCluster) -> Iterator[Callable[[], None]]:
    """``broker_down()`` stops the cluster's only broker; it runs again after the test."""
    yield lambda: cluster.stop_broker(NODE)
    cluster.start_broker(NODE)


def daemon_config(cluster: KafkaCluster, socket_dir: str, spool: Path | None) -> DaemonConfig:
    """Made while the broker runs: the daemon's TCP and status ports are then not the
    broker's (free once it stops), where librdkafka would find the daemon itself."""
    return DaemonConfig(
        cluster.bootstrap_servers,
        socket_dir,
        spool_path=None if spool is None else str(spool),
        log_to_stdout=True,  # into the DaemonProcess's log file
    )


def send_on_every_transport(config: DaemonConfig, topic: str) -> list[bytes]:
    """PER_TRANSPORT messages on each input; their values, all distinct."""
    values: list[bytes] = []
    senders = {
        "unix_dgram": DatagramSender(config.datagram_path),
        "unix_stream": UnixStreamSender(config.stream_path),
        "tcp": TcpSender(config.tcp_port or 0),
    }
    for transport, sender in senders.items():
        with sender:
            for i in range(PER_TRANSPORT):
                value = b"%s-%04d" % (transport.encode(), i)
                sender.send(topic, value, key=b"k%d" % i if i % 2 else b"")
                values.append(value)
    return values


def metric(daemon: DaemonProcess, name: str) -> float:
    with urllib.request.urlopen(f"{daemon.url}/metrics", timeout=60) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(f"{name} "):
                return float(line.split()[1])
    raise AssertionError(f"no {name} in /metrics")


def plain_page(daemon: DaemonProcess, name: str) -> str:
    with urllib.request.urlopen(f"{daemon.url}/{name}", timeout=60) as response:
        return str(response.read().decode())


def by_topic(books: dict[str, Any]) -> dict[str, Any]:
    """/books/json's per-topic list in the form tests/helpers.py's checks read."""
    return {"topics": {t["topic"]: t for t in books["topics"]}}


def start_without_kafka(config: DaemonConfig, base: Path) -> DaemonProcess:
    """``pydory serve`` with the broker down; returns once its status port answers."""
    base.mkdir(exist_ok=True)
    daemon = DaemonProcess(config, base / "pydory.xml", base / "pydory.log", wait_ready=False)
    daemon.wait_ready(OPENS_WITHIN_S, metadata=False)
    return daemon


def says_no_metadata_yet(daemon: DaemonProcess, waiting: int) -> None:
    """Every place the status interface shows metadata says there is none yet."""
    books = daemon.books()
    assert books["metadata_known"] is False
    assert books["waiting_for_metadata"] == waiting
    assert daemon.page("metadata_fetch_time/json")["last_updated"] == 0  # Dory's "never"
    assert "0 (no metadata yet)" in plain_page(daemon, "metadata_fetch_time/plain")
    # Dory's "new" queue. A page is reused for PAGE_REUSE_S: this one may still be the
    # rendering of a moment ago.
    wait_until(lambda: daemon.page("queues/json")["new"] == waiting, what="/queues new")
    assert daemon.page("dashboard/json")["metadata"]["known"] is False
    assert metric(daemon, "pydory_metadata_known") == 0
    status = subprocess.run(
        [sys.executable, "-m", "pydory", "status", "--url", daemon.url],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert "no metadata yet" in status.stdout, status.stdout


def created_and_destroyed(daemon: DaemonProcess) -> tuple[int, int]:
    """Dory's MsgCreate and MsgDestroy (its Nagios check: their difference is outstanding)."""
    counters = daemon.counters()
    return counters["MsgCreate"], counters["MsgDestroy"]


def every_value_once(cluster: KafkaCluster, topic: str, values: list[bytes]) -> None:
    records = consume_all(cluster.bootstrap_servers, topic, len(values), timeout_s=60)
    copies = Counter(r.value for r in records)
    assert set(copies) == set(values), "missing or unknown values"
    assert {v: n for v, n in copies.items() if n > 1} == {}, "duplicates"


@pytest.mark.parametrize("spool", [False, True], ids=["memory", "spool"])
def test_a_daemon_started_before_kafka_takes_every_message_and_delivers_it_once(
    cluster: KafkaCluster,
    broker_down: Callable[[], None],
    unique_topic: Callable[[str], str],
    socket_dir: str,
    tmp_path: Path,
    spool: bool,
) -> None:
    topic, missing = unique_topic("before-kafka"), unique_topic("never-created")
    cluster.create_topic(topic, PARTITIONS)
    config = daemon_config(cluster, socket_dir, tmp_path / "spool" if spool else None)
    broker_down()
    daemon = start_without_kafka(config, tmp_path)
    try:
        says_no_metadata_yet(daemon, waiting=0)
        values = send_on_every_transport(config, topic)
        with UnixStreamSender(config.stream_path) as stream:
            stream.send(missing, b"to a topic the cluster does not have")
        total = len(values) + 1

        def all_read_and_held() -> bool:
            books = daemon.books()
            return sum(books["received"].values()) == total and (
                books["waiting_for_metadata"] == total
            )

        wait_until(all_read_and_held, what="every message read and held")
        says_no_metadata_yet(daemon, waiting=total)
        # Dory counts a message in MsgCreate from its receipt, held ones included (issue 33).
        wait_until(lambda: created_and_destroyed(daemon) == (total, 0), what="MsgCreate")
        assert daemon.books()["topics"] == []  # held: neither accepted nor discarded
        assert daemon.page("commit_point/json")["open_messages"] == total

        cluster.start_broker(NODE)

        def delivered() -> bool:
            books = daemon.books()
            topics = by_topic(books)["topics"]
            return (
                books["metadata_known"]
                and books["waiting_for_metadata"] == 0
                and topics.get(topic, {}).get("delivered") == len(values)
            )

        wait_until(delivered, DELIVERED_WITHIN_S, what="every held message's delivery")
        books = daemon.books()
        assert metric(daemon, "pydory_metadata_known") == 1
        totals = by_topic(books)["topics"][topic]
        assert totals["accepted"] == totals["delivered"] == len(values)
        assert totals["in_flight"] == 0
        assert totals["discarded"] == {}
        assert_balanced(by_topic(books))
        assert books["received"] == {"unix_dgram": 150, "unix_stream": 151, "tcp": 150}
        # The topic Kafka does not have: found out once metadata came, as ever.
        wait_until(lambda: daemon.counters().get("discarded_bad_topic") == 1)
        # Never down: the one found a bad topic stays created, and is destroyed.
        wait_until(lambda: created_and_destroyed(daemon) == (total, total), what="MsgDestroy")
        assert missing not in by_topic(daemon.books())["topics"]
        assert books["pool"]["used"] == 0
        assert daemon.stop() == 0
    finally:
        daemon.kill()
    every_value_once(cluster, topic, values)


def test_a_stop_before_kafka_answered_keeps_the_spool_for_the_next_start(
    cluster: KafkaCluster,
    broker_down: Callable[[], None],
    unique_topic: Callable[[str], str],
    socket_dir: str,
    tmp_path: Path,
) -> None:
    """What waited for metadata meets the end of any undelivered message at shutdown:
    with the spool on, it stays there for the next start, which delivers it."""
    topic = unique_topic("stopped-early")
    cluster.create_topic(topic, PARTITIONS)
    config = daemon_config(cluster, socket_dir, tmp_path / "spool")
    broker_down()
    first = start_without_kafka(config, tmp_path / "first")
    try:
        values = send_on_every_transport(config, topic)
        wait_until(
            lambda: first.books()["waiting_for_metadata"] == len(values),
            what="every message read and held",
        )
        assert first.stop() == 0  # SIGTERM: a graceful stop, the broker still down
    finally:
        first.kill()
    log = (tmp_path / "first" / "pydory.log").read_text()
    assert f"left for next start {len(values)}" in log, log[-3000:]
    cluster.start_broker(NODE)
    second = DaemonProcess(config, tmp_path / "pydory.xml", tmp_path / "second.log")
    try:

        def delivered() -> bool:
            topics = by_topic(second.books())["topics"]
            return topics.get(topic, {}).get("delivered") == len(values)

        wait_until(delivered, DELIVERED_WITHIN_S, what="the replayed messages' delivery")
        books = by_topic(second.books())
        assert books["topics"][topic]["in_flight"] == 0
        assert_balanced(books)
        assert second.counters().get("spool_replayed") == len(values)
        assert second.stop() == 0
    finally:
        second.kill()
    every_value_once(cluster, topic, values)
