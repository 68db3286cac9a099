"""librdkafka's mock cluster through pydory_tools.testing: round trip, faults, injection,
process."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable

import pytest
from confluent_kafka import KafkaError, Message, Producer
from confluent_kafka.admin import AdminClient

from pydory_tools.testing.kafka_util import ConsumedRecord, consume_all, produce_all
from pydory_tools.testing.mock_cluster import ApiKey, ErrorCode, MockCluster, MockClusterError

ROUND_TRIP_COUNT = 2000


def numbered_messages(count: int) -> list[tuple[bytes, bytes]]:
    """Keys spread over partitions; the value is the message's sequence number."""
    return [(f"key-{i % 97}".encode(), str(i).encode()) for i in range(count)]


def values_by_partition(records: list[ConsumedRecord]) -> dict[int, list[int]]:
    """Sequence numbers per partition, in the order they were read (offset order)."""
    by_partition: dict[int, list[int]] = defaultdict(list)
    for record in records:
        assert record.value is not None
        by_partition[record.partition].append(int(record.value))
    return dict(by_partition)


def assert_round_trip(bootstrap_servers: str, topic: str, count: int) -> None:
    """Produce ``count`` numbered messages, read them all back, compare exactly."""
    sent = numbered_messages(count)
    reports = produce_all(bootstrap_servers, topic, sent)
    records = consume_all(bootstrap_servers, topic, expected=count, timeout_s=60)

    assert Counter((r.key, r.value) for r in records) == Counter(sent)
    assert {(r.partition, r.value) for r in records} == {(d.partition, d.value) for d in reports}
    for partition, values in values_by_partition(records).items():
        assert values == sorted(values), f"partition {partition} out of order"
    assert len(values_by_partition(records)) > 1, "keys did not spread over partitions"


def partition_leaders(bootstrap_servers: str, topic: str) -> dict[int, int]:
    metadata = AdminClient({"bootstrap.servers": bootstrap_servers}).list_topics(topic, timeout=60)
    return {p: info.leader for p, info in metadata.topics[topic].partitions.items()}


# --- basics ---------------------------------------------------------------------------------


def test_round_trip_over_three_brokers(
    mock_cluster: MockCluster, unique_topic: Callable[[str], str]
) -> None:
    topic = unique_topic("roundtrip")
    mock_cluster.create_topic(topic, partitions=4)
    assert_round_trip(mock_cluster.bootstrap_servers, topic, ROUND_TRIP_COUNT)


def test_bootstrap_lists_every_broker(mock_cluster_factory: Callable[..., MockCluster]) -> None:
    cluster = mock_cluster_factory(brokers=2)
    addresses = cluster.bootstrap_servers.split(",")
    assert len(addresses) == 2
    assert all(address.startswith("127.0.0.1:") for address in addresses)
    metadata = AdminClient({"bootstrap.servers": cluster.bootstrap_servers}).list_topics(timeout=60)
    assert set(metadata.brokers) == set(cluster.broker_ids) == {1, 2}


def test_set_partition_leader_shows_in_metadata(
    mock_cluster: MockCluster, unique_topic: Callable[[str], str]
) -> None:
    topic = unique_topic("leaders")
    mock_cluster.create_topic(topic, partitions=3)
    mock_cluster.set_partition_leader(topic, 0, 3)
    mock_cluster.set_partition_leader(topic, 1, 3)
    mock_cluster.set_partition_leader(topic, 2, -1)

    assert partition_leaders(mock_cluster.bootstrap_servers, topic) == {0: 3, 1: 3, 2: -1}


def test_pushed_produce_error_reaches_the_delivery_report(
    mock_cluster: MockCluster, unique_topic: Callable[[str], str]
) -> None:
    topic = unique_topic("inject")
    mock_cluster.create_topic(topic, partitions=1)
    mock_cluster.push_request_errors(ApiKey.PRODUCE, [ErrorCode.NOT_ENOUGH_REPLICAS])
    reports: list[KafkaError | None] = []

    def on_delivery(error: KafkaError | None, _message: Message) -> None:
        reports.append(error)

    producer = Producer(
        {"bootstrap.servers": mock_cluster.bootstrap_servers, "message.send.max.retries": 0}
    )
    for value in (b"refused", b"accepted"):
        producer.produce(topic, value=value, on_delivery=on_delivery)
        assert producer.flush(10) == 0

    assert len(reports) == 2
    assert reports[0] is not None
    assert reports[0].code() == KafkaError.NOT_ENOUGH_REPLICAS
    assert reports[1] is None, "only the next request should fail"


def test_error_codes_match_librdkafka() -> None:
    assert ErrorCode.NOT_LEADER_FOR_PARTITION == KafkaError.NOT_LEADER_FOR_PARTITION
    assert ErrorCode.REQUEST_TIMED_OUT == KafkaError.REQUEST_TIMED_OUT
    assert ErrorCode.MESSAGE_TOO_LARGE == KafkaError.MSG_SIZE_TOO_LARGE
    assert ErrorCode.TOPIC_AUTHORIZATION_FAILED == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert ErrorCode.TRANSPORT == KafkaError._TRANSPORT


def test_unknown_broker_raises_naming_the_call(mock_cluster: MockCluster) -> None:
    with pytest.raises(MockClusterError, match="rd_kafka_mock_broker_set_down") as caught:
        mock_cluster.broker_down(99)
    assert caught.value.code == KafkaError.BROKER_NOT_AVAILABLE
    with pytest.raises(MockClusterError, match="rd_kafka_mock_broker_set_rtt"):
        mock_cluster.set_rtt(99, 10)


