"""The books: every message counted, every discard given a reason and a report entry.

A message's life (docs/accounting.md has the full story)::

    received ──> accepted ──> delivered
        │            ├──────> possibly delivered   (librdkafka cannot know: in Kafka or not)
        │            ├──────> left for next start  (kept in the spool at shutdown)
        │            └──────> discarded after acceptance  (kafka_error,
        │                                                  failed_delivery_attempts,
        │                                                  shutdown_delay)
        └──> discarded before acceptance  (malformed, unsupported_api_key,
             unsupported_version, bad_topic, too_long, no_memory, rate_limit)

``unclean_disconnect`` is a partial message left when a stream closes: it was never
framed, so it is neither received nor accepted. ``spool_corrupt`` is a message of the
previous run's spool that could not be read back: neither received nor replayed.

A message is *accepted* once it passed every admission check (framed and decoded, size
within limits, pool bytes allocated, rate limit passed, topic known): from then on the
daemon alone is responsible for it. The invariant, per topic, at every moment::

    accepted == delivered + possibly_delivered + left_for_next_start
                + discarded_after_acceptance + in_flight                (in_flight >= 0)

:class:`Books` enforces it (a delivery or post-acceptance discard with nothing in flight
raises :class:`AccountingError`) and the audit job reads the totals from
:meth:`Books.per_topic`.

Topic names come from clients, so the records kept per topic are bounded: a topic Kafka
has (``topic_known``) always gets records of its own (the cluster bounds those), and so do
the first ``unknown_topic_limit`` names Kafka does not have; every later unknown name is
counted under :data:`OTHER_TOPICS`, a name no Kafka topic can have. Nothing is lost:
``(other)`` counts every message folded into it, so per-topic sums still equal the totals.
It only ever holds discards before acceptance (a message is accepted only for a topic
Kafka has, which has its own records), so its invariant is ``accepted == in_flight == 0``.

The discard report (Dory's ``/discards``) is kept in reporting periods
(:mod:`pydory.daemon.books.discard_report`); the books roll them on the wall clock and
:mod:`pydory.status.discards` renders them. The books' vocabulary (reasons, transports,
discard events) is :mod:`pydory.daemon.books.events`; counter names are
:mod:`pydory.daemon.books.counters`.

Single-threaded: driven from the daemon's event loop only, so there are no locks.

Rule: a message's lifecycle is counted here alone: only :class:`Books` records a
reception, an acceptance, a delivery or a discard, and it enforces the invariant above.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from pydory.daemon.books import counters as counter_names
from pydory.daemon.books.counters import Counters
from pydory.daemon.books.discard_report import (
    DORY_RECENT_LIMIT,
    DiscardReport,
    Period,
    widen,
)
from pydory.daemon.books.events import (
    AFTER_ACCEPTANCE,
    TOPIC_DISCARDS,
    AccountingError,
    DiscardEvent,
    DiscardReason,
    DiscardSink,
    OpenOutcome,
    Transport,
)

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_UNKNOWN_TOPIC_LIMIT", "OTHER_TOPICS", "Books", "TopicTotals"]

#: The books' name for every topic beyond the unknown-topic limit. Kafka allows only
#: [a-zA-Z0-9._-] in a topic name, so no real topic (and no client's name, which the
#: decoder checks by Kafka's rules) can ever be this one.
OTHER_TOPICS = "(other)"
#: Topic names Kafka does not have that get records of their own (``<maxUnknownTopics>``).
DEFAULT_UNKNOWN_TOPIC_LIMIT = 1000
#: Per topic, the identities (``pydory-id``) of possibly delivered messages kept for the
#: fleet audit to look up in the lake; beyond it they are only counted.
POSSIBLY_DELIVERED_IDS_KEPT = 1000


# --- per-topic totals ----------------------------------------------------------------------


@dataclass(frozen=True)
class TopicTotals:
    """Lifetime totals of one topic, as the audit job reads them."""

    accepted: int
    delivered: int
    discarded_by_reason: Mapping[DiscardReason, int]
    in_flight: int
    #: The last attempt's error left it unknown whether Kafka has the message.
    possibly_delivered: int = 0
    #: Kept in the spool at shutdown: the next start replays them.
    left_for_next_start: int = 0
    #: The identities of the first POSSIBLY_DELIVERED_IDS_KEPT possibly delivered ones.
    possibly_delivered_ids: tuple[str, ...] = ()

    @property
    def discarded_after_acceptance(self) -> int:
        """Discards that count against ``accepted`` (see :data:`AFTER_ACCEPTANCE`)."""
        return sum(
            n for reason, n in self.discarded_by_reason.items() if reason in AFTER_ACCEPTANCE
        )


@dataclass
class _TopicLedger:
    accepted: int = 0
    delivered: int = 0
    discarded: Counter[DiscardReason] = field(default_factory=Counter)
    # Kept alongside ``discarded`` so that in_flight, checked on every delivery, is O(1).
    discarded_after_acceptance: int = 0
    possibly_delivered: int = 0
    possibly_delivered_ids: list[str] = field(default_factory=list)
    left_for_next_start: int = 0

    @property
    def in_flight(self) -> int:
        return (
            self.accepted
            - self.delivered
            - self.discarded_after_acceptance
            - self.possibly_delivered
            - self.left_for_next_start
        )

    def discard(self, reason: DiscardReason) -> None:
        self.discarded[reason] += 1
        if reason in AFTER_ACCEPTANCE:
            self.discarded_after_acceptance += 1

    def totals(self) -> TopicTotals:
        return TopicTotals(
            accepted=self.accepted,
            delivered=self.delivered,
            discarded_by_reason=MappingProxyType(dict(self.discarded)),
            in_flight=self.in_flight,
            possibly_delivered=self.possibly_delivered,
            left_for_next_start=self.left_for_next_start,
            possibly_delivered_ids=tuple(self.possibly_delivered_ids),
        )


# --- the books -----------------------------------------------------------------------------


class Books:
    """All of the daemon's message accounting: lifecycle totals and the discard report."""

    def __init__(
        self,
        report_interval_s: int,
        bad_msg_prefix_size: int,
        wall_clock: Callable[[], float] = time.time,
        recent_limit: int = DORY_RECENT_LIMIT,
        counters: Counters | None = None,
        discard_sink: DiscardSink | None = None,
        *,
        unknown_topic_limit: int = DEFAULT_UNKNOWN_TOPIC_LIMIT,
        topic_known: Callable[[str], bool] = lambda topic: False,
    ) -> None:
        """Start the books with reporting period 0 beginning now.

        ``report_interval_s`` is Dory's ``discardReportInterval`` (0 disables rolling);
        ``bad_msg_prefix_size`` caps every stored message prefix (``badMsgPrefixSize``);
        ``recent_limit`` caps each recent-item list; ``counters`` lets the daemon share one
        counter registry (a new one is created otherwise); ``discard_sink``, if given, is
        handed every discard and possible duplicate (the discard log and ``logDiscards``);
        ``topic_known(topic)`` says whether Kafka has a topic, and ``unknown_topic_limit``
        how many other names get records of their own (the rest: :data:`OTHER_TOPICS`).
        """
        if report_interval_s < 0:
            raise ValueError(f"report interval must be >= 0 seconds, got {report_interval_s}")
        if bad_msg_prefix_size < 0:
            raise ValueError(f"bad message prefix size must be >= 0, got {bad_msg_prefix_size}")
        if recent_limit < 1:
            raise ValueError(f"recent_limit must be >= 1, got {recent_limit}")
        if unknown_topic_limit < 0:
            raise ValueError(f"unknown_topic_limit must be >= 0, got {unknown_topic_limit}")
        self._interval_s = report_interval_s
        self._prefix_size = bad_msg_prefix_size
        self._wall_clock = wall_clock
        self._recent_limit = recent_limit
        self.counters = counters if counters is not None else Counters()
        self._topics: dict[str, _TopicLedger] = {}
        self._topic_known = topic_known
        self._unknown_topic_limit = unknown_topic_limit
        # Names Kafka did not have when first recorded that got records of their own: at
        # most unknown_topic_limit of them, kept for the daemon's life (never evicted, so
        # a name's counts never move between its own line and (other)).
        self._unknown_named: set[str] = set()
        self._received: Counter[Transport] = Counter()
        self._lifetime_discards: Counter[DiscardReason] = Counter()
        self._current = Period(0, int(wall_clock()), recent_limit)
        self._finished: Period | None = None
        self._discard_sink = discard_sink
        self._report_read_at = wall_clock()  # when the discard report was last asked for

    def set_discard_sink(self, sink: DiscardSink | None) -> None:
        """A config reload changed the discard outputs: every discard from now on goes to
        ``sink`` (the caller closes the old one after, so nothing falls between)."""
        self._discard_sink = sink

    # --- message lifecycle ---------------------------------------------------------------

    def received(self, transport: Transport, n: int = 1) -> None:
        """``n`` messages arrived on ``transport`` and were framed (not yet admitted)."""
        self._received[transport] += n
        self.counters.inc(counter_names.RECEIVED[transport], n)

    def accepted(self, topic: str, n: int = 1) -> None:
        """``n`` messages of ``topic`` passed admission: the daemon now answers for them."""
        self._ledger(topic).accepted += n
        self.counters.inc(counter_names.ACCEPTED, n)

    def delivered(self, topic: str, n: int = 1) -> None:
        """Kafka acknowledged ``n`` accepted messages of ``topic``."""
        ledger = self._topics.get(topic)
        if ledger is None or n > ledger.in_flight:
            self._require_in_flight(topic, n, "delivered")  # raises, naming the mistake
        else:
            ledger.delivered += n
        self.counters.inc(counter_names.DELIVERED, n)

    def discarded(
        self,
        reason: DiscardReason,
        topic: str | None,
        client_timestamp_ms: int | None,
        prefix: bytes = b"",
        detail: str = "",
        transport: Transport | None = None,
        *,
        api_version: int | None = None,
        key: bytes = b"",
    ) -> None:
        """Record one discarded message (or partial message) and why.

        What each reason needs:

        - ``too_long``, ``no_memory``, ``rate_limit``, ``kafka_error``,
          ``failed_delivery_attempts``, ``shutdown_delay``: ``topic`` and
          ``client_timestamp_ms``. For ``too_long`` pass the message value as ``prefix``:
          the report keeps ``topic + b" " + value``, cut to the prefix size, as Dory does.
          For ``kafka_error`` pass the Kafka error name as ``detail``.
        - ``bad_topic``: ``topic``, the rejected name as text.
        - ``malformed``, ``unclean_disconnect``: ``prefix``, the bytes received;
          ``unclean_disconnect`` also needs ``transport`` (UNIX stream or TCP).
        - ``spool_corrupt``: nothing; ``prefix`` (the damaged bytes) and ``detail`` (where
          they were) go to the discard sink.
        - ``unsupported_version``: ``api_version``, the version the client sent.
        - ``unsupported_api_key``: nothing (Dory reports only the count).

        The discard sink, if any, also gets ``prefix`` (pass the message value for any
        topic discard when you have it) and ``key``; the books themselves ignore ``key``.

        Post-acceptance reasons (:data:`AFTER_ACCEPTANCE`) require a message of ``topic``
        in flight and raise :class:`AccountingError` otherwise.
        """
        self.maybe_roll()
        if reason in TOPIC_DISCARDS:
            if topic is None or client_timestamp_ms is None:
                raise ValueError(f"a {reason} discard needs the topic and the client timestamp")
            self._record_topic_discard(reason, topic, client_timestamp_ms, prefix, detail)
        else:
            self._record_input_discard(reason, topic, prefix, transport, api_version)
        self._lifetime_discards[reason] += 1
        self._current.discards_by_reason[reason] += 1
        self.counters.inc(counter_names.DISCARDED[reason])
        if self._discard_sink is not None:
            event = DiscardEvent(
                reason, topic, client_timestamp_ms, key, prefix, detail, transport, api_version
            )
            self._discard_sink.discarded(event)

    def possibly_delivered(
        self,
        topic: str,
        client_timestamp_ms: int,
        value: bytes,
        key: bytes,
        detail: str,
        identity: str | None = None,
    ) -> None:
        """An accepted message's last attempt ended in an error after which it may be in
        Kafka or not (``detail``: librdkafka's error name). Not a discard: Dory's report
        lists it apart, and the discard log has it, with the client's bytes, as ``MAYBE``.
        ``identity``: its ``pydory-id``, kept (a bounded number per topic) for the audit.
        """
        ledger = self._topics.get(topic)
        if ledger is None or ledger.in_flight < 1:
            self._require_in_flight(topic, 1, "possibly delivered")  # raises
        else:
            ledger.possibly_delivered += 1
            if identity is not None and len(ledger.possibly_delivered_ids) < (
                POSSIBLY_DELIVERED_IDS_KEPT
            ):
                ledger.possibly_delivered_ids.append(identity)
        self.counters.inc(counter_names.POSSIBLY_DELIVERED)
        self.maybe_roll()
        widen(self._current.possibly_delivered_topics, topic, client_timestamp_ms)
        if self._discard_sink is not None:
            event = DiscardEvent(
                OpenOutcome.POSSIBLY_DELIVERED,
                topic,
                client_timestamp_ms,
                key,
                value,
                detail,
                None,
                None,
            )
            self._discard_sink.discarded(event)

    def left_for_next_start(self, topic: str, n: int = 1) -> None:
        """At shutdown, ``n`` accepted messages of ``topic`` stay in the spool for the next
        start, which replays them. Not a discard: nothing is dropped."""
        ledger = self._topics.get(topic)
        if ledger is None or n > ledger.in_flight:
            self._require_in_flight(topic, n, "left for the next start")  # raises
        else:
            ledger.left_for_next_start += n
        self.counters.inc(counter_names.LEFT_FOR_NEXT_START, n)

    def possible_duplicate(self, topic: str, client_timestamp_ms: int) -> None:
        """A message of ``topic`` was sent again after a send whose outcome was unknown."""
        self.counters.inc(counter_names.POSSIBLE_DUPLICATE)
        self.maybe_roll()
        widen(self._current.duplicate_topics, self._record_name(topic), client_timestamp_ms)
        if self._discard_sink is not None:
            self._discard_sink.possible_duplicate(topic, client_timestamp_ms)

    # --- reading the books ---------------------------------------------------------------

    def per_topic(self) -> dict[str, TopicTotals]:
        """Lifetime totals of every topic seen (accepted, or discarded with a topic)."""
        return {topic: ledger.totals() for topic, ledger in self._topics.items()}

    def in_flight_by_topic(self) -> dict[str, int]:
        """Per topic, accepted messages not yet delivered or discarded."""
        return {topic: ledger.in_flight for topic, ledger in self._topics.items()}

    @property
    def unknown_topic_limit(self) -> int:
        """Names Kafka does not have that get records of their own; the rest: (other)."""
        return self._unknown_topic_limit

    @property
    def unknown_topics_named(self) -> int:
        """Names Kafka did not have when first recorded that have records of their own."""
        return len(self._unknown_named)

    def received_by_transport(self) -> dict[Transport, int]:
        """Lifetime count of framed messages per transport."""
        return {transport: self._received[transport] for transport in Transport}

    def lifetime_discards_by_reason(self) -> dict[DiscardReason, int]:
        """Lifetime discards per reason, every reason present (0 if none)."""
        return {reason: self._lifetime_discards[reason] for reason in DiscardReason}

    def discard_report(self) -> DiscardReport:
        """The discard report now: the current period and the latest finished one."""
        self._report_read_at = self._wall_clock()
        self.maybe_roll()
        finished = self._finished.snapshot() if self._finished is not None else None
        return DiscardReport(self._interval_s, self._current.snapshot(), finished)

    def check_report_read(self) -> bool:
        """Dory's ``NoDiscardQuery``: False (and counted, logged) when nobody asked for the
        discard report for longer than a report interval, so a finished period may have
        been replaced before anyone read it. The daemon calls this every interval + 1 s."""
        if self._interval_s == 0:
            return True
        unread_s = self._wall_clock() - self._report_read_at
        if unread_s <= self._interval_s:
            return True
        self.counters.inc(counter_names.DISCARD_REPORT_UNREAD)
        log.warning(
            "no discard report query in the last %d s: possible loss of discard information",
            unread_s,
        )
        return False

    def maybe_roll(self) -> None:
        """Close the current period if ``report_interval_s`` has passed (wall clock).

        Periods stay on the grid ``start + k * interval``. If two or more periods passed
        since the last event, the latest finished period is an empty one with the right
        id, as in Dory (nobody asked for the report in time; its data is lost). A wall
        clock set back never closes a period.
        """
        if self._interval_s == 0:
            return
        elapsed = int(self._wall_clock()) - self._current.start_time
        periods_passed = max(elapsed, 0) // self._interval_s
        if periods_passed == 0:
            return
        current = self._current
        if periods_passed == 1:
            self._finished = current
        else:
            self._finished = self._empty_period(periods_passed - 1)
        self._current = self._empty_period(periods_passed)

    # --- internals -----------------------------------------------------------------------

    def _empty_period(self, periods_after_current: int) -> Period:
        return Period(
            self._current.report_id + periods_after_current,
            self._current.start_time + periods_after_current * self._interval_s,
            self._recent_limit,
        )

    def _ledger(self, topic: str) -> _TopicLedger:
        ledger = self._topics.get(topic)
        if ledger is None:
            ledger = self._topics[topic] = _TopicLedger()
        return ledger

    def _record_name(self, topic: str) -> str:
        """The name ``topic``'s records go under: its own, or :data:`OTHER_TOPICS` when
        Kafka does not have it and the unknown-topic limit is reached (counted)."""
        if topic in self._topics or topic in self._unknown_named or self._topic_known(topic):
            return topic
        if len(self._unknown_named) < self._unknown_topic_limit:
            self._unknown_named.add(topic)
            return topic
        if not self.counters.get(counter_names.OTHER_TOPIC_EVENTS):
            log.warning(
                "%d topic names Kafka does not have have records of their own "
                "(maxUnknownTopics): events of any further one are counted under %s",
                self._unknown_topic_limit,
                OTHER_TOPICS,
            )
        self.counters.inc(counter_names.OTHER_TOPIC_EVENTS)
        return OTHER_TOPICS

    def _require_in_flight(self, topic: str, n: int, what: str) -> None:
        ledger = self._topics.get(topic)
        in_flight = ledger.in_flight if ledger is not None else 0
        if n > in_flight:
            raise AccountingError(
                f"{n} message(s) of topic {topic!r} {what}, but only {in_flight} "
                "in flight: a message was accounted twice or never accepted"
            )

    def _record_topic_discard(
        self, reason: DiscardReason, topic: str, timestamp_ms: int, prefix: bytes, detail: str
    ) -> None:
        """A discard of a message with a topic: per-topic books, then Dory's report."""
        ledger = self._topics.get(topic)
        if reason in AFTER_ACCEPTANCE and (ledger is None or ledger.in_flight < 1):
            self._require_in_flight(topic, 1, f"discarded ({reason})")  # raises
        # Before acceptance only (an accepted topic has a ledger): maybe (other)'s.
        name = topic if ledger is not None else self._record_name(topic)
        if ledger is None:
            ledger = self._ledger(name)
        ledger.discard(reason)
        period = self._current
        widen(period.discard_topics, name, timestamp_ms)
        if reason is DiscardReason.TOO_LONG:
            # The real name: the recent list is bounded by itself (recent_limit).
            period.recent_too_long.add(self._cut(topic.encode("utf-8") + b" " + prefix))
        elif reason is DiscardReason.RATE_LIMIT:
            period.rate_limit_discards[name] += 1
        elif reason is DiscardReason.KAFKA_ERROR:
            error_name = detail or "unknown"
            period.kafka_errors[error_name] += 1
            self.counters.inc(counter_names.discarded_kafka_error(error_name))

    def _record_input_discard(
        self,
        reason: DiscardReason,
        topic: str | None,
        prefix: bytes,
        transport: Transport | None,
        api_version: int | None,
    ) -> None:
        """A discard of bytes that never became a message with a topic (see the table)."""
        period = self._current
        if reason is DiscardReason.MALFORMED:
            period.malformed_count += 1
            period.recent_malformed.add(self._cut(prefix))
        elif reason is DiscardReason.UNSUPPORTED_API_KEY:
            period.unsupported_api_key_count += 1
        elif reason is DiscardReason.UNSUPPORTED_VERSION:
            if api_version is None:
                raise ValueError("an unsupported_version discard needs the api_version")
            period.unsupported_versions[api_version] += 1
        elif reason is DiscardReason.BAD_TOPIC:
            if topic is None:
                raise ValueError("a bad_topic discard needs the rejected topic name")
            period.bad_topic_count += 1
            period.recent_bad_topics.add(topic)
        elif reason is DiscardReason.UNCLEAN_DISCONNECT:
            if transport is None or transport is Transport.UNIX_DGRAM:
                raise ValueError(f"an unclean disconnect needs a stream transport, not {transport}")
            period.unclean_disconnect_counts[transport] += 1
            period.recent_unclean[transport].add(self._cut(prefix))
        elif reason is DiscardReason.SPOOL_CORRUPT:
            pass  # Dory's report has no place for it: the period's discards_by_reason counts it
        else:
            raise AssertionError(f"discard reason {reason} has no place in the report")

    def _cut(self, data: bytes) -> bytes:
        return bytes(data[: self._prefix_size])
