"""One stream connection (UNIX stream or TCP): its bytes framed by Size for the intake, its
reads paused and resumed.

A Size above maxStreamMsgSize closes that connection only; a stream ending mid-message is
an unclean disconnect. The daemon never writes to a client socket.

Quotas (``<quotas>``, pydory.daemon.inputs.quotas has the logic): a connection above
its listener's limit is refused (closed at once, counted), and a client above its rate
is slowed by pausing that connection's reads for the throttle time. Without a rate quota
the read path pays one ``if``.

Reads are bounded: a connection reads into its input's ``READ_BYTES`` buffer (an
``asyncio.BufferedProtocol``), and one whose read filled it waits for its turn
(pydory.daemon.inputs.turns), so a flooding client cannot hold the loop.

Partial frames count against the memory pool (``maxBuffer``) and against their client's
fair share of it (pydory.daemon.books.shares: a client is its uid, as for the quotas):
every byte a connection holds for a frame still arriving is charged as it comes
(``partial_frame_cost``), and released when the frame is whole, just before the intake
charges the message, or when the connection ends. When its client is at its share, or the
pool has no room for a partial frame beyond ``PARTIAL_FRAME_FREE_BYTES`` (16 KiB), the
connection stops being read (its client's bytes wait in the kernel, and its writes block,
as under the backpressure policy) until there is room; if none comes within
``PARTIAL_FRAME_WAIT_S``, or if its partial frame alone holds the largest share a client
can have (it could never be completed), the connection is closed, counted
(``stream_partial_frame_no_room_<transport>``) and its frame is an unclean disconnect.
Why wait rather than close at once: a legal frame must get through when there is room,
and room usually comes back in milliseconds as Kafka acknowledges; why close at all: a
partial frame that can never get room would otherwise hold its bytes (and its client)
for ever. Clients of messages up to ``PARTIAL_FRAME_FREE_BYTES`` never wait for the
pool: their partial frames are within that allowance, so the discard policy (Dory's)
still never blocks them; nor for their share, which a client of ordinary messages never
reaches (it holds one partial frame per connection).

A connection thus has four reasons not to be read, kept apart: the input's pause
(backpressure, shutdown), its rate throttle, waiting for room in the pool, and waiting
for its turn.

A TCP connection whose read was small *gathers*: its socket's low-water mark
(``SO_RCVLOWAT``) is raised to ``GATHER_BYTES`` for ``GATHER_S``, so a client writing
small messages fast wakes the daemon once per 16 KiB instead of once per write (each
wake-up cost more than the messages it brought: issue 25), then lowered back to 1 byte, so
no message waits longer than that; the kernel reports a peer's close whatever the mark.
(UNIX stream sockets ignore the mark in poll: they are read as before.)

Where pydory.daemon.inputs.stream_drain turns it on (the default; ``PYDORY_STREAM_DRAIN=0``
turns it off), a UNIX stream connection is read by the input's drain thread from its second
read on: the first is its transport's (uvloop starts reading after ``connection_made``
whatever was asked there),
then the transport is paused for good and the thread reads a duplicate of its socket. Each
loop turn the connection takes what the thread read, at most what a read of its transport
would have read, and hands it on exactly as such a read; pausing it stops the thread reading
it; every close takes it out of the thread first, with what it held.

Rule: a :class:`StreamInputProtocol` connection is read only when none of the input's pause,
its throttle, its wait for room and its wait for a turn holds.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import weakref
from collections.abc import Callable
from typing import cast

from pydory.daemon.books import counters as counter_names
from pydory.daemon.books.counters import Counters
from pydory.daemon.books.events import Transport
from pydory.daemon.books.pool import PARTIAL_FRAME_FREE_BYTES, MemoryPool, partial_frame_cost
from pydory.daemon.inputs.intake_port import Intake
from pydory.daemon.inputs.peers import loopback_tcp_owner, peer_uid, uid_client
from pydory.daemon.inputs.quotas import ClientQuota, ListenerQuota
from pydory.daemon.inputs.sockets import dup_socket, read_buffered, unread_bytes_on
from pydory.daemon.inputs.stream_drain import ConnectionsDrain
from pydory.daemon.inputs.turns import READ_BYTES, loop_turns
from pydory.daemon.log_limits import ClientLines
from pydory.hotpath import StreamFramer

log = logging.getLogger(__name__)
# Lines a client causes as often as it connects: one per kind per minute.
_lines = ClientLines(log)

#: A TCP read smaller than this makes its connection gather (the module's docstring) ...
GATHER_BYTES = 16 * 1024
#: ... for this long at most: the longest a message waits to be read for it.
GATHER_S = 0.001

#: How long a connection whose partial frame found no room in the pool waits for room
#: before it is closed (deliveries normally give memory back within milliseconds).
PARTIAL_FRAME_WAIT_S = 10.0


class FrameReader:
    """One connection's byte stream, framed into messages for the intake (no I/O), its
    partial frame charged to the memory pool and to its client's share."""

    __slots__ = (
        "_framer",
        "_identify",
        "_intake",
        "_kind",
        "_shares",
        "broken",
        "charged",
        "client",
        "frames_read",
        "short_of_memory",
    )

    def __init__(
        self,
        kind: Transport,
        max_msg_size: int,
        intake: Intake,
        pool: MemoryPool,
        identify: Callable[[], object] | None = None,
    ) -> None:
        """``identify``: who the client is (asked once, at the first read; none: this
        connection alone)."""
        self._kind = kind
        self._intake = intake
        self._framer = StreamFramer(max_msg_size)
        self._shares = pool.shares
        self._identify = identify
        #: The client the charges go to (pydory.daemon.books.shares), once known.
        self.client: object | None = None
        self.broken = False
        self.frames_read = 0  # whole messages framed so far (the rate quota counts them)
        #: Pool bytes charged now for the partial frame held (``partial_frame_cost``).
        self.charged = 0
        #: Set when the client was at its share, or the pool had no room for the partial
        #: frame (charged all the same: those bytes are read already); the connection then
        #: waits for room.
        self.short_of_memory = False

    def feed(self, data: bytes | memoryview) -> bool:
        """Hand the intake every whole message ``data`` completes; False once the stream
        cannot be framed any more (close the connection)."""
        if self.broken:
            return False
        framer = self._framer
        framer.feed(data)
        frames = framer.drain()  # one call per read (compiled: pydory.hotpath)
        error = framer.error
        if error is not None:
            # An oversized or nonsensical Size: a buggy client.
            self.broken = True
            self._release(self.charged)  # nothing is held any more
            if frames:
                self._intake.frames(frames, self._kind, self.client)  # those before, first
            self._intake.broken_stream(error, self._kind)
            return False
        cost = partial_frame_cost(framer.buffered)
        if cost < self.charged:
            # A frame was completed: its bytes leave the reader before the intake charges
            # them as a message, so they are never counted twice.
            self._release(self.charged - cost)
        if frames:
            # Handed over as one burst: the intake counts and books once per burst.
            self.frames_read += len(frames)
            # Charged, once accepted, to the same client's share (books/charges.py).
            self._intake.frames(frames, self._kind, self.client)
        if cost > self.charged:
            self._charge(cost - self.charged)
        return True

    def room(self) -> int:
        """Bytes this connection may read now before its client is at its share (the
        first call asks who the client is)."""
        client = self.client
        if client is None:
            client = self.client = self if self._identify is None else self._identify()
        return self._shares.room(client)

    def _charge(self, nbytes: int) -> None:
        client = self.client
        if client is None:
            client = self.client = self if self._identify is None else self._identify()
        charged = self.charged + nbytes
        self.charged = charged
        if charged <= PARTIAL_FRAME_FREE_BYTES:  # never waits for the pool, only its share
            within = self._shares.charge_anyway(client, nbytes)
        else:
            within = self._shares.charge(client, nbytes)
        if not within:
            self.short_of_memory = True

    def _release(self, nbytes: int) -> None:
        if nbytes:
            self._shares.release(self.client, nbytes)
            self.charged -= nbytes

    def finish(self) -> None:
        """The connection ended: a message left incomplete is an unclean disconnect."""
        self._release(self.charged)
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
        pool: MemoryPool,
    ) -> None:
        self.kind = kind
        #: The listener's quotas; the connections ask it and count what it decides.
        self.quota = quota
        self.counters = counters
        self.clock = clock
        self.refused_counter = counter_names.QUOTA_CONNECTIONS_REFUSED[kind]
        self.throttles_counter = counter_names.QUOTA_THROTTLES[kind]
        self.throttled_ms_counter = counter_names.QUOTA_THROTTLED_MS[kind]
        self.no_room_counter = counter_names.STREAM_PARTIAL_FRAME_NO_ROOM[kind]
        #: Partial frames are charged here (Dory's maxBuffer).
        self.pool = pool
        #: The read buffer of every connection of this input: a read is framed (copied
        #: out) before the next one, so one buffer serves them all.
        self.read_buffer = memoryview(bytearray(READ_BYTES))
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
        #: The thread reading the connections from their second read on (UNIX stream, where
        #: pydory.daemon.inputs.stream_drain turns it on), else None.
        self.drain: ConnectionsDrain | None = None
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


