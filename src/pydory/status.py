"""The HTTP status interface: Dory's status pages (plain text and JSON) and pydory's books.

Dory's URLs keep Dory's output field for field, so existing monitoring scripts keep
working (``spec/dory-compat.md`` section 3)::

    GET  /server_info/{plain,json}          pid, version, start time
    GET  /counters/{plain,json}             every event counter
    GET  /discards/{plain,json}             the discard report (current and latest period)
    GET  /queues/{plain,json}               messages per topic in librdkafka's queues
    GET  /metadata_fetch_time/{plain,json}  metadata last updated / last modified (ms)
    POST /metadata_update                   ask for a metadata refresh now

and pydory's own::

    GET  /books/json                        per-topic accounting and the memory pool
    GET  /commit_point/{plain,json}         the commit point (``pydory.commit_point``)
    GET  /metrics                           Prometheus text (``pydory.metrics``)
    GET  /                                  the live dashboard (``pydory.dashboard``)
    GET  /dashboard/json                    the dashboard's data, one document per refresh

Any other URL answers 404 with the list of known URLs (Dory answers its index page).
docs/status.md describes every page; docs/schemas/ holds a JSON Schema for each JSON one.

:class:`StatusPages` renders the pages (no I/O); :class:`StatusServer` serves them with
aiohttp on the daemon's own event loop. Handlers therefore run on the thread that owns
the books, so every page is a consistent snapshot without locks, and every request takes
loop time from ingestion: a rendered page is reused for PAGE_REUSE_S, and requests are
paced (:class:`RequestPacer`), so a client polling in a tight loop cannot slow the daemon.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from pydory import __version__
from pydory.accounting import DiscardReport
from pydory.commit_point import commit_point_routes
from pydory.dashboard import ASSETS, Asset, dashboard_json, load_asset
from pydory.errors import ConfigError
from pydory.metrics import build_registry

if TYPE_CHECKING:
    from pydory.kafka_stats import TopicQueues
    from pydory.server import Server

__all__ = [
    "PORT_CONFIG_PATH",
    "RequestPacer",
    "StatusPages",
    "StatusServer",
    "listen_hosts",
    "paced",
    "reused_briefly",
]

log = logging.getLogger(__name__)

#: The config element named when the status port cannot be bound.
PORT_CONFIG_PATH = "/doryConfig/httpInterface/port"
#: How long closing waits for requests in progress before dropping them.
CLOSE_TIMEOUT_S = 2.0

# Binding these means "the port is taken or forbidden": the operator must fix the config.
# Any other failure on the optional IPv6 address means this host has no IPv6 there.
_PORT_CONFLICTS = frozenset({errno.EADDRINUSE, errno.EACCES})

#: A rendered page is served again to requests arriving within this many seconds.
PAGE_REUSE_S = 0.1
#: Status requests begin at most this often per second, after a burst of STATUS_BURST:
#: the pages share the event loop with ingestion, and a client polling in a tight loop
#: must not take more than a sliver of it. (A dashboard asks once a second, Prometheus
#: every 15 s, so honest clients never wait.)
STATUS_REQUESTS_PER_S = 50.0
STATUS_BURST = 20
#: Requests held back by the pacing at once; more are refused with 503 at once, so a
#: flood of connections cannot pile up waiting requests without bound.
MAX_WAITING_REQUESTS = 64

JSON_TYPE = "application/json"
PLAIN_TYPE = "text/plain; charset=utf-8"

JsonPage = Callable[[], dict[str, Any]]
PlainPage = Callable[[], str]


def listen_hosts(loopback_only: bool) -> tuple[str, str]:
    """The IPv4 address to bind (required), then the IPv6 one (used if the host has it)."""
    return ("127.0.0.1", "::1") if loopback_only else ("0.0.0.0", "::")


# --- rendering -----------------------------------------------------------------------------


class StatusPages:
    """Renders every status page from the live ``Server``; call on the server's loop."""

    def __init__(
        self,
        server: Server,
        clock: Callable[[], float] = time.time,
        format_time: Callable[[float], str] = time.ctime,
    ) -> None:
        """``clock`` gives epoch seconds; ``format_time`` renders them like C's ctime()."""
        self._server = server
        self._clock = clock
        self._format_time = format_time

    # Dory's pages all start with the same four fields.

    def _header(self, now_s: float) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "version": __version__,
            "since": int(self._server.started_at),
            "now": int(now_s),
        }

    def _header_lines(self, now_s: float) -> list[str]:
        return [
            f"pid: {os.getpid()}",
            f"version: {__version__}",
            f"since: {self._stamp(self._server.started_at)}",
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

    # /counters: pydory's counters have no source location, so it is empty.

    def counters_json(self) -> dict[str, Any]:
        """``/counters/json``: the header, then every counter in order of first use."""
        counters = [
            {"location": "", "name": name, "value": value}
            for name, value in self._server.counters.snapshot().items()
        ]
        return {**self._header(self._clock()), "counters": counters}

    def counters_plain(self) -> str:
        """``/counters/plain``: the header, a blank line, then ``location.name=value``."""
        lines = [*self._header_lines(self._clock()), ""]
        lines += [f".{name}={value}" for name, value in self._server.counters.snapshot().items()]
        return _text(lines)

    # /discards

    def discards_json(self) -> dict[str, Any]:
        """``/discards/json``: the header, ``interval``, then the report periods."""
        report = self._discard_report()
        header = self._header(self._clock())
        return {**header, "interval": report.interval_s, **report.to_dory_json()}

    def discards_plain(self) -> str:
        """``/discards/plain``."""
        report = self._discard_report()
        lines = self._header_lines(self._clock())
        lines += [f"report interval in seconds: {report.interval_s}", ""]
        return _text(lines) + report.to_dory_plain(self._format_time)

    def _discard_report(self) -> DiscardReport:
        books = self._server.books
        books.maybe_roll()  # a period that ended while nobody looked is reported as finished
        return books.discard_report()

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
        return {**header, "sending": sending, "new": self._server.intake.pending_topic_messages}

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
        new = self._server.intake.pending_topic_messages
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
        """librdkafka's queues by topic name, sorted as Dory's std::map iterates them."""
        return sorted(self._server.kafka_stats.latest().topics.items())

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
            f"metadata last updated at (milliseconds since epoch): {self._stamp_ms(updated)}",
            f"metadata last modified at (milliseconds since epoch): {self._stamp_ms(modified)}",
        ]
        return _text(lines)

    def _metadata_times(self) -> tuple[int, int]:
        metadata = self._server.metadata
        return metadata.last_updated_ms or 0, metadata.last_modified_ms or 0

    # POST /metadata_update

    def metadata_update(self) -> str:
        """Ask the metadata service for a refresh now; the answer says when it was asked.

        The service spaces on-demand refreshes by minPauseDelay, so the refresh itself
        may follow a moment later.
        """
        self._server.metadata.request_refresh()
        self._server.counters.inc("metadata_update_requested")
        return _text([f"Metadata update initiated at {self._stamp(self._clock())}"])

    # /books/json (pydory's own)

    def books_json(self) -> dict[str, Any]:
        """``/books/json``: lifetime accounting per topic and per transport, and the pool.

        Per topic, ``accepted == delivered + discarded_after_acceptance + in_flight``.
        """
        books, pool = self._server.books, self._server.pool
        topics = [
            {
                "topic": topic,
                "accepted": totals.accepted,
                "delivered": totals.delivered,
                "discarded": {str(r): n for r, n in totals.discarded_by_reason.items()},
                "discarded_after_acceptance": totals.discarded_after_acceptance,
                "in_flight": totals.in_flight,
            }
            for topic, totals in sorted(books.per_topic().items())
        ]
        return {
            **self._header(self._clock()),
            "topics": topics,
            "received": {str(t): n for t, n in books.received_by_transport().items()},
            "pool": {
                "budget": pool.budget,
                "used": pool.used,
                "available": pool.available,
                "percent_time_depleted": pool.percent_time_depleted(),
            },
        }

    # /dashboard/json (pydory's own)

    def dashboard_json(self) -> dict[str, Any]:
        """``/dashboard/json``: everything the live dashboard draws, in one document."""
        return dashboard_json(self._server, self._clock)


