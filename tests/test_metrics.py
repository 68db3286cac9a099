"""``/metrics``: the books in Prometheus form, parsed back and checked value by value.

The collector is checked twice: against hand-built books and librdkafka statistics (exact
values for every family), and against a real daemon on the mock cluster (what a scrape
reports matches what the daemon did and what /books/json says).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from pydory.client import DatagramSender, encode_message
from pydory.config.model import HttpInterfaceConfig
from pydory.daemon.books.accounting import Books
from pydory.daemon.books.commit_point import CommitPointView
from pydory.daemon.books.counters import Counters
from pydory.daemon.books.events import DiscardReason, Transport
from pydory.daemon.books.pool import MemoryPool
from pydory.daemon.delivery.kafka_stats import BrokerStats, StatsSnapshot, TopicQueues
from pydory.daemon.delivery.router import MetadataSnapshot
from pydory.daemon.reload import ReloadHistory, ReloadOutcome
from pydory.status.metrics import DaemonCollector, build_registry
from pydory.status.pages import StatusPages
from pydory.status.view import DaemonView
from pydory_tools.testing.daemon import DaemonConfig, RunningDaemon, running_daemon
from pydory_tools.testing.mock_cluster import MockCluster
from test_status import fetch, port_of, send_good_and_bad, wait_until

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Samples:
    """Every sample of a scrape: (name, labels) -> value."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


def names(samples: Samples) -> set[str]:
    return {name for name, _ in samples}


# --- the collector on hand-built books -----------------------------------------------------

NOW = 1_800_000_000.0


class FixedStats:
    def __init__(self, snapshot: StatsSnapshot) -> None:
        self.snapshot = snapshot

    def latest(self) -> StatsSnapshot:
        return self.snapshot


def broker(node_id: int, state: str = "UP", **overrides: Any) -> BrokerStats:
    fields: dict[str, Any] = {
        "node_id": node_id,
        "name": f"127.0.0.1:{9000 + node_id}/{node_id}",
        "state": state,
        "rtt_avg_ms": 2.5,
        "rtt_p99_ms": 40.0,
        "tx_errors": 1,
        "rx_errors": 2,
        "request_timeouts": 3,
        "outbuf_requests": 4,
        "waitresp_requests": 5,
        "leader_partitions": 6,
    }
    return BrokerStats(**(fields | overrides))


@pytest.fixture
def fake_server() -> DaemonView:
    """The parts of a Server the collector reads, with known contents."""
    counters = Counters()
    books = Books(600, 64, wall_clock=lambda: NOW, counters=counters)
    books.received(Transport.UNIX_DGRAM, 10)
    books.received(Transport.TCP, 2)
    books.accepted("orders", 7)
    books.delivered("orders", 4)
    books.discarded(DiscardReason.KAFKA_ERROR, "orders", 1, detail="MSG_SIZE_TOO_LARGE")
    books.discarded(DiscardReason.TOO_LONG, "orders", 1, prefix=b"x")
    books.discarded(DiscardReason.MALFORMED, None, None, prefix=b"junk")
    books.discarded(DiscardReason.MALFORMED, None, None, prefix=b"junk2")
    pool = MemoryPool(1000, clock=lambda: 5.0)
    assert pool.try_allocate(300)
    stats = StatsSnapshot(
        taken_at=NOW - 0.75,
        topics={"orders": TopicQueues("orders", batch=1, send_wait=0, ack_wait=1)},
        brokers=[broker(-1, "INIT"), broker(1), broker(2, "DOWN", rtt_avg_ms=0.0)],
        producers=1,
    )
    metadata = SimpleNamespace(
        last_updated_ms=int((NOW - 30) * 1000),
        last_modified_ms=int((NOW - 90) * 1000),
        fetch_failures=2,
    )
    return DaemonView(
        started_at=NOW - 100,
        http=HttpInterfaceConfig(),
        books=books,
        counters=counters,
        pool=pool,
        kafka_stats=FixedStats(stats),
        metadata=metadata,
        commit_point=SimpleNamespace(current=lambda: CommitPointView(NOW, NOW - 0.25, 4)),
        layout=lambda: MetadataSnapshot({}, {}),
        pending_topic_messages=lambda: 3,
        rerouted=lambda: 9,
        request_metadata_refresh=lambda: None,
        spool=SimpleNamespace(
            directory="/var/lib/pydory/spool",
            max_bytes=1 << 30,
            fsync_interval_ms=1000,
            bytes_on_disk=123_456,
            segments=3,
            outstanding=17,
            appended_total=1000,
            fsyncs_total=12,
            errors_total=1,
            full_total=2,
        ),
        overload=SimpleNamespace(
            policy_name="backpressure", paused=True, paused_seconds=lambda: 2.5
        ),
    )


