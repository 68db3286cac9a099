"""`pydory status [VIEW] [--json] [--url URL | --config-path FILE]`: a running daemon, read.

Reads the daemon's JSON status pages over HTTP and prints them for a person: aligned
tables, times in local time, ages. ``--json`` prints the daemon's own JSON instead
(pretty). Views and the pages they read:

=========  ======================================================================
(none)     a summary: server_info, books, counters, queues, metadata_fetch_time
counters   /counters/json: every counter
discards   /discards/json: the current and the latest finished reporting period
queues     /queues/json: librdkafka's queues per topic (Dory's /queues)
metadata   /metadata_fetch_time/json: when metadata was last fetched and changed
books      /books/json: per-topic accounting, messages received, the memory pool
config     /config/json: the config file, when it was loaded, its reloads
=========  ======================================================================

Exit status: 0; 1 for a bad config file or an answer that is not a status page;
2 when the daemon cannot be reached (one line on stderr).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pydory.commands import Subparsers, add_command
from pydory.commands.daemon_url import (
    add_daemon_location,
    add_timeout_option,
    config_failure,
    locate_daemon,
)
from pydory.daemon.books import counters as counter_names
from pydory.daemon.books.events import AFTER_ACCEPTANCE, DiscardReason
from pydory.errors import ConfigError
from pydory.status_client import (
    DaemonUnreachable,
    NotAStatusPage,
    PageNotFound,
    StatusHttp,
    StatusUrlError,
)
from pydory.wording import counted

DEFAULT_TIMEOUT_S = 5.0
EXIT_UNREACHABLE = 2

Page = dict[str, Any]

#: Each view: the pages it reads (name -> path). A summary page may be absent (404).
PAGES = {
    "server_info": "/server_info/json",
    "books": "/books/json",
    "counters": "/counters/json",
    "discards": "/discards/json",
    "queues": "/queues/json",
    "metadata": "/metadata_fetch_time/json",
    "config": "/config/json",
}
SUMMARY_PAGES = ("server_info", "books", "counters", "queues", "metadata", "config")
#: Summary pages an older pydory, or Dory, may lack (404): their section is left out.
OPTIONAL_SUMMARY_PAGES = ("queues", "config")
VIEWS = ("counters", "discards", "queues", "metadata", "books", "config")


# --- the command line ----------------------------------------------------------------------


def register(subparsers: Subparsers) -> None:
    """Add the `status` subcommand."""
    parser = add_command(
        subparsers,
        "status",
        "Read a running pydory (or Dory) daemon's status pages and print them as tables. "
        "Without VIEW, print a summary.",
        run,
    )
    parser.add_argument(
        "view", nargs="?", choices=VIEWS, metavar="VIEW", help=f"one of {', '.join(VIEWS)}"
    )
    parser.add_argument(
        "--json", action="store_true", help="print the daemon's JSON (pretty) instead"
    )
    add_daemon_location(parser)
    add_timeout_option(parser, DEFAULT_TIMEOUT_S, "for each answer")


def run(args: argparse.Namespace) -> int:
    """Handler of `pydory status`."""
    try:
        location = locate_daemon(args.url, args.config_path)
    except (ConfigError, OSError) as error:
        print(config_failure(error, args.config_path), file=sys.stderr)
        return 1
    except StatusUrlError as error:
        print(f"pydory status: {error}", file=sys.stderr)
        return 1
    base_url = location.url
    client = StatusClient(base_url, args.timeout)
    try:
        if args.view is None:
            pages = client.get_pages(SUMMARY_PAGES, optional=OPTIONAL_SUMMARY_PAGES)
            print(json.dumps(pages, indent=4) if args.json else render_summary(pages, base_url))
        else:
            page = client.get(PAGES[args.view])
            print(json.dumps(page, indent=4) if args.json else RENDERERS[args.view](page))
    except DaemonUnreachable as error:
        print(f"pydory status: {location.unreachable(error)}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except NotAStatusPage as error:
        print(f"pydory status: {error}", file=sys.stderr)
        return 1
    except KeyError as error:  # another version's page: say so rather than a traceback
        print(
            f"pydory status: the daemon's page lacks the field {error}; --json shows it as is",
            file=sys.stderr,
        )
        return 1
    return 0


# --- fetching ------------------------------------------------------------------------------


class StatusClient:
    """GETs JSON status pages from one daemon (through ``pydory.status_client``)."""

    def __init__(self, base_url: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        """``base_url`` like ``http://127.0.0.1:9090``; each request waits ``timeout_s``."""
        self._http = StatusHttp(base_url, timeout_s)
        self.base_url = self._http.base_url

    def get(self, path: str) -> Page:
        """The JSON page at ``path``; raises DaemonUnreachable or NotAStatusPage."""
        return self._http.get_page(path)

    def get_optional(self, path: str) -> Page | None:
        """Like :meth:`get`, but None when the daemon has no such page (404)."""
        try:
            return self._http.get_page(path)
        except PageNotFound:
            return None

    def get_pages(self, names: Sequence[str], optional: Sequence[str] = ()) -> dict[str, Any]:
        """Pages by name (see :data:`PAGES`); an ``optional`` page is None if absent."""
        pages: dict[str, Any] = {}
        for name in names:
            path = PAGES[name]
            pages[name] = self.get_optional(path) if name in optional else self.get(path)
        return pages


