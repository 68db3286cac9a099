"""The loop's turns, shared between the busy connections of one stream input.

Every input gets its share of each turn of the event loop (one poll of the sockets and
the callbacks it wakes): the datagram input reads at most ``DATAGRAM_BURST`` datagrams
per turn (one readiness callback each), and a stream input reads at most
``TURN_READ_BYTES`` from its busy connections. A connection is *busy* when a read filled
its whole read buffer (``READ_BYTES``): its client may have more waiting, and libuv would
read it again and again (up to 32 times) before serving anything else. Instead it pauses
and waits in this queue; each turn the connections at its head read again, as many as the
turn's budget allows, and the rest wait for the next turn, in order (round robin). A
connection whose read did not fill its buffer had nothing more waiting: it stays read as
its data comes, one read per turn at most.

Why: one unthrottled stream client read 256 KiB (thousands of messages, ~10 ms of work)
per turn, and four of them four times that, while a datagram sender, whose socket queue
holds only ``net.unix.max_dgram_qlen`` (10 here) datagrams, got those few read per turn:
950 datagrams/s beside one flooder, 406/s beside four, against 14,819/s alone
(BENCHMARKS.md, "Fair shares of the loop"). Now a turn reads a bounded amount whatever
the number of flooding connections, so the turns come often and the datagram queue is
emptied often. The price is two ``epoll_ctl`` calls per busy read, only under load, and
smaller bursts for the intake.

Rule: per loop turn, a stream input reads at most ``TURN_READ_BYTES`` from connections
that were busy, oldest waiter first.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Protocol

__all__ = ["READ_BYTES", "TURN_READ_BYTES", "ReadTurns", "TakesTurns"]

#: One read of a stream connection (its read buffer): a read this full may have left more.
#: Smaller reads cost more per message (each read is a burst for the intake and a poll of
#: the producers); 32 KiB cost nothing measurable (BENCHMARKS.md).
READ_BYTES = 32 * 1024
#: What one stream input reads per loop turn from its busy connections, all together: one
#: read. 64 KiB (two reads) let four flooders take a datagram sender to 45 % of its rate.
TURN_READ_BYTES = 32 * 1024
#: Busy connections read per turn.
CONNECTIONS_PER_TURN = TURN_READ_BYTES // READ_BYTES


class TakesTurns(Protocol):
    """A connection that can wait for its turn (paused) and take it (resumed)."""

    def pause(self) -> None: ...
    def take_turn(self) -> None: ...


class ReadTurns:
    """The busy connections of one stream input, waiting for their turn (loop thread)."""

    __slots__ = ("_next_turn_handle", "_waiting")

    def __init__(self) -> None:
        self._waiting: deque[TakesTurns] = deque()
        self._next_turn_handle: asyncio.Handle | None = None

    @property
    def waiting(self) -> int:
        """Busy connections waiting for a turn now."""
        return len(self._waiting)

    def wait_for_turn(self, connection: TakesTurns) -> None:
        """``connection`` filled its read buffer: pause it until its turn comes."""
        connection.pause()
        self._waiting.append(connection)
        if self._next_turn_handle is None:
            self._next_turn_handle = asyncio.get_running_loop().call_soon(self._next_turn)

    def _next_turn(self) -> None:
        """A new turn of the loop: the connections at the head of the queue read again
        (in this turn's poll); the others wait for the next turn."""
        self._next_turn_handle = None
        waiting = self._waiting
        for _ in range(min(CONNECTIONS_PER_TURN, len(waiting))):
            waiting.popleft().take_turn()
        if waiting:
            # call_soon from a callback runs in the loop's next turn, after its poll.
            self._next_turn_handle = asyncio.get_running_loop().call_soon(self._next_turn)

    def close(self) -> None:
        """The input closes: no more turns (its connections are drained and closed)."""
        if self._next_turn_handle is not None:
            self._next_turn_handle.cancel()
            self._next_turn_handle = None
        self._waiting.clear()
