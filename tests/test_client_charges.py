"""Accepted messages charged to their client's share until their outcome (issue 33, point
1: ``books/charges.py``), on the intake with real books, pool, commit point and ledger;
every test on the compiled hot path and on the pure-Python one."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, cast

from helpers import RecordingDispatcher
from hotpaths import module_fixture
from pydory.daemon.admission.intake import Intake
from pydory.daemon.admission.ratelimit import RateLimit, TopicRateLimiter
from pydory.daemon.books import counters as counter_names
from pydory.daemon.books.accounting import Books
from pydory.daemon.books.charges import SLOT_BITS, ClientTokens
from pydory.daemon.books.commit_point import CommitPoint
from pydory.daemon.books.events import DiscardReason, Transport
from pydory.daemon.books.pool import MemoryPool, message_cost
from pydory.daemon.delivery.dispatcher import Dispatcher
from pydory.daemon.delivery.outcomes import Delivered, DeliveryLedger
from pydory.daemon.delivery.router import MetadataSnapshot, Router
from pydory.daemon.spool import write_ahead
from pydory.wire import encode_any_partition

implementation = module_fixture()

BUDGET = 1 << 20
#: The known topic, and one being auto-created whose creation never ends.
METADATA = MetadataSnapshot.build({1: "b1"}, {"known": {0: 1, 1: 1}, "refused": {0: 1}})


@dataclass(frozen=True)
class NoLimit:
    interval_ms: int = 1000
    max_count: int | None = None


@dataclass
class TokenDispatcher(RecordingDispatcher):
    """Records each message sent with its token, so the test can settle it."""

    tokens: list[tuple[int, str, int]] = field(default_factory=list)

    def send(
        self, topic: str, partition: int, value: bytes, key: bytes | None, *args: Any, **kwargs: Any
    ) -> None:
        token = kwargs.get("token", args[3] if len(args) > 3 else 0)
        super().send(topic, partition, value, key, *args, **kwargs)
        self.tokens.append((token, topic, message_cost(topic, len(value) + len(key or b""))))

    def burst_sender(self, topic: str) -> Any:
        produce_burst = super().burst_sender(topic)

        def recorded(
            parsed: list[Any], headers: Any, topic: str, max_data: int, runs: Any, token: int
        ) -> list[tuple[int, int]]:
            refused = produce_burst(parsed, headers, topic, max_data, runs, token)
            for fields in parsed:
                if fields is not None and fields[0] == topic:
                    cost = message_cost(topic, len(fields[1]) + len(fields[2]))
                    self.tokens.append((token, topic, cost))
            return refused

        return recorded


@dataclass
class Daemon:
    pool: MemoryPool
    books: Books
    tokens: ClientTokens
    intake: Intake
    dispatcher: TokenDispatcher
    ledger: DeliveryLedger


def daemon() -> Daemon:
    books = Books(600, 64, wall_clock=lambda: 1_700_000_000.0)
    pool = MemoryPool(BUDGET, clock=lambda: 0.0)
    commit_point = CommitPoint(schedule=lambda delay, callback: False)
    tokens = ClientTokens(commit_point, pool.shares)
    dispatcher = TokenDispatcher()

    def no_limit(topic: str) -> RateLimit:
        return NoLimit()

    intake = Intake(
        books=books,
        pool=pool,
        limiter=TopicRateLimiter(no_limit, clock=lambda: 0.0),
        router=Router(METADATA),
        dispatcher=cast(Dispatcher, dispatcher),
        commit_point=tokens,
        message_max_bytes=1 << 20,
        prefix_size=64,
        autocreate=lambda topic: None,  # a creation never answered: its messages wait
    )
    ledger = DeliveryLedger(books, pool, tokens, charges=tokens)
    return Daemon(pool, books, tokens, intake, dispatcher, ledger)


def deliver_all(d: Daemon) -> None:
    """Kafka acknowledges every message sent: one batch, per token."""
    per_token: dict[int, dict[str, int]] = defaultdict(dict)
    cost: dict[int, int] = defaultdict(int)
    for token, topic, nbytes in d.dispatcher.tokens:
        per_token[token][topic] = per_token[token].get(topic, 0) + 1
        cost[token] += nbytes
    d.dispatcher.tokens.clear()
    d.ledger.delivered(Delivered.of(per_token, cost))


def test_tokens_keep_the_order_and_the_spool_segment_of_those_they_wrap() -> None:
    assert write_ahead.SEGMENT_SHIFT == 48  # books/charges.py's _SEGMENT_SHIFT
    pool = MemoryPool(BUDGET)

    class Inner:
        def __init__(self) -> None:
            self.next = [5, 6, (3 << 48) | 6, (3 << 48) | 7, (4 << 48) | 1]
            self.closed: list[int] = []

        def open(self, n: int = 1) -> int:
            return self.next.pop(0)

        def close(self, token: int, n: int = 1) -> None:
            self.closed.append(token)

        def keep(self, token: int, n: int = 1) -> None:
            self.closed.append(token)

    inner = Inner()
    tokens = ClientTokens(inner, pool.shares)
    made = []
    for client in ["b", "a", None, "a", "b"]:
        tokens.client = client
        made.append(tokens.open(1, 100))
    assert [ClientTokens.inner(token) for token in made] == [
        5,
        6,
        3 << 48 | 6,
        3 << 48 | 7,
        4 << 48 | 1,
    ]
    assert made == sorted(made)  # in the order of the tokens they wrap
    assert [write_ahead.WriteAhead.in_spool(token) for token in made] == [False] * 2 + [True] * 3
    assert made[2] & ((1 << SLOT_BITS) - 1) == 0  # no client: slot 0, charged to nobody
    assert pool.shares.held("a") == pool.shares.held("b") == 200
    for token in made:
        tokens.released(token, 100)
        tokens.close(token)
    assert inner.closed == [5, 6, 3 << 48 | 6, 3 << 48 | 7, 4 << 48 | 1]
    assert pool.shares.holders == 0
    assert tokens.charged == 0


def test_the_share_questions_per_message_and_per_burst_answer_as_the_room_does() -> None:
    """``admits`` (per message) and ``has_room`` (per burst) ask every client's least room
    first (issue 30's trim): far from a share and near it, they answer as ``room()``."""
    pool = MemoryPool(BUDGET)
    tokens = ClientTokens(CommitPoint(schedule=lambda delay, callback: True), pool.shares)
    assert tokens.admits()
    assert tokens.has_room(BUDGET)
    for client in ["a", "b"]:
        tokens.client = client
        while tokens.admits():
            room = tokens.room()
            for nbytes in (0, 1, room // 2, room - 1, room, room + 1):
                assert tokens.has_room(nbytes) == (room > nbytes)
            tokens.open(1, max(1, room // 3))
        assert tokens.room() <= 0
        assert not tokens.has_room(0)
    tokens.client = "c"  # holding nothing: a newcomer's share
    assert tokens.admits()
    assert tokens.has_room(tokens.room() - 1)
    assert not tokens.has_room(tokens.room())


def test_a_client_whose_messages_wait_stops_at_its_share_and_another_loses_nothing() -> None:
    d = daemon()
    held = encode_any_partition("being-created", b"h" * 1000)
    # The held client's messages wait for a creation that never ends: they are charged to
    # its share (half the pool, it being the one client holding any), and no further.
    for _ in range(BUDGET // 1000 // 64):
        d.intake.frames([held] * 64, Transport.TCP, "held client")
    shares = d.pool.shares
    assert shares.held("held client") == d.pool.used
    assert BUDGET // 2 <= shares.held("held client") < BUDGET // 2 + message_cost("x", 1000) * 64
    refused = d.books.lifetime_discards_by_reason()[DiscardReason.NO_MEMORY]
    assert refused > 0
    assert d.books.counters.get(counter_names.NO_MEMORY_CLIENT_SHARE) == refused
    assert not d.pool.is_depleted
    # Another client, on another transport: every message accepted, charged to its own
    # share while it waits for Kafka, given back when Kafka acknowledges it.
    good = [encode_any_partition("known", b"g%05d" % i) for i in range(512)]
    for _ in range(20):
        d.intake.datagrams(good, "good client")
        assert shares.held("good client") > 0
        deliver_all(d)
        assert shares.held("good client") == 0
    assert d.books.per_topic()["known"].delivered == 20 * 512
    assert d.books.lifetime_discards_by_reason()[DiscardReason.NO_MEMORY] == refused
    # The creation ends without the topic: the held messages are bad topics, their bytes
    # given back to the pool and to their client.
    d.intake.topic_creation_settled("being-created")
    assert shares.holders == 0
    assert d.pool.used == 0
    assert d.tokens.charged == 0


def test_a_refused_message_gives_its_bytes_back_to_its_client() -> None:
    d = daemon()
    d.intake.frames([encode_any_partition("refused", b"no")] * 10, Transport.TCP, "c")
    assert d.books.lifetime_discards_by_reason()[DiscardReason.KAFKA_ERROR] == 10
    assert d.pool.shares.holders == 0
    assert d.pool.used == 0


@dataclass
class Reported:
    """A delivery report's message (what settlement reads of confluent-kafka's)."""

    name: str
    payload: bytes = b"v"

    def topic(self) -> str:
        return self.name

    def key(self) -> bytes | None:
        return None

    def value(self) -> bytes:
        return self.payload

    def partition(self) -> int:
        return 0

    def __len__(self) -> int:
        return len(self.payload)


@dataclass
class SettledLedger:
    """Records what settlement hands the ledger."""

    duplicates: list[str] = field(default_factory=list)
    delivered_batches: list[Delivered] = field(default_factory=list)

    def delivered(self, batch: Delivered) -> None:
        self.delivered_batches.append(batch)

    def possibly_delivered(self, topic: str, *args: Any) -> None:
        pass

    def possible_duplicate(self, topic: str, timestamp_ms: int) -> None:
        self.duplicates.append(topic)


def test_the_possible_duplicate_window_takes_every_client_of_the_newest_generation() -> None:
    """Tokens of one generation differ by their clients' slots only: a failure that may
    have been written flags every acknowledgement of the newest token's generation sent
    before it, whatever its client, as it did when they shared one token."""
    from confluent_kafka import KafkaError

    from pydory.daemon.books.msg_debug import MsgDebug
    from pydory.daemon.delivery.producer_backend import AckReport, DeliveryReports, FailureReport
    from pydory.daemon.delivery.settlement import Settlement

    generation = 7 << SLOT_BITS
    newest, other_client, next_generation = generation | 1, generation | 2, (8 << SLOT_BITS) | 1
    ledger = SettledLedger()
    settlement = Settlement(
        cast(Any, ledger),
        Router(METADATA),
        MsgDebug.disabled(),
        lambda token: False,
        resend=lambda *args, **kwargs: None,
        on_partition_trouble=lambda: None,
        newest_token=lambda: newest,
        shutting_down=lambda: False,
    )
    reports = DeliveryReports()
    handle = type("Handle", (), {"fatal_error": None})()
    failed = KafkaError(KafkaError.REQUEST_TIMED_OUT)
    reports.failures.append(
        FailureReport(failed, Reported("known"), 0, None, 1, newest, handle, False, None, True)
    )
    for token, topic in [(other_client, "before"), (next_generation, "after")]:
        reports.acks.append(AckReport(Reported(topic), token, 0))
    settlement.settle(reports)
    assert "before" in ledger.duplicates
    assert "after" not in ledger.duplicates
