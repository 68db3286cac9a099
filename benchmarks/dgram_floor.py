"""What one Python interpreter can do on the datagram path, without pydory's machinery.

Not a test, and not pydory: an experiment for the design decision in BENCHMARKS.md. The
same generator as `pydory bench` writes N datagrams; this process reads them with
recv_into, parses the Dory header with struct (no Message object), and calls produce()
on a confluent-kafka producer bound to a fresh mock cluster. Variants:

- ``--reports none``: delivery.report.only.error, no per-message Python callback (the
  books would have to come from counts, not from per-message reports);
- ``--reports callback``: one Python callback per message, appending to a list, as pydory
  does today (pydory also hands them to the loop thread and settles each one).

    .venv/bin/python benchmarks/dgram_floor.py --messages 200000 --reports none

Prints msgs/s (first send -> flush done) and CPU µs/msg of this process (all threads).
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from pydory_tools.bench.child import stop_process
from pydory_tools.bench.runs import start_generators
from pydory_tools.bench.settings import BROKERS, PARTITIONS, TOPIC, BenchSettings

_TOPIC_SIZE = struct.Struct(">h")  # at offset 10 (after Size, ApiKey, ApiVersion, Flags)
_TIMESTAMP_KEY_SIZE = struct.Struct(">qi")
_VALUE_SIZE = struct.Struct(">i")


def receive_and_produce(sock: socket.socket, producer: Producer, count: int, callback: Any) -> None:
    buffer = bytearray(65537)
    view = memoryview(buffer)
    recv_into, produce, poll = sock.recv_into, producer.produce, producer.poll
    topics: dict[bytes, str] = {}
    for received in range(count):
        recv_into(buffer)
        (topic_size,) = _TOPIC_SIZE.unpack_from(buffer, 10)
        topic_bytes = bytes(view[12 : 12 + topic_size])
        topic = topics.get(topic_bytes) or topics.setdefault(topic_bytes, topic_bytes.decode())
        at = 12 + topic_size
        timestamp, key_size = _TIMESTAMP_KEY_SIZE.unpack_from(buffer, at)
        at += 12 + key_size
        (value_size,) = _VALUE_SIZE.unpack_from(buffer, at)
        value = bytes(view[at + 4 : at + 4 + value_size])
        if callback is None:
            produce(topic, value, timestamp=timestamp)
        else:
            produce(topic, value, timestamp=timestamp, on_delivery=callback)
        if received % 1000 == 0:
            poll(0)


@contextlib.contextmanager
def mock_cluster_process() -> Iterator[str]:
    """The mock cluster in its own process, so that its CPU is not counted here."""
    command = [sys.executable, "-m", "pydory_tools.testing.mock_cluster", "--brokers", str(BROKERS)]
    command += ["--topic", f"{TOPIC}:{PARTITIONS}"]
    cluster = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        assert cluster.stdout is not None
        yield cluster.stdout.readline().strip()
    finally:
        stop_process(cluster)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--reports", choices=("none", "callback"), default="none")
    args = parser.parse_args()
    settings = BenchSettings(
        transport="dgram", messages=args.messages, value_bytes=args.value_bytes, timeout_s=120
    )
    reports: list[Any] = []
    callback = None if args.reports == "none" else (lambda err, msg: reports.append(msg))
    with (
        tempfile.TemporaryDirectory(prefix="dgram-floor-") as tmp,
        contextlib.ExitStack() as stack,
    ):
        bootstrap = stack.enter_context(mock_cluster_process())
        producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "linger.ms": 5,
                "enable.idempotence": True,
                "delivery.report.only.error": args.reports == "none",
                "queue.buffering.max.messages": 2_000_000,
            }
        )
        producer.list_topics(TOPIC, timeout=10)
        path = str(Path(tmp) / "floor.sock")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(path)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        generators = start_generators(settings, path, Path(tmp), stack, probes=False)
        cpu_start = time.process_time()
        for generator in generators:
            generator.go()
        receive_and_produce(sock, producer, args.messages, callback)
        producer.poll(0)
        remaining = producer.flush(60)
        done = time.monotonic()
        cpu = time.process_time() - cpu_start
        first = generators[0].wait_result(60)["first_send"]
    print(
        f"reports={args.reports}: {args.messages / (done - first):,.0f} msgs/s, "
        f"{cpu / args.messages * 1e6:.2f} µs/msg CPU (this process, all threads), "
        f"unflushed {remaining}"
    )


if __name__ == "__main__":
    main()
