"""The compiled producer (pydory._cproducer) on librdkafka's mock cluster: what a poll
reports (acknowledgements summed per token and topic, or one by one; failures with what a
resend needs; statistics, errors, log lines), what produce refuses, and that every
message it took is reported exactly once. Every test runs with the report thread (the
daemon's default) and without it (the poll serves the queue itself); the thread's own
behaviour is tests/test_report_thread.py's."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from helpers import reports_until_empty, wait_until
from pydory import wire
from pydory.daemon.delivery import backends, compiled_producer
from pydory.daemon.delivery.compiled_producer import CompiledBackend
from pydory.daemon.delivery.producer_backend import DeliveryReports, PollSinks
from pydory.hotpath import identity_headers
from pydory_tools.testing.mock_cluster import ApiKey, MockCluster

pytestmark = pytest.mark.skipif(
    compiled_producer.bound() is None,
    reason=f"the compiled producer does not run here: {backends.WHY}",
)

if compiled_producer.bound() is not None:
    from pydory import _cproducer

#: A poll's record lists, gathered over polls: ack_sums, acks, failures, events.
Polled = tuple[list[Any], list[Any], list[Any], list[Any]]

#: Whether the producers the tests make have a report thread (the module's fixture).
_THREAD = {"on": True}


@pytest.fixture(autouse=True, scope="module", params=["report thread", "polling thread"])
def report_thread(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every test with the report thread and without it."""
    _THREAD["on"] = request.param == "report thread"
    yield
    _THREAD["on"] = True


def producer(mock_cluster: MockCluster, **properties: Any) -> Any:
    """A ``pydory._cproducer.Producer`` (the C type itself: its records are the subject)."""
    settings = {"bootstrap.servers": mock_cluster.bootstrap_servers, "linger.ms": "5"}
    settings.update({name.replace("_", "."): str(value) for name, value in properties.items()})
    try:
        return _cproducer.Producer(settings, thread=_THREAD["on"])
    except ValueError as error:  # as CompiledBackend raises it
        raise KafkaException(KafkaError(KafkaError._INVALID_ARG, str(error))) from None


def poll_until(p: Any, done: Callable[[Polled], bool], each_ack: bool = False) -> Polled:
    """Every poll's results, gathered until ``done`` says they are complete."""
    gathered: Polled = ([], [], [], [])

    def more() -> bool:
        result = p.poll(0.05, each_ack)
        if result is not None:
            assert result.stopped_by is None
            parts = (result.ack_sums, result.acks, result.failures, result.events)
            for into, part in zip(gathered, parts, strict=True):
                into.extend(part or [])
        return done(gathered)

    wait_until(more, timeout_s=60, what="the reports")
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


