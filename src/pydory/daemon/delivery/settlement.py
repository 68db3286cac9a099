"""Settlement: each delivery report batch becomes the ledger's entries, on the loop.

Failures first, one by one (each needs its own decision, :func:`outcomes.failure_outcome`):
settled as discarded, possibly delivered or left for the next start, or rerouted (a new
``send`` of the same message under its identity). Then the acknowledgements as one batch,
per topic and per token. The possible-duplicate window lives here: librdkafka's idempotent
producer, once a message times out in flight (or a request that may have been written
fails), bumps its epoch and renumbers what it still holds, so a batch already written may
be written again and reported delivered once (its INTRODUCTION.md, "Message timeout
considerations"; confluentinc/librdkafka#4953). Which ones, librdkafka does not say, so
every message sent before such a failure (its token at most ``suspect_through``) and
acknowledged after it is flagged a possible duplicate, until nothing sent before it is held
any more (the dispatcher then calls :meth:`Settlement.close_window`).

Rule: every delivery report is settled in `Settlement` alone, and the possible-duplicate
window opens, flags and closes here alone.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

from pydory.daemon.books.charges import SLOT_MASK
from pydory.daemon.books.msg_debug import MsgDebug
from pydory.daemon.books.pool import message_cost, messages_cost, pool_cost
from pydory.daemon.delivery.outcomes import (
    POSSIBLY_PERSISTED,
    Delivered,
    Discard,
    EnqueueRefused,
    FinalOutcome,
    Ledger,
    PossiblyDelivered,
    Reroute,
    failure_outcome,
    resend_refused,
)
from pydory.daemon.delivery.producer_backend import (
    AckReport,
    AckSum,
    DeliveryReports,
    FailureReport,
)
from pydory.daemon.delivery.router import NO_LEADER, Router

__all__ = ["Settlement"]


class Settlement:
    """Settles delivery reports on the ledger; reroutes through ``resend`` (Dispatcher.send)."""

    def __init__(
        self,
        ledger: Ledger,
        router: Router,
        msg_debug: MsgDebug,
        kept_on_disk: Callable[[int], bool],
        *,
        resend: Callable[..., None],
        on_partition_trouble: Callable[[], None],
        newest_token: Callable[[], int],
        shutting_down: Callable[[], bool],
    ) -> None:
        """``newest_token()``: the newest token sent; ``shutting_down()``: the dispatcher
        is closing (nothing will poll for a resend's report)."""
        self._ledger = ledger
        self._router = router
        self._msg_debug = msg_debug
        self._kept_on_disk = kept_on_disk
        self._send = resend
        self._on_partition_trouble = on_partition_trouble
        self._newest_token = newest_token
        self._shutting_down = shutting_down
        #: How many times a message is sent at most (<maxFailedDeliveryAttempts>).
        self.max_attempts = 1
        #: Messages sent again after a failed attempt.
        self.rerouted = 0
        self._suspect_through: int | None = None

    @property
    def window_open(self) -> bool:
        """Acknowledgements must come one by one: the possible-duplicate window is open."""
        return self._suspect_through is not None

    def close_window(self) -> None:
        """Nothing sent before the failure that opened the window is held any more."""
        self._suspect_through = None

    def settle(self, reports: DeliveryReports) -> None:
        """Settle every report waiting: failures one by one, then acknowledgements as one
        batch, per topic and per token."""
        # Failures first: one may open the possible-duplicate window for the acks after it.
        failures = reports.failures
        while failures:
            self._settle_failure(failures.popleft())
        acks, sums = reports.acks, reports.ack_sums
        if acks or sums:
            self._settle_acks(acks, sums)

    def _settle_acks(
        self, acks: collections.deque[AckReport], sums: collections.deque[AckSum]
    ) -> None:
        if self._msg_debug.active:  # one check per batch
            self._trace_acks(acks)
        if self._suspect_through is not None:  # one check per batch
            self._flag_suspects(acks, self._suspect_through)
        per_token: dict[int, dict[str, int]] = {}  # as cheap as two flat counts
        cost: dict[int, int] = {}  # per token: its client's (books/charges.py)
        pop = acks.popleft
        cost_of = message_cost
        while acks:
            msg, token, _ = pop()
            topic = msg.topic()
            key = msg.key()
            topics = per_token.get(token) or per_token.setdefault(token, {})
            topics[topic] = topics.get(topic, 0) + 1
            # len(msg) is the value's length, without copying it out.
            cost[token] = cost.get(token, 0) + cost_of(topic, len(msg) + (len(key) if key else 0))
        while sums:  # the compiled producer's: summed per (token, topic) already
            entry = sums.popleft()
            token, topic, n = entry.token, entry.topic, entry.messages
            topics = per_token.get(token) or per_token.setdefault(token, {})
            topics[topic] = topics.get(topic, 0) + n
            cost[token] = cost.get(token, 0) + messages_cost(topic, n, entry.data_bytes)
        self._ledger.delivered(Delivered.of(per_token, cost))

    def _flag_suspects(self, acks: collections.deque[AckReport], through: int) -> None:
        """Each acknowledged message sent before the last failure after which librdkafka
        may have renumbered what it held: a possible duplicate (see ``__init__``)."""
        possible_duplicate = self._ledger.possible_duplicate
        for msg, token, timestamp_ms in acks:
            if token <= through:
                possible_duplicate(msg.topic(), timestamp_ms)

    def _trace_acks(self, acks: collections.deque[AckReport]) -> None:
        """Message debugging: a ``msg_got_ack`` line per acknowledged traced message."""
        msg_debug = self._msg_debug
        for msg, _, timestamp_ms in acks:
            topic = msg.topic()
            if msg_debug.traces(topic):
                msg_debug.acknowledged(topic, msg.partition(), msg.key(), msg.value(), timestamp_ms)

    def _settle_failure(self, failure: FailureReport) -> None:
        err, msg, timestamp_ms, token = (
            failure.error,
            failure.message,
            failure.timestamp_ms,
            failure.token,
        )
        topic: str = msg.topic()
        possibly_persisted = failure.possibly_persisted
        outcome = failure_outcome(
            err.code(),
            err.name(),
            error_is_fatal=err.fatal(),
            producer_fatal_error=failure.handle.fatal_error,
            topic_known=self._router.knows(topic),
            attempt=failure.attempt,
            max_attempts=self.max_attempts,
            shutting_down=self._shutting_down(),
            maybe_in_kafka_before=failure.maybe_in_kafka,
            in_spool=self._kept_on_disk(token),
            possibly_persisted=possibly_persisted,
        )
        if (possibly_persisted or err.code() in POSSIBLY_PERSISTED) and not self._shutting_down():
            # Every client's slot of the newest token's generation (books/charges.py):
            # sent before the failure as much as the newest message of the generation.
            self._suspect_through = self._newest_token() | SLOT_MASK
        # Sent before such a failure (its own included): librdkafka may have written it
        # twice, and a copy in Kafka may then be a second one.
        renumbered = self._suspect_through is not None and token <= self._suspect_through
        if not isinstance(outcome, Reroute):
            if renumbered and isinstance(outcome, PossiblyDelivered):
                self._ledger.possible_duplicate(topic, timestamp_ms)
            self._settle(msg, timestamp_ms, outcome, token, failure.headers)
            return
        if outcome.possible_duplicate or renumbered:
            self._ledger.possible_duplicate(topic, timestamp_ms)
        maybe_in_kafka = failure.maybe_in_kafka or outcome.possible_duplicate
        resend = (failure.partition_key, failure.attempt + 1, token, maybe_in_kafka)
        self._reroute(msg, timestamp_ms, *resend, failure.headers)

    def _settle(
        self, msg: Any, timestamp_ms: int, outcome: FinalOutcome, token: int, headers: Any
    ) -> None:
        topic = msg.topic()
        cost, ledger = pool_cost(topic, msg.key(), msg.value()), self._ledger
        why = outcome.detail if isinstance(outcome, Discard | PossiblyDelivered) else ""
        if isinstance(outcome, Discard):
            ledger.discarded(outcome.reason, topic, timestamp_ms, why, cost, token)
        elif isinstance(outcome, PossiblyDelivered):
            ledger.possibly_delivered(topic, timestamp_ms, msg, why, cost, token, headers)
        else:
            ledger.left_for_next_start(topic, cost, token)

    def _reroute(
        self,
        msg: Any,
        timestamp_ms: int,
        partition_key: int | None,
        attempt: int,
        token: int,
        maybe_in_kafka: bool,
        headers: Any,
    ) -> None:
        """Send again, under the identity it was first sent with: an AnyPartition message
        to another available partition, a PartitionKey one by the key rule."""
        topic = msg.topic()
        failed = msg.partition()
        layout = self._router.layout(topic)
        if layout is not None and layout.leaders.get(failed, NO_LEADER) != NO_LEADER:
            # Metadata still names a leader for the partition that failed: it is stale.
            self._on_partition_trouble()
        if partition_key is None:
            partition = self._router.any_partition(topic, avoid=failed)
        else:
            partition = self._router.partition_key_partition(topic, partition_key)
        self.rerouted += 1
        try:
            self._send(
                topic,
                partition,
                msg.value(),
                msg.key(),
                timestamp_ms,
                partition_key,
                attempt,
                token,
                maybe_in_kafka,
                headers,
            )
        except EnqueueRefused as refusal:
            self._settle(msg, timestamp_ms, resend_refused(refusal, maybe_in_kafka), token, headers)
            return
        msg_debug = self._msg_debug
        if msg_debug.active and msg_debug.traces(topic):
            msg_debug.sent(topic, partition, msg.key(), msg.value(), timestamp_ms)
