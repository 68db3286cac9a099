"""The books: every message counted, every discard given a reason and a report entry.

A message's life (docs/accounting.md has the full story)::

    received ──> accepted ──> delivered
        │            └──────> discarded after acceptance  (kafka_error,
        │                                                  failed_delivery_attempts,
        │                                                  shutdown_delay)
        └──> discarded before acceptance  (malformed, unsupported_api_key,
             unsupported_version, bad_topic, too_long, no_memory, rate_limit)

``unclean_disconnect`` is a partial message left when a stream closes: it was never
framed, so it is neither received nor accepted.

A message is *accepted* once it passed every admission check (framed and decoded, size
within limits, pool bytes allocated, rate limit passed, topic known): from then on the
daemon alone is responsible for it. The invariant, per topic, at every moment::

    accepted == delivered + discarded_after_acceptance + in_flight      (in_flight >= 0)

:class:`Books` enforces it (a delivery or post-acceptance discard with nothing in flight
raises :class:`AccountingError`) and the audit job reads the totals from
:meth:`Books.per_topic`.

The discard report (Dory's ``/discards``) is kept in reporting periods of
``discardReportInterval`` seconds on the wall clock, exactly as Dory's ``TAnomalyTracker``
does: period starts stay on the grid ``first_start + k * interval``; if more than one
period passed unobserved, the latest finished period is an empty one. Recent-item lists
keep the newest first, move a repeated item to the front instead of duplicating it, and
hold at most ``recent_limit`` items.

Single-threaded: driven from the daemon's event loop only, so there are no locks.
"""

from __future__ import annotations

import base64
import enum
import logging
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Generic, NamedTuple, Protocol, TypeVar

from pydory.errors import PydoryError

log = logging.getLogger(__name__)

__all__ = [
    "AFTER_ACCEPTANCE",
    "BEFORE_ACCEPTANCE",
    "DORY_RECENT_LIMIT",
    "AccountingError",
    "Books",
    "Counters",
    "DiscardEvent",
    "DiscardReason",
    "DiscardReport",
    "DiscardSink",
    "PeriodReport",
    "TopicInterval",
    "TopicTotals",
    "Transport",
]

# Dory's TAnomalyTracker keeps at most 25 items in each "recent" list.
DORY_RECENT_LIMIT = 25


class DiscardReason(enum.StrEnum):
    """Why a message was dropped. Values are stable: metrics and JSON use them."""

    MALFORMED = "malformed"
    UNSUPPORTED_API_KEY = "unsupported_api_key"
    UNSUPPORTED_VERSION = "unsupported_version"
    BAD_TOPIC = "bad_topic"
    TOO_LONG = "too_long"
    NO_MEMORY = "no_memory"
    RATE_LIMIT = "rate_limit"
    KAFKA_ERROR = "kafka_error"
    FAILED_DELIVERY_ATTEMPTS = "failed_delivery_attempts"
    SHUTDOWN_DELAY = "shutdown_delay"
    UNCLEAN_DISCONNECT = "unclean_disconnect"


class Transport(enum.StrEnum):
    """The client socket a message arrived on."""

    UNIX_DGRAM = "unix_dgram"
    UNIX_STREAM = "unix_stream"
    TCP = "tcp"


AFTER_ACCEPTANCE: frozenset[DiscardReason] = frozenset(
    {
        DiscardReason.KAFKA_ERROR,
        DiscardReason.FAILED_DELIVERY_ATTEMPTS,
        DiscardReason.SHUTDOWN_DELAY,
    }
)
"""Discards of messages the daemon had accepted: they leave ``in_flight``."""

BEFORE_ACCEPTANCE: frozenset[DiscardReason] = frozenset(DiscardReason) - AFTER_ACCEPTANCE
"""Discards at admission: counted per reason, never part of ``accepted``."""

# Discards of a message with a usable topic and client timestamp. Dory reports these in
# "discard_topic" (rate-limit discards appear there too, as well as in
# "rate_limit_discard"), and pydory keeps per-topic totals for them.
_TOPIC_DISCARDS: frozenset[DiscardReason] = frozenset(
    {
        DiscardReason.TOO_LONG,
        DiscardReason.NO_MEMORY,
        DiscardReason.RATE_LIMIT,
        *AFTER_ACCEPTANCE,
    }
)

