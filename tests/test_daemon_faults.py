"""The daemon under faults, end to end: every message either reaches Kafka or is reported.

Real daemon, real client sockets, librdkafka's mock cluster with injected faults. Each
fault test ends with the books exact (accepted == delivered + post-acceptance discards,
nothing in flight) and with every message sent either read back from Kafka or counted
as a discard.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import signal
import socket
import stat
import struct
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import uvloop

import producer_backends
from helpers import (
    DISCARD_COUNTS,
    TOTALS_LINE,
    SchedulingDelay,
    assert_balanced,
    settled,
    shutdown_span_s,
    wait_until,
)
from pydory.client import UnixStreamSender
from pydory.daemon.books.events import AFTER_ACCEPTANCE, DiscardReason
from pydory.daemon.delivery.dispatcher import Dispatcher
from pydory.daemon.delivery.librdkafka_settings import DeliverySettings, ProducerProfile
from pydory.daemon.delivery.outcomes import Delivered
from pydory.daemon.delivery.router import MetadataSnapshot, Router
from pydory.errors import DaemonUnavailable
from pydory.wire import encode_any_partition, encode_partition_key
from pydory_tools.testing.daemon import DaemonConfig, RunningDaemon, running_daemon
from pydory_tools.testing.daemon_process import DaemonProcess
from pydory_tools.testing.kafka_util import consume_all
from pydory_tools.testing.mock_cluster import ApiKey, ErrorCode, MockCluster

# Every test on both producer backends (the compiled one and confluent-kafka's).
producer_backend = producer_backends.module_fixture()


@pytest.fixture
def socket_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    # UNIX socket paths are limited to ~108 bytes: keep them short.
    return str(tmp_path_factory.mktemp("s", numbered=True))


def lifetime_discards(daemon: RunningDaemon) -> Counter[str]:
    return Counter(daemon.snapshot()["discards"])


def assert_all_settled(snapshot: dict[str, Any]) -> None:
    """The books balance and nothing is left in flight."""
    assert_balanced(snapshot)
    for name, books in snapshot["topics"].items():
        assert books["in_flight"] == 0, name


# --- AnyPartition spreading -------------------------------------------------------------


def test_any_partition_load_follows_each_brokers_share_of_leaders(
    mock_cluster: MockCluster, unique_topic: Callable[[str], str], socket_dir: str
) -> None:
    topic = unique_topic("spread")
    leaders = {0: 1, 1: 1, 2: 1, 3: 2, 4: 2, 5: 3}  # broker 1 leads 3, broker 2 two, 3 one
    mock_cluster.create_topic(topic, len(leaders))
    for partition, broker in leaders.items():
        mock_cluster.set_partition_leader(topic, partition, broker)
    total = 10_000
    config = DaemonConfig(mock_cluster.bootstrap_servers, socket_dir)
    with running_daemon(config) as daemon, UnixStreamSender(config.stream_path) as stream:
        stream.send_many(encode_any_partition(topic, b"s%d" % i) for i in range(total))
        wait_until(settled(daemon, topic, total), what=f"{total} deliveries")
        snapshot = daemon.snapshot()
    assert snapshot["topics"][topic]["delivered"] == total
    records = consume_all(mock_cluster.bootstrap_servers, topic, total)
    assert len(records) == total
    per_broker = Counter(leaders[r.partition] for r in records)
    leader_share = Counter(leaders.values())
    for broker, led in leader_share.items():
        expected = total * led / len(leaders)
        assert abs(per_broker[broker] - expected) <= 0.10 * expected, (broker, per_broker)


# --- every discard reason, once ----------------------------------------------------------


def malformed_datagram(topic: str) -> bytes:
    """A message whose Size claims one byte more than the message holds."""
    good = encode_any_partition(topic, b"x")
    return struct.pack(">i", len(good) + 1) + good[4:]


def illegal_topic_message() -> bytes:
    """A well-framed message whose topic has a character Kafka forbids."""
    return encode_any_partition("bad_topic", b"x").replace(b"bad_topic", b"bad topic")


@pytest.mark.slow
def test_every_discard_reason_is_counted_exactly_once_per_message(
    mock_cluster: MockCluster, unique_topic: Callable[[str], str], socket_dir: str
) -> None:
    topic = unique_topic("reasons")
    limited = unique_topic("limited")
    for name in (topic, limited):
        mock_cluster.create_topic(name, 2)
    config = DaemonConfig(
        mock_cluster.bootstrap_servers,
        socket_dir,
        max_buffer="1k",  # one 2000-byte message in flight exhausts it (KIP-72 over-allocation)
        message_max_bytes=4000,
        max_failed_delivery_attempts=2,
        shutdown_max_delay_ms=500,
        rate_limits={limited: (600_000, 1)},
    )
    daemon = RunningDaemon(config).start()
    dgram = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    stream = UnixStreamSender(config.stream_path)
    expected_per_topic: dict[str, Counter[str]] = {topic: Counter(), limited: Counter()}

    def expect(reason: DiscardReason, action: Callable[[], None], on: str | None = None) -> None:
        """``action`` discards exactly one message, with ``reason`` and no other."""
        before = lifetime_discards(daemon)
        action()
        wait_until(lambda: lifetime_discards(daemon).total() > before.total(), what=str(reason))
        if on is not None:
            wait_until(settled(daemon, on, 1), what=f"{on} to settle after {reason}")
        assert lifetime_discards(daemon) - before == Counter({str(reason): 1})
        if on is not None:
            expected_per_topic[on][str(reason)] += 1

    try:
        stream.send(topic, b"warm-up")  # the producer connects and learns the cluster
        wait_until(settled(daemon, topic, 1))

        expect(
            DiscardReason.MALFORMED,
            lambda: dgram.sendto(malformed_datagram(topic), config.datagram_path),
        )
        expect(
            DiscardReason.UNSUPPORTED_API_KEY,
            lambda: dgram.sendto(struct.pack(">ihh", 8, 999, 0), config.datagram_path),
        )
        expect(
            DiscardReason.UNSUPPORTED_VERSION,
            lambda: dgram.sendto(struct.pack(">ihh", 8, 256, 1), config.datagram_path),
        )
        expect(
            DiscardReason.BAD_TOPIC,
            lambda: dgram.sendto(illegal_topic_message(), config.datagram_path),
        )
        expect(DiscardReason.BAD_TOPIC, lambda: stream.send(unique_topic("unknown"), b"x"))
        expect(DiscardReason.TOO_LONG, lambda: stream.send(topic, b"L" * 5000), on=topic)
        expect(
            DiscardReason.RATE_LIMIT,
            lambda: stream.send_many(encode_any_partition(limited, b"r%d" % i) for i in range(2)),
            on=limited,
        )

        def big_then_small() -> None:
            for broker in mock_cluster.broker_ids:
                mock_cluster.set_rtt(broker, 1000)  # the big message stays in the pool
            stream.send_many(
                [encode_any_partition(topic, b"B" * 2000), encode_any_partition(topic, b"s")]
            )

        expect(DiscardReason.NO_MEMORY, big_then_small, on=topic)
        for broker in mock_cluster.broker_ids:
            mock_cluster.set_rtt(broker, 0)

        def refused_by_kafka() -> None:
            mock_cluster.push_request_errors(ApiKey.PRODUCE, [ErrorCode.MESSAGE_TOO_LARGE])
            stream.send(topic, b"refused")

        expect(DiscardReason.KAFKA_ERROR, refused_by_kafka, on=topic)

        def never_accepted_by_kafka() -> None:
            mock_cluster.push_request_errors(ApiKey.PRODUCE, [ErrorCode.NOT_ENOUGH_REPLICAS] * 50)
            stream.send(topic, b"doomed")

        expect(DiscardReason.FAILED_DELIVERY_ATTEMPTS, never_accepted_by_kafka, on=topic)
        mock_cluster.clear_request_errors(ApiKey.PRODUCE)

        def partial_message() -> None:
            with socket.create_connection(("127.0.0.1", daemon.tcp_port)) as partial:
                partial.sendall(encode_any_partition(topic, b"cut short")[:10])

        expect(DiscardReason.UNCLEAN_DISCONNECT, partial_message)
        stream.send(topic, b"last delivered")
        wait_until(settled(daemon, topic, 1))
        counters = daemon.call(daemon.server.counters.snapshot)

        for broker in mock_cluster.broker_ids:
            mock_cluster.broker_down(broker)
        stream.send(topic, b"held at shutdown")
        wait_until(lambda: daemon.snapshot()["topics"][topic]["in_flight"] == 1)
    finally:
        stream.close()
        dgram.close()
        daemon.stop()
    expected_per_topic[topic][str(DiscardReason.SHUTDOWN_DELAY)] += 1
    final = daemon.server.snapshot()
    every_reason_once = Counter({str(reason): 1 for reason in DiscardReason})
    every_reason_once[str(DiscardReason.BAD_TOPIC)] = 2  # an illegal name and an unknown topic
    every_reason_once[str(DiscardReason.SPOOL_CORRUPT)] = 0  # no spool here (test_spool_recovery)
    assert Counter(final["discards"]) == every_reason_once
    for name, reasons in expected_per_topic.items():
        assert Counter(final["topics"][name]["discarded"]) == reasons, name
    assert counters["discarded_kafka_error_MSG_SIZE_TOO_LARGE"] == 1
    assert final["topics"][topic]["delivered"] == 3  # warm-up, the big one, "last delivered"
    assert final["topics"][limited]["delivered"] == 1
    assert_all_settled(final)


# --- faults on the way to Kafka ---------------------------------------------------------


def any_and_keyed(topic: str, label: bytes, count: int) -> list[bytes]:
    """``count`` messages, alternately AnyPartition and PartitionKey (key = index)."""
    return [
        encode_partition_key(topic, b"%s%d" % (label, i), i)
        if i % 2
        else encode_any_partition(topic, b"%s%d" % (label, i))
        for i in range(count)
    ]


def sent_values(label: bytes, count: int) -> list[bytes]:
    return [b"%s%d" % (label, i) for i in range(count)]


def assert_every_message_accounted_for(
    snapshot: dict[str, Any], bootstrap_servers: str, topic: str, sent: list[bytes]
) -> list[Any]:
    """Books exact, nothing in flight, and each message sent either read back from Kafka
    (once) or counted as a discard. Returns the records read back."""
    assert_all_settled(snapshot)
    books = snapshot["topics"][topic]
    assert books["accepted"] + sum(
        n for reason, n in books["discarded"].items() if reason not in AFTER_ACCEPTANCE
    ) == len(sent)
    records = consume_all(bootstrap_servers, topic, books["delivered"])
    values = [r.value for r in records]
    assert len(values) == books["delivered"]
    assert len(set(values)) == len(values), "a message was stored twice"
    assert set(values) <= set(sent)
    assert len(values) + sum(books["discarded"].values()) == len(sent)
    return records


@pytest.mark.parametrize("error", [ErrorCode.NOT_LEADER_FOR_PARTITION, ErrorCode.REQUEST_TIMED_OUT])
def test_retriable_produce_errors_are_retried_and_delivered(
    mock_cluster: MockCluster, unique_topic: Callable[[str], str], socket_dir: str, error: int
) -> None:
    topic = unique_topic("retried")
    mock_cluster.create_topic(topic, 4)
    config = DaemonConfig(mock_cluster.bootstrap_servers, socket_dir)
    chunk = 1000
    with running_daemon(config) as daemon, UnixStreamSender(config.stream_path) as stream:
        stream.send_many(any_and_keyed(topic, b"a", chunk))
        wait_until(settled(daemon, topic, chunk), what="the first chunk")
        # The next three produce requests fail; their messages must be sent again.
        mock_cluster.push_request_errors(ApiKey.PRODUCE, [error] * 3)
        stream.send_many(any_and_keyed(topic, b"b", chunk))
        wait_until(settled(daemon, topic, 2 * chunk), what="every delivery")
        snapshot = daemon.snapshot()
    sent = sent_values(b"a", chunk) + sent_values(b"b", chunk)
    assert_every_message_accounted_for(snapshot, mock_cluster.bootstrap_servers, topic, sent)
    assert snapshot["topics"][topic]["delivered"] == len(sent)


@pytest.mark.parametrize(
    ("error", "name"),
    [
        (ErrorCode.MESSAGE_TOO_LARGE, "MSG_SIZE_TOO_LARGE"),
        (ErrorCode.TOPIC_AUTHORIZATION_FAILED, "TOPIC_AUTHORIZATION_FAILED"),
    ],
)
def test_permanent_produce_errors_are_discarded_with_their_name(
    mock_cluster: MockCluster,
    unique_topic: Callable[[str], str],
    socket_dir: str,
    error: int,
    name: str,
) -> None:
    # Each case has its own cluster and topic: after TOPIC_AUTHORIZATION_FAILED librdkafka
    # refuses the topic for good.
    topic = unique_topic("refused")
    mock_cluster.create_topic(topic, 4)
    config = DaemonConfig(mock_cluster.bootstrap_servers, socket_dir)
    chunk = 1000
    with running_daemon(config) as daemon, UnixStreamSender(config.stream_path) as stream:
        stream.send_many(any_and_keyed(topic, b"a", chunk))
        wait_until(settled(daemon, topic, chunk), what="the first chunk")
        mock_cluster.push_request_errors(ApiKey.PRODUCE, [error])
        stream.send_many(any_and_keyed(topic, b"b", chunk))
        wait_until(settled(daemon, topic, 2 * chunk), what="the second chunk to settle")
        snapshot = daemon.snapshot()
        counters = daemon.call(daemon.server.counters.snapshot)
    sent = sent_values(b"a", chunk) + sent_values(b"b", chunk)
    assert_every_message_accounted_for(snapshot, mock_cluster.bootstrap_servers, topic, sent)
    books = snapshot["topics"][topic]
    assert books["delivered"] >= chunk
    assert set(books["discarded"]) == {str(DiscardReason.KAFKA_ERROR)}
    assert counters[f"discarded_kafka_error_{name}"] == books["discarded"]["kafka_error"] > 0


def unavailable_brokers(daemon: RunningDaemon) -> frozenset[int]:
    return daemon.call(lambda: daemon.server.router.unavailable_brokers)


def routable_partitions(daemon: RunningDaemon, topic: str) -> tuple[int, ...]:
    return daemon.call(lambda: daemon.server.router.available(topic))


@pytest.mark.slow
def test_traffic_avoids_a_downed_broker_and_returns_when_it_is_up(
    mock_cluster: MockCluster, unique_topic: Callable[[str], str], socket_dir: str
) -> None:
    topic = unique_topic("liveness")
    leaders = {0: 1, 1: 2, 2: 3, 3: 1, 4: 2, 5: 3}
    mock_cluster.create_topic(topic, len(leaders))
    for partition, broker in leaders.items():
        mock_cluster.set_partition_leader(topic, partition, broker)
    config = DaemonConfig(
        mock_cluster.bootstrap_servers,
        socket_dir,
        # A message sent to the downed broker would wait this long: far beyond the waits
        # below, so only routing around the broker can deliver everything in time.
        librdkafka={"message.timeout.ms": "120000"},
    )
    chunk = 600
    with running_daemon(config) as daemon, UnixStreamSender(config.stream_path) as stream:
        stream.send_many(encode_any_partition(topic, b"before%d" % i) for i in range(chunk))
        wait_until(settled(daemon, topic, chunk), what="deliveries before the outage")

        mock_cluster.broker_down(3)
        wait_until(
            lambda: not {2, 5} & set(routable_partitions(daemon, topic)),
            timeout_s=60,
            what="the router to drop broker 3's partitions",
        )
        during = [encode_any_partition(topic, b"during%d" % i) for i in range(chunk)]
        # Key 2 picks partition 2 (broker 3): the next partition with a reachable leader.
        during += [encode_partition_key(topic, b"keyed%d" % i, 2) for i in range(100)]
        stream.send_many(during)
        wait_until(settled(daemon, topic, 2 * chunk + 100), timeout_s=60, what="delivery")

        mock_cluster.broker_up(3)
        wait_until(
            lambda: (
                set(routable_partitions(daemon, topic)) == set(leaders)
                and not unavailable_brokers(daemon)
            ),
            what="broker 3's partitions to be routable again",
        )
        stream.send_many(encode_any_partition(topic, b"after%d" % i) for i in range(chunk))
        wait_until(settled(daemon, topic, 3 * chunk + 100), what="deliveries after the outage")
        snapshot = daemon.snapshot()
    sent = (
        sent_values(b"before", chunk)
        + sent_values(b"during", chunk)
        + sent_values(b"keyed", 100)
        + sent_values(b"after", chunk)
    )
    records = assert_every_message_accounted_for(
        snapshot, mock_cluster.bootstrap_servers, topic, sent
    )
    assert snapshot["topics"][topic]["delivered"] == len(sent)
    brokers_by_label = {
        label: Counter(leaders[r.partition] for r in records if r.value.startswith(label))
        for label in (b"before", b"during", b"keyed", b"after")
    }
    assert set(brokers_by_label[b"during"]) == {1, 2}
    assert {r.partition for r in records if r.value.startswith(b"keyed")} == {3}
    assert set(brokers_by_label[b"after"]) == {1, 2, 3}


class ImplicitAcks(logging.Handler):
    """Counts the messages librdkafka reports delivered because a later batch of the same
    partition succeeded (its "IMPLICITACK" debug line), without the broker confirming them."""

    PATTERN = re.compile(r"(\d+) message\(s\) implicitly acked by subsequent batch success")

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages = 0

    def emit(self, record: logging.LogRecord) -> None:
        if match := self.PATTERN.search(record.getMessage()):
            self.messages += int(match[1])


@pytest.fixture
def implicit_acks() -> Iterator[ImplicitAcks]:
    """librdkafka's debug lines reach the pydory.librdkafka logger while this is active."""
    logger = logging.getLogger("pydory.librdkafka")
    handler, level = ImplicitAcks(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)