@pytest.fixture
def scraped(fake_server: DaemonView) -> Samples:
    collector = DaemonCollector(fake_server, clock=lambda: NOW)
    return parse(generate_latest(collector).decode())


def test_messages_per_transport_and_topic(scraped: Samples) -> None:
    assert value(scraped, "pydory_received_messages_total", transport="unix_dgram") == 10
    assert value(scraped, "pydory_received_messages_total", transport="tcp") == 2
    assert value(scraped, "pydory_received_messages_total", transport="unix_stream") == 0
    assert value(scraped, "pydory_accepted_messages_total", topic="orders") == 7
    assert value(scraped, "pydory_delivered_messages_total", topic="orders") == 4
    assert value(scraped, "pydory_in_flight_messages", topic="orders") == 2
    assert value(scraped, "pydory_rerouted_messages_total") == 9


def test_discards_by_reason_and_topic_count_each_discard_once(scraped: Samples) -> None:
    discards = "pydory_discarded_messages_total"
    assert value(scraped, discards, reason="kafka_error", topic="orders") == 1
    assert value(scraped, discards, reason="too_long", topic="orders") == 1
    assert value(scraped, discards, reason="malformed", topic="") == 2
    assert value(scraped, discards, reason="kafka_error", topic="") == 0
    total = sum(v for (name, _), v in scraped.items() if name == discards)
    assert total == 4
    reasons = {dict(labels)["reason"] for name, labels in scraped if name == discards}
    assert reasons == {str(reason) for reason in DiscardReason}


def test_pool_sensors(scraped: Samples) -> None:
    assert value(scraped, "pydory_pool_budget_bytes") == 1000
    assert value(scraped, "pydory_pool_used_bytes") == 300
    assert value(scraped, "pydory_pool_available_bytes") == 700
    assert value(scraped, "pydory_pool_depleted_time_percent") == 0
    assert value(scraped, "pydory_pool_depleted_seconds_total") == 0


def test_queue_depths_per_topic_and_stage(scraped: Samples) -> None:
    for stage, expected in (("batch", 1), ("send_wait", 0), ("ack_wait", 1)):
        assert value(scraped, "pydory_queue_messages", topic="orders", stage=stage) == expected
    assert value(scraped, "pydory_queue_new_messages") == 3
    assert value(scraped, "pydory_kafka_stats_age_seconds") == 0.75


def test_brokers_rtt_errors_and_state_leave_out_bootstrap_entries(scraped: Samples) -> None:
    one = {"broker": "127.0.0.1:9001/1", "node_id": "1"}
    two = {"broker": "127.0.0.1:9002/2", "node_id": "2"}
    assert value(scraped, "pydory_broker_up", **one) == 1
    assert value(scraped, "pydory_broker_up", **two) == 0
    assert value(scraped, "pydory_broker_state", **one, state="UP") == 1
    assert value(scraped, "pydory_broker_state", **two, state="DOWN") == 1
    assert value(scraped, "pydory_broker_rtt_avg_seconds", **one) == 0.0025
    assert value(scraped, "pydory_broker_rtt_p99_seconds", **one) == 0.04
    assert value(scraped, "pydory_broker_tx_errors_total", **one) == 1
    assert value(scraped, "pydory_broker_rx_errors_total", **one) == 2
    assert value(scraped, "pydory_broker_request_timeouts_total", **one) == 3
    assert value(scraped, "pydory_broker_outbuf_requests", **one) == 4
    assert value(scraped, "pydory_broker_waitresp_requests", **one) == 5
    assert value(scraped, "pydory_broker_leader_partitions", **one) == 6
    node_ids = {dict(labels).get("node_id") for name, labels in scraped if "broker" in name}
    assert node_ids == {"1", "2"}


