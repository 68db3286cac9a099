"""The two Spark connectors of the landing job, next to a bare consumer, on Apache Kafka.

Not a test. Starts one Apache Kafka broker (pydory_tools.testing.kafka_broker, KRaft, its own
JVM), fills a topic of P partitions with N records of V bytes once, then reads all of
them in R interleaved rounds (plus one warm-up round, reported apart), each round:

- bare: one confluent-kafka (librdkafka) consumer, assign() over every partition from
  the start, consume() in batches until it has every record; the clock starts after it
  has connected. The ceiling of reading the topic at all from Python;
- python: the landing job (pydory.pipeline.landing.land, Trigger.AvailableNow, Parquet file sink)
  with ``connector="python"`` (the ``pydory-kafka`` source, librdkafka in Python workers);
- native: the same job with ``connector="native"`` (Spark's own ``kafka`` source, the
  jars from .jars/spark-kafka).

Each landing writes a fresh lake and checkpoint, checked afterwards to hold every record
once. Rates: records / (query start -> termination), which includes planning and the
sink's commit log, and Spark's rate over trigger execution (sum of numInputRows / sum of
durationMs.triggerExecution). The SparkSession is started once, before the rounds; its
start-up is printed apart. Bounded: every read has a timeout, and no new round starts
after --max-seconds.

On a shared machine wall-clock rates follow whatever else runs, so each reading also
reports the CPU it cost, from /proc: "client" is this process and every descendant
except the broker (the bare consumer; the Spark JVM and its Python workers), "broker" is
the broker's JVM. records per client CPU-second does not depend on how busy the machine
is, only on the work a reader does.

    .venv/bin/python benchmarks/connectors.py --messages 200000 --value-bytes 100 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition

from pydory_tools.bench.workload import make_values
from pydory_tools.testing.kafka_broker import KafkaCluster

TOPIC = "bench.connectors"
READ_TIMEOUT_S = 600
READERS = ("bare", "python", "native")
_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def _processes() -> dict[int, tuple[int, float]]:
    """pid -> (parent pid, CPU seconds of it and its reaped children), from /proc."""
    table: dict[int, tuple[int, float]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:  # ended meanwhile
            continue
        utime, stime, cutime, cstime = (int(field) for field in fields[11:15])
        table[int(entry)] = (int(fields[1]), (utime + stime + cutime + cstime) / _TICKS_PER_S)
    return table


def cpu_seconds(broker_pids: set[int]) -> tuple[float, float]:
    """(client, broker) CPU seconds so far: this process's tree without the broker's, and
    the broker's tree."""
    table = _processes()
    children: dict[int, list[int]] = {}
    for pid, (parent, _cpu) in table.items():
        children.setdefault(parent, []).append(pid)

    def tree(root: int, skip: set[int]) -> float:
        total, todo = 0.0, [root]
        while todo:
            pid = todo.pop()
            if pid in skip or pid not in table:
                continue
            total += table[pid][1]
            todo.extend(children.get(pid, ()))
        return total

    broker = sum(tree(pid, set()) for pid in broker_pids)
    return tree(os.getpid(), broker_pids), broker


def measured(
    read: Callable[[], dict[str, Any]], broker_pids: set[int], records: int
) -> dict[str, Any]:
    """``read()``'s figures plus the CPU it cost (client and broker)."""
    client_before, broker_before = cpu_seconds(broker_pids)
    figures = read()
    client_after, broker_after = cpu_seconds(broker_pids)
    figures["client_cpu_s"] = client_after - client_before
    figures["broker_cpu_s"] = broker_after - broker_before
    figures["records_per_client_cpu_s"] = records / max(figures["client_cpu_s"], 1e-9)
    return figures


