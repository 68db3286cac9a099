"""A graceful stop during a Kafka outage keeps what it could not deliver (issue 20, item 4).

With the spool on, SIGTERM must not keep less than SIGKILL: what librdkafka still holds
when shutdownMaxDelay runs out stays in the spool, counted in the books as
``left_for_next_start`` (not a discard, not in /discards), and the next start replays and
delivers it. The outage is the mock cluster's (every broker down: librdkafka cannot
deliver, and nothing can reach the log); the daemons are real processes.
"""

from __future__ import annotations

import json
import urllib.request
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import producer_backends
from daemon_process import DaemonProcess
from helpers import DISCARD_COUNTS, TOTALS_LINE, wait_until
from pydory.client import UnixStreamSender
from pydory.daemon.spool.records import HEADER_BYTES, decode_records
from pydory.wire import encode_any_partition
from pydory_tools.testing.daemon_config import DaemonConfig
from pydory_tools.testing.kafka_util import consume_all
from pydory_tools.testing.mock_cluster import MockCluster

# Every test on both producer backends (the compiled one and confluent-kafka's).
producer_backend = producer_backends.module_fixture()

pytestmark = pytest.mark.slow

COUNT = 2_000


def topic_books(daemon: DaemonProcess, topic: str) -> dict[str, Any]:
    return next((t for t in daemon.books()["topics"] if t["topic"] == topic), {})


def spooled(spool_dir: Path) -> int:
    """Records in the spool's segments (what the next start would replay)."""
    records = 0
    for segment in spool_dir.glob("segment-*.spool"):
        found, _, _ = decode_records(segment.read_bytes()[HEADER_BYTES:])
        records += len(found)
    return records


def closing_totals(log_path: Path, topic: str) -> tuple[int, ...]:
    """The last closing line the daemon logged for ``topic``: accepted, delivered, possibly
    delivered, left for next start, in flight (and the discards must be none)."""
    lines = [m for m in TOTALS_LINE.finditer(log_path.read_text()) if m["topic"] == topic]
    assert lines, "the daemon logged no totals for the topic"
    last = lines[-1]
    assert DISCARD_COUNTS.findall(last["discarded"]) == [], last.group(0)
    fields = ("accepted", "delivered", "possibly", "left", "in_flight")
    return tuple(int(last[name]) for name in fields)


def commit_point_passed(daemon: DaemonProcess) -> Callable[[], bool]:
    def check() -> bool:
        url = f"{daemon.url}/commit_point/json?after=now&timeout=5"
        with urllib.request.urlopen(url, timeout=60) as reply:
            return bool(json.load(reply)["passed"])

    return check


def test_sigterm_during_an_outage_leaves_the_spool_for_the_next_start(
    mock_cluster: MockCluster, unique_topic: Callable[[str], str], tmp_path: Path
) -> None:
    topic = unique_topic("outage-stop")
    mock_cluster.create_topic(topic, 4)
    spool_dir = tmp_path / "spool"
    config = DaemonConfig(
        mock_cluster.bootstrap_servers,
        str(tmp_path),
        spool_path=str(spool_dir),
        discard_log_path=str(tmp_path / "discards.log"),
        shutdown_max_delay_ms=2_000,
        log_to_stdout=True,  # the closing totals, read from the daemon's log below
    )
    log_path = tmp_path / "daemon.log"
    daemon = DaemonProcess(config, tmp_path / "pydory.xml", log_path)
    try:
        with UnixStreamSender(config.stream_path) as stream:
            stream.send(topic, b"warm-up")  # metadata, a producer, a connection: all known
        wait_until(lambda: topic_books(daemon, topic).get("delivered") == 1, what="warm-up")
        for broker in mock_cluster.broker_ids:
            mock_cluster.broker_down(broker)
        with UnixStreamSender(config.stream_path) as stream:
            stream.send_many(encode_any_partition(topic, b"o%05d" % i) for i in range(COUNT))
        wait_until(
            lambda: topic_books(daemon, topic).get("accepted") == COUNT + 1, what="acceptance"
        )
    finally:
        assert daemon.stop() == 0
    # SIGTERM kept what SIGKILL would have kept: all of it is in the spool, and the books
    # say so instead of calling it a discard.
    accepted, delivered, possibly, left, in_flight = closing_totals(log_path, topic)
    assert (accepted, delivered, possibly, left, in_flight) == (COUNT + 1, 1, 0, COUNT, 0)
    assert spooled(spool_dir) == COUNT
    discard_log = tmp_path / "discards.log"
    assert not discard_log.exists() or "event: DISC" not in discard_log.read_text()

    for broker in mock_cluster.broker_ids:
        mock_cluster.broker_up(broker)
    restarted = DaemonProcess(config, tmp_path / "pydory.xml", log_path)
    try:
        wait_until(commit_point_passed(restarted), timeout_s=120, what="the replay to settle")
        # Settled; /books/json may still serve a page rendered up to 0.1 s before
        # (status/server.py, PAGE_REUSE_S): wait for one rendered since.
        wait_until(lambda: topic_books(restarted, topic).get("in_flight") == 0, what="fresh books")
        books = topic_books(restarted, topic)
        counters = restarted.counters()
    finally:
        assert restarted.stop() == 0
    assert (books["accepted"], books["delivered"], books["discarded"]) == (COUNT, COUNT, {})
    assert counters["spool_replayed"] == COUNT
    values = Counter(r.value for r in consume_all(config.bootstrap_servers, topic, COUNT + 1))
    assert set(values) == {b"warm-up"} | {b"o%05d" % i for i in range(COUNT)}
    assert all(n == 1 for n in values.values())
    assert spooled(spool_dir) == 0
