"""The spool end to end: a daemon SIGKILLed with messages it accepted loses none of them.

The daemon runs as its own process (``pydory serve``), so that it can be killed the way
the OOM killer or a careless deploy kills it; Kafka is Apache Kafka (``kafka_broker``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from pydory.client import UnixStreamSender
from pydory.testing.daemon_config import DaemonConfig
from pydory.testing.kafka_broker import KafkaCluster
from pydory.testing.kafka_util import consume_all
from pydory.wire import encode_any_partition

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

START_TIMEOUT_S = 60.0


class DaemonProcess:
    """``pydory serve`` in a process of its own, its output in a log file."""

    def __init__(self, config: DaemonConfig, config_path: Path, log_path: Path) -> None:
        config_path.write_text(config.render())
        self.url = f"http://127.0.0.1:{config.http_port}"
        self._log = log_path.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "pydory", "serve", "--config-path", str(config_path)],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        self.log_path = log_path
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._answers():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise AssertionError(f"pydory serve did not start: {log_path.read_text()}")
            time.sleep(0.05)

    def _answers(self) -> bool:
        try:
            self.books()
        except OSError:
            return False
        return True

    def books(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.url}/books/json", timeout=5) as response:
            books: dict[str, Any] = json.load(response)
        return books

    def kill(self) -> None:
        """SIGKILL: no flush, no shutdown, nothing written after this instant."""
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)
        self._log.close()

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        status = self.process.wait(timeout=60)
        self._log.close()
        return status


@pytest.fixture
def daemon_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # UNIX socket paths are limited to ~108 bytes: keep the directory short.
    return tmp_path_factory.mktemp("sp", numbered=True)


def wait_for(condition: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def topic_books(books: dict[str, Any], topic: str) -> dict[str, Any]:
    return next((t for t in books["topics"] if t["topic"] == topic), {})


def duplicate_lines(discard_log: Path, topic: str) -> int:
    """``DUP`` lines of ``topic`` in the discard log and its rotated files."""
    lines = 0
    for path in discard_log.parent.glob(discard_log.name + "*"):
        lines += sum(
            1 for line in path.read_text().splitlines() if "event: DUP" in line and topic in line
        )
    return lines


def test_messages_waiting_in_librdkafka_survive_a_sigkill(
    kafka_broker: KafkaCluster, unique_topic: Any, daemon_dir: Path
) -> None:
    """The operator's bad day: every message accepted, all of them still in librdkafka's
    batches (a 10 s linger), and the daemon SIGKILLed. The restarted daemon replays them
    from the spool and counts each as a possible duplicate; without the spool all are lost.
    """
    topic = unique_topic("spool-kill")
    kafka_broker.create_topic(topic, 4)
    count = 20_000
    config = DaemonConfig(
        kafka_broker.bootstrap_servers,
        str(daemon_dir),
        batching_time_ms=10_000,  # they wait in librdkafka's batches when the kill comes
        spool_path=str(daemon_dir / "spool"),
        discard_log_path=str(daemon_dir / "discards.log"),
    )
    daemon = DaemonProcess(config, daemon_dir / "pydory.xml", daemon_dir / "daemon.log")
    try:
        with UnixStreamSender(config.stream_path) as stream:
            stream.send_many(encode_any_partition(topic, b"m%06d" % i) for i in range(count))
        wait_for(
            lambda: daemon.books()["received"]["unix_stream"] == count, 30, "the daemon to read"
        )
        assert topic_books(daemon.books(), topic)["delivered"] == 0  # all still in batches
    finally:
        daemon.kill()
    assert list((daemon_dir / "spool").glob("segment-*.spool")), "nothing left in the spool"

    config.batching_time_ms = 20
    restarted = DaemonProcess(config, daemon_dir / "pydory.xml", daemon_dir / "daemon.log")
    try:
        wait_for(
            lambda: topic_books(restarted.books(), topic).get("delivered") == count,
            60,
            "the replayed messages to be delivered",
        )
        books = topic_books(restarted.books(), topic)
    finally:
        assert restarted.stop() == 0
    assert books["accepted"] == count
    assert books["discarded"] == {}
    values = Counter(record.value for record in consume_all(config.bootstrap_servers, topic, count))
    assert set(values) == {b"m%06d" % i for i in range(count)}
    assert all(n == 1 for n in values.values())
    # Each replayed message may have reached Kafka before the kill: counted, not silent.
    assert duplicate_lines(daemon_dir / "discards.log", topic) == count
    # Settled and shut down cleanly: nothing left to replay.
    assert not list((daemon_dir / "spool").glob("segment-*.spool")) or all(
        p.stat().st_size <= 16 for p in (daemon_dir / "spool").glob("segment-*.spool")
    )
