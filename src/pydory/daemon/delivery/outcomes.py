"""Outcomes: what becomes of an accepted message when librdkafka reports on it, and where
that outcome is settled.

Rule: every error -> outcome decision lives here alone. A failed delivery report becomes
one outcome (:func:`failure_outcome`): discarded with a reason and a detail, or rerouted
(a possible duplicate first, if the error means the message may already be in the log).
A refusal at ``produce()`` becomes one :class:`EnqueueRefused` (:func:`produce_refusal`).
The dispatcher makes the calls and acts on the answers; :class:`DeliveryLedger` settles
each final outcome in the books, the memory pool and the commit point, so an accepted
message leaves the daemon here, not back through the intake.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from confluent_kafka import KafkaError

from pydory.daemon.books.accounting import Books
from pydory.daemon.books.charges import TokenCharges
from pydory.daemon.books.events import DiscardReason
from pydory.daemon.books.pool import MemoryPool
from pydory.daemon.spool.identity import Headers, identity_in
from pydory.daemon.spool.tallies import DELIVERED, POSSIBLY_DELIVERED
from pydory.errors import PydoryError

# Errors after which the message may already be in the log: the request may have left
# (or been written by the leader) before the error. librdkafka knows per message whether it
# was sent (rd_kafka_message_status), but confluent-kafka's Message does not carry that, so
# the classification is conservative: a timeout or a broken connection may come after the
# request left. A resend after one of these may duplicate the message; a final failure
# after one of these is "possibly delivered", never a plain discard.
POSSIBLY_PERSISTED = frozenset(
    {
        KafkaError._MSG_TIMED_OUT,
        KafkaError._TIMED_OUT,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError._TRANSPORT,
        KafkaError.NETWORK_EXCEPTION,
        KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        KafkaError._PURGE_INFLIGHT,
    }
)

# Errors that mean "we are shutting down and ran out of time", not a Kafka verdict.
_PURGED = frozenset({KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT})
# Kafka-side verdicts that no resend will change (Dory: Discard).
_PERMANENT = frozenset(
    {
        KafkaError.MSG_SIZE_TOO_LARGE,
        KafkaError.INVALID_MSG_SIZE,
        KafkaError.RECORD_LIST_TOO_LARGE,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.CLUSTER_AUTHORIZATION_FAILED,
        KafkaError.TOPIC_EXCEPTION,
        KafkaError.INVALID_RECORD,
        KafkaError.UNSUPPORTED_FOR_MESSAGE_FORMAT,
        KafkaError.INVALID_REQUIRED_ACKS,
        KafkaError.POLICY_VIOLATION,
    }
)


# -- a failed delivery report ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Discard:
    """The message is discarded with ``reason``; ``detail`` names the error."""

    reason: DiscardReason
    detail: str


@dataclass(frozen=True, slots=True)
class PossiblyDelivered:
    """The message's last attempt failed, but an attempt may have reached the log: Kafka
    may have it or not. ``detail`` names the last error."""

    detail: str


@dataclass(frozen=True, slots=True)
class LeftForNextStart:
    """Shutting down, and the message is in the spool: it stays there for the next start,
    which replays it (a possible duplicate if an attempt may have reached the log)."""

    detail: str


@dataclass(frozen=True, slots=True)
class Reroute:
    """The message is sent again; ``possible_duplicate``: it may already be in the log."""

    possible_duplicate: bool


FinalOutcome = Discard | PossiblyDelivered | LeftForNextStart


def failure_outcome(
    code: int,
    error_name: str,
    *,
    error_is_fatal: bool,
    producer_fatal_error: str | None,
    topic_known: bool,
    attempt: int,
    max_attempts: int,
    shutting_down: bool,
    maybe_in_kafka_before: bool = False,
    in_spool: bool = False,
    possibly_persisted: bool = False,
) -> FinalOutcome | Reroute:
    """The outcome of a failed delivery report: librdkafka's error ``code`` (named
    ``error_name``, fatal or not) for a message sent ``attempt`` times of at most
    ``max_attempts``, by a producer that has had a fatal error (``producer_fatal_error``)
    or not, for a topic the router still knows or not, while the daemon runs or shuts
    down; ``maybe_in_kafka_before``: an earlier attempt ended in a POSSIBLY_PERSISTED
    error; ``in_spool``: the message is on disk for the next start;
    ``possibly_persisted``: librdkafka says this attempt may be in the log whatever its
    error (a request holding it timed out after it was sent, then was retried).

    The first rule that applies decides. A final failure of a message that may be in
    Kafka (this error or an earlier one) is possibly delivered, not discarded.
    """
    this_attempt_maybe = possibly_persisted or code in POSSIBLY_PERSISTED
    maybe_in_kafka = maybe_in_kafka_before or this_attempt_maybe
    verdict: Discard
    if producer_fatal_error is not None:
        # Whatever the failed producer still held: its fatal error is the verdict. By the
        # error code alone: after a fatal error librdkafka marks every message it fails
        # possibly persisted, the ones the broker refused too.
        maybe_in_kafka = maybe_in_kafka_before or code in POSSIBLY_PERSISTED
        verdict = Discard(DiscardReason.KAFKA_ERROR, producer_fatal_error)
    elif code in _PURGED or (shutting_down and code not in _PERMANENT):
        # Nothing will poll for a resend's report once the producers stop.
        if in_spool:
            return LeftForNextStart(error_name)
        verdict = Discard(DiscardReason.SHUTDOWN_DELAY, error_name)
    elif code in _PERMANENT or error_is_fatal or not topic_known:
        verdict = Discard(DiscardReason.KAFKA_ERROR, error_name)
    elif attempt >= max_attempts:
        verdict = Discard(DiscardReason.FAILED_DELIVERY_ATTEMPTS, error_name)
    else:
        return Reroute(possible_duplicate=this_attempt_maybe)
    return PossiblyDelivered(verdict.detail) if maybe_in_kafka else verdict


# -- a refusal at produce() --------------------------------------------------------------


class EnqueueRefused(PydoryError):
    """librdkafka refused a message at ``produce()``: it never left the daemon."""

    def __init__(self, reason: DiscardReason, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def produce_refusal(code: int) -> EnqueueRefused:
    """What librdkafka refusing a message at ``produce()`` with error ``code`` means
    for it (confluent-kafka raises BufferError for _QUEUE_FULL: the producer maps it)."""
    if code == KafkaError._QUEUE_FULL:
        return EnqueueRefused(DiscardReason.NO_MEMORY, "librdkafka queue full")
    name = KafkaError(code).name()
    if code == KafkaError.MSG_SIZE_TOO_LARGE:
        return EnqueueRefused(DiscardReason.TOO_LONG, name)
    return EnqueueRefused(DiscardReason.KAFKA_ERROR, name)


def no_producer_refusal() -> EnqueueRefused:
    """No producer could be made for the message's topic (librdkafka refused one)."""
    return EnqueueRefused(DiscardReason.KAFKA_ERROR, "producer unavailable")


