"""Input agents: the three client transports, as thin adapters on one asyncio reactor.

Seed 004's model: no thread per connection; readiness callbacks on one event loop. Each
adapter only moves bytes: framing and decoding live in ``pydory.wire``, every decision about
a message in the ``Intake`` it hands them to. The daemon never writes to a client socket.

- UNIX datagram: a raw non-blocking socket read with ``recv_into`` from a reader callback
  (measured: several times faster than asyncio's datagram transport), a burst at a time.
- UNIX stream and TCP: asyncio servers sharing ``StreamInputProtocol``; a Size above
  maxStreamMsgSize closes that connection only; a stream ending mid-message is an unclean
  disconnect. asyncio's accept loop already backs off on EMFILE/ENFILE.

Quotas (``<quotas>``, pydory.daemon.inputs.quotas has the logic): a stream listener may refuse
connections above its limit (closed at once, counted) and slow a client above its rate
by pausing that connection's reads for the throttle time. A connection then has two
reasons not to be read, kept apart: the input's pause (backpressure, shutdown) and its own
throttle; it is read again only when neither holds. Without a rate quota the read path
pays one ``if``.

Two more duties:

- Closing at shutdown: stop accepting, then hand the intake what the kernel already holds
  (queued datagrams, bytes on open connections, connections waiting in the listen
  backlog), reading without waiting for more, within SHUTDOWN_DRAIN_S; then close. UNIX
  sockets are first shut for reading, so that a client sending after that point gets EPIPE
  instead of losing its message silently.
- The commit point's input marks, :func:`mark_inputs`: what every input socket holds at
  one instant (one poll(2), and FIONREAD on the connections holding bytes), and whether
  the daemon has read it all since (pydory.daemon.books.commit_point explains why it needs them).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import logging
import os
import select
import socket
import stat
import struct
import termios
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol, cast

from pydory.config.model import NO_QUOTAS, ListenerQuotas, QuotasConfig
from pydory.daemon.books.accounting import Counters, Transport
from pydory.daemon.inputs.quotas import ClientQuota, ListenerQuota
from pydory.errors import ClientProtocolError, ConfigError
from pydory.wire import NEED_DATA, StreamFramer

log = logging.getLogger(__name__)

#: Datagrams read per readiness callback before yielding to other work on the loop.
DATAGRAM_BURST = 512
#: At shutdown, the longest time spent reading what clients sent before the inputs closed.
SHUTDOWN_DRAIN_S = 1.0
#: At shutdown, the most datagrams read from the queue (the kernel queues far fewer).
SHUTDOWN_DATAGRAMS_MAX = 100_000
#: Bytes asked of a stream socket per read while draining it at shutdown.
DRAIN_READ_SIZE = 256 * 1024
#: A stream read at least this large may have left more behind: the connection then
#: waits for the loop's next turn before it is read again (see ``_yield_turn``).
TURN_READ_BYTES = 64 * 1024
#: A UNIX datagram larger than this needs the client to raise SO_SNDBUF (Dory's
#: allowLargeUnixDatagrams); Linux's default net.core.wmem_default is 212992.
DEFAULT_WMEM_FILE = "/proc/sys/net/core/wmem_default"
#: The length of a UNIX datagram socket's receive queue, fixed when the socket is created.
MAX_DGRAM_QLEN_FILE = "/proc/sys/net/unix/max_dgram_qlen"
#: struct ucred (SO_PEERCRED): pid, uid, gid.
_UCRED = struct.Struct("3i")


class Intake(Protocol):
    """What the input agents hand their bytes to (implemented by pydory.daemon.admission.intake)."""

    def datagrams(self, burst: Sequence[bytes]) -> None: ...

    def datagram_too_large(self, size: int, prefix: bytes) -> None: ...

    def frames(self, burst: Sequence[bytes], transport: Transport) -> None: ...

    def broken_stream(self, error: ClientProtocolError, transport: Transport) -> None: ...

    def unclean_disconnect(self, prefix: bytes, transport: Transport) -> None: ...

    def connection_opened(self, transport: Transport) -> None: ...

    def connection_closed(
        self, transport: Transport, error: BaseException | None = None
    ) -> None: ...


def _prepare_socket_path(path: str, kind: int) -> None:
    """Remove a stale socket file left by an earlier run; refuse to take over a socket that
    another process still serves, or to clobber a file that is not a socket."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise ConfigError(f"socket path {path} exists and is not a socket; refusing to replace it")
    if _socket_is_served(path, kind):
        raise ConfigError(f"socket {path} is in use by another running process (another pydory?)")
    os.unlink(path)


