"""The UNIX datagram input: one Dory message per datagram, read a burst at a time.

A raw non-blocking socket read with ``recv_into`` from a reader callback (measured:
several times faster than asyncio's datagram transport). At shutdown the socket is shut
for reading (a client sending from then on gets EPIPE), its file removed, and the
datagrams already queued are handed to the intake before it closes.

Rule: every datagram read is handed on, in the order read: whole ones in bursts, one too
large (MSG_TRUNC tells its size) as ``datagram_too_large`` after the ones before it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket

from pydory.daemon.inputs.intake_port import Intake
from pydory.daemon.inputs.marks import DatagramMark, Pending
from pydory.daemon.inputs.sockets import (
    datagram_queue_limit,
    kernel_datagram_limit,
    prepare_socket_path,
    remove_socket_file,
)
from pydory.errors import ConfigError

log = logging.getLogger(__name__)

#: Datagrams read per readiness callback before yielding to other work on the loop.
DATAGRAM_BURST = 512
#: At shutdown, the most datagrams read from the queue (the kernel queues far fewer).
SHUTDOWN_DATAGRAMS_MAX = 100_000


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
        # For the commit point's marks (see DatagramMark).
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
        prepare_socket_path(self.path, socket.SOCK_DGRAM)
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

    def mark_unread(self, readable: set[int]) -> list[Pending]:
        """The commit point's note of the datagrams queued now (``readable``: from poll)."""
        if self._sock is None or self._sock.fileno() not in readable:
            return []
        return [DatagramMark(self)]

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
            remove_socket_file(self.path)
            if not self._read(sock, SHUTDOWN_DATAGRAMS_MAX):
                log.warning(
                    "more than %d datagrams queued at shutdown: the rest are lost",
                    SHUTDOWN_DATAGRAMS_MAX,
                )
        finally:
            sock.close()
