"""The daemon end to end: real sockets in, the librdkafka mock cluster out, books balanced."""

from __future__ import annotations

import os
import socket
import stat
import struct
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from helpers import assert_balanced, settled, wait_until
from pydory.client import DatagramSender, TcpSender, UnixStreamSender
from pydory.daemon.books.events import DiscardReason
from pydory.status.discards import discard_report_json
from pydory.wire import encode_any_partition, encode_partition_key
from pydory_tools.testing.daemon import DaemonConfig, RunningDaemon, running_daemon
from pydory_tools.testing.kafka_util import consume_all
from pydory_tools.testing.mock_cluster import MockCluster

PARTITIONS = 4


@pytest.fixture
def socket_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    # UNIX socket paths are limited to ~108 bytes: keep them short.
    path = tmp_path_factory.mktemp("s", numbered=True)
    return str(path)


@pytest.fixture
def topic(mock_cluster: MockCluster, unique_topic: Callable[[str], str]) -> str:
    name = unique_topic("daemon")
    mock_cluster.create_topic(name, PARTITIONS)
    return name


def test_every_transport_delivers_and_the_books_balance(
    mock_cluster: MockCluster, topic: str, socket_dir: str
) -> None:
    config = DaemonConfig(mock_cluster.bootstrap_servers, socket_dir)
    with running_daemon(config) as daemon:
        with DatagramSender(config.datagram_path) as dgram:
            for i in range(50):
                dgram.send(topic, b"dgram-%d" % i, key=b"k")
        with UnixStreamSender(config.stream_path) as stream:
            for i in range(50):
                stream.send(topic, b"stream-%d" % i)
        with TcpSender(daemon.tcp_port) as tcp:
            for i in range(50):
                tcp.send(topic, b"tcp-%d" % i, partition_key=i)
        wait_until(settled(daemon, topic, 150), what="150 deliveries")
        snapshot = daemon.snapshot()
    assert snapshot["topics"][topic]["delivered"] == 150
    assert snapshot["received"] == {"unix_dgram": 50, "unix_stream": 50, "tcp": 50}
    assert snapshot["pool_used"] == 0
    records = consume_all(mock_cluster.bootstrap_servers, topic, 150)
    values = Counter(r.value for r in records)
    assert len(records) == 150
    assert all(n == 1 for n in values.values())
    by_value = {r.value: r for r in records}
    assert by_value[b"dgram-7"].key == b"k"
    # PartitionKey: partitions sorted ascending, key % n.
    for i in range(50):
        assert by_value[b"tcp-%d" % i].partition == i % PARTITIONS


def test_any_partition_spreads_over_every_partition(
    mock_cluster: MockCluster, topic: str, socket_dir: str
) -> None:
    config = DaemonConfig(mock_cluster.bootstrap_servers, socket_dir)
    with running_daemon(config) as daemon, UnixStreamSender(config.stream_path) as stream:
        stream.send_many(encode_any_partition(topic, b"v%d" % i) for i in range(2000))
        wait_until(settled(daemon, topic, 2000), what="2000 deliveries")
    per_partition = Counter(
        r.partition for r in consume_all(mock_cluster.bootstrap_servers, topic, 2000)
    )
    assert set(per_partition) == set(range(PARTITIONS))
    assert max(per_partition.values()) - min(per_partition.values()) <= 2 * 64


