"""The daemon end to end against Tansu, a separate Kafka-compatible broker process.

What a client sends must arrive unchanged: topic, key, value and the client's own
timestamp, on every transport. Tansu's high watermarks undercount, so these tests count
by consuming. One test checks the timestamp on the mock cluster too, so that neither
broker implementation alone defines "exact".
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

import producer_backends
from helpers import assert_balanced, settled, wait_until
from pydory.client import DatagramSender, TcpSender, UnixStreamSender
from pydory_tools.testing.daemon import DaemonConfig, RunningDaemon, running_daemon
from pydory_tools.testing.kafka_util import consume_all
from pydory_tools.testing.mock_cluster import MockCluster
from pydory_tools.testing.tansu import TansuBroker

# Every test on both producer backends (the compiled one and confluent-kafka's).
producer_backend = producer_backends.module_fixture()

MESSAGES = 200
PARTITIONS = 3
#: Client timestamps far from "now", so a broker or producer that substitutes its own
#: clock cannot pass by accident. 2001-09-09T01:46:40Z, then one millisecond apart.
FIRST_TIMESTAMP_MS = 1_000_000_000_000

# (key, value, client timestamp) of one message.
Sent = tuple[bytes, bytes, int]


@pytest.fixture
def socket_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    # UNIX socket paths are limited to ~108 bytes: keep them short.
    return str(tmp_path_factory.mktemp("s", numbered=True))


def messages_for(transport: str) -> list[Sent]:
    """Distinct keys (one empty), values and timestamps, so any mix-up shows."""
    return [
        (
            b"" if i == 0 else b"key-%s-%d" % (transport.encode(), i % 7),
            b"%s value %d \x00\xff" % (transport.encode(), i),
            FIRST_TIMESTAMP_MS + i * 1001,
        )
        for i in range(MESSAGES)
    ]


def send_over(transport: str, daemon: RunningDaemon, topic: str, messages: list[Sent]) -> None:
    config = daemon.daemon_config
    sender: DatagramSender | UnixStreamSender | TcpSender
    if transport == "unix_dgram":
        sender = DatagramSender(config.datagram_path)
    elif transport == "unix_stream":
        sender = UnixStreamSender(config.stream_path)
    else:
        sender = TcpSender(daemon.tcp_port)
    with sender:
        for i, (key, value, timestamp_ms) in enumerate(messages):
            # Half AnyPartition, half PartitionKey: both paths must keep the fields.
            partition_key = i if i % 2 else None
            sender.send(
                topic, value, key=key, partition_key=partition_key, timestamp_ms=timestamp_ms
            )


def read_back(bootstrap_servers: str, topic: str) -> list[tuple[str, bytes, bytes, int]]:
    records = consume_all(bootstrap_servers, topic, MESSAGES)
    # librdkafka hands an empty key back as None: the client cannot tell the two apart.
    return sorted((r.topic, r.key or b"", r.value or b"", r.timestamp_ms) for r in records)


def expected(topic: str, messages: list[Sent]) -> list[tuple[str, bytes, bytes, int]]:
    return sorted((topic, key, value, timestamp_ms) for key, value, timestamp_ms in messages)


@pytest.mark.tansu
@pytest.mark.slow
@pytest.mark.parametrize("transport", ["unix_dgram", "unix_stream", "tcp"])
def test_each_transport_delivers_exactly_what_was_sent_to_tansu(
    tansu_broker: TansuBroker,
    unique_topic: Callable[[str], str],
    socket_dir: str,
    transport: str,
) -> None:
    topic = unique_topic(f"tansu-{transport.replace('_', '-')}")
    tansu_broker.create_topic(topic, PARTITIONS)
    messages = messages_for(transport)
    config = DaemonConfig(tansu_broker.bootstrap_servers, socket_dir)
    with running_daemon(config) as daemon:
        send_over(transport, daemon, topic, messages)
        wait_until(settled(daemon, topic, MESSAGES), what=f"{MESSAGES} deliveries")
        snapshot = daemon.snapshot()
    assert snapshot["received"][transport] == MESSAGES
    assert snapshot["topics"][topic]["delivered"] == MESSAGES
    assert snapshot["discards"] == {reason: 0 for reason in snapshot["discards"]}
    assert_balanced(snapshot)
    assert read_back(tansu_broker.bootstrap_servers, topic) == expected(topic, messages)


def test_the_client_timestamp_arrives_exactly_on_the_mock_cluster(
    mock_cluster: MockCluster, unique_topic: Callable[[str], str], socket_dir: str
) -> None:
    topic = unique_topic("timestamps")
    mock_cluster.create_topic(topic, PARTITIONS)
    messages = messages_for("unix_stream")
    config = DaemonConfig(mock_cluster.bootstrap_servers, socket_dir)
    with running_daemon(config) as daemon:
        send_over("unix_stream", daemon, topic, messages)
        wait_until(settled(daemon, topic, MESSAGES), what=f"{MESSAGES} deliveries")
    assert read_back(mock_cluster.bootstrap_servers, topic) == expected(topic, messages)
