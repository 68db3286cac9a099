"""Each client's share of the memory pool for what the inputs hold on its behalf.

A client is a uid on every stream transport (pydory.daemon.inputs.peers says who; a peer
the kernel cannot name is its connection alone; the datagram socket's senders are one
client, ``inputs/datagram.py``). What the inputs hold for a client before its messages
are whole (the partial frames of its stream connections, every byte of them) is charged
to the pool *and* to the client here; its accepted messages, from acceptance to their
outcome, are charged to the client here too (:meth:`ClientShares.hold`, by
``books/charges.py``; their pool bytes by the intake). A client may hold at most its
**fair share**::

    share = max(floor, budget // (clients holding memory + 1))

the pool divided between the clients that hold memory now, plus one more: the ``+ 1`` is
the room kept for a client not holding anything yet (KIP-72's pool, with Kafka's fair
share of a quota between the clients using it: seeds 001 and 004). So whatever one
client does, the others together always find at least ``budget // (n + 1)`` free for
their messages (n: the clients holding memory), half the pool while a single client
holds any: no client can fill the pool with bytes it never completes, and so none can
make another's message meet ``no_memory`` while the pool has room for it.

A client at or over its share has its next messages discarded (``no_memory``, by the
intake), and is not refused bytes it has sent (they are read already:
they are charged, and the pool's books stay exact), it is *paused*: its connections are
not read until it is under its share again (its own bytes wait in the kernel,
backpressure on its own connections), and one that waits longer than the stream input's
limit is closed (``inputs/stream_connection.py``). The inputs read no more for a client
than its :meth:`ClientShares.room` (one byte when it has none, so its connection learns
it and pauses), so a client exceeds its share by at most a byte per connection. A
share grows when a client stops holding memory (the divisor shrinks) and shrinks when one
starts; a client over a shrunken share keeps what it holds until its frames complete or
its connections close, and holds no more meanwhile.

The floor is two reads (``SHARE_FLOOR_BYTES``), or one whole frame of the largest size
the stream inputs accept when that is more (:meth:`ClientShares.admit_frames_up_to`): a
frame the config allows must always be able to complete, whatever the pool's size (a
Dory config with ``maxStreamMsgSize`` above half ``maxBuffer`` runs as it did).

Cost on the hot path: one dict lookup and a comparison per read that leaves a partial
frame, and the wake-ups only while someone waits (accepted messages: ``books/charges.py``).
The shares are recomputed only when the number of holders, the floor or the budget
changes, and :attr:`ClientShares.room_for_any` (the least room any client has) is kept
as the charges come and go, so a read while every client has room asks no client's entry
(BENCHMARKS.md, issue 30, "The read's share work trimmed").

Rule: whether a client may hold more of the pool (:meth:`ClientShares.charge`) is decided
here alone, by its fair share.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

__all__ = ["SHARE_FLOOR_BYTES", "ClientShares", "SharedPool"]

#: The smallest share a client is ever given, whatever the number of clients: two reads
#: (64 KiB), so a client of ordinary messages is never paused by the count of other
#: clients alone. Above ``budget // SHARE_FLOOR_BYTES - 1`` clients holding memory at
#: once, the floor may let them fill the pool together (a host has few uids).
SHARE_FLOOR_BYTES = 64 * 1024


class SharedPool(Protocol):
    """What the shares need of the memory pool (``books/pool.py``)."""

    @property
    def budget(self) -> int: ...
    def try_allocate(self, size: int) -> bool: ...
    def force_allocate(self, size: int) -> None: ...
    def release(self, size: int) -> None: ...
    def when_room(self, callback: Callable[[], None]) -> None: ...
    def cancel_when_room(self, callback: Callable[[], None]) -> None: ...


class ClientShares:
    """The bytes each client holds in the pool through the inputs, and its fair share
    (event loop thread only)."""

    __slots__ = (
        "_floor",
        "_held",
        "_newcomer_share",
        "_pool",
        "_share",
        "_total",
        "_waiters",
        "room_for_any",
    )

    def __init__(self, pool: SharedPool) -> None:
        self._pool = pool
        #: The smallest share (the module's formula).
        self._floor = SHARE_FLOOR_BYTES
        #: Bytes held now, by client (a client holding nothing has no entry).
        self._held: dict[object, int] = {}
        #: Their sum.
        self._total = 0
        #: Paused connections' callbacks, by client, oldest first.
        self._waiters: dict[object, dict[Callable[[], None], None]] = {}
        #: The share of a client holding memory, and of one not holding any yet (one
        #: holder more): the module's formula, recomputed by :meth:`_reshare` whenever the
        #: holders, the floor or the budget change.
        self._share = self._newcomer_share = 0
        #: Bytes every client may still take at least (<= each one's :meth:`room`): the
        #: newcomer's share less all that is held. Read on every stream read: while it is
        #: a read's size or more, the read needs no client's entry.
        self.room_for_any = 0
        self._reshare()

    def _reshare(self) -> None:
        """The holders, the floor or the budget changed: the shares with them."""
        floor, budget, holders = self._floor, self._pool.budget, len(self._held)
        self._share = max(floor, budget // (holders + 1))
        self._newcomer_share = newcomer = max(floor, budget // (holders + 2))
        self.room_for_any = newcomer - self._total

    def resized(self) -> None:
        """The pool's budget changed (``MemoryPool.resize``)."""
        self._reshare()

    @property
    def holders(self) -> int:
        """Clients holding memory now."""
        return len(self._held)

    def held(self, client: object) -> int:
        """Bytes ``client`` holds now."""
        return self._held.get(client, 0)

    def admit_frames_up_to(self, frame_bytes: int) -> None:
        """Let every client's share hold at least one frame of ``frame_bytes`` (the
        largest a stream input accepts), so that such a frame can always complete."""
        self._floor = max(SHARE_FLOOR_BYTES, frame_bytes)
        self._reshare()

    def share(self) -> int:
        """The most bytes a client may hold before it is paused (the module's formula)."""
        return self._share

    def largest_share(self) -> int:
        """The share a client holding memory alone has: more than this it can never hold
        (a partial frame this large can never be completed)."""
        return max(self._floor, self._pool.budget // 2)

    def room(self, client: object) -> int:
        """Bytes ``client`` may still take before it is at its share (<= 0: none); the
        inputs read no more than this for it (one byte when none is left, so a connection
        of a client at its share learns it with its next read and pauses)."""
        before = self._held.get(client)
        if before is None:
            return self._newcomer_share
        return self._share - before

    def charge(self, client: object, nbytes: int) -> bool:
        """Charge ``nbytes`` (> 0, read already) to ``client`` and to the pool; False if
        the client was at or over its share before it, or the pool refused them (charged
        all the same): the caller then stops reading for this client."""
        before = self._held.get(client, 0)
        self.hold(client, nbytes)  # (the rarer path: partial frames above 16 KiB)
        within = before < self._share
        pool = self._pool
        if not pool.try_allocate(nbytes):
            pool.force_allocate(nbytes)
            return False
        return within

    def charge_anyway(self, client: object, nbytes: int) -> bool:
        """:meth:`charge` where the pool's refusal is not the caller's concern (bytes
        within a connection's allowance); False only if the client is over its share."""
        # hold's books, written out: a call more per read costs more than they do.
        held = self._held
        before = held.get(client)
        self._total += nbytes
        if before is None:
            held[client] = nbytes
            self._reshare()  # one holder more: every share shrinks
            before = 0
        else:
            held[client] = before + nbytes
            self.room_for_any -= nbytes
        within = before < self._share
        pool = self._pool
        if not pool.try_allocate(nbytes):
            pool.force_allocate(nbytes)
        return within

    def release(self, client: object, nbytes: int) -> None:
        """Give back ``nbytes`` ``client`` held (its frame completed, or its connection
        ended); a paused client back under its share, or every paused client when a
        client stops holding (the shares grow), is told."""
        held = self._held
        left = held[client] - nbytes
        if left < 0:
            raise ValueError(f"client released {nbytes} bytes but held {held[client]}")
        self._pool.release(nbytes)
        if left and not self._waiters:  # _left's common case, written out (per read)
            held[client] = left
            self._total -= nbytes
            self.room_for_any += nbytes
            return
        self._left(client, left, nbytes)

    def hold(self, client: object, nbytes: int) -> None:
        """Charge ``client`` with ``nbytes`` (> 0) of messages it got accepted, which the
        intake charged to the pool already (``books/charges.py``): they count in its share
        until :meth:`let_go` gives them back with their pool bytes."""
        held = self._held
        before = held.get(client)
        self._total += nbytes
        if before is None:
            held[client] = nbytes
            self._reshare()  # one holder more: every share shrinks
        else:
            held[client] = before + nbytes
            self.room_for_any -= nbytes

    def let_go(self, client: object, nbytes: int) -> None:
        """:meth:`release` of bytes charged by :meth:`hold` (the pool's are released by
        whoever settled the messages): the same wake-ups."""
        held = self._held
        left = held[client] - nbytes
        if left < 0:
            raise ValueError(f"client let go of {nbytes} bytes but held {held[client]}")
        if left and not self._waiters:  # _left's common case, written out (per token)
            held[client] = left
            self._total -= nbytes
            self.room_for_any += nbytes
            return
        self._left(client, left, nbytes)

    def _left(self, client: object, left: int, given_back: int) -> None:
        """``client`` holds ``left`` bytes now, ``given_back`` fewer: wake whom that
        concerns."""
        held = self._held
        self._total -= given_back
        if left:
            held[client] = left
            self.room_for_any += given_back
            if self._waiters and client in self._waiters and left < self._share:
                self._wake(client)
        else:
            del held[client]
            self._reshare()  # one holder fewer: every share grows
            if self._waiters:
                self._wake_all()

    def when_room(self, client: object, callback: Callable[[], None]) -> None:
        """Call ``callback`` once, when ``client`` is under its share and the pool has
        room (at once if both hold now); :meth:`cancel_when_room` withdraws it."""
        if self.held(client) < self._share:
            self._pool.when_room(callback)
        else:
            self._waiters.setdefault(client, {})[callback] = None

    def cancel_when_room(self, client: object, callback: Callable[[], None]) -> None:
        """Withdraw a :meth:`when_room` callback (its connection went away); no-op if none."""
        waiting = self._waiters.get(client)
        if waiting is not None:
            waiting.pop(callback, None)
            if not waiting:
                del self._waiters[client]
        self._pool.cancel_when_room(callback)

    def largest_held(self) -> int:
        """The most bytes one client holds now (0: none holds any)."""
        return max(self._held.values(), default=0)

    @property
    def waiting(self) -> int:
        """Paused connections waiting for their client's share (not for the pool)."""
        return sum(len(callbacks) for callbacks in self._waiters.values())

    def _wake(self, client: object) -> None:
        """``client`` is under its share: its waiters now wait for the pool's room only."""
        for callback in self._waiters.pop(client, {}):
            self._pool.when_room(callback)

    def _wake_all(self) -> None:
        share = self.share()
        for client in [c for c in self._waiters if self.held(c) < share]:
            self._wake(client)
