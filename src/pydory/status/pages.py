"""Dory's status pages and pydory's books, rendered from the daemon's view (no I/O).

Dory's URLs keep Dory's output field for field, so existing monitoring scripts keep
working (``spec/dory-compat.md`` section 3); :mod:`pydory.status.server` lists the URLs
and serves these pages. docs/status.md describes every page; docs/schemas/ holds a JSON
Schema for each JSON one.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from pydory import __version__
from pydory.daemon.books import counters as counter_names
from pydory.status.dashboard import dashboard_json
from pydory.status.discards import discard_report_json, discard_report_plain
from pydory.status.dory_counters import dory_counters

if TYPE_CHECKING:
    from pydory.daemon.books.discard_report import DiscardReport
    from pydory.daemon.delivery.kafka_stats import TopicQueues
    from pydory.status.view import DaemonView

__all__ = ["COUNTER_LOCATION", "NO_METADATA_YET", "StatusPages"]

#: A counter's source location, ``[file, line]`` in Dory: pydory's counters have none, so
#: they show what Dory shows for a counter without one (its blank location, line 1).
COUNTER_LOCATION = "[, 1]"

#: What the pages say before the first metadata fetch succeeded.
NO_METADATA_YET = "no metadata yet"


class StatusPages:
    """Renders every status page from the daemon's view; call on the daemon's loop."""

    def __init__(
        self,
        view: DaemonView,
        clock: Callable[[], float] = time.time,
        format_time: Callable[[float], str] = time.ctime,
    ) -> None:
        """``clock`` gives epoch seconds; ``format_time`` renders them like C's ctime()."""
        self._view = view
        self._clock = clock
        self._format_time = format_time

    # Dory's pages all start with the same four fields.

    def _header(self, now_s: float) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "version": __version__,
            "since": int(self._view.started_at),
            "now": int(now_s),
        }

    def _header_lines(self, now_s: float) -> list[str]:
        return [
            f"pid: {os.getpid()}",
            f"version: {__version__}",
            f"since: {self._stamp(self._view.started_at)}",
            f"now: {self._stamp(now_s)}",
        ]

    def _stamp(self, epoch_s: float) -> str:
        """Dory's ``1795246742 Sat Nov 21 07:39:02 2026``: seconds, then ctime()."""
        seconds = int(epoch_s)
        return f"{seconds} {self._format_time(seconds)}"

    def _stamp_ms(self, epoch_ms: int) -> str:
        return f"{epoch_ms} {self._format_time(epoch_ms // 1000)}"

    # /server_info

    def server_info_json(self) -> dict[str, Any]:
        """``/server_info/json``: pid, version, since, now."""
        return self._header(self._clock())

    def server_info_plain(self) -> str:
        """``/server_info/plain``."""
        return _text(self._header_lines(self._clock()))

    # /counters: Dory's counters first, then pydory's own, every one always and the same
    # names from the first request to the last (Dory's check answers UNKNOWN when a name
    # appears or goes). The open-ended family discarded_kafka_error_<name> is on
    # /books/json (discarded_by_kafka_error) and /metrics instead.

    def counters_json(self) -> dict[str, Any]:
        """``/counters/json``: the header, then every counter."""
        counters = [
            {"location": COUNTER_LOCATION, "name": name, "value": value}
            for name, value in self._all_counters().items()
        ]
        return {**self._header(self._clock()), "counters": counters}

    def counters_plain(self) -> str:
        """``/counters/plain``: the header, a blank line, then ``[file, line].name=value``."""
        lines = [*self._header_lines(self._clock()), ""]
        lines += [
            f"{COUNTER_LOCATION}.{name}={value}" for name, value in self._all_counters().items()
        ]
        return _text(lines)

    def _all_counters(self) -> dict[str, int]:
        """Dory's counters under Dory's names, then every one of pydory's, zeros included."""
        counters = self._view.counters
        return {
            **dory_counters(self._view),
            **{name: counters.get(name) for name in counter_names.EVERY_COUNTER},
        }

    # /discards

    def discards_json(self) -> dict[str, Any]:
        """``/discards/json``: the header, ``interval``, then the report periods."""
        report = self._discard_report()
        header = self._header(self._clock())
        return {**header, "interval": report.interval_s, **discard_report_json(report)}

    def discards_plain(self) -> str:
        """``/discards/plain``."""
        report = self._discard_report()
        lines = self._header_lines(self._clock())
        lines += [f"report interval in seconds: {report.interval_s}", ""]
        return _text(lines) + discard_report_plain(report, self._format_time)

    def _discard_report(self) -> DiscardReport:
        # discard_report() first closes a period that ended while nobody looked.
        return self._view.books.discard_report()

    # /queues: librdkafka's queues per topic, from its latest statistics.

    def queues_json(self) -> dict[str, Any]:
        """``/queues/json``: per topic batch / send_wait / ack_wait, then ``new``."""
        sending = [
            {
                "topic": topic,
                "batch": queues.batch,
                "send_wait": queues.send_wait,
                "ack_wait": queues.ack_wait,
            }
            for topic, queues in self._queued_topics()
        ]
        header = self._header(self._clock())
        return {**header, "sending": sending, "new": self._view.pending_topic_messages()}

    def queues_plain(self) -> str:
        """``/queues/plain``: one line per topic, then the totals per state."""
        lines = [*self._header_lines(self._clock()), ""]
        topics = self._queued_topics()
        lines += [
            f"batch: {q.batch:10d}  send_wait: {q.send_wait:10d}  "
            f"ack_wait: {q.ack_wait:10d}  topic: [{topic}]"
            for topic, q in topics
        ]
        if topics:
            lines.append("")
        new = self._view.pending_topic_messages()
        batch = sum(q.batch for _, q in topics)
        send_wait = sum(q.send_wait for _, q in topics)
        ack_wait = sum(q.ack_wait for _, q in topics)
        lines += [
            f"{new:10d} total new",
            f"{batch:10d} total batch",
            f"{send_wait:10d} total send_wait",
            f"{ack_wait:10d} total ack_wait",
            f"{new + batch + send_wait + ack_wait:10d} total "
            "(all states: new + batch + send_wait + ack_wait)",
        ]
        return _text(lines)

    def _queued_topics(self) -> list[tuple[str, TopicQueues]]:
        """librdkafka's queues by topic name, sorted as Dory's std::map iterates them; as
        Dory (TMsgStateTracker::GetStats), only topics with a message in some state."""
        return sorted(
            (topic, q)
            for topic, q in self._view.kafka_stats.latest().topics.items()
            if q.batch or q.send_wait or q.ack_wait
        )

    # /metadata_fetch_time: Dory reports "now" in milliseconds on this page only.

    def metadata_fetch_time_json(self) -> dict[str, Any]:
        """``/metadata_fetch_time/json``: times in ms since the epoch (0 = never)."""
        now_s = self._clock()
        updated, modified = self._metadata_times()
        return {
            **self._header(now_s),
            "now": int(now_s * 1000),
            "last_updated": updated,
            "last_modified": modified,
        }

    def metadata_fetch_time_plain(self) -> str:
        """``/metadata_fetch_time/plain``."""
        now_s = self._clock()
        updated, modified = self._metadata_times()
        lines = self._header_lines(now_s)[:3]
        lines += [
            f"now (milliseconds since epoch): {self._stamp_ms(int(now_s * 1000))}",
            f"metadata last updated at (milliseconds since epoch): {self._fetch_stamp(updated)}",
            f"metadata last modified at (milliseconds since epoch): {self._fetch_stamp(modified)}",
        ]
        return _text(lines)

    def _fetch_stamp(self, epoch_ms: int) -> str:
        """A metadata time; 0 (no fetch yet) says so rather than render 1970."""
        return f"0 ({NO_METADATA_YET})" if epoch_ms == 0 else self._stamp_ms(epoch_ms)

    def _metadata_times(self) -> tuple[int, int]:
        metadata = self._view.metadata
        return metadata.last_updated_ms or 0, metadata.last_modified_ms or 0

    # POST /metadata_update

    def metadata_update(self) -> str:
        """Ask the metadata service for a refresh now; the answer says when it was asked.

        The service spaces on-demand refreshes by minPauseDelay, so the refresh itself
        may follow a moment later.
        """
        self._view.request_metadata_refresh()
        return _text([f"Metadata update initiated at {self._stamp(self._clock())}"])

    # /books/json (pydory's own)

    def books_json(self) -> dict[str, Any]:
        """``/books/json``: lifetime accounting per topic and per transport, and the pool.

        Per topic, ``accepted == delivered + possibly_delivered + left_for_next_start +
        discarded_after_acceptance + in_flight``.
        """
        books, pool = self._view.books, self._view.pool
        topics = [
            {
                "topic": topic,
                "accepted": totals.accepted,
                "delivered": totals.delivered,
                "discarded": {str(r): n for r, n in totals.discarded_by_reason.items()},
                "discarded_after_acceptance": totals.discarded_after_acceptance,
                "in_flight": totals.in_flight,
                "possibly_delivered": totals.possibly_delivered,
                "left_for_next_start": totals.left_for_next_start,
            }
            for topic, totals in sorted(books.per_topic().items())
        ]
        return {
            **self._header(self._clock()),
            "topics": topics,
            "received": {str(t): n for t, n in books.received_by_transport().items()},
            # Lifetime kafka_error discards by librdkafka's error name: an open-ended set of
            # names, so here rather than on /counters (whose names never change).
            "discarded_by_kafka_error": counter_names.discarded_by_kafka_error(
                self._view.counters.snapshot()
            ),
            # Received, neither accepted nor discarded yet: waiting for the first metadata
            # (while metadata_known is false) or for a topic's creation.
            "metadata_known": self._view.metadata.last_updated_ms is not None,
            "waiting_for_metadata": self._view.pending_topic_messages(),
            # Topic names Kafka does not have with lines of their own, and the limit
            # (<maxUnknownTopics>) past which they are counted under (other).
            "unknown_topics": {
                "named": books.unknown_topics_named,
                "limit": books.unknown_topic_limit,
            },
            # How the datagram socket is read, and what it may hold that is not received
            # yet (a SIGKILL loses it unseen): the kernel's queue and a drain thread's ring.
            "datagram_input": self._datagram_input_json(),
            # The same for the UNIX stream connections: a drain thread's bytes.
            "stream_input": self._stream_input_json(),
            "pool": {
                "budget": pool.budget,
                "used": pool.used,
                "available": pool.available,
                "over_budget": pool.over_budget,
                "percent_time_depleted": pool.percent_time_depleted(),
                # Each client's share of it (partial frames and accepted messages).
                "shares": {
                    "clients": pool.shares.holders,
                    "share": pool.shares.share(),
                    "largest_held": pool.shares.largest_held(),
                },
            },
        }

    def _datagram_input_json(self) -> dict[str, Any] | None:
        datagram = None if self._view.datagram_input is None else self._view.datagram_input()
        if datagram is None:
            return None
        return {
            "reader": datagram.reader,
            "kernel_queue": datagram.kernel_queue_datagrams,
            "ring": datagram.ring_datagrams,
        }

    def _stream_input_json(self) -> dict[str, Any] | None:
        stream = None if self._view.stream_input is None else self._view.stream_input()
        if stream is None:
            return None
        return {
            "reader": stream.reader,
            "held_bytes": stream.held_bytes,
            "connection_held_bytes": stream.connection_held_bytes,
        }

    # /config/json (pydory's own)

    def config_json(self) -> dict[str, Any]:
        """``/config/json``: the config file, when it was loaded, and how the reloads went
        (``pydory reload`` reads it to report the outcome of the one it asked for)."""
        reloads = self._view.reloads
        history = reloads.as_json() if reloads is not None else {}
        return {**self._header(self._clock()), **history}

    # /dashboard/json (pydory's own)

    def dashboard_json(self) -> dict[str, Any]:
        """``/dashboard/json``: everything the live dashboard draws, in one document."""
        return dashboard_json(self._view, self._clock)


def _text(lines: Sequence[str]) -> str:
    """Dory's plain pages: every line newline-terminated."""
    return "".join(line + "\n" for line in lines)
