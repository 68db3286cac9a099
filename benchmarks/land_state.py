"""The landing job's memory and CPU on a backlog, against a bare consumer writing Parquet.

Not a test. Two helpers for the commands in BENCHMARKS.md ("Landing a backlog"), each run
under ``/usr/bin/time -v`` so wall, CPU and peak RSS come from the kernel:

    fill BOOTSTRAP TOPIC N   produce N records of 100 B, each with a distinct ``pydory-id``
                             header (one host, one run, four streams, dense sequences: what
                             a daemon sends), round-robin over the topic's partitions
    bare BOOTSTRAP TOPIC OUT read the whole topic with one confluent-kafka consumer and write
                             it as Parquet (the lake's data columns, pyarrow, 100,000 rows a
                             file): the floor for reading and writing the same records

    measure -- COMMAND...    run COMMAND, sampling its process tree every 0.1 s from /proc,
                             and print its wall time, the CPU seconds of the whole tree (the
                             Spark JVM is not reaped by the command, so ``time`` misses it)
                             and the peak RSS (VmHWM) of its largest process and of the tree

The landing itself is ``pydory pipeline land --available-now`` (see BENCHMARKS.md).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from confluent_kafka import Consumer, Producer, TopicPartition

HEADER = "pydory-id"
STREAMS = 4
ROWS_PER_FILE = 100_000


def fill(bootstrap: str, topic: str, count: int) -> None:
    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1_000_000, "acks": "all"}
    )
    partitions = len(producer.list_topics(topic, timeout=30).topics[topic].partitions)
    value = b"x" * 100
    incarnation = int(time.time())
    for i in range(count):
        identity = f"bench-host/{incarnation}/{i % STREAMS}/{i // STREAMS}".encode()
        while True:
            try:
                producer.produce(
                    topic, value, partition=i % partitions, headers=[(HEADER, identity)]
                )
                break
            except BufferError:
                producer.poll(0.05)
    if producer.flush(300):
        raise SystemExit("the topic could not be filled")
    print(f"filled {topic} with {count:,} records", flush=True)


def bare(bootstrap: str, topic: str, out: Path) -> None:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "bench-bare", "enable.auto.commit": False}
    )
    partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
    ranges = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), 30) for p in partitions}
    expected = sum(high - low for low, high in ranges.values())
    consumer.assign([TopicPartition(topic, p, low) for p, (low, _high) in ranges.items()])
    out.mkdir(parents=True, exist_ok=True)
    columns: dict[str, list[object]] = {
        name: [] for name in ("key", "value", "partition", "offset", "timestamp", "pydory_id")
    }
    received = files = 0
    while received < expected:
        for record in consumer.consume(min(10_000, expected - received), 1.0):
            if record.error() is not None:
                continue
            received += 1
            headers = dict(record.headers() or [])
            columns["key"].append(record.key())
            columns["value"].append(record.value())
            columns["partition"].append(record.partition())
            columns["offset"].append(record.offset())
            columns["timestamp"].append(record.timestamp()[1])
            identity = headers.get(HEADER)
            columns["pydory_id"].append(identity.decode() if identity else None)
        if len(columns["value"]) >= ROWS_PER_FILE or received >= expected:
            pq.write_table(pa.table(columns), out / f"part-{files:05d}.parquet")
            files += 1
            columns = {name: [] for name in columns}
    consumer.close()
    print(f"bare consumer: {received:,} records into {files} Parquet files", flush=True)


_TICKS = os.sysconf("SC_CLK_TCK")


def _tree(root: int) -> dict[int, tuple[float, int]]:
    """pid -> (CPU seconds, VmHWM KiB) of ``root`` and its descendants, from /proc."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    parents[int(entry)] = int(stat.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                pass
    members, todo = set(), [root]
    while todo:
        pid = todo.pop()
        members.add(pid)
        todo.extend(child for child, parent in parents.items() if parent == pid)
    found: dict[int, tuple[float, int]] = {}
    for pid in members:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{pid}/status") as status:
                hwm = next((int(line.split()[1]) for line in status if line.startswith("VmHWM")), 0)
        except OSError:
            continue
        found[pid] = (sum(int(f) for f in fields[11:13]) / _TICKS, hwm)
    return found


def measure(command: list[str]) -> int:
    began = time.monotonic()
    child = subprocess.Popen(command)
    seen: dict[int, tuple[float, int]] = {}
    while child.poll() is None:
        for pid, (cpu, hwm) in _tree(child.pid).items():  # a zombie's zeros count for nothing
            before = seen.get(pid, (0.0, 0))
            seen[pid] = (max(cpu, before[0]), max(hwm, before[1]))
        time.sleep(0.1)
    wall = time.monotonic() - began
    cpu = sum(cpu for cpu, _ in seen.values())
    largest = max((hwm for _, hwm in seen.values()), default=0)
    print(
        f"MEASURED wall {wall:.1f} s, CPU {cpu:.1f} s (tree, sampled), peak RSS largest process "
        f"{largest / 1024:.0f} MB, sum of peaks {sum(h for _, h in seen.values()) / 1024:.0f} MB, "
        f"exit {child.returncode}",
        flush=True,
    )
    return child.returncode


if __name__ == "__main__":
    if sys.argv[1] == "measure":
        sys.exit(measure(sys.argv[3:]))
    command, bootstrap, topic, arg = sys.argv[1:5]
    if command == "fill":
        fill(bootstrap, topic, int(arg))
    else:
        bare(bootstrap, topic, Path(arg))
