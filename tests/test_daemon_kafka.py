"""The daemon's main path on Apache Kafka itself: what a user's cluster does, not a double.

Every test runs a real daemon against the session's single-node broker (``kafka_broker``:
PLAINTEXT, SASL_PLAINTEXT with ACLs, SSL) and reads the records back from Kafka. The
faults only librdkafka's mock cluster can inject are in test_daemon.py and
test_daemon_faults.py.
"""

from __future__ import annotations

import struct
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import pytest
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

import producer_backends
from helpers import assert_balanced, settled, wait_until
from pydory.client import DatagramSender, TcpSender, UnixStreamSender
from pydory.client.messages import now_ms
from pydory.daemon.delivery.router import ANY_PARTITION_RUN
from pydory.status.discards import discard_report_json
from pydory.wire import encode_any_partition
from pydory_tools.testing.daemon import DaemonConfig, RunningDaemon, running_daemon
from pydory_tools.testing.kafka_broker import KafkaCluster, SaslUser
from pydory_tools.testing.kafka_util import ConsumedRecord, consume_all
from pydory_tools.testing.pytest_plugin import KAFKA_SASL_USERS

# Every test on both producer backends (the compiled one and confluent-kafka's).
producer_backend = producer_backends.module_fixture()

pytestmark = [pytest.mark.kafka, pytest.mark.slow, pytest.mark.timeout(120)]