def fill(bootstrap: str, partitions: int, messages: int, value_bytes: int) -> int:
    """Produce the records round-robin over the partitions; return how many the topic holds."""
    values = make_values(value_bytes, 4096, seed=0)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all"})
    for i in range(messages):
        while True:
            try:
                producer.produce(TOPIC, values[i % len(values)], partition=i % partitions)
                break
            except BufferError:
                producer.poll(0.01)
    if producer.flush(120):
        raise RuntimeError("the topic could not be filled")
    held = sum(high - low for low, high in watermarks(bootstrap, partitions))
    if held != messages:
        raise RuntimeError(f"the topic holds {held} records, {messages} were produced")
    return held


def watermarks(bootstrap: str, partitions: int) -> list[tuple[int, int]]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-watermarks"})
    try:
        return [
            consumer.get_watermark_offsets(TopicPartition(TOPIC, p), timeout=10)
            for p in range(partitions)
        ]
    finally:
        consumer.close()


def bare_consumer(bootstrap: str, partitions: int, expected: int) -> dict[str, float]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "bench-bare",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    topic_partitions = [TopicPartition(TOPIC, p) for p in range(partitions)]
    # Asking every partition's low watermark connects to the leader before the clock
    # starts; the landing job's clock likewise starts after its session exists.
    lows = [consumer.get_watermark_offsets(tp, timeout=10)[0] for tp in topic_partitions]
    consumer.assign([TopicPartition(TOPIC, p, low) for p, low in enumerate(lows)])
    received = 0
    started = time.monotonic()
    try:
        while received < expected:
            if time.monotonic() - started > READ_TIMEOUT_S:
                raise TimeoutError(f"bare consumer read {received} of {expected}")
            # Never ask for more than is left: consume() would wait out its timeout for it.
            batch = consumer.consume(min(10_000, expected - received), 0.5)
            received += sum(1 for r in batch if r.error() is None)
        seconds = time.monotonic() - started
    finally:
        consumer.close()
    if received != expected:
        raise RuntimeError(f"bare consumer read {received} records, the topic holds {expected}")
    return {"records_per_s": expected / seconds, "seconds": seconds}


def landing(spark: Any, bootstrap: str, connector: str, expected: int, workdir: Path) -> Any:
    """One AvailableNow landing into a fresh lake; returns its rates."""
    from pydory.pipeline.landing.land import LandSettings, start_landing

    run = Path(tempfile.mkdtemp(prefix=f"{connector}-", dir=workdir))
    settings = LandSettings(
        bootstrap_servers=bootstrap,
        topics=(TOPIC,),
        lake=str(run / "lake"),
        checkpoint=str(run / "checkpoint"),
        available_now=True,
        connector=connector,  # type: ignore[arg-type]
    )
    try:
        started = time.monotonic()
        query = start_landing(spark, settings)
        if not query.awaitTermination(READ_TIMEOUT_S):
            query.stop()
            raise TimeoutError(f"the {connector} landing did not finish in {READ_TIMEOUT_S} s")
        seconds = time.monotonic() - started
        if query.exception() is not None:
            raise RuntimeError(f"the {connector} landing failed: {query.exception()}")
        progress = [p for p in query.recentProgress if p["numInputRows"]]
        rows = sum(p["numInputRows"] for p in progress)
        trigger_ms = sum(p["durationMs"]["triggerExecution"] for p in progress)
        lake = spark.read.parquet(settings.lake)
        landed = lake.count()
        distinct = lake.select("partition", "offset").distinct().count()
        if not landed == distinct == expected:
            raise RuntimeError(
                f"the {connector} lake holds {landed} rows ({distinct} distinct offsets), "
                f"the topic {expected}"
            )
        return {
            "records_per_s": expected / seconds,
            "seconds": seconds,
            "trigger_records_per_s": rows / (trigger_ms / 1000) if trigger_ms else 0.0,
            "batches": len(progress),
            "source": progress[0]["sources"][0]["description"] if progress else "",
        }
    finally:
        shutil.rmtree(run, ignore_errors=True)


