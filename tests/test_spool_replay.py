"""A spool far larger than the memory pool is replayed with bounded memory.

The spool is written by hand (what a crashed daemon leaves behind: Dory's messages as
read, in segment files), then ``pydory serve`` starts on it as a process of its own, so
that its peak resident set (``VmHWM``) is the daemon's alone. The replay admits one burst
at a time, each once the pool has room: memory stays near the pool, not the spool.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from daemon_process import DaemonProcess
from pydory.daemon.spool.segments import Spool
from pydory.wire import encode_any_partition
from pydory_tools.testing.daemon_config import DaemonConfig
from pydory_tools.testing.mock_cluster import MockCluster

pytestmark = pytest.mark.slow

MIB = 1024 * 1024
VALUE_BYTES = 4096
MESSAGES = 60_000  # 240 MiB of values: thirty times the pool
MAX_BUFFER = "8m"
#: Measured (2026-11-25, this 2-core machine, the mock cluster): VmHWM 77-79 MiB after
#: replaying a 159 MiB spool through an 8 MiB pool, and 79 MiB for twice as many messages
#: (318 MiB): the peak does not follow the spool. Re-measured later that day (issue 24's
#: books, issue 25's extension loaded; the same at 78356ef, so it is the machine's state,
#: not the code): 90-91 MiB for 159 MiB, 91-95 MiB for 239 MiB, one CI run at 94.2 MiB beside
#: other work. The bound: 80 MiB, the pool and a replay burst (4 MiB here) twice over,
#: kept well below the spool (the last assertion).
RSS_BOUND_BYTES = 80 * MIB + 2 * (8 + 4) * MIB


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
    daemon = DaemonProcess(config, base / "pydory.xml", base / "pydory.log", wait_ready=False)
    try:
        daemon.wait_ready(120)  # the spool is replayed before the inputs and pages open

        def drained() -> bool:
            books = daemon.books()
            mine = next((t for t in books["topics"] if t["topic"] == topic), {})
            return mine.get("delivered", 0) >= MESSAGES and mine.get("in_flight", 1) == 0

        wait_for(drained, 180, f"{MESSAGES} replayed messages' delivery")
        peak = daemon.peak_rss_bytes()
        books = daemon.books()
        counters = daemon.counters()
    finally:
        status = daemon.stop()
    assert status == 0, daemon.log_path.read_text()
    mine = next(t for t in books["topics"] if t["topic"] == topic)
    assert mine["accepted"] == mine["delivered"] == MESSAGES
    assert counters["spool_replayed"] == MESSAGES
    print(f"spool {spool_bytes / MIB:.0f} MiB, maxBuffer {MAX_BUFFER}: VmHWM {peak / MIB:.1f} MiB")
    assert peak < RSS_BOUND_BYTES, f"VmHWM {peak / MIB:.1f} MiB"
    # The bound is far below the spool (a daemon holding it could not meet the bound);
    # the peak itself is near a daemon's floor, not a fraction of the spool.
    assert spool_bytes * 0.6 > RSS_BOUND_BYTES
    # Every message settled: nothing is left to replay.
    segments = [p for p in spool_dir.iterdir() if p.name.endswith(".spool")]
    assert sum(p.stat().st_size for p in segments) < MIB
