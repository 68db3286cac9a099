"""The UNIX datagram input: one Dory message per datagram, read a burst at a time.

A raw non-blocking socket read from a reader callback (measured: several times faster
than asyncio's datagram transport). At shutdown the socket is shut
for reading (a client sending from then on gets EPIPE), its file removed, and the
datagrams already queued are handed to the intake before it closes.

Each datagram is charged to its sender's uid's share of the pool, the same share as that
uid's stream connections (books/shares.py), on every reader, with or without a datagram
quota: the socket sets SO_PASSCRED, and each datagram's SCM_CREDENTIALS comes with it.
The compiled ``recvmmsg`` reads (the loop's and the drain thread's) cut each burst into
runs of one uid in C; the pure reference reads each datagram with ``recvmsg_into`` into
its preallocated buffer and cuts the runs as it reads (a run goes on while the ancillary
data is unchanged, so one uid per run, not per datagram, is parsed). From
:data:`LARGE_DATAGRAM_BYTES` on, datagrams are read one at a time, and the peek that
takes each one's size takes its sender's credentials too, on both paths.
Consecutive datagrams of one uid are handed on as one burst, the bursts in the order read
(docs/operations.md, "Datagram senders", has what it costs). With a quota, a datagram
over its uid's quota is handed to the intake's ``over_quota`` at the end of its burst
(pydory.daemon.inputs.quotas says why it is discarded, not held).

With the compiled hot path (pydory.hotpath), below :data:`LARGE_DATAGRAM_BYTES` the read
takes up to 64 datagrams per system call (``recvmmsg``, which Python's socket module
lacks) with the same order, the same runs, the same oversized rule and the same "found
empty" count; ``recvmsg_into`` is the reference.
Where pydory.daemon.inputs.datagram_drain chooses it (on by default), the socket is
instead emptied by a thread of its own, its bursts handed on here the same way (with a
quota, each datagram's uid kept by the thread and judged here).

Memory for large datagrams is taken only when one arrives: below
:data:`LARGE_DATAGRAM_BYTES` the read buffers are of ``maxDatagramMsgSize`` + 1 bytes (64 of
them for ``recvmmsg``); from it on, each datagram's size is peeked first (``MSG_PEEK |
MSG_TRUNC`` into one buffer of that size, which holds a small one whole) and a larger one
received into memory of its own size, which goes with the message. So every
``maxDatagramMsgSize`` the config accepts runs (the reader is built when the limit is set,
at start and on a reload, and :meth:`DatagramInput.check_limits` refuses a limit it cannot
build one for) and an idle input holds at most 64 buffers of 256 KiB, whatever the limit.

Rule: every datagram a :class:`DatagramInput` reads is handed on, in the order read: whole
ones in bursts, one too large (MSG_TRUNC tells its size) as ``datagram_too_large`` after the
ones before it (and those over their sender's quota, as ``over_quota``, at the end of their
burst).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Callable

from pydory.config.model import ClientRate
from pydory.daemon.inputs import datagram_drain
from pydory.daemon.inputs.datagram_drain import SocketDrain
from pydory.daemon.inputs.handover import HeldSocket, set_socket_mode
from pydory.daemon.inputs.intake_port import Intake
from pydory.daemon.inputs.marks import DatagramMark, Pending
from pydory.daemon.inputs.peers import CREDENTIALS_SPACE, credentials_uid, uid_client
from pydory.daemon.inputs.quotas import DatagramQuota
from pydory.daemon.inputs.sockets import (
    bind_unix_datagram,
    datagram_queue_limit,
    kernel_datagram_limit,
    prepare_socket_path,
    remove_socket_file,
)
from pydory.errors import ConfigError
from pydory.hotpath import DatagramReader

log = logging.getLogger(__name__)

# A peek at the next datagram's true size (its bytes stay queued).
_PEEK_SIZE = socket.MSG_PEEK | socket.MSG_TRUNC
# SO_RCVBUF is a C int.
_MAX_SOCKET_BUFFER = 2**31 - 1

#: Who a datagram's message is charged to in the pool's shares (books/shares.py) when its
#: sender is not named (no credentials came with it): the unnamed senders as one client.
#: Every other datagram is charged to its sender's uid's share (:func:`sender_client`),
#: the one its stream connections have.
DATAGRAM_CLIENT = ("unix_dgram", "senders")
#: A burst's items, as the compiled reads give them: bytes, or (size, prefix) if too large.
Items = list[bytes | tuple[int, bytes]]
#: A burst's runs of one sender, [(uid or None, end)] (None: the senders unnamed).
Runs = list[tuple[int | None, int]] | None
#: No rate quota on the datagram socket (the default).
NO_CLIENT_RATE = ClientRate()
#: Datagrams read per readiness callback before yielding to other work on the loop.
DATAGRAM_BURST = 512
#: At shutdown, the most datagrams read from the queue (the kernel queues far fewer).
SHUTDOWN_DATAGRAMS_MAX = 100_000
#: From this ``maxDatagramMsgSize`` on, datagrams are read one at a time, each size peeked
#: first (as ``_cwire.c``'s ``SLOT_BYTES``): no buffer of that size is held.
LARGE_DATAGRAM_BYTES = 256 * 1024
#: Of a datagram too large, the bytes handed on (as ``_cwire.c``'s ``OVERSIZED_PREFIX``).
OVERSIZED_PREFIX = 64
#: The config element a datagram size comes from, for a refusal.
MAX_SIZE_ELEMENT = "/doryConfig/inputConfig/maxDatagramMsgSize"


class DatagramInput:
    """Reads one Dory message per datagram from a UNIX datagram socket."""

    def __init__(
        self,
        path: str,
        mode: int | None,
        max_msg_size: int,
        allow_large: bool,
        intake: Intake,
        quota: ClientRate = NO_CLIENT_RATE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``quota``: the ``<quotas><unixDatagram>`` client rate (none by default)."""
        self.path = path
        self._mode = mode
        self._intake = intake
        self.check_limits(max_msg_size, allow_large)
        self._sock: socket.socket | None = None
        #: The socket's drain thread while one reads it (datagram_drain.py), else None.
        self._drain: SocketDrain | None = None
        self._paused = False
        self._set_max(max_msg_size)
        #: systemd holds the socket too (handover.py): never shut nor its file removed.
        self.inherited = False
        self._loop: asyncio.AbstractEventLoop | None = None
        # For the commit point's marks (see DatagramMark).
        self.datagrams_read = 0
        self._times_drained = 0  # reads that found the queue empty (a retired drain's too)
        self._kernel_queue_limit: int | None = None
        self._clock = clock
        self.quota: DatagramQuota | None = None
        self.set_quota(quota)

    @property
    def times_drained(self) -> int:
        """Reads that found the queue empty, every datagram read before them handed on."""
        if self._drain is None:
            return self._times_drained
        return self._times_drained + self._drain.position()[1]

    @property
    def queue_limit(self) -> int | None:
        """The most datagrams read and not handed on yet: the kernel's queue, and what a
        drain thread holds now."""
        if self._kernel_queue_limit is None or self._drain is None:
            return self._kernel_queue_limit
        return self._kernel_queue_limit + self._drain.position()[0]

    @property
    def _runs_in_c(self) -> bool:
        """The compiled reads give each burst's runs of one sender (``recvmmsg``, the
        loop's or a drain thread's; from :data:`LARGE_DATAGRAM_BYTES` on, one datagram at
        a time, each sender named by its peek)."""
        return DatagramReader is not None

    @property
    def reader(self) -> str:
        """Who reads the socket now: ``"drain_thread"`` (a thread of its own,
        datagram_drain.py) or ``"event_loop"`` (the loop's reader callback)."""
        return "drain_thread" if self._drain is not None else "event_loop"

    @property
    def ring_datagrams(self) -> int:
        """The most datagrams a drain thread holds, read from the socket and not handed on
        yet (0 without one): beside the kernel's queue, what a SIGKILL can lose unseen."""
        return 0 if self._drain is None else self._drain.capacity

    @property
    def kernel_queue_datagrams(self) -> int | None:
        """The most datagrams the kernel queues on the socket (None: unknown)."""
        return self._kernel_queue_limit

    @staticmethod
    def check_limits(max_msg_size: int, allow_large: bool) -> None:
        """Raise ConfigError if clients could not send datagrams of ``max_msg_size``."""
        if max_msg_size > kernel_datagram_limit() and not allow_large:
            raise ConfigError(
                f"maxDatagramMsgSize {max_msg_size} exceeds the kernel's default datagram "
                f"limit ({kernel_datagram_limit()}); set allowLargeUnixDatagrams to true "
                "(clients must then raise SO_SNDBUF) or lower maxDatagramMsgSize",
                MAX_SIZE_ELEMENT,
            )
        _new_reader(-1, max_msg_size)

    def set_max_msg_size(self, max_msg_size: int) -> None:
        """A config reload: the largest datagram from the next read on (checked first
        with :meth:`check_limits`); the socket's receive buffer stays as it is."""
        self._set_max(max_msg_size)

    def _set_max(self, max_msg_size: int) -> None:
        self._retire_drain()  # what it read, handed on under the limit it read with
        self._max = max_msg_size
        # One extra byte tells an oversized datagram apart; MSG_TRUNC reports its true size.
        # From LARGE_DATAGRAM_BYTES on, the buffer only holds the small ones whole.
        self._large = max_msg_size >= LARGE_DATAGRAM_BYTES
        self._buffer = bytearray(LARGE_DATAGRAM_BYTES if self._large else max_msg_size + 1)
        self._buffers = [self._buffer]  # recvmsg_into's, made once
        self._view = memoryview(self._buffer)
        self._batch_reader: tuple[int, object] | None = None  # (fd, its reader)
        if self._sock is not None:
            self._build_reader(self._sock)
            self._watch()

    def _build_reader(self, sock: socket.socket) -> None:
        """The compiled reader of ``sock`` at this limit, built now (not at the first read:
        a limit it cannot honour is a config error, never an error on every loop turn)."""
        fd = sock.fileno()
        reader = _new_reader(fd, self._max, credentials=True)
        self._batch_reader = None if reader is None else (fd, reader)

    def set_quota(self, rate: ClientRate) -> None:
        """The senders' rate quota (a config reload: windows start afresh)."""
        self._retire_drain()  # rebuilt below: it judges the quota it was made with
        self.quota = DatagramQuota(rate) if rate.limited else None
        if self._sock is not None:
            self._watch()

    @property
    def closed(self) -> bool:
        return self._sock is None

    def start(self, loop: asyncio.AbstractEventLoop, held: HeldSocket | None = None) -> None:
        """Bind the socket, or take ``held``: bound before (daemon/inputs/handover.py)."""
        self._kernel_queue_limit = datagram_queue_limit()
        if held is None:
            prepare_socket_path(self.path, socket.SOCK_DGRAM)
            sock = bind_unix_datagram(self.path)
        else:
            sock, self.inherited = held.sock, held.inherited
        try:
            if self._mode is not None:
                set_socket_mode(self.path, self._mode, held)
            # A larger receive buffer absorbs bursts while the loop is busy elsewhere (the
            # kernel caps it at net.core.rmem_max; the option is a C int).
            receive_buffer = min(max(4 * self._max, 1 << 20), _MAX_SOCKET_BUFFER)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
            sock.setblocking(False)
            # Every datagram's sender named, on every reader, quota or not (a datagram
            # queued before this reads as the overflow uid: inputs/peers.py).
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
            self._build_reader(sock)
        except BaseException:
            sock.close()
            raise
        self._sock = sock
        self._loop = loop
        self._watch()
        log.info(
            "listening for UNIX datagrams on %s%s",
            self.path,
            " (drained by a thread)" if self._drain is not None else "",
        )

    def _watch(self) -> None:
        """Read the socket from now on (unless paused): by a drain thread where one fits,
        else by the loop's reader callback."""
        sock, loop = self._sock, self._loop
        if sock is None or loop is None:
            return
        loop.remove_reader(sock.fileno())
        if datagram_drain.fits(self._max):
            if self._drain is None:
                self._drain = SocketDrain(
                    sock.fileno(), self._max, self._hand_on_drained, credentials=True
                )
            if not self._paused:
                self._drain.watch(loop)
        elif not self._paused:
            loop.add_reader(sock.fileno(), self._on_readable)

    def _retire_drain(self) -> None:
        """End the drain thread, if one reads, handing on every datagram it read."""
        drain = self._drain  # kept while it hands on: what it holds counts for the marks
        if drain is None:
            return
        try:
            drain.stop()
        finally:
            self._times_drained += drain.position()[1]
            self._drain = None

    def watched_fds(self) -> list[int]:
        """The socket to probe for unread datagrams (none once closed)."""
        return [] if self._sock is None else [self._sock.fileno()]

    def mark_unread(self, readable: set[int]) -> list[Pending]:
        """The commit point's note of the datagrams queued now (``readable``: from poll),
        or read by a drain thread and not handed on yet."""
        if self._sock is None:
            return []
        held = self._drain is not None and self._drain.position()[0] > 0
        if not held and self._sock.fileno() not in readable:
            return []
        return [DatagramMark(self)]

    def _on_readable(self) -> None:
        assert self._sock is not None
        if self._runs_in_c:
            self._read_batched(self._sock, DATAGRAM_BURST, self.quota)
        elif self.quota is None:
            self._read(self._sock, DATAGRAM_BURST)
        else:
            self._read_metered(self._sock, DATAGRAM_BURST, self.quota)

    def _read(self, sock: socket.socket, limit: int) -> bool:
        """Read up to ``limit`` datagrams into the intake, each run of one sender in one
        call; True if the queue ran empty."""
        if DatagramReader is not None:
            return self._read_batched(sock, limit)
        if self._large:
            return self._read_large(sock, limit)
        # The pure reference of read_runs, inlined: one recvmsg_into per datagram (Python
        # has no recvmmsg), the ancillary buffer the one SCM_CREDENTIALS needs.
        recvmsg_into = sock.recvmsg_into
        buffers, view, max_size = self._buffers, self._view, self._max
        intake = self._intake
        burst: list[bytes] = []
        keep = burst.append
        uid: int | None = None  # the run's sender
        # The last datagram's ancillary data: while the next one's is equal (the same
        # process, or no credentials), it is the same sender and nothing is parsed.
        last: object = None
        read = 0
        drained = False
        try:
            while read < limit:
                try:
                    size, ancdata, _, _ = recvmsg_into(buffers, CREDENTIALS_SPACE, socket.MSG_TRUNC)
                except (BlockingIOError, InterruptedError):
                    drained = True
                    break
                read += 1
                if ancdata != last:
                    last = ancdata
                    sender = credentials_uid(ancdata)
                    if sender != uid:  # another uid: the run so far goes first
                        if burst:
                            intake.datagrams(burst, sender_client(uid))
                            burst = []
                            keep = burst.append
                        uid = sender
                if size <= max_size:
                    keep(bytes(view[:size]))
                    continue
                if burst:  # the ones before it first, in order
                    intake.datagrams(burst, sender_client(uid))
                    burst = []
                    keep = burst.append
                intake.datagram_too_large(size, bytes(view[: min(size, OVERSIZED_PREFIX)]))
        finally:
            # A run handed over as one burst: the intake counts and books once per burst.
            if burst:
                intake.datagrams(burst, sender_client(uid))
            self.datagrams_read += read
            if drained:
                self._times_drained += 1
        return drained

    def _read_large(self, sock: socket.socket, limit: int) -> bool:
        """:meth:`_read` from :data:`LARGE_DATAGRAM_BYTES` on: one datagram at a time,
        each sender named by the peek that takes its size (as the compiled one-at-a-time
        read does), consecutive datagrams of one uid handed on as one burst."""
        intake = self._intake
        burst: list[bytes] = []
        uid: int | None = None  # the run's sender
        read = 0
        drained = False
        try:
            while read < limit:
                try:
                    size, data, ancdata = self._receive_large(sock, CREDENTIALS_SPACE)
                except (BlockingIOError, InterruptedError):
                    drained = True
                    break
                read += 1
                sender = credentials_uid(ancdata)
                if burst and (len(data) != size or sender != uid):
                    intake.datagrams(burst, sender_client(uid))  # the ones before it first
                    burst = []
                uid = sender
                if len(data) == size:
                    burst.append(data)
                else:
                    intake.datagram_too_large(size, data)
        finally:
            if burst:
                intake.datagrams(burst, sender_client(uid))
            self.datagrams_read += read
            if drained:
                self._times_drained += 1
        return drained

    def _receive_large(
        self, sock: socket.socket, ancillary: int
    ) -> tuple[int, bytes, list[tuple[int, int, bytes]]]:
        """One datagram, from :data:`LARGE_DATAGRAM_BYTES` on: ``(its size, its bytes,
        its ancillary data)``, the bytes whole if their length is the size, else the
        prefix of one too large (or one there was no memory for: consumed all the same,
        so it is not met again). Its size is peeked first, its ancillary data (room for
        ``ancillary`` bytes) with it: the kernel gives a peek the datagram's own
        credentials, and nothing else reads the socket between the two calls. A large one
        is received into memory of its own size, taken now."""
        size, ancdata, _, _ = sock.recvmsg_into(self._buffers, ancillary, _PEEK_SIZE)
        if len(self._buffer) <= size <= self._max:
            with contextlib.suppress(MemoryError):  # raised before anything is consumed
                return size, sock.recv(size), ancdata
        size = sock.recv_into(self._buffer, len(self._buffer), socket.MSG_TRUNC)
        if size < len(self._buffer):
            return size, bytes(self._view[:size]), ancdata
        return size, bytes(self._view[:OVERSIZED_PREFIX]), ancdata

    def _read_batched(
        self, sock: socket.socket, limit: int, quota: DatagramQuota | None = None
    ) -> bool:
        """:meth:`_read` with recvmmsg (compiled): the same hand-over, in one call per
        64 datagrams, each run of one sender handed on in one call when none is too large
        (``quota``: judged per datagram; at shutdown, none)."""
        assert DatagramReader is not None
        if self._batch_reader is None or self._batch_reader[0] != sock.fileno():
            self._build_reader(sock)  # a socket of its own (shutdown's read, a test's)
        assert self._batch_reader is not None
        reader = self._batch_reader[1]
        assert isinstance(reader, DatagramReader)
        items, oversized, drained, runs = reader.read_runs(limit)
        try:
            self._hand_on(items, oversized, runs, quota)
        finally:
            if drained:
                self._times_drained += 1
        return drained

    def _hand_on_drained(self, items: Items, oversized: bool, runs: Runs) -> None:
        """A drain thread's burst: as the loop's reads hand theirs on (the thread kept
        each datagram's sender; the quota, if one is set, judged here)."""
        self._hand_on(items, oversized, runs, self.quota)

    def _hand_on(
        self, items: Items, oversized: bool, runs: Runs, quota: DatagramQuota | None = None
    ) -> None:
        """A burst of the compiled reads (the loop's or a drain thread's): each run of one
        sender (``runs``: [(uid or None, end)], None: the senders unnamed) handed on in one
        call, charged to its uid's share; with ``quota``, each datagram judged first."""
        try:
            if quota is not None:
                self._judge(items, runs, quota)
            elif runs is None:
                self._hand_on_run(items, oversized, DATAGRAM_CLIENT)
            elif len(runs) == 1:  # one sender: the whole burst, no copy
                self._hand_on_run(items, oversized, sender_client(runs[0][0]))
            else:
                start = 0
                for uid, end in runs:
                    self._hand_on_run(items[start:end], oversized, sender_client(uid))
                    start = end
        finally:
            self.datagrams_read += len(items)

    def _hand_on_run(self, items: Items, oversized: bool, client: object) -> None:
        """Datagrams of one client in one call when none is too large (``oversized``:
        whether any of the burst is), else whole ones between the ones too large."""
        intake = self._intake
        if not oversized:
            if items:
                intake.datagrams(items, client)  # type: ignore[arg-type]  # bytes only here
            return
        burst: list[bytes] = []
        for item in items:
            if isinstance(item, bytes):
                burst.append(item)
                continue
            if burst:  # the ones before it first, in order
                intake.datagrams(burst, client)
                burst = []
            intake.datagram_too_large(*item)
        if burst:
            intake.datagrams(burst, client)

    def _judge(self, items: Items, runs: Runs, quota: DatagramQuota) -> None:
        """Each datagram against its sender's quota, as the loop's metered read judges
        it (no uid: admitted); within it, charged to that uid's share, in runs
        (:class:`_SenderRuns`); over it, ``over_quota`` at the end of the burst."""
        intake, now = self._intake, self._clock()
        out = _SenderRuns(intake)
        over: list[bytes] = []
        start = 0
        try:
            for uid, end in runs if runs is not None else [(None, len(items))]:
                for item in items[start:end]:
                    if not isinstance(item, bytes):
                        out.flush()  # the ones before it first, in order
                        intake.datagram_too_large(*item)
                    elif uid is None or quota.admits(uid, now, len(item)):
                        out.add(item, uid)
                    else:
                        over.append(item)
                start = end
        finally:
            out.flush()
            if over:
                intake.over_quota(over)

    def _read_metered(self, sock: socket.socket, limit: int, quota: DatagramQuota) -> None:
        """:meth:`_read` with each sender's uid judged against ``quota`` and the datagrams
        within it charged to that uid's share, in runs (:class:`_SenderRuns`); those over
        it are handed to the intake's ``over_quota`` after the burst."""
        recvmsg_into = sock.recvmsg_into
        buffers, view, max_size = self._buffers, self._view, self._max
        intake, now = self._intake, self._clock()
        runs = _SenderRuns(intake)
        over: list[bytes] = []
        read = 0
        try:
            while read < limit:
                try:
                    if self._large:
                        size, data, ancdata = self._receive_large(sock, CREDENTIALS_SPACE)
                    else:
                        size, ancdata, _, _ = recvmsg_into(
                            buffers, CREDENTIALS_SPACE, socket.MSG_TRUNC
                        )
                        if size <= max_size:
                            data = bytes(view[:size])
                        else:  # what the buffer kept of it, at most the prefix
                            data = bytes(view[: min(size, OVERSIZED_PREFIX)])
                except (BlockingIOError, InterruptedError):
                    self._times_drained += 1
                    break
                read += 1
                if len(data) != size:
                    runs.flush()  # the ones before it first, in order
                    intake.datagram_too_large(size, data)
                    continue
                uid = credentials_uid(ancdata)
                if uid is None or quota.admits(uid, now, size):
                    runs.add(data, uid)
                else:
                    over.append(data)
        finally:
            runs.flush()
            if over:
                intake.over_quota(over)
            self.datagrams_read += read

    def pause(self) -> None:
        """Stop reading for now (a shutdown was requested, or backpressure): what clients
        send meanwhile waits in the socket (senders then meet a full queue), for
        :meth:`resume` or :meth:`close` to read."""
        self._paused = True
        if self._sock is not None and self._loop is not None:
            self._loop.remove_reader(self._sock.fileno())
        if self._drain is not None:  # it reads on until its bursts are full, then stops
            self._drain.unwatch()

    def resume(self) -> None:
        self._paused = False
        self._watch()

    def close(self) -> None:
        """Stop reading, hand the intake the datagrams already queued, close the socket and
        remove its file (a socket systemd passed: neither shut nor removed, what clients
        send from now on waits in it for the next daemon)."""
        sock, self._sock = self._sock, None
        if sock is None:
            return
        try:
            self._retire_drain()  # what it read first: it was read before the queue's rest
            if self._loop is not None:
                self._loop.remove_reader(sock.fileno())
            if not self.inherited:
                # From here a sender gets EPIPE; what is already queued stays readable.
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RD)
                remove_socket_file(self.path)
            if not self._read(sock, SHUTDOWN_DATAGRAMS_MAX):
                log.warning(
                    "more than %d datagrams queued at shutdown: the rest are %s",
                    SHUTDOWN_DATAGRAMS_MAX,
                    "left in systemd's socket" if self.inherited else "lost",
                )
        finally:
            sock.close()


