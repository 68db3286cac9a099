"""The HTTP status interface: serves the pages on the daemon's own event loop.

Dory's URLs keep Dory's output field for field (``spec/dory-compat.md`` section 3)::

    GET  /server_info/{plain,json}          pid, version, start time
    GET  /counters/{plain,json}             every event counter
    GET  /discards/{plain,json}             the discard report (current and latest period)
    GET  /queues/{plain,json}               messages per topic in librdkafka's queues
    GET  /metadata_fetch_time/{plain,json}  metadata last updated / last modified (ms)
    POST /metadata_update                   ask for a metadata refresh now
    GET  /msg_debug/...                     message debugging (``pydory.status.msg_debug``)

and pydory's own::

    GET  /books/json                        per-topic accounting and the memory pool
    GET  /commit_point/{plain,json}         the commit point (``pydory.status.commit_point``)
    GET  /metrics                           Prometheus text (``pydory.status.metrics``)
    GET  /                                  the live dashboard (``pydory.status.dashboard``)
    GET  /dashboard/json                    the dashboard's data, one document per refresh
    GET  /health, /ready                    liveness and readiness (``pydory.status.health``)

Any other URL answers 404 with the list of known URLs (Dory answers its index page).

:class:`~pydory.status.pages.StatusPages` renders the pages; :class:`StatusServer` serves
them with aiohttp on the daemon's event loop. Handlers therefore run on the thread that
owns the books, so every page is a consistent snapshot without locks, and every request
takes loop time from ingestion: a rendered page is reused for PAGE_REUSE_S, and requests
are paced (:class:`RequestPacer`), so a client polling in a tight loop cannot slow the
daemon. Connections are bounded by ``pydory.status.limits`` (header and idle timeouts, a
cap on open connections), and malformed requests are logged one line per kind per minute.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from prometheus_client import CONTENT_TYPE_LATEST

from pydory.errors import ConfigError
from pydory.status.commit_point import commit_point_routes
from pydory.status.dashboard import ASSETS, Asset, load_asset
from pydory.status.health import health_routes
from pydory.status.limits import ConnectionGuard, GuardedSite, QuietRequestErrors, StatusLimits
from pydory.status.metrics import build_registry
from pydory.status.msg_debug import msg_debug_routes
from pydory.status.pages import StatusPages
from pydory.status.rendering import ReusedPage, json_in_slices, metrics_in_slices
from pydory.status.view import DaemonView

__all__ = [
    "PORT_CONFIG_PATH",
    "RequestPacer",
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
#: The status port's connection limits (``pydory.status.limits``): module defaults.
DEFAULT_LIMITS = StatusLimits()

JSON_TYPE = "application/json"
PLAIN_TYPE = "text/plain; charset=utf-8"

JsonPage = Callable[[], dict[str, Any]]
PlainPage = Callable[[], str]


def listen_hosts(loopback_only: bool) -> tuple[str, str]:
    """The IPv4 address to bind (required), then the IPv6 one (used if the host has it)."""
    return ("127.0.0.1", "::1") if loopback_only else ("0.0.0.0", "::")


# --- serving -------------------------------------------------------------------------------


Render = Callable[[], bytes]


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


def _sliced_handler(page: ReusedPage, content_type: str) -> Handler:
    async def handle(request: web.Request) -> web.StreamResponse:
        return web.Response(body=await page(), headers={"Content-Type": content_type})

    return handle


def _json_handler(page: JsonPage) -> Handler:
    # The document is built at once (a consistent snapshot), its encoding in slices
    # (pydory.status.rendering): a page of many topics never holds the loop for long.
    return _sliced_handler(ReusedPage(lambda: json_in_slices(page()), PAGE_REUSE_S), JSON_TYPE)


def _dory_page(name: str, plain: PlainPage, json: JsonPage) -> list[web.RouteDef]:
    """Dory's page ``name``, as Dory serves each of its pages: ``/name/plain`` (text) and
    ``/name/json``."""
    return [
        web.get(f"/{name}/plain", _plain_handler(plain)),
        web.get(f"/{name}/json", _json_handler(json)),
    ]


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

    def __init__(
        self,
        view: DaemonView,
        count: Callable[[str], None] = lambda name: None,
        limits: StatusLimits | None = None,
    ) -> None:
        """Prepare to serve the pages of ``view``; nothing listens until :meth:`start`.

        ``count`` increments an event counter (the status port's refusals and timeouts);
        ``limits`` defaults to DEFAULT_LIMITS as it is when the server is made.
        """
        self._view = view
        self._guard = ConnectionGuard(limits or DEFAULT_LIMITS, count)
        self._pages = StatusPages(view)
        registry = build_registry(view)
        self._metrics = _sliced_handler(
            ReusedPage(lambda: metrics_in_slices(registry), PAGE_REUSE_S), CONTENT_TYPE_LATEST
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
        http = self._view.http
        routes = self._routes()
        pacer = RequestPacer(STATUS_REQUESTS_PER_S, STATUS_BURST)
        app = web.Application(
            middlewares=[_not_found_lists(routes), paced(pacer, MAX_WAITING_REQUESTS)]
        )
        app.add_routes(routes)
        runner = web.AppRunner(
            app,
            access_log=None,
            shutdown_timeout=CLOSE_TIMEOUT_S,
            # aiohttp's own idle timeout; the header timeout and the cap are the guard's.
            keepalive_timeout=self._guard.limits.idle_timeout_s,
            logger=QuietRequestErrors(),
        )
        await runner.setup()
        self._runner = runner
        try:
            self._port = await self._listen(
                runner, self._guard, listen_hosts(http.loopback_only), http.port
            )
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
            *_dory_page("server_info", pages.server_info_plain, pages.server_info_json),
            *_dory_page("counters", pages.counters_plain, pages.counters_json),
            *_dory_page("discards", pages.discards_plain, pages.discards_json),
            *_dory_page("queues", pages.queues_plain, pages.queues_json),
            *_dory_page(
                "metadata_fetch_time",
                pages.metadata_fetch_time_plain,
                pages.metadata_fetch_time_json,
            ),
            web.post("/metadata_update", _action_handler(pages.metadata_update)),
            web.get("/books/json", _json_handler(pages.books_json)),
            web.get("/config/json", _json_handler(pages.config_json)),
            *commit_point_routes(self._view),
            *health_routes(self._view),
            *msg_debug_routes(self._view),
            web.get("/metrics", self._metrics),
            web.get("/dashboard/json", _json_handler(pages.dashboard_json)),
            *(web.get(path, _asset_handler(asset)) for path, asset in self._assets.items()),
        ]

    @staticmethod
    async def _listen(
        runner: web.AppRunner, guard: ConnectionGuard, hosts: tuple[str, str], port: int
    ) -> int:
        """One site per address, all on the IPv4 site's port; returns that port."""
        ipv4, ipv6 = hosts
        try:
            bound_port = await _start_site(runner, guard, ipv4, port)
        except OSError as exc:
            raise _unbindable(ipv4, port, exc) from exc
        try:
            await _start_site(runner, guard, ipv6, bound_port)
        except OSError as exc:
            if exc.errno in _PORT_CONFLICTS:
                raise _unbindable(ipv6, bound_port, exc) from exc
            log.info("status pages not on %s (%s); IPv4 only", ipv6, exc)
        return bound_port


async def _start_site(runner: web.AppRunner, guard: ConnectionGuard, host: str, port: int) -> int:
    """Listen on ``host:port`` and return the bound port; a failed site is unregistered."""
    site = GuardedSite(runner, host, port, guard)
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