def test_bad_input_is_counted_and_loses_nothing_else(
    mock_cluster: MockCluster, topic: str, socket_dir: str
) -> None:
    config = DaemonConfig(
        mock_cluster.bootstrap_servers,
        socket_dir,
        max_stream_msg_size="16k",
        message_max_bytes=2000,
    )
    good = encode_any_partition(topic, b"good")
    unknown_key = struct.pack(">ihh", 8, 999, 0)
    bad_version = struct.pack(">ihh", 8, 256, 7)
    malformed = good[:-1]  # Size says one byte more than there is
    malformed = struct.pack(">i", len(malformed)) + malformed[4:]
    with running_daemon(config) as daemon:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        for data in (good, unknown_key, bad_version, malformed, good):
            sock.sendto(data, config.datagram_path)
        sock.close()
        with UnixStreamSender(config.stream_path) as stream:
            stream.send("no-such-topic", b"x")  # a legal name the cluster lacks
            stream.send(topic, b"y" * 5000)  # within maxStreamMsgSize, too long for Kafka
            stream.send(topic, b"after the long one")  # the connection stays open
        # An oversized frame closes that connection only.
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as rogue:
            rogue.connect(config.stream_path)
            rogue.sendall(struct.pack(">i", 1 << 30))
            assert rogue.recv(1) == b""  # closed by the daemon
        # A stream that ends mid-message is an unclean disconnect.
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as partial:
            partial.connect(("127.0.0.1", daemon.tcp_port))
            partial.sendall(good[:10])
        with TcpSender(daemon.tcp_port) as tcp:
            tcp.send(topic, b"tcp still works")
        wait_until(settled(daemon, topic, 4), what="the 4 good messages")
        wait_until(lambda: daemon.snapshot()["discards"].get("unclean_disconnect") == 1)
        snapshot = daemon.snapshot()
        report = daemon.call(lambda: discard_report_json(daemon.server.books.discard_report()))
    discards = snapshot["discards"]
    assert discards["unsupported_api_key"] == 1
    assert discards["unsupported_version"] == 1
    assert discards["malformed"] == 2  # the short message and the oversized frame
    assert discards["bad_topic"] == 1
    assert discards["too_long"] == 1
    assert discards["unclean_disconnect"] == 1
    assert snapshot["topics"][topic]["delivered"] == 4
    current = report["unfinished_report"]
    assert current["tcp_unclean_disconnect_count"] == 1
    assert current["recent_bad_topic"]
    assert_balanced(snapshot)


def test_rate_limited_topic_discards_the_excess(
    mock_cluster: MockCluster, topic: str, socket_dir: str
) -> None:
    config = DaemonConfig(
        mock_cluster.bootstrap_servers, socket_dir, rate_limits={topic: (60_000, 10)}
    )
    with running_daemon(config) as daemon, UnixStreamSender(config.stream_path) as stream:
        stream.send_many(encode_partition_key(topic, b"m%d" % i, i) for i in range(25))
        wait_until(settled(daemon, topic, 10))
        wait_until(lambda: daemon.snapshot()["discards"].get("rate_limit") == 15)
        snapshot = daemon.snapshot()
    assert snapshot["topics"][topic]["delivered"] == 10
    assert snapshot["topics"][topic]["discarded"] == {"rate_limit": 15}


def test_pool_exhaustion_discards_with_no_memory(
    mock_cluster: MockCluster, topic: str, socket_dir: str
) -> None:
    # A slow broker keeps messages in the pool; a tiny pool then runs out.
    for broker in (1, 2, 3):
        mock_cluster.set_rtt(broker, 300)
    config = DaemonConfig(mock_cluster.bootstrap_servers, socket_dir, max_buffer="20k")
    with running_daemon(config) as daemon, UnixStreamSender(config.stream_path) as stream:
        stream.send_many(encode_any_partition(topic, b"z" * 1000) for _ in range(100))
        wait_until(
            lambda: (
                sum(t["accepted"] for t in daemon.snapshot()["topics"].values())
                + daemon.snapshot()["discards"].get("no_memory", 0)
                == 100
            )
        )
        wait_until(settled(daemon, topic, 1))
        snapshot = daemon.snapshot()
    accepted = snapshot["topics"][topic]["accepted"]
    assert 0 < accepted < 100
    assert snapshot["discards"]["no_memory"] == 100 - accepted
    assert snapshot["topics"][topic]["delivered"] == accepted


