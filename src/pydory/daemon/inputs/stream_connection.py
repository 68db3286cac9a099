"""One stream connection (UNIX stream or TCP): its bytes framed by Size for the intake, its
reads paused and resumed.

A Size above maxStreamMsgSize closes that connection only; a stream ending mid-message is
an unclean disconnect. The daemon never writes to a client socket.

Quotas (``<quotas>``, pydory.daemon.inputs.quotas has the logic): a connection above
its listener's limit is refused (closed at once, counted), and a client above its rate
is slowed by pausing that connection's reads for the throttle time. A connection then
has two reasons not to be read, kept apart: the input's pause (backpressure, shutdown)
and its own throttle. Without a rate quota the read path pays one ``if``. A large read
also yields the loop's turn to the other inputs (``_yield_turn``).

Rule: a connection is read only when neither the input's pause nor its own throttle
holds.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Callable
from typing import cast

from pydory.daemon.books import counters as counter_names
from pydory.daemon.books.counters import Counters
from pydory.daemon.books.events import Transport
from pydory.daemon.inputs.intake_port import Intake
from pydory.daemon.inputs.quotas import ClientQuota, ListenerQuota
from pydory.daemon.inputs.sockets import dup_socket, peer_uid, read_buffered
from pydory.errors import ClientProtocolError
from pydory.wire import NEED_DATA, StreamFramer

log = logging.getLogger(__name__)

#: A stream read at least this large may have left more behind: the connection then
#: waits for the loop's next turn before it is read again (see ``_yield_turn``).
TURN_READ_BYTES = 64 * 1024


class FrameReader:
    """One connection's byte stream, framed into messages for the intake (no I/O)."""

    __slots__ = ("_framer", "_intake", "_kind", "broken", "frames_read")

    def __init__(self, kind: Transport, max_msg_size: int, intake: Intake) -> None:
        self._kind = kind
        self._intake = intake
        self._framer = StreamFramer(max_msg_size)
        self.broken = False
        self.frames_read = 0  # whole messages framed so far (the rate quota counts them)

    def feed(self, data: bytes) -> bool:
        """Hand the intake every whole message ``data`` completes; False once the stream
        cannot be framed any more (close the connection)."""
        if self.broken:
            return False
        framer = self._framer
        framer.feed(data)
        frames: list[bytes] = []
        keep = frames.append
        try:
            while (frame := framer.next_frame()) is not NEED_DATA:
                keep(frame)
        except ClientProtocolError as error:
            # An oversized or nonsensical Size: a buggy client.
            self.broken = True
            if frames:
                self._intake.frames(frames, self._kind)  # those before it, first
            self._intake.broken_stream(error, self._kind)
            return False
        if frames:
            # Handed over as one burst: the intake counts and books once per burst.
            self.frames_read += len(frames)
            self._intake.frames(frames, self._kind)
        return True

    def finish(self) -> None:
        """The connection ended: a message left incomplete is an unclean disconnect."""
        if not self.broken:
            remainder = self._framer.unclean_remainder()
            if remainder:
                self._intake.unclean_disconnect(remainder, self._kind)


