"""Issue 21 item 1: 10^5 distinct topic names from clients against a real ``pydory serve``
on the mock cluster. The books keep records for at most ``maxUnknownTopics`` (1,000 by
default) names Kafka does not have and count the rest under ``(other)``; every count
still adds up; a ``/metrics`` scrape does not hold back a message sent meanwhile.

The names come in three kinds, in turn: a legal name Kafka does not have (``bad_topic``),
the same with a value over ``messageMaxBytes`` (``too_long``: judged before the topic is
looked up, so it is the kind that gets per-topic records), and a 250-byte name Kafka
refuses (``bad_topic`` at decoding). Sent as datagrams on a blocking socket, so the
daemon's reading paces the sender.
"""

from __future__ import annotations

import socket
import statistics
import struct
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from prometheus_client.parser import text_string_to_metric_families

from daemon_process import DaemonProcess
from helpers import discarded_after_acceptance, wait_until
from pydory.daemon.books.accounting import DEFAULT_UNKNOWN_TOPIC_LIMIT, OTHER_TOPICS
from pydory.wire import encode_any_partition
from pydory_tools.testing.daemon_config import DaemonConfig
from pydory_tools.testing.mock_cluster import MockCluster

NAMES = 100_000
CANARY = "canary"
MESSAGE_MAX_BYTES = 1000
SMALL = b"v" * 20
TOO_LONG = b"x" * MESSAGE_MAX_BYTES
#: A canary sent during scrapes may take this many times the idle one ...
LATENCY_RATIO = 10
#: ... where the idle one counts as at least this much (a fast idle must not make a
#: busy 2-core machine's ordinary jitter fail the test).
IDLE_FLOOR_S = 0.1
#: The daemon's resident memory may grow this much over the flood and the scrapes (the
#: old books grew by over 100 MB).
RSS_GROWTH_LIMIT_MB = 40


def raw_any_partition(topic: bytes, value: bytes) -> bytes:
    """AnyPartition bytes for any topic, one Kafka refuses included (the client won't)."""
    head = struct.pack(">ihhhh", 28 + len(topic) + len(value), 256, 0, 0, len(topic))
    return head + topic + struct.pack(">qi", 0, 0) + struct.pack(">i", len(value)) + value


def name_message(i: int) -> bytes:
    kind = i % 3
    if kind == 0:
        return encode_any_partition(f"unknown.{i}", SMALL)
    if kind == 1:
        return encode_any_partition(f"toolong.{i}", TOO_LONG)
    return raw_any_partition(f"n{i}".ljust(250, "x").encode(), SMALL)


class Canary:
    """Sends a message to ``canary`` and times it until a consumer reads it back."""

    def __init__(self, bootstrap: str, datagram_path: str) -> None:
        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": "canary",
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 5,
            }
        )
        low, _ = self._consumer.get_watermark_offsets(TopicPartition(CANARY, 0), timeout=60)
        self._consumer.assign([TopicPartition(CANARY, 0, low)])
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._socket.connect(datagram_path)

    def send_and_time(self) -> float:
        sent = time.monotonic()
        self._socket.send(encode_any_partition(CANARY, b"tweet"))
        deadline = sent + 60
        while time.monotonic() < deadline:
            record = self._consumer.poll(0.05)
            if record is not None and record.error() is None:
                return time.monotonic() - sent
        raise AssertionError("the canary never reached Kafka")

    def close(self) -> None:
        self._socket.close()
        self._consumer.close()


