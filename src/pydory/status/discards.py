"""Dory's discard report (``/discards``), rendered from the books' report (no I/O).

The books keep the reporting periods (:class:`~pydory.daemon.books.accounting.DiscardReport`
and its :class:`~pydory.daemon.books.accounting.PeriodReport` s); this module spells them as
Dory 3.2.6 does, so Dory's monitoring scripts keep reading them: :func:`discard_report_json`
for ``/discards/json`` and :func:`discard_report_plain` for ``/discards/plain``.
:mod:`pydory.status.pages` writes the page header before either.

Rule: Dory's ``/discards`` output (its keys, their order, its plain-text lines) is spelled
here alone (:func:`discard_report_json`, :func:`discard_report_plain`).
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pydory.daemon.books.discard_report import DiscardReport, PeriodReport, TopicInterval

__all__ = [
    "discard_report_json",
    "discard_report_plain",
    "period_json",
    "period_plain_lines",
    "printable_name",
]


def discard_report_json(report: DiscardReport) -> dict[str, Any]:
    """The report body of Dory's ``/discards/json``.

    Keys ``unfinished_report`` and, once a period has finished, ``finished_report``
    (Dory 3.2.6's name, which Dory's monitoring scripts read). The status server adds
    ``pid``, ``version``, ``since``, ``now`` and ``interval`` (``report.interval_s``)
    before these keys, in that order.
    """
    body: dict[str, Any] = {"unfinished_report": period_json(report.unfinished)}
    if report.latest_finished is not None:
        body["finished_report"] = period_json(report.latest_finished)
    return body


def discard_report_plain(
    report: DiscardReport, format_time: Callable[[float], str] = time.ctime
) -> str:
    """The period sections of Dory's ``/discards/plain``, newline-terminated.

    The status server writes the header (pid, version, since, now, report interval,
    blank line) before this. ``format_time`` renders epoch seconds like C's
    ``ctime()`` in local time; tests pass a UTC formatter.
    """
    lines = ["current (unfinished) reporting period:"]
    lines += period_plain_lines(report.unfinished, format_time)
    if report.latest_finished is not None:
        lines += ["", "latest finished reporting period:"]
        lines += period_plain_lines(report.latest_finished, format_time)
    return "\n".join(lines) + "\n"


def period_json(period: PeriodReport) -> dict[str, Any]:
    """One period as Dory's JSON object, followed by pydory's extra keys."""
    return {
        "id": period.id,
        "start_time": period.start_time,
        "malformed_msg_count": period.malformed_msg_count,
        "unix_stream_unclean_disconnect_count": period.unix_stream_unclean_disconnect_count,
        "tcp_unclean_disconnect_count": period.tcp_unclean_disconnect_count,
        "unsupported_api_key_msg_count": period.unsupported_api_key_msg_count,
        "unsupported_version_msg_count": period.unsupported_version_msg_count,
        "bad_topic_msg_count": period.bad_topic_msg_count,
        "recent_malformed": [_b64(p) for p in period.recent_malformed],
        "unix_stream_unclean_disconnect": [_b64(p) for p in period.unix_stream_unclean_disconnect],
        "tcp_unclean_disconnect": [_b64(p) for p in period.tcp_unclean_disconnect],
        "unsupported_msg_version": [
            {"version": version, "count": count}
            for version, count in period.unsupported_msg_version
        ],
        "recent_bad_topic": list(period.recent_bad_topic),
        "recent_too_long_msg": [_b64(p) for p in period.recent_too_long_msg],
        "rate_limit_discard": [
            {"topic": topic, "count": count} for topic, count in period.rate_limit_discard
        ],
        "discard_topic": _topic_intervals_json(period.discard_topic),
        "possible_duplicate_topic": _topic_intervals_json(period.possible_duplicate_topic),
        "discards_by_reason": {
            str(reason): count for reason, count in period.discards_by_reason.items()
        },
        "kafka_error_discards": dict(period.kafka_error_discards),
        "possibly_delivered_topic": _topic_intervals_json(period.possibly_delivered_topic),
    }


def period_plain_lines(period: PeriodReport, format_time: Callable[[float], str]) -> list[str]:
    """One period as the indented lines of Dory's plain-text report (no newlines)."""
    lines = [
        f"    report ID: {period.id}",
        f"    start time: {period.start_time} {format_time(period.start_time)}",
        f"    malformed msg count: {period.malformed_msg_count}",
        f"    UNIX stream unclean disconnect count: {period.unix_stream_unclean_disconnect_count}",
        f"    TCP unclean disconnect count: {period.tcp_unclean_disconnect_count}",
        f"    unsupported API key msg count: {period.unsupported_api_key_msg_count}",
        f"    unsupported version msg count: {period.unsupported_version_msg_count}",
        f"    bad topic msg count: {period.bad_topic_msg_count}",
    ]
    # Each non-empty section is preceded by one blank line, as in Dory.
    sections: list[list[str]] = [
        [_plain_base64("recent malformed msg", p) for p in period.recent_malformed],
        [
            _plain_base64("recent UNIX stream unclean disconnect msg", p)
            for p in period.unix_stream_unclean_disconnect
        ],
        [
            _plain_base64("recent TCP unclean disconnect msg", p)
            for p in period.tcp_unclean_disconnect
        ],
        [
            f"    unsupported msg version: {version} count: {count}"
            for version, count in period.unsupported_msg_version
        ],
        [f"    recent bad topic: {_length_prefixed(topic)}" for topic in period.recent_bad_topic],
        [_plain_base64("recent too long msg", p) for p in period.recent_too_long_msg],
        [
            f"    rate limit discard topic: {_length_prefixed(topic)} count {count}"
            for topic, count in period.rate_limit_discard
        ],
        _plain_topic_intervals("discard topic", period.discard_topic),
        _plain_topic_intervals("possible duplicate topic", period.possible_duplicate_topic),
        # pydory's own section, after all of Dory's: not discarded, and not known delivered.
        _plain_topic_intervals("possibly delivered topic", period.possibly_delivered_topic),
    ]
    for section in sections:
        if section:
            lines.append("")
            lines.extend(section)
    return lines


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _length_prefixed(text: str) -> str:
    """Dory's plain-text framing of a name: its byte length, then the name in brackets.
    The name is the client's when it was rejected: escaped (:func:`printable_name`), so
    it cannot forge a line; the length is of what is printed."""
    printed = printable_name(text)
    return f"{len(printed.encode('utf-8', 'surrogateescape'))}[{printed}]"


def printable_name(name: str) -> str:
    """A name as a plain page prints it: a rejected (``bad_topic``) name is the client's
    bytes and can hold any character, so one with a character that is not printable (a
    newline, a carriage return, a Unicode line separator, ...) is escaped whole
    (``unicode_escape``: a newline becomes ``\\n``) and stays on its line. A name Kafka
    accepts is printable ASCII: it is printed as it is."""
    if name.isprintable():
        return name
    return name.encode("unicode_escape").decode("ascii")


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