PARTITIONS = 4
ALICE, MALLORY = KAFKA_SASL_USERS
# Record batch v2 (the only format Kafka 4 writes): baseOffset int64, batchLength int32,
# partitionLeaderEpoch int32, magic int8, crc uint32, attributes int16 (codec: low 3 bits).
BATCH_HEADER = struct.Struct(">qiibIh")
CODEC_IDS = {"gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


@dataclass(frozen=True)
class Sent:
    """One message a test handed to the daemon, to compare with what Kafka holds."""

    value: bytes
    key: bytes
    timestamp_ms: int
    partition_key: int | None = None


@pytest.fixture
def socket_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    # UNIX socket paths are limited to ~108 bytes: keep them short.
    return str(tmp_path_factory.mktemp("s", numbered=True))


@pytest.fixture
def topic(kafka_broker: KafkaCluster, unique_topic: Callable[[str], str]) -> str:
    name = unique_topic("daemon-kafka")
    kafka_broker.create_topic(name, PARTITIONS)
    return name


def sasl_login(user: SaslUser) -> dict[str, str]:
    """librdkafka properties that log in as ``user`` over SASL/PLAIN."""
    return {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.username": user.name,
        "sasl.password": user.password,
    }


def grant(
    kafka_broker: KafkaCluster, topic: str, user: SaslUser, operations: Iterable[AclOperation]
) -> None:
    """Allow ``user`` ``operations`` on ``topic``, as the super user over SASL.

    Returns once the broker's authorizer lists the ACLs (it applies them from the
    metadata log, a moment after the controller accepted them).
    """
    admin = AdminClient(
        {
            "bootstrap.servers": kafka_broker.sasl_bootstrap_servers,
            **sasl_login(kafka_broker.admin_user),
        }
    )
    bindings = [
        AclBinding(
            ResourceType.TOPIC,
            topic,
            ResourcePatternType.LITERAL,
            f"User:{user.name}",
            "*",
            operation,
            AclPermissionType.ALLOW,
        )
        for operation in operations
    ]
    for future in admin.create_acls(bindings).values():
        future.result(timeout=60)
    acls_of_topic = AclBindingFilter(
        ResourceType.TOPIC,
        topic,
        ResourcePatternType.LITERAL,
        None,
        None,
        AclOperation.ANY,
        AclPermissionType.ANY,
    )
    wait_until(
        lambda: set(bindings) <= set(admin.describe_acls(acls_of_topic).result(timeout=60)),
        what=f"the ACLs on {topic}",
    )


def read_back(kafka_broker: KafkaCluster, topic: str, expected: int) -> list[ConsumedRecord]:
    """Every record of ``topic``, read over PLAINTEXT (a super user: no ACLs apply)."""
    return consume_all(kafka_broker.bootstrap_servers, topic, expected)


def stored_codecs(kafka_broker: KafkaCluster, topic: str) -> Counter[int]:
    """Batches per compression codec id in the broker's log segments of ``topic``.

    Reads the segment files directly: the launcher keeps each node's log.dirs at
    ``<base_dir>/node-<id>/data``, and an appended batch is in the file (page cache) at
    once, flushed or not.
    """
    codecs: Counter[int] = Counter()
    segments = sorted(kafka_broker.base_dir.glob(f"node-*/data/{topic}-*/*.log"))
    assert segments, f"no log segment of {topic} under {kafka_broker.base_dir}"
    for segment in segments:
        codecs.update(_batch_codecs(segment.read_bytes()))
    return codecs


def _batch_codecs(segment: bytes) -> Iterable[int]:
    position = 0
    while position + BATCH_HEADER.size <= len(segment):
        _base_offset, length, _epoch, magic, _crc, attributes = BATCH_HEADER.unpack_from(
            segment, position
        )
        assert magic == 2, f"record batch format v{magic}"
        yield attributes & 0x7
        position += 12 + length  # the length counts the bytes after itself


def delivered_everything(daemon: RunningDaemon, topic: str, expected: int) -> None:
    """Wait until ``expected`` messages of ``topic`` settled; assert they were all delivered."""
    wait_until(settled(daemon, topic, expected), what=f"{expected} deliveries to {topic}")
    snapshot = daemon.snapshot()
    books = snapshot["topics"][topic]
    assert books["accepted"] == books["delivered"] == expected, books
    assert books["discarded"] == {}
    assert snapshot["pool_used"] == 0
    assert_balanced(snapshot)


# -- the main path -----------------------------------------------------------------------


def test_every_transport_delivers_topic_key_value_and_timestamp(
    kafka_broker: KafkaCluster, topic: str, socket_dir: str
) -> None:
    # Ten minutes ago: clearly not a time librdkafka or the broker would stamp, and recent
    # enough that time-based retention leaves the records alone.
    base_ms = now_ms() - 600_000
    # PartitionKey is taken as unsigned 32-bit: -1 is 2**32 - 1, on partition 3 of 4.
    partition_keys = [0, 1, 2, 3, 5, 6, 11, 2**31, 2**32 - 1, -1]
    sent: dict[str, list[Sent]] = {
        transport: [
            Sent(
                b"%s-%d" % (transport.encode(), i),
                b"key-%d" % i if i % 3 else b"",  # some without a key
                base_ms + i,
                partition_keys[i % len(partition_keys)] if i % 2 else None,
            )
            for i in range(40)
        ]
        for transport in ("unix_dgram", "unix_stream", "tcp")
    }
    config = DaemonConfig(kafka_broker.bootstrap_servers, socket_dir)
    with running_daemon(config) as daemon:
        senders = {
            "unix_dgram": DatagramSender(config.datagram_path),
            "unix_stream": UnixStreamSender(config.stream_path),
            "tcp": TcpSender(daemon.tcp_port),
        }
        for transport, sender in senders.items():
            with sender:
                for m in sent[transport]:
                    sender.send(
                        topic,
                        m.value,
                        key=m.key,
                        partition_key=m.partition_key,
                        timestamp_ms=m.timestamp_ms,
                    )
        delivered_everything(daemon, topic, 120)
        assert daemon.snapshot()["received"] == {"unix_dgram": 40, "unix_stream": 40, "tcp": 40}

    records = read_back(kafka_broker, topic, 120)
    by_value = {r.value: r for r in records}
    assert len(records) == len(by_value) == 120  # each message once
    for m in (m for messages in sent.values() for m in messages):
        record = by_value[m.value]
        assert record.topic == topic
        assert record.key == (m.key or None)  # an empty key is sent as no key
        assert record.timestamp_ms == m.timestamp_ms, m
        if m.partition_key is not None:
            # Dory's rule: partitions sorted ascending, unsigned key % count.
            assert record.partition == (m.partition_key & 0xFFFFFFFF) % PARTITIONS, m


def test_any_partition_spreads_over_every_partition(
    kafka_broker: KafkaCluster, topic: str, socket_dir: str
) -> None:
    config = DaemonConfig(kafka_broker.bootstrap_servers, socket_dir)
    with running_daemon(config) as daemon, UnixStreamSender(config.stream_path) as stream:
        stream.send_many(encode_any_partition(topic, b"v%d" % i) for i in range(2000))
        delivered_everything(daemon, topic, 2000)
    per_partition = Counter(r.partition for r in read_back(kafka_broker, topic, 2000))
    assert set(per_partition) == set(range(PARTITIONS))
    # Runs of ANY_PARTITION_RUN messages per partition, round robin: at most a run apart.
    spread = max(per_partition.values()) - min(per_partition.values())
    assert spread <= ANY_PARTITION_RUN, per_partition
    assert sum(per_partition.values()) == 2000


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_every_codec_is_stored_compressed_and_read_back_intact(
    kafka_broker: KafkaCluster, unique_topic: Callable[[str], str], socket_dir: str, codec: str
) -> None:
    topic = unique_topic(f"codec-{codec}")
    kafka_broker.create_topic(topic, 1)
    values = [b"%s %d " % (codec.encode(), i) * 50 for i in range(300)]  # compressible
    config = DaemonConfig(kafka_broker.bootstrap_servers, socket_dir, compression=codec)
    with running_daemon(config) as daemon, UnixStreamSender(config.stream_path) as stream:
        stream.send_many(encode_any_partition(topic, value, b"k") for value in values)
        delivered_everything(daemon, topic, len(values))
    records = read_back(kafka_broker, topic, len(values))
    assert [r.value for r in records] == values
    assert all(r.key == b"k" for r in records)
    # The broker kept the producer's compression (the topic's compression.type=producer).
    assert set(stored_codecs(kafka_broker, topic)) == {CODEC_IDS[codec]}


# -- topics that do not exist ---------------------------------------------------------------


def test_autocreate_creates_the_topic_and_delivers(
    kafka_broker: KafkaCluster, unique_topic: Callable[[str], str], socket_dir: str
) -> None:
    topic = unique_topic("autocreated")
    config = DaemonConfig(kafka_broker.bootstrap_servers, socket_dir, topic_autocreate=True)
    with running_daemon(config) as daemon, UnixStreamSender(config.stream_path) as stream:
        stream.send_many(encode_any_partition(topic, b"new %d" % i) for i in range(20))
        delivered_everything(daemon, topic, 20)
        assert daemon.snapshot()["discards"]["bad_topic"] == 0
    # Held until the topic existed, then sent in the order received (one partition).
    assert [r.value for r in read_back(kafka_broker, topic, 20)] == [
        b"new %d" % i for i in range(20)
    ]


def test_without_autocreate_an_unknown_topic_is_a_bad_topic_discard(
    kafka_broker: KafkaCluster, topic: str, unique_topic: Callable[[str], str], socket_dir: str
) -> None:
    missing = unique_topic("never-created")
    config = DaemonConfig(kafka_broker.bootstrap_servers, socket_dir)
    with running_daemon(config) as daemon, UnixStreamSender(config.stream_path) as stream:
        stream.send(missing, b"nowhere to go")
        stream.send(topic, b"a topic that exists")
        delivered_everything(daemon, topic, 1)
        wait_until(lambda: daemon.snapshot()["discards"]["bad_topic"] == 1)
        report = daemon.call(lambda: discard_report_json(daemon.server.books.discard_report()))
        assert missing not in daemon.snapshot()["topics"]
    assert report["unfinished_report"]["recent_bad_topic"] == [missing]
    # Nor did the daemon's metadata requests create it.
    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap_servers})
    assert missing not in admin.list_topics(timeout=60).topics


