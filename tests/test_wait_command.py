"""`pydory wait` against a real daemon on the mock cluster: when it says the commit point
passed, the messages sent before it are in Kafka; while they are stuck, it says no."""

from __future__ import annotations

import json
import threading
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from helpers import assert_balanced, wait_until
from pydory.cli import main
from pydory.client import DatagramSender, TcpSender, UnixStreamSender
from pydory.wire import encode_partition_key
from pydory_tools.testing.daemon import DaemonConfig, RunningDaemon, running_daemon
from pydory_tools.testing.kafka_util import consume_all
from pydory_tools.testing.mock_cluster import MockCluster
from pydory_tools.testing.ports import free_loopback_port

_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@pytest.fixture
def socket_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    # UNIX socket paths are limited to ~108 bytes: keep them short.
    return str(tmp_path_factory.mktemp("s", numbered=True))


def status_url(daemon: RunningDaemon) -> str:
    return f"http://127.0.0.1:{daemon.daemon_config.http_port}"


def pydory_wait(daemon: RunningDaemon, *args: str) -> int:
    return main(["wait", "--url", status_url(daemon), *args])


def commit_point_page(daemon: RunningDaemon) -> dict[str, Any]:
    with _opener.open(f"{status_url(daemon)}/commit_point/json", timeout=60) as response:
        page: dict[str, Any] = json.load(response)
    return page