def resend_refused(refusal: EnqueueRefused, maybe_in_kafka: bool) -> Discard | PossiblyDelivered:
    """librdkafka refused a reroute at ``produce()``: that was the message's last attempt
    (possibly delivered if the attempt before may have reached the log)."""
    if maybe_in_kafka:
        return PossiblyDelivered(refusal.detail)
    return Discard(DiscardReason.FAILED_DELIVERY_ATTEMPTS, refusal.detail)


# -- where outcomes are settled ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Delivered:
    """A batch of messages Kafka acknowledged: how many per topic and per token (the
    caller's opaque int given to ``send``), and the pool bytes they held in all;
    ``by_token_topic``: per token, per topic (the spool's tallies: ``Tallies``)."""

    by_topic: Mapping[str, int]
    by_token: Mapping[int, int]
    cost: int
    by_token_topic: Mapping[int, Mapping[str, int]] = field(default_factory=dict)
    #: The pool bytes per token (their clients' charges: ``books/charges.py``).
    cost_by_token: Mapping[int, int] = field(default_factory=dict)

    @classmethod
    def of(
        cls, by_token_topic: Mapping[int, Mapping[str, int]], cost_by_token: Mapping[int, int]
    ) -> Delivered:
        by_topic: dict[str, int] = {}
        by_token: dict[int, int] = {}
        for token, topics in by_token_topic.items():
            by_token[token] = sum(topics.values())
            for topic, n in topics.items():
                by_topic[topic] = by_topic.get(topic, 0) + n
        cost = sum(cost_by_token.values())
        return cls(by_topic, by_token, cost, by_token_topic, cost_by_token)