class Connections:
    """The connections of one stream input, from the moment the loop accepts them."""

    def __init__(
        self,
        kind: Transport,
        quota: ListenerQuota,
        counters: Counters,
        clock: Callable[[], float],
    ) -> None:
        self.kind = kind
        #: The listener's quotas; the connections ask it and count what it decides.
        self.quota = quota
        self.counters = counters
        self.clock = clock
        self.refused_counter = counter_names.QUOTA_CONNECTIONS_REFUSED[kind]
        self.throttles_counter = counter_names.QUOTA_THROTTLES[kind]
        self.throttled_ms_counter = counter_names.QUOTA_THROTTLED_MS[kind]
        #: Connections whose ``connection_made`` has run: their sockets are known.
        self.ready: set[StreamInputProtocol] = set()
        #: Protocols the loop created for a connection it is accepting (uvloop calls the
        #: factory just before accept(2)) whose ``connection_made`` is still to come. Weak:
        #: if the accept fails, the loop drops the protocol and it leaves this set.
        self.accepting: weakref.WeakSet[StreamInputProtocol] = weakref.WeakSet()
        #: Set when the input closes: connections then drain and close by this deadline.
        self.drain_deadline: float | None = None
        #: While set, connections are not read (backpressure, or a shutdown on its way);
        #: one accepted meanwhile starts paused.
        self.paused = False
        #: Called when the last connection is gone (set on a listener a reload retired).
        self.on_idle: Callable[[], None] | None = None
        self._lost: asyncio.Event | None = None

    def made(self, connection: StreamInputProtocol) -> None:
        self.accepting.discard(connection)
        self.ready.add(connection)

    def lost(self, connection: StreamInputProtocol) -> None:
        self.ready.discard(connection)
        if self._lost is not None:
            self._lost.set()
        if self.on_idle is not None and not self.ready and not self.accepting:
            self.on_idle()

    async def wait_all_lost(self, deadline: float) -> bool:
        """Wait until every connection is gone; False if some remain at ``deadline``."""
        while self.ready or self.accepting:
            self._lost = asyncio.Event()
            try:
                async with asyncio.timeout(deadline - time.monotonic()):
                    await self._lost.wait()
            except TimeoutError:
                return False
            finally:
                self._lost = None
        return True


