"""The intake's datagram burst path against its reference path, message for message."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import pytest

from helpers import RecordingDispatcher
from hotpaths import module_fixture
from pydory.daemon.admission.intake import Intake
from pydory.daemon.admission.ratelimit import RateLimit, TopicRateLimiter
from pydory.daemon.books import counters as counter_names
from pydory.daemon.books.accounting import Books
from pydory.daemon.books.commit_point import CommitPoint
from pydory.daemon.books.counters import Counters
from pydory.daemon.books.events import DiscardReason, Transport
from pydory.daemon.books.pool import MemoryPool, pool_cost
from pydory.daemon.delivery.dispatcher import Dispatcher
from pydory.daemon.delivery.router import MetadataSnapshot, Router
from pydory.daemon.spool.records import SpoolRecord
from pydory.daemon.spool.tallies import Tally
from pydory.daemon.spool.write_ahead import WriteAhead
from pydory.status.discards import discard_report_json
from pydory.wire import encode_any_partition, encode_partition_key

# Every test here runs on the compiled hot path and on the pure-Python one (issue 25).
implementation = module_fixture()


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
    router: Router


def daemon(
    pool_budget: int = 2_000,
    *,
    metadata: bool = True,
    autocreate: Callable[[str], None] | None = None,
    on_unknown_topic: Callable[[str], None] = lambda topic: None,
    write_ahead: Callable[[CommitPoint], WriteAhead] | None = None,
    unknown_topic_limit: int = 1000,
) -> Daemon:
    """An intake with real books, pool, rate limiter, router and commit point; its router
    has no metadata yet unless ``metadata`` (then it knows TOPICS)."""
    books = Books(600, 64, wall_clock=lambda: 1_700_000_000.0)
    pool = MemoryPool(pool_budget, clock=lambda: 0.0)
    commit_point = CommitPoint(schedule=lambda delay, callback: False)
    limits = {"limited": Limit(1000, 2)}

    def limit_for(topic: str) -> RateLimit:
        return limits.get(topic, Limit(1000, None))

    dispatcher = RecordingDispatcher()
    tokens = None if write_ahead is None else write_ahead(commit_point)
    router = Router(METADATA) if metadata else Router()
    intake = Intake(
        books=books,
        pool=pool,
        limiter=TopicRateLimiter(limit_for, clock=lambda: 0.0),
        router=router,
        dispatcher=cast(Dispatcher, dispatcher),
        commit_point=commit_point if tokens is None else tokens,
        message_max_bytes=82 + 200,  # 200 bytes of key + value at most
        prefix_size=64,
        on_unknown_topic=on_unknown_topic,
        autocreate=autocreate,
        write_ahead=tokens,
        unknown_topic_limit=unknown_topic_limit,
    )
    return Daemon(books, pool, commit_point, dispatcher, intake, router)


TOPICS = ("fast", "other", "limited", "refused")
#: What the daemon's metadata shows: TOPICS, three partitions each.
METADATA = MetadataSnapshot.build({1: "b1"}, {name: {0: 1, 1: 1, 2: 1} for name in TOPICS})


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
        # Per topic, in order: the burst path sends a burst a topic at a time.
        "sent": sorted(d.dispatcher.sent, key=lambda sent: sent[0]),
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


# -- before the first metadata ----------------------------------------------------------------


def test_messages_read_before_the_first_metadata_wait_and_are_routed_when_it_comes() -> None:
    d = daemon(pool_budget=1 << 20, metadata=False)
    first = [encode_any_partition("fast", b"a%d" % i, b"", 1_700_000_000_000 + i) for i in range(5)]
    d.intake.datagrams(first)
    d.intake.frames([encode_partition_key("other", b"by key", 7)], Transport.TCP)
    d.intake.frame(encode_any_partition("fast", b"last", b"k"), Transport.UNIX_STREAM)
    # Held: not sent, not accepted, not discarded; charged to the pool, and the commit
    # point waits for them.
    assert d.dispatcher.sent == []
    assert d.books.per_topic() == {}
    assert sum(d.books.lifetime_discards_by_reason().values()) == 0
    assert d.intake.pending_topic_messages == 7
    assert d.commit_point.open_messages == 7
    held_bytes = d.pool.used
    assert held_bytes == sum(
        pool_cost(t, k, v)
        for t, k, v in [*(("fast", b"", b"a%d" % i) for i in range(5)), ("other", b"", b"by key")]
    ) + pool_cost("fast", b"k", b"last")

    d.router.replace(METADATA)  # the first fetch succeeded
    d.intake.metadata_arrived()
    # Routed in the order they were read, by Dory's rules (PartitionKey 7 % 3 = 1).
    assert [(m[0], m[2]) for m in d.dispatcher.sent] == [
        *(("fast", b"a%d" % i) for i in range(5)),
        ("other", b"by key"),
        ("fast", b"last"),
    ]
    assert d.dispatcher.sent[5][1] == 1
    assert d.dispatcher.sent[0][4] == 1_700_000_000_000
    assert d.intake.pending_topic_messages == 0
    assert d.books.per_topic()["fast"].accepted == 6
    assert d.books.per_topic()["other"].in_flight == 1
    assert d.commit_point.open_messages == 7  # in flight now, until their delivery reports
    assert d.pool.used == held_bytes
    # From now on a message goes straight through.
    d.intake.datagrams([encode_any_partition("fast", b"after")])
    assert d.dispatcher.sent[-1][2] == b"after"


def test_the_pool_bounds_what_waits_for_metadata_however_many_topics() -> None:
    d = daemon(pool_budget=2_000, metadata=False)
    # Ten thousand distinct topic names: one list waits, bounded by the pool's bytes.
    burst = [encode_any_partition(f"t{i:05d}", b"v") for i in range(10_000)]
    d.intake.datagrams(burst)
    held = d.intake.pending_topic_messages
    cost = pool_cost("t00000", b"", b"v")
    assert held == -(-2_000 // cost)  # until the pool ran out (the last one over-allocates)
    assert d.pool.used == held * cost < 2_000 + cost
    assert d.books.lifetime_discards_by_reason()[DiscardReason.NO_MEMORY] == 10_000 - held
    assert d.commit_point.open_messages == held
    # No state per topic name while no metadata is known: nothing for the discarded ones.
    assert d.intake.waiting_room._for_creation == {}
    # The rate limit applies to held messages as to any other.
    d2 = daemon(pool_budget=1 << 20, metadata=False)
    d2.intake.datagrams([encode_any_partition("limited", b"l%d" % i) for i in range(4)])
    assert d2.intake.pending_topic_messages == 2
    assert d2.books.lifetime_discards_by_reason()[DiscardReason.RATE_LIMIT] == 2


def test_under_backpressure_what_waits_for_metadata_depletes_the_pool_by_one_burst_at_most() -> (
    None
):
    d = daemon(pool_budget=2_000, metadata=False)
    d.intake.hold_when_memory_short = True  # the backpressure policy (Overload sets it)
    burst = [encode_any_partition("fast", b"v%03d" % i) for i in range(100)]
    d.intake.datagrams(burst)
    # Nothing discarded for memory: charged past the budget, and the pool says depleted
    # (the overload policy pauses the inputs on that), the overshoot being this burst.
    assert d.intake.pending_topic_messages == 100
    assert d.books.lifetime_discards_by_reason()[DiscardReason.NO_MEMORY] == 0
    assert d.pool.is_depleted
    assert d.pool.used == 100 * pool_cost("fast", b"", b"v000")
    assert d.books.counters.get(counter_names.HELD_WHEN_MEMORY_SHORT) > 0


def test_a_topic_the_first_metadata_does_not_show_is_discarded_as_a_bad_topic() -> None:
    asked: list[str] = []
    d = daemon(pool_budget=1 << 20, metadata=False, on_unknown_topic=asked.append)
    d.intake.datagrams(
        [
            encode_any_partition("nowhere", b"lost", b"key", 1_700_000_000_123),
            encode_any_partition("fast", b"found"),
        ]
    )
    assert d.intake.pending_topic_messages == 2
    d.router.replace(METADATA)
    d.intake.metadata_arrived()
    assert [m[2] for m in d.dispatcher.sent] == [b"found"]
    assert d.books.lifetime_discards_by_reason()[DiscardReason.BAD_TOPIC] == 1
    report = discard_report_json(d.books.discard_report())["unfinished_report"]
    assert report["recent_bad_topic"] == ["nowhere"]
    assert "nowhere" not in d.books.per_topic()
    assert asked == ["nowhere"]  # a metadata refresh asked for, as for any unknown topic
    assert d.pool.used == pool_cost("fast", b"", b"found")
    assert d.commit_point.open_messages == 1


def test_with_autocreate_a_topic_the_first_metadata_does_not_show_is_created() -> None:
    creating: list[str] = []
    d = daemon(pool_budget=1 << 20, metadata=False, autocreate=creating.append)
    d.intake.datagrams([encode_any_partition("new-topic", b"n%d" % i) for i in range(3)])
    assert creating == []  # nothing is known yet: no reason to create anything
    d.router.replace(METADATA)
    d.intake.metadata_arrived()
    assert creating == ["new-topic"]  # once, for all three
    assert d.intake.pending_topic_messages == 3
    d.router.replace(
        MetadataSnapshot.build({1: "b1"}, {"new-topic": {0: 1}, **{t: {0: 1} for t in TOPICS}})
    )
    d.intake.topic_creation_settled("new-topic")
    assert [m[2] for m in d.dispatcher.sent] == [b"n0", b"n1", b"n2"]
    assert d.books.per_topic()["new-topic"].accepted == 3


def test_autocreations_under_way_are_bounded_and_a_name_beyond_is_a_bad_topic() -> None:
    """A client cycling through names must not start a creation (a task, a metadata
    request) for each: at most the unknown-topic limit wait at once (issue 21)."""
    creating: list[str] = []
    d = daemon(pool_budget=1 << 20, autocreate=creating.append, unknown_topic_limit=2)
    d.intake.datagrams([encode_any_partition(f"new.{i}", b"v") for i in range(5)])
    d.intake.datagrams([encode_any_partition("new.0", b"again")])  # waits with the first
    assert creating == ["new.0", "new.1"]
    assert d.intake.pending_topic_messages == 3
    assert d.books.lifetime_discards_by_reason()[DiscardReason.BAD_TOPIC] == 3
    assert d.books.counters.get(counter_names.AUTOCREATE_OVER_LIMIT) == 3
    assert d.pool.used == 2 * pool_cost("new.0", b"", b"v") + pool_cost("new.0", b"", b"again")
    assert d.commit_point.open_messages == 3


def test_an_autocreation_that_settles_at_once_loses_no_message() -> None:
    """The server settles an autocreation at once when it has no task group yet (during
    the spool replay, which the first metadata may now interrupt): the message must be
    held before the creation is asked for, or it would wait in a list nobody holds,
    its pool bytes and commit point count never given back."""
    holder: list[Intake] = []
    d = daemon(
        pool_budget=1 << 20, autocreate=lambda topic: holder[0].topic_creation_settled(topic)
    )
    holder.append(d.intake)
    d.intake.datagrams([encode_any_partition("not-there", b"v")])
    assert d.books.lifetime_discards_by_reason()[DiscardReason.BAD_TOPIC] == 1
    assert d.pool.used == 0
    assert d.commit_point.open_messages == 0


def test_at_shutdown_what_still_waits_for_metadata_is_settled_as_purged_at_shutdown() -> None:
    d = daemon(pool_budget=1 << 20, metadata=False)
    d.intake.datagrams([encode_any_partition("fast", b"v%d" % i, b"", 5) for i in range(4)])
    d.intake.settle_pending_topics()
    totals = d.books.per_topic()["fast"]
    assert totals.accepted == 4
    assert totals.discarded_by_reason == {DiscardReason.SHUTDOWN_DELAY: 4}
    assert totals.in_flight == 0
    assert d.dispatcher.sent == []
    assert d.pool.used == 0
    assert d.commit_point.open_messages == 0
    assert d.intake.pending_topic_messages == 0


@dataclass
class RecordingSpool:
    """A spool that takes every burst into segment 1 and records what is settled."""

    last_append: tuple[int, int] = (0, 0)
    last_identity: tuple[int, int] = (1, 0)  # stream 1, frames numbered as appended
    settled: int = 0
    payloads: list[bytes] = field(default_factory=list)

    def append_payloads(
        self, payloads: Sequence[bytes], origins: Sequence[bytes | None] | None = None
    ) -> int:
        self.last_append = (len(self.payloads), len(self.payloads) + len(payloads))
        self.last_identity = (1, len(self.payloads))
        self.payloads.extend(payloads)
        return 1

    def read_frames(self, segment_id: int, start: int, end: int) -> list[SpoolRecord]:
        return [SpoolRecord("", b"", p, 0, is_payload=True) for p in self.payloads[start:end]]

    def settle(self, segment_id: int, count: int) -> None:
        self.settled += count

    def acknowledge(
        self, segment_id: int, stream: int, ranges: list[tuple[int, int]], tally: Tally
    ) -> None:
        pass  # acknowledgement marks: tests/test_spool_acks.py

    def before_fold(self, segment_id: int, stream: int) -> None:
        pass  # outcome tallies: tests/test_books_durable.py


def test_at_shutdown_what_waits_for_metadata_in_the_spool_stays_there_for_the_next_start() -> None:
    spool = RecordingSpool()
    d = daemon(
        pool_budget=1 << 20,
        metadata=False,
        write_ahead=lambda commit_point: WriteAhead(commit_point, spool, Counters()),
    )
    d.intake.datagrams([encode_any_partition("fast", b"v%d" % i) for i in range(4)])
    assert len(spool.payloads) == 4  # written ahead before they were held
    d.intake.settle_pending_topics()
    totals = d.books.per_topic()["fast"]
    assert totals.left_for_next_start == 4
    assert totals.discarded_by_reason == {}
    assert totals.in_flight == 0
    assert spool.settled == 0  # kept in the spool: the next start replays them
    assert d.pool.used == 0
    assert d.commit_point.open_messages == 0
