"""The books: lifecycle invariant, discard reasons, Dory's discard report (JSON and plain)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pydory.daemon.books import counters as counter_names
from pydory.daemon.books.accounting import OTHER_TOPICS, POSSIBLY_DELIVERED_IDS_KEPT, Books
from pydory.daemon.books.counters import Counters
from pydory.daemon.books.events import (
    AFTER_ACCEPTANCE,
    BEFORE_ACCEPTANCE,
    TOPIC_DISCARDS,
    AccountingError,
    DiscardEvent,
    DiscardReason,
    OpenOutcome,
    Transport,
)
from pydory.status.discards import discard_report_json, discard_report_plain

R = DiscardReason


class FakeWallClock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def utc_ctime(epoch_s: float) -> str:
    return time.asctime(time.gmtime(epoch_s))


def make_books(
    start: float = 1000.0, interval_s: int = 600, prefix_size: int = 256, recent_limit: int = 25
) -> tuple[Books, FakeWallClock]:
    clock = FakeWallClock(start)
    return Books(interval_s, prefix_size, wall_clock=clock, recent_limit=recent_limit), clock


def unfinished(books: Books) -> dict[str, Any]:
    report: dict[str, Any] = discard_report_json(books.discard_report())["unfinished_report"]
    return report


def empty_period(report_id: int, start_time: int) -> dict[str, Any]:
    return {
        "id": report_id,
        "start_time": start_time,
        "malformed_msg_count": 0,
        "unix_stream_unclean_disconnect_count": 0,
        "tcp_unclean_disconnect_count": 0,
        "unsupported_api_key_msg_count": 0,
        "unsupported_version_msg_count": 0,
        "bad_topic_msg_count": 0,
        "recent_malformed": [],
        "unix_stream_unclean_disconnect": [],
        "tcp_unclean_disconnect": [],
        "unsupported_msg_version": [],
        "recent_bad_topic": [],
        "recent_too_long_msg": [],
        "rate_limit_discard": [],
        "discard_topic": [],
        "possible_duplicate_topic": [],
        "discards_by_reason": {reason.value: 0 for reason in DiscardReason},
        "kafka_error_discards": {},
        "possibly_delivered_topic": [],
    }


def with_reasons(period: dict[str, Any], **counts: int) -> dict[str, Any]:
    period["discards_by_reason"].update(counts)
    return period


# --- the vocabulary ---------------------------------------------------------------------------


def test_reason_and_transport_values_are_the_stable_strings() -> None:
    assert [r.value for r in DiscardReason] == [
        "malformed",
        "unsupported_api_key",
        "unsupported_version",
        "bad_topic",
        "too_long",
        "no_memory",
        "rate_limit",
        "kafka_error",
        "failed_delivery_attempts",
        "shutdown_delay",
        "unclean_disconnect",
        "spool_corrupt",
    ]
    assert [t.value for t in Transport] == ["unix_dgram", "unix_stream", "tcp"]


def test_every_reason_is_either_before_or_after_acceptance() -> None:
    assert frozenset(DiscardReason) == BEFORE_ACCEPTANCE | AFTER_ACCEPTANCE
    assert not BEFORE_ACCEPTANCE & AFTER_ACCEPTANCE
    assert {R.KAFKA_ERROR, R.FAILED_DELIVERY_ATTEMPTS, R.SHUTDOWN_DELAY} == AFTER_ACCEPTANCE


def test_counters_count_by_name() -> None:
    counters = Counters()
    counters.inc("a")
    counters.inc("b", 5)
    counters.inc("a", 2)
    assert counters.get("a") == 3
    assert counters.get("never") == 0
    assert counters.snapshot() == {"a": 3, "b": 5}


# --- where each reason lands --------------------------------------------------------------------


def test_malformed_counts_and_keeps_the_prefix() -> None:
    books, _ = make_books(prefix_size=8)
    books.discarded(R.MALFORMED, None, None, prefix=b"\x00\x00\x00\x05abc")
    expected = with_reasons(empty_period(0, 1000), malformed=1)
    expected |= {"malformed_msg_count": 1, "recent_malformed": ["AAAABWFiYw=="]}
    assert unfinished(books) == expected


def test_unsupported_api_key_is_only_counted() -> None:
    books, _ = make_books()
    books.discarded(R.UNSUPPORTED_API_KEY, None, None, prefix=b"whatever")
    expected = with_reasons(empty_period(0, 1000), unsupported_api_key=1)
    expected["unsupported_api_key_msg_count"] = 1
    assert unfinished(books) == expected


def test_unsupported_version_is_counted_per_version() -> None:
    books, _ = make_books()
    for version in (3, 1, 3):
        books.discarded(R.UNSUPPORTED_VERSION, None, None, api_version=version)
    expected = with_reasons(empty_period(0, 1000), unsupported_version=3)
    expected["unsupported_version_msg_count"] = 3
    expected["unsupported_msg_version"] = [
        {"version": 1, "count": 1},
        {"version": 3, "count": 2},
    ]
    assert unfinished(books) == expected


def test_bad_topic_keeps_the_name_and_no_per_topic_books() -> None:
    books, _ = make_books()
    books.discarded(R.BAD_TOPIC, "no/such topic", 1_700_000_000_000)
    expected = with_reasons(empty_period(0, 1000), bad_topic=1)
    expected |= {"bad_topic_msg_count": 1, "recent_bad_topic": ["no/such topic"]}
    assert unfinished(books) == expected
    assert books.per_topic() == {}  # garbage names must not grow the per-topic books


def test_too_long_keeps_topic_space_value_cut_to_the_prefix_size() -> None:
    books, _ = make_books(prefix_size=8)
    books.discarded(R.TOO_LONG, "logs", 1_700_000_000_005, prefix=b"0123456789")
    expected = with_reasons(empty_period(0, 1000), too_long=1)
    expected["recent_too_long_msg"] = ["bG9ncyAwMTI="]  # b"logs 012"
    expected["discard_topic"] = [
        {
            "topic": "logs",
            "min_timestamp": 1_700_000_000_005,
            "max_timestamp": 1_700_000_000_005,
            "count": 1,
        }
    ]
    assert unfinished(books) == expected


def test_rate_limit_is_in_rate_limit_discard_and_in_discard_topic() -> None:
    books, _ = make_books()
    books.discarded(R.RATE_LIMIT, "clicks", 20)
    books.discarded(R.RATE_LIMIT, "clicks", 10)
    expected = with_reasons(empty_period(0, 1000), rate_limit=2)
    expected["rate_limit_discard"] = [{"topic": "clicks", "count": 2}]
    expected["discard_topic"] = [
        {"topic": "clicks", "min_timestamp": 10, "max_timestamp": 20, "count": 2}
    ]
    assert unfinished(books) == expected


@pytest.mark.parametrize(
    "reason", [R.NO_MEMORY, R.KAFKA_ERROR, R.FAILED_DELIVERY_ATTEMPTS, R.SHUTDOWN_DELAY]
)
def test_topic_discards_appear_only_in_discard_topic(reason: DiscardReason) -> None:
    books, _ = make_books()
    if reason in AFTER_ACCEPTANCE:
        books.accepted("t")
    books.discarded(reason, "t", 42, detail="REQUEST_TIMED_OUT")
    expected = with_reasons(empty_period(0, 1000), **{reason.value: 1})
    expected["discard_topic"] = [
        {"topic": "t", "min_timestamp": 42, "max_timestamp": 42, "count": 1}
    ]
    if reason is R.KAFKA_ERROR:
        expected["kafka_error_discards"] = {"REQUEST_TIMED_OUT": 1}
    assert unfinished(books) == expected


@pytest.mark.parametrize(
    ("transport", "count_key", "list_key"),
    [
        (
            Transport.UNIX_STREAM,
            "unix_stream_unclean_disconnect_count",
            "unix_stream_unclean_disconnect",
        ),
        (Transport.TCP, "tcp_unclean_disconnect_count", "tcp_unclean_disconnect"),
    ],
)
def test_unclean_disconnect_is_reported_per_stream_transport(
    transport: Transport, count_key: str, list_key: str
) -> None:
    books, _ = make_books()
    books.discarded(R.UNCLEAN_DISCONNECT, None, None, prefix=b"partial", transport=transport)
    expected = with_reasons(empty_period(0, 1000), unclean_disconnect=1)
    expected |= {count_key: 1, list_key: ["cGFydGlhbA=="]}
    assert unfinished(books) == expected


def test_spool_corrupt_is_a_discard_before_acceptance_with_no_topic() -> None:
    """A message of the previous run's spool that could not be read back (issue 20)."""
    events: list[DiscardEvent] = []

    class Sink:
        def discarded(self, event: DiscardEvent) -> None:
            events.append(event)

        def possible_duplicate(self, topic: str, client_timestamp_ms: int) -> None:
            raise AssertionError("not a duplicate")

    books, _ = make_books()
    books.set_discard_sink(Sink())
    books.discarded(R.SPOOL_CORRUPT, None, None, prefix=b"\xfe\x00", detail="segment-1 [16, 55)")
    assert R.SPOOL_CORRUPT in BEFORE_ACCEPTANCE
    assert R.SPOOL_CORRUPT not in TOPIC_DISCARDS
    assert unfinished(books) == with_reasons(empty_period(0, 1000), spool_corrupt=1)
    assert books.per_topic() == {}
    assert books.lifetime_discards_by_reason()[R.SPOOL_CORRUPT] == 1
    assert books.counters.get("discarded_spool_corrupt") == 1
    assert [(e.reason, e.topic, e.message, e.detail) for e in events] == [
        (R.SPOOL_CORRUPT, None, b"\xfe\x00", "segment-1 [16, 55)")
    ]