def _text(lines: Sequence[str]) -> str:
    """Dory's plain pages: every line newline-terminated."""
    return "".join(line + "\n" for line in lines)


# --- serving -------------------------------------------------------------------------------


Render = Callable[[], bytes]


def _json_bytes(page: JsonPage) -> Render:
    return lambda: (json.dumps(page(), indent=4) + "\n").encode("utf-8")


def _plain_bytes(page: PlainPage) -> Render:
    return lambda: page().encode("utf-8")


def reused_briefly(render: Render, clock: Callable[[], float] = time.monotonic) -> Render:
    """``render``, but a result younger than PAGE_REUSE_S is served again instead.

    Monitoring reads a page at most every second or so; a client asking faster gets the
    same bytes, so that rendering costs the event loop (shared with ingestion) at most
    1 / PAGE_REUSE_S renders per page per second.
    """
    rendered_at = -float("inf")
    body = b""

    def reuse_or_render() -> bytes:
        nonlocal rendered_at, body
        now = clock()
        if now - rendered_at >= PAGE_REUSE_S:
            body, rendered_at = render(), now
        return body

    return reuse_or_render


def _page_handler(render: Render, content_type: str) -> Handler:
    async def handle(request: web.Request) -> web.StreamResponse:
        return web.Response(body=render(), headers={"Content-Type": content_type})

    return handle


