"""librdkafka statistics: parsing real documents, merging producers, the live view.

The two documents in tests/data were captured from a confluent-kafka producer against
librdkafka's mock cluster (3 brokers, topics "events" with 3 partitions and "audit" with
2; broker 2 answering after 1.5 s, broker 3 taken down):

- librdkafka_stats.json: broker 3 in TRY_CONNECT; broker 2 UP with 12 messages awaiting
  its response (events-1: 5, audit-1: 7); events-2 (broker 3) holding 12 queued messages;
  62 messages in the producer, some of them in librdkafka's unreported transmit queues.
- librdkafka_stats_broker_gone.json: a moment later, broker 3 has left the cluster's
  metadata: librdkafka dropped it and has no broker for events-2 (leader 3).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pydory.daemon.delivery.kafka_stats import (
    EMPTY_SNAPSHOT,
    BrokerStats,
    KafkaStats,
    ProducerStats,
    StatsSnapshot,
    TopicQueues,
    merge,
    parse_statistics,
)

DATA = Path(__file__).parent / "data"
BROKER_TRYING = DATA / "librdkafka_stats.json"
BROKER_GONE = DATA / "librdkafka_stats_broker_gone.json"


def parsed(path: Path, received_at: float = 1000.0) -> ProducerStats:
    return parse_statistics(path.read_text(encoding="utf-8"), received_at=received_at)


def document(path: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return loaded


def by_node(brokers: Any) -> dict[int, BrokerStats]:
    return {b.node_id: b for b in brokers}


# --- one producer's document ------------------------------------------------------------------


def test_topic_queues_split_queued_unsent_and_awaiting_acknowledgement() -> None:
    report = parsed(BROKER_TRYING)
    assert report.topics == {
        "events": TopicQueues("events", batch=12, send_wait=0, ack_wait=5),
        "audit": TopicQueues("audit", batch=0, send_wait=0, ack_wait=7),
    }
    assert report.messages == 62
    assert report.producer == "pydory#producer-2"


def test_broker_fields_come_from_the_document_in_milliseconds() -> None:
    brokers = by_node(parsed(BROKER_TRYING).brokers)
    assert set(brokers) == {1, 2, 3}
    assert brokers[2].state == "UP"
    assert brokers[2].waitresp_requests == 5  # produce requests, one partition each here
    assert brokers[2].outbuf_requests == 0
    assert brokers[3].state == "TRY_CONNECT"
    raw = document(BROKER_TRYING)["brokers"][brokers[1].name]
    assert brokers[1].name == raw["name"] == f"{raw['nodename']}/1"
    assert brokers[1].rtt_avg_ms == raw["rtt"]["avg"] / 1000
    assert brokers[1].rtt_p99_ms == raw["rtt"]["p99"] / 1000
    assert brokers[1].state_age_s == raw["stateage"] / 1_000_000


def test_leader_partitions_counts_the_partitions_each_broker_leads() -> None:
    brokers = by_node(parsed(BROKER_TRYING).brokers)
    # events 0,1,2 led by 1,2,3; audit 0,1 led by 1,2
    assert {n: b.leader_partitions for n, b in brokers.items()} == {1: 2, 2: 2, 3: 1}


def test_a_broker_whose_connection_failed_is_unreachable_and_the_others_are_not() -> None:
    report = parsed(BROKER_TRYING)
    assert {b.node_id: b.unreachable for b in report.brokers} == {1: False, 2: False, 3: True}
    assert report.unroutable == frozenset()


def test_a_broker_gone_from_the_metadata_leaves_its_partitions_unroutable() -> None:
    report = parsed(BROKER_GONE)
    assert set(by_node(report.brokers)) == {1, 2}
    assert report.unroutable == {("events", 2)}
    assert report.topics["events"].batch == 25


def test_round_trips_beyond_the_histogram_report_the_maximum_as_p99() -> None:
    raw = document(BROKER_TRYING)
    name = next(n for n, b in raw["brokers"].items() if b["nodeid"] == 2)
    raw["brokers"][name]["rtt"] |= {"avg": 1_500_000, "max": 1_500_000, "outofrange": 1}
    broker = by_node(parse_statistics(json.dumps(raw)).brokers)[2]
    assert broker.rtt_avg_ms == 1500.0
    assert broker.rtt_p99_ms == 1500.0


def test_messages_in_requests_are_split_by_the_brokers_output_buffer_share() -> None:
    raw = document(BROKER_TRYING)
    name = next(n for n, b in raw["brokers"].items() if b["nodeid"] == 2)
    # Of broker 2's 12 in-request messages, 3 are still waiting to be sent.
    raw["brokers"][name] |= {"outbuf_msg_cnt": 3, "waitresp_msg_cnt": 9}
    topics = parse_statistics(json.dumps(raw)).topics
    assert topics["events"].send_wait + topics["audit"].send_wait == 3
    assert topics["events"].send_wait + topics["events"].ack_wait == 5
    assert topics["audit"].send_wait + topics["audit"].ack_wait == 7


@pytest.mark.parametrize(
    ("state", "age_s", "unreachable"),
    [
        ("UP", 100.0, False),
        ("UPDATE", 0.0, False),
        ("INIT", 100.0, False),  # never tried: only sending there makes librdkafka try
        ("DOWN", 0.0, True),
        ("TRY_CONNECT", 0.0, True),
        ("CONNECT", 0.01, False),  # a normal connection being set up
        ("APIVERSION_QUERY", 0.01, False),
        ("CONNECT", 5.0, True),  # set up for longer than a statistics interval
        ("SSL_HANDSHAKE", 5.0, True),
    ],
)
def test_unreachable_by_state_and_how_long_it_has_lasted(
    state: str, age_s: float, unreachable: bool
) -> None:
    broker = BrokerStats(1, "b/1", state, 0.0, 0.0, 0, 0, 0, 0, 0, 0, state_age_s=age_s)
    assert broker.unreachable is unreachable


@pytest.mark.parametrize("raw", ["", "not json", "[]", '{"name": "x"}'])
def test_a_document_that_is_not_statistics_is_refused(raw: str) -> None:
    with pytest.raises(ValueError, match=r"."):
        parse_statistics(raw)


# --- merging producers -------------------------------------------------------------------------


def test_merging_nothing_is_the_empty_snapshot() -> None:
    assert merge([]) == EMPTY_SNAPSHOT
    assert EMPTY_SNAPSHOT.producers == 0
    assert EMPTY_SNAPSHOT.brokers == ()


def test_merging_producers_adds_their_queues_and_counts_each_led_partition_once() -> None:
    first, second = parsed(BROKER_TRYING, 1000.0), parsed(BROKER_TRYING, 1001.0)
    snapshot = merge([first, second])
    assert snapshot.producers == 2
    assert snapshot.taken_at == 1001.0
    assert snapshot.topics["events"] == TopicQueues("events", 24, 0, 10)
    brokers = by_node(snapshot.brokers)
    assert brokers[2].waitresp_requests == 10
    assert {n: b.leader_partitions for n, b in brokers.items()} == {1: 2, 2: 2, 3: 1}


def test_a_working_connection_in_any_producer_makes_the_broker_reachable() -> None:
    trying = parsed(BROKER_TRYING)
    connected = parse_statistics(
        BROKER_TRYING.read_text(encoding="utf-8").replace('"TRY_CONNECT"', '"UP"')
    )
    assert merge([trying]).unreachable_brokers() == {3}
    assert merge([trying, connected]).unreachable_brokers() == frozenset()


def test_a_failed_connection_outweighs_a_producer_that_never_tried() -> None:
    trying = parsed(BROKER_TRYING)
    untried = parse_statistics(
        BROKER_TRYING.read_text(encoding="utf-8").replace('"TRY_CONNECT"', '"INIT"')
    )
    assert merge([untried]).unreachable_brokers() == frozenset()
    assert merge([untried, trying]).unreachable_brokers() == {3}


def test_unroutable_partitions_are_merged_over_producers() -> None:
    snapshot = merge([parsed(BROKER_TRYING), parsed(BROKER_GONE)])
    assert snapshot.unroutable == {("events", 2)}


def test_held_messages_not_in_requests_count_as_batch() -> None:
    # librdkafka does not report its transmit queues: the dispatcher's own count of
    # messages handed over and not yet reported fills the gap.
    snapshot = merge([parsed(BROKER_TRYING)], held_by_topic={"events": 40, "audit": 22, "x": 0})
    assert snapshot.topics == {
        "audit": TopicQueues("audit", batch=15, send_wait=0, ack_wait=7),
        "events": TopicQueues("events", batch=35, send_wait=0, ack_wait=5),
    }


def test_held_messages_of_a_topic_librdkafka_has_not_reported_yet() -> None:
    snapshot = merge([parsed(BROKER_TRYING)], held_by_topic={"fresh": 3})
    assert snapshot.topics["fresh"] == TopicQueues("fresh", 3, 0, 0)


# --- the live view -------------------------------------------------------------------------------


def test_latest_is_empty_before_the_first_report() -> None:
    assert KafkaStats().latest() == EMPTY_SNAPSHOT


def test_updates_merge_the_latest_report_of_each_producer_and_notify_subscribers() -> None:
    stats = KafkaStats()
    seen: list[StatsSnapshot] = []
    stats.subscribe(seen.append)
    stats.update("p0", parsed(BROKER_TRYING, 1000.0))
    stats.update("p1", parsed(BROKER_TRYING, 1001.0))
    stats.update("p1", parsed(BROKER_GONE, 1002.0))  # replaces p1's earlier report
    assert [s.producers for s in seen] == [1, 2, 2]
    assert stats.latest() is seen[-1]
    assert stats.latest().taken_at == 1002.0
    assert stats.latest().topics["events"].batch == 12 + 25


def test_a_forgotten_producer_no_longer_counts() -> None:
    stats = KafkaStats()
    stats.update("p0", parsed(BROKER_TRYING))
    stats.update("p1", parsed(BROKER_GONE))
    stats.forget("p1")
    stats.forget("never-seen")
    assert stats.latest().producers == 1
    assert stats.latest().unroutable == frozenset()
    stats.forget("p0")
    assert stats.latest() == EMPTY_SNAPSHOT


def test_held_counts_given_with_a_report_are_used_until_the_next() -> None:
    stats = KafkaStats()
    held = {"events": 40}
    stats.update("p0", parsed(BROKER_TRYING), held)
    assert stats.latest().topics["events"].batch == 35
    held["events"] = 20
    stats.update("p0", parsed(BROKER_TRYING))
    assert stats.latest().topics["events"].batch == 15
