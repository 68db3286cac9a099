"""Accepting stream connections, and the process's file descriptor limit.

uvloop's servers accept inside libuv, which at EMFILE/ENFILE closes its reserve
descriptor, accepts every connection waiting in the backlog and closes it at once (its
"EMFILE trick"), tells Python nothing, and closes the listener for good if it cannot take
its reserve back. So at the fd limit a client's connection would be dropped unseen, and
pydory could neither say so nor count it. :class:`Acceptor` accepts in Python instead
(``add_reader`` on the listening socket, ``accept``, then the loop's
``connect_accepted_socket``), as asyncio's own accept loop does, and reports EMFILE and
ENFILE to :class:`FdLimit`, shared by every listener of the process.

An **episode** at the fd limit: at the first accept the kernel refuses, one WARNING line,
``accept_fd_limit_episodes`` + 1, and every listener stops accepting; ``accept_fd_limit_
refused`` counts each accept refused. The clients meanwhile wait in the listen backlog
(their connect succeeded; their writes fill the socket buffers, then block): nothing they
send is lost, and the commit point waits for them. Every ACCEPT_RETRY_S the listeners try
again. The episode ends, with a second WARNING line giving its length and the accepts
refused, once every listener has emptied its backlog without meeting the limit.

The **reserve**: the process holds RESERVE_FDS descriptors (``/dev/null``) while no
episode is under way, and lets them go when one starts, so that the status port (whose
connections are capped, pydory.status.limits), librdkafka's reconnections, a spool
segment or a log file still find descriptors while the listeners wait; they are taken
back before the listeners accept again.

Rule: a stream connection is accepted only by an :class:`Acceptor`, and never while the
process is at its file descriptor limit (:class:`FdLimit`).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import resource
import socket
import time
from collections.abc import Callable

from pydory.daemon.books import counters as counter_names
from pydory.daemon.books.counters import Counters
from pydory.daemon.inputs.sockets import LISTEN_BACKLOG, listen_unix_stream
from pydory.daemon.inputs.sockets import listen_tcp as listen_tcp_socket
from pydory.daemon.log_limits import ClientLines

__all__ = ["ACCEPT_RETRY_S", "RESERVE_FDS", "Acceptor", "FdLimit", "listen_tcp", "listen_unix"]

log = logging.getLogger(__name__)

#: Descriptors held back for everything but new stream connections (at most an eighth of
#: the soft limit).
RESERVE_FDS = 16
#: How long the listeners wait at the fd limit before they try to accept again.
ACCEPT_RETRY_S = 0.5
#: Connections accepted per readiness callback before the loop's next turn.
ACCEPT_BURST = 64
#: The listen backlog: clients waiting to be accepted (at the fd limit, too).
BACKLOG = LISTEN_BACKLOG

_AT_THE_LIMIT = frozenset({errno.EMFILE, errno.ENFILE})


class FdLimit:
    """The stream listeners' view of the process's descriptor limit: the reserve, the
    episodes, the retries. One per process (pydory.daemon.inputs.input_set)."""

    def __init__(self, counters: Counters, reserve: int | None = None) -> None:
        self._counters = counters
        if reserve is None:
            soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
            reserve = RESERVE_FDS if soft == resource.RLIM_INFINITY else min(RESERVE_FDS, soft // 8)
        self.reserve_size = max(0, reserve)
        self._reserve: list[int] = []
        self._acceptors: set[Acceptor] = set()
        #: Set from the first refused accept until the episode ends.
        self.episode_started: float | None = None
        #: Listeners still to empty their backlog before the episode ends.
        self._unconfirmed: set[Acceptor] = set()
        self.refused_in_episode = 0
        self._retry: asyncio.TimerHandle | None = None

    @property
    def at_limit(self) -> bool:
        """Whether an episode is under way (the listeners wait or are confirming)."""
        return self.episode_started is not None

    def register(self, acceptor: Acceptor) -> bool:
        """A new listener; whether it may accept now (not while the others wait)."""
        if not self._reserve and not self.at_limit:
            self._take_reserve()
        self._acceptors.add(acceptor)
        return self._retry is None

    def unregister(self, acceptor: Acceptor) -> None:
        self._acceptors.discard(acceptor)
        self._unconfirmed.discard(acceptor)
        if not self._acceptors:
            self.close()

    def refused(self, error: OSError) -> None:
        """An accept the kernel refused for want of descriptors: count it, begin the
        episode if none is under way, stop every listener and try again later."""
        self._counters.inc(counter_names.ACCEPT_FD_LIMIT_REFUSED)
        self.refused_in_episode += 1
        if self.episode_started is None:
            self.episode_started = time.monotonic()
            self._counters.inc(counter_names.ACCEPT_FD_LIMIT_EPISODES)
            log.warning(
                "stream inputs at the file descriptor limit (%s; RLIMIT_NOFILE %s): not "
                "accepting new connections, retrying every %.1f s; clients wait in the "
                "listen backlog",
                errno.errorcode.get(error.errno or 0, error),
                resource.getrlimit(resource.RLIMIT_NOFILE)[0],
                ACCEPT_RETRY_S,
            )
        self._release_reserve()
        self._unconfirmed.clear()
        for acceptor in self._acceptors:
            acceptor.pause()
        if self._retry is None:
            loop = asyncio.get_running_loop()
            self._retry = loop.call_later(ACCEPT_RETRY_S, self._try_again)

    def _try_again(self) -> None:
        """Take the reserve back, then let every listener accept (and confirm the end of
        the episode by emptying its backlog); still short of descriptors: wait again."""
        self._retry = None
        if not self._take_reserve():
            self._retry = asyncio.get_running_loop().call_later(ACCEPT_RETRY_S, self._try_again)
            return
        self._unconfirmed = set(self._acceptors)
        for acceptor in list(self._acceptors):
            if self._retry is not None:
                return  # the limit again: every listener waits once more
            acceptor.resume()
            acceptor.accept_waiting()

    def drained(self, acceptor: Acceptor) -> None:
        """``acceptor`` found its backlog empty: the end of the episode when every
        listener has since the reserve came back."""
        if self.episode_started is None or self._retry is not None:
            return
        self._unconfirmed.discard(acceptor)
        if self._unconfirmed:
            return
        log.warning(
            "stream inputs accepting again: %.1f s at the file descriptor limit, "
            "%d accepts refused",
            time.monotonic() - self.episode_started,
            self.refused_in_episode,
        )
        self.episode_started = None
        self.refused_in_episode = 0

    def _take_reserve(self) -> bool:
        """Open the reserve; False (holding none) if the descriptors are not there."""
        try:
            while len(self._reserve) < self.reserve_size:
                self._reserve.append(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC))
        except OSError as error:
            if error.errno not in _AT_THE_LIMIT:
                raise
            self._release_reserve()
            return False
        return True

    def _release_reserve(self) -> None:
        reserve, self._reserve = self._reserve, []
        for fd in reserve:
            os.close(fd)

    def close(self) -> None:
        """No listener left (shutdown): the reserve goes, a retry is cancelled."""
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        self._release_reserve()


ProtocolFactory = Callable[[], asyncio.BaseProtocol]


class Acceptor:
    """One listening socket, accepted from in Python; the hand-off of each connection to
    the loop (``connect_accepted_socket``) under way until its ``connection_made``.
    Has the parts of ``asyncio.Server`` the stream input uses (``sockets``, ``close``,
    ``wait_closed``)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sock: socket.socket,
        protocol_factory: ProtocolFactory,
        fd_limit: FdLimit,
    ) -> None:
        self._loop = loop
        self._sock = sock
        self._protocol_factory = protocol_factory
        self._fd_limit = fd_limit
        self._reading = False
        self._closed = False
        self._lines = ClientLines(log)  # a client can cause these: once a minute each
        self._handoffs: set[asyncio.Task[object]] = set()
        sock.setblocking(False)
        if fd_limit.register(self):  # else the episode's retry starts it with the others
            self.resume()

    @property
    def sockets(self) -> list[socket.socket]:
        return [] if self._closed else [self._sock]

    def pause(self) -> None:
        if self._reading:
            self._loop.remove_reader(self._sock.fileno())
            self._reading = False

    def resume(self) -> None:
        if not self._reading and not self._closed:
            self._loop.add_reader(self._sock.fileno(), self.accept_waiting)
            self._reading = True

    def accept_waiting(self) -> None:
        """Accept the connections waiting (ACCEPT_BURST at most this turn)."""
        for _ in range(ACCEPT_BURST):
            if self._closed or not self._reading:
                return
            try:
                conn, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                self._fd_limit.drained(self)
                return
            except ConnectionAbortedError:
                continue  # the client gave up while waiting: nothing to serve
            except OSError as error:
                if error.errno in _AT_THE_LIMIT:
                    self._fd_limit.refused(error)
                else:  # e.g. ENOBUFS: the loop calls again while the backlog is not empty
                    self._lines.log(
                        logging.WARNING,
                        "accept failed",
                        "accepting a stream connection failed: %s",
                        error,
                    )
                return
            self._hand_off(conn)

    def _hand_off(self, conn: socket.socket) -> None:
        conn.setblocking(False)
        protocol = self._protocol_factory()  # known to the input from now on (its marks)
        task: asyncio.Task[object] = self._loop.create_task(
            self._loop.connect_accepted_socket(lambda: protocol, conn)
        )
        self._handoffs.add(task)
        task.add_done_callback(lambda done: self._handed_off(done, conn))

    def _handed_off(self, task: asyncio.Task[object], conn: socket.socket) -> None:
        self._handoffs.discard(task)
        if task.cancelled():
            conn.close()
            return
        error = task.exception()
        if error is not None:  # the socket failed before it was served: nothing read
            self._lines.log(
                logging.WARNING,
                "set-up failed",
                "a stream connection could not be set up: %s",
                error,
            )
            conn.close()

    def close(self) -> None:
        """Stop accepting and close the listening socket (a duplicate keeps the backlog)."""
        if self._closed:
            return
        self.pause()
        self._closed = True
        self._fd_limit.unregister(self)
        self._sock.close()

    async def wait_closed(self) -> None:
        """Until every connection accepted has been handed to the loop."""
        if self._handoffs:
            await asyncio.gather(*self._handoffs, return_exceptions=True)


def listen_unix(
    loop: asyncio.AbstractEventLoop, factory: ProtocolFactory, path: str, fd_limit: FdLimit
) -> Acceptor:
    """A UNIX stream listener on ``path`` (the caller prepared the path)."""
    return Acceptor(loop, listen_unix_stream(path), factory, fd_limit)


def listen_tcp(
    loop: asyncio.AbstractEventLoop,
    factory: ProtocolFactory,
    host: str,
    port: int,
    fd_limit: FdLimit,
) -> Acceptor:
    """A TCP listener on ``host`` (a loopback address) and ``port``."""
    return Acceptor(loop, listen_tcp_socket(host, port), factory, fd_limit)
