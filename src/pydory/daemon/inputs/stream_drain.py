"""The UNIX stream connections read by a thread of their own (issue 34, lever 1, for the
streams), and whether the daemon uses one: the second implementation of a stream
connection's reads, beside its transport's (the reference, pydory.daemon.inputs
.stream_connection).

Why: one message per write is one skb per message, and ``read(2)`` frees each in the
kernel: 61-74 of the loop thread's ~170 clock ticks on "UNIX stream, 1 per write"
(ARCHITECTURE.md). ``pydory._cwire.StreamDrain`` is a C thread that never holds the GIL: it
reads every connection handed to it (a duplicate of its socket) into a bounded pool of
chunks (at most ``capacity`` bytes for the input, ``connection_capacity`` for one
connection: memory outside the pool, like the socket's buffer it extends, since the pool is
charged when the intake admits) and tells the loop through an eventfd; each loop turn,
every connection holding bytes takes at most a read's worth (``READ_BYTES``, or its
client's room) and hands it to its own ``FrameReader``, exactly as a read of its transport
does. A paused connection is neither read by the thread nor taken from (its kernel buffer
fills, its sender blocks), as with ``pause_reading``. A close first takes the connection
out of the thread, with what it holds (fed first at a shutdown: nothing read is dropped).

What a SIGKILL costs with it on: the bytes the thread holds, at most :attr:`capacity`
(read from the kernel, never handed to the intake, so never counted as received), at most
``connection_capacity`` of one connection: ``/books/json``'s ``stream_input`` says so, and
the kill loop (tests/test_spool_daemon.py, rule (d)) counts it in its bound.

It is ON by default on the compiled hot path, for the UNIX stream input (session 16:
1.1-1.45x the rate of UNIX stream 1/write on two cores, 1.24-2.95x beside CPU hogs;
BENCHMARKS.md); ``PYDORY_STREAM_DRAIN=0`` turns it off (read once, at import). Tests
choose it through :func:`use`.

Rule: whether UNIX stream connections are read by a thread is chosen here alone
(`_choose`, or a test's `use`).
"""

from __future__ import annotations

import asyncio
import os
from typing import TYPE_CHECKING, Final, Protocol

from pydory import hotpath

if TYPE_CHECKING:
    from pydory import _cwire

__all__ = ["DRAIN", "DRAIN_VARIABLE", "WHY", "ConnectionsDrain", "use"]

#: The environment variable that turns the drain thread off (``0``); on by default.
DRAIN_VARIABLE: Final = "PYDORY_STREAM_DRAIN"

DrainType = type["_cwire.StreamDrain"]


def _choose() -> tuple[DrainType | None, str]:
    named = os.environ.get(DRAIN_VARIABLE, "")
    if named == "0":
        return None, f"{DRAIN_VARIABLE}=0"
    if hotpath.StreamDrain is None:
        return None, "the compiled hot path is not here (the drain thread is part of it)"
    return hotpath.StreamDrain, f"{DRAIN_VARIABLE}={named}" if named else "on by default"


DRAIN: DrainType | None
WHY: str
DRAIN, WHY = _choose()


def use(drain: DrainType | None) -> None:
    """From now on, UNIX stream inputs started read with ``drain`` (None: transports)."""
    global DRAIN, WHY
    DRAIN, WHY = drain, "chosen by a test" if drain is not None else "off (a test)"


class Drained(Protocol):
    """A connection the drain reads (pydory.daemon.inputs.stream_connection)."""

    def take_drained(self) -> None: ...


class ConnectionsDrain:
    """One stream input's drain thread, seen from the loop: connections are added at their
    first read, and each holding bytes takes them once a loop turn."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        assert DRAIN is not None
        self._drain = DRAIN()
        self._connections: dict[int, Drained] = {}
        self._loop: asyncio.AbstractEventLoop | None = loop
        self._drain.start()
        loop.add_reader(self._drain.wake_fd, self._on_ready)

    def add(self, fd: int, connection: Drained, paused: bool) -> int:
        """The thread reads ``fd`` from now on (its transport must read it no more)."""
        token = self._drain.add(fd, paused)
        self._connections[token] = connection
        return token

    def remove(self, token: int) -> tuple[bytes, int | None]:
        """The thread reads it no more: what it held, and its end if not handed yet."""
        self._connections.pop(token, None)
        return self._drain.remove(token)

    def take(self, token: int, limit: int) -> tuple[bytes, int | None]:
        return self._drain.take(token, limit)

    def pause(self, token: int) -> None:
        self._drain.pause(token)

    def resume(self, token: int) -> None:
        self._drain.resume(token)

    def unread(self, token: int) -> int:
        """Its bytes not handed on yet: in the kernel and held by the thread."""
        return self._drain.unread(token)

    def _on_ready(self) -> None:
        connections = self._connections
        for token in self._drain.ready():
            connection = connections.get(token)
            if connection is not None:
                connection.take_drained()

    def close(self) -> None:
        """End the thread (joined); called once every connection is removed."""
        if self._loop is not None:
            self._loop.remove_reader(self._drain.wake_fd)
            self._loop = None
        self._drain.stop()

    @property
    def capacity(self) -> int:
        return self._drain.capacity

    @property
    def connection_capacity(self) -> int:
        return self._drain.connection_capacity

    def stats(self) -> dict[str, int]:
        return self._drain.stats()
