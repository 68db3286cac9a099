"""The fleet audit's figure: a full read of the lake against an incremental one.

Not a test. Fills a topic of Apache Kafka (our launcher: one KRaft node, 8 partitions)
with N records carrying ``pydory-id`` headers, as three hosts of two runs each would send
them, and publishes those runs' books to a books topic; lands the topic with the landing
job (Spark's own connector, Trigger.AvailableNow); then, in one SparkSession:

1. ``full``: the fleet audit with no state (reads every lake file and books record);
2. ``first``: the same with ``--state`` (a first run reads everything too, and keeps it);
3. one more run of one host sends N/100 records, which are landed; then
   ``incremental``: the audit with the state (reads only the new files and records) and
   ``full again``: without it, over the same, now larger, lake.

Each audit's wall time (SparkSession start-up excluded, printed apart) and what it read.

    .venv/bin/python benchmarks/fleet_audit_bench.py --messages 1000000
"""

from __future__ import annotations

import argparse
import io
import sys
import tempfile
import time
from pathlib import Path

from confluent_kafka import Producer

from pydory.daemon.books.durable import CLEAN, RunBooks
from pydory.daemon.books.publisher import books_value
from pydory_tools.testing.kafka_broker import KafkaCluster

TOPIC = "bench.fleet"
BOOKS = "bench.books"
PARTITIONS = 8
HOSTS = ("host-1", "host-2", "host-3")


def send_run(bootstrap: str, host: str, incarnation: int, count: int) -> RunBooks:
    """``count`` records of one run, as its daemon sends them; its books, published."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    prefix = f"{host}/{incarnation:016x}/1/"
    value = b"v" * 100
    for sequence in range(count):
        while True:
            try:
                producer.produce(TOPIC, value, headers=[("pydory-id", prefix + str(sequence))])
                break
            except BufferError:
                producer.poll(0.01)
    books = RunBooks(host, incarnation, started_ms=incarnation, final=True, ended=CLEAN)
    books.live = {
        TOPIC: {
            "accepted": count,
            "delivered": count,
            "possibly_delivered": 0,
            "discarded": {},
            "left_for_next_start": 0,
            "in_flight": 0,
            "replayed": 0,
        }
    }
    producer.produce(BOOKS, books_value(books), books.key)
    if producer.flush(120):
        raise RuntimeError("the records could not be produced")
    return books


def land(bootstrap: str, root: Path) -> None:
    from pydory.pipeline.landing.land import LandSettings, run_landing

    out = io.StringIO()
    settings = LandSettings(
        bootstrap_servers=bootstrap,
        topics=(TOPIC,),
        lake=str(root / "lake"),
        checkpoint=str(root / "checkpoint"),
        available_now=True,
    )
    if run_landing(settings, out) != 0:
        raise RuntimeError(out.getvalue())


def timed_audit(label: str, spark: object, bootstrap: str, root: Path, state: bool) -> None:
    from pydory.pipeline.audits.fleet_audit import STATE_FILE, FleetState, fleet_audit

    started = time.monotonic()
    report = fleet_audit(
        spark,  # type: ignore[arg-type]
        root / "lake",
        bootstrap_servers=bootstrap,
        books_topic=BOOKS,
        state_dir=str(root / "state") if state else None,
    )
    elapsed = time.monotonic() - started
    landed = sum(topic.landed for host in report.hosts for topic in host.topics)
    print(
        f"{label:12s} {elapsed:7.1f} s  files read {report.sources['lake_files_read']:4d}  "
        f"books records read {report.sources['books_records_read']:3d}  "
        f"landed {landed}  balanced {report.balanced}",
        flush=True,
    )
    if state:
        kept = FleetState.load(str(root / "state"), str((root / "lake").resolve()), BOOKS)
        ranges = sum(len(r) for r in kept.ranges.values())
        size = (root / "state" / STATE_FILE).stat().st_size
        print(f"{'':12s} state: {ranges} ranges over {len(kept.ranges)} streams, {size} bytes")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    args = parser.parse_args()
    with KafkaCluster(1) as kafka, tempfile.TemporaryDirectory(prefix="pydory-fleet-") as tmp:
        bootstrap = kafka.bootstrap_servers
        kafka.create_topic(TOPIC, PARTITIONS)
        kafka.create_topic(BOOKS, 1, config={"cleanup.policy": "compact"})
        root = Path(tmp)
        per_run = args.messages // (2 * len(HOSTS))
        started = time.monotonic()
        for index, host in enumerate(HOSTS):
            for run in (1, 2):
                send_run(bootstrap, host, 16 * index + run, per_run)
        print(f"produced {per_run * 6} records in {time.monotonic() - started:.1f} s")
        from pydory.pipeline.spark import spark_session

        started = time.monotonic()
        spark = spark_session(app_name="pydory-fleet-audit-bench")
        print(f"SparkSession started in {time.monotonic() - started:.1f} s")
        started = time.monotonic()
        land(bootstrap, root)
        print(f"landed in {time.monotonic() - started:.1f} s")
        timed_audit("full", spark, bootstrap, root, state=False)
        timed_audit("first", spark, bootstrap, root, state=True)
        send_run(bootstrap, HOSTS[0], 3, max(1, args.messages // 100))
        land(bootstrap, root)
        timed_audit("incremental", spark, bootstrap, root, state=True)
        timed_audit("full again", spark, bootstrap, root, state=False)
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
