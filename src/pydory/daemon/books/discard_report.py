"""Dory's discard report as data: reporting periods and their snapshots.

The discard report (Dory's ``/discards``) is kept in reporting periods of
``discardReportInterval`` seconds on the wall clock, exactly as Dory's ``TAnomalyTracker``
does (the books roll them: :class:`pydory.daemon.books.accounting.Books`). Recent-item
lists keep the newest first, move a repeated item to the front instead of duplicating it,
and hold at most ``recent_limit`` items. :mod:`pydory.status.discards` renders the
snapshots as Dory's pages.

Rule: what one reporting :class:`Period` holds, and how it is frozen into a
:class:`PeriodReport`, is decided here alone.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Generic, TypeVar

from pydory.daemon.books.events import STREAM_TRANSPORTS, DiscardReason, Transport

__all__ = ["DORY_RECENT_LIMIT", "DiscardReport", "Period", "PeriodReport", "TopicInterval", "widen"]

# Dory's TAnomalyTracker keeps at most 25 items in each "recent" list.
DORY_RECENT_LIMIT = 25


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


class Period:
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
            t: _RecentItems(recent_limit) for t in STREAM_TRANSPORTS
        }
        self.recent_bad_topics: _RecentItems[str] = _RecentItems(recent_limit)
        self.recent_too_long: _RecentItems[bytes] = _RecentItems(recent_limit)
        self.rate_limit_discards: Counter[str] = Counter()
        # topic -> [min timestamp, max timestamp, count]: updated in place on every
        # discard (a flood costs no object per message), frozen in snapshot().
        self.discard_topics: dict[str, list[int]] = {}
        self.duplicate_topics: dict[str, list[int]] = {}
        self.possibly_delivered_topics: dict[str, list[int]] = {}
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
            discard_topic=frozen_intervals(self.discard_topics),
            possible_duplicate_topic=frozen_intervals(self.duplicate_topics),
            possibly_delivered_topic=frozen_intervals(self.possibly_delivered_topics),
            discards_by_reason=MappingProxyType(
                {reason: self.discards_by_reason[reason] for reason in DiscardReason}
            ),
            kafka_error_discards=MappingProxyType(dict(sorted(self.kafka_errors.items()))),
        )


@dataclass(frozen=True)
class PeriodReport:
    """An immutable snapshot of one reporting period, in Dory's report vocabulary.

    Recent lists are newest first; per-topic and per-version lists are sorted by key, as
    Dory's ``std::map`` iterates them. ``recent_bad_topic`` holds topic names as text
    (callers decode raw bytes with ``errors="backslashreplace"``); the other recent lists
    hold raw byte prefixes, base64-encoded on output (:mod:`pydory.status.discards`
    renders it).
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
    #: Accepted messages whose last attempt left it unknown whether Kafka has them.
    possibly_delivered_topic: tuple[tuple[str, TopicInterval], ...] = ()


@dataclass(frozen=True)
class DiscardReport:
    """The discard report: the current (unfinished) period and the latest finished one.

    :mod:`pydory.status.discards` renders it as Dory's ``/discards``.
    """

    interval_s: int
    unfinished: PeriodReport
    latest_finished: PeriodReport | None


def widen(intervals: dict[str, list[int]], topic: str, timestamp_ms: int) -> None:
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


def frozen_intervals(intervals: dict[str, list[int]]) -> tuple[tuple[str, TopicInterval], ...]:
    """A period's per-topic intervals as the report shows them, sorted by topic."""
    return tuple(
        (topic, TopicInterval(low, high, count))
        for topic, (low, high, count) in sorted(intervals.items())
    )
