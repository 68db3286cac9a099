"""The long-running landing's end-to-end latency and cost, against a bare consumer.

Not a test. One bounded run for BENCHMARKS.md ("The long-running landing"): on a running
Kafka, in one sitting,

1. start ``pydory pipeline land --trigger-interval S`` (the production mode) on a fresh
   lake and checkpoint, and a bare consumer (confluent-kafka, one Parquet file with the
   lake's data columns every S seconds, pyarrow) on the same topic;
2. once both read (the topic's first record is in each), send RATE records a second for
   SECONDS seconds, each with its own ``pydory-id`` (100 B values, the producer's
   CreateTime as the record's timestamp);
3. wait until both have written every record (a far-off safety net, not a deadline),
   stop both (SIGTERM), and print per reader: send -> visible latency p50 / p95 / max,
   the CPU seconds of its process tree during the run (sampled from /proc), CPU per
   10,000 records, and the files it wrote.

"Visible" is when a reader could read the record: for the landing, the modification
time of the sink's commit-log entry (``LAKE/_spark_metadata/<batch>``) listing the
record's file (Spark's readers see a file only from then on); for the bare consumer, the
file's own modification time. Both against the record's CreateTime: the producer runs
in this process, on the same clock.

    python benchmarks/land_latency.py BOOTSTRAP TOPIC WORKDIR [--rate 1000]
        [--seconds 120] [--trigger-interval 5]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.parquet as pq
from confluent_kafka import Consumer, Producer

sys.path.insert(0, str(Path(__file__).parent))
from land_state import _tree

HEADER = "pydory-id"
# A safety net for the whole run, far beyond what it takes.
_SAFETY_NET_S = 3600.0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("bootstrap")
    parser.add_argument("topic")
    parser.add_argument("workdir", type=Path)
    parser.add_argument("--rate", type=int, default=1_000)
    parser.add_argument("--seconds", type=int, default=120)
    parser.add_argument("--trigger-interval", type=float, default=5.0)
    parser.add_argument("--bare", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.bare:
        return bare_consumer(args.bootstrap, args.topic, args.workdir, args.trigger_interval)
    return run(args)


def run(args: argparse.Namespace) -> int:
    lake, checkpoint, bare_out = (args.workdir / name for name in ("lake", "ckpt", "bare"))
    producer = Producer({"bootstrap.servers": args.bootstrap, "linger.ms": 5})
    # A first record, so each reader has started reading before the clock runs.
    producer.produce(args.topic, b"warm-up", headers=[(HEADER, b"bench/0/0/0")])
    producer.flush(30)
    land = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pydory",
            "pipeline",
            "land",
            "--bootstrap-servers",
            args.bootstrap,
            "--topics",
            args.topic,
            "--lake",
            str(lake),
            "--checkpoint",
            str(checkpoint),
            "--trigger-interval",
            f"{args.trigger_interval:g}",
            "--master",
            "local[2]",
        ],
        stdout=open(args.workdir / "land.out", "w"),  # noqa: SIM115
        stderr=subprocess.STDOUT,
    )
    bare = subprocess.Popen(
        [
            sys.executable,
            __file__,
            args.bootstrap,
            args.topic,
            str(bare_out),
            "--bare",
            "--trigger-interval",
            f"{args.trigger_interval:g}",
        ]
    )
    cpu = {"landing": _Cpu(land.pid), "bare consumer": _Cpu(bare.pid)}
    _wait(lambda: _landed_count(lake) >= 1 and _bare_count(bare_out) >= 1, cpu, "both to start")
    load_before = os.getloadavg()[0]
    cpu_at_start = {name: meter.total() for name, meter in cpu.items()}
    count = args.rate * args.seconds
    began = time.monotonic()
    incarnation = int(time.time())
    for i in range(count):
        # Paced: record i leaves at began + i / rate.
        delay = began + i / args.rate - time.monotonic()
        if delay > 0:
            producer.poll(delay)
        identity = f"bench/{incarnation}/1/{i}".encode()
        producer.produce(args.topic, b"x" * 100, headers=[(HEADER, identity)])
    producer.flush(60)
    sent_s = time.monotonic() - began
    total = count + 1
    _wait(lambda: _landed_count(lake) >= total and _bare_count(bare_out) >= total, cpu, "all")
    load_after = os.getloadavg()[0]
    used = {name: meter.total() - cpu_at_start[name] for name, meter in cpu.items()}
    land.send_signal(signal.SIGTERM)
    bare.send_signal(signal.SIGTERM)
    land.wait(120)
    bare.wait(120)
    print(
        f"sent {count:,} records at {args.rate:,}/s over {sent_s:.1f} s; trigger "
        f"{args.trigger_interval:g} s; 1-minute load {load_before:.1f} before, "
        f"{load_after:.1f} after"
    )
    results = {
        "landing": (_landing_latencies(lake), _parquet_files(lake)),
        "bare consumer": (_bare_latencies(bare_out), _parquet_files(bare_out)),
    }
    for name, (latencies, files) in results.items():
        print(
            f"{name}: latency p50 {_quantile(latencies, 0.5):.2f} s, p95 "
            f"{_quantile(latencies, 0.95):.2f} s, max {max(latencies):.2f} s "
            f"({len(latencies):,} records); CPU {used[name]:.1f} s during the run, "
            f"{used[name] / count * 10_000:.2f} s per 10,000 records; {files} Parquet files"
        )
    return 0


class _Cpu:
    """The CPU seconds of a process tree so far (its members' highest sample each)."""

    def __init__(self, pid: int) -> None:
        self._pid = pid
        self._seen: dict[int, float] = {}

    def sample(self) -> None:
        for pid, (cpu, _hwm) in _tree(self._pid).items():
            self._seen[pid] = max(cpu, self._seen.get(pid, 0.0))

    def total(self) -> float:
        self.sample()
        return sum(self._seen.values())


def _wait(done: object, cpu: dict[str, _Cpu], what: str) -> None:
    deadline = time.monotonic() + _SAFETY_NET_S
    while not done():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise SystemExit(f"gave up waiting for {what}")
        for meter in cpu.values():
            meter.sample()
        time.sleep(0.5)


def _commit_log(lake: Path) -> list[tuple[float, list[str]]]:
    """Per committed batch, in order: its entry's modification time and its new files."""
    log = lake / "_spark_metadata"
    if not log.is_dir():
        return []
    batches = sorted(
        (int(entry.name.split(".")[0]), entry)
        for entry in log.iterdir()
        if entry.name.split(".")[0].isdigit()
    )
    seen: set[str] = set()
    found = []
    for _batch, entry in batches:
        try:
            lines = entry.read_text().splitlines()[1:]
            modified = entry.stat().st_mtime
        except FileNotFoundError:  # compacted away meanwhile
            continue
        paths = [unquote(urlparse(json.loads(line)["path"]).path) for line in lines]
        new = [path for path in paths if path not in seen]
        seen.update(new)
        found.append((modified, new))
    return found


def _landed_count(lake: Path) -> int:
    return sum(
        pq.ParquetFile(path).metadata.num_rows for _, paths in _commit_log(lake) for path in paths
    )


def _bare_count(out: Path) -> int:
    return sum(pq.ParquetFile(path).metadata.num_rows for path in out.glob("*.parquet"))


def _landing_latencies(lake: Path) -> list[float]:
    latencies: list[float] = []
    for visible, paths in _commit_log(lake):
        for path in paths:
            latencies += _since_sent(path, visible)
    return latencies


def _bare_latencies(out: Path) -> list[float]:
    latencies: list[float] = []
    for path in out.glob("*.parquet"):
        latencies += _since_sent(str(path), path.stat().st_mtime)
    return latencies


def _since_sent(path: str, visible: float) -> list[float]:
    """``visible`` less each benchmark record's CreateTime in the file (the warm-up left out)."""
    table = pq.read_table(path, columns=["timestamp", "pydory_id"])
    column = table.column("timestamp")
    if pa.types.is_timestamp(column.type):  # Spark's (INT96: ns); the bare consumer's: ms
        per_second = {"s": 1, "ms": 1e3, "us": 1e6, "ns": 1e9}[column.type.unit]
    else:
        per_second = 1e3
    sent = [value / per_second for value in column.cast(pa.int64()).to_pylist()]
    names = table.column("pydory_id").to_pylist()
    return [visible - at for at, name in zip(sent, names, strict=True) if name != "bench/0/0/0"]


def _parquet_files(root: Path) -> int:
    return sum(1 for _ in root.rglob("*.parquet"))


def _quantile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[round(q * 100) - 1]


def bare_consumer(bootstrap: str, topic: str, out: Path, interval_s: float) -> int:
    """Read ``topic`` from the start; every ``interval_s`` write what arrived as one file."""
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-bare-{os.getpid()}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    out.mkdir(parents=True, exist_ok=True)
    names = ("key", "value", "partition", "offset", "timestamp", "pydory_id")
    columns: dict[str, list[object]] = {name: [] for name in names}
    files, next_write = 0, time.monotonic() + interval_s
    while not stop:
        for record in consumer.consume(10_000, max(0.0, next_write - time.monotonic())):
            if record.error() is not None:
                continue
            identity = dict(record.headers() or []).get(HEADER)
            columns["key"].append(record.key())
            columns["value"].append(record.value())
            columns["partition"].append(record.partition())
            columns["offset"].append(record.offset())
            columns["timestamp"].append(record.timestamp()[1])
            columns["pydory_id"].append(identity.decode() if identity else None)
        if time.monotonic() >= next_write:
            next_write += interval_s
            if columns["value"]:
                temporary = out / f".part-{files:05d}.tmp"
                pq.write_table(pa.table(columns), temporary)
                os.replace(temporary, out / f"part-{files:05d}.parquet")
                files += 1
                columns = {name: [] for name in names}
    consumer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