def test_possible_duplicates_have_their_own_topic_intervals() -> None:
    books, _ = make_books()
    for ts in (500, 300, 400):
        books.possible_duplicate("t", ts)
    expected = empty_period(0, 1000)
    expected["possible_duplicate_topic"] = [
        {"topic": "t", "min_timestamp": 300, "max_timestamp": 500, "count": 3}
    ]
    assert unfinished(books) == expected
    assert books.counters.get("possible_duplicate") == 3
    assert books.lifetime_discards_by_reason() == dict.fromkeys(DiscardReason, 0)


class RecordingSink:
    def __init__(self) -> None:
        self.events: list[DiscardEvent] = []

    def discarded(self, event: DiscardEvent) -> None:
        self.events.append(event)

    def possible_duplicate(self, topic: str, client_timestamp_ms: int) -> None:
        raise AssertionError("not expected here")


def test_the_identities_of_possibly_delivered_messages_are_kept_up_to_a_bound_per_topic() -> None:
    books, _ = make_books()
    books.accepted("t", POSSIBLY_DELIVERED_IDS_KEPT + 3)
    books.accepted("u", 1)
    for i in range(POSSIBLY_DELIVERED_IDS_KEPT + 2):
        books.possibly_delivered("t", 700, b"v", b"", "_MSG_TIMED_OUT", f"h/{i:016x}/1/{i}")
    books.possibly_delivered("t", 700, b"v", b"", "_MSG_TIMED_OUT", None)  # headers off
    books.possibly_delivered("u", 700, b"v", b"", "_TRANSPORT", "h/00000000000000ff/0/1")
    per_topic = books.per_topic()
    kept = per_topic["t"].possibly_delivered_ids
    assert per_topic["t"].possibly_delivered == POSSIBLY_DELIVERED_IDS_KEPT + 3
    assert len(kept) == POSSIBLY_DELIVERED_IDS_KEPT
    assert kept[:2] == ("h/0000000000000000/1/0", "h/0000000000000001/1/1")
    assert per_topic["u"].possibly_delivered_ids == ("h/00000000000000ff/0/1",)