def test_metadata_times_and_identity(scraped: Samples) -> None:
    assert value(scraped, "pydory_metadata_known") == 1
    assert value(scraped, "pydory_metadata_age_seconds") == 30
    assert value(scraped, "pydory_metadata_last_updated_timestamp_seconds") == NOW - 30
    assert value(scraped, "pydory_metadata_last_modified_timestamp_seconds") == NOW - 90
    assert value(scraped, "pydory_metadata_fetch_failures_total") == 2
    assert value(scraped, "pydory_start_time_seconds") == NOW - 100
    build = [labels for name, labels in scraped if name == "pydory_build_info"]
    assert len(build) == 1
    assert dict(build[0])["version"]


def test_before_the_first_metadata_every_page_says_there_is_none_yet(
    fake_server: DaemonView,
) -> None:
    """No broker has answered since start-up: the daemon serves all the same, and says so."""
    never = SimpleNamespace(
        last_updated_ms=None, last_modified_ms=None, fetch_failures=3, fetch_successes=0
    )
    view = dataclasses.replace(fake_server, metadata=never)
    samples = parse(generate_latest(DaemonCollector(view, clock=lambda: NOW)).decode())
    assert value(samples, "pydory_metadata_known") == 0
    assert "pydory_metadata_age_seconds" not in names(samples)
    assert value(samples, "pydory_queue_new_messages") == 3  # what waits for it
    pages = StatusPages(view, clock=lambda: NOW)
    books = pages.books_json()
    assert books["metadata_known"] is False
    assert books["waiting_for_metadata"] == 3
    assert pages.dashboard_json()["metadata"]["known"] is False
    assert pages.metadata_fetch_time_json()["last_updated"] == 0  # Dory's "never"
    plain = pages.metadata_fetch_time_plain()
    assert "metadata last updated at (milliseconds since epoch): 0 (no metadata yet)" in plain
    # Once it is in, /books/json says so.
    assert StatusPages(fake_server, clock=lambda: NOW).books_json()["metadata_known"] is True


def test_commit_point(scraped: Samples) -> None:
    assert value(scraped, "pydory_commit_point_timestamp_seconds") == NOW - 0.25
    assert value(scraped, "pydory_commit_point_lag_seconds") == 0.25
    assert value(scraped, "pydory_commit_point_open_messages") == 4


def test_event_counters(scraped: Samples) -> None:
    assert value(scraped, "pydory_events_total", event="discarded_malformed") == 2
    assert value(scraped, "pydory_events_total", event="accepted") == 7


def test_spool_and_overload(fake_server: DaemonView) -> None:
    fake_server.counters.inc("spool_replayed", 40)  # type: ignore[attr-defined]
    fake_server.counters.inc("spool_unprotected", 5)  # type: ignore[attr-defined]
    fake_server.counters.inc("backpressure_pauses", 3)  # type: ignore[attr-defined]
    scraped = parse(generate_latest(DaemonCollector(fake_server, clock=lambda: NOW)).decode())
    assert value(scraped, "pydory_spool_bytes") == 123_456
    assert value(scraped, "pydory_spool_max_bytes") == 1 << 30
    assert value(scraped, "pydory_spool_segments") == 3
    assert value(scraped, "pydory_spool_outstanding_messages") == 17
    assert value(scraped, "pydory_spool_appended_messages_total") == 1000
    assert value(scraped, "pydory_spool_fsyncs_total") == 12
    assert value(scraped, "pydory_spool_errors_total") == 1
    assert value(scraped, "pydory_spool_full_bursts_total") == 2
    assert value(scraped, "pydory_spool_replayed_messages_total") == 40
    assert value(scraped, "pydory_spool_unprotected_messages_total") == 5
    assert value(scraped, "pydory_overload_policy_info", policy="backpressure") == 1
    assert value(scraped, "pydory_overload_paused") == 1
    assert value(scraped, "pydory_overload_paused_seconds_total") == 2.5
    assert value(scraped, "pydory_overload_pauses_total") == 3


