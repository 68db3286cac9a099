"""``/health`` (liveness) and ``/ready`` (readiness) on the status port (issue 23, item 14).

Through a real ``pydory serve`` process against librdkafka's mock cluster: alive and ready
once Kafka answered; alive but not ready (503, with the reason in JSON) when it started
while every broker was down, and ready once they are back. The readiness rules themselves
(shutdown, no metadata, every broker unreachable) are checked on a view built by hand.
"""

from __future__ import annotations

import json
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest

from daemon_process import DaemonProcess
from helpers import wait_until
from pydory.daemon.delivery.kafka_stats import EMPTY_SNAPSHOT, BrokerStats, StatsSnapshot
from pydory.status.health import readiness
from pydory.status.view import DaemonView
from pydory_tools.testing.daemon_config import DaemonConfig
from pydory_tools.testing.mock_cluster import MockCluster

_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def get(url: str) -> tuple[int, dict[str, Any]]:
    """The status and JSON body of a GET, an HTTP error status included."""
    try:
        with _DIRECT.open(url, timeout=60) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """UNIX socket paths are limited to 107 bytes: keep them short."""
    with tempfile.TemporaryDirectory(prefix="pydory-health-") as path:
        yield Path(path)


# --- through a real daemon -------------------------------------------------------------------


@pytest.mark.slow
def test_a_daemon_with_kafka_is_alive_and_ready(mock_cluster: MockCluster, short_dir: Path) -> None:
    config = DaemonConfig(mock_cluster.bootstrap_servers, str(short_dir))
    daemon = DaemonProcess(config, short_dir / "pydory.xml", short_dir / "daemon.log")
    try:
        status, health = get(f"{daemon.url}/health")
        assert status == 200
        assert health["alive"] is True
        assert health["pid"] == daemon.process.pid
        wait_until(lambda: get(f"{daemon.url}/ready")[0] == 200, what="/ready 200")
        _, ready = get(f"{daemon.url}/ready")
        assert ready["ready"] is True
        assert ready["reason"] is None
        assert ready["checks"]["metadata_known"] is True
        assert ready["checks"]["inputs_open"] is True
    finally:
        assert daemon.stop() == 0


@pytest.mark.slow
def test_a_daemon_started_while_kafka_is_down_is_alive_not_ready_until_it_answers(
    mock_cluster: MockCluster, short_dir: Path
) -> None:
    for broker in mock_cluster.broker_ids:
        mock_cluster.broker_down(broker)
    config = DaemonConfig(mock_cluster.bootstrap_servers, str(short_dir))
    daemon = DaemonProcess(
        config, short_dir / "pydory.xml", short_dir / "daemon.log", wait_ready=False
    )
    try:
        daemon.wait_ready(metadata=False)  # the status pages answer; Kafka does not
        assert get(f"{daemon.url}/health")[0] == 200
        wait_until(lambda: "fetches failed" in (get(f"{daemon.url}/ready")[1]["reason"] or ""))
        status, ready = get(f"{daemon.url}/ready")
        assert status == 503
        assert ready["ready"] is False
        assert ready["reason"].startswith("no metadata from Kafka yet (")
        assert ready["checks"]["metadata_known"] is False
        assert ready["checks"]["inputs_open"] is True  # it takes messages meanwhile
        assert get(f"{daemon.url}/health")[0] == 200  # alive all along

        for broker in mock_cluster.broker_ids:
            mock_cluster.broker_up(broker)
        wait_until(lambda: get(f"{daemon.url}/ready")[0] == 200, timeout_s=120, what="ready")
    finally:
        assert daemon.stop() == 0


# --- the rules, on a view built by hand ---------------------------------------------------------


@dataclass
class Metadata:
    last_updated_ms: int | None = 1
    fetch_failures: int = 0


@dataclass
class CommitPoint:
    shutting_down: bool = False


@dataclass
class Stats:
    snapshot: StatsSnapshot = EMPTY_SNAPSHOT

    def latest(self) -> StatsSnapshot:
        return self.snapshot


@dataclass
class View:
    metadata: Metadata
    commit_point: CommitPoint
    kafka_stats: Stats
    stopping: Any = None
    overload: Any = None


def broker(node_id: int, state: str) -> BrokerStats:
    return BrokerStats(node_id, f"h:{node_id}/{node_id}", state, 0, 0, 0, 0, 0, 0, 0, 1)


def view(**changes: Any) -> DaemonView:
    made = View(Metadata(), CommitPoint(), Stats())
    for name, value in changes.items():
        setattr(made, name, value)
    return cast(DaemonView, made)


def snapshot(*brokers: BrokerStats) -> Stats:
    return Stats(StatsSnapshot(taken_at=1.0, topics={}, brokers=brokers, producers=1))


def test_ready_with_metadata_and_a_broker_to_send_to() -> None:
    assert readiness(view()).ready  # no statistics yet: the metadata's broker answered
    assert readiness(view(kafka_stats=snapshot(broker(1, "DOWN"), broker(2, "UP")))).ready
    assert readiness(view(kafka_stats=snapshot(broker(-1, "DOWN"), broker(2, "INIT")))).ready


def test_not_ready_once_a_shutdown_begins() -> None:
    found = readiness(view(stopping=lambda: True))
    assert found.reason == "shutting down: the inputs are closing"
    assert not found.inputs_open
    assert not readiness(view(commit_point=CommitPoint(shutting_down=True))).ready


def test_not_ready_without_metadata_saying_how_many_fetches_failed() -> None:
    found = readiness(view(metadata=Metadata(last_updated_ms=None, fetch_failures=3)))
    assert found.reason is not None
    assert found.reason.startswith("no metadata from Kafka yet (3 fetches failed since start)")


def test_not_ready_when_every_broker_is_unreachable() -> None:
    found = readiness(view(kafka_stats=snapshot(broker(1, "DOWN"), broker(2, "TRY_CONNECT"))))
    assert found.reason == "every broker is unreachable (librdkafka): h:1/1, h:2/2"
    assert found.as_json()["checks"]["brokers_unreachable"] == 2