def test_possibly_delivered_is_its_own_outcome_not_a_discard() -> None:
    books, _ = make_books()
    sink = RecordingSink()
    books.set_discard_sink(sink)
    books.accepted("t", 3)
    books.delivered("t")
    books.possibly_delivered("t", 700, b"value", b"key", "_MSG_TIMED_OUT")
    totals = books.per_topic()["t"]
    assert (totals.delivered, totals.possibly_delivered, totals.in_flight) == (1, 1, 1)
    assert totals.discarded_after_acceptance == 0
    assert books.lifetime_discards_by_reason() == dict.fromkeys(DiscardReason, 0)
    expected = empty_period(0, 1000)
    expected["possibly_delivered_topic"] = [
        {"topic": "t", "min_timestamp": 700, "max_timestamp": 700, "count": 1}
    ]
    assert unfinished(books) == expected
    assert "possibly delivered topic: 1[t]" in discard_report_plain(books.discard_report())
    assert books.counters.get(counter_names.POSSIBLY_DELIVERED) == 1
    (event,) = sink.events
    assert (event.reason, event.topic, event.key, event.message, event.detail) == (
        OpenOutcome.POSSIBLY_DELIVERED,
        "t",
        b"key",
        b"value",
        "_MSG_TIMED_OUT",
    )


def test_left_for_next_start_is_neither_a_discard_nor_in_the_report() -> None:
    books, _ = make_books()
    sink = RecordingSink()
    books.set_discard_sink(sink)
    books.accepted("t", 4)
    books.left_for_next_start("t", 3)
    totals = books.per_topic()["t"]
    assert (totals.left_for_next_start, totals.in_flight) == (3, 1)
    assert unfinished(books) == empty_period(0, 1000)
    assert sink.events == []
    assert books.counters.get(counter_names.LEFT_FOR_NEXT_START) == 3


def test_an_open_outcome_without_a_message_in_flight_is_a_bug() -> None:
    books, _ = make_books()
    books.accepted("t", 1)
    books.left_for_next_start("t")
    with pytest.raises(AccountingError):
        books.left_for_next_start("t")
    with pytest.raises(AccountingError):
        books.possibly_delivered("t", 1, b"", b"", "_MSG_TIMED_OUT")
    assert books.per_topic()["t"].left_for_next_start == 1


def test_topic_intervals_are_sorted_by_topic() -> None:
    books, _ = make_books()
    for topic in ("zeta", "alpha", "mid"):
        books.discarded(R.NO_MEMORY, topic, 1)
    assert [e["topic"] for e in unfinished(books)["discard_topic"]] == ["alpha", "mid", "zeta"]


