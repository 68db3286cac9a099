"""Input agents: the three client transports, as thin adapters on one asyncio reactor.

Seed 004's model: no thread per connection; readiness callbacks on one event loop. Each
adapter only moves bytes: framing and decoding live in ``pydory.wire``, every decision about
a message in the ``Intake`` it hands them to. The daemon never writes to a client socket.

- UNIX datagram: a raw non-blocking socket read with ``recv_into`` from a reader callback
  (measured: several times faster than asyncio's datagram transport), a burst at a time.
- UNIX stream and TCP: asyncio servers sharing ``StreamInputProtocol``; a Size above
  maxStreamMsgSize closes that connection only; a stream ending mid-message is an unclean
  disconnect. asyncio's accept loop already backs off on EMFILE/ENFILE.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import socket
import stat
from typing import Protocol, cast

from pydory.accounting import Transport
from pydory.errors import ClientProtocolError, ConfigError
from pydory.wire import NEED_DATA, StreamFramer

log = logging.getLogger(__name__)

#: Datagrams read per readiness callback before yielding to other work on the loop.
DATAGRAM_BURST = 512
#: A UNIX datagram larger than this needs the client to raise SO_SNDBUF (Dory's
#: allowLargeUnixDatagrams); Linux's default net.core.wmem_default is 212992.
DEFAULT_WMEM_FILE = "/proc/sys/net/core/wmem_default"


class Intake(Protocol):
    """What the input agents hand their bytes to (implemented by pydory.intake)."""

    def datagram(self, data: bytes) -> None: ...

    def datagram_too_large(self, size: int, prefix: bytes) -> None: ...

    def frame(self, data: bytes, transport: Transport) -> None: ...

    def broken_stream(self, error: ClientProtocolError, transport: Transport) -> None: ...

    def unclean_disconnect(self, prefix: bytes, transport: Transport) -> None: ...

    def connection_opened(self, transport: Transport) -> None: ...

    def connection_closed(self, transport: Transport) -> None: ...


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


def kernel_datagram_limit() -> int:
    """The largest UNIX datagram a client can send without raising its SO_SNDBUF."""
    try:
        with open(DEFAULT_WMEM_FILE) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return 212_992


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
        self._max = max_msg_size
        self._intake = intake
        if max_msg_size > kernel_datagram_limit() and not allow_large:
            raise ConfigError(
                f"maxDatagramMsgSize {max_msg_size} exceeds the kernel's default datagram "
                f"limit ({kernel_datagram_limit()}); set allowLargeUnixDatagrams to true "
                "(clients must then raise SO_SNDBUF) or lower maxDatagramMsgSize",
                "/doryConfig/inputConfig/maxDatagramMsgSize",
            )
        # One extra byte tells an oversized datagram apart; MSG_TRUNC reports its true size.
        self._buffer = bytearray(max_msg_size + 1)
        self._view = memoryview(self._buffer)
        self._sock: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        _prepare_socket_path(self.path, socket.SOCK_DGRAM)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
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

    def _on_readable(self) -> None:
        assert self._sock is not None
        recv_into = self._sock.recv_into
        buffer, view, limit = self._buffer, self._view, self._max
        intake = self._intake
        for _ in range(DATAGRAM_BURST):
            try:
                size = recv_into(buffer, len(buffer), socket.MSG_TRUNC)
            except (BlockingIOError, InterruptedError):
                return
            if size > limit:
                intake.datagram_too_large(size, bytes(view[: min(size, 64)]))
            else:
                intake.datagram(bytes(view[:size]))

    def close(self) -> None:
        if self._sock is not None:
            if self._loop is not None:
                self._loop.remove_reader(self._sock.fileno())
            self._sock.close()
            self._sock = None
            _remove_socket_file(self.path)


class StreamInputProtocol(asyncio.Protocol):
    """One stream connection: frames by Size, hands each frame to the intake."""

    def __init__(
        self,
        kind: Transport,
        max_msg_size: int,
        intake: Intake,
        registry: set[StreamInputProtocol],
    ) -> None:
        self._kind = kind
        self._intake = intake
        self._framer = StreamFramer(max_msg_size)
        self._transport: asyncio.Transport | None = None
        self._broken = False
        self._registry = registry

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self._transport = cast(asyncio.Transport, transport)
        self._registry.add(self)
        self._intake.connection_opened(self._kind)

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def data_received(self, data: bytes) -> None:
        if self._broken:
            return
        framer = self._framer
        framer.feed(data)
        frame_to_intake = self._intake.frame
        kind = self._kind
        try:
            while True:
                frame = framer.next_frame()
                if frame is NEED_DATA:
                    return
                frame_to_intake(frame, kind)
        except ClientProtocolError as error:
            # The stream can't be framed any more (oversized or nonsensical Size): a buggy
            # client. Close this connection only.
            self._broken = True
            self._intake.broken_stream(error, kind)
            assert self._transport is not None
            self._transport.close()

    def eof_received(self) -> bool | None:
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._broken:
            remainder = self._framer.unclean_remainder()
            if remainder:
                self._intake.unclean_disconnect(remainder, self._kind)
        self._registry.discard(self)
        self._intake.connection_closed(self._kind)


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
    ) -> None:
        self.kind = kind
        self.path = path
        self.port = port
        self._mode = mode
        self._max = max_msg_size
        self._intake = intake
        self._servers: list[asyncio.AbstractServer] = []
        self._connections: set[StreamInputProtocol] = set()

    def _protocol(self) -> StreamInputProtocol:
        return StreamInputProtocol(self.kind, self._max, self._intake, self._connections)

    @property
    def connection_count(self) -> int:
        return len(self._connections)

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

    async def close(self) -> None:
        for server in self._servers:
            server.close()
        for connection in list(self._connections):
            connection.close()  # what they sent so far has been handed to the intake
        for server in self._servers:
            await server.wait_closed()
        self._servers.clear()
        if self.path is not None:
            _remove_socket_file(self.path)