def summary(values: list[float]) -> dict[str, float]:
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5, help="measured rounds (default 5)")
    parser.add_argument("--master", default="local[*]")
    parser.add_argument(
        "--max-seconds",
        type=float,
        default=1800.0,
        help="start no new round after this many seconds (default 1800)",
    )
    parser.add_argument("--json", metavar="FILE", help="also write every figure as JSON")
    args = parser.parse_args()
    began = time.monotonic()

    from pydory.pipeline.spark import find_spark_kafka_jars, spark_session

    if not find_spark_kafka_jars():
        raise SystemExit("no Spark Kafka connector jars: run ./dev jars")
    with KafkaCluster(1) as kafka, tempfile.TemporaryDirectory(prefix="pydory-conn-") as tmp:
        bootstrap = kafka.bootstrap_servers
        kafka.create_topic(TOPIC, args.partitions)
        records = fill(bootstrap, args.partitions, args.messages, args.value_bytes)
        print(
            f"Apache Kafka {kafka.version}, topic {TOPIC}: {records:,} records of "
            f"{args.value_bytes} B in {args.partitions} partitions",
            flush=True,
        )
        session_began = time.monotonic()
        spark = spark_session(master=args.master, app_name="pydory-bench-connectors")
        session_s = time.monotonic() - session_began
        print(f"SparkSession ({args.master}) started in {session_s:.1f} s (not counted)")
        readers: dict[str, Callable[[], dict[str, Any]]] = {
            "bare": lambda: bare_consumer(bootstrap, args.partitions, records),
            "python": lambda: landing(spark, bootstrap, "python", records, Path(tmp)),
            "native": lambda: landing(spark, bootstrap, "native", records, Path(tmp)),
        }
        broker_pids = {pid for pid in map(kafka.pid, kafka.broker_ids) if pid is not None}
        results: dict[str, list[dict[str, Any]]] = {name: [] for name in READERS}
        for round_number in range(args.rounds + 1):
            if round_number and time.monotonic() - began > args.max_seconds:
                print(f"stopping after {round_number - 1} rounds: --max-seconds reached")
                break
            # Rotate the order so that no reader always runs first (or after another).
            order = READERS[round_number % 3 :] + READERS[: round_number % 3]
            label = "warm-up" if round_number == 0 else f"round {round_number}"
            for name in order:
                figures = measured(readers[name], broker_pids, records)
                if round_number:
                    results[name].append(figures)
                extra = ""
                if "trigger_records_per_s" in figures:
                    extra = (
                        f", {figures['trigger_records_per_s']:,.0f} over trigger execution, "
                        f"{figures['batches']} batch(es), source {figures['source']}"
                    )
                print(
                    f"{label:>8} {name:>6}: {figures['records_per_s']:>9,.0f} records/s "
                    f"({figures['seconds']:.1f} s{extra}); CPU s: client "
                    f"{figures['client_cpu_s']:.1f}, broker {figures['broker_cpu_s']:.1f}",
                    flush=True,
                )
        spark.stop()

    print(f"\nover {len(results['bare'])} rounds, min / median / max:")
    report: dict[str, Any] = {"records": records, "session_start_s": session_s, "readers": {}}
    for name in READERS:
        if not results[name]:
            continue
        rounds = results[name]
        report["readers"][name] = {"rounds": rounds}
        lines = []
        for key, what in (
            ("records_per_s", "records/s, wall"),
            ("trigger_records_per_s", "records/s, trigger execution"),
            ("records_per_client_cpu_s", "records per client CPU-second"),
            ("broker_cpu_s", "broker CPU seconds"),
        ):
            if key not in rounds[0]:
                continue
            figures = summary([r[key] for r in rounds])
            report["readers"][name][key] = figures
            number = "{:>9,.1f}" if key == "broker_cpu_s" else "{:>9,.0f}"
            lines.append(
                f"{name:>6} {what:<30} "
                + " / ".join(number.format(figures[k]) for k in ("min", "median", "max"))
            )
        print("\n".join(lines))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