def test_config_reloads(fake_server: DaemonView) -> None:
    history = ReloadHistory("/etc/pydory/pydory.xml", loaded_at=NOW - 100)
    history.record(ReloadOutcome(history.next_attempt(), True, NOW - 50))
    history.record(ReloadOutcome(history.next_attempt(), False, NOW - 10, errors=("bad",)))
    with_reloads = dataclasses.replace(fake_server, reloads=history)
    scraped = parse(generate_latest(DaemonCollector(with_reloads, clock=lambda: NOW)).decode())
    assert value(scraped, "pydory_config_last_reload_successful") == 0
    assert value(scraped, "pydory_config_loaded_timestamp_seconds") == NOW - 50
    assert value(scraped, "pydory_config_reloads_total", outcome="success") == 1
    assert value(scraped, "pydory_config_reloads_total", outcome="failure") == 1
    history.record(ReloadOutcome(history.next_attempt(), True, NOW))
    scraped = parse(generate_latest(DaemonCollector(with_reloads, clock=lambda: NOW)).decode())
    assert value(scraped, "pydory_config_last_reload_successful") == 1


def test_no_spool_no_spool_metrics(fake_server: DaemonView) -> None:
    without = dataclasses.replace(fake_server, spool=None, overload=None)
    scraped = parse(generate_latest(DaemonCollector(without, clock=lambda: NOW)).decode())
    assert not {n for n in names(scraped) if n.startswith(("pydory_spool", "pydory_overload"))}


def test_every_name_is_pydory_and_times_are_in_seconds(scraped: Samples) -> None:
    for name in names(scraped):
        assert name.startswith("pydory_"), name
        assert "_ms" not in name, name  # Prometheus' base unit is the second


# --- a running daemon ----------------------------------------------------------------------


@pytest.fixture
def topic(mock_cluster: MockCluster, unique_topic: Callable[[str], str]) -> str:
    name = unique_topic("metrics")
    mock_cluster.create_topic(name, 3)
    return name


@pytest.fixture
def daemon(
    mock_cluster: MockCluster, tmp_path_factory: pytest.TempPathFactory, topic: str
) -> Iterator[RunningDaemon]:
    socket_dir = str(tmp_path_factory.mktemp("s", numbered=True))
    config = DaemonConfig(mock_cluster.bootstrap_servers, socket_dir, message_max_bytes=2000)
    with running_daemon(config) as running:
        yield running


def scrape(daemon: RunningDaemon) -> Samples:
    reply = fetch(port_of(daemon), "/metrics")
    assert reply.status == 200
    assert reply.content_type.startswith("text/plain; version=")
    return parse(reply.body)


def test_a_scrape_reports_what_the_daemon_did(daemon: RunningDaemon, topic: str) -> None:
    send_good_and_bad(daemon, topic)  # 5 delivered, 1 too long, 3 malformed
    wait_until(
        lambda: (
            scrape(daemon).get(("pydory_delivered_messages_total", frozenset({("topic", topic)})))
            == 5
        ),
        what="5 deliveries in /metrics",
    )
    samples = scrape(daemon)
    assert value(samples, "pydory_received_messages_total", transport="unix_dgram") == 9
    assert value(samples, "pydory_accepted_messages_total", topic=topic) == 5
    assert value(samples, "pydory_in_flight_messages", topic=topic) == 0
    assert value(samples, "pydory_discarded_messages_total", reason="too_long", topic=topic) == 1
    assert value(samples, "pydory_discarded_messages_total", reason="malformed", topic="") == 3

    pool = fetch(port_of(daemon), "/books/json").json()["pool"]
    assert value(samples, "pydory_pool_budget_bytes") == pool["budget"] == 64 * 1024 * 1024
    assert value(samples, "pydory_pool_used_bytes") == 0
    assert value(samples, "pydory_pool_available_bytes") == pool["budget"]

    last_updated_ms = fetch(port_of(daemon), "/metadata_fetch_time/json").json()["last_updated"]
    assert value(samples, "pydory_metadata_last_updated_timestamp_seconds") == (
        last_updated_ms / 1000
    )
    assert value(samples, "pydory_start_time_seconds") == daemon.server.started_at
    assert value(samples, "process_cpu_seconds_total") > 0
    assert value(samples, "process_resident_memory_bytes") > 10 * 1024 * 1024