@pytest.mark.parametrize(
    ("reason", "kwargs", "message"),
    [
        (R.NO_MEMORY, {"topic": None, "client_timestamp_ms": 1}, "needs the topic"),
        (R.RATE_LIMIT, {"topic": "t", "client_timestamp_ms": None}, "client timestamp"),
        (R.BAD_TOPIC, {"topic": None, "client_timestamp_ms": None}, "rejected topic name"),
        (R.UNSUPPORTED_VERSION, {"topic": None, "client_timestamp_ms": None}, "api_version"),
        (
            R.UNCLEAN_DISCONNECT,
            {"topic": None, "client_timestamp_ms": None, "transport": Transport.UNIX_DGRAM},
            "stream transport",
        ),
        (R.UNCLEAN_DISCONNECT, {"topic": None, "client_timestamp_ms": None}, "stream transport"),
    ],
)
def test_a_discard_missing_what_its_report_entry_needs_is_rejected(
    reason: DiscardReason, kwargs: dict[str, Any], message: str
) -> None:
    books, _ = make_books()
    with pytest.raises(ValueError, match=message):
        books.discarded(reason, **kwargs)
    assert unfinished(books) == empty_period(0, 1000)
    assert sum(books.lifetime_discards_by_reason().values()) == 0


# --- recent lists -------------------------------------------------------------------------------


def test_recent_lists_keep_the_newest_items_newest_first() -> None:
    books, _ = make_books(recent_limit=3)
    for prefix in (b"aaaa", b"bbbb", b"cccc", b"dddd"):
        books.discarded(R.MALFORMED, None, None, prefix=prefix)
    report = unfinished(books)
    assert report["malformed_msg_count"] == 4
    assert report["recent_malformed"] == ["ZGRkZA==", "Y2NjYw==", "YmJiYg=="]  # d, c, b


def test_a_repeated_item_moves_to_the_front_instead_of_repeating() -> None:
    books, _ = make_books(recent_limit=3)
    for topic in ("a", "b", "c", "a"):
        books.discarded(R.BAD_TOPIC, topic, None)
    report = unfinished(books)
    assert report["bad_topic_msg_count"] == 4
    assert report["recent_bad_topic"] == ["a", "c", "b"]


def test_prefixes_are_cut_to_bad_msg_prefix_size() -> None:
    books, _ = make_books(prefix_size=1)
    books.discarded(R.MALFORMED, None, None, prefix=b"xyz")
    books.discarded(R.UNCLEAN_DISCONNECT, None, None, prefix=b"xyz", transport=Transport.TCP)
    report = unfinished(books)
    assert report["recent_malformed"] == ["eA=="]
    assert report["tcp_unclean_disconnect"] == ["eA=="]


# --- reporting periods --------------------------------------------------------------------------


def test_no_finished_period_before_the_first_interval_ends() -> None:
    books, clock = make_books(start=1000, interval_s=600)
    books.discarded(R.MALFORMED, None, None, prefix=b"x")
    clock.now = 1599.9
    report = books.discard_report()
    assert report.latest_finished is None
    assert "finished_report" not in discard_report_json(report)
    assert report.unfinished.malformed_msg_count == 1


def test_rolling_moves_the_period_to_finished_and_starts_the_next_id() -> None:
    books, clock = make_books(start=1000, interval_s=600)
    books.discarded(R.MALFORMED, None, None, prefix=b"x")
    clock.now = 1600
    books.maybe_roll()
    books.discarded(R.UNSUPPORTED_API_KEY, None, None)
    body = discard_report_json(books.discard_report())
    finished = with_reasons(empty_period(0, 1000), malformed=1)
    finished |= {"malformed_msg_count": 1, "recent_malformed": ["eA=="]}
    current = with_reasons(empty_period(1, 1600), unsupported_api_key=1)
    current["unsupported_api_key_msg_count"] = 1
    assert body == {"unfinished_report": current, "finished_report": finished}


def test_an_event_after_the_interval_lands_in_the_new_period_without_explicit_roll() -> None:
    books, clock = make_books(start=1000, interval_s=600)
    clock.now = 1700
    books.discarded(R.RATE_LIMIT, "t", 5)
    report = books.discard_report()
    assert report.unfinished.id == 1
    assert report.unfinished.rate_limit_discard == (("t", 1),)
    assert report.latest_finished is not None
    assert report.latest_finished.rate_limit_discard == ()


def test_several_unobserved_periods_leave_an_empty_finished_period_on_the_grid() -> None:
    books, clock = make_books(start=1000, interval_s=600)
    books.discarded(R.MALFORMED, None, None, prefix=b"x")
    clock.now = 1000 + 3 * 600 + 10  # periods 1 and 2 went by unobserved
    body = discard_report_json(books.discard_report())
    assert body == {
        "unfinished_report": empty_period(3, 2800),
        "finished_report": empty_period(2, 2200),
    }
    # The lifetime totals still have the discard the lost period held.
    assert books.lifetime_discards_by_reason()[R.MALFORMED] == 1