def test_when_wait_returns_every_message_sent_on_each_transport_is_in_kafka(
    mock_cluster: MockCluster,
    unique_topic: Callable[[str], str],
    socket_dir: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    topic = unique_topic("wait")
    mock_cluster.create_topic(topic, 4)
    config = DaemonConfig(mock_cluster.bootstrap_servers, socket_dir)
    sent = [b"%s-%d" % (transport, i) for transport in (b"d", b"s", b"t") for i in range(100)]
    with running_daemon(config) as daemon:
        with DatagramSender(config.datagram_path) as dgram:
            for value in sent[:100]:
                dgram.send(topic, value)
        with UnixStreamSender(config.stream_path) as stream:
            for value in sent[100:200]:
                stream.send(topic, value)
        with TcpSender(daemon.tcp_port) as tcp:
            for value in sent[200:]:
                tcp.send(topic, value)
        assert pydory_wait(daemon, "--timeout", "30") == 0
        snapshot = daemon.snapshot()  # at once: no waiting for the books to catch up
    assert snapshot["topics"][topic]["delivered"] == len(sent)
    assert snapshot["topics"][topic]["in_flight"] == 0
    records = consume_all(mock_cluster.bootstrap_servers, topic, len(sent))
    assert sorted(r.value for r in records) == sorted(sent)
    assert "is past" in capsys.readouterr().out


@pytest.mark.slow
def test_wait_fails_while_the_brokers_are_down_and_passes_once_they_are_back(
    mock_cluster: MockCluster,
    unique_topic: Callable[[str], str],
    socket_dir: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    topic = unique_topic("stuck")
    mock_cluster.create_topic(topic, 4)
    config = DaemonConfig(
        mock_cluster.bootstrap_servers,
        socket_dir,
        # Reconnect soon after the brokers return, rather than after up to 10 s of backoff.
        librdkafka={"reconnect.backoff.max.ms": "500"},
    )
    stuck = [b"stuck-%d" % i for i in range(20)]
    with running_daemon(config) as daemon, UnixStreamSender(config.stream_path) as stream:
        stream.send(topic, b"warm-up")
        assert pydory_wait(daemon, "--timeout", "30") == 0
        for broker in mock_cluster.broker_ids:
            mock_cluster.broker_down(broker)
        stream.send_many(encode_partition_key(topic, value, i) for i, value in enumerate(stuck))
        capsys.readouterr()
        assert pydory_wait(daemon, "--until-now", "--timeout", "2") == 1
        assert "timed out after 2 s" in capsys.readouterr().err
        held = daemon.snapshot()["topics"][topic]
        page = commit_point_page(daemon)
        for broker in mock_cluster.broker_ids:
            mock_cluster.broker_up(broker)
        assert pydory_wait(daemon, "--timeout", "60") == 0
        snapshot = daemon.snapshot()
    assert held["in_flight"] == len(stuck)
    assert page["open_messages"] == len(stuck)
    assert page["lag_s"] >= 2
    assert snapshot["topics"][topic]["delivered"] == 1 + len(stuck)
    assert_balanced(snapshot)
    records = consume_all(mock_cluster.bootstrap_servers, topic, 1 + len(stuck))
    assert sorted(r.value for r in records) == sorted([b"warm-up", *stuck])


class OrderedSender(threading.Thread):
    """Sends numbered messages to one partition over one stream, in order, until told to
    stop or ``limit`` is reached; ``sent`` counts those handed to the daemon's socket.

    Paced (``slice_size`` messages per ``pause_s``, at most ~50k/s): the load must still be
    running when the test's last wait starts, however fast the machine is."""

    def __init__(
        self,
        path: str,
        topic: str,
        limit: int = 200_000,
        slice_size: int = 100,
        pause_s: float = 0.002,
    ):
        super().__init__(daemon=True)
        self.path, self.topic, self.limit, self.slice_size = path, topic, limit, slice_size
        self.pause_s = pause_s
        self.sent = 0
        self.stop = threading.Event()
        self.sent_some = threading.Event()

    def run(self) -> None:
        with UnixStreamSender(self.path) as stream:
            while self.sent < self.limit and not self.stop.is_set():
                first = self.sent
                stream.send_many(
                    encode_partition_key(self.topic, b"n%d" % i, 0)
                    for i in range(first, first + self.slice_size)
                )
                self.sent = first + self.slice_size
                if self.sent >= 1000:
                    self.sent_some.set()
                self.stop.wait(self.pause_s)


@pytest.mark.slow
def test_under_load_the_commit_point_keeps_passing_what_was_sent_before_each_wait(
    mock_cluster: MockCluster, unique_topic: Callable[[str], str], socket_dir: str
) -> None:
    topic = unique_topic("load")
    mock_cluster.create_topic(topic, 1)  # one partition: Kafka keeps the sending order
    config = DaemonConfig(mock_cluster.bootstrap_servers, socket_dir)
    rounds = []
    with running_daemon(config) as daemon:
        sender = OrderedSender(config.stream_path, topic)
        sender.start()
        try:
            assert sender.sent_some.wait(60)
            for _ in range(3):
                sent_before = sender.sent
                assert pydory_wait(daemon, "--timeout", "30") == 0
                delivered = daemon.snapshot()["topics"][topic]["delivered"]
                rounds.append((sent_before, delivered, commit_point_page(daemon)["commit_point"]))
        finally:
            sender.stop.set()
            sender.join(60)
        assert pydory_wait(daemon, "--timeout", "30") == 0
        total = sender.sent
        snapshot = daemon.snapshot()
    for sent_before, delivered, _ in rounds:
        # In order on one partition: the first `delivered` messages are the ones in Kafka.
        assert delivered >= sent_before
    commit_points = [commit_point for _, _, commit_point in rounds]
    assert commit_points == sorted(commit_points)
    assert len(set(commit_points)) == len(commit_points)
    assert rounds[-1][0] < total, "the load stopped before the last wait"
    assert snapshot["topics"][topic]["delivered"] == total
    records = consume_all(mock_cluster.bootstrap_servers, topic, total)
    assert [r.value for r in records] == [b"n%d" % i for i in range(total)]


def test_wait_answers_not_passed_at_once_when_the_daemon_shuts_down(
    mock_cluster: MockCluster,
    unique_topic: Callable[[str], str],
    socket_dir: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    topic = unique_topic("bye")
    mock_cluster.create_topic(topic, 2)
    config = DaemonConfig(mock_cluster.bootstrap_servers, socket_dir, shutdown_max_delay_ms=200)
    daemon = RunningDaemon(config).start()
    outcome: list[int] = []
    try:
        with UnixStreamSender(config.stream_path) as stream:
            stream.send(topic, b"warm-up")
            assert pydory_wait(daemon, "--timeout", "30") == 0
            for broker in mock_cluster.broker_ids:
                mock_cluster.broker_down(broker)
            stream.send(topic, b"stuck")
        waiter = threading.Thread(
            target=lambda: outcome.append(pydory_wait(daemon, "--timeout", "60")), daemon=True
        )
        waiter.start()
        wait_until(lambda: daemon.call(lambda: daemon.server.commit_point.waiters) == 1)
    finally:
        daemon.stop()
    waiter.join(60)
    assert outcome == [1]
    assert "shutting down" in capsys.readouterr().err


def test_wait_finds_the_status_port_in_the_config_file(
    mock_cluster: MockCluster, socket_dir: str, tmp_path: Path
) -> None:
    config = DaemonConfig(mock_cluster.bootstrap_servers, socket_dir)
    config_path = tmp_path / "pydory.xml"
    config_path.write_text(config.render(), encoding="ascii")
    with running_daemon(config):
        assert main(["wait", "--config-path", str(config_path), "--timeout", "10", "-q"]) == 0


def test_wait_with_no_time_to_wait_passes_on_an_idle_daemon(
    mock_cluster: MockCluster, socket_dir: str
) -> None:
    """Nothing is outstanding, so even ``--timeout 0`` passes ("now" is a moment just
    ahead: the daemon grants it the sweep it takes, status/commit_point.py NOW_GRACE_S)."""
    config = DaemonConfig(mock_cluster.bootstrap_servers, socket_dir)
    with running_daemon(config) as daemon:
        assert [pydory_wait(daemon, "--timeout", "0", "-q") for _ in range(5)] == [0] * 5


def test_wait_exits_2_when_no_daemon_answers(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_loopback_port()}"
    assert main(["wait", "--url", url, "--timeout", "1"]) == 2
    assert f"cannot reach the daemon at {url}" in capsys.readouterr().err


def test_wait_exits_2_when_the_config_file_is_unreadable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "missing.xml"
    assert main(["wait", "--config-path", str(missing)]) == 2
    assert f"Cannot read config file [{missing}]" in capsys.readouterr().err
