"""Bounds on the status port's connections, and quiet logging of malformed requests.

The status port shares the daemon's one event loop and its file descriptors with the
inputs, so a client that opens connections and never finishes a request (or never closes
one) must not be able to hold either for long:

* the **header timeout**: a connection whose first request head has not fully arrived
  HEADER_TIMEOUT_S after it opened is closed (a slow or stalled client, Slowloris);
* the **idle timeout**: aiohttp's own ``keepalive_timeout`` closes a connection that has
  sent no complete request for IDLE_TIMEOUT_S since it opened or since its last response
  (so a half-sent second request on a kept-alive connection is bounded by it too);
* the **connection cap**: MAX_CONNECTIONS open status connections, shared between the
  clients (:class:`SlotShares`): a client is a peer (on loopback, the uid owning its socket,
  found as the inputs find it, ``daemon/inputs/peers.py``; else its address). When the
  slots are full, a new connection is answered ``503`` and closed at once, without reading
  it, and counted, unless its peer holds fewer than the peer holding the most less one:
  then that greedy peer's oldest connection is reset (counted as refused too) and the
  new one served. So one client holding every slot cannot starve another: it is the one
  refused.

aiohttp has no knob for the first and the last, so :class:`GuardedSite` (a ``TCPSite``)
wraps each accepted connection's protocol in :class:`_GuardedConnection`, which watches
only the transport: it neither parses HTTP nor touches aiohttp's request handling.

aiohttp logs every malformed request with a traceback (``RequestHandler.handle_error``
through its ``logger``); :class:`QuietRequestErrors` is that logger, cut down to one line
per kind of error per REQUEST_ERROR_LOG_INTERVAL_S, with the count of those left out.

Rule: limits act on the transport alone (open, its peer, bytes seen, close:
:class:`ConnectionGuard`, the slots shared by :class:`SlotShares`); everything HTTP stays
aiohttp's.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, cast

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from pydory.daemon.books import counters as counter_names
from pydory.daemon.inputs.peers import loopback_tcp_owner

__all__ = [
    "ConnectionGuard",
    "GuardedSite",
    "QuietRequestErrors",
    "SlotShares",
    "StatusLimits",
    "status_peer",
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
#: Who holds a status connection (its transport -> a peer), for the shares of the slots.
PeerOf = Callable[[asyncio.BaseTransport], Hashable]


def status_peer(transport: asyncio.BaseTransport) -> Hashable:
    """The client of a status connection: on loopback, the uid owning the client's
    socket (as the inputs' quotas know a client, ``daemon/inputs/peers.py``); elsewhere,
    or when the kernel does not say, the client's address."""
    peer = transport.get_extra_info("peername")
    host = peer[0] if peer else None
    try:
        loopback = host is not None and ipaddress.ip_address(host).is_loopback
    except ValueError:  # e.g. a scoped IPv6 address
        loopback = False
    if loopback:
        sock = transport.get_extra_info("socket")
        uid = loopback_tcp_owner(sock) if sock is not None else None
        if uid is not None:
            return ("uid", uid)
    return ("address", host)


@dataclass(frozen=True)
class StatusLimits:
    """The status port's connection limits (module defaults; tests shrink them, and may
    tell peers apart by another rule)."""

    header_timeout_s: float = HEADER_TIMEOUT_S
    idle_timeout_s: float = IDLE_TIMEOUT_S
    max_connections: int = MAX_CONNECTIONS
    peer_of: PeerOf = status_peer


class SlotShares:
    """The connection slots, shared between peers (pure logic).

    A claim is granted while a slot is free. When none is, it is granted only if the peer
    holding the most holds more than one more than the claimant: that peer gives one up
    (:meth:`claim` names it; the caller closes one of its connections). So slots go to
    the peers holding the fewest, and a peer holding every slot is the one refused."""

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self.open = 0
        self._held: dict[Hashable, int] = {}

    def held(self, peer: Hashable) -> int:
        return self._held.get(peer, 0)

    def claim(self, peer: Hashable) -> tuple[bool, Hashable | None]:
        """``(granted, the peer that gives a slot up for it, or None)``."""
        if self.open < self.slots:
            self._take(peer)
            return True, None
        greedy = max(self._held, key=self._held.__getitem__, default=None)
        if greedy is None or self._held[greedy] <= self.held(peer) + 1:
            return False, None
        self.release(greedy)
        self._take(peer)
        return True, greedy

    def release(self, peer: Hashable) -> None:
        self.open -= 1
        left = self._held[peer] - 1
        if left:
            self._held[peer] = left
        else:
            del self._held[peer]

    def _take(self, peer: Hashable) -> None:
        self.open += 1
        self._held[peer] = self._held.get(peer, 0) + 1


class ConnectionGuard:
    """The open connections of all the sites of one status server (the cap counts them
    together), by peer, and its limits."""

    def __init__(self, limits: StatusLimits, count: Count) -> None:
        self.limits = limits
        self.count = count
        self.shares = SlotShares(limits.max_connections)
        # Each peer's open connections, oldest first (the one a greedy peer gives up).
        self._connections: dict[Hashable, dict[_GuardedConnection, None]] = {}

    @property
    def open(self) -> int:
        return self.shares.open

    def protocol_factory(
        self, make_handler: Callable[[], asyncio.Protocol]
    ) -> Callable[[], asyncio.Protocol]:
        def guarded() -> asyncio.Protocol:
            return _GuardedConnection(make_handler(), self)

        return guarded

    def admit(self, connection: _GuardedConnection, peer: Hashable) -> bool:
        """Whether ``peer``'s new ``connection`` gets a slot (a greedy peer's oldest
        connection reset for it, when the slots are full); a refusal is counted."""
        granted, giver = self.shares.claim(peer)
        if not granted:
            self.count(counter_names.STATUS_CONNECTIONS_REFUSED)
            return False
        if giver is not None:
            given = self._connections[giver]
            oldest = next(iter(given))
            self._forget(oldest, giver)
            self.count(counter_names.STATUS_CONNECTIONS_REFUSED)
            oldest.reset()
        self._connections.setdefault(peer, {})[connection] = None
        return True

    def lost(self, connection: _GuardedConnection, peer: Hashable) -> None:
        """``connection`` closed: its slot is free (unless it was given up already)."""
        held = self._connections.get(peer)
        if held is not None and connection in held:
            self._forget(connection, peer)
            self.shares.release(peer)

    def _forget(self, connection: _GuardedConnection, peer: Hashable) -> None:
        held = self._connections[peer]
        del held[connection]
        if not held:
            del self._connections[peer]


class _GuardedConnection(asyncio.Protocol):
    """aiohttp's protocol for one connection, given a slot (or refused: one 503, then
    closed, its fd freed at once), counted and held to the header timeout."""

    def __init__(self, inner: asyncio.Protocol, guard: ConnectionGuard) -> None:
        self._inner = inner
        self._guard = guard
        self._transport: asyncio.BaseTransport | None = None
        self._peer: Hashable = None
        self._refused = False
        self._header_deadline: asyncio.TimerHandle | None = None
        # The last bytes seen, so that a blank line split across two reads is found.
        self._tail = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport
        self._peer = self._guard.limits.peer_of(transport)
        if not self._guard.admit(self, self._peer):
            self._refused = True
            # A fresh socket's send buffer takes these few bytes; close() then flushes
            # them. (A cast, not isinstance: uvloop's transports are not asyncio's.)
            stream = cast(asyncio.Transport, transport)
            stream.write(_REFUSAL)
            stream.close()
            return
        loop = asyncio.get_running_loop()
        self._header_deadline = loop.call_later(
            self._guard.limits.header_timeout_s, self._head_too_slow
        )
        self._inner.connection_made(transport)

    def reset(self) -> None:
        """Given up for a peer holding fewer slots: reset now (its fd freed at once)."""
        if self._transport is not None:
            cast(asyncio.Transport, self._transport).abort()

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if self._header_deadline is not None:
            # The head ends at the first blank line; aiohttp takes "\r\n\r\n" and "\n\n".
            seen = self._tail + data
            if b"\n\r\n" in seen or b"\n\n" in seen:
                self._header_deadline.cancel()
                self._header_deadline = None
            self._tail = seen[-2:]
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        if self._refused:
            return None
        return self._inner.eof_received()

    def pause_writing(self) -> None:
        if not self._refused:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if not self._refused:
            self._inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._refused:
            return
        self._guard.lost(self, self._peer)
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