class Ledger(Protocol):
    """Where dispatch reports each message's final outcome (the daemon's books and pool)."""

    def delivered(self, batch: Delivered) -> None: ...

    def discarded(
        self,
        reason: DiscardReason,
        topic: str,
        timestamp_ms: int,
        detail: str,
        cost: int,
        token: int,
    ) -> None: ...

    def possibly_delivered(
        self,
        topic: str,
        timestamp_ms: int,
        message: Unsent,
        detail: str,
        cost: int,
        token: int,
        headers: Headers | None = None,
    ) -> None: ...

    def left_for_next_start(self, topic: str, cost: int, token: int) -> None: ...

    def possible_duplicate(self, topic: str, timestamp_ms: int) -> None: ...


class Unsent(Protocol):
    """The client's bytes of a message whose delivery failed (librdkafka's Message)."""

    def key(self) -> bytes | None: ...
    def value(self) -> bytes | None: ...


class Tokens(Protocol):
    """Counts accepted messages until they settle: the commit point, or the write-ahead
    standing in for it (which settles the spool too)."""

    def open(self, n: int = 1) -> int: ...
    def close(self, token: int, n: int = 1) -> None: ...
    def keep(self, token: int, n: int = 1) -> None:
        """Shutdown: the messages stay in the spool for the next start; this run's commit
        point no longer waits for them."""


class Tallies(Protocol):
    """Where a spooled message's final outcome is kept on disk with its settlement (the
    write-ahead: :mod:`pydory.daemon.spool.tallies`); told before the token closes."""

    def settled_as(self, token: int, topic: str, outcome: str, n: int = 1) -> None: ...


class DeliveryLedger:
    """The dispatch Ledger: final outcomes go to the books (and the spool's tallies), free
    their pool bytes and settle their commit point tokens."""

    def __init__(
        self,
        books: Books,
        pool: MemoryPool,
        commit_point: Tokens,
        tallies: Tallies | None = None,
        charges: TokenCharges | None = None,
    ) -> None:
        """``charges``: where a token's pool bytes go back to its client too (the
        ``ClientTokens`` the tokens are; none: no client is charged)."""
        self._books = books
        self._pool = pool
        self._commit_point = commit_point
        self._tallies = tallies
        self._charges = charges

    def _release(self, cost: int, token: int) -> None:
        """The pool bytes of a message under ``token``, back to the pool and its client."""
        self._pool.release(cost)
        if self._charges is not None:
            self._charges.released(token, cost)

    def delivered(self, batch: Delivered) -> None:
        books, close = self._books, self._commit_point.close
        for topic, n in batch.by_topic.items():
            books.delivered(topic, n)
        self._pool.release(batch.cost)
        if self._charges is not None:
            released = self._charges.released
            for token, cost in batch.cost_by_token.items():
                released(token, cost)
        if self._tallies is not None:
            settled_as = self._tallies.settled_as
            for token, topics in batch.by_token_topic.items():
                for topic, n in topics.items():
                    settled_as(token, topic, DELIVERED, n)
        for token, n in batch.by_token.items():
            close(token, n)

    def discarded(
        self,
        reason: DiscardReason,
        topic: str,
        timestamp_ms: int,
        detail: str,
        cost: int,
        token: int,
    ) -> None:
        self._books.discarded(reason, topic, timestamp_ms, detail=detail)
        self._release(cost, token)
        if self._tallies is not None:
            self._tallies.settled_as(token, topic, reason.value)
        self._commit_point.close(token)

    def possibly_delivered(
        self,
        topic: str,
        timestamp_ms: int,
        message: Unsent,
        detail: str,
        cost: int,
        token: int,
        headers: Headers | None = None,
    ) -> None:
        """``headers``: those it was produced with (a delivery report has none), whose
        identity the books keep for the audit to look up."""
        value, key = message.value() or b"", message.key() or b""
        identity = identity_in(headers)
        self._books.possibly_delivered(topic, timestamp_ms, value, key, detail, identity)
        self._release(cost, token)
        if self._tallies is not None:
            self._tallies.settled_as(token, topic, POSSIBLY_DELIVERED)
        self._commit_point.close(token)  # its fate is decided: a replay would only duplicate

    def left_for_next_start(self, topic: str, cost: int, token: int) -> None:
        self._books.left_for_next_start(topic)
        self._release(cost, token)
        self._commit_point.keep(token)

    def possible_duplicate(self, topic: str, timestamp_ms: int) -> None:
        self._books.possible_duplicate(topic, timestamp_ms)