def _json_handler(page: JsonPage) -> Handler:
    return _page_handler(reused_briefly(_json_bytes(page)), JSON_TYPE)


def _plain_handler(page: PlainPage) -> Handler:
    return _page_handler(reused_briefly(_plain_bytes(page)), PLAIN_TYPE)


def _action_handler(action: PlainPage) -> Handler:
    """A POST: runs ``action`` on every request, never reused."""
    return _page_handler(_plain_bytes(action), PLAIN_TYPE)


def _asset_handler(asset: Asset) -> Handler:
    async def handle(request: web.Request) -> web.StreamResponse:
        return web.Response(body=asset.body, content_type=asset.content_type, charset="utf-8")

    return handle


class RequestPacer:
    """Spaces requests to ``rate_per_s`` after an initial ``burst`` (a leaky bucket, GCRA).

    :meth:`reserve` books the next slot and says how long the caller must wait for it;
    no I/O here, the middleware sleeps.
    """

    def __init__(
        self, rate_per_s: float, burst: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        """``burst`` requests may start at once; after that, one every ``1 / rate_per_s``."""
        if rate_per_s <= 0 or burst < 1:
            raise ValueError(f"need a positive rate and burst, got {rate_per_s}, {burst}")
        self._interval = 1.0 / rate_per_s
        self._tolerance = (burst - 1) * self._interval
        self._clock = clock
        self._next_slot = -float("inf")

    def reserve(self) -> float:
        """Take the next slot; returns the seconds to wait before it (0.0: go now)."""
        now = self._clock()
        slot = max(self._next_slot, now)
        self._next_slot = slot + self._interval
        return max(0.0, slot - now - self._tolerance)


def paced(pacer: RequestPacer, max_waiting: int) -> Middleware:
    """Middleware: requests start no faster than ``pacer`` allows; beyond ``max_waiting``
    held-back requests, answer 503 at once (retry in a second)."""
    waiting = 0

    @web.middleware
    async def pace(request: web.Request, handler: Handler) -> web.StreamResponse:
        nonlocal waiting
        if waiting >= max_waiting:
            return web.Response(
                status=503,
                text="503 too many status requests at once; retry in a second\n",
                content_type="text/plain",
                charset="utf-8",
                headers={"Retry-After": "1"},
            )
        delay = pacer.reserve()
        if delay > 0:
            waiting += 1
            try:
                await asyncio.sleep(delay)
            finally:
                waiting -= 1
        return await handler(request)

    return pace


def _not_found_lists(routes: Sequence[web.RouteDef]) -> Middleware:
    """Middleware: a 404 names the known URLs instead of aiohttp's bare "Not Found"."""
    known = "".join(f"    {route.method} {route.path}\n" for route in routes)

    @web.middleware
    async def not_found_lists_urls(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except web.HTTPNotFound:
            text = f"404 not found: {request.path}\nknown URLs:\n{known}"
            return web.Response(status=404, text=text, content_type="text/plain", charset="utf-8")

    return not_found_lists_urls


class StatusServer:
    """Serves :class:`StatusPages` on the httpInterface port, in the server's event loop."""

    def __init__(self, server: Server) -> None:
        """Prepare to serve ``server``'s pages; nothing listens until :meth:`start`."""
        self._server = server
        self._pages = StatusPages(server)
        registry = build_registry(server)
        self._metrics = _page_handler(
            reused_briefly(lambda: generate_latest(registry)), CONTENT_TYPE_LATEST
        )
        self._assets = {path: load_asset(*source) for path, source in ASSETS.items()}
        self._runner: web.AppRunner | None = None
        self._port: int | None = None

    @property
    def port(self) -> int:
        """The bound port (the kernel's choice when the config says 0)."""
        if self._port is None:
            raise RuntimeError("the status server is not listening")
        return self._port

    @property
    def addresses(self) -> list[tuple[str, int]]:
        """``(host, port)`` of every listening socket; empty when not listening."""
        if self._runner is None:
            return []
        return [(address[0], address[1]) for address in self._runner.addresses]

    async def start(self) -> None:
        """Listen on ``config.http``'s port; raises ConfigError if it cannot be bound."""
        http = self._server.config.http
        routes = self._routes()
        pacer = RequestPacer(STATUS_REQUESTS_PER_S, STATUS_BURST)
        app = web.Application(
            middlewares=[_not_found_lists(routes), paced(pacer, MAX_WAITING_REQUESTS)]
        )
        app.add_routes(routes)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=CLOSE_TIMEOUT_S)
        await runner.setup()
        self._runner = runner
        try:
            self._port = await self._listen(runner, listen_hosts(http.loopback_only), http.port)
        except BaseException:
            await self.close()
            raise
        log.info("status pages at %s", ", ".join(f"{h} port {p}" for h, p in self.addresses))

    async def close(self) -> None:
        """Stop listening and finish (briefly) the requests in progress. Idempotent."""
        runner, self._runner = self._runner, None
        self._port = None
        if runner is not None:
            await runner.cleanup()

    def _routes(self) -> list[web.RouteDef]:
        pages = self._pages
        return [
            web.get("/server_info/plain", _plain_handler(pages.server_info_plain)),
            web.get("/server_info/json", _json_handler(pages.server_info_json)),
            web.get("/counters/plain", _plain_handler(pages.counters_plain)),
            web.get("/counters/json", _json_handler(pages.counters_json)),
            web.get("/discards/plain", _plain_handler(pages.discards_plain)),
            web.get("/discards/json", _json_handler(pages.discards_json)),
            web.get("/queues/plain", _plain_handler(pages.queues_plain)),
            web.get("/queues/json", _json_handler(pages.queues_json)),
            web.get("/metadata_fetch_time/plain", _plain_handler(pages.metadata_fetch_time_plain)),
            web.get("/metadata_fetch_time/json", _json_handler(pages.metadata_fetch_time_json)),
            web.post("/metadata_update", _action_handler(pages.metadata_update)),
            web.get("/books/json", _json_handler(pages.books_json)),
            *commit_point_routes(self._server),
            web.get("/metrics", self._metrics),
            web.get("/dashboard/json", _json_handler(pages.dashboard_json)),
            *(web.get(path, _asset_handler(asset)) for path, asset in self._assets.items()),
        ]

    @staticmethod
    async def _listen(runner: web.AppRunner, hosts: tuple[str, str], port: int) -> int:
        """One site per address, all on the IPv4 site's port; returns that port."""
        ipv4, ipv6 = hosts
        try:
            bound_port = await _start_site(runner, ipv4, port)
        except OSError as exc:
            raise _unbindable(ipv4, port, exc) from exc
        try:
            await _start_site(runner, ipv6, bound_port)
        except OSError as exc:
            if exc.errno in _PORT_CONFLICTS:
                raise _unbindable(ipv6, bound_port, exc) from exc
            log.info("status pages not on %s (%s); IPv4 only", ipv6, exc)
        return bound_port


async def _start_site(runner: web.AppRunner, host: str, port: int) -> int:
    """Listen on ``host:port`` and return the bound port; a failed site is unregistered."""
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError:
        await site.stop()
        raise
    return site.port


def _unbindable(host: str, port: int, exc: OSError) -> ConfigError:
    # asyncio's bind errors repeat the address; the plain errno text reads better.
    reason = os.strerror(exc.errno) if exc.errno else str(exc)
    return ConfigError(
        f"cannot serve the status pages on {host} port {port}: {reason} "
        "(is another pydory or Dory running? choose a free httpInterface port)",
        path=PORT_CONFIG_PATH,
    )
