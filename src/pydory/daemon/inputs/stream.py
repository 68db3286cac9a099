"""A UNIX stream or loopback TCP listener: the listening sockets whose connections are
StreamInputProtocol (pydory.daemon.inputs.stream_connection).

Accepting is pydory.daemon.inputs.acceptor's (in Python, so that the file descriptor
limit is seen: logged once per episode, counted, backed off). TCP listens on loopback only
(127.0.0.1, and ::1 where the host has IPv6), never on a wildcard. The listener holds its
quotas' settings (a reload replaces them) and can be paused and resumed as a whole.

Closing at shutdown: stop accepting, then hand the intake what the kernel already holds
(bytes on open connections, connections waiting in the listen backlog), reading without
waiting for more, within SHUTDOWN_DRAIN_S; then close. A listening socket systemd passed
(daemon/inputs/handover.py) keeps its file and its backlog: the next daemon accepts
those connections. A listener a reload moved or
removed stops accepting but serves its open connections until their clients close them.

Rule: a listener stops (shutdown or reload) without dropping what clients already sent:
its connections, and those waiting in its listen backlog, are read first (at shutdown,
within ``SHUTDOWN_DRAIN_S``; a socket systemd holds keeps its backlog for the next daemon).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import time
from collections.abc import Callable, Sequence

from pydory.config.model import NO_QUOTAS, ListenerQuotas, QuotasConfig
from pydory.daemon.books.counters import Counters
from pydory.daemon.books.events import Transport
from pydory.daemon.books.pool import MemoryPool
from pydory.daemon.inputs import stream_drain
from pydory.daemon.inputs.acceptor import Acceptor, FdLimit, listen_tcp, listen_unix
from pydory.daemon.inputs.handover import HeldSocket, set_socket_mode
from pydory.daemon.inputs.intake_port import Intake
from pydory.daemon.inputs.marks import BacklogMark, ConnectionMark, Pending
from pydory.daemon.inputs.quotas import ListenerQuota
from pydory.daemon.inputs.sockets import (
    dup_socket,
    prepare_socket_path,
    read_buffered,
    remove_socket_file,
    tcp_port_refused,
)
from pydory.daemon.inputs.stream_connection import Connections, FrameReader, StreamInputProtocol
from pydory.daemon.inputs.stream_drain import ConnectionsDrain
from pydory.daemon.inputs.turns import loop_turns

log = logging.getLogger(__name__)

#: At shutdown, the longest time spent reading what clients sent before the inputs closed.
SHUTDOWN_DRAIN_S = 1.0
#: The budget of a listener's own pool when it is given none (tests, tools): no limit.
UNBOUNDED_POOL_BYTES = 1 << 62


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
        pool: MemoryPool | None = None,
        fd_limit: FdLimit | None = None,
    ) -> None:
        """``quotas``: the ``<quotas>`` section (this listener's part applies);
        ``counters``: where quota refusals and throttles are counted; ``pool``: the
        memory pool partial frames are charged to (none: a pool of its own, unbounded);
        ``fd_limit``: the process's descriptor limit, shared by its listeners (none: one
        of its own)."""
        self.kind = kind
        self.path = path
        self.port = port
        self._mode = mode
        self._max = max_msg_size
        self._intake = intake
        self._servers: list[Acceptor] = []
        counters = Counters() if counters is None else counters
        self._fd_limit = FdLimit(counters) if fd_limit is None else fd_limit
        self._listening_fds: list[int] = []
        #: systemd holds the listening socket too (handover.py): its file is never removed,
        #: and its backlog is left at shutdown to the next daemon.
        self.inherited = False
        self._quota = ListenerQuota(self._quotas_of(quotas))
        self._connections = Connections(
            kind,
            self._quota,
            counters,
            clock,
            MemoryPool(UNBOUNDED_POOL_BYTES) if pool is None else pool,
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
    def reader(self) -> str:
        """Who reads the connections: ``"drain_thread"`` (stream_drain.py) or
        ``"event_loop"`` (their transports)."""
        return "drain_thread" if self._connections.drain is not None else "event_loop"

    @property
    def held_bytes(self) -> int:
        """The most bytes a drain thread holds, read from the connections and not handed
        on yet (0 without one): beside the kernel's buffers, what a SIGKILL can lose unseen."""
        drain = self._connections.drain
        return 0 if drain is None else drain.capacity

    @property
    def connection_held_bytes(self) -> int:
        """The most of those one connection's (0 without a drain thread)."""
        drain = self._connections.drain
        return 0 if drain is None else drain.connection_capacity

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

    def mark_unread(self, readable: set[int]) -> list[Pending]:
        """The commit point's note of what this input holds now (``readable``: from poll):
        bytes on connections (a connection the drain thread reads may hold bytes there
        while its socket polls empty), clients waiting in the backlog, connections being
        accepted."""
        marks: list[Pending] = [
            ConnectionMark(c, c.bytes_read + c.unread())
            for c in self._connections.ready
            if (c.fd in readable or c.drained) and not c.lost
        ]
        marks += [ConnectionMark(c, None) for c in self._connections.accepting]
        if not readable.isdisjoint(self._listening_fds):
            marks.append(BacklogMark(self))
        return marks

    async def start(self, loop: asyncio.AbstractEventLoop, held: Sequence[HeldSocket] = ()) -> None:
        """Listen, or take ``held``: bound before (daemon/inputs/handover.py)."""
        self.inherited = any(each.inherited for each in held)
        if self.kind is Transport.UNIX_STREAM and stream_drain.DRAIN is not None:
            self._connections.drain = ConnectionsDrain(loop)
            log.info("UNIX stream connections read by a thread (%s)", stream_drain.WHY)
        if held:
            self._servers += [Acceptor(loop, h.sock, self._protocol, self._fd_limit) for h in held]
            if self.port is not None:
                self.port = self._servers[0].sockets[0].getsockname()[1]
        elif self.path is not None:
            prepare_socket_path(self.path, socket.SOCK_STREAM)
            self._servers.append(listen_unix(loop, self._protocol, self.path, self._fd_limit))
        else:
            assert self.port is not None
            await self._start_tcp(loop, self.port)
        if self.path is not None:
            if self._mode is not None:
                set_socket_mode(self.path, self._mode, held[0] if held else None)
            log.info("listening for UNIX stream connections on %s", self.path)
        elif held:
            log.info("listening for TCP connections on loopback port %d", self.port)
        self._listening_fds = [sock.fileno() for s in self._servers for sock in s.sockets]

    async def _start_tcp(self, loop: asyncio.AbstractEventLoop, port: int) -> None:
        """Loopback only: 127.0.0.1, and ::1 where the host has IPv6. Never a wildcard."""
        try:
            server = listen_tcp(loop, self._protocol, "127.0.0.1", port, self._fd_limit)
        except OSError as exc:
            raise tcp_port_refused("127.0.0.1", port, exc) from exc
        self._servers.append(server)
        bound_port = server.sockets[0].getsockname()[1]
        self.port = bound_port
        try:
            v6 = listen_tcp(loop, self._protocol, "::1", bound_port, self._fd_limit)
        except OSError as exc:
            if exc.errno not in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT):
                raise tcp_port_refused("::1", bound_port, exc) from exc
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
        if self.inherited:  # systemd's socket keeps them for the next daemon
            for listener in backlogs:
                listener.close()
            backlogs = []
        self._connections.drain_deadline = deadline
        try:
            for listener in backlogs:
                self._drain_backlog(listener, deadline)
        finally:
            for listener in backlogs:
                listener.close()
        draining = list(self._connections.ready)
        for connection in draining:
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
        loop_turns().withdraw(draining)  # the other inputs keep their turns
        drain = self._connections.drain
        if drain is not None:  # its connections are gone (or given up)
            drain.close()
            # What the thread did, for the benchmarks: reads (and empty ones), bytes, takes.
            log.info("UNIX stream drain thread stopped: %s", drain.stats())

    def _stop_listening(self) -> list[socket.socket]:
        """Stop the loop accepting, keeping each listening socket (and its backlog of
        connected clients) open on a duplicate; remove the socket file, so that no new
        UNIX client can connect."""
        if not self._listening_fds:
            return []  # stopped already (by stop_accepting): the file may be another's now
        backlogs = [dup_socket(fd) for fd in self._listening_fds]
        self._listening_fds = []
        for server in self._servers:
            server.close()
        if self.path is not None and not self.inherited:
            remove_socket_file(self.path)
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
                reader = FrameReader(self.kind, self._max, self._intake, self._connections.pool)
                self._intake.connection_opened(self.kind)
                read_buffered(sock, reader.feed, deadline)
                reader.finish()
                self._intake.connection_closed(self.kind)
