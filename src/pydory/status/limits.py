"""Bounds on the status port's connections, and quiet logging of malformed requests.

The status port shares the daemon's one event loop and its file descriptors with the
inputs, so a client that opens connections and never finishes a request (or never closes
one) must not be able to hold either for long:

* the **header timeout**: a connection whose first request head has not fully arrived
  HEADER_TIMEOUT_S after it opened is closed (a slow or stalled client, Slowloris);
* the **idle timeout**: aiohttp's own ``keepalive_timeout`` closes a connection that has
  sent no complete request for IDLE_TIMEOUT_S since it opened or since its last response
  (so a half-sent second request on a kept-alive connection is bounded by it too);
* the **connection cap**: above MAX_CONNECTIONS open status connections, a new one is
  answered ``503`` and closed at once, without reading it, and counted.

aiohttp has no knob for the first and the last, so :class:`GuardedSite` (a ``TCPSite``)
wraps each accepted connection's protocol in :class:`_GuardedConnection`, which watches
only the transport: it neither parses HTTP nor touches aiohttp's request handling.

aiohttp logs every malformed request with a traceback (``RequestHandler.handle_error``
through its ``logger``); :class:`QuietRequestErrors` is that logger, cut down to one line
per kind of error per REQUEST_ERROR_LOG_INTERVAL_S, with the count of those left out.

Rule: limits act on the transport alone (open, bytes seen, close: :class:`ConnectionGuard`);
everything HTTP stays aiohttp's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from pydory.daemon.books import counters as counter_names

__all__ = [
    "ConnectionGuard",
    "GuardedSite",
    "QuietRequestErrors",
    "StatusLimits",
]

#: Seconds a new connection has to deliver its whole first request head.
HEADER_TIMEOUT_S = 10.0
#: Seconds a connection may stay open without a complete request (aiohttp's
#: keepalive_timeout). Longer than Prometheus's usual 15 s scrape interval, so a scraper
#: keeps its connection between scrapes.
IDLE_TIMEOUT_S = 60.0
#: Open status connections at most; beyond, new ones get 503 and are closed at once.
#: A dashboard, a scraper and a Nagios check need a handful.
MAX_CONNECTIONS = 64
#: A kind of request error is logged at most once per this many seconds.
REQUEST_ERROR_LOG_INTERVAL_S = 60.0

#: What a connection beyond the cap reads before the close (written before its request:
#: HTTP/1.1 clients report it as the answer).
_REFUSAL = (
    b"HTTP/1.1 503 Service Unavailable\r\n"
    b"Content-Type: text/plain; charset=utf-8\r\n"
    b"Retry-After: 1\r\n"
    b"Connection: close\r\n"
    b"Content-Length: 40\r\n"
    b"\r\n"
    b"503 too many open status connections\r\n\r\n"
)

#: Characters of an error's text kept in its log line.
_MAX_ERROR_TEXT = 200

Count = Callable[[str], None]


@dataclass(frozen=True)
class StatusLimits:
    """The status port's connection limits (module defaults; tests shrink them)."""

    header_timeout_s: float = HEADER_TIMEOUT_S
    idle_timeout_s: float = IDLE_TIMEOUT_S
    max_connections: int = MAX_CONNECTIONS


class ConnectionGuard:
    """The open-connection count of all the sites of one status server (the cap counts
    them together), and its limits."""

    def __init__(self, limits: StatusLimits, count: Count) -> None:
        self.limits = limits
        self.count = count
        self.open = 0

    def protocol_factory(
        self, make_handler: Callable[[], asyncio.Protocol]
    ) -> Callable[[], asyncio.Protocol]:
        def guarded() -> asyncio.Protocol:
            if self.open >= self.limits.max_connections:
                return _Refused(self)
            return _GuardedConnection(make_handler(), self)

        return guarded


class _Refused(asyncio.Protocol):
    """A connection above the cap: one 503, then closed, its fd freed at once."""

    def __init__(self, guard: ConnectionGuard) -> None:
        self._guard = guard

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._guard.count(counter_names.STATUS_CONNECTIONS_REFUSED)
        # A fresh socket's send buffer takes these few bytes; close() then flushes them.
        # (A cast, not isinstance: uvloop's transports are not asyncio's classes.)
        stream = cast(asyncio.Transport, transport)
        stream.write(_REFUSAL)
        stream.close()