# -- the broker's refusals -----------------------------------------------------------------


def test_a_record_over_the_topics_max_message_bytes_is_a_kafka_error_discard(
    kafka_broker: KafkaCluster, unique_topic: Callable[[str], str], socket_dir: str
) -> None:
    topic = unique_topic("small-records")
    kafka_broker.create_topic(topic, 1, config={"max.message.bytes": "1000"})
    refused_at_ms = now_ms() - 600_000
    # messageMaxBytes (the daemon's own limit) is far above the topic's: the broker refuses.
    config = DaemonConfig(kafka_broker.bootstrap_servers, socket_dir, message_max_bytes=100_000)
    with running_daemon(config) as daemon, UnixStreamSender(config.stream_path) as stream:
        stream.send(topic, b"x" * 5000, timestamp_ms=refused_at_ms)
        wait_until(
            lambda: (
                daemon.snapshot()["topics"].get(topic, {}).get("discarded") == {"kafka_error": 1}
            )
        )
        # Alone: a smaller record in the same batch would be refused with it.
        stream.send(topic, b"small enough")
        wait_until(settled(daemon, topic, 2))
        snapshot = daemon.snapshot()
        counters = daemon.call(daemon.server.counters.snapshot)
        report = daemon.call(lambda: discard_report_json(daemon.server.books.discard_report()))
    assert snapshot["topics"][topic]["delivered"] == 1
    assert snapshot["pool_used"] == 0
    assert_balanced(snapshot)
    assert counters["discarded_kafka_error_MSG_SIZE_TOO_LARGE"] == 1
    current = report["unfinished_report"]
    assert current["kafka_error_discards"] == {"MSG_SIZE_TOO_LARGE": 1}
    # The discard report carries the client's timestamp (a failed delivery report has none).
    assert current["discard_topic"] == [
        {
            "topic": topic,
            "min_timestamp": refused_at_ms,
            "max_timestamp": refused_at_ms,
            "count": 1,
        }
    ]
    assert [r.value for r in read_back(kafka_broker, topic, 1)] == [b"small enough"]


