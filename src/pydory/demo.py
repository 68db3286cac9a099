"""The demo: an embedded Kafka, the daemon, `pydory send` over all three transports,
and every message read back from Kafka.

It runs what a user would run: the daemon on a generated Dory config, and the
``pydory send`` command line as separate client processes.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass

from pydory.testing.daemon import DaemonConfig, RunningDaemon, running_daemon
from pydory.testing.kafka_util import consume_all
from pydory.testing.mock_cluster import MockCluster
from pydory.testing.tansu import TansuBroker

TOPIC = "demo.events"
PARTITIONS = 4
SETTLE_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class ClientRun:
    """One client process: a transport and the `pydory send` options that choose it."""

    transport: str
    options: tuple[str, ...]
    count: int


def _say(text: str) -> None:
    print(text, flush=True)


@contextlib.contextmanager
def embedded_kafka(kind: str, brokers: int) -> Iterator[str]:
    """Start the chosen Kafka, create the demo topic, yield the bootstrap string."""
    if kind == "mock":
        with MockCluster(brokers) as cluster:
            cluster.create_topic(TOPIC, PARTITIONS)
            _say(
                f"kafka: librdkafka mock cluster, {brokers} brokers at {cluster.bootstrap_servers}"
            )
            yield cluster.bootstrap_servers
    elif kind == "tansu":
        with TansuBroker() as tansu:
            tansu.create_topic(TOPIC, PARTITIONS)
            _say(f"kafka: Tansu broker (pid {tansu.pid}) at {tansu.bootstrap_servers}")
            yield tansu.bootstrap_servers
    else:
        _say(f"kafka: your cluster at {kind} (topic {TOPIC} must exist)")
        yield kind


def _send(daemon: RunningDaemon, run: ClientRun) -> None:
    command = [
        sys.executable,
        "-m",
        "pydory",
        "send",
        *run.options,
        "--topic",
        TOPIC,
        "--value",
        f"hello from {run.transport}",
        "--count",
        str(run.count),
    ]
    subprocess.run(command, check=True, timeout=60)
    _say(f"  sent {run.count:>5} messages over {run.transport:<14} ({' '.join(run.options)})")


def _wait_settled(daemon: RunningDaemon, expected: int) -> dict[str, int]:
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while True:
        topic = daemon.snapshot()["topics"].get(TOPIC, {})
        if topic.get("accepted", 0) >= expected and topic.get("in_flight", 1) == 0:
            return dict(topic)
        if time.monotonic() > deadline:
            raise TimeoutError(f"messages not settled after {SETTLE_TIMEOUT_S} s: {topic}")
        time.sleep(0.05)


def run_demo(kafka: str = "mock", brokers: int = 3, count: int = 1000) -> int:
    """Run the demo; returns 0 when every message sent was read back from Kafka."""
    with (
        tempfile.TemporaryDirectory(prefix="pydory-demo-") as workdir,
        embedded_kafka(kafka, brokers) as bootstrap,
    ):
        config = DaemonConfig(bootstrap, workdir)
        with running_daemon(config) as daemon:
            _say(
                f"daemon: pydory serving on {config.datagram_path}, {config.stream_path}, "
                f"tcp 127.0.0.1:{daemon.tcp_port}"
            )
            runs = [
                ClientRun("unix datagram", ("--socket-path", config.datagram_path), count),
                ClientRun("unix stream", ("--stream-socket-path", config.stream_path), count),
                ClientRun("tcp", ("--port", str(daemon.tcp_port)), count),
                ClientRun(
                    "tcp, keyed",
                    ("--port", str(daemon.tcp_port), "--partition-key", "7"),
                    count,
                ),
            ]
            _say("clients:")
            for run in runs:
                _send(daemon, run)
            sent = sum(run.count for run in runs)
            totals = _wait_settled(daemon, sent)
        records = consume_all(bootstrap, TOPIC, sent, timeout_s=SETTLE_TIMEOUT_S)
    by_value: dict[bytes, int] = {}
    for record in records:
        by_value[record.value or b""] = by_value.get(record.value or b"", 0) + 1
    keyed_partitions = {r.partition for r in records if r.value == b"hello from tcp, keyed"}
    _say("")
    _say(f"{'transport':<16}{'sent':>8}{'in kafka':>10}")
    for run in runs:
        landed = by_value.get(f"hello from {run.transport}".encode(), 0)
        _say(f"{run.transport:<16}{run.count:>8}{landed:>10}")
    _say(
        f"daemon books for {TOPIC}: accepted {totals['accepted']}, delivered "
        f"{totals['delivered']}, in flight {totals['in_flight']}"
    )
    _say(f"partition key 7 -> partition {sorted(keyed_partitions)} (7 % {PARTITIONS} = 3)")
    ok = len(records) == sent and totals["delivered"] == sent and keyed_partitions == {3}
    _say("demo: OK, every message delivered exactly once" if ok else "demo: FAILED")
    return 0 if ok else 1