class StreamInputProtocol(asyncio.BufferedProtocol):
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
        self._reader = FrameReader(kind, max_msg_size, intake, connections.pool, self.client_key)
        self._transport: asyncio.Transport | None = None
        self._connections = connections
        # Its client's share of the pool (read per read: get_buffer).
        self._shares = connections.pool.shares
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
        self._awaiting_turn = False  # paused until its turn (pydory.daemon.inputs.turns)
        # Waiting for room in the pool: the timer that closes the connection if none comes.
        self._room_deadline: asyncio.TimerHandle | None = None
        # The frame it waits for (its count of whole frames then) and when its time is up:
        # a wait for the same partial frame resumes the first wait's time, not a new one.
        self._room_wait_frame = -1
        self._room_wait_until = 0.0
        # Gathering (TCP only): its socket, and the timer lowering the mark again.
        self._socket: socket.socket | None = None
        self._gathering: asyncio.TimerHandle | None = None
        self._client_key: object | None = None  # who the client is, once asked
        # Read by the input's drain thread: its token there, whether it is paused there, and
        # the error it ended with (connection_lost is told).
        self._token: int | None = None
        self._drain_paused = False
        self._end_error: OSError | None = None
        connections.accepting.add(self)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self._transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        self.fd = sock.fileno()
        if self._kind is Transport.TCP:
            self._socket = sock
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
        _lines.log(
            logging.DEBUG,
            ("quota refusal", self._kind),
            "%s input: connection refused by the connection quota",
            self._kind,
        )
        assert self._transport is not None
        self._transport.abort()

    # -- the rate quota --------------------------------------------------------------------

    def client_key(self) -> object:
        """Who this client is for its rate quota: its uid (every connection of a uid on
        the listener shares one quota): the peer's on a UNIX socket, the owner of the
        client's socket on loopback TCP (pydory.daemon.inputs.peers); this connection
        alone if the kernel does not say. The same key names it in the pool's shares."""
        if self._client_key is not None:
            return self._client_key
        if self._transport is None:
            return self
        sock = self._transport.get_extra_info("socket")
        uid = peer_uid(sock) if self._kind is Transport.UNIX_STREAM else loopback_tcp_owner(sock)
        key = self._client_key = self if uid is None else uid_client(uid)
        return key

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
        self._stop_reading()
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
        if transport is None or transport.is_closing():
            return False
        return not self._drain_paused if self._token is not None else transport.is_reading()

    @property
    def drained(self) -> bool:
        """Whether the input's drain thread reads this connection."""
        return self._token is not None

    def unread(self) -> int:
        """Bytes sent on this connection not handed to the intake yet: in the kernel, and
        those the drain thread holds (the commit point's marks)."""
        drain = self._connections.drain
        if self._token is not None and drain is not None:
            return drain.unread(self._token)
        return unread_bytes_on(self.fd)

    def _end_throttle(self) -> None:
        if self._throttle is not None:
            self._throttle.cancel()
            self._throttle = None

    # -- reading -------------------------------------------------------------------------

    def close(self) -> None:
        self._leave_drain()
        if self._transport is not None:
            self._transport.close()

    def _stop_reading(self) -> None:
        """Pause the transport, or the drain thread's reads of this connection."""
        drain = self._connections.drain
        if self._token is not None and drain is not None:
            drain.pause(self._token)
            self._drain_paused = True
        elif self._transport is not None:
            self._transport.pause_reading()

    def _start_reading(self) -> None:
        drain = self._connections.drain
        if self._token is not None and drain is not None:
            drain.resume(self._token)
            self._drain_paused = False
        elif self._transport is not None:
            self._transport.resume_reading()

    def _leave_drain(self) -> bytes:
        """Take this connection out of the drain thread (before any close: it reads a
        duplicate of the socket); what it held is returned."""
        token, drain = self._token, self._connections.drain
        if token is None or drain is None:
            return b""
        self._token = None
        self._drain_paused = False
        held, _ = drain.remove(token)
        return held

    def pause(self) -> None:
        """Stop reading for now; :meth:`drain_and_close` reads what waits meanwhile."""
        if self._transport is not None and not self._transport.is_closing():
            self._stop_reading()

    def resume(self) -> None:
        """Read again, unless the rate quota, a wait for room or a wait for its turn holds
        this connection (the end of that wait resumes it)."""
        if (
            self._throttle is None
            and self._room_deadline is None
            and not self._awaiting_turn
            and self._transport is not None
            and not self._transport.is_closing()
        ):
            self._start_reading()

    def drain_and_close(self, deadline: float) -> None:
        """Shutdown: hand the intake what the kernel holds for this connection, then close.
        Throttled or not: the quotas only pace reading while the daemon runs."""
        self._end_gather()
        self._end_throttle()
        self._end_room_wait()
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        transport.pause_reading()
        held = self._leave_drain()  # read by the thread: before what the kernel still holds
        if held and not self._reader.broken:
            self.bytes_read += len(held)
            self._reader.feed(held)
        if not self._reader.broken and self.fd >= 0:
            with dup_socket(self.fd) as sock:
                read_buffered(sock, self._reader.feed, deadline)
        transport.close()

    def get_buffer(self, sizehint: int) -> memoryview:
        buffer = self._connections.read_buffer
        limit = self._read_limit()
        return buffer if limit == READ_BYTES else buffer[:limit]

    def _read_limit(self) -> int:
        """The most bytes the next read may bring."""
        reader = self._reader
        if self._shares.room_for_any >= READ_BYTES and reader.client is not None:
            return READ_BYTES  # every client has a read's room: no need to look up this one's
        room = reader.room()  # (the first read's asks who the client is)
        if room >= READ_BYTES:
            return READ_BYTES
        # Its client is near its share of the pool: read no more than the share allows
        # (a byte when none is left: that read pauses this connection until there is).
        return max(1, room)

    def buffer_updated(self, nbytes: int) -> None:
        self.bytes_read += nbytes
        if not self._reader.feed(self._connections.read_buffer[:nbytes]):
            # The stream can't be framed any more: close this connection only.
            assert self._transport is not None
            self._transport.close()
            return
        self._after_read(nbytes)
        if self._connections.drain is not None and self._token is None:
            self._hand_to_drain()

    def take_drained(self) -> None:
        """Its turn to take what the drain thread read: at most what a read of the
        transport would bring, handed on as such a read; then its end, if it came."""
        token, drain = self._token, self._connections.drain
        if token is None or drain is None:
            return
        data, end = drain.take(token, self._read_limit())
        if data:
            self.bytes_read += len(data)
            if not self._reader.feed(data):
                self.close()  # the stream can't be framed any more: this connection only
                return
            self._after_read(len(data))
        if end is not None:
            # EOF (0), as eof_received closes; or the error a read met, for connection_lost.
            self._end_error = OSError(end, os.strerror(end)) if end else None
            self.close()

    def _hand_to_drain(self) -> None:
        """After its transport's first read: from now on the drain thread reads it (paused
        there if one of the reasons not to read holds now)."""
        transport, drain = self._transport, self._connections.drain
        if transport is None or transport.is_closing() or drain is None or self.fd < 0:
            return
        paused = not transport.is_reading()
        transport.pause_reading()  # for good: the transport reads it no more
        self._token = drain.add(self.fd, self, paused)
        self._drain_paused = paused

    def _after_read(self, nbytes: int) -> None:
        """What follows a read's framing: the rate quota, the pool, the pause, the turns."""
        reader = self._reader
        if self._client is not None:
            self._charge(nbytes)
        if reader.short_of_memory:
            reader.short_of_memory = False
            self._wait_for_room()
        elif self._connections.paused:
            self.pause()  # a pause in connection_made does not hold under uvloop (above)
        elif nbytes == READ_BYTES and self._throttle is None:
            # A full read: its client may have more waiting; the others read first.
            if not self._awaiting_turn:
                self._awaiting_turn = True
                loop_turns().wait_for_turn(self, reader.client)
            else:  # resumed early (the input's resume): wait for the turn queued already
                self.pause()
        elif nbytes < GATHER_BYTES and self._socket is not None and self._gathering is None:
            self._gather()

    def _gather(self) -> None:
        """A small read on TCP: the kernel wakes us for this connection again once
        GATHER_BYTES wait, or once GATHER_S has passed, whichever comes first."""
        if self._set_low_water(GATHER_BYTES):
            self._gathering = asyncio.get_running_loop().call_later(GATHER_S, self._end_gather)

    def _end_gather(self) -> None:
        if self._gathering is not None:
            self._gathering.cancel()  # harmless when it is the timer running this
            self._gathering = None
            self._set_low_water(1)

    def _set_low_water(self, nbytes: int) -> bool:
        transport, sock = self._transport, self._socket
        if sock is None or transport is None or transport.is_closing():
            return False
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, nbytes)
        except OSError:  # the connection went meanwhile: nothing to gather
            return False
        return True

    def take_turn(self) -> None:
        """Its turn has come (pydory.daemon.inputs.turns): read again, unless the input is
        paused meanwhile (then its resume, or the drain, reads it)."""
        self._awaiting_turn = False
        if not self._connections.paused:
            self.resume()

    # -- partial frames and the pool -------------------------------------------------------

    def _wait_for_room(self) -> None:
        """Its client is at its share, or the pool had no room for this connection's
        partial frame: stop reading it until there is room, within PARTIAL_FRAME_WAIT_S of
        its first wait for this frame (woken and short again, it does not start afresh: a
        client at its share cannot keep frames it never completes by taking turns); close
        it at once if its partial frame alone holds the largest share a client can have
        (no room can ever come for it)."""
        connections = self._connections
        shares = connections.pool.shares
        if self._reader.charged >= shares.largest_share():
            self._close_for_no_room()
            return
        assert self._transport is not None
        self._stop_reading()
        loop = asyncio.get_running_loop()
        frame = self._reader.frames_read
        if frame != self._room_wait_frame:  # a new partial frame: its time starts now
            self._room_wait_frame = frame
            self._room_wait_until = loop.time() + PARTIAL_FRAME_WAIT_S
        self._room_deadline = loop.call_at(self._room_wait_until, self._close_for_no_room)
        shares.when_room(self._reader.client, self._room_back)

    def _room_back(self) -> None:
        """The pool has room again: read on (unless the input is paused meanwhile)."""
        if self._room_deadline is not None:
            self._room_deadline.cancel()
            self._room_deadline = None
        if not self._connections.paused:
            self.resume()

    def _close_for_no_room(self) -> None:
        """No room for this connection's partial frame: close it, counted; the frame is an
        unclean disconnect (connection_lost), its pool bytes released."""
        self._end_room_wait()
        connections = self._connections
        connections.counters.inc(connections.no_room_counter)
        # A hostile client can have hundreds of such connections: a line a client causes.
        _lines.log(
            logging.WARNING,
            ("no room", self._kind),
            "%s input: closing a connection whose partial frame found no room in the "
            "memory pool (maxBuffer %d) or in its client's share of it within %.0f s; "
            "counted in %s",
            self._kind,
            connections.pool.budget,
            PARTIAL_FRAME_WAIT_S,
            connections.no_room_counter,
        )
        self.close()

    def _end_room_wait(self) -> None:
        if self._room_deadline is not None:
            self._room_deadline.cancel()
            self._room_deadline = None
        self._connections.pool.shares.cancel_when_room(self._reader.client, self._room_back)

    def eof_received(self) -> bool | None:
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self._refused:
            return  # never made: neither opened nor read
        self._leave_drain()  # closed by the loop itself: what the thread held goes with it
        if exc is None:
            exc = self._end_error
        self._end_gather()
        self._end_throttle()
        self._end_room_wait()
        if self._client is not None:
            self._connections.quota.detach(self._client)
            self._client = None
        self._reader.finish()
        self._connections.lost(self)
        self._intake.connection_closed(self._kind, exc)