def test_a_wall_clock_set_back_never_rolls() -> None:
    books, clock = make_books(start=1000, interval_s=600)
    clock.now = 10
    books.discarded(R.MALFORMED, None, None, prefix=b"x")
    assert books.discard_report().unfinished.id == 0


def test_interval_zero_disables_rolling() -> None:
    books, clock = make_books(start=1000, interval_s=0)
    clock.now = 10**9
    assert books.discard_report().unfinished.id == 0


# --- Dory's exact output ------------------------------------------------------------------------

# From a real Dory 3.2.6 run against the librdkafka mock cluster
# (shared/compat/dory-http-samples/mock_discards_json.txt).
DORY_MOCK_UNFINISHED_REPORT = {
    "id": 0,
    "start_time": 1795246677,
    "malformed_msg_count": 0,
    "unix_stream_unclean_disconnect_count": 0,
    "tcp_unclean_disconnect_count": 0,
    "unsupported_api_key_msg_count": 0,
    "unsupported_version_msg_count": 0,
    "bad_topic_msg_count": 0,
    "recent_malformed": [],
    "unix_stream_unclean_disconnect": [],
    "tcp_unclean_disconnect": [],
    "unsupported_msg_version": [],
    "recent_bad_topic": [],
    "recent_too_long_msg": [],
    "rate_limit_discard": [],
    "discard_topic": [
        {
            "topic": "dory_test",
            "min_timestamp": 1795246679208,
            "max_timestamp": 1795246679214,
            "count": 23,
        }
    ],
    "possible_duplicate_topic": [],
}

# The period part of mock_discards_plain.txt (the status server writes the header).
DORY_MOCK_PLAIN_PERIODS = """\
current (unfinished) reporting period:
    report ID: 0
    start time: 1795246677 Sat Nov 21 07:37:57 2026
    malformed msg count: 0
    UNIX stream unclean disconnect count: 0
    TCP unclean disconnect count: 0
    unsupported API key msg count: 0
    unsupported version msg count: 0
    bad topic msg count: 0

    discard topic: 9[dory_test] begin [1795246679208] end [1795246679214] count 23
"""


def replay_dory_mock_run() -> Books:
    """23 messages of dory_test discarded on Kafka error ACKs, as in Dory's sample."""
    books = Books(600, 256, wall_clock=lambda: 1795246677)
    books.accepted("dory_test", 23)
    for i in range(23):
        timestamp = 1795246679208 + i % 7  # 208 .. 214
        books.discarded(R.KAFKA_ERROR, "dory_test", timestamp, detail="NOT_ENOUGH_REPLICAS")
    return books


def test_json_reproduces_dorys_sample_and_adds_only_new_keys() -> None:
    report = unfinished(replay_dory_mock_run())
    dory_keys = list(DORY_MOCK_UNFINISHED_REPORT)
    assert list(report)[: len(dory_keys)] == dory_keys  # same keys, same order
    assert {key: report[key] for key in dory_keys} == DORY_MOCK_UNFINISHED_REPORT
    assert report["discards_by_reason"]["kafka_error"] == 23
    assert report["kafka_error_discards"] == {"NOT_ENOUGH_REPLICAS": 23}


def test_plain_reproduces_dorys_sample() -> None:
    plain = discard_report_plain(replay_dory_mock_run().discard_report(), format_time=utc_ctime)
    assert plain == DORY_MOCK_PLAIN_PERIODS


def test_json_reproduces_dorys_tansu_possible_duplicate_sample() -> None:
    books = Books(600, 256, wall_clock=lambda: 1795246482)
    for i in range(72):
        books.possible_duplicate("dory_test", 1795246490323 + i % 7)
    assert unfinished(books)["possible_duplicate_topic"] == [
        {
            "topic": "dory_test",
            "min_timestamp": 1795246490323,
            "max_timestamp": 1795246490329,
            "count": 72,
        }
    ]


def scripted_scenario() -> Books:
    """Every kind of report entry, across one period roll."""
    books, clock = make_books(start=1000, interval_s=600, prefix_size=8, recent_limit=3)
    # Period 0.
    books.discarded(R.MALFORMED, None, None, prefix=b"\x00\x00\x00\x05abc")
    books.accepted("clicks", 3)
    books.delivered("clicks", 1)
    books.discarded(R.KAFKA_ERROR, "clicks", 1_700_000_000_123, detail="MSG_SIZE_TOO_LARGE")
    books.discarded(R.RATE_LIMIT, "clicks", 1_700_000_000_100)
    # Period 1.
    clock.now = 1650
    books.discarded(R.BAD_TOPIC, "no such topic", None)
    books.discarded(R.UNSUPPORTED_VERSION, None, None, prefix=b"v", api_version=3)
    books.discarded(R.UNCLEAN_DISCONNECT, None, None, prefix=b"partial", transport=Transport.TCP)
    books.discarded(R.TOO_LONG, "logs", 1_700_000_000_400, prefix=b"0123456789")
    books.possible_duplicate("clicks", 1_700_000_000_200)
    clock.now = 1700
    return books