def sasl_daemon_config(kafka_broker: KafkaCluster, socket_dir: str, user: SaslUser) -> DaemonConfig:
    return DaemonConfig(
        kafka_broker.sasl_bootstrap_servers, socket_dir, librdkafka=sasl_login(user)
    )


def test_a_user_without_write_permission_is_refused_by_the_broker(
    kafka_broker: KafkaCluster, topic: str, socket_dir: str
) -> None:
    # mallory may read the topic (which lets her describe it) but not write to it.
    grant(kafka_broker, topic, ALICE, [AclOperation.WRITE, AclOperation.DESCRIBE])
    grant(kafka_broker, topic, MALLORY, [AclOperation.READ])
    config = sasl_daemon_config(kafka_broker, socket_dir, MALLORY)
    with running_daemon(config) as daemon, UnixStreamSender(config.stream_path) as stream:
        stream.send(topic, b"from mallory", partition_key=1)
        stream.send(topic, b"from mallory again")
        wait_until(settled(daemon, topic, 2), what="mallory's messages to settle")
        snapshot = daemon.snapshot()
        counters = daemon.call(daemon.server.counters.snapshot)
    assert snapshot["topics"][topic]["discarded"] == {"kafka_error": 2}
    assert snapshot["topics"][topic]["delivered"] == 0
    assert snapshot["pool_used"] == 0
    assert counters["discarded_kafka_error_TOPIC_AUTHORIZATION_FAILED"] == 2

    alice = sasl_daemon_config(kafka_broker, socket_dir, ALICE)
    with running_daemon(alice) as daemon, UnixStreamSender(alice.stream_path) as stream:
        stream.send(topic, b"from alice", partition_key=1)
        delivered_everything(daemon, topic, 1)
    assert [(r.value, r.partition) for r in read_back(kafka_broker, topic, 1)] == [
        (b"from alice", 1)
    ]


def test_a_topic_the_user_may_not_describe_is_refused_at_once(
    kafka_broker: KafkaCluster, topic: str, socket_dir: str
) -> None:
    # The topic has ACLs (alice's), none for mallory: Kafka leaves it out of her metadata,
    # and answers her request to create it with TOPIC_AUTHORIZATION_FAILED.
    grant(kafka_broker, topic, ALICE, [AclOperation.WRITE, AclOperation.DESCRIBE])
    config = sasl_daemon_config(kafka_broker, socket_dir, MALLORY)
    config.topic_autocreate = True
    started = time.monotonic()
    with running_daemon(config) as daemon, UnixStreamSender(config.stream_path) as stream:
        # Metadata without the topic is still metadata: start-up does not wait for it.
        assert time.monotonic() - started < 45  # far below start()'s wait for a topic (60 s)
        stream.send(topic, b"invisible to mallory")
        # A refusal, not a topic still being created: no waiting for it to appear.
        wait_until(lambda: daemon.snapshot()["discards"]["bad_topic"] == 1, timeout_s=60)
        snapshot = daemon.snapshot()
    assert topic not in snapshot["topics"]
    assert snapshot["pool_used"] == 0
    assert read_back(kafka_broker, topic, 0) == []


# -- TLS and SASL ------------------------------------------------------------------------


def produce_and_read_back(
    kafka_broker: KafkaCluster, topic: str, config: DaemonConfig, label: bytes
) -> None:
    """Send 50 messages through the daemon ``config`` describes; they all reach ``topic``."""
    values = [b"%s %d" % (label, i) for i in range(50)]
    with running_daemon(config) as daemon, TcpSender(daemon.tcp_port) as tcp:
        for i, value in enumerate(values):
            tcp.send(topic, value, partition_key=i)
        delivered_everything(daemon, topic, len(values))
    records = read_back(kafka_broker, topic, len(values))
    assert sorted(r.value for r in records) == sorted(values)
    assert all(r.partition == int(r.value.split()[-1]) % PARTITIONS for r in records)


def test_tls_main_path(kafka_broker: KafkaCluster, topic: str, socket_dir: str) -> None:
    assert kafka_broker.ca_path is not None
    tls = {"security.protocol": "SSL", "ssl.ca.location": str(kafka_broker.ca_path)}
    config = DaemonConfig(kafka_broker.ssl_bootstrap_servers, socket_dir, librdkafka=tls)
    produce_and_read_back(kafka_broker, topic, config, b"over tls")


def test_sasl_plain_main_path(kafka_broker: KafkaCluster, topic: str, socket_dir: str) -> None:
    grant(kafka_broker, topic, ALICE, [AclOperation.WRITE, AclOperation.DESCRIBE])
    config = sasl_daemon_config(kafka_broker, socket_dir, ALICE)
    produce_and_read_back(kafka_broker, topic, config, b"over sasl")