def _socket_is_served(path: str, kind: int) -> bool:
    """Whether something still listens on the UNIX socket at ``path`` (a stale file refuses)."""
    with socket.socket(socket.AF_UNIX, kind) as probe:
        try:
            probe.connect(path)
        except ConnectionRefusedError:
            return False
        except OSError as exc:
            # A live socket of the other type answers EPROTOTYPE: served, just not by us.
            return exc.errno == errno.EPROTOTYPE
        return True


def _remove_socket_file(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def datagram_queue_limit() -> int | None:
    """The most datagrams the kernel queues for a UNIX datagram socket created now: one
    more than net.unix.max_dgram_qlen. None if unknown."""
    try:
        with open(MAX_DGRAM_QLEN_FILE) as f:
            return int(f.read().strip()) + 1
    except (OSError, ValueError):
        return None


def kernel_datagram_limit() -> int:
    """The largest UNIX datagram a client can send without raising its SO_SNDBUF."""
    try:
        with open(DEFAULT_WMEM_FILE) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return 212_992


def _dup_socket(fd: int) -> socket.socket:
    """A non-blocking socket object on a duplicate of ``fd``: closing it leaves ``fd`` open
    (and the socket alive for as long as either is open)."""
    sock = socket.socket(fileno=os.dup(fd))
    sock.setblocking(False)
    return sock


def _read_buffered(sock: socket.socket, feed: Callable[[bytes], bool], deadline: float) -> None:
    """Hand ``feed`` the bytes a stream socket holds now, without waiting for more.

    The socket is shut for reading first: a UNIX peer's next send fails (EPIPE), so nothing
    more arrives. A TCP peer can go on sending, so only the bytes queued at the start are
    read. Stops early at ``deadline`` or when ``feed`` returns False (the stream broke).
    """
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RD)
    remaining = _unread_bytes_on(sock.fileno())
    while remaining > 0 and time.monotonic() < deadline:
        try:
            data = sock.recv(min(remaining, DRAIN_READ_SIZE))
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:  # e.g. the peer reset the connection
            log.debug("reading a connection at shutdown: %s", exc)
            return
        if not data:
            return
        remaining -= len(data)
        if not feed(data):
            return


def _unread_bytes_on(fd: int) -> int:
    """Bytes in a stream socket's receive queue (FIONREAD); 0 if the socket is gone."""
    try:
        result: int = struct.unpack("@i", fcntl.ioctl(fd, termios.FIONREAD, b"\0" * 4))[0]
    except OSError:
        return 0
    return result