@pytest.fixture
def serve(
    mock_cluster: MockCluster, tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> Iterator[tuple[DaemonProcess, DaemonConfig]]:
    mock_cluster.create_topic(CANARY, 1)
    socket_dir = str(tmp_path_factory.mktemp("tc", numbered=True))  # short socket paths
    config = DaemonConfig(
        mock_cluster.bootstrap_servers,
        socket_dir,
        tcp_port=None,
        unix_stream=False,
        message_max_bytes=MESSAGE_MAX_BYTES,
        batching_time_ms=5,
    )
    daemon = DaemonProcess(config, tmp_path / "dory.xml", tmp_path / "daemon.log")
    try:
        yield daemon, config
    finally:
        daemon.stop()


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def scrape(url: str) -> str:
    with urllib.request.urlopen(f"{url}/metrics", timeout=60) as response:
        return str(response.read().decode())


def scrape_while(url: str, stop: threading.Event, texts: list[str]) -> None:
    """Scrape back to back until ``stop`` (at most 200 scrapes: bounded)."""
    for _ in range(200):
        if stop.is_set():
            return
        texts.append(scrape(url))


@pytest.mark.slow
def test_a_flood_of_topic_names_keeps_the_books_bounded_and_the_loop_free(
    serve: tuple[DaemonProcess, DaemonConfig], mock_cluster: MockCluster
) -> None:
    daemon, config = serve
    canary = Canary(mock_cluster.bootstrap_servers, config.datagram_path)
    try:
        idle_s = statistics.median(canary.send_and_time() for _ in range(3))
        rss_idle = rss_mb(daemon.process.pid)
        flood = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        flood.connect(config.datagram_path)
        for i in range(NAMES):
            flood.send(name_message(i))
        flood.close()
        wait_until(
            lambda: daemon.counters()["received_unix_dgram"] == NAMES + 3,
            timeout_s=120,
            what="every name read",
        )
        stop, texts = threading.Event(), list[str]()
        scraper = threading.Thread(target=scrape_while, args=(daemon.url, stop, texts))
        scraper.start()
        try:
            wait_until(lambda: len(texts) >= 1, timeout_s=120, what="a first scrape")
            during_s = max(canary.send_and_time() for _ in range(3))
        finally:
            stop.set()
            scraper.join(timeout=120)
        # The consumer reads a canary back before the daemon has its delivery report:
        # the books count it delivered a moment later (seen late on a loaded machine).
        wait_until(
            lambda: canary_delivered(daemon.books()) == 6,
            timeout_s=600,  # a hang's net: the condition is the assertion
            what="the six canaries delivered in the books",
        )
        books, counters = daemon.books(), daemon.counters()
        assert_bounded_and_whole(books, counters)
        assert_metrics_bounded_and_whole(scrape(daemon.url), counters)
        assert rss_mb(daemon.process.pid) - rss_idle < RSS_GROWTH_LIMIT_MB
        assert during_s <= LATENCY_RATIO * max(idle_s, IDLE_FLOOR_S), (during_s, idle_s)
    finally:
        canary.close()


def canary_delivered(books: dict[str, Any]) -> int:
    """How many canaries the books count delivered."""
    return sum(line["delivered"] for line in books["topics"] if line["topic"] == CANARY)


def assert_bounded_and_whole(books: dict[str, Any], counters: dict[str, int]) -> None:
    topics = {line["topic"]: line for line in books["topics"]}
    assert len(topics) <= DEFAULT_UNKNOWN_TOPIC_LIMIT + 2  # the unknown ones, (other), canary
    other = topics[OTHER_TOPICS]
    too_long = NAMES // 3
    assert counters["discarded_too_long"] == too_long
    assert counters["discarded_bad_topic"] == NAMES - too_long
    assert sum(t["discarded"].get("too_long", 0) for t in topics.values()) == too_long
    assert other["discarded"]["too_long"] == too_long - (len(topics) - 2)
    assert counters["other_topic_events"] == other["discarded"]["too_long"]
    assert other["accepted"] == other["in_flight"] == 0
    assert topics[CANARY]["delivered"] == 6
    for name, t in topics.items():
        outcomes = t["delivered"] + t["possibly_delivered"] + t["left_for_next_start"]
        assert t["accepted"] == outcomes + discarded_after_acceptance(t) + t["in_flight"], name
    assert books["received"]["unix_dgram"] == NAMES + 6
    assert books["unknown_topics"] == {
        "named": DEFAULT_UNKNOWN_TOPIC_LIMIT,
        "limit": DEFAULT_UNKNOWN_TOPIC_LIMIT,
    }


def assert_metrics_bounded_and_whole(text: str, counters: dict[str, int]) -> None:
    labels: set[str] = set()
    discarded: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels.get("topic"):
                labels.add(sample.labels["topic"])
            if sample.name == "pydory_discarded_messages_total":
                reason = sample.labels["reason"]
                discarded[reason] = discarded.get(reason, 0) + sample.value
    assert len(labels) <= DEFAULT_UNKNOWN_TOPIC_LIMIT + 2
    assert OTHER_TOPICS in labels
    assert discarded["too_long"] == counters["discarded_too_long"]
    assert discarded["bad_topic"] == counters["discarded_bad_topic"]
