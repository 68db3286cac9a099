"""The intake's datagram burst path against its reference path, message for message."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, cast

import pytest

from helpers import RecordingDispatcher
from pydory.daemon.admission.intake import Intake
from pydory.daemon.admission.ratelimit import RateLimit, TopicRateLimiter
from pydory.daemon.books.accounting import Books
from pydory.daemon.books.commit_point import CommitPoint
from pydory.daemon.books.events import DiscardReason, Transport
from pydory.daemon.books.pool import MemoryPool
from pydory.daemon.delivery.dispatcher import Dispatcher
from pydory.daemon.delivery.router import MetadataSnapshot, Router
from pydory.status.discards import discard_report_json
from pydory.wire import encode_any_partition, encode_partition_key


@dataclass(frozen=True)
class Limit:
    interval_ms: int
    max_count: int | None


@dataclass
class Daemon:
    books: Books
    pool: MemoryPool
    commit_point: CommitPoint
    dispatcher: RecordingDispatcher
    intake: Intake


def daemon(pool_budget: int = 2_000) -> Daemon:
    """An intake with real books, pool, rate limiter, router and commit point."""
    books = Books(600, 64, wall_clock=lambda: 1_700_000_000.0)
    pool = MemoryPool(pool_budget, clock=lambda: 0.0)
    commit_point = CommitPoint(schedule=lambda delay, callback: False)
    limits = {"limited": Limit(1000, 2)}

    def limit_for(topic: str) -> RateLimit:
        return limits.get(topic, Limit(1000, None))

    topics = {name: {0: 1, 1: 1, 2: 1} for name in ("fast", "other", "limited", "refused")}
    dispatcher = RecordingDispatcher()
    intake = Intake(
        books=books,
        pool=pool,
        limiter=TopicRateLimiter(limit_for, clock=lambda: 0.0),
        router=Router(MetadataSnapshot.build({1: "b1"}, topics)),
        dispatcher=cast(Dispatcher, dispatcher),
        commit_point=commit_point,
        message_max_bytes=82 + 200,  # 200 bytes of key + value at most
        prefix_size=64,
    )
    return Daemon(books, pool, commit_point, dispatcher, intake)


def mixed_traffic() -> list[bytes]:
    """Every kind of datagram, the common case most often."""
    common = [
        encode_any_partition("fast", b"v%03d" % i, b"", 1_700_000_000_000 + i) for i in range(40)
    ]
    return [
        *common[:10],
        encode_any_partition("fast", b"with a key", b"k", -5),  # a negative timestamp
        encode_any_partition("other", b"x", b"", 0),
        encode_partition_key("fast", b"by key", 12345),
        encode_any_partition("nowhere", b"unknown topic"),
        *[encode_any_partition("limited", b"l%d" % i) for i in range(4)],
        encode_any_partition("fast", b"y" * 201),  # too long
        encode_any_partition("fast", b"y" * 150, b"z" * 50),  # exactly the limit
        b"\x00\x00\x00\x05\x01",  # malformed
        encode_any_partition("fast", b"bad api key")[:4] + b"\x00\x07" + b"\x00" * 30,
        encode_any_partition("refused", b"Kafka says no"),
        *common[10:],  # by now the pool runs out: no_memory
    ]


def outcome(d: Daemon) -> dict[str, Any]:
    return {
        "received": d.books.received_by_transport(),
        "topics": d.books.per_topic(),
        "discards": d.books.lifetime_discards_by_reason(),
        "report": discard_report_json(d.books.discard_report()),
        "counters": d.books.counters.snapshot(),
        "pool_used": d.pool.used,
        "open_messages": d.commit_point.open_messages,
        "sent": d.dispatcher.sent,
    }


@pytest.mark.parametrize("burst_size", [1, 7, 512])
@pytest.mark.parametrize("transport", list(Transport))
def test_a_burst_has_exactly_the_outcome_of_the_reference_path(
    burst_size: int, transport: Transport
) -> None:
    # A topic's first message looks its rate limit up (the reference path): warm up.
    warm_up = [encode_any_partition(topic, b"warm-up") for topic in ("fast", "other")]
    traffic = mixed_traffic()
    reference = daemon()
    for data in warm_up + traffic:
        reference.intake.frame(data, transport)  # decode + admit, one by one
    bursts = daemon()
    hand_over = (
        bursts.intake.datagrams
        if transport is Transport.UNIX_DGRAM
        else functools.partial(bursts.intake.frames, transport=transport)
    )
    hand_over(warm_up)
    for start in range(0, len(traffic), burst_size):
        hand_over(traffic[start : start + burst_size])

    expected = outcome(reference)
    assert outcome(bursts) == expected
    # The traffic reached every outcome, so both paths were exercised.
    discards = expected["discards"]
    for reason in ("too_long", "no_memory", "rate_limit", "bad_topic", "malformed"):
        assert discards[DiscardReason(reason)] > 0, reason
    assert discards[DiscardReason.KAFKA_ERROR] == 1
    assert expected["topics"]["fast"].accepted > 10


def test_the_books_balance_after_a_burst() -> None:
    d = daemon(pool_budget=1 << 20)
    d.intake.datagrams([encode_any_partition("fast", b"v%d" % i) for i in range(100)])
    totals = d.books.per_topic()["fast"]
    assert totals.accepted == totals.in_flight == len(d.dispatcher.sent) == 100
    assert d.commit_point.open_messages == 100
    assert d.books.received_by_transport()[Transport.UNIX_DGRAM] == 100
