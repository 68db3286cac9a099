"""The compiled producer (pydory._cproducer) on librdkafka's mock cluster: what a poll
reports (acknowledgements summed per token and topic, or one by one; failures with what a
resend needs; statistics, errors, log lines), what produce refuses, and that every
message it took is reported exactly once."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from helpers import wait_until
from pydory.daemon.delivery import compiled_producer
from pydory.hotpath import identity_headers
from pydory_tools.testing.mock_cluster import ApiKey, MockCluster

pytestmark = pytest.mark.skipif(
    compiled_producer.compiled_producer_class() is None,
    reason=f"the compiled producer does not run here: {compiled_producer.why}",
)

Polled = tuple[list[Any], list[Any], list[Any], list[Any]]


def producer(mock_cluster: MockCluster, **properties: Any) -> compiled_producer.CompiledProducer:
    settings = {"bootstrap.servers": mock_cluster.bootstrap_servers, "linger.ms": 5}
    settings.update({name.replace("_", "."): value for name, value in properties.items()})
    return compiled_producer.CompiledProducer(settings)


def poll_until(
    p: compiled_producer.CompiledProducer, done: Callable[[Polled], bool], each_ack: bool = False
) -> Polled:
    """Every poll's results, gathered until ``done`` says they are complete."""
    gathered: Polled = ([], [], [], [])

    def more() -> bool:
        result = p._producer.poll(0.05, each_ack)
        if result is not None:
            for into, part in zip(gathered, result, strict=True):
                into.extend(part or [])
        return done(gathered)

    wait_until(more, timeout_s=30, what="the reports")
    return gathered


def summed(acks: list[tuple[int, str, int, int]]) -> dict[tuple[int, str], list[int]]:
    totals: dict[tuple[int, str], list[int]] = {}
    for token, topic, count, data_bytes in acks:
        entry = totals.setdefault((token, topic), [0, 0])
        entry[0] += count
        entry[1] += data_bytes
    return totals


def test_acknowledgements_are_summed_per_token_and_topic_with_their_bytes(
    mock_cluster: MockCluster, unique_topic: Callable[[str], str]
) -> None:
    topics = [unique_topic("a"), unique_topic("b")]
    for topic in topics:
        mock_cluster.create_topic(topic, 3)
    p = producer(mock_cluster)
    expected: dict[tuple[int, str], list[int]] = {}
    for i in range(3000):
        topic, token = topics[i % 2], i // 700
        key = b"k%d" % i if i % 3 else None
        value = b"v" * (i % 50)
        headers = [("pydory-id", b"h%d" % i)] if i % 5 else None
        assert p.produce(topic, -1, value, key, 0, None, 1, token, False, headers) == 0
        entry = expected.setdefault((token, topic), [0, 0])
        entry[0] += 1
        entry[1] += len(value) + len(key or b"")
    sums, each, failures, _ = poll_until(
        p, lambda got: sum(count for *_, count, _ in got[0]) >= 3000
    )
    assert summed(sums) == expected
    assert each == []
    assert failures == []
    assert len(p) == 0
    p.close()


def test_each_acknowledgement_on_its_own_gives_the_timestamp_it_was_sent_with(
    mock_cluster: MockCluster, unique_topic: Callable[[str], str]
) -> None:
    topic = unique_topic("each")
    mock_cluster.create_topic(topic, 2)
    p = producer(mock_cluster)
    sent = {(b"v%d" % i, 1_700_000_000_000 + i, i % 4) for i in range(200)}
    for value, timestamp_ms, token in sent:
        assert p.produce(topic, -1, value, b"k", timestamp_ms, None, 1, token, False, None) == 0
    sums, each, _, _ = poll_until(p, lambda got: len(got[1]) >= 200, each_ack=True)
    assert sums == []
    assert {(value, timestamp_ms, token) for _, _, _, value, timestamp_ms, token in each} == sent
    assert all(t == topic and key == b"k" and 0 <= part < 2 for t, part, key, *_ in each)
    p.close()


def test_a_failure_comes_back_with_what_a_resend_needs(
    mock_cluster: MockCluster, unique_topic: Callable[[str], str]
) -> None:
    topic = unique_topic("fail")
    mock_cluster.create_topic(topic, 1)
    p = producer(mock_cluster, linger_ms=0, retries=0)
    mock_cluster.push_request_errors(ApiKey.PRODUCE, [KafkaError.TOPIC_AUTHORIZATION_FAILED])
    headers = [("pydory-id", b"host/1/7")]
    assert p.produce(topic, 0, b"doomed", b"key", 1234, 99, 3, 42, True, headers) == 0
    _, _, failures, _ = poll_until(p, lambda got: bool(got[2]))
    (failure,) = failures
    code, failed_topic, partition, key, value, timestamp_ms, got_headers = failure[:7]
    token, partition_key, attempt, maybe_in_kafka, status = failure[7:]
    assert (code, failed_topic, partition, key, value) == (
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        topic,
        0,
        b"key",
        b"doomed",
    )
    assert (timestamp_ms, got_headers, token, partition_key, attempt, maybe_in_kafka) == (
        1234,
        headers,
        42,
        99,
        3,
        True,
    )
    assert status in (0, 1, 2)  # librdkafka's persisted status
    p.close()