_STREAM_TRANSPORTS = frozenset({Transport.UNIX_STREAM, Transport.TCP})
# Counter names, formatted once rather than per message.
_RECEIVED_COUNTER = {transport: f"received_{transport}" for transport in Transport}
_DISCARDED_COUNTER = {reason: f"discarded_{reason}" for reason in DiscardReason}


class AccountingError(PydoryError):
    """The daemon reported an impossible lifecycle step for a topic.

    For example a delivery or a post-acceptance discard with no message of that topic in
    flight. This is a bug in the daemon (a message accounted twice or never accepted),
    not in a client; the books are left unchanged.
    """


# --- counters ------------------------------------------------------------------------------


class Counters:
    """Named event counters, like Dory's ``/counters``: name -> count, cheap increments."""

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}

    def inc(self, name: str, n: int = 1) -> None:
        """Add ``n`` to counter ``name`` (created at 0 on first use)."""
        self._counts[name] = self._counts.get(name, 0) + n

    def get(self, name: str) -> int:
        """The current value of ``name``; 0 if it was never incremented."""
        return self._counts.get(name, 0)

    def snapshot(self) -> dict[str, int]:
        """A copy of every counter, in order of first use."""
        return dict(self._counts)


# --- per-topic totals ----------------------------------------------------------------------


@dataclass(frozen=True)
class TopicTotals:
    """Lifetime totals of one topic, as the audit job reads them."""

    accepted: int
    delivered: int
    discarded_by_reason: Mapping[DiscardReason, int]
    in_flight: int

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

    @property
    def in_flight(self) -> int:
        return self.accepted - self.delivered - self.discarded_after_acceptance

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
        )


# --- one reporting period ------------------------------------------------------------------


@dataclass(frozen=True)
class TopicInterval:
    """Earliest and latest client timestamps (ms since epoch) of a topic's events."""

    min_timestamp: int
    max_timestamp: int
    count: int

    def including(self, timestamp_ms: int) -> TopicInterval:
        return TopicInterval(
            min(self.min_timestamp, timestamp_ms),
            max(self.max_timestamp, timestamp_ms),
            self.count + 1,
        )


_Item = TypeVar("_Item", bytes, str)