@pytest.mark.slow
def test_partition_leaders_moved_mid_stream_every_message_is_delivered_and_stored(
    mock_cluster: MockCluster,
    unique_topic: Callable[[str], str],
    socket_dir: str,
    implicit_acks: ImplicitAcks,
) -> None:
    """Leaders move twice while produce requests to a slow broker are in flight;
    librdkafka retries NOT_LEADER_FOR_PARTITION on the new leaders by itself.

    The mock cluster can lose acknowledged messages here, with no pydory involved: a
    plain idempotent confluent-kafka producer doing the same (6,000 messages over 3 s,
    broker 1 at 300 ms, leaders moved twice) lost some in 3 runs of 25, and in each run
    the loss equalled the messages librdkafka acknowledged without an offset. A batch
    sent to the old leader fails with NOT_LEADER, a later batch of the same partition
    succeeds on the new leader, and librdkafka then reports the failed batch delivered
    too ("implicitly acked by subsequent batch success"), trusting the broker to have
    checked the producer's sequence numbers. A real broker does (it would answer
    OUT_OF_ORDER_SEQUENCE_NUMBER); the mock checks them only for transactional producers
    (rd_kafka_mock_validate_records). So the check against Kafka is: nothing stored
    twice, nothing stored that was not sent, and every acknowledged message stored except
    at most those librdkafka acknowledged implicitly (counted from its debug log).
    """
    topic = unique_topic("moved")
    initial = {0: 1, 1: 2, 2: 3, 3: 1}
    mock_cluster.create_topic(topic, len(initial))
    for partition, broker in initial.items():
        mock_cluster.set_partition_leader(topic, partition, broker)
    mock_cluster.set_rtt(1, 300)  # requests to broker 1 stay in flight when leaders move
    config = DaemonConfig(mock_cluster.bootstrap_servers, socket_dir, librdkafka={"debug": "msg"})
    chunk = 2000
    with running_daemon(config) as daemon, UnixStreamSender(config.stream_path) as stream:
        for shift, label in enumerate([b"a", b"b", b"c"]):
            # A steady stream (~2,000 messages a second), so that requests are in flight
            # whenever the leaders move.
            messages = any_and_keyed(topic, label, chunk)
            for start in range(0, chunk, 100):
                stream.send_many(messages[start : start + 100])
                time.sleep(0.05)
            if shift < 2:
                for partition, broker in initial.items():
                    mock_cluster.set_partition_leader(topic, partition, (broker + shift) % 3 + 1)
        wait_until(settled(daemon, topic, 3 * chunk), timeout_s=60, what="every delivery")
        snapshot = daemon.snapshot()
    mock_cluster.set_rtt(1, 0)  # reading 6,000 records back through a 300 ms broker is slow
    sent = sent_values(b"a", chunk) + sent_values(b"b", chunk) + sent_values(b"c", chunk)
    assert_all_settled(snapshot)
    books = snapshot["topics"][topic]
    assert books["accepted"] == books["delivered"] == len(sent)
    records = consume_all(mock_cluster.bootstrap_servers, topic, len(sent))
    values = [r.value for r in records]
    assert len(set(values)) == len(values), "a message was stored twice"
    assert set(values) <= set(sent)
    assert len(sent) - implicit_acks.messages <= len(values) <= len(sent)


