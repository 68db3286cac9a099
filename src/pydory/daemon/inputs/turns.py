"""The loop's turns, shared between the busy stream connections of every client.

Every input gets its share of each turn of the event loop (one poll of the sockets and
the callbacks it wakes): the datagram input reads at most ``DATAGRAM_BURST`` datagrams
per turn (one readiness callback each), and the stream inputs together read at most
``TURN_READ_BYTES`` from their busy connections. A connection is *busy* when a read
filled its whole read buffer (``READ_BYTES``): its client may have more waiting, and
libuv would read it again and again (up to 32 times) before serving anything else.
Instead it pauses and waits in this queue; each turn the next busy *client* (a uid on
every transport, as the quotas and the pool's shares name it) reads again on its oldest
waiting connection, as many as the turn's budget allows, and the rest wait for the next
turn, in order: round robin between clients, then between a client's connections. A
connection whose read did not fill its buffer had nothing more waiting: it stays read as
its data comes, one read per turn at most.

Why: one unthrottled stream client read 256 KiB (thousands of messages, ~10 ms of work)
per turn, and four of them four times that, while a datagram sender, whose socket queue
holds only ``net.unix.max_dgram_qlen`` (10 here) datagrams, got those few read per turn:
950 datagrams/s beside one flooder, 406/s beside four, against 14,819/s alone
(BENCHMARKS.md, "Fair shares of the loop"). Now a turn reads a bounded amount whatever
the number of flooding connections, clients or stream inputs (one queue for the loop: a
flooder on TCP and one on the UNIX stream socket share one budget, issue 33), so the
turns come often and the datagram queue is emptied often; and a client's turns do not
grow with its connections (a busy client among N flooders' hundred connections gets one
turn in N + 1, not one in a hundred and one). The price is two ``epoll_ctl`` calls per
busy read, only under load, and smaller bursts for the intake.

Rule: per loop turn, the stream inputs read at most ``TURN_READ_BYTES`` from connections
that were busy, the clients in turn, each client's oldest waiter first.
"""

from __future__ import annotations

import asyncio
import weakref
from collections import deque
from collections.abc import Iterable
from typing import Protocol

__all__ = ["READ_BYTES", "TURN_READ_BYTES", "ReadTurns", "TakesTurns", "loop_turns"]

#: One read of a stream connection (its read buffer): a read this full may have left more.
#: Smaller reads cost more per message (each read is a burst for the intake and a poll of
#: the producers); 32 KiB cost nothing measurable (BENCHMARKS.md).
READ_BYTES = 32 * 1024
#: What the stream inputs read per loop turn from their busy connections, all together:
#: one read. 64 KiB (two reads) let four flooders take a datagram sender to 45 % of its
#: rate.
TURN_READ_BYTES = 32 * 1024
#: Busy connections read per turn.
CONNECTIONS_PER_TURN = TURN_READ_BYTES // READ_BYTES


class TakesTurns(Protocol):
    """A connection that can wait for its turn (paused) and take it (resumed)."""

    def pause(self) -> None: ...
    def take_turn(self) -> None: ...


class ReadTurns:
    """The busy connections of every stream input on one loop, by client, waiting for
    their turn (loop thread)."""

    __slots__ = ("__weakref__", "_clients", "_next_turn_handle")

    def __init__(self) -> None:
        #: Each busy client's waiting connections, oldest first; the dict's order is the
        #: clients' (a client that took its turn goes to the back).
        self._clients: dict[object, deque[TakesTurns]] = {}
        self._next_turn_handle: asyncio.Handle | None = None

    @property
    def waiting(self) -> int:
        """Busy connections waiting for a turn now."""
        return sum(len(connections) for connections in self._clients.values())

    def wait_for_turn(self, connection: TakesTurns, client: object) -> None:
        """``connection`` (of ``client``) filled its read buffer: pause it until its turn
        comes."""
        connection.pause()
        waiting = self._clients.get(client)
        if waiting is None:
            waiting = self._clients[client] = deque()
        waiting.append(connection)
        if self._next_turn_handle is None:
            self._next_turn_handle = asyncio.get_running_loop().call_soon(self._next_turn)

    def next_turn(self) -> list[TakesTurns]:
        """Whose turn it is now: the next clients' oldest waiting connections (no more
        than the turn's budget), taken out of the queue."""
        clients = self._clients
        turn: list[TakesTurns] = []
        for _ in range(min(CONNECTIONS_PER_TURN, len(clients))):
            client = next(iter(clients))
            waiting = clients.pop(client)
            turn.append(waiting.popleft())
            if waiting:
                clients[client] = waiting  # to the back: the other clients go first
        return turn

    def _next_turn(self) -> None:
        """A new turn of the loop: the connections whose turn it is read again (in this
        turn's poll); the others wait for the next turn."""
        self._next_turn_handle = None
        for connection in self.next_turn():
            connection.take_turn()
        if self._clients:
            # call_soon from a callback runs in the loop's next turn, after its poll.
            self._next_turn_handle = asyncio.get_running_loop().call_soon(self._next_turn)

    def withdraw(self, connections: Iterable[TakesTurns]) -> None:
        """An input closes: its connections take no more turns (they are drained and
        closed); the other inputs' keep theirs."""
        gone = set(map(id, connections))
        for client in list(self._clients):
            kept = deque(c for c in self._clients[client] if id(c) not in gone)
            if kept:
                self._clients[client] = kept
            else:
                del self._clients[client]
        if not self._clients and self._next_turn_handle is not None:
            self._next_turn_handle.cancel()
            self._next_turn_handle = None


_LOOP_TURNS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, ReadTurns] = (
    weakref.WeakKeyDictionary()
)


def loop_turns() -> ReadTurns:
    """The running loop's one :class:`ReadTurns` (every stream input on it shares it)."""
    loop = asyncio.get_running_loop()
    turns = _LOOP_TURNS.get(loop)
    if turns is None:
        turns = _LOOP_TURNS[loop] = ReadTurns()
    return turns
