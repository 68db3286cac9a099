"""The waiting room: accepted-to-be messages whose topic Kafka's metadata does not show yet.

A message reaches it from admission (step 5 of ``intake.py``) after passing every other
check, its pool bytes already charged. It waits in one of two places:

- **before the first metadata** (Kafka has not answered yet; Dory's sockets open at once
  and buffer too): one list for every topic, so that a flood of distinct topic names before
  the first metadata grows one list, bounded by the memory pool, and no map. When the
  metadata comes (:meth:`WaitingRoom.metadata_arrived`) each is routed, in the order
  received, or found a bad topic, or held for its auto-creation;
- **while its topic is auto-created** (``<topicAutocreate>``): one list per topic, at most
  ``<maxUnknownTopics>`` topics at once (a message for one more is a ``bad_topic``
  discard, counted), each routed or found bad when the metadata after the creation comes
  (:meth:`WaitingRoom.topic_creation_settled`).

A waiting message holds the commit point back from the moment it waits (its token is open),
and its bytes count in its client's share (``books/charges.py``) until it leaves.
At shutdown everything still waiting is settled (:meth:`WaitingRoom.settle_all`): the
creations' messages routed or found bad, those before any metadata settled as purged.

Rule: a message whose topic metadata does not show waits only in :class:`WaitingRoom`, and
leaves it routed, discarded as a bad topic, or settled at shutdown; never forgotten.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from confluent_kafka import KafkaError

from pydory.daemon.books import counters as counter_names
from pydory.daemon.books.accounting import Books
from pydory.daemon.books.charges import ClientTokens
from pydory.daemon.books.events import DiscardReason
from pydory.daemon.books.pool import MemoryPool
from pydory.daemon.delivery.outcomes import (
    DeliveryLedger,
    Discard,
    LeftForNextStart,
    failure_outcome,
)
from pydory.daemon.delivery.router import Router
from pydory.daemon.spool.identity import Headers
from pydory.daemon.spool.write_ahead import WriteAhead
from pydory.wire import Message

#: What admission does with a message whose topic is known: ``(message, cost, token,
#: headers)`` handed to dispatch (``Intake._enqueue``).
Enqueue = Callable[[Message, int, int, Headers | None], None]


@dataclass
class _Waiting:
    """Messages waiting for one metadata: the metadata that shows a topic being
    auto-created (one per topic), or the first metadata of all (one for every topic)."""

    #: Each with its pool cost, its commit point token and its identity headers.
    messages: list[tuple[Message, int, int, Headers | None]] = field(default_factory=list)


class WaitingRoom:
    """Messages held for metadata, and what becomes of them when it comes."""

    def __init__(
        self,
        *,
        books: Books,
        pool: MemoryPool,
        router: Router,
        tokens: ClientTokens,
        enqueue: Enqueue,
        on_unknown_topic: Callable[[str], None],
        autocreate: Callable[[str], None] | None,
        write_ahead: WriteAhead | None,
        creation_limit: int,
    ) -> None:
        """``autocreate``: starts a topic's creation (None: ``<topicAutocreate>`` off);
        ``creation_limit``: at most this many topics wait for their creation at once;
        ``on_unknown_topic``: told of a topic found bad (asks for a metadata refresh)."""
        self._books = books
        self._counters = books.counters
        self._pool = pool
        self._router = router
        self._tokens = tokens
        self._enqueue = enqueue
        self._on_unknown_topic = on_unknown_topic
        self.autocreate = autocreate
        self._write_ahead = write_ahead
        self._creation_limit = creation_limit
        self._for_creation: dict[str, _Waiting] = {}
        self._before_metadata = _Waiting()
        # Settles what never reached a producer, as delivery settles what did.
        self._ledger = DeliveryLedger(books, pool, tokens, charges=tokens)

    @property
    def waiting(self) -> int:
        """Messages held for metadata: Dory's "new" queue."""
        held = len(self._before_metadata.messages)
        return held + sum(len(w.messages) for w in self._for_creation.values())

    def unknown_topic(self, message: Message, cost: int, headers: Headers | None) -> None:
        """Admission's step 5 for a topic the metadata does not show: held for the first
        metadata or for the topic's creation, or discarded as a bad topic."""
        if not self._router.has_metadata:
            # Held, not yet sent: it holds the commit point back all the same.
            held = (message, cost, self._tokens.open(1, cost), headers)
            self._before_metadata.messages.append(held)
            return
        if self.autocreate is None:
            self._pool.release(cost)
            self._discard_bad_topic(message)
            self._on_unknown_topic(message.topic)
            return
        self._hold_for_creation(message, cost, self._tokens.open(1, cost), headers)

    def _hold_for_creation(
        self,
        message: Message,
        cost: int,
        token: int,
        headers: Headers | None,
        *,
        was_waiting: bool = False,
    ) -> None:
        """Hold ``message`` until metadata shows its topic (autocreate is on);
        ``was_waiting``: it waited for the first metadata before."""
        assert self.autocreate is not None
        topic = message.topic
        waiting = self._for_creation.get(topic)
        if waiting is not None:
            waiting.messages.append((message, cost, token, headers))
            return
        if len(self._for_creation) >= self._creation_limit:
            # A client cycling through names must not start a creation (and a task) each.
            self._counters.inc(counter_names.AUTOCREATE_OVER_LIMIT)
            self._found_bad(message, cost, token, waited=was_waiting)
            return
        # Held before asking: the creation may settle at once (no task group yet).
        self._for_creation[topic] = _Waiting([(message, cost, token, headers)])
        self.autocreate(topic)

    def _discard_bad_topic(self, message: Message) -> None:
        self._books.discarded(
            DiscardReason.BAD_TOPIC,
            message.topic,
            message.timestamp_ms,
            prefix=message.value,
            key=message.key,
        )

    def _found_bad(self, message: Message, cost: int, token: int, *, waited: bool) -> None:
        """A message whose topic the metadata still does not show: its bytes and token
        released, a ``bad_topic`` discard. ``waited``: it was held here before (and so
        counted in Dory's MsgCreate, which counts a message from its receipt)."""
        if waited:
            self._counters.inc(counter_names.WAITED_THEN_BAD_TOPIC)
        self._pool.release(cost)
        self._tokens.released(token, cost)
        self._tokens.close(token)
        self._discard_bad_topic(message)

    def topic_creation_settled(self, topic: str) -> None:
        """Metadata was refreshed after trying to create ``topic``: route what waited for it."""
        waiting = self._for_creation.pop(topic, None)
        if waiting is None:
            return
        for message, cost, token, headers in waiting.messages:
            if self._router.knows(topic):
                self._enqueue(message, cost, token, headers)
            else:
                self._found_bad(message, cost, token, waited=True)

    def metadata_arrived(self) -> None:
        """The first metadata is in: route what waited for it, in the order received. A
        topic it does not show is a bad topic, or is auto-created (topicAutocreate)."""
        held, self._before_metadata = self._before_metadata, _Waiting()
        for message, cost, token, headers in held.messages:
            topic = message.topic
            if self._router.knows(topic):
                self._enqueue(message, cost, token, headers)
            elif self.autocreate is not None:
                self._hold_for_creation(message, cost, token, headers, was_waiting=True)
            else:
                self._found_bad(message, cost, token, waited=True)
                self._on_unknown_topic(topic)

    def settle_all(self) -> None:
        """Shutdown: route or discard every message still waiting for topic creation,
        and settle those still waiting for the first metadata (:meth:`_settle_unrouted`)."""
        for topic in list(self._for_creation):
            self.topic_creation_settled(topic)
        held, self._before_metadata = self._before_metadata, _Waiting()
        for message, cost, token, _headers in held.messages:
            self._settle_unrouted(message, cost, token)

    def _settle_unrouted(self, message: Message, cost: int, token: int) -> None:
        """Shutdown before any metadata: ``message`` was taken in and never reached a
        producer, as if purged from librdkafka's queue when the shutdown ran out of time.
        It meets that outcome, decided where every delivery outcome is
        (``outcomes.failure_outcome``): left for the next start when it is in the spool,
        else discarded ``shutdown_delay``."""
        topic = message.topic
        outcome = failure_outcome(
            KafkaError._PURGE_QUEUE,
            "no metadata yet",
            error_is_fatal=False,
            producer_fatal_error=None,
            topic_known=False,
            attempt=1,
            max_attempts=1,
            shutting_down=True,
            in_spool=self._write_ahead is not None and self._write_ahead.in_spool(token),
        )
        self._books.accepted(topic)
        ledger = self._ledger
        if isinstance(outcome, LeftForNextStart):
            ledger.left_for_next_start(topic, cost, token)
        else:
            assert isinstance(outcome, Discard), outcome  # a purge never left the daemon
            ledger.discarded(
                outcome.reason, topic, message.timestamp_ms, outcome.detail, cost, token
            )