def test_duplicate_topic_raises(mock_cluster: MockCluster) -> None:
    mock_cluster.create_topic("twice", partitions=1)
    with pytest.raises(MockClusterError, match="already exists"):
        mock_cluster.create_topic("twice", partitions=1)


def test_stop_is_idempotent_and_final() -> None:
    cluster = MockCluster(brokers=1)
    cluster.set_rtt(1, 1)
    cluster.stop()
    cluster.stop()
    with pytest.raises(MockClusterError, match="stopped"):
        cluster.create_topic("late", partitions=1)


# --- a broker outage under an idempotent producer -------------------------------------------

FAULT_COUNT = 20_000
FAULT_PARTITIONS = 6
DOWN_BROKER = 2


class DeliveryLog:
    """Delivery reports of the fault test, kept per message sequence number."""

    def __init__(self) -> None:
        self.delivered: dict[int, int] = {}  # sequence number -> partition
        self.failed: list[KafkaError] = []

    def __call__(self, error: KafkaError | None, message: Message) -> None:
        if error is not None:
            self.failed.append(error)
            return
        value = message.value()
        partition = message.partition()
        assert value is not None
        assert partition is not None
        self.delivered[int(value)] = partition


def produce_range(producer: Producer, topic: str, numbers: range, log: DeliveryLog) -> None:
    for number in numbers:
        partition = number % FAULT_PARTITIONS
        producer.produce(topic, value=str(number).encode(), partition=partition, on_delivery=log)
        producer.poll(0)


def serve_until(producer: Producer, done: Callable[[], bool], timeout_s: float) -> None:
    """Serve delivery reports until ``done()`` or the timeout."""
    deadline = time.monotonic() + timeout_s
    while not done() and time.monotonic() < deadline:
        producer.poll(0.1)


@pytest.mark.slow
def test_idempotent_producer_survives_a_broker_outage(
    mock_cluster: MockCluster, unique_topic: Callable[[str], str]
) -> None:
    topic = unique_topic("outage")
    mock_cluster.create_topic(topic, partitions=FAULT_PARTITIONS)
    leaders = {p: p % 3 + 1 for p in range(FAULT_PARTITIONS)}
    for partition, broker in leaders.items():
        mock_cluster.set_partition_leader(topic, partition, broker)
    on_down_broker = {p for p, broker in leaders.items() if broker == DOWN_BROKER}

    producer = Producer(
        {
            "bootstrap.servers": mock_cluster.bootstrap_servers,
            "enable.idempotence": True,
            "linger.ms": 5,
            "batch.num.messages": 100,  # many requests per partition, several in flight
            # Outlast the outage: a message timeout would fail messages instead of retrying.
            "message.timeout.ms": 120_000,
            "reconnect.backoff.ms": 50,
            "reconnect.backoff.max.ms": 500,
            "retry.backoff.ms": 50,
            "retry.backoff.max.ms": 500,
        }
    )
    log = DeliveryLog()
    third = FAULT_COUNT // 3
    before, during, after = range(third), range(third, 2 * third), range(2 * third, FAULT_COUNT)

    produce_range(producer, topic, before, log)
    # Go down once the broker has acknowledged some: the rest are in flight or queued.
    on_down = [n for n in before if n % FAULT_PARTITIONS in on_down_broker]
    serve_until(producer, lambda: any(n in log.delivered for n in on_down), timeout_s=60)
    mock_cluster.broker_down(DOWN_BROKER)
    produce_range(producer, topic, during, log)
    reachable = [n for n in during if n % FAULT_PARTITIONS not in on_down_broker]
    serve_until(producer, lambda: all(n in log.delivered for n in reachable), timeout_s=60)

    assert all(n in log.delivered for n in reachable), "healthy brokers stalled"
    stuck = [n for n in during if n % FAULT_PARTITIONS in on_down_broker]
    assert not any(n in log.delivered for n in stuck), "delivered through a broker that is down"

    mock_cluster.broker_up(DOWN_BROKER)
    produce_range(producer, topic, after, log)
    assert producer.flush(60) == 0
    assert log.failed == []
    assert sorted(log.delivered) == list(range(FAULT_COUNT))

    records = consume_all(mock_cluster.bootstrap_servers, topic, FAULT_COUNT, timeout_s=60)
    by_partition = values_by_partition(records)
    for partition in range(FAULT_PARTITIONS):
        expected = list(range(partition, FAULT_COUNT, FAULT_PARTITIONS))
        assert by_partition[partition] == expected, f"partition {partition}: lost, dup or reorder"


# --- the command-line process ---------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT], ids=["TERM", "INT"])
def test_process_serves_until_signalled(stop_signal: signal.Signals) -> None:
    command = [sys.executable, "-m", "pydory_tools.testing.mock_cluster", "--brokers", "2"]
    command += ["--topic", "demo:3", "--topic", "other:1"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as process:
        try:
            assert process.stdout is not None
            bootstrap = process.stdout.readline().strip()
            assert bootstrap.count("127.0.0.1:") == 2

            produce_all(bootstrap, "demo", [(b"k", b"hello")])
            records = consume_all(bootstrap, "demo", expected=1, timeout_s=60)
            assert [(r.key, r.value) for r in records] == [(b"k", b"hello")]
            assert len(partition_leaders(bootstrap, "demo")) == 3

            process.send_signal(stop_signal)
            assert process.wait(timeout=60) == 0
        finally:
            if process.poll() is None:
                process.kill()


def test_process_rejects_a_bad_topic_spec() -> None:
    command = [sys.executable, "-m", "pydory_tools.testing.mock_cluster", "--topic", "nopartitions"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2
    assert "NAME:PARTITIONS" in result.stderr