def test_permanent_kafka_error_is_a_discard_with_its_name(
    mock_cluster: MockCluster, topic: str, socket_dir: str
) -> None:
    config = DaemonConfig(mock_cluster.bootstrap_servers, socket_dir)
    with running_daemon(config) as daemon, UnixStreamSender(config.stream_path) as stream:
        stream.send(topic, b"warm-up")  # the producer connects and learns the cluster
        wait_until(settled(daemon, topic, 1))
        # Produce -> MESSAGE_TOO_LARGE, which no resend changes. (TOPIC_AUTHORIZATION_FAILED
        # would do too, but librdkafka then refuses the whole topic until metadata changes.)
        mock_cluster.push_request_errors(0, [10])
        stream.send(topic, b"refused")
        wait_until(lambda: daemon.snapshot()["topics"][topic]["discarded"].get("kafka_error") == 1)
        stream.send(topic, b"after")
        wait_until(settled(daemon, topic, 3))
        snapshot = daemon.snapshot()
        counters = daemon.call(daemon.server.counters.snapshot)
    assert snapshot["topics"][topic]["delivered"] == 2
    assert counters["discarded_kafka_error_MSG_SIZE_TOO_LARGE"] == 1


def test_broker_down_then_up_loses_nothing(
    mock_cluster: MockCluster, topic: str, socket_dir: str
) -> None:
    config = DaemonConfig(mock_cluster.bootstrap_servers, socket_dir)
    total = 3000
    with running_daemon(config) as daemon, UnixStreamSender(config.stream_path) as stream:
        stream.send_many(encode_partition_key(topic, b"a%d" % i, i) for i in range(1000))
        mock_cluster.broker_down(2)
        stream.send_many(encode_partition_key(topic, b"b%d" % i, i) for i in range(1000))
        time.sleep(1.0)  # messages for broker 2's partitions wait in librdkafka meanwhile
        mock_cluster.broker_up(2)
        stream.send_many(encode_partition_key(topic, b"c%d" % i, i) for i in range(1000))
        wait_until(settled(daemon, topic, total), timeout_s=60, what="all deliveries")
        snapshot = daemon.snapshot()
    assert snapshot["topics"][topic]["delivered"] == total
    records = consume_all(mock_cluster.bootstrap_servers, topic, total)
    assert sorted(r.value for r in records) == sorted(
        b"%s%d" % (p, i) for p in (b"a", b"b", b"c") for i in range(1000)
    )


def test_retriable_errors_past_librdkafkas_retries_end_in_a_reroute_and_delivery(
    mock_cluster: MockCluster, topic: str, socket_dir: str
) -> None:
    # librdkafka retries NOT_ENOUGH_REPLICAS itself (retries = maxFailedDeliveryAttempts);
    # past that the report reaches us and the message is rerouted, not dropped.
    # (Setting a partition's leader to -1 in the mock cluster would model "no leader",
    # but librdkafka's mock crashes when produced to in that state.)
    config = DaemonConfig(
        mock_cluster.bootstrap_servers, socket_dir, max_failed_delivery_attempts=3
    )
    with running_daemon(config) as daemon, UnixStreamSender(config.stream_path) as stream:
        stream.send(topic, b"warm-up")
        wait_until(settled(daemon, topic, 1))
        mock_cluster.push_request_errors(0, [19] * 4)  # Produce -> NOT_ENOUGH_REPLICAS x4
        stream.send(topic, b"survivor", timestamp_ms=1_700_000_000_123)
        wait_until(settled(daemon, topic, 2), timeout_s=60, what="the reroute to settle")
        snapshot = daemon.snapshot()
    assert snapshot["topics"][topic]["delivered"] == 2
    assert snapshot["rerouted"] == 1
    # The resend keeps the client's timestamp (librdkafka's failure report has none).
    by_value = {r.value: r for r in consume_all(mock_cluster.bootstrap_servers, topic, 2)}
    assert by_value[b"survivor"].timestamp_ms == 1_700_000_000_123


def test_retriable_errors_past_every_attempt_are_discarded_with_reason(
    mock_cluster: MockCluster, topic: str, socket_dir: str
) -> None:
    config = DaemonConfig(
        mock_cluster.bootstrap_servers, socket_dir, max_failed_delivery_attempts=2
    )
    with running_daemon(config) as daemon, UnixStreamSender(config.stream_path) as stream:
        stream.send(topic, b"warm-up")
        wait_until(settled(daemon, topic, 1))
        mock_cluster.push_request_errors(0, [19] * 50)
        stream.send(topic, b"doomed")
        wait_until(settled(daemon, topic, 2), timeout_s=60, what="the discard")
        snapshot = daemon.snapshot()
    assert snapshot["topics"][topic]["discarded"] == {"failed_delivery_attempts": 1}