#: Kafka's error code (not in ErrorCode, which lists the codes the other tests share).
OUT_OF_ORDER_SEQUENCE_NUMBER = 45


def test_a_fatal_producer_error_discards_what_it_held_and_a_new_producer_delivers(
    mock_cluster: MockCluster, unique_topic: Callable[[str], str], socket_dir: str
) -> None:
    topic = unique_topic("fatal")
    mock_cluster.create_topic(topic, 4)
    config = DaemonConfig(mock_cluster.bootstrap_servers, socket_dir)
    chunk = 1000
    with running_daemon(config) as daemon, UnixStreamSender(config.stream_path) as stream:
        stream.send_many(any_and_keyed(topic, b"a", chunk))
        wait_until(settled(daemon, topic, chunk), what="the first chunk")
        # librdkafka treats a sequence error on an idempotent producer as fatal: the
        # instance is unusable from then on.
        mock_cluster.push_request_errors(ApiKey.PRODUCE, [OUT_OF_ORDER_SEQUENCE_NUMBER])
        stream.send_many(any_and_keyed(topic, b"b", chunk))
        wait_until(settled(daemon, topic, 2 * chunk), what="the second chunk to settle")
        stream.send_many(any_and_keyed(topic, b"c", chunk))
        wait_until(settled(daemon, topic, 3 * chunk), what="the third chunk")
        snapshot = daemon.snapshot()
        counters = daemon.call(daemon.server.counters.snapshot)
    sent = sent_values(b"a", chunk) + sent_values(b"b", chunk) + sent_values(b"c", chunk)
    records = assert_every_message_accounted_for(
        snapshot, mock_cluster.bootstrap_servers, topic, sent
    )
    books = snapshot["topics"][topic]
    assert counters["producer_recreated"] == 1
    assert set(books["discarded"]) == {str(DiscardReason.KAFKA_ERROR)}
    assert 0 < books["discarded"]["kafka_error"] <= chunk
    # The replacement producer delivers everything after the failure.
    assert set(sent_values(b"c", chunk)) <= {r.value for r in records}