def test_sums_stay_exact_when_tokens_alternate_within_an_event_and_overflow_the_slots(
    mock_cluster: MockCluster, unique_topic: Callable[[str], str]
) -> None:
    """The sum found for a message's topic handle is reused for the next message of its
    event only under the same token: tokens changing from one message to the next, and more
    (token, topic) pairs than the producer has slots for (sums handed over mid-event), still
    give every pair its exact count and bytes."""
    topics = [unique_topic("x"), unique_topic("y")]
    for topic in topics:
        mock_cluster.create_topic(topic, 2)
    p = producer(mock_cluster)
    expected: dict[tuple[int, str], list[int]] = {}
    for i in range(4000):
        topic, token = topics[(i // 500) % 2], i % 41  # 82 pairs, more than the slots
        value = b"w" * (i % 7)
        assert p.produce(topic, -1, value, None, 0, None, 1, token, False, None) == 0
        entry = expected.setdefault((token, topic), [0, 0])
        entry[0] += 1
        entry[1] += len(value)
    sums, _, failures, _ = poll_until(p, lambda got: sum(count for *_, count, _ in got[0]) >= 4000)
    assert summed(sums) == expected
    assert failures == []
    p.close()


def test_each_acknowledgement_on_its_own_gives_the_timestamp_it_was_sent_with(
    mock_cluster: MockCluster, unique_topic: Callable[[str], str]
) -> None:
    topic = unique_topic("each")
    mock_cluster.create_topic(topic, 2)
    p = producer(mock_cluster)
    p.report_each_ack()  # from now on (a report thread would sum what comes before a poll)
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
    code, failed_topic, partition, key, value = (
        failure.code,
        failure.topic,
        failure.partition,
        failure.key,
        failure.value,
    )
    timestamp_ms, got_headers, token = failure.timestamp_ms, failure.headers, failure.token
    partition_key, attempt, maybe_in_kafka = (
        failure.partition_key,
        failure.attempt,
        failure.maybe_in_kafka,
    )
    status = failure.status
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
    assert p.produce_burst(parsed, headers, topic, 1 << 20, [(0, 11)], 7) == []
    _, _, failures, _ = poll_until(p, lambda got: len(got[2]) >= 11)
    got = {failure.value: failure.headers for failure in failures}
    assert got == {b"v%d" % i: expected[i] for i in range(12) if i != 3}
    assert got[b"v5"] == [(name, b"web-7/9b2d4c0e7a1f3355/4/100000")]
    p.close()


@pytest.mark.parametrize("form", ["ParsedBurst", "list"])
def test_a_burst_sends_each_message_as_parsed_in_either_form(
    mock_cluster: MockCluster, unique_topic: Callable[[str], str], form: str
) -> None:
    """produce_burst and burst_topics read a ParsedBurst (pydory._cwire.parse_burst: the
    fields in place) as they read the list of tuples: the same messages, keys (an empty
    one as none), values, timestamps (<= 0 as "now": 0 kept) and tokens, the other
    topic's and the too-long ones left out."""
    cwire = pytest.importorskip("pydory._cwire")
    topic, other = unique_topic("parsed"), unique_topic("other")
    mock_cluster.create_topic(topic, 1)
    for name in (topic, other):
        wire.validate_topic(name.encode())
    p = producer(mock_cluster, linger_ms=0, retries=0)
    mock_cluster.push_request_errors(ApiKey.PRODUCE, [KafkaError.TOPIC_AUTHORIZATION_FAILED] * 64)
    frames = [
        wire.encode_any_partition(other if i == 2 else topic, b"v%d" % i, b"k" * (i % 2), ts)
        for i, ts in enumerate([1_700_000_000_000, -5, 0, 7, 9])
    ] + [wire.encode_any_partition(topic, b"x" * 50), b"\x00\x00\x00\x05\x00"]
    if form == "ParsedBurst":
        parsed = cwire.parse_burst(frames, wire._topic_by_bytes)
    else:
        parsed = cwire.parse_any_partition_burst(frames, wire._topic_by_bytes)
    assert _cproducer.burst_topics(parsed, 40) == {topic: (4, 10), other: (1, 2)}
    assert p.produce_burst(parsed, None, topic, 40, [(0, 4)], 7) == []
    _, _, failures, _ = poll_until(p, lambda got: len(got[2]) >= 4)
    got = sorted((f.value, f.key, f.timestamp_ms, f.token) for f in failures)
    assert got == [
        (b"v0", None, 1_700_000_000_000, 7),
        (b"v1", b"k", 0, 7),
        (b"v3", b"k", 7, 7),
        (b"v4", None, 9, 7),
    ]
    p.close()


def test_the_producer_reads_a_parsed_burst_whichever_extension_is_imported_first() -> None:
    """_cproducer finds _cwire's ParsedBurst through a capsule at its own import, even
    where nothing imported _cwire before it (a process of its own)."""
    pytest.importorskip("pydory._cwire")
    code = (
        "from pydory import _cproducer, _cwire, wire; wire.validate_topic(b't'); "
        "frames = [wire.encode_any_partition('t', b'v')]; "
        "print(_cproducer.burst_topics(_cwire.parse_burst(frames, wire._topic_by_bytes), 9))"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.strip() == "{'t': (1, 1)}"


def test_produce_burst_refuses_an_identity_run_it_cannot_format(
    mock_cluster: MockCluster, unique_topic: Callable[[str], str]
) -> None:
    topic = unique_topic("bad")
    p = producer(mock_cluster)
    parsed = [(topic, b"", b"v", 0)]
    for bad in [("n", "text", 0), ("n", b"p/", -1), ("n", b"p" * 201, 0), ("n", b"p/")]:
        with pytest.raises((TypeError, ValueError)):
            p.produce_burst(parsed, bad, topic, 1 << 20, [(0, 1)], 1)
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
    # Nothing refused is held: once what librdkafka still queues is served (a log line or
    # statistics it counts in its outq_len, held whole by a report thread), it counts none.
    poll_until(p, lambda got: len(p) == 0)
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
    p = producer(mock_cluster, statistics_interval_ms=100, debug="msg")
    assert p.produce(topic, 0, b"x", None, 0, None, 1, 0, False, None) == 0

    def kind(event: Any) -> str:
        return type(event).__name__.lower()

    _, _, _, events = poll_until(
        p, lambda got: {"statistics", "log"} <= {kind(event) for event in got[3]} and bool(got[0])
    )
    kinds = Counter(kind(event) for event in events)
    assert kinds["statistics"] >= 1
    assert kinds["log"] >= 1
    stats = next(event.json for event in events if kind(event) == "statistics")
    assert '"type": "producer"' in stats or '"type":"producer"' in stats
    p.close()
    # The backend logs them to the logger its sinks name.
    sinks = PollSinks(DeliveryReports(), None, None, None, lambda error: None, logger)
    properties = {"bootstrap.servers": mock_cluster.bootstrap_servers, "debug": "msg"}
    backend = CompiledBackend(properties, sinks)
    with caplog.at_level(logging.DEBUG, logger=logger.name):
        assert backend.produce(topic, 0, b"x", None, 0, None, 1, 0, False, None) == 0
        wait_until(
            lambda: backend.poll(0.05, False) is None and not len(backend) and caplog.records,
            what="a log line",
        )
    assert any(record.name == logger.name for record in caplog.records)
    backend.close()
    # A broker nobody listens on: librdkafka's connection errors arrive as error events.
    lonely = _cproducer.Producer(
        {"bootstrap.servers": "127.0.0.1:9", "reconnect.backoff.ms": "10"}, thread=_THREAD["on"]
    )
    _, _, _, events = poll_until(lonely, lambda got: any(kind(e) == "error" for e in got[3]))
    error = next(event for event in events if kind(event) == "error")
    assert error.code in (KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN)
    assert error.fatal is False
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
    assert sorted(f.token for f in failures) == list(range(500))  # every token once
    assert {f.code for f in failures} == {KafkaError._PURGE_QUEUE}
    wait_until(lambda: p.poll(0, False) is None and len(p) == 0, what="none held")
    p.close()


@pytest.fixture
def armed_faults() -> Iterator[Callable[[int, int], None]]:
    """``arm(fail_report, garble_texts)``: _cproducer's fault hooks, disarmed after."""
    yield _cproducer._inject_faults
    _cproducer._inject_faults(0, 0)


@pytest.mark.parametrize("each_ack", [False, True])
def test_a_report_that_cannot_be_converted_stays_queued_for_the_next_poll(
    mock_cluster: MockCluster,
    unique_topic: Callable[[str], str],
    armed_faults: Callable[[int, int], None],
    each_ack: bool,
) -> None:
    """Issue 30: a MemoryError while converting a report stops the poll there; the poll
    hands over what it served, and the report that failed and every one after it come
    with the next poll: each message reported exactly once, none lost."""
    topic = unique_topic("nomem")
    mock_cluster.create_topic(topic, 2)
    p = producer(mock_cluster)
    armed_faults(37, 0)  # the 37th report converted from now fails
    for token in range(400):
        assert p.produce(topic, -1, b"v", None, 0, None, 1, token, False, None) == 0
    stopped, tokens = reports_until_empty(p, each_ack)
    assert stopped == [MemoryError]
    assert tokens == Counter(range(400))  # every message once
    p.close()


def test_librdkafka_text_that_is_not_utf8_is_decoded_with_replacement(
    mock_cluster: MockCluster,
    unique_topic: Callable[[str], str],
    armed_faults: Callable[[int, int], None],
) -> None:
    """Issue 30: a log line or error string with bytes that are not UTF-8 (a broker's
    text) comes through with U+FFFD where they were, and the reports with it."""
    topic = unique_topic("garbled")
    mock_cluster.create_topic(topic, 1)
    armed_faults(0, 5)
    p = producer(mock_cluster, debug="broker,topic,msg")
    assert p.produce(topic, 0, b"x", None, 0, None, 1, 0, False, None) == 0
    sums, _, _, events = poll_until(
        p, lambda got: bool(got[0]) and sum(type(e).__name__ == "Log" for e in got[3]) >= 5
    )
    assert sum(entry.messages for entry in sums) == 1
    garbled = [event.text for event in events if type(event).__name__ == "Log"][:5]
    assert all(text.startswith("\ufffd\ufffd ") for text in garbled), garbled
    p.close()


def test_close_is_refused_while_a_poll_waits(
    mock_cluster: MockCluster, unique_topic: Callable[[str], str]
) -> None:
    """Issue 30: close() cannot destroy the queue a poll waits on without the GIL."""
    topic = unique_topic("close")
    mock_cluster.create_topic(topic, 1)
    p = producer(mock_cluster)
    results: list[Any] = []
    waiter = threading.Thread(target=lambda: results.append(p.poll(60.0, False)))
    waiter.start()
    wait_until(lambda: p.polling == 1, what="the poll to wait")
    with pytest.raises(RuntimeError, match="poll"):
        p.close()
    with pytest.raises(RuntimeError, match="poll"):
        p.poll(0, False)  # nor a second poll beside it
    assert p.produce(topic, 0, b"x", None, 0, None, 1, 0, False, None) == 0  # wakes it
    waiter.join(timeout=60)
    assert results
    assert results[0] is not None
    p.close()
    assert p.polling == 0


def test_bind_names_the_librdkafka_confluent_kafka_loaded() -> None:
    """The library bound is the one confluent_kafka.cimpl links (one copy mapped)."""
    import confluent_kafka

    version, library = _cproducer.bind(confluent_kafka.cimpl.__file__)
    assert version == confluent_kafka.libversion()[0]
    with open("/proc/self/maps", encoding="utf-8") as maps:
        mapped = {os.path.realpath(line.split()[-1]) for line in maps if "librdkafka" in line}
    assert mapped == {os.path.realpath(library)}
