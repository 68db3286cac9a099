"""SIGKILL mid-stream on Apache Kafka: the replay resends only what was not acknowledged,
under the identity its first send carried (issue 24, items 1 and 2).

A client streams numbered messages into a spooled daemon; once most of them are
delivered, the daemon is SIGKILLed while the stream flows, and restarted (``KILLS``
times). Then every message the daemon had accepted (what each post-kill spool holds, and
what Kafka already had) must be in Kafka, every record with its ``pydory-id`` header,
both copies of a message resent under the same identity, and the second copies few (a
generous bound here; the measured figure is in BENCHMARKS.md: run with
``PYDORY_ACK_KILLS=5 ... -s`` to print it).

Imports only what pydory had before issue 24, so that the same test runs against an
older tree (``PYTHONPATH=<old>/src``): there it fails, on the missing header and on the
second copies of whole replayed segments.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from daemon_process import DaemonProcess
from helpers import wait_until
from pydory import wire
from pydory.daemon.spool.records import HEADER_BYTES, decode_records
from pydory.wire import encode_any_partition
from pydory_tools.testing.daemon_config import DaemonConfig
from pydory_tools.testing.kafka_broker import KafkaCluster

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

IDENTITY_HEADER = "pydory-id"
KILLS = int(os.environ.get("PYDORY_ACK_KILLS", "2"))
PER_RUN = 15_000  # messages delivered in a run before its SIGKILL
_SEND_FLAGS = getattr(socket, "MSG_NOSIGNAL", 0)


class Stream(threading.Thread):
    """Sends ``value(n)`` for n = first, first+1, ... on one UNIX stream connection, at
    most ``rate`` a second, until stopped or the daemon goes away."""

    def __init__(self, path: str, topic: str, first: int, rate: int = 20_000) -> None:
        super().__init__(daemon=True)
        self.path, self.topic, self.next, self.rate = path, topic, first, rate
        self.stopped = threading.Event()

    def run(self) -> None:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(self.path)
            started, sent = time.monotonic(), 0
            while not self.stopped.is_set():
                chunk = b"".join(
                    encode_any_partition(self.topic, value(n))
                    for n in range(self.next, self.next + 200)
                )
                try:
                    sock.sendall(chunk, _SEND_FLAGS)
                except OSError:
                    return  # the daemon died: the rest of the chunk may be lost, unaccepted
                self.next += 200
                sent += 200
                ahead = sent / self.rate - (time.monotonic() - started)
                if ahead > 0:
                    time.sleep(ahead)


def delivered(daemon: DaemonProcess, topic: str) -> int:
    books = daemon.books()["topics"]
    return sum(int(t["delivered"]) for t in books if t["topic"] == topic)


def delivered_at_least(daemon: DaemonProcess, topic: str, count: int) -> Callable[[], bool]:
    return lambda: delivered(daemon, topic) >= count


def value(n: int) -> bytes:
    return b"v%09d" % n


def spool_values(spool_dir: Path) -> set[bytes]:
    """The messages the segments hold (read-only: what the dead daemon had accepted and
    not deleted), as their values."""
    found = set()
    for path in spool_dir.glob("segment-*.spool"):
        data = path.read_bytes()
        records, _, _ = decode_records(data[HEADER_BYTES:])
        found.update(wire.decode(record.value).value for record in records)
    return found


def read_topic(bootstrap: str, topic: str) -> list[tuple[bytes, bytes | None]]:
    """Every record of ``topic``: its value and its identity header (None: none)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "pydory-test-acks",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    records: list[tuple[bytes, bytes | None]] = []
    try:
        partitions = sorted(consumer.list_topics(topic, timeout=60).topics[topic].partitions)
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        at_end: set[int] = set()
        deadline = time.monotonic() + 120
        while at_end != set(partitions) and time.monotonic() < deadline:
            for message in consumer.consume(10_000, timeout=1):
                error = message.error()
                if error is not None:
                    assert error.code() == KafkaError._PARTITION_EOF, error
                    at_end.add(message.partition() or 0)
                    continue
                at_end.discard(message.partition() or 0)
                headers = dict(message.headers() or [])
                identity = headers.get(IDENTITY_HEADER)
                records.append((message.value() or b"", identity))
        assert at_end == set(partitions), "not read to the end in time"
    finally:
        consumer.close()
    return records


def test_a_sigkill_mid_stream_replays_few_and_each_under_its_first_identity(
    kafka_broker: KafkaCluster, unique_topic: Any, tmp_path: Path
) -> None:
    topic = unique_topic("acks")
    kafka_broker.create_topic(topic, 4)
    spool_dir = tmp_path / "spool"
    config = DaemonConfig(kafka_broker.bootstrap_servers, str(tmp_path), spool_path=str(spool_dir))
    accepted: set[bytes] = set()
    next_number = 0
    for run in range(KILLS):
        daemon = DaemonProcess(config, tmp_path / "pydory.xml", tmp_path / "daemon.log")
        stream = Stream(config.stream_path, topic, next_number)
        try:
            stream.start()

            wait_until(
                delivered_at_least(daemon, topic, PER_RUN),
                120,
                f"run {run}: {PER_RUN} delivered",
            )
        finally:
            daemon.kill()  # mid-stream: the client is still sending
            stream.stopped.set()
            stream.join(timeout=60)
        accepted |= spool_values(spool_dir)
        next_number = stream.next + 1_000_000  # a fresh range: no value sent twice
    restarted = DaemonProcess(config, tmp_path / "pydory.xml", tmp_path / "daemon.log")
    try:
        wait_until(
            lambda: restarted.page("commit_point/json?after=now&timeout=30")["passed"],
            120,
            "the replayed messages to settle",
        )
    finally:
        assert restarted.stop() == 0
    records = read_topic(kafka_broker.bootstrap_servers, topic)
    values = [v for v, _ in records]
    second_copies = len(values) - len(set(values))
    print(
        f"\n{KILLS} SIGKILLs mid-stream: {len(records)} records in Kafka, "
        f"{second_copies} second copies ({100 * second_copies / len(records):.2f} %)"
    )
    assert accepted <= set(values), "an accepted message is missing from Kafka"
    assert all(identity is not None for _, identity in records), "a record with no identity"
    identities: dict[bytes, set[bytes | None]] = defaultdict(set)
    names: dict[bytes | None, set[bytes]] = defaultdict(set)
    for v, identity in records:
        identities[v].add(identity)
        names[identity].add(v)
    assert all(len(ids) == 1 for ids in identities.values()), "a copy under another identity"
    assert all(len(vs) == 1 for vs in names.values()), "one identity for two messages"
    assert second_copies <= 0.10 * len(records)