def _readable(fds: Iterable[int]) -> set[int]:
    """Which of ``fds`` hold something to read (or to accept) now: one poll(2), no wait."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    return {fd for fd, _ in poller.poll(0)}


# --- the commit point's input marks ---------------------------------------------------------


class _Pending(Protocol):
    def reached(self) -> bool: ...


class InputMark:
    """What the input sockets held at one instant; :meth:`reached` once the daemon has read
    all of it, whatever arrived since. pydory.daemon.books.commit_point builds on this."""

    def __init__(self, pending: list[_Pending]) -> None:
        self._pending = pending

    def reached(self) -> bool:
        """Whether everything the sockets held when the mark was taken has been read."""
        self._pending = [item for item in self._pending if not item.reached()]
        return not self._pending


def mark_inputs(datagram: DatagramInput | None, streams: Iterable[StreamInput]) -> InputMark:
    """Mark what every input socket holds now.

    One poll(2) over the datagram socket, every connection and every listening socket
    finds those holding anything, and only those are noted: how far the datagram queue
    reaches, how many bytes each connection holds (FIONREAD), which listening sockets
    have clients waiting. Connections the loop is accepting right now, whose sockets the
    input does not know yet, are noted too.
    """
    inputs: list[DatagramInput | StreamInput] = [*streams]
    if datagram is not None:
        inputs.append(datagram)
    readable = _readable(fd for source in inputs for fd in source.watched_fds())
    return InputMark([item for source in inputs for item in source.mark_unread(readable)])


class _DatagramMark:
    """The datagrams queued at the mark: all read once the reader has since found the
    queue empty, or has read as many datagrams as the kernel can queue."""

    __slots__ = ("_datagram", "_drained", "_read_target")

    def __init__(self, datagram: DatagramInput) -> None:
        self._datagram = datagram
        self._drained = datagram.times_drained
        limit = datagram.queue_limit
        self._read_target = None if limit is None else datagram.datagrams_read + limit

    def reached(self) -> bool:
        datagram = self._datagram
        return (
            datagram.closed
            or datagram.times_drained > self._drained
            or (self._read_target is not None and datagram.datagrams_read >= self._read_target)
        )


class _ConnectionMark:
    """The bytes one connection held at the mark: read once the daemon has read that many
    more. For a connection being accepted, counted from when its socket is known."""

    __slots__ = ("_connection", "_target")

    def __init__(self, connection: StreamInputProtocol, target: int | None) -> None:
        # Weak: a connection whose accept fails is dropped by the loop, and then by us.
        self._connection = weakref.ref(connection)
        self._target = target

    def reached(self) -> bool:
        connection = self._connection()
        if connection is None or connection.lost:
            return True  # gone: whatever it delivered has been handed to the intake
        if connection.fd < 0:
            return False  # accepted, its connection_made still to come
        if self._target is None:
            self._target = connection.bytes_read + _unread_bytes_on(connection.fd)
        return connection.bytes_read >= self._target


class _BacklogMark:
    """Clients waiting to be accepted at the mark: all read once the listening sockets
    have since been seen with nobody waiting, and every connection known at that moment
    has been read as far as it held bytes then."""

    __slots__ = ("_connections", "_stream")

    def __init__(self, stream: StreamInput) -> None:
        self._stream = stream
        self._connections: list[_ConnectionMark] | None = None

    def reached(self) -> bool:
        if self._connections is None:
            if _readable(self._stream.listening_fds):
                return False
            self._connections = [_ConnectionMark(c, None) for c in self._stream.connections()]
        self._connections = [c for c in self._connections if not c.reached()]
        return not self._connections


class DatagramInput:
    """Reads one Dory message per datagram from a UNIX datagram socket."""

    def __init__(
        self,
        path: str,
        mode: int | None,
        max_msg_size: int,
        allow_large: bool,
        intake: Intake,
    ) -> None:
        self.path = path
        self._mode = mode
        self._intake = intake
        self.check_limits(max_msg_size, allow_large)
        self._set_max(max_msg_size)
        self._sock: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # For the commit point's marks (see _DatagramMark).
        self.datagrams_read = 0
        self.times_drained = 0  # reads that found the queue empty
        self.queue_limit: int | None = None

    @staticmethod
    def check_limits(max_msg_size: int, allow_large: bool) -> None:
        """Raise ConfigError if clients could not send datagrams of ``max_msg_size``."""
        if max_msg_size > kernel_datagram_limit() and not allow_large:
            raise ConfigError(
                f"maxDatagramMsgSize {max_msg_size} exceeds the kernel's default datagram "
                f"limit ({kernel_datagram_limit()}); set allowLargeUnixDatagrams to true "
                "(clients must then raise SO_SNDBUF) or lower maxDatagramMsgSize",
                "/doryConfig/inputConfig/maxDatagramMsgSize",
            )

    def set_max_msg_size(self, max_msg_size: int) -> None:
        """A config reload: the largest datagram from the next read on (checked first
        with :meth:`check_limits`); the socket's receive buffer stays as it is."""
        self._set_max(max_msg_size)

    def _set_max(self, max_msg_size: int) -> None:
        self._max = max_msg_size
        # One extra byte tells an oversized datagram apart; MSG_TRUNC reports its true size.
        self._buffer = bytearray(max_msg_size + 1)
        self._view = memoryview(self._buffer)

    @property
    def closed(self) -> bool:
        return self._sock is None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        _prepare_socket_path(self.path, socket.SOCK_DGRAM)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.queue_limit = datagram_queue_limit()
        try:
            sock.bind(self.path)
            if self._mode is not None:
                os.chmod(self.path, self._mode)
            # A larger receive buffer absorbs bursts while the loop is busy elsewhere.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, max(4 * self._max, 1 << 20))
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        self._sock = sock
        self._loop = loop
        loop.add_reader(sock.fileno(), self._on_readable)
        log.info("listening for UNIX datagrams on %s", self.path)

    def watched_fds(self) -> list[int]:
        """The socket to probe for unread datagrams (none once closed)."""
        return [] if self._sock is None else [self._sock.fileno()]

    def mark_unread(self, readable: set[int]) -> list[_Pending]:
        """The commit point's note of the datagrams queued now (``readable``: from poll)."""
        if self._sock is None or self._sock.fileno() not in readable:
            return []
        return [_DatagramMark(self)]

    def _on_readable(self) -> None:
        assert self._sock is not None
        self._read(self._sock, DATAGRAM_BURST)

    def _read(self, sock: socket.socket, limit: int) -> bool:
        """Read up to ``limit`` datagrams into the intake; True if the queue ran empty."""
        recv_into = sock.recv_into
        buffer, view, max_size = self._buffer, self._view, self._max
        capacity = len(buffer)
        intake = self._intake
        burst: list[bytes] = []
        keep = burst.append
        read = 0
        drained = False
        try:
            while read < limit:
                try:
                    size = recv_into(buffer, capacity, socket.MSG_TRUNC)
                except (BlockingIOError, InterruptedError):
                    drained = True
                    break
                read += 1
                if size <= max_size:
                    keep(bytes(view[:size]))
                    continue
                if burst:  # the ones before it first, in order
                    intake.datagrams(burst)
                    burst.clear()
                intake.datagram_too_large(size, bytes(view[: min(size, 64)]))
        finally:
            # Handed over as one burst: the intake counts and books once per burst.
            if burst:
                intake.datagrams(burst)
            self.datagrams_read += read
            if drained:
                self.times_drained += 1
        return drained

    def pause(self) -> None:
        """Stop reading for now (a shutdown was requested, or backpressure): what clients
        send meanwhile waits in the socket (senders then meet a full queue), for
        :meth:`resume` or :meth:`close` to read."""
        if self._sock is not None and self._loop is not None:
            self._loop.remove_reader(self._sock.fileno())

    def resume(self) -> None:
        if self._sock is not None and self._loop is not None:
            self._loop.add_reader(self._sock.fileno(), self._on_readable)

    def close(self) -> None:
        """Stop reading, hand the intake the datagrams already queued, close the socket and
        remove its file."""
        sock, self._sock = self._sock, None
        if sock is None:
            return
        try:
            if self._loop is not None:
                self._loop.remove_reader(sock.fileno())
            # From here a sender gets EPIPE; what is already queued stays readable.
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RD)
            _remove_socket_file(self.path)
            if not self._read(sock, SHUTDOWN_DATAGRAMS_MAX):
                log.warning(
                    "more than %d datagrams queued at shutdown: the rest are lost",
                    SHUTDOWN_DATAGRAMS_MAX,
                )
        finally:
            sock.close()