def test_json_of_a_scripted_scenario_matches_the_hand_written_report() -> None:
    assert discard_report_json(scripted_scenario().discard_report()) == {
        "unfinished_report": {
            "id": 1,
            "start_time": 1600,
            "malformed_msg_count": 0,
            "unix_stream_unclean_disconnect_count": 0,
            "tcp_unclean_disconnect_count": 1,
            "unsupported_api_key_msg_count": 0,
            "unsupported_version_msg_count": 1,
            "bad_topic_msg_count": 1,
            "recent_malformed": [],
            "unix_stream_unclean_disconnect": [],
            "tcp_unclean_disconnect": ["cGFydGlhbA=="],
            "unsupported_msg_version": [{"version": 3, "count": 1}],
            "recent_bad_topic": ["no such topic"],
            "recent_too_long_msg": ["bG9ncyAwMTI="],
            "rate_limit_discard": [],
            "discard_topic": [
                {
                    "topic": "logs",
                    "min_timestamp": 1_700_000_000_400,
                    "max_timestamp": 1_700_000_000_400,
                    "count": 1,
                }
            ],
            "possible_duplicate_topic": [
                {
                    "topic": "clicks",
                    "min_timestamp": 1_700_000_000_200,
                    "max_timestamp": 1_700_000_000_200,
                    "count": 1,
                }
            ],
            "discards_by_reason": {
                "malformed": 0,
                "unsupported_api_key": 0,
                "unsupported_version": 1,
                "bad_topic": 1,
                "too_long": 1,
                "no_memory": 0,
                "rate_limit": 0,
                "kafka_error": 0,
                "failed_delivery_attempts": 0,
                "shutdown_delay": 0,
                "unclean_disconnect": 1,
                "spool_corrupt": 0,
            },
            "kafka_error_discards": {},
            "possibly_delivered_topic": [],
        },
        "finished_report": {
            "id": 0,
            "start_time": 1000,
            "malformed_msg_count": 1,
            "unix_stream_unclean_disconnect_count": 0,
            "tcp_unclean_disconnect_count": 0,
            "unsupported_api_key_msg_count": 0,
            "unsupported_version_msg_count": 0,
            "bad_topic_msg_count": 0,
            "recent_malformed": ["AAAABWFiYw=="],
            "unix_stream_unclean_disconnect": [],
            "tcp_unclean_disconnect": [],
            "unsupported_msg_version": [],
            "recent_bad_topic": [],
            "recent_too_long_msg": [],
            "rate_limit_discard": [{"topic": "clicks", "count": 1}],
            "discard_topic": [
                {
                    "topic": "clicks",
                    "min_timestamp": 1_700_000_000_100,
                    "max_timestamp": 1_700_000_000_123,
                    "count": 2,
                }
            ],
            "possible_duplicate_topic": [],
            "discards_by_reason": {
                "malformed": 1,
                "unsupported_api_key": 0,
                "unsupported_version": 0,
                "bad_topic": 0,
                "too_long": 0,
                "no_memory": 0,
                "rate_limit": 1,
                "kafka_error": 1,
                "failed_delivery_attempts": 0,
                "shutdown_delay": 0,
                "unclean_disconnect": 0,
                "spool_corrupt": 0,
            },
            "kafka_error_discards": {"MSG_SIZE_TOO_LARGE": 1},
            "possibly_delivered_topic": [],
        },
    }


def test_plain_of_a_scripted_scenario_has_every_section_in_dorys_layout() -> None:
    plain = discard_report_plain(scripted_scenario().discard_report(), format_time=utc_ctime)
    assert plain == (
        "current (unfinished) reporting period:\n"
        "    report ID: 1\n"
        "    start time: 1600 Thu Jan  1 00:26:40 1970\n"
        "    malformed msg count: 0\n"
        "    UNIX stream unclean disconnect count: 0\n"
        "    TCP unclean disconnect count: 1\n"
        "    unsupported API key msg count: 0\n"
        "    unsupported version msg count: 1\n"
        "    bad topic msg count: 1\n"
        "\n"
        "    recent TCP unclean disconnect msg: 12[cGFydGlhbA==]\n"
        "\n"
        "    unsupported msg version: 3 count: 1\n"
        "\n"
        "    recent bad topic: 13[no such topic]\n"
        "\n"
        "    recent too long msg: 12[bG9ncyAwMTI=]\n"
        "\n"
        "    discard topic: 4[logs] begin [1700000000400] end [1700000000400] count 1\n"
        "\n"
        "    possible duplicate topic: 6[clicks] begin [1700000000200] end [1700000000200]"
        " count 1\n"
        "\n"
        "latest finished reporting period:\n"
        "    report ID: 0\n"
        "    start time: 1000 Thu Jan  1 00:16:40 1970\n"
        "    malformed msg count: 1\n"
        "    UNIX stream unclean disconnect count: 0\n"
        "    TCP unclean disconnect count: 0\n"
        "    unsupported API key msg count: 0\n"
        "    unsupported version msg count: 0\n"
        "    bad topic msg count: 0\n"
        "\n"
        "    recent malformed msg: 12[AAAABWFiYw==]\n"
        "\n"
        "    rate limit discard topic: 6[clicks] count 1\n"
        "\n"
        "    discard topic: 6[clicks] begin [1700000000100] end [1700000000123] count 2\n"
    )


