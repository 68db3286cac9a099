"""The books leave the host with the data, and survive a SIGKILL (issue 24, item 3), on
Apache Kafka: a spooled daemon is SIGKILLed mid-stream and restarted; the books topic
then holds the killed run's books, rebuilt by the next start from its spool, and the
next run's, final after its clean stop. Per topic the killed run balances (accepted =
delivered + possibly delivered + discarded + handed over to the next start), the next
run replayed exactly what was handed over, and the lake's view agrees: the distinct
identities of the killed run in Kafka are exactly what it accepted."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource

from daemon_process import DaemonProcess
from helpers import wait_until
from pydory_tools.testing.daemon_config import DaemonConfig
from pydory_tools.testing.kafka_broker import KafkaCluster
from test_spool_acks_kafka import Stream, delivered_at_least, read_topic

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def books_records(bootstrap: str, topic: str) -> dict[str, dict[str, Any]]:
    """The books topic as compaction leaves it: the latest record per key."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "pydory-test-books",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    latest: dict[str, dict[str, Any]] = {}
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        while True:
            message = consumer.poll(30)
            assert message is not None, "the books topic was not read to its end in time"
            error = message.error()
            if error is not None:
                assert error.code() == KafkaError._PARTITION_EOF, error
                return latest
            key = (message.key() or b"").decode()
            latest[key] = json.loads(message.value() or b"null")
    finally:
        consumer.close()


def in_flight(daemon: DaemonProcess, topic: str) -> int:
    """The messages of ``topic`` the daemon accepted and has no outcome for yet."""
    topics = {t["topic"]: t for t in daemon.books()["topics"]}
    return int(topics.get(topic, {}).get("in_flight", 0))


def test_a_sigkilled_runs_books_are_rebuilt_and_published_with_the_next_ones(
    kafka_broker: KafkaCluster, unique_topic: Any, tmp_path: Path
) -> None:
    topic = unique_topic("books-data")
    books_topic = unique_topic("books")
    kafka_broker.create_topic(topic, 4)
    kafka_broker.create_topic(books_topic, 1, config={"cleanup.policy": "compact"})
    config = DaemonConfig(
        kafka_broker.bootstrap_servers,
        str(tmp_path),
        spool_path=str(tmp_path / "spool"),
        host_id="host-a",
        books_topic=books_topic,
        # Batches held a second in librdkafka: while the client sends, the daemon always
        # has messages in flight, however the machine schedules the two processes.
        batching_time_ms=1000,
    )
    killed = DaemonProcess(config, tmp_path / "pydory.xml", tmp_path / "daemon.log")
    stream = Stream(config.stream_path, topic, 0)
    try:
        stream.start()
        wait_until(delivered_at_least(killed, topic, 10_000), 120, "10,000 delivered")
        wait_until(lambda: in_flight(killed, topic) > 0, 120, "messages in flight")
    finally:
        killed.kill()  # mid-stream: the client is still sending
        stream.stopped.set()
        stream.join(timeout=60)
    restarted = DaemonProcess(config, tmp_path / "pydory.xml", tmp_path / "daemon.log")
    try:
        wait_until(
            lambda: restarted.page("commit_point/json?after=now&timeout=30")["passed"],
            120,
            "the replayed messages to settle",
        )
    finally:
        assert restarted.stop() == 0

    records = books_records(kafka_broker.bootstrap_servers, books_topic)
    assert len(records) == 2, sorted(records)
    first, second = sorted(records.values(), key=lambda r: r["started_ms"])
    assert first["host"] == second["host"] == "host-a"
    assert list(records) == [f"host-a/{r['incarnation']}" for r in records.values()]
    assert (first["final"], first["ended"]) == (True, "rebuilt_after_crash")
    assert (second["final"], second["ended"]) == (True, "clean")
    assert second["previous_incarnation"] == first["incarnation"]

    books = first["topics"][topic]
    handed_over = books["handed_over"]
    assert handed_over > 0, "the SIGKILL came with nothing in flight: nothing tested"
    assert books["accepted"] == (
        books["delivered"]
        + books["possibly_delivered"]
        + sum(books["discarded"].values())
        + handed_over
    )
    assert books["delivered"] >= 10_000 - handed_over
    assert second["replayed_from"] == {first["incarnation"]: {topic: handed_over}}
    assert second["topics"][topic]["replayed"] == handed_over
    assert second["topics"][topic]["in_flight"] == 0

    # What the lake would land: every message the killed run accepted, once by identity.
    killed_ids = {
        identity
        for _, identity in read_topic(kafka_broker.bootstrap_servers, topic)
        if identity is not None and identity.split(b"/")[1] == first["incarnation"].encode()
    }
    assert len(killed_ids) == books["accepted"]


def test_with_topic_autocreate_the_daemon_creates_the_books_topic_compacted(
    kafka_broker: KafkaCluster, unique_topic: Any, tmp_path: Path
) -> None:
    books_topic = unique_topic("books-created")
    config = DaemonConfig(
        kafka_broker.bootstrap_servers,
        str(tmp_path),
        spool_path=str(tmp_path / "spool"),
        host_id="host-b",
        books_topic=books_topic,
        topic_autocreate=True,
    )
    daemon = DaemonProcess(config, tmp_path / "pydory.xml", tmp_path / "daemon.log")
    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap_servers})
    try:
        wait_until(
            lambda: books_topic in admin.list_topics(timeout=60).topics, 60, "the books topic"
        )
    finally:
        assert daemon.stop() == 0
    resource = ConfigResource(ConfigResource.Type.TOPIC, books_topic)
    described = admin.describe_configs([resource])[resource].result(timeout=60)
    assert described["cleanup.policy"].value == "compact"
    (record,) = books_records(kafka_broker.bootstrap_servers, books_topic).values()
    assert (record["host"], record["final"], record["ended"]) == ("host-b", True, "clean")