@pytest.mark.slow
def test_an_outage_longer_than_the_memory_budget_discards_the_excess_then_delivers(
    mock_cluster: MockCluster, unique_topic: Callable[[str], str], socket_dir: str
) -> None:
    topic = unique_topic("outage")
    mock_cluster.create_topic(topic, 4)
    config = DaemonConfig(
        mock_cluster.bootstrap_servers,
        socket_dir,
        max_buffer="64k",
        # Reconnect soon after the brokers return, rather than after up to 10 s of backoff.
        librdkafka={"reconnect.backoff.max.ms": "500"},
    )
    count = 300
    with running_daemon(config) as daemon, UnixStreamSender(config.stream_path) as stream:
        stream.send(topic, b"warm-up")
        wait_until(settled(daemon, topic, 1))
        for broker in mock_cluster.broker_ids:
            mock_cluster.broker_down(broker)
        # 300 messages of ~1 KB: several times the 64 KB budget.
        stream.send_many(
            encode_any_partition(topic, b"o%04d" % i + b"." * 1000) for i in range(count)
        )

        def all_admitted_or_refused() -> bool:
            books = daemon.snapshot()["topics"][topic]
            return books["accepted"] - 1 + books["discarded"].get("no_memory", 0) == count

        wait_until(all_admitted_or_refused, what="every message admitted or refused")
        held = daemon.snapshot()
        for broker in mock_cluster.broker_ids:
            mock_cluster.broker_up(broker)
        wait_until(settled(daemon, topic, 1), what="the held messages' delivery")
        snapshot = daemon.snapshot()
    accepted_in_outage = held["topics"][topic]["accepted"] - 1
    assert 0 < accepted_in_outage < count
    assert held["pool_used"] >= 64 * 1024
    assert snapshot["discards"]["no_memory"] == count - accepted_in_outage
    sent = [b"warm-up"] + [b"o%04d" % i + b"." * 1000 for i in range(count)]
    assert_every_message_accounted_for(snapshot, mock_cluster.bootstrap_servers, topic, sent)
    assert snapshot["topics"][topic]["delivered"] == accepted_in_outage + 1
    assert snapshot["pool_used"] == 0