def sender_client(uid: int | None) -> object:
    """The share a datagram is charged to: its sender's uid's (the one a stream client of
    that uid has), or, the uid unknown, every unnamed sender's (:data:`DATAGRAM_CLIENT`)."""
    return DATAGRAM_CLIENT if uid is None else uid_client(uid)


class _SenderRuns:
    """Whole datagrams handed to the intake as runs of one sender: consecutive datagrams
    of one uid go as one burst, charged to its share; a burst is handed on when the next
    datagram's uid differs (or at :meth:`flush`), so the intake meets them in the order
    read. Interleaved senders cost a burst each run (the intake books once per burst)."""

    __slots__ = ("_burst", "_intake", "_uid")

    def __init__(self, intake: Intake) -> None:
        self._intake = intake
        self._burst: list[bytes] = []
        self._uid: int | None = None

    def add(self, data: bytes, uid: int | None) -> None:
        if uid != self._uid and self._burst:
            self.flush()
        self._uid = uid
        self._burst.append(data)

    def flush(self) -> None:
        burst = self._burst
        if burst:
            self._burst = []
            self._intake.datagrams(burst, sender_client(self._uid))


def _new_reader(fd: int, max_msg_size: int, credentials: bool = False) -> object | None:
    """The compiled reader for ``maxDatagramMsgSize`` ``max_msg_size`` (None on the pure
    path), asking for each datagram's credentials if ``credentials``; ConfigError, naming
    the element, if it cannot be built."""
    if DatagramReader is None:
        return None
    try:
        return DatagramReader(fd, max_msg_size, credentials)
    except (ValueError, MemoryError) as error:
        raise ConfigError(
            f"maxDatagramMsgSize {max_msg_size}: the datagram reader cannot be built "
            f"({error or type(error).__name__})",
            MAX_SIZE_ELEMENT,
        ) from error