class StreamInputProtocol(asyncio.Protocol):
    """One stream connection: frames by Size, hands each frame to the intake."""

    def __init__(
        self,
        kind: Transport,
        max_msg_size: int,
        intake: Intake,
        connections: Connections,
    ) -> None:
        self._kind = kind
        self._intake = intake
        self._reader = FrameReader(kind, max_msg_size, intake)
        self._transport: asyncio.Transport | None = None
        self._connections = connections
        # For the commit point's marks (see pydory.daemon.inputs.marks.ConnectionMark).
        self.fd = -1  # the connection's socket, once connection_made has run
        self.bytes_read = 0
        self.lost = False
        # The rate quota: this client's (None: no rate quota, the read path skips it),
        # the frames it has been charged for, and the timer ending a throttle under way.
        self._client: ClientQuota | None = None
        self._frames_charged = 0
        self._throttle: asyncio.TimerHandle | None = None
        self._refused = False  # closed at once by the connection quota
        self._next_turn_handle: asyncio.Handle | None = None  # see _yield_turn
        connections.accepting.add(self)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self._transport = cast(asyncio.Transport, transport)
        self.fd = transport.get_extra_info("socket").fileno()
        connections = self._connections
        deadline = connections.drain_deadline
        if deadline is None and not connections.quota.admit(len(connections.ready)):
            self._refuse()
            return
        connections.made(self)
        self._intake.connection_opened(self._kind)
        if deadline is not None:  # accepted as the input was closing
            self.drain_and_close(deadline)
            return
        if connections.quota.rate_limited:
            self.attach_quota()
        if connections.paused:
            # uvloop starts reading after connection_made returns, whatever was asked in
            # it (CPython's loops did the same before 3.12, gh-103607); data_received
            # pauses again, so a connection accepted while paused is read once at most.
            self.pause()

    def _refuse(self) -> None:
        """Over the connection quota: close at once (unread), count it; the client sees
        its connection closed (its next send fails)."""
        self._refused = True
        connections = self._connections
        connections.accepting.discard(self)
        connections.counters.inc(connections.refused_counter)
        log.debug("%s input: connection refused by the connection quota", self._kind)
        assert self._transport is not None
        self._transport.abort()

    # -- the rate quota --------------------------------------------------------------------

    def client_key(self) -> object:
        """Who this client is for its rate quota: its uid on a UNIX socket (every
        connection of a uid shares one quota), else this connection."""
        if self._kind is Transport.UNIX_STREAM and self._transport is not None:
            uid = peer_uid(self._transport.get_extra_info("socket"))
            if uid is not None:
                return ("uid", uid)
        return self

    def attach_quota(self) -> None:
        """Take this client's rate quota from the listener's (again, after a change of
        settings: the measurement starts afresh); None if no rate is limited now."""
        quota = self._connections.quota
        if self._client is not None:
            quota.detach(self._client)
            self._client = None
        if self.lost or self._refused or self._transport is None:
            return
        self._client = quota.attach(self.client_key()) if quota.rate_limited else None
        self._frames_charged = self._reader.frames_read

    def _charge(self, nbytes: int) -> None:
        """Charge a read to this client's rate quota; over it, pause reading for the
        throttle time."""
        assert self._client is not None
        frames = self._reader.frames_read
        messages = frames - self._frames_charged
        self._frames_charged = frames
        connections = self._connections
        wait = self._client.on_read(connections.clock(), nbytes, messages)
        if wait <= 0.0 or self._transport is None or self._transport.is_closing():
            return
        if self._throttle is not None:  # cannot happen while paused; be safe
            self._throttle.cancel()
        self._transport.pause_reading()
        self._throttle = asyncio.get_running_loop().call_later(wait, self._throttle_over)
        connections.quota.throttled(wait)
        connections.counters.inc(connections.throttles_counter)
        connections.counters.inc(connections.throttled_ms_counter, round(wait * 1000))

    def _throttle_over(self) -> None:
        """The throttle time is up: read again, unless the input is paused meanwhile
        (backpressure or shutdown: their resume reads it, or the drain does)."""
        self._throttle = None
        if not self._connections.paused:
            self.resume()

    @property
    def throttled(self) -> bool:
        """Whether this connection is paused by its rate quota now."""
        return self._throttle is not None

    @property
    def reading(self) -> bool:
        """Whether the loop reads this connection now (paused by neither reason)."""
        transport = self._transport
        return transport is not None and not transport.is_closing() and transport.is_reading()

    def _end_throttle(self) -> None:
        if self._throttle is not None:
            self._throttle.cancel()
            self._throttle = None

    # -- reading -------------------------------------------------------------------------

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def pause(self) -> None:
        """Stop reading for now; :meth:`drain_and_close` reads what waits meanwhile."""
        if self._transport is not None and not self._transport.is_closing():
            self._transport.pause_reading()

    def resume(self) -> None:
        """Read again, unless the rate quota holds this connection (its timer resumes)."""
        if (
            self._throttle is None
            and self._transport is not None
            and not self._transport.is_closing()
        ):
            self._transport.resume_reading()

    def drain_and_close(self, deadline: float) -> None:
        """Shutdown: hand the intake what the kernel holds for this connection, then close.
        Throttled or not: the quotas only pace reading while the daemon runs."""
        self._end_throttle()
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        transport.pause_reading()
        if not self._reader.broken and self.fd >= 0:
            with dup_socket(self.fd) as sock:
                read_buffered(sock, self._reader.feed, deadline)
        transport.close()

    def data_received(self, data: bytes) -> None:
        self.bytes_read += len(data)
        if not self._reader.feed(data):
            # The stream can't be framed any more: close this connection only.
            assert self._transport is not None
            self._transport.close()
            return
        if self._client is not None:
            self._charge(len(data))
        if self._connections.paused:
            self.pause()  # a pause in connection_made does not hold under uvloop (above)
        elif len(data) >= TURN_READ_BYTES and self._throttle is None:
            self._yield_turn()

    def _yield_turn(self) -> None:
        """A large read: the client may have more waiting, and libuv would read this
        connection up to 32 times in a row (8 MiB) before the loop serves anything else,
        so one busy client delayed every other input and the status pages by a quarter of
        a second. Pause it until the loop's next turn instead: every input gets a read
        per turn. Costs two epoll_ctl calls per large read, and only under load."""
        assert self._transport is not None
        self._transport.pause_reading()
        self._next_turn_handle = asyncio.get_running_loop().call_soon(self._next_turn)

    def _next_turn(self) -> None:
        self._next_turn_handle = None
        if not self._connections.paused:  # else their resume (or the drain) reads it
            self.resume()

    def eof_received(self) -> bool | None:
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self._refused:
            return  # never made: neither opened nor read
        self._end_throttle()
        if self._client is not None:
            self._connections.quota.detach(self._client)
            self._client = None
        self._reader.finish()
        self._connections.lost(self)
        self._intake.connection_closed(self._kind, exc)