class RecordingLedger:
    """A dispatch Ledger that only writes the outcomes down."""

    def __init__(self) -> None:
        self.outcomes: list[str] = []
        self.first_delivery: asyncio.Event | None = None
        self.threads: set[str] = set()  # where the outcomes were reported
        self.tokens: Counter[int] = Counter()
        self.expected = 0
        self.all_delivered: asyncio.Event | None = None  # set at ``expected`` outcomes
        self.possibly_delivered_headers: list[Any] = []

    def delivered(self, batch: Delivered) -> None:
        self.outcomes += ["delivered"] * sum(batch.by_topic.values())
        self.threads.add(threading.current_thread().name)
        self.tokens.update(batch.by_token)
        if self.all_delivered is not None and len(self.outcomes) >= self.expected:
            self.all_delivered.set()
        if self.first_delivery is not None:
            self.first_delivery.set()

    def discarded(
        self,
        reason: DiscardReason,
        topic: str,
        timestamp_ms: int,
        detail: str,
        cost: int,
        token: int,
    ) -> None:
        self.outcomes.append(str(reason))

    def possibly_delivered(
        self,
        topic: str,
        timestamp_ms: int,
        message: Any,
        detail: str,
        cost: int,
        token: int,
        headers: Any = None,
    ) -> None:
        self.outcomes.append("possibly_delivered")
        self.possibly_delivered_headers.append(headers)
        if self.all_delivered is not None and len(self.outcomes) >= self.expected:
            self.all_delivered.set()

    def left_for_next_start(self, topic: str, cost: int, token: int) -> None:
        self.outcomes.append("left_for_next_start")

    def possible_duplicate(self, topic: str, timestamp_ms: int) -> None:
        self.outcomes.append("possible_duplicate")