def test_librdkafkas_brokers_and_queues_appear(
    daemon: RunningDaemon, mock_cluster: MockCluster, topic: str
) -> None:
    # AnyPartition messages go to each partition in turn, 64 at a time: 300 of them reach
    # all 3 partitions, so librdkafka connects to every leader (it connects lazily).
    with DatagramSender(daemon.daemon_config.datagram_path) as sender:
        sender.send_many(encode_message(topic, b"m-%d" % i) for i in range(300))

    def brokers_up() -> set[str]:
        samples = scrape(daemon)
        return {
            dict(labels)["node_id"]
            for (name, labels), up in samples.items()
            if name == "pydory_broker_up" and up == 1
        }

    expected = {str(b) for b in mock_cluster.broker_ids}
    wait_until(lambda: brokers_up() == expected, what=f"brokers {expected} UP in /metrics")
    samples = scrape(daemon)
    for stage in ("batch", "send_wait", "ack_wait"):
        assert ("pydory_queue_messages", frozenset({("topic", topic), ("stage", stage)})) in (
            samples
        )
    for (name, _), rtt in samples.items():
        if name == "pydory_broker_rtt_avg_seconds":
            assert 0 <= rtt < 10
    led = [n for (name, _), n in samples.items() if name == "pydory_broker_leader_partitions"]
    assert sum(led) == 3  # the topic's 3 partitions
    assert value(samples, "pydory_kafka_stats_age_seconds") >= 0


def test_each_server_has_a_registry_of_its_own(daemon: RunningDaemon) -> None:
    # A second registry for the same server: no collision with the first (the global
    # registry would raise on the duplicate process collector), and the same numbers.
    other = build_registry(daemon.server.status_view())
    samples = parse(daemon.call(lambda: generate_latest(other)).decode())
    assert value(samples, "pydory_start_time_seconds") == daemon.server.started_at
    assert time.time() >= value(samples, "pydory_start_time_seconds")


def test_a_daemon_with_a_spool_reports_it(
    mock_cluster: MockCluster, tmp_path_factory: pytest.TempPathFactory, topic: str
) -> None:
    base = tmp_path_factory.mktemp("s", numbered=True)
    config = DaemonConfig(
        mock_cluster.bootstrap_servers,
        str(base),
        spool_path=str(base / "spool"),
        overload_policy="backpressure",
    )
    with running_daemon(config) as daemon:
        with DatagramSender(config.datagram_path) as sender:
            sender.send_many(encode_message(topic, b"m-%d" % i) for i in range(100))

        def settled() -> bool:
            samples = scrape(daemon)
            delivered = ("pydory_delivered_messages_total", frozenset({("topic", topic)}))
            return samples.get(delivered) == 100

        wait_until(settled, what="100 deliveries in /metrics")
        samples = scrape(daemon)
    assert value(samples, "pydory_spool_appended_messages_total") == 100
    assert value(samples, "pydory_spool_outstanding_messages") == 0
    assert value(samples, "pydory_spool_segments") >= 1
    assert value(samples, "pydory_spool_bytes") > 0
    assert value(samples, "pydory_spool_replayed_messages_total") == 0
    assert value(samples, "pydory_overload_policy_info", policy="backpressure") == 1
    assert value(samples, "pydory_overload_paused") == 0
    assert value(samples, "pydory_overload_pauses_total") == 0