class _GuardedConnection(asyncio.Protocol):
    """aiohttp's protocol for one connection, counted and held to the header timeout."""

    def __init__(self, inner: asyncio.Protocol, guard: ConnectionGuard) -> None:
        self._inner = inner
        self._guard = guard
        self._transport: asyncio.BaseTransport | None = None
        self._header_deadline: asyncio.TimerHandle | None = None
        # The last bytes seen, so that a blank line split across two reads is found.
        self._tail = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._guard.open += 1
        self._transport = transport
        loop = asyncio.get_running_loop()
        self._header_deadline = loop.call_later(
            self._guard.limits.header_timeout_s, self._head_too_slow
        )
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self._header_deadline is not None:
            # The head ends at the first blank line; aiohttp takes "\r\n\r\n" and "\n\n".
            seen = self._tail + data
            if b"\n\r\n" in seen or b"\n\n" in seen:
                self._header_deadline.cancel()
                self._header_deadline = None
            self._tail = seen[-2:]
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self._guard.open -= 1
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None
        self._inner.connection_lost(exc)

    def _head_too_slow(self) -> None:
        self._header_deadline = None
        self._guard.count(counter_names.STATUS_HEADER_TIMEOUTS)
        if self._transport is not None:
            # abort: there is nothing to flush, and the fd is freed now.
            cast(asyncio.Transport, self._transport).abort()


class GuardedSite(web.TCPSite):
    """``web.TCPSite`` whose connections go through a shared :class:`ConnectionGuard`."""

    def __init__(self, runner: web.AppRunner, host: str, port: int, guard: ConnectionGuard) -> None:
        super().__init__(runner, host, port)
        self._guard = guard

    async def start(self) -> None:
        # TCPSite.start, with aiohttp's protocol factory wrapped by the guard.
        await web.BaseSite.start(self)
        server = self._runner.server
        assert server is not None
        self._server = await asyncio.get_running_loop().create_server(
            self._guard.protocol_factory(server), self._host, self._port, backlog=self._backlog
        )
        sockets = self._server.sockets
        self._bound_port = sockets[0].getsockname()[1] if sockets else self._port


class QuietRequestErrors(logging.LoggerAdapter[logging.Logger]):
    """The logger aiohttp's request handler gets (``handler_args={"logger": ...}``).

    Of the records that carry an exception, it logs one line per kind (the exception's
    class) per interval: the first at once, and at the interval's end, if more of that
    kind came meanwhile, one line with their count (which opens the next interval). A
    malformed request (aiohttp's HttpProcessingError) loses its traceback: it says nothing
    about pydory. Any other error keeps it on its first line, since it may be a bug in a
    page. Call it on the event loop, as aiohttp does: the interval ends are loop timers.
    """

    def __init__(self, interval_s: float = REQUEST_ERROR_LOG_INTERVAL_S) -> None:
        super().__init__(logging.getLogger("pydory.status.requests"))
        self._interval_s = interval_s
        #: Kinds within an interval -> records of that kind left out so far in it.
        self._left_out: dict[str, int] = {}

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info")
        if not isinstance(exc, BaseException):
            self.logger.log(level, msg, *args, **kwargs)
            return
        kind = type(exc).__name__
        if kind in self._left_out:
            self._left_out[kind] += 1
            return
        self._open_interval(kind, level)
        # One line, bounded: aiohttp's messages span lines and quote the request.
        said = " ".join(str(exc).split())[:_MAX_ERROR_TEXT]
        line = f"{str(msg) % args if args else msg}: {kind}: {said}"
        line += f"; at most one line per {self._interval_s:g} s for more of this kind"
        if isinstance(exc, HttpProcessingError):
            kwargs["exc_info"] = None
        self.logger.log(level, "%s", line, **kwargs)

    def _open_interval(self, kind: str, level: int) -> None:
        self._left_out[kind] = 0
        loop = asyncio.get_running_loop()
        loop.call_later(self._interval_s, self._close_interval, kind, level)

    def _close_interval(self, kind: str, level: int) -> None:
        left_out = self._left_out.pop(kind)
        if left_out:
            self.logger.log(
                level,
                "%d more %s from status clients in the last %g s",
                left_out,
                kind,
                self._interval_s,
            )
            self._open_interval(kind, level)