def test_a_poll_timer_armed_for_a_time_already_past_is_moved_on_uvloop(
    mock_cluster: MockCluster,
) -> None:
    """uvloop's call_at returns a plain Handle (no ``when()``) for a time already past; the
    next arming must still compare due times (an AttributeError here stopped the loop's
    poll in 3 of 4 broker-fault runs)."""
    dispatcher = Dispatcher(
        DeliverySettings(mock_cluster.bootstrap_servers),
        lambda topic: ProducerProfile(linger_ms=5, batch_messages=100, batch_bytes=100_000),
        Router(MetadataSnapshot.build({1: "b1"}, {})),
        RecordingLedger(),
    )
    polled = asyncio.Event()

    async def arm_in_the_past_then_again() -> None:
        loop = asyncio.get_running_loop()
        dispatcher.start(loop)
        dispatcher._arm_poll_timer(-1.0)
        dispatcher._arm_poll_timer(0.005)
        loop.call_soon(polled.set)
        await asyncio.wait_for(polled.wait(), 60)
        await dispatcher.shutdown(max_delay_s=1.0)

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(arm_in_the_past_then_again())


@pytest.mark.parametrize(
    ("already_waited_s", "outcome"),
    [(0.0, "delivered"), (3.0, str(DiscardReason.SHUTDOWN_DELAY))],
)
def test_the_shutdown_deadline_counts_from_when_shutdown_was_requested(
    mock_cluster: MockCluster,
    unique_topic: Callable[[str], str],
    already_waited_s: float,
    outcome: str,
) -> None:
    topic = unique_topic("deadline")
    mock_cluster.create_topic(topic, 1)
    router = Router(MetadataSnapshot.build({1: "b1"}, {topic: {0: 1}}))
    ledger = RecordingLedger()
    dispatcher = Dispatcher(
        DeliverySettings(mock_cluster.bootstrap_servers),
        lambda topic: ProducerProfile(linger_ms=5, batch_messages=100, batch_bytes=100_000),
        router,
        ledger,
    )

    async def send_then_shut_down() -> None:
        dispatcher.start(asyncio.get_running_loop())
        ledger.first_delivery = asyncio.Event()
        dispatcher.send(topic, 0, b"warm-up", None, 0)  # connects and gets a producer id
        await asyncio.wait_for(ledger.first_delivery.wait(), 60)
        for broker in mock_cluster.broker_ids:
            mock_cluster.set_rtt(broker, 1000)  # acknowledged 1 s after it is sent
        dispatcher.send(topic, 0, b"last", None, 0)
        requested_at = time.monotonic() - already_waited_s
        await dispatcher.shutdown(max_delay_s=3.0, requested_at=requested_at)

    asyncio.run(send_then_shut_down())
    assert ledger.outcomes == ["delivered", outcome]