@pytest.mark.parametrize("form", ["identity run", "list"])
def test_a_burst_carries_each_message_its_identity_in_either_form(
    mock_cluster: MockCluster, unique_topic: Callable[[str], str], form: str
) -> None:
    """produce_burst formats an identity run's headers in C (``(name, prefix, first)``,
    IdentityRun.compiled): each message the same header the list form gives it."""
    topic = unique_topic("ids")
    mock_cluster.create_topic(topic, 1)
    p = producer(mock_cluster, linger_ms=0, retries=0)
    mock_cluster.push_request_errors(ApiKey.PRODUCE, [KafkaError.TOPIC_AUTHORIZATION_FAILED] * 64)
    name, prefix, first = "pydory-id", b"web-7/9b2d4c0e7a1f3355/4/", 99_995
    parsed: list[Any] = [(topic, b"", b"v%d" % i, 1_700_000_000_000 + i) for i in range(12)]
    parsed[3] = None  # not this path's: skipped, yet its index keeps its identity
    expected = identity_headers(name, prefix, first, len(parsed))
    headers = (name, prefix, first) if form == "identity run" else expected
    assert p._producer.produce_burst(parsed, headers, topic, 1 << 20, [(0, 11)], 7) == []
    _, _, failures, _ = poll_until(p, lambda got: len(got[2]) >= 11)
    got = {failure[4]: failure[6] for failure in failures}
    assert got == {b"v%d" % i: expected[i] for i in range(12) if i != 3}
    assert got[b"v5"] == [(name, b"web-7/9b2d4c0e7a1f3355/4/100000")]
    p.close()


def test_produce_burst_refuses_an_identity_run_it_cannot_format(
    mock_cluster: MockCluster, unique_topic: Callable[[str], str]
) -> None:
    topic = unique_topic("bad")
    p = producer(mock_cluster)
    parsed = [(topic, b"", b"v", 0)]
    for bad in [("n", "text", 0), ("n", b"p/", -1), ("n", b"p" * 201, 0), ("n", b"p/")]:
        with pytest.raises((TypeError, ValueError)):
            p._producer.produce_burst(parsed, bad, topic, 1 << 20, [(0, 1)], 1)
    assert len(p) == 0
    p.close()


def test_produce_refuses_with_librdkafkas_code_and_holds_nothing(
    mock_cluster: MockCluster, unique_topic: Callable[[str], str]
) -> None:
    topic = unique_topic("refuse")
    mock_cluster.create_topic(topic, 2)
    p = producer(mock_cluster, message_max_bytes=2000)
    assert p.produce(topic, 0, b"first", None, 0, None, 1, 0, False, None) == 0
    poll_until(p, lambda got: bool(got[0]))  # acknowledged: the topic's metadata is known
    assert p.produce(topic, 7, b"x", None, 0, None, 1, 0, False, None) == (
        KafkaError._UNKNOWN_PARTITION
    )
    assert p.produce(topic, 0, b"x" * 5000, None, 0, None, 1, 0, False, None) == (
        KafkaError.MSG_SIZE_TOO_LARGE
    )
    assert len(p) == 0
    p.close()
    assert p.produce(topic, 0, b"x", None, 0, None, 1, 0, False, None) == KafkaError._DESTROY
    assert len(p) == 0


def test_a_property_librdkafka_refuses_is_a_kafka_exception_in_its_words(
    mock_cluster: MockCluster,
) -> None:
    with pytest.raises(KafkaException) as raised:
        producer(mock_cluster, no_such_property="1")
    assert "no.such.property" in raised.value.args[0].str()
    with pytest.raises(KafkaException):
        producer(mock_cluster, linger_ms="soon")


def test_statistics_errors_and_log_lines_come_through_the_poll(
    mock_cluster: MockCluster, unique_topic: Callable[[str], str], caplog: Any
) -> None:
    topic = unique_topic("events")
    mock_cluster.create_topic(topic, 1)
    logger = logging.getLogger("pydory.test.librdkafka")
    p = producer(mock_cluster, statistics_interval_ms=100, debug="msg", logger=logger)
    assert p.logger is logger
    assert p.produce(topic, 0, b"x", None, 0, None, 1, 0, False, None) == 0
    _, _, _, events = poll_until(
        p, lambda got: {"stats", "log"} <= {event[0] for event in got[3]} and bool(got[0])
    )
    kinds = Counter(event[0] for event in events)
    assert kinds["stats"] >= 1
    assert kinds["log"] >= 1
    stats = next(event[1] for event in events if event[0] == "stats")
    assert '"type": "producer"' in stats or '"type":"producer"' in stats
    p.close()
    # A broker nobody listens on: librdkafka's connection errors arrive as error events.
    lonely = compiled_producer.CompiledProducer(
        {"bootstrap.servers": "127.0.0.1:9", "reconnect.backoff.ms": 10}
    )
    _, _, _, events = poll_until(lonely, lambda got: any(e[0] == "error" for e in got[3]))
    error = next(event for event in events if event[0] == "error")
    assert error[1] in (KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN)
    assert error[3] is False
    lonely.close()


def test_a_purge_reports_every_message_held_as_purged_exactly_once(
    mock_cluster: MockCluster, unique_topic: Callable[[str], str]
) -> None:
    topic = unique_topic("purge")
    mock_cluster.create_topic(topic, 1)
    p = producer(mock_cluster, linger_ms=60_000, batch_num_messages=100_000)
    for i in range(500):
        assert p.produce(topic, 0, b"v%d" % i, None, 0, None, 1, i, False, None) == 0
    assert len(p) == 500
    p.purge()
    _, _, failures, _ = poll_until(p, lambda got: len(got[2]) >= 500)
    assert sorted(f[7] for f in failures) == list(range(500))  # every token once
    assert {f[0] for f in failures} == {KafkaError._PURGE_QUEUE}
    wait_until(lambda: p._producer.poll(0, False) is None and len(p) == 0, what="none held")
    p.close()