class _FrameReader:
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


class _Connections:
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
        self.refused_counter = f"quota_connections_refused_{kind}"
        self.throttles_counter = f"quota_throttles_{kind}"
        self.throttled_ms_counter = f"quota_throttled_ms_{kind}"
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
        connections: _Connections,
    ) -> None:
        self._kind = kind
        self._intake = intake
        self._reader = _FrameReader(kind, max_msg_size, intake)
        self._transport: asyncio.Transport | None = None
        self._connections = connections
        # For the commit point's marks (see _ConnectionMark).
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
            sock = self._transport.get_extra_info("socket")
            with contextlib.suppress(OSError):
                cred = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
                _pid, uid, _gid = _UCRED.unpack(cred)
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
            with _dup_socket(self.fd) as sock:
                _read_buffered(sock, self._reader.feed, deadline)
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


class StreamInput:
    """A UNIX stream or loopback TCP listener feeding StreamInputProtocol connections."""

    def __init__(
        self,
        kind: Transport,
        max_msg_size: int,
        intake: Intake,
        *,
        path: str | None = None,
        mode: int | None = None,
        port: int | None = None,
        quotas: QuotasConfig = NO_QUOTAS,
        counters: Counters | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``quotas``: the ``<quotas>`` section (this listener's part applies);
        ``counters``: where quota refusals and throttles are counted."""
        self.kind = kind
        self.path = path
        self.port = port
        self._mode = mode
        self._max = max_msg_size
        self._intake = intake
        self._servers: list[asyncio.Server] = []
        self._listening_fds: list[int] = []
        self._quota = ListenerQuota(self._quotas_of(quotas))
        self._connections = _Connections(
            kind, self._quota, Counters() if counters is None else counters, clock
        )

    def _quotas_of(self, quotas: QuotasConfig) -> ListenerQuotas:
        return quotas.tcp if self.kind is Transport.TCP else quotas.unix_stream

    @property
    def quota(self) -> ListenerQuota:
        """This listener's quotas (their settings and what they did)."""
        return self._quota

    def set_quotas(self, quotas: QuotasConfig) -> None:
        """Replace the quota settings at run time (a config reload): ``quotas`` is the
        whole ``<quotas>`` section, this listener takes its part. A new connection limit
        applies to connections made from now on (open ones stay); every open connection
        takes the new rate quota at once, measured afresh; a throttle under way ends at
        its time."""
        self._quota.configure(self._quotas_of(quotas))
        for connection in list(self._connections.ready):
            connection.attach_quota()

    def set_max_msg_size(self, max_msg_size: int) -> None:
        """A config reload: the largest message on connections made from now on (an
        open connection keeps the limit it was framed with)."""
        self._max = max_msg_size

    def _protocol(self) -> StreamInputProtocol:
        return StreamInputProtocol(self.kind, self._max, self._intake, self._connections)

    @property
    def connection_count(self) -> int:
        return len(self._connections.ready)

    @property
    def listening_fds(self) -> list[int]:
        """The listening sockets (empty once closing)."""
        return self._listening_fds

    def connections(self) -> list[StreamInputProtocol]:
        """Every connection, including those the loop is accepting right now."""
        return [*self._connections.ready, *self._connections.accepting]

    def watched_fds(self) -> list[int]:
        """The sockets to probe for unread input: listening sockets and connections."""
        return [*self._listening_fds, *(c.fd for c in self._connections.ready if not c.lost)]

    def mark_unread(self, readable: set[int]) -> list[_Pending]:
        """The commit point's note of what this input holds now (``readable``: from poll):
        bytes on connections, clients waiting in the backlog, connections being accepted."""
        marks: list[_Pending] = [
            _ConnectionMark(c, c.bytes_read + _unread_bytes_on(c.fd))
            for c in self._connections.ready
            if c.fd in readable and not c.lost
        ]
        marks += [_ConnectionMark(c, None) for c in self._connections.accepting]
        if not readable.isdisjoint(self._listening_fds):
            marks.append(_BacklogMark(self))
        return marks

    async def start(self, loop: asyncio.AbstractEventLoop) -> None:
        if self.path is not None:
            _prepare_socket_path(self.path, socket.SOCK_STREAM)
            server = await loop.create_unix_server(self._protocol, self.path, backlog=1024)
            if self._mode is not None:
                os.chmod(self.path, self._mode)
            self._servers.append(server)
            log.info("listening for UNIX stream connections on %s", self.path)
        else:
            assert self.port is not None
            await self._start_tcp(loop, self.port)
        self._listening_fds = [sock.fileno() for s in self._servers for sock in s.sockets]

    async def _start_tcp(self, loop: asyncio.AbstractEventLoop, port: int) -> None:
        """Loopback only: 127.0.0.1, and ::1 where the host has IPv6. Never a wildcard."""
        server = await loop.create_server(self._protocol, "127.0.0.1", port, backlog=1024)
        self._servers.append(server)
        bound_port = server.sockets[0].getsockname()[1]
        self.port = bound_port
        try:
            v6 = await loop.create_server(self._protocol, "::1", bound_port, backlog=1024)
        except OSError as exc:
            if exc.errno not in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT):
                raise
            log.info("no IPv6 loopback here; TCP input on 127.0.0.1 only")
        else:
            self._servers.append(v6)
        log.info("listening for TCP connections on loopback port %d", bound_port)

    def pause(self) -> None:
        """Stop reading the open connections for now (a shutdown was requested, or the
        backpressure policy mutes the clients while memory is short); writers then block
        on full socket buffers, and :meth:`close` reads what they sent meanwhile."""
        self._connections.paused = True
        for connection in self._connections.ready:
            connection.pause()

    def resume(self) -> None:
        """Read the connections again (memory is back)."""
        self._connections.paused = False
        for connection in self._connections.ready:
            connection.resume()

    async def close(self) -> None:
        """Stop accepting; hand the intake everything clients already sent, connections
        still in the listen backlog included, reading without waiting for more; close."""
        deadline = time.monotonic() + SHUTDOWN_DRAIN_S
        backlogs = self._stop_listening()
        self._connections.drain_deadline = deadline
        try:
            for listener in backlogs:
                self._drain_backlog(listener, deadline)
        finally:
            for listener in backlogs:
                listener.close()
        for connection in list(self._connections.ready):
            connection.drain_and_close(deadline)
        # A connection the loop accepted a moment ago drains itself in connection_made.
        if not await self._connections.wait_all_lost(deadline) or time.monotonic() > deadline:
            log.warning(
                "%s input: reading what clients sent before shutdown took over %.1f s; "
                "whatever was still unread is lost",
                self.kind,
                SHUTDOWN_DRAIN_S,
            )
        for server in self._servers:
            await server.wait_closed()
        self._servers.clear()

    def _stop_listening(self) -> list[socket.socket]:
        """Stop the loop accepting, keeping each listening socket (and its backlog of
        connected clients) open on a duplicate; remove the socket file, so that no new
        UNIX client can connect."""
        if not self._listening_fds:
            return []  # stopped already (by stop_accepting): the file may be another's now
        backlogs = [_dup_socket(fd) for fd in self._listening_fds]
        self._listening_fds = []
        for server in self._servers:
            server.close()
        if self.path is not None:
            _remove_socket_file(self.path)
        return backlogs

    async def stop_accepting(
        self, loop: asyncio.AbstractEventLoop, on_idle: Callable[[], None] | None = None
    ) -> None:
        """A reload moved or removed this listener: accept no new connection (the socket
        file goes at once), but serve the connections open on it, those waiting in the
        listen backlog included, until their clients close them. Closing them instead
        would lose what a TCP client sends in the meantime (its writes succeed until the
        reset). :meth:`close` still drains and closes them at shutdown. ``on_idle`` is
        called when the last of them closes (not if there is none: see :attr:`idle`)."""
        backlogs = self._stop_listening()
        try:
            for listener in backlogs:
                while True:
                    try:
                        sock, _ = listener.accept()
                    except (BlockingIOError, InterruptedError):
                        break
                    except OSError as exc:
                        log.warning("%s input: cannot accept a waiting client: %s", self.kind, exc)
                        break
                    sock.setblocking(False)
                    await loop.connect_accepted_socket(self._protocol, sock)
        finally:
            for listener in backlogs:
                listener.close()
        self._connections.on_idle = on_idle

    @property
    def idle(self) -> bool:
        """No connection open or being accepted (a listener a reload retired may go)."""
        return not self._connections.ready and not self._connections.accepting

    def _drain_backlog(self, listener: socket.socket, deadline: float) -> None:
        """Accept the connections waiting in the backlog and read what those clients sent."""
        while time.monotonic() < deadline:
            try:
                sock, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.warning(
                    "%s input: cannot accept a waiting client at shutdown: %s", self.kind, exc
                )
                return
            with sock:
                sock.setblocking(False)
                reader = _FrameReader(self.kind, self._max, self._intake)
                self._intake.connection_opened(self.kind)
                _read_buffered(sock, reader.feed, deadline)
                reader.finish()
                self._intake.connection_closed(self.kind)
