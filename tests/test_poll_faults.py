"""Issue 30: no delivery report is lost to another event's failure in the compiled poll.

A daemon on the compiled producer (pydory._cproducer: its fault hooks, inert unless
armed, stand in for what a test cannot provoke) and librdkafka's mock cluster: a report
whose conversion fails (MemoryError) in the middle of a poll, and librdkafka text that is
not UTF-8 (a log line, an error string: a broker's bytes), while messages flow. Every
message still settles: delivered, the pool released, the commit point past it, the spool
settled.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import producer_backends
from helpers import assert_balanced, settled, wait_until
from pydory.client import UnixStreamSender
from pydory.daemon.delivery import compiled_producer
from pydory.wire import encode_any_partition
from pydory_tools.testing.daemon import DaemonConfig, RunningDaemon
from pydory_tools.testing.kafka_util import consume_all
from pydory_tools.testing.mock_cluster import MockCluster

COUNT = 3_000


@pytest.fixture
def compiled() -> Iterator[object]:
    """The compiled backend, its fault hooks disarmed after the test."""
    with producer_backends.using("compiled"):
        module = compiled_producer.bound()
        yield module
        module._inject_faults(0, 0)


def test_a_failed_report_conversion_and_garbled_text_lose_no_report(
    mock_cluster: MockCluster,
    unique_topic: Callable[[str], str],
    tmp_path: Path,
    compiled: object,
    caplog: pytest.LogCaptureFixture,
) -> None:
    topic = unique_topic("pollfault")
    mock_cluster.create_topic(topic, 4)
    config = DaemonConfig(
        mock_cluster.bootstrap_servers, str(tmp_path), spool_path=str(tmp_path / "spool")
    )
    daemon = RunningDaemon(config).start()
    try:
        with caplog.at_level(logging.DEBUG), UnixStreamSender(config.stream_path) as stream:
            stream.send_many(encode_any_partition(topic, b"m%d" % i) for i in range(100))
            wait_until(settled(daemon, topic, 100), what="connections to every broker")
            # The 500th report converted from now fails; the next 20 log lines and error
            # strings carry bytes that are not UTF-8.
            compiled._inject_faults(500, 20)  # type: ignore[attr-defined]
            mock_cluster.broker_down(1)  # librdkafka says so: log lines, error strings
            rest = range(100, COUNT)
            stream.send_many(encode_any_partition(topic, b"m%d" % i) for i in rest)
            wait_until(
                lambda: any("\ufffd" in r.getMessage() for r in caplog.records),
                what="librdkafka's garbled text, decoded",
            )
            mock_cluster.broker_up(1)
            wait_until(settled(daemon, topic, COUNT), timeout_s=120, what="every report")
        server = daemon.server
        snapshot = daemon.snapshot()
        books = snapshot["topics"][topic]
        assert books["delivered"] == COUNT
        assert_balanced(snapshot)
        assert snapshot["pool_used"] == 0
        assert daemon.call(lambda: server.commit_point.open_messages) == 0
        assert server.spool is not None
        assert daemon.call(lambda: server.spool.outstanding) == 0
    finally:
        daemon.stop()
    # The report that could not be converted was served by a later poll.
    assert any("a poll stopped on MemoryError" in r.getMessage() for r in caplog.records)
    values = sorted(r.value for r in consume_all(mock_cluster.bootstrap_servers, topic, COUNT))
    assert values == sorted(b"m%d" % i for i in range(COUNT))
