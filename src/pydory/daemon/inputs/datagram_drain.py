"""The datagram socket drained by a thread of its own (issue 34, lever 1), and whether the
daemon uses one: the second implementation of the datagram input's reads, beside the loop's
reader callback in pydory.daemon.inputs.datagram (the reference).

Why: the kernel queues about 11 datagrams per UNIX datagram socket (``max_dgram_qlen``
10), so whenever the loop thread is off the CPU its datagram senders block, and each wake-up
of the loop finds 11-16 datagrams, paying every per-burst cost (the intake's, the spool's)
per 11. ``pydory._cwire.DatagramDrain`` is a C thread that never holds the GIL: it empties
the socket with ``recvmmsg`` into a bounded ring of bursts and tells the loop through an
eventfd; the loop takes one burst (at most :data:`DRAIN_BURST_DATAGRAMS`) per turn and hands
it to the intake exactly as the loop's reader does. When the ring is full (the loop is slow,
or the input is paused for backpressure) the thread stops reading and the kernel's queue
backs up, as with the loop's reader: backpressure is unchanged, only the queue is longer by
the ring (at most 4 bursts of 512 datagrams or 1 MiB each: memory outside the pool, like the
socket's receive buffer, since the pool is charged when the intake admits). Stopping joins
the thread, and what it read is handed on before the loop's reader reads what the kernel
still queues (order kept, nothing dropped).

It runs only where it fits: the compiled hot path and a ``maxDatagramMsgSize`` below 256
KiB (larger ones are read one at a time, peeked first). The thread keeps each datagram's
sender's uid (SCM_CREDENTIALS, asked of ``recvmmsg``) beside it, and ``take`` cuts each
burst into runs of one uid in C, so the loop charges each run to its sender's share of the
pool (issue 33, point 1) and judges a datagram quota, if one is set, as it hands the burst
on. It is ON by default there;
``PYDORY_DATAGRAM_DRAIN=0`` turns it off (read once, at import). The benchmarks favour it
(BENCHMARKS.md, "Issue 34, lever 1": 1.36x the loop reader's datagram rate at 0.91x its
CPU quiet, 2.4x beside four CPU hogs per core). What it costs: a SIGKILL loses what its
ring holds (:attr:`SocketDrain.capacity` datagrams at most: ``_cwire.DRAIN_BURSTS`` bursts
of :data:`DRAIN_BURST_DATAGRAMS`) beside the kernel's queue: read from the socket, never
received by the intake, so never acknowledged as accepted (the kill loop's bound counts it,
tests/test_spool_daemon.py; ``/books/json``'s ``datagram_input`` says which reader runs and
its ring). Tests run the datagram suites on it by setting :data:`DRAIN`
(tests/hotpaths.py's ``"drain"``), a benchmark through :func:`use`
(benchmarks/datagram_drain.py).

Rule: whether a datagram socket is drained by a thread is chosen here alone (`_choose`, or
a test's or benchmark's `use`).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from pydory import hotpath

if TYPE_CHECKING:
    from pydory import _cwire

__all__ = ["DRAIN", "DRAIN_VARIABLE", "WHY", "SocketDrain", "use"]

#: The environment variable that turns the drain thread off (``0``); on by default.
DRAIN_VARIABLE: Final = "PYDORY_DATAGRAM_DRAIN"
#: Datagrams per burst the loop takes in one turn (as the loop reader's ``DATAGRAM_BURST``).
DRAIN_BURST_DATAGRAMS: Final = 512
#: From this ``maxDatagramMsgSize`` on, datagrams are read by the loop (``_cwire.c``'s
#: ``SLOT_BYTES``; the drain's slots are of the limit's size).
DRAIN_MAX_SIZE_BELOW: Final = 256 * 1024

DrainType = type["_cwire.DatagramDrain"]
#: Items of a burst as ``DatagramReader.read`` gives them: bytes, or (size, prefix).
Items = list[bytes | tuple[int, bytes]]
#: The items' runs of one sender, [(uid or None, end)] (cut by the C), or None without
#: credentials.
Runs = list[tuple[int | None, int]] | None


def _choose() -> tuple[DrainType | None, str]:
    named = os.environ.get(DRAIN_VARIABLE, "")
    if named == "0":
        return None, f"{DRAIN_VARIABLE}=0"
    if hotpath.DatagramDrain is None:
        return None, "the compiled hot path is not here (the drain thread is part of it)"
    return hotpath.DatagramDrain, f"{DRAIN_VARIABLE}={named}" if named else "on by default"


DRAIN: DrainType | None
WHY: str
DRAIN, WHY = _choose()


def use(drain: DrainType | None) -> None:
    """From now on, datagram inputs started drain with ``drain`` (None: the loop reads)."""
    global DRAIN, WHY
    DRAIN, WHY = drain, "chosen by a test" if drain is not None else "off (a test)"


def fits(max_msg_size: int) -> bool:
    """Whether a socket of this limit is drained by a thread."""
    return DRAIN is not None and max_msg_size < DRAIN_MAX_SIZE_BELOW


class SocketDrain:
    """One socket's drain thread, seen from the loop: its bursts handed to ``on_burst``
    (items, whether any is oversized, their runs of one sender when ``credentials``: the
    socket then has SO_PASSCRED on) one per loop turn while watched."""

    def __init__(
        self,
        fd: int,
        max_msg_size: int,
        on_burst: Callable[[Items, bool, Runs], None],
        credentials: bool = False,
    ) -> None:
        assert DRAIN is not None
        self._drain = DRAIN(fd, max_msg_size, DRAIN_BURST_DATAGRAMS, credentials)
        self._on_burst = on_burst
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain.start()

    def watch(self, loop: asyncio.AbstractEventLoop) -> None:
        """Take bursts on ``loop`` as they come."""
        self._loop = loop
        loop.add_reader(self._drain.wake_fd, self._on_ready)

    def unwatch(self) -> None:
        """Take no more for now (pause): the thread reads until its ring is full."""
        if self._loop is not None:
            self._loop.remove_reader(self._drain.wake_fd)
            self._loop = None

    def _on_ready(self) -> None:
        self._take_one()

    def _take_one(self, stopped: bool = False) -> bool:
        """Hand on the oldest burst; False if there was none."""
        items, oversized, error, runs = self._drain.take()
        if items:
            self._on_burst(items, oversized, runs)
        if error and not stopped:  # once stopped, an error read nothing more
            # As the loop's reader raising in its callback: asyncio logs it; the thread
            # reads again now that the loop has been told.
            raise OSError(error, f"reading the datagram socket: {os.strerror(error)}")
        return bool(items)

    def stop(self) -> None:
        """End the thread (joined) and hand on every burst it read, in order."""
        self.unwatch()
        self._drain.stop()
        while self._take_one(stopped=True):
            pass

    def position(self) -> tuple[int, int]:
        """(datagrams read and not handed on yet, at most; the queue-empty moments whose
        datagrams were all handed on) for the commit point's marks."""
        return self._drain.position()

    @property
    def capacity(self) -> int:
        """The most datagrams the thread holds at once (read, not yet handed on): its
        ring's size, as the C counts it (``_cwire.DRAIN_BURSTS`` bursts)."""
        return self._drain.capacity

    def stats(self) -> dict[str, int]:
        """recvmmsg calls, datagrams, takes, waits for room, empty queues, lost."""
        return self._drain.stats()
