"""Issue 21 item 1: 10^5 distinct topic names from clients, then a scrape and a canary.

A real daemon (``pydory serve`` in its own process, optionally from another tree with
``--daemon-src``) on librdkafka's mock cluster, which has one topic: ``canary``. This
process sends N datagrams, each to a topic name never seen before, in three kinds taken in
turn: a legal name Kafka does not have (``bad_topic``), a legal unknown name with a value
over ``messageMaxBytes`` (``too_long``, judged before the topic is looked up, so it used to
get per-topic books), and a name Kafka refuses (250 bytes: ``bad_topic`` at decoding).

Measured, per round:

- ``rss_mb_idle`` / ``rss_mb_after``: the daemon's VmRSS before the names and after all
  were read (``received_unix_dgram`` on ``/counters/json``);
- ``topics_in_books``: the lines of ``/books/json``;
- ``<page>_s``: the wall time of one request of ``/metrics``, ``/books/json``,
  ``/discards/json``, ``/dashboard/json`` after the names;
- ``canary_idle_ms``: send -> consumed latency of a message to ``canary`` before the names
  (median of 5), and ``canary_during_scrape_ms``: the worst of 5 canaries each sent 20 ms
  into a ``/metrics`` scrape (a loop held by the scrape holds the canary too).

The canary is read back by a consumer in this process (fetch.wait.max.ms 5), so its figure
is send -> Kafka -> consumer, an upper bound on send -> delivered.

Not a test. Run::

    .venv/bin/python benchmarks/topic_cardinality.py [--names 100000] [--rounds 1]
        [--daemon-src /tmp/pydory-base-h1/src] [--json]
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import struct
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from pydory.wire import encode_any_partition
from pydory_tools.bench.daemon import BenchDaemon
from pydory_tools.testing.daemon_config import DaemonConfig
from pydory_tools.testing.mock_cluster import MockCluster

CANARY = "canary"
MESSAGE_MAX_BYTES = 1000  # a 1,000-byte value is too long, cheaply
TOO_LONG_VALUE = b"x" * MESSAGE_MAX_BYTES
SMALL_VALUE = b"v" * 20
PAGES = ("/metrics", "/books/json", "/discards/json", "/dashboard/json")
CANARIES = 5
HTTP_TIMEOUT_S = 120.0
START_TIMEOUT_S = 60.0
_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def name_message(i: int) -> bytes:
    """The ``i``-th flood message: a fresh topic name, of the kind ``i % 3``."""
    kind = i % 3
    if kind == 0:
        return encode_any_partition(f"unknown.{i}", SMALL_VALUE)
    if kind == 1:
        return encode_any_partition(f"toolong.{i}", TOO_LONG_VALUE)
    # A name longer than Kafka's 249 bytes: refused at decoding. Built by hand, since the
    # client library refuses to encode it.
    return raw_any_partition(f"n{i}".ljust(250, "x").encode(), SMALL_VALUE)


def raw_any_partition(topic: bytes, value: bytes) -> bytes:
    """Dory's AnyPartition bytes for any ``topic``, legal or not (no timestamp, no key)."""
    size = 28 + len(topic) + len(value)
    head = struct.pack(">ihhhh", size, 256, 0, 0, len(topic))
    return head + topic + struct.pack(">qi", 0, 0) + struct.pack(">i", len(value)) + value


def canary_message() -> bytes:
    return encode_any_partition(CANARY, str(time.time_ns()).encode())


class CanaryReader:
    """Reads ``canary`` and notes, per message, send -> receipt in ms."""

    def __init__(self, bootstrap: str) -> None:
        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": "topic-cardinality",
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 5,
            }
        )
        low, _ = self._consumer.get_watermark_offsets(TopicPartition(CANARY, 0), timeout=30)
        self._consumer.assign([TopicPartition(CANARY, 0, low)])

    def next_latency_ms(self, timeout_s: float = 120.0) -> float:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            record = self._consumer.poll(0.1)
            if record is not None and record.error() is None:
                return (time.time_ns() - int(record.value() or b"0")) / 1e6
        raise TimeoutError("the canary never reached Kafka")

    def close(self) -> None:
        self._consumer.close()


def get(base: str, path: str) -> bytes:
    with _opener.open(base + path, timeout=HTTP_TIMEOUT_S) as response:
        body: bytes = response.read()
        return body


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def received(base: str) -> int:
    counters = json.loads(get(base, "/counters/json"))["counters"]
    return next(c["value"] for c in counters if c["name"] == "received_unix_dgram")


def one_round(names: int, source: Path | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="pydory-card-") as workdir, MockCluster() as cluster:
        cluster.create_topic(CANARY, 1)
        config = DaemonConfig(
            cluster.bootstrap_servers,
            workdir,
            tcp_port=None,
            unix_stream=False,
            message_max_bytes=MESSAGE_MAX_BYTES,
            batching_time_ms=5,
        )
        daemon = BenchDaemon(config, Path(workdir), source)
        daemon.start(START_TIMEOUT_S)
        reader = CanaryReader(cluster.bootstrap_servers)
        sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sender.connect(config.datagram_path)
        base = f"http://127.0.0.1:{config.http_port}"
        try:
            return measure(daemon, reader, sender, base, names)
        finally:
            sender.close()
            reader.close()
            daemon.stop()


def measure(
    daemon: BenchDaemon, reader: CanaryReader, sender: socket.socket, base: str, names: int
) -> dict[str, Any]:
    idle = []
    for _ in range(CANARIES):
        sender.send(canary_message())
        idle.append(reader.next_latency_ms())
    result: dict[str, Any] = {"rss_mb_idle": rss_mb(daemon.pid)}
    started = time.monotonic()
    for i in range(names):
        sender.send(name_message(i))  # blocking: paced by the daemon's reads
    before = CANARIES
    while received(base) < before + names:
        time.sleep(0.05)
    result["flood_s"] = time.monotonic() - started
    result["rss_mb_after"] = rss_mb(daemon.pid)
    result["topics_in_books"] = len(json.loads(get(base, "/books/json"))["topics"])
    for page in PAGES:
        time.sleep(0.2)  # past the page reuse window: a fresh render each time
        began = time.monotonic()
        get(base, page)
        result[f"{page.strip('/').replace('/', '_')}_s"] = time.monotonic() - began
    during = []
    for _ in range(CANARIES):
        time.sleep(0.2)
        scrape = threading.Thread(target=get, args=(base, "/metrics"))
        scrape.start()
        time.sleep(0.02)
        sender.send(canary_message())
        during.append(reader.next_latency_ms())
        scrape.join()
    result["canary_idle_ms"] = statistics.median(idle)
    result["canary_during_scrape_ms"] = max(during)
    result["rss_mb_end"] = rss_mb(daemon.pid)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--names", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--daemon-src", type=Path, default=None)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rounds = [one_round(args.names, args.daemon_src) for _ in range(args.rounds)]
    summary = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
    summary.update(names=args.names, rounds=args.rounds, source=str(args.daemon_src or "."))
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        for key, value in summary.items():
            print(f"{key:28s} {value:.3f}" if isinstance(value, float) else f"{key:28s} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