def test_plain_length_prefix_counts_bytes_not_characters() -> None:
    books, _ = make_books()
    books.discarded(R.NO_MEMORY, "café", 7)
    plain = discard_report_plain(books.discard_report(), format_time=utc_ctime)
    assert "    discard topic: 5[café] begin [7] end [7] count 1\n" in plain


# --- the lifecycle invariant --------------------------------------------------------------------


def test_per_topic_totals_follow_the_lifecycle() -> None:
    books, _ = make_books()
    books.received(Transport.UNIX_DGRAM, 7)
    books.discarded(R.NO_MEMORY, "t", 1)  # before acceptance: not in accepted
    books.discarded(R.RATE_LIMIT, "t", 1)
    books.accepted("t", 5)
    books.delivered("t", 2)
    books.discarded(R.SHUTDOWN_DELAY, "t", 1)
    totals = books.per_topic()["t"]
    assert (totals.accepted, totals.delivered, totals.in_flight) == (5, 2, 2)
    assert totals.discarded_by_reason == {R.NO_MEMORY: 1, R.RATE_LIMIT: 1, R.SHUTDOWN_DELAY: 1}
    assert totals.discarded_after_acceptance == 1
    assert books.received_by_transport() == {
        Transport.UNIX_DGRAM: 7,
        Transport.UNIX_STREAM: 0,
        Transport.TCP: 0,
    }
    assert books.counters.snapshot() == {
        "received_unix_dgram": 7,
        "discarded_no_memory": 1,
        "discarded_rate_limit": 1,
        "accepted": 5,
        "delivered": 2,
        "discarded_shutdown_delay": 1,
    }


def test_delivering_more_than_in_flight_is_a_bug_and_changes_nothing() -> None:
    books, _ = make_books()
    books.accepted("t", 2)
    books.delivered("t", 2)
    with pytest.raises(AccountingError, match="only 0 in flight"):
        books.delivered("t")
    with pytest.raises(AccountingError, match="only 0 in flight"):
        books.discarded(R.KAFKA_ERROR, "t", 1, detail="UNKNOWN")
    with pytest.raises(AccountingError):
        books.discarded(R.FAILED_DELIVERY_ATTEMPTS, "never-accepted", 1)
    assert list(books.per_topic()) == ["t"]
    assert books.per_topic()["t"].delivered == 2
    assert unfinished(books) == empty_period(0, 1000)


TOPICS = st.sampled_from(["a", "b", "c"])
EVENTS = st.one_of(
    st.tuples(st.just("accept"), TOPICS, st.integers(1, 5)),
    st.tuples(st.just("deliver"), TOPICS, st.integers(1, 5)),
    st.tuples(st.sampled_from(sorted(AFTER_ACCEPTANCE)), TOPICS, st.just(1)),
    st.tuples(st.sampled_from([R.NO_MEMORY, R.RATE_LIMIT, R.TOO_LONG]), TOPICS, st.just(1)),
    st.tuples(st.just("tick"), TOPICS, st.integers(0, 900)),
)


@settings(max_examples=200)
@given(events=st.lists(EVENTS, max_size=80))
def test_accepted_equals_delivered_plus_discarded_after_plus_in_flight(
    events: list[tuple[Any, str, int]],
) -> None:
    books, clock = make_books(interval_s=600)
    in_flight = dict.fromkeys(["a", "b", "c"], 0)
    for kind, topic, n in events:
        if kind == "accept":
            books.accepted(topic, n)
            in_flight[topic] += n
        elif kind == "deliver":
            n = min(n, in_flight[topic])
            if n:
                books.delivered(topic, n)
                in_flight[topic] -= n
        elif kind == "tick":
            clock.now += n
        elif kind in AFTER_ACCEPTANCE:
            if in_flight[topic]:
                books.discarded(kind, topic, 1, detail="X")
                in_flight[topic] -= 1
        else:
            books.discarded(kind, topic, 1)

        for name, totals in books.per_topic().items():
            assert totals.in_flight == in_flight[name]
            assert totals.accepted == (
                totals.delivered + totals.discarded_after_acceptance + totals.in_flight
            )
    lifetime = books.lifetime_discards_by_reason()
    per_topic = books.per_topic().values()
    for reason in DiscardReason:
        assert lifetime[reason] == sum(t.discarded_by_reason.get(reason, 0) for t in per_topic)


