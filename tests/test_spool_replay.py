"""A spool far larger than the memory pool is replayed with bounded memory.

The spool is written by hand (what a crashed daemon leaves behind: Dory's messages as
read, in segment files), then ``pydory serve`` starts on it as a process of its own, so
that its peak resident set (``VmHWM``) is the daemon's alone. The replay admits one burst
at a time, each once the pool has room: memory stays near the pool, not the spool.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pydory.daemon.spool import Spool
from pydory.testing.daemon_config import DaemonConfig
from pydory.testing.mock_cluster import MockCluster
from pydory.wire import encode_any_partition

pytestmark = pytest.mark.slow

MIB = 1024 * 1024
VALUE_BYTES = 4096
MESSAGES = 40_000  # 160 MiB of values: twenty times the pool
MAX_BUFFER = "8m"
#: Measured (2026-11-25, this 2-core machine, the mock cluster): VmHWM 77-79 MiB after
#: replaying this 159 MiB spool through an 8 MiB pool, and 79 MiB for twice as many
#: messages (318 MiB): the peak does not follow the spool. The floor, a daemon replaying a
#: 4 MiB spool, is 69 MiB (the interpreter with librdkafka, uvloop, aiohttp loaded).
#: The bound: that floor, the pool and a replay burst (4 MiB here) twice over, for noise.
RSS_BOUND_BYTES = 70 * MIB + 2 * (8 + 4) * MIB


class DaemonProcess:
    """``pydory serve`` in a process of its own, its output in a log file."""

    def __init__(self, config: DaemonConfig, config_path: Path, log_path: Path) -> None:
        config_path.write_text(config.render())
        self.url = f"http://127.0.0.1:{config.http_port}"
        self.log_path = log_path
        self._log = log_path.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "pydory", "serve", "--config-path", str(config_path)],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(f"{self.url}{path}", timeout=5) as response:
            return json.load(response)

    def answers(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"pydory serve exited: {self.log_path.read_text()}")
        try:
            self.get("/books/json")
        except OSError:
            return False
        return True

    def peak_rss_bytes(self) -> int:
        """``VmHWM``: the process's peak resident set so far."""
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmHWM in /proc/PID/status")

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=60)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait(timeout=30)
            self._log.close()


def wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def write_spool(directory: Path, topic: str) -> int:
    """What a crashed daemon leaves: MESSAGES messages, unsettled; returns the bytes."""
    spool = Spool(
        str(directory), segment_bytes=4 * MIB, max_bytes=1024 * MIB, fsync_interval_ms=None
    )
    with spool:
        filler = b"v" * (VALUE_BYTES - 8)
        for start in range(0, MESSAGES, 1000):
            spool.append_payloads(
                [
                    encode_any_partition(topic, b"%08d" % i + filler)
                    for i in range(start, start + 1000)
                ]
            )
        return spool.bytes_on_disk


def test_a_spool_twenty_times_the_pool_replays_with_memory_near_the_pool(
    mock_cluster: MockCluster,
    unique_topic: Callable[[str], str],
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    topic = unique_topic("replay")
    mock_cluster.create_topic(topic, 4)
    base = tmp_path_factory.mktemp("rp", numbered=True)  # short: UNIX socket paths
    spool_dir = base / "spool"
    spool_bytes = write_spool(spool_dir, topic)
    assert spool_bytes > MESSAGES * VALUE_BYTES
    config = DaemonConfig(
        mock_cluster.bootstrap_servers,
        str(base),
        max_buffer=MAX_BUFFER,
        spool_path=str(spool_dir),
        tcp_port=None,
    )
    daemon = DaemonProcess(config, base / "pydory.xml", base / "pydory.log")
    try:
        wait_for(daemon.answers, 120, "the daemon to replay its spool and open")

        def drained() -> bool:
            books = daemon.get("/books/json")
            mine = next((t for t in books["topics"] if t["topic"] == topic), {})
            return mine.get("delivered", 0) >= MESSAGES and mine.get("in_flight", 1) == 0

        wait_for(drained, 180, f"{MESSAGES} replayed messages' delivery")
        peak = daemon.peak_rss_bytes()
        books = daemon.get("/books/json")
        counters = {c["name"]: c["value"] for c in daemon.get("/counters/json")["counters"]}
    finally:
        status = daemon.stop()
    assert status == 0, daemon.log_path.read_text()
    mine = next(t for t in books["topics"] if t["topic"] == topic)
    assert mine["accepted"] == mine["delivered"] == MESSAGES
    assert counters["spool_replayed"] == MESSAGES
    print(f"spool {spool_bytes / MIB:.0f} MiB, maxBuffer {MAX_BUFFER}: VmHWM {peak / MIB:.1f} MiB")
    assert peak < RSS_BOUND_BYTES, f"VmHWM {peak / MIB:.1f} MiB"
    assert peak < spool_bytes / 2
    # Every message settled: nothing is left to replay.
    segments = [p for p in spool_dir.iterdir() if p.name.endswith(".spool")]
    assert sum(p.stat().st_size for p in segments) < MIB