class _RecentItems(Generic[_Item]):
    """The ``limit`` most recently seen distinct items; a repeat moves to the front."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._items: OrderedDict[_Item, None] = OrderedDict()

    def add(self, item: _Item) -> None:
        if item in self._items:
            self._items.move_to_end(item)
            return
        self._items[item] = None
        if len(self._items) > self._limit:
            self._items.popitem(last=False)

    def newest_first(self) -> tuple[_Item, ...]:
        return tuple(reversed(self._items))


class _Period:
    """The mutable tallies of one reporting period (Dory's ``TAnomalyTracker::TInfo``)."""

    def __init__(self, report_id: int, start_time: int, recent_limit: int) -> None:
        self.report_id = report_id
        self.start_time = start_time
        self.malformed_count = 0
        self.unclean_disconnect_counts: Counter[Transport] = Counter()
        self.unsupported_api_key_count = 0
        self.unsupported_versions: Counter[int] = Counter()
        self.bad_topic_count = 0
        self.recent_malformed: _RecentItems[bytes] = _RecentItems(recent_limit)
        self.recent_unclean: dict[Transport, _RecentItems[bytes]] = {
            t: _RecentItems(recent_limit) for t in _STREAM_TRANSPORTS
        }
        self.recent_bad_topics: _RecentItems[str] = _RecentItems(recent_limit)
        self.recent_too_long: _RecentItems[bytes] = _RecentItems(recent_limit)
        self.rate_limit_discards: Counter[str] = Counter()
        # topic -> [min timestamp, max timestamp, count]: updated in place on every
        # discard (a flood costs no object per message), frozen in snapshot().
        self.discard_topics: dict[str, list[int]] = {}
        self.duplicate_topics: dict[str, list[int]] = {}
        self.discards_by_reason: Counter[DiscardReason] = Counter()
        self.kafka_errors: Counter[str] = Counter()

    def snapshot(self) -> PeriodReport:
        return PeriodReport(
            id=self.report_id,
            start_time=self.start_time,
            malformed_msg_count=self.malformed_count,
            unix_stream_unclean_disconnect_count=self.unclean_disconnect_counts[
                Transport.UNIX_STREAM
            ],
            tcp_unclean_disconnect_count=self.unclean_disconnect_counts[Transport.TCP],
            unsupported_api_key_msg_count=self.unsupported_api_key_count,
            unsupported_version_msg_count=self.unsupported_versions.total(),
            bad_topic_msg_count=self.bad_topic_count,
            recent_malformed=self.recent_malformed.newest_first(),
            unix_stream_unclean_disconnect=self.recent_unclean[
                Transport.UNIX_STREAM
            ].newest_first(),
            tcp_unclean_disconnect=self.recent_unclean[Transport.TCP].newest_first(),
            unsupported_msg_version=tuple(sorted(self.unsupported_versions.items())),
            recent_bad_topic=self.recent_bad_topics.newest_first(),
            recent_too_long_msg=self.recent_too_long.newest_first(),
            rate_limit_discard=tuple(sorted(self.rate_limit_discards.items())),
            discard_topic=_frozen_intervals(self.discard_topics),
            possible_duplicate_topic=_frozen_intervals(self.duplicate_topics),
            discards_by_reason=MappingProxyType(
                {reason: self.discards_by_reason[reason] for reason in DiscardReason}
            ),
            kafka_error_discards=MappingProxyType(dict(sorted(self.kafka_errors.items()))),
        )


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _length_prefixed(text: str) -> str:
    """Dory's plain-text framing of a name: its byte length, then the name in brackets."""
    return f"{len(text.encode('utf-8', 'surrogateescape'))}[{text}]"


@dataclass(frozen=True)
class PeriodReport:
    """An immutable snapshot of one reporting period, in Dory's report vocabulary.

    Recent lists are newest first; per-topic and per-version lists are sorted by key, as
    Dory's ``std::map`` iterates them. ``recent_bad_topic`` holds topic names as text
    (callers decode raw bytes with ``errors="backslashreplace"``); the other recent lists
    hold raw byte prefixes, base64-encoded on output.
    """

    id: int
    start_time: int
    malformed_msg_count: int
    unix_stream_unclean_disconnect_count: int
    tcp_unclean_disconnect_count: int
    unsupported_api_key_msg_count: int
    unsupported_version_msg_count: int
    bad_topic_msg_count: int
    recent_malformed: tuple[bytes, ...]
    unix_stream_unclean_disconnect: tuple[bytes, ...]
    tcp_unclean_disconnect: tuple[bytes, ...]
    unsupported_msg_version: tuple[tuple[int, int], ...]
    recent_bad_topic: tuple[str, ...]
    recent_too_long_msg: tuple[bytes, ...]
    rate_limit_discard: tuple[tuple[str, int], ...]
    discard_topic: tuple[tuple[str, TopicInterval], ...]
    possible_duplicate_topic: tuple[tuple[str, TopicInterval], ...]
    # pydory extras (new JSON keys, never in place of Dory's):
    discards_by_reason: Mapping[DiscardReason, int]
    kafka_error_discards: Mapping[str, int]

    def to_dory_json(self) -> dict[str, Any]:
        """This period as Dory's JSON object, followed by pydory's extra keys."""
        return {
            "id": self.id,
            "start_time": self.start_time,
            "malformed_msg_count": self.malformed_msg_count,
            "unix_stream_unclean_disconnect_count": self.unix_stream_unclean_disconnect_count,
            "tcp_unclean_disconnect_count": self.tcp_unclean_disconnect_count,
            "unsupported_api_key_msg_count": self.unsupported_api_key_msg_count,
            "unsupported_version_msg_count": self.unsupported_version_msg_count,
            "bad_topic_msg_count": self.bad_topic_msg_count,
            "recent_malformed": [_b64(p) for p in self.recent_malformed],
            "unix_stream_unclean_disconnect": [
                _b64(p) for p in self.unix_stream_unclean_disconnect
            ],
            "tcp_unclean_disconnect": [_b64(p) for p in self.tcp_unclean_disconnect],
            "unsupported_msg_version": [
                {"version": version, "count": count}
                for version, count in self.unsupported_msg_version
            ],
            "recent_bad_topic": list(self.recent_bad_topic),
            "recent_too_long_msg": [_b64(p) for p in self.recent_too_long_msg],
            "rate_limit_discard": [
                {"topic": topic, "count": count} for topic, count in self.rate_limit_discard
            ],
            "discard_topic": _topic_intervals_json(self.discard_topic),
            "possible_duplicate_topic": _topic_intervals_json(self.possible_duplicate_topic),
            "discards_by_reason": {
                str(reason): count for reason, count in self.discards_by_reason.items()
            },
            "kafka_error_discards": dict(self.kafka_error_discards),
        }

    def to_dory_plain_lines(self, format_time: Callable[[float], str]) -> list[str]:
        """This period as the indented lines of Dory's plain-text report (no newlines)."""
        lines = [
            f"    report ID: {self.id}",
            f"    start time: {self.start_time} {format_time(self.start_time)}",
            f"    malformed msg count: {self.malformed_msg_count}",
            "    UNIX stream unclean disconnect count: "
            f"{self.unix_stream_unclean_disconnect_count}",
            f"    TCP unclean disconnect count: {self.tcp_unclean_disconnect_count}",
            f"    unsupported API key msg count: {self.unsupported_api_key_msg_count}",
            f"    unsupported version msg count: {self.unsupported_version_msg_count}",
            f"    bad topic msg count: {self.bad_topic_msg_count}",
        ]
        # Each non-empty section is preceded by one blank line, as in Dory.
        sections: list[list[str]] = [
            [_plain_base64("recent malformed msg", p) for p in self.recent_malformed],
            [
                _plain_base64("recent UNIX stream unclean disconnect msg", p)
                for p in self.unix_stream_unclean_disconnect
            ],
            [
                _plain_base64("recent TCP unclean disconnect msg", p)
                for p in self.tcp_unclean_disconnect
            ],
            [
                f"    unsupported msg version: {version} count: {count}"
                for version, count in self.unsupported_msg_version
            ],
            [f"    recent bad topic: {_length_prefixed(topic)}" for topic in self.recent_bad_topic],
            [_plain_base64("recent too long msg", p) for p in self.recent_too_long_msg],
            [
                f"    rate limit discard topic: {_length_prefixed(topic)} count {count}"
                for topic, count in self.rate_limit_discard
            ],
            _plain_topic_intervals("discard topic", self.discard_topic),
            _plain_topic_intervals("possible duplicate topic", self.possible_duplicate_topic),
        ]
        for section in sections:
            if section:
                lines.append("")
                lines.extend(section)
        return lines


def _topic_intervals_json(
    items: Iterable[tuple[str, TopicInterval]],
) -> list[dict[str, Any]]:
    return [
        {
            "topic": topic,
            "min_timestamp": interval.min_timestamp,
            "max_timestamp": interval.max_timestamp,
            "count": interval.count,
        }
        for topic, interval in items
    ]


def _plain_base64(label: str, data: bytes) -> str:
    encoded = _b64(data)
    return f"    {label}: {len(encoded)}[{encoded}]"


def _plain_topic_intervals(label: str, items: Iterable[tuple[str, TopicInterval]]) -> list[str]:
    return [
        f"    {label}: {_length_prefixed(topic)} begin [{interval.min_timestamp}] "
        f"end [{interval.max_timestamp}] count {interval.count}"
        for topic, interval in items
    ]


@dataclass(frozen=True)
class DiscardReport:
    """The discard report: the current (unfinished) period and the latest finished one."""

    interval_s: int
    unfinished: PeriodReport
    latest_finished: PeriodReport | None

    def to_dory_json(self) -> dict[str, Any]:
        """The report body of Dory's ``/discards/json``.

        Keys ``unfinished_report`` and, once a period has finished, ``finished_report``
        (Dory 3.2.6's name, which Dory's monitoring scripts read). The status server adds
        ``pid``, ``version``, ``since``, ``now`` and ``interval`` (:attr:`interval_s`)
        before these keys, in that order.
        """
        body: dict[str, Any] = {"unfinished_report": self.unfinished.to_dory_json()}
        if self.latest_finished is not None:
            body["finished_report"] = self.latest_finished.to_dory_json()
        return body

    def to_dory_plain(self, format_time: Callable[[float], str] = time.ctime) -> str:
        """The period sections of Dory's ``/discards/plain``, newline-terminated.

        The status server writes the header (pid, version, since, now, report interval,
        blank line) before this. ``format_time`` renders epoch seconds like C's
        ``ctime()`` in local time; tests pass a UTC formatter.
        """
        lines = ["current (unfinished) reporting period:"]
        lines += self.unfinished.to_dory_plain_lines(format_time)
        if self.latest_finished is not None:
            lines += ["", "latest finished reporting period:"]
            lines += self.latest_finished.to_dory_plain_lines(format_time)
        return "\n".join(lines) + "\n"


# --- where each discard goes besides the books ---------------------------------------------


class DiscardEvent(NamedTuple):
    """One discard as :meth:`Books.discarded` recorded it, for a :class:`DiscardSink`.

    A named tuple: it is built on the hot path, and a tuple is the cheapest immutable
    record Python has.

    ``message`` holds the bytes the caller had: the value for topic discards that passed
    one (``too_long``, refusals at enqueue), the raw bytes received for ``malformed``,
    ``unsupported_*`` and ``unclean_disconnect``, else empty. ``key`` is empty unless the
    caller passed it. ``client_timestamp_ms`` is None when no timestamp could be read.
    """

    reason: DiscardReason
    topic: str | None
    client_timestamp_ms: int | None
    key: bytes
    message: bytes
    detail: str
    transport: Transport | None
    api_version: int | None


class DiscardSink(Protocol):
    """Receives every discard and possible duplicate as the books record it.

    Called on the books' thread (the event loop) in the middle of the hot path: an
    implementation must return at once (queue, never block on I/O) and never raise.
    """

    def discarded(self, event: DiscardEvent) -> None:
        """A message (or partial message) was discarded."""

    def possible_duplicate(self, topic: str, client_timestamp_ms: int) -> None:
        """A message of ``topic`` was sent again after a send whose outcome was unknown."""


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
    ) -> None:
        """Start the books with reporting period 0 beginning now.

        ``report_interval_s`` is Dory's ``discardReportInterval`` (0 disables rolling);
        ``bad_msg_prefix_size`` caps every stored message prefix (``badMsgPrefixSize``);
        ``recent_limit`` caps each recent-item list; ``counters`` lets the daemon share one
        counter registry (a new one is created otherwise); ``discard_sink``, if given, is
        handed every discard and possible duplicate (the discard log and ``logDiscards``).
        """
        if report_interval_s < 0:
            raise ValueError(f"report interval must be >= 0 seconds, got {report_interval_s}")
        if bad_msg_prefix_size < 0:
            raise ValueError(f"bad message prefix size must be >= 0, got {bad_msg_prefix_size}")
        if recent_limit < 1:
            raise ValueError(f"recent_limit must be >= 1, got {recent_limit}")
        self._interval_s = report_interval_s
        self._prefix_size = bad_msg_prefix_size
        self._wall_clock = wall_clock
        self._recent_limit = recent_limit
        self.counters = counters if counters is not None else Counters()
        self._topics: dict[str, _TopicLedger] = {}
        self._received: Counter[Transport] = Counter()
        self._lifetime_discards: Counter[DiscardReason] = Counter()
        self._current = _Period(0, int(wall_clock()), recent_limit)
        self._finished: _Period | None = None
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
        self.counters.inc(_RECEIVED_COUNTER[transport], n)

    def accepted(self, topic: str, n: int = 1) -> None:
        """``n`` messages of ``topic`` passed admission: the daemon now answers for them."""
        self._ledger(topic).accepted += n
        self.counters.inc("accepted", n)

    def delivered(self, topic: str, n: int = 1) -> None:
        """Kafka acknowledged ``n`` accepted messages of ``topic``."""
        ledger = self._topics.get(topic)
        if ledger is None or n > ledger.in_flight:
            self._require_in_flight(topic, n, "delivered")  # raises, naming the mistake
        else:
            ledger.delivered += n
        self.counters.inc("delivered", n)

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
        - ``unsupported_version``: ``api_version``, the version the client sent.
        - ``unsupported_api_key``: nothing (Dory reports only the count).

        The discard sink, if any, also gets ``prefix`` (pass the message value for any
        topic discard when you have it) and ``key``; the books themselves ignore ``key``.

        Post-acceptance reasons (:data:`AFTER_ACCEPTANCE`) require a message of ``topic``
        in flight and raise :class:`AccountingError` otherwise.
        """
        self.maybe_roll()
        if reason in _TOPIC_DISCARDS:
            if topic is None or client_timestamp_ms is None:
                raise ValueError(f"a {reason} discard needs the topic and the client timestamp")
            self._record_topic_discard(reason, topic, client_timestamp_ms, prefix, detail)
        else:
            self._record_input_discard(reason, topic, prefix, transport, api_version)
        self._lifetime_discards[reason] += 1
        self._current.discards_by_reason[reason] += 1
        self.counters.inc(_DISCARDED_COUNTER[reason])
        if self._discard_sink is not None:
            event = DiscardEvent(
                reason, topic, client_timestamp_ms, key, prefix, detail, transport, api_version
            )
            self._discard_sink.discarded(event)

    def possible_duplicate(self, topic: str, client_timestamp_ms: int) -> None:
        """A message of ``topic`` was sent again after a send whose outcome was unknown."""
        self.counters.inc("possible_duplicate")
        self.maybe_roll()
        _widen(self._current.duplicate_topics, topic, client_timestamp_ms)
        if self._discard_sink is not None:
            self._discard_sink.possible_duplicate(topic, client_timestamp_ms)

    # --- reading the books ---------------------------------------------------------------

    def per_topic(self) -> dict[str, TopicTotals]:
        """Lifetime totals of every topic seen (accepted, or discarded with a topic)."""
        return {topic: ledger.totals() for topic, ledger in self._topics.items()}

    def in_flight_by_topic(self) -> dict[str, int]:
        """Per topic, accepted messages not yet delivered or discarded."""
        return {topic: ledger.in_flight for topic, ledger in self._topics.items()}

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
        self.counters.inc("discard_report_unread")
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

    def _empty_period(self, periods_after_current: int) -> _Period:
        return _Period(
            self._current.report_id + periods_after_current,
            self._current.start_time + periods_after_current * self._interval_s,
            self._recent_limit,
        )

    def _ledger(self, topic: str) -> _TopicLedger:
        ledger = self._topics.get(topic)
        if ledger is None:
            ledger = self._topics[topic] = _TopicLedger()
        return ledger

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
        if ledger is None:
            ledger = self._topics[topic] = _TopicLedger()
        ledger.discard(reason)
        period = self._current
        _widen(period.discard_topics, topic, timestamp_ms)
        if reason is DiscardReason.TOO_LONG:
            period.recent_too_long.add(self._cut(topic.encode("utf-8") + b" " + prefix))
        elif reason is DiscardReason.RATE_LIMIT:
            period.rate_limit_discards[topic] += 1
        elif reason is DiscardReason.KAFKA_ERROR:
            error_name = detail or "unknown"
            period.kafka_errors[error_name] += 1
            self.counters.inc(f"discarded_kafka_error_{error_name}")

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
        else:
            raise AssertionError(f"discard reason {reason} has no place in the report")

    def _cut(self, data: bytes) -> bytes:
        return bytes(data[: self._prefix_size])


def _widen(intervals: dict[str, list[int]], topic: str, timestamp_ms: int) -> None:
    """Count one event of ``topic`` at ``timestamp_ms`` in a per-topic interval map."""
    known = intervals.get(topic)
    if known is None:
        intervals[topic] = [timestamp_ms, timestamp_ms, 1]
        return
    if timestamp_ms < known[0]:
        known[0] = timestamp_ms
    elif timestamp_ms > known[1]:
        known[1] = timestamp_ms
    known[2] += 1


def _frozen_intervals(intervals: dict[str, list[int]]) -> tuple[tuple[str, TopicInterval], ...]:
    """A period's per-topic intervals as the report shows them, sorted by topic."""
    return tuple(
        (topic, TopicInterval(low, high, count))
        for topic, (low, high, count) in sorted(intervals.items())
    )