def test_socket_files_are_replaced_at_start_and_removed_at_exit(
    mock_cluster: MockCluster, topic: str, socket_dir: str
) -> None:
    config = DaemonConfig(mock_cluster.bootstrap_servers, socket_dir)
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    stale.bind(config.datagram_path)
    stale.close()  # leaves a stale socket file behind, as a crashed daemon would
    with running_daemon(config):
        mode = os.stat(config.stream_path).st_mode
        assert stat.S_ISSOCK(mode)
        assert stat.S_IMODE(mode) == 0o666
        with DatagramSender(config.datagram_path) as dgram:
            dgram.send(topic, b"through the replaced socket")
    assert not Path(config.datagram_path).exists()
    assert not Path(config.stream_path).exists()


def test_tcp_listens_on_loopback_only(
    mock_cluster: MockCluster, topic: str, socket_dir: str
) -> None:
    config = DaemonConfig(mock_cluster.bootstrap_servers, socket_dir)
    with running_daemon(config) as daemon:
        addresses = {
            sock.getsockname()[0]
            for stream_input in daemon.server.inputs.streams
            if stream_input.port is not None
            for server in stream_input._servers
            for sock in server.sockets
        }
    assert addresses
    assert addresses <= {"127.0.0.1", "::1"}


def test_shutdown_delivers_what_it_holds(
    mock_cluster: MockCluster, topic: str, socket_dir: str
) -> None:
    config = DaemonConfig(mock_cluster.bootstrap_servers, socket_dir, batching_time_ms=2000)
    daemon = RunningDaemon(config).start()
    with UnixStreamSender(config.stream_path) as stream:
        stream.send_many(encode_any_partition(topic, b"s%d" % i) for i in range(500))
    wait_until(lambda: daemon.snapshot()["topics"].get(topic, {}).get("accepted") == 500)
    daemon.stop()  # linger is 2 s: these are still batching when the stop arrives
    books = daemon.server.books.per_topic()[topic]
    assert books.delivered == 500
    assert books.in_flight == 0


def test_shutdown_past_its_delay_discards_with_reason(
    mock_cluster: MockCluster, topic: str, socket_dir: str
) -> None:
    config = DaemonConfig(mock_cluster.bootstrap_servers, socket_dir, shutdown_max_delay_ms=500)
    daemon = RunningDaemon(config).start()
    with UnixStreamSender(config.stream_path) as stream:
        stream.send(topic, b"warm-up")
        wait_until(lambda: daemon.snapshot()["topics"].get(topic, {}).get("delivered") == 1)
        for broker in (1, 2, 3):
            mock_cluster.broker_down(broker)
        stream.send_many(encode_any_partition(topic, b"d%d" % i) for i in range(100))
    wait_until(lambda: daemon.snapshot()["topics"][topic]["accepted"] == 101)
    daemon.stop()
    books = daemon.server.books.per_topic()[topic]
    assert books.in_flight == 0
    assert books.delivered == 1
    assert books.discarded_by_reason[DiscardReason.SHUTDOWN_DELAY] == 100


def test_a_second_daemon_does_not_take_over_a_live_socket(
    mock_cluster: MockCluster, topic: str, socket_dir: str
) -> None:
    config = DaemonConfig(mock_cluster.bootstrap_servers, socket_dir)
    with running_daemon(config):
        intruder = RunningDaemon(DaemonConfig(mock_cluster.bootstrap_servers, socket_dir))
        with pytest.raises(RuntimeError) as failed:
            intruder.start()
        assert "in use by another running process" in str(failed.value.__cause__)
        with DatagramSender(config.datagram_path) as dgram:  # the first one still serves
            dgram.send(topic, b"still here")
        assert Path(config.stream_path).exists()