def test_an_unread_discard_report_is_counted_as_dory_counts_no_discard_query() -> None:
    books, clock = make_books(interval_s=60)

    clock.now += 60  # a whole interval, not more: still fine
    assert books.check_report_read() is True
    clock.now += 2
    assert books.check_report_read() is False
    assert books.counters.get("discard_report_unread") == 1

    books.discard_report()  # monitoring asked
    clock.now += 30
    assert books.check_report_read() is True
    assert books.counters.get("discard_report_unread") == 1


def test_no_report_interval_means_no_discard_query_check() -> None:
    books, clock = make_books(interval_s=0)
    clock.now += 10_000
    assert books.check_report_read() is True


# --- the unknown-topic limit (issue 21): a flood of names folds into (other) -------------


def limited_books(limit: int, known: frozenset[str] = frozenset()) -> Books:
    return Books(
        600,
        256,
        wall_clock=lambda: 1000.0,
        unknown_topic_limit=limit,
        topic_known=known.__contains__,
    )


def test_names_kafka_does_not_have_beyond_the_limit_are_counted_under_other() -> None:
    books = limited_books(3)
    for i in range(10):
        books.discarded(R.TOO_LONG, f"junk.{i}", 5, prefix=b"v")
    books.discarded(R.RATE_LIMIT, "junk.0", 6)  # has its own records: stays there
    books.discarded(R.NO_MEMORY, "junk.9", 7)
    per_topic = books.per_topic()
    assert sorted(per_topic) == sorted(["junk.0", "junk.1", "junk.2", OTHER_TOPICS])
    assert dict(per_topic[OTHER_TOPICS].discarded_by_reason) == {R.TOO_LONG: 7, R.NO_MEMORY: 1}
    assert dict(per_topic["junk.0"].discarded_by_reason) == {R.TOO_LONG: 1, R.RATE_LIMIT: 1}
    assert books.counters.get(counter_names.OTHER_TOPIC_EVENTS) == 8
    assert books.unknown_topics_named == 3
    lifetime = books.lifetime_discards_by_reason()
    for reason in (R.TOO_LONG, R.RATE_LIMIT, R.NO_MEMORY):
        by_topic = sum(t.discarded_by_reason.get(reason, 0) for t in per_topic.values())
        assert by_topic == lifetime[reason]
    report = unfinished(books)
    assert [t["topic"] for t in report["discard_topic"]] == [
        OTHER_TOPICS,
        "junk.0",
        "junk.1",
        "junk.2",
    ]
    assert sum(t["count"] for t in report["discard_topic"]) == 12
    assert report["rate_limit_discard"] == [{"topic": "junk.0", "count": 1}]


def test_topics_kafka_has_always_get_their_own_records() -> None:
    books = limited_books(0, known=frozenset({"orders"}))
    books.discarded(R.TOO_LONG, "nope", 5, prefix=b"v")
    books.discarded(R.RATE_LIMIT, "orders", 5)
    books.accepted("orders", 2)
    books.delivered("orders")
    books.discarded(R.KAFKA_ERROR, "orders", 5, detail="MSG_SIZE_TOO_LARGE")
    per_topic = books.per_topic()
    assert sorted(per_topic) == [OTHER_TOPICS, "orders"]
    other = per_topic[OTHER_TOPICS]
    assert other.accepted == other.in_flight == 0
    assert per_topic["orders"].in_flight == 0


def test_a_possible_duplicate_of_an_unknown_name_beyond_the_limit_is_under_other() -> None:
    books = limited_books(1)
    books.possible_duplicate("first", 5)
    books.possible_duplicate("second", 6)
    report = unfinished(books)
    assert [t["topic"] for t in report["possible_duplicate_topic"]] == [OTHER_TOPICS, "first"]


@settings(max_examples=50, deadline=None)
@given(
    limit=st.integers(0, 4),
    events=st.lists(
        st.tuples(st.sampled_from([R.TOO_LONG, R.NO_MEMORY, R.RATE_LIMIT]), st.integers(0, 9)),
        max_size=40,
    ),
)
def test_whatever_the_names_the_records_stay_bounded_and_add_up(
    limit: int, events: list[tuple[DiscardReason, int]]
) -> None:
    books = limited_books(limit)
    for reason, name in events:
        books.discarded(reason, f"t{name}", 1, prefix=b"v")
    per_topic = books.per_topic()
    assert len(per_topic.keys() - {OTHER_TOPICS}) <= limit
    lifetime = books.lifetime_discards_by_reason()
    for reason in (R.TOO_LONG, R.NO_MEMORY, R.RATE_LIMIT):
        by_topic = sum(t.discarded_by_reason.get(reason, 0) for t in per_topic.values())
        assert by_topic == lifetime[reason]