def test_a_possibly_delivered_message_reaches_the_ledger_with_the_identity_it_was_sent_with(
    mock_cluster: MockCluster, unique_topic: Callable[[str], str]
) -> None:
    """A delivery report carries no headers: the identity the books list for the audit
    to look up (issue 24) is the one the message was produced with."""
    topic = unique_topic("maybe-id")
    mock_cluster.create_topic(topic, 1)
    ledger = RecordingLedger()
    dispatcher = Dispatcher(
        DeliverySettings(
            mock_cluster.bootstrap_servers,
            max_failed_delivery_attempts=1,
            replication_timeout_ms=1000,
            extra={"message.timeout.ms": "1500"},
        ),
        lambda topic: ProducerProfile(linger_ms=5, batch_messages=100, batch_bytes=100_000),
        Router(MetadataSnapshot.build({1: "b1"}, {topic: {0: 1}})),
        ledger,
    )
    identity = [("pydory-id", b"host-a/00000000000000aa/1/7")]

    async def send_into_a_hung_broker() -> None:
        dispatcher.start(asyncio.get_running_loop())
        ledger.first_delivery = asyncio.Event()
        dispatcher.send(topic, 0, b"warm-up", None, 0)
        await asyncio.wait_for(ledger.first_delivery.wait(), 60)
        ledger.expected, ledger.all_delivered = 2, asyncio.Event()
        for broker in mock_cluster.broker_ids:
            mock_cluster.set_rtt(broker, 5000)  # the request leaves; no answer in time
        dispatcher.send(topic, 0, b"maybe", None, 0, headers=identity)
        await asyncio.wait_for(ledger.all_delivered.wait(), 60)
        await dispatcher.shutdown(max_delay_s=1.0)

    asyncio.run(send_into_a_hung_broker())
    settled = [outcome for outcome in ledger.outcomes if outcome != "possible_duplicate"]
    assert settled == ["delivered", "possibly_delivered"]
    assert ledger.possibly_delivered_headers == [identity]


