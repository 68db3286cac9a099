"""The Tansu broker through pydory_tools.testing: start, round trip, stop."""

from __future__ import annotations

import os
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from pydory_tools.testing.kafka_util import consume_all, produce_all
from pydory_tools.testing.tansu import TansuBroker, find_tansu_binary

pytestmark = pytest.mark.tansu

ROUND_TRIP_COUNT = 2000


def test_binary_is_bundled_and_executable() -> None:
    binary = find_tansu_binary()
    assert os.access(binary, os.X_OK)


def test_round_trip(tansu_broker: TansuBroker, unique_topic: Callable[[str], str]) -> None:
    topic = unique_topic("roundtrip")
    tansu_broker.create_topic(topic, partitions=4)
    sent = [(f"key-{i % 97}".encode(), str(i).encode()) for i in range(ROUND_TRIP_COUNT)]

    reports = produce_all(tansu_broker.bootstrap_servers, topic, sent)
    # Count by consuming, not by high watermark: Tansu's watermarks undercount.
    records = consume_all(tansu_broker.bootstrap_servers, topic, ROUND_TRIP_COUNT, timeout_s=60)

    assert Counter((r.key, r.value) for r in records) == Counter(sent)
    assert {(r.partition, r.value) for r in records} == {(d.partition, d.value) for d in reports}
    by_partition: dict[int, list[int]] = defaultdict(list)
    for record in records:
        assert record.value is not None
        by_partition[record.partition].append(int(record.value))
    assert len(by_partition) > 1, "keys did not spread over partitions"
    for partition, values in by_partition.items():
        assert values == sorted(values), f"partition {partition} out of order"


def test_created_topic_has_the_requested_partitions(
    tansu_broker: TansuBroker, unique_topic: Callable[[str], str]
) -> None:
    topic = unique_topic("partitions")
    tansu_broker.create_topic(topic, partitions=3)
    admin = AdminClient({"bootstrap.servers": tansu_broker.bootstrap_servers})
    metadata = admin.list_topics(topic, timeout=60)
    assert sorted(metadata.topics[topic].partitions) == [0, 1, 2]


def test_stop_ends_the_process_and_removes_its_temp_dir() -> None:
    broker = TansuBroker()
    pid = broker.pid
    log_path = broker.log_path
    assert pid is not None
    assert log_path.exists()

    broker.stop()
    broker.stop()

    assert broker.pid is None
    assert not log_path.parent.exists()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # reaped by stop(), so the PID is gone


def test_log_dir_given_by_the_caller_is_kept(tmp_path: Path) -> None:
    with TansuBroker(log_dir=tmp_path) as broker:
        log_path = broker.log_path
    assert log_path.exists()
    assert "tansu" in log_path.read_text()
