"""The Spark figure: the landing job's records/s into Parquet next to a bare consumer.

Not a test. Fills a topic of a mock cluster (its own process, 3 brokers, 8 partitions)
with N records of V bytes, then reads all of them twice:

- bare: one confluent-kafka (librdkafka) consumer, assign() over every partition from the
  start, consume() in batches until it has every record: the ceiling of reading in Python;
- land: pydory's landing job (pydory.pipeline.landing.land, ``pydory-kafka`` source, Parquet file
  sink, Trigger.AvailableNow) on ``local[*]``.

For the landing job it reports two rates: records / (query start -> termination), which
includes planning and the sink's commit log, and Spark's own rate over the triggers'
execution time (sum of numInputRows / sum of durationMs.triggerExecution). SparkSession
start-up (~10 s here) is excluded from both and printed apart.

    .venv/bin/python benchmarks/spark_land_bench.py --messages 200000 --value-bytes 100
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition

from pydory_tools.bench.child import stop_process
from pydory_tools.bench.workload import make_values

TOPIC = "bench.land"
PARTITIONS = 8


def start_mock_cluster() -> tuple[subprocess.Popen[str], str]:
    command = [sys.executable, "-m", "pydory_tools.testing.mock_cluster", "--brokers", "3"]
    command += ["--topic", f"{TOPIC}:{PARTITIONS}"]
    cluster = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert cluster.stdout is not None
    return cluster, cluster.stdout.readline().strip()


def fill(bootstrap: str, messages: int, value_bytes: int) -> int:
    """Produce the records; return how many the topic holds (the mock may age some out)."""
    values = make_values(value_bytes, 4096, seed=0)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(messages):
        while True:
            try:
                producer.produce(TOPIC, values[i % len(values)])
                break
            except BufferError:
                producer.poll(0.01)
    if producer.flush(60):
        raise RuntimeError("the topic could not be filled")
    return available_records(bootstrap)


def available_records(bootstrap: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-watermarks"})
    try:
        total = 0
        for partition in range(PARTITIONS):
            low, high = consumer.get_watermark_offsets(TopicPartition(TOPIC, partition), 10)
            total += high - low
        return total
    finally:
        consumer.close()


def bare_consumer_rate(bootstrap: str, expected: int, timeout_s: float = 120) -> float:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "bench-bare",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    partitions = [TopicPartition(TOPIC, p) for p in range(PARTITIONS)]
    # Asking for every partition's low watermark connects to every leader before the clock
    # starts; the landing job's clock likewise starts after its session exists.
    lows = [consumer.get_watermark_offsets(tp, timeout=10)[0] for tp in partitions]
    consumer.assign([TopicPartition(TOPIC, p, low) for p, low in enumerate(lows)])
    received = 0
    started = time.monotonic()
    try:
        while received < expected:
            if time.monotonic() - started > timeout_s:
                raise TimeoutError(f"bare consumer read {received} of {expected}")
            received += sum(1 for r in consumer.consume(10_000, 0.5) if r.error() is None)
        return received / (time.monotonic() - started)
    finally:
        consumer.close()


def landing_rates(bootstrap: str, expected: int, workdir: Path) -> dict[str, float]:
    from pydory.pipeline.landing.land import LandSettings, start_landing
    from pydory.pipeline.spark import spark_session

    begun = time.monotonic()
    spark = spark_session(master="local[*]", app_name="pydory-bench-land")
    session_s = time.monotonic() - begun
    settings = LandSettings(
        bootstrap_servers=bootstrap,
        topics=(TOPIC,),
        lake=str(workdir / "lake"),
        checkpoint=str(workdir / "checkpoint"),
        available_now=True,
    )
    started = time.monotonic()
    query = start_landing(spark, settings)
    query.awaitTermination()
    wall_s = time.monotonic() - started
    progress = [p for p in query.recentProgress if p["numInputRows"]]
    rows = sum(p["numInputRows"] for p in progress)
    trigger_ms = sum(p["durationMs"]["triggerExecution"] for p in progress)
    landed = spark.read.parquet(settings.lake).count()
    spark.stop()
    if landed != expected:
        raise RuntimeError(f"the lake holds {landed} records, the topic {expected}")
    return {
        "session_start_s": session_s,
        "wall_records_per_s": expected / wall_s,
        "trigger_records_per_s": rows / (trigger_ms / 1000) if trigger_ms else 0.0,
        "batches": len(progress),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    args = parser.parse_args()
    cluster, bootstrap = start_mock_cluster()
    try:
        with tempfile.TemporaryDirectory(prefix="pydory-bench-land-") as tmp:
            records = fill(bootstrap, args.messages, args.value_bytes)
            print(f"topic {TOPIC}: {records:,} records of {args.value_bytes} B available")
            print(f"bare consumer: {bare_consumer_rate(bootstrap, records):,.0f} records/s")
            rates = landing_rates(bootstrap, records, Path(tmp))
            print(
                f"landing job: {rates['wall_records_per_s']:,.0f} records/s query start -> end, "
                f"{rates['trigger_records_per_s']:,.0f} records/s over trigger execution "
                f"({rates['batches']:.0f} batches; SparkSession start-up "
                f"{rates['session_start_s']:.1f} s, not counted)"
            )
    finally:
        stop_process(cluster)


if __name__ == "__main__":
    main()