def test_delivery_reports_are_served_and_settled_on_the_loop_thread_in_batches(
    mock_cluster: MockCluster, unique_topic: Callable[[str], str]
) -> None:
    topic = unique_topic("on-the-loop")
    mock_cluster.create_topic(topic, 2)
    router = Router(MetadataSnapshot.build({1: "b1"}, {topic: {0: 1, 1: 1}}))
    ledger = RecordingLedger()
    dispatcher = Dispatcher(
        DeliverySettings(mock_cluster.bootstrap_servers),
        lambda topic: ProducerProfile(linger_ms=5, batch_messages=100, batch_bytes=100_000),
        router,
        ledger,
    )
    threads_while_running: set[str] = set()

    async def send_and_wait() -> None:
        dispatcher.start(asyncio.get_running_loop())
        ledger.expected, ledger.all_delivered = 200, asyncio.Event()
        for i in range(200):
            dispatcher.send(topic, i % 2, b"m%d" % i, None, 0, token=1 + i // 100)
        await asyncio.wait_for(ledger.all_delivered.wait(), 60)
        threads_while_running.update(t.name for t in threading.enumerate())
        await dispatcher.shutdown(max_delay_s=5.0)

    asyncio.run(send_and_wait())
    assert ledger.outcomes == ["delivered"] * 200
    assert ledger.threads == {threading.current_thread().name}  # asyncio.run's thread
    assert ledger.tokens == {1: 100, 2: 100}
    # No thread of pydory's own serves the producer while it runs.
    assert not {name for name in threads_while_running if name.startswith("pydory-")}


# --- the daemon as a process -------------------------------------------------------------


class StreamingClient(threading.Thread):
    """Sends numbered messages, ``slice_size`` at a time with ``pause_s`` between slices,
    until the daemon goes away (or ``limit`` is reached)."""

    def __init__(
        self,
        path: str,
        topic: str,
        limit: int = 100_000,
        slice_size: int = 50,
        pause_s: float = 0.0,
    ) -> None:
        super().__init__(daemon=True)
        self.path, self.topic, self.limit = path, topic, limit
        self.slice_size, self.pause_s = slice_size, pause_s
        self.attempted: list[bytes] = []
        self.refused: DaemonUnavailable | None = None
        self._progress = threading.Condition()

    def run(self) -> None:
        with UnixStreamSender(self.path) as stream:
            while len(self.attempted) < self.limit:
                values = [b"t%d" % (len(self.attempted) + i) for i in range(self.slice_size)]
                with self._progress:
                    self.attempted += values
                    self._progress.notify_all()
                try:
                    stream.send_many(encode_any_partition(self.topic, v) for v in values)
                except DaemonUnavailable as error:
                    self.refused = error
                    return
                time.sleep(self.pause_s)

    def wait_for(self, attempted: int, timeout_s: float = 60.0) -> bool:
        """Wait until ``attempted`` messages have been sent (or tried)."""
        with self._progress:
            return self._progress.wait_for(lambda: len(self.attempted) >= attempted, timeout_s)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("pause_s", "limit"),
    [
        pytest.param(0.005, 100_000, id="steady"),  # about 10,000 messages a second
        pytest.param(0.0, 1_000_000, id="flood"),  # as fast as the daemon takes them
    ],
)
def test_sigterm_under_load_with_slow_brokers_exits_in_time_with_every_message_reported(
    mock_cluster: MockCluster,
    unique_topic: Callable[[str], str],
    socket_dir: str,
    tmp_path: Path,
    pause_s: float,
    limit: int,
) -> None:
    topic = unique_topic("sigterm")
    mock_cluster.create_topic(topic, 4)
    shutdown_max_delay_s = 2
    config = DaemonConfig(
        mock_cluster.bootstrap_servers,
        socket_dir,
        shutdown_max_delay_ms=shutdown_max_delay_s * 1000,
    )
    daemon = DaemonProcess(
        config,
        tmp_path / "pydory.xml",
        tmp_path / "pydory.log",
        wait_ready=False,
        arguments=["--log-stderr"],
    )
    try:
        daemon.wait_ready(metadata=False)  # the inputs are open
        assert stat.S_ISSOCK(os.stat(config.stream_path).st_mode)
        client = StreamingClient(config.stream_path, topic, limit=limit, pause_s=pause_s)
        client.start()
        assert client.wait_for(2000)
        # Every broker now answers after 2.5 s: more than shutdownMaxDelay, so whatever
        # is in flight at SIGTERM cannot be acknowledged in time and must be reported.
        for broker in mock_cluster.broker_ids:
            mock_cluster.set_rtt(broker, 2500)
        assert client.wait_for(len(client.attempted) + 10_000)
        with SchedulingDelay() as lateness:
            daemon.process.send_signal(signal.SIGTERM)
            exit_status = daemon.process.wait(timeout=600)  # a safety net only
        # The contract, on the daemon's own clock (its log lines), with a margin
        # that grows with how late the machine runs (a runner at load 50 is slow).
        stop_s = shutdown_span_s(daemon.log_path.read_text().splitlines())
        assert stop_s <= shutdown_max_delay_s + lateness.margin_s(), daemon.log_path.read_text()
        client.join(timeout=60)
    finally:
        daemon.kill()
    output = daemon.log_path.read_text()
    assert exit_status == 0, output
    assert client.refused is not None, "the client never noticed the daemon stopping"
    assert not Path(config.stream_path).exists()
    assert not Path(config.datagram_path).exists()
    matches = [m for m in map(TOTALS_LINE.search, output.splitlines()) if m]
    assert len(matches) == 1, output
    totals = matches[0]
    assert totals["topic"] == topic
    accepted, delivered = int(totals["accepted"]), int(totals["delivered"])
    possibly = int(totals["possibly"])
    discards = dict(DISCARD_COUNTS.findall(totals["discarded"]))
    assert (int(totals["in_flight"]), int(totals["left"])) == (0, 0)  # no spool here
    assert set(discards) <= {str(DiscardReason.SHUTDOWN_DELAY)}
    shutdown_discards = int(discards.get(str(DiscardReason.SHUTDOWN_DELAY), 0))
    assert shutdown_discards + possibly > 0
    assert accepted == delivered + possibly + shutdown_discards
    assert 10_000 <= accepted <= len(client.attempted)
    for broker in mock_cluster.broker_ids:
        mock_cluster.set_rtt(broker, 0)
    records = consume_all(mock_cluster.bootstrap_servers, topic, delivered)
    values = [r.value for r in records]
    assert len(set(values)) == len(values), "a message was stored twice"
    assert set(values) <= set(client.attempted)
    # Messages purged while in flight may have been written (the broker only answered
    # late): they are possibly delivered, never shutdown_delay discards. Kafka holds every
    # delivered message and at most the possibly delivered ones besides.
    assert delivered <= len(values) <= delivered + possibly


def test_a_config_error_stops_the_daemon_naming_the_element_and_line(
    mock_cluster: MockCluster, socket_dir: str, tmp_path: Path
) -> None:
    config = DaemonConfig(mock_cluster.bootstrap_servers, socket_dir)
    text = config.render().replace(
        '<sizeThresholdPercent value="75" />', '<sizeThresholdPercent value="175" />'
    )
    line = 1 + text.splitlines().index('        <sizeThresholdPercent value="175" />')
    config_path = tmp_path / "bad.xml"
    config_path.write_text(text, encoding="ascii")
    result = subprocess.run(
        [sys.executable, "-m", "pydory", "serve", "--config-path", str(config_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    assert f"(line {line}, column 9)" in result.stderr
    assert "/doryConfig/compression/sizeThresholdPercent" in result.stderr
    assert "175" in result.stderr
    assert not Path(config.stream_path).exists()
    assert not Path(config.datagram_path).exists()