# --- formatting helpers --------------------------------------------------------------------


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], indent: str = "") -> str:
    """Rows under headers, columns aligned: numbers to the right, text to the left."""
    cells = [[_cell(value) for value in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    numeric = [
        bool(rows) and all(isinstance(row[i], int | float) for row in rows)
        for i in range(len(headers))
    ]

    def line(values: Sequence[str]) -> str:
        padded = [
            v.rjust(w) if is_number else v.ljust(w)
            for v, w, is_number in zip(values, widths, numeric, strict=True)
        ]
        return (indent + "  ".join(padded)).rstrip()

    return "\n".join([line(headers), *(line(row) for row in cells)])


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.1f}"
    return str(value)


def local_time(epoch_s: float) -> str:
    """``2026-11-21 07:37:57`` in local time."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch_s))


def duration(seconds: float) -> str:
    """``45 s``, ``3m 05s``, ``2h 03m``, ``4d 07h``: two units at most."""
    whole = max(0, int(seconds))
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours:02d}h"
    if hours:
        return f"{hours}h {minutes:02d}m"
    if minutes:
        return f"{minutes}m {secs:02d}s"
    return f"{secs} s"


def byte_size(n: float) -> str:
    """``812 B``, ``1.5 KiB``, ``64.0 MiB``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _ms_time(epoch_ms: int, now_ms: int) -> str:
    """A metadata time: ``never``, or when and how long ago."""
    if epoch_ms <= 0:
        return "never"
    return f"{local_time(epoch_ms / 1000)} ({duration((now_ms - epoch_ms) / 1000)} ago)"


# --- the views -----------------------------------------------------------------------------


def render_summary(pages: Mapping[str, Any], base_url: str) -> str:
    """The default view: who, topics, pool, discards by reason, queues, metadata."""
    info = pages["server_info"]
    sections = [
        f"pydory {info['version']} at {base_url}: pid {info['pid']}, "
        f"up {duration(info['now'] - info['since'])} (since {local_time(info['since'])})",
        _topics_table(pages["books"]),
        _received_and_pool(pages["books"]),
        _discards_by_reason(pages["counters"], pages["books"]),
        _queues_section(pages["queues"]),
        render_metadata(pages["metadata"]),
    ]
    if pages.get("config") is not None:
        sections.append(render_config(pages["config"]))
    return "\n\n".join(sections)


def _topics_table(books: Page) -> str:
    topics = books["topics"]
    if not topics:
        return "TOPICS: none yet"
    counts = {
        t["topic"]: [t["accepted"], t["delivered"], sum(t["discarded"].values()), t["in_flight"]]
        for t in topics
    }
    rows: list[list[object]] = [[topic, *numbers] for topic, numbers in counts.items()]
    if len(rows) > 1:
        totals = [sum(column) for column in zip(*counts.values(), strict=True)]
        rows.append(["(all topics)", *totals])
    return table(["TOPIC", "ACCEPTED", "DELIVERED", "DISCARDED", "IN FLIGHT"], rows)


def _received_and_pool(books: Page) -> str:
    received = ", ".join(f"{transport} {n}" for transport, n in books["received"].items())
    pool = books["pool"]
    budget = pool["budget"]
    percent_used = 100.0 * pool["used"] / budget if budget else 0.0
    text = (
        f"received: {received}\n"
        f"memory pool: {byte_size(pool['used'])} of {byte_size(budget)} used "
        f"({percent_used:.1f} %), depleted {pool['percent_time_depleted']:.1f} % of the time"
    )
    # .get: a daemon older than these fields still gets its summary.
    if not books.get("metadata_known", True):
        waiting = books.get("waiting_for_metadata", 0)
        held = counted(waiting, "message")
        text += f"\nno metadata yet: {held} held in memory until a broker answers"
    return text


def discards_by_reason(counters_page: Page, books_page: Page | None = None) -> dict[str, int]:
    """Lifetime discards per reason (``discarded_<reason>`` counters), and per Kafka error
    name as ``kafka_error: NAME`` (``/books/json``'s ``discarded_by_kafka_error``), non-zero
    only."""
    values = {c["name"]: c["value"] for c in counters_page["counters"]}
    result: dict[str, int] = {}
    for reason in DiscardReason:
        count = values.get(f"discarded_{reason}", 0)
        if count:
            result[str(reason)] = count
    # On /books/json since /counters lists a fixed set of names; a daemon older than that
    # listed them among the counters.
    by_error = None if books_page is None else books_page.get("discarded_by_kafka_error")
    if by_error is None:
        by_error = counter_names.discarded_by_kafka_error(values)
    for error_name, count in by_error.items():
        if count:
            result[f"{DiscardReason.KAFKA_ERROR}: {error_name}"] = count
    return result


def _discards_by_reason(counters_page: Page, books_page: Page) -> str:
    by_reason = discards_by_reason(counters_page, books_page)
    if not by_reason:
        return "DISCARDS since start: none"
    rows = [[("  " + r) if ":" in r else r, n] for r, n in by_reason.items()]
    return "DISCARDS since start\n" + table(["REASON", "COUNT"], rows)


def _queues_section(queues: Page | None) -> str:
    if queues is None:
        return "QUEUES: not available (this daemon serves no /queues/json)"
    return render_queues(queues)


def render_counters(page: Page) -> str:
    """``pydory status counters``: every counter, by name."""
    rows = sorted([c["name"], c["value"]] for c in page["counters"])
    if not rows:
        return "no counters yet"
    return table(["COUNTER", "VALUE"], rows)


def render_queues(page: Page) -> str:
    """``pydory status queues``: messages in librdkafka per topic and state, and totals."""
    sending = page["sending"]
    rows: list[list[object]] = [
        [q["topic"], q["batch"], q["send_wait"], q["ack_wait"]] for q in sending
    ]
    totals = [sum(int(q[key]) for q in sending) for key in ("batch", "send_wait", "ack_wait")]
    if len(rows) > 1:
        rows.append(["(all topics)", *totals])
    lines = [
        "QUEUES (librdkafka's, from its latest statistics)",
        table(["TOPIC", "BATCH", "SEND WAIT", "ACK WAIT"], rows),
        f"new (waiting for metadata or topic creation): {page['new']}",
        f"total: {page['new'] + sum(totals)}",
    ]
    return "\n".join(lines)


def render_metadata(page: Page) -> str:
    """``pydory status metadata``: when metadata was fetched and when it last changed."""
    now_ms = page["now"]
    if page["last_updated"] <= 0:
        # No broker has answered since start-up: the daemon holds what it reads meanwhile.
        return "metadata: no metadata yet (no broker has answered; messages wait in memory)"
    return (
        f"metadata last fetched: {_ms_time(page['last_updated'], now_ms)}\n"
        f"metadata last changed: {_ms_time(page['last_modified'], now_ms)}"
    )


def render_config(page: Page) -> str:
    """``pydory status config``: the config file, when it was loaded, how reloads went."""
    now = page["now"]
    reloads = page["reloads"]
    lines = [
        f"config: {page['path'] or '(given in memory)'}, loaded {local_time(page['loaded_at'])} "
        f"({duration(now - page['loaded_at'])} ago)",
        f"reloads: {reloads['succeeded']} applied, {reloads['failed']} refused",
    ]
    last = page["last_reload"]
    if last is not None:
        when = f"{local_time(last['at'])} ({duration(now - last['at'])} ago)"
        if last["ok"]:
            changed = ", ".join(last["changed"]) or "nothing"
            lines.append(f"last reload: applied at {when}: {changed}")
        else:
            lines.append(f"last reload: REFUSED at {when}; running on the config loaded before:")
            lines += [f"  {error}" for error in last["errors"]]
        lines += [
            f"  <{element}> changed in the file: takes effect at the next restart"
            for element in last["restart_needed"]
        ]
    return "\n".join(lines)


def render_books(page: Page) -> str:
    """``pydory status books``: per-topic accounting with discards by reason."""
    topics = page["topics"]
    reasons = sorted({reason for t in topics for reason in t["discarded"]})
    headers = ["TOPIC", "ACCEPTED", "DELIVERED", "IN FLIGHT", *(r.upper() for r in reasons)]
    rows = [
        [
            t["topic"],
            t["accepted"],
            t["delivered"],
            t["in_flight"],
            *(t["discarded"].get(r, 0) for r in reasons),
        ]
        for t in topics
    ]
    after = sorted(str(r) for r in AFTER_ACCEPTANCE)
    lines = [
        table(headers, rows) if rows else "no topics yet",
        f"per topic: accepted = delivered + in flight + discarded after acceptance "
        f"({', '.join(after)})",
        "",
        _received_and_pool(page),
    ]
    return "\n".join(lines)


def render_discards(page: Page) -> str:
    """``pydory status discards``: the reporting periods of Dory's discard report."""
    lines = [f"discard report: periods of {page['interval']} s (Dory's /discards)", ""]
    lines += _period_lines("CURRENT PERIOD", page["unfinished_report"], page["now"])
    finished = page.get("finished_report")
    if finished is not None:
        lines += ["", *_period_lines("LATEST FINISHED PERIOD", finished, None)]
    return "\n".join(lines)


def _period_lines(title: str, period: Page, now_s: int | None) -> list[str]:
    start = period["start_time"]
    so_far = f", {duration(now_s - start)} so far" if now_s is not None else ""
    lines = [f"{title} (report {period['id']}, from {local_time(start)}{so_far})"]
    by_reason = {r: n for r, n in period.get("discards_by_reason", {}).items() if n}
    if by_reason:
        lines.append(table(["REASON", "COUNT"], sorted(by_reason.items()), indent="  "))
    else:
        lines.append("  no discards")
    counts = [
        ("malformed", period["malformed_msg_count"]),
        ("unsupported API key", period["unsupported_api_key_msg_count"]),
        ("unsupported version", period["unsupported_version_msg_count"]),
        ("bad topic", period["bad_topic_msg_count"]),
        ("UNIX stream unclean disconnects", period["unix_stream_unclean_disconnect_count"]),
        ("TCP unclean disconnects", period["tcp_unclean_disconnect_count"]),
    ]
    nonzero = [f"{name} {count}" for name, count in counts if count]
    if nonzero:
        lines.append("  input problems: " + ", ".join(nonzero))
    lines += _topic_intervals("discarded", period["discard_topic"])
    lines += _topic_intervals("possible duplicates", period["possible_duplicate_topic"])
    if period["rate_limit_discard"]:
        rows = [[r["topic"], r["count"]] for r in period["rate_limit_discard"]]
        lines += ["  rate limit discards:", table(["TOPIC", "COUNT"], rows, indent="    ")]
    lines += _recent("recent bad topics", period["recent_bad_topic"], repr)
    lines += _recent("recent malformed (base64)", period["recent_malformed"], str)
    lines += _recent("recent too long (base64)", period["recent_too_long_msg"], str)
    return lines


def _topic_intervals(what: str, items: Sequence[Page]) -> list[str]:
    if not items:
        return []
    rows = [
        [
            i["topic"],
            i["count"],
            local_time(i["min_timestamp"] / 1000),
            local_time(i["max_timestamp"] / 1000),
        ]
        for i in items
    ]
    headers = ["TOPIC", "COUNT", "EARLIEST (client time)", "LATEST (client time)"]
    return [f"  {what}, per topic:", table(headers, rows, indent="    ")]


def _recent(title: str, items: Sequence[str], show: Callable[[str], str]) -> list[str]:
    if not items:
        return []
    return [f"  {title}, newest first:", *(f"    {show(item)}" for item in items)]


RENDERERS: dict[str, Callable[[Page], str]] = {
    "counters": render_counters,
    "discards": render_discards,
    "queues": render_queues,
    "metadata": render_metadata,
    "books": render_books,
    "config": render_config,
}
