"""Accepted messages charged to their client's share, from acceptance to their outcome.

A message a client got accepted holds pool bytes until its final outcome (delivered,
discarded, possibly delivered, left for the next start), waiting for Kafka, in
librdkafka's queues or in the waiting room. Those bytes count in its client's fair share
(``books/shares.py``) as its partial frames do, so a client whose messages queue (Kafka
slow, a topic without metadata) reaches its share and no further: its next messages are
``no_memory`` discards while another client still finds room.

The client travels with the message **in its token**: every accepted message already
carries the commit point's (or the write-ahead's) token to its outcome, through the
producers (an opaque ``long long`` in C) and back in every delivery report, per token
summed. :class:`ClientTokens` stands in front of those tokens and writes the client's
*slot* into the token's low ``SLOT_BITS``, the generation moved up to make room and the
write-ahead's segment left where it is::

    token = segment << 48 | generation << SLOT_BITS | slot

so a token still orders as the one it wraps (segment, then generation), ``in_spool``
reads it unchanged, and the reports summed per token are summed per client. Where the
pool bytes of a token's messages are released, :meth:`ClientTokens.released` gives them
back to the slot's client. Slot 0 is no client: a spool replay's messages (read by an
earlier run: their senders are not known; they are charged to the pool only, paced by
its room) and a deferred burst's. A slot is taken by a client's first accepted message
and given back when its last one settles, so 4,095 clients can hold messages at once;
beyond that the others share the last slot (one share between them).

Cost on the hot path: a share check and a charge (a few dict lookups) per message on
the reference path, per topic of a burst on the burst path (which takes a burst only if
the client's share has room for all of it, as the reference would), and a give-back per
token of a batch of acknowledgements; a token costs nothing more to carry. The share
checks ask ``ClientShares.room_for_any`` first (no lookup while every client has room).

Rule: which client an accepted message's bytes are charged to, and when they are given
back, is decided by :class:`ClientTokens` alone, from the slot in its token.
"""

from __future__ import annotations

from typing import Protocol

from pydory.daemon.books.shares import ClientShares

__all__ = ["SLOT_BITS", "SLOT_MASK", "ClientTokens", "TokenCharges"]

#: Bits of a token naming its client's slot (0: none).
SLOT_BITS = 12
SLOT_MASK = (1 << SLOT_BITS) - 1
#: The write-ahead's segment sits above this bit (``spool/write_ahead.py``'s
#: ``SEGMENT_SHIFT``, held equal by tests/test_client_charges.py); the generation below.
_SEGMENT_SHIFT = 48
_GENERATION_MASK = (1 << _SEGMENT_SHIFT) - 1
_SEGMENT_BITS = ~_GENERATION_MASK
#: The largest generation a token can carry with its slot (at most 100 generations a
#: second: 21 years of them).
MAX_GENERATION = (1 << (_SEGMENT_SHIFT - SLOT_BITS)) - 1
#: The client of the last slot when every other is taken: the clients beyond 4,094.
MORE_CLIENTS = "(more clients)"


class InnerTokens(Protocol):
    """The tokens wrapped: the commit point's, or the write-ahead's."""

    def open(self, n: int = 1) -> int: ...
    def close(self, token: int, n: int = 1) -> None: ...
    def keep(self, token: int, n: int = 1) -> None: ...


class InnerTallies(Protocol):
    def settled_as(self, token: int, topic: str, outcome: str, n: int = 1) -> None: ...


class TokenCharges(Protocol):
    """Where the pool bytes of a token's messages are given back to its client."""

    def released(self, token: int, cost: int) -> None: ...


class ClientTokens:
    """Tokens that name their client's slot; the client's charges per slot (event loop
    thread only)."""

    __slots__ = ("_bytes", "_clients", "_free", "_inner", "_shares", "_slots", "_tallies", "client")

    def __init__(
        self, inner: InnerTokens, shares: ClientShares, tallies: InnerTallies | None = None
    ) -> None:
        self._inner = inner
        self._tallies = tallies
        self._shares = shares
        #: The client whose burst is admitted now (set by the intake; None: no client).
        self.client: object | None = None
        self._slots: dict[object, int] = {}
        self._clients: dict[int, object] = {}
        self._bytes: dict[int, int] = {}  # bytes of accepted messages held, per slot
        self._free = list(range(SLOT_MASK, 0, -1))  # the smallest slot taken first

    def admits(self) -> bool:
        """Whether the current client is under its share (no client: always): asked per
        message on the reference path, so every client's least room is asked first."""
        return self.client is None or self._shares.room_for_any > 0 or self.room() > 0

    def has_room(self, nbytes: int) -> bool:
        """Whether the current client may hold more than ``nbytes`` more (``room() >
        nbytes``; no client: always), every client's least room asked first (per burst)."""
        return self.client is None or self._shares.room_for_any > nbytes or self.room() > nbytes

    def room(self) -> int:
        """Bytes the current client may still hold (no client: any number)."""
        client = self.client
        if client is None:
            return 1 << 62
        slot = self._slots.get(client)
        return self._shares.room(client if slot is None else self._clients[slot])

    def open(self, n: int = 1, cost: int = 0) -> int:
        """``n`` messages of the current client holding ``cost`` pool bytes in all were
        accepted: charged to it, their token naming it."""
        inner = self._inner.open(n)
        generation = inner & _GENERATION_MASK
        if generation > MAX_GENERATION:
            raise OverflowError(f"commit point generation {generation} beyond a token's room")
        client = self.client
        slot = 0
        if client is not None and cost > 0:
            slot = self._slots.get(client) or self._take_slot(client)
            self._bytes[slot] += cost
            self._shares.hold(self._clients[slot], cost)
        return (inner & _SEGMENT_BITS) | (generation << SLOT_BITS) | slot

    def _take_slot(self, client: object) -> int:
        if self._free:
            slot = self._free.pop()
            self._clients[slot] = client
            self._bytes[slot] = 0
        else:  # every slot taken: the newcomers share the last one
            slot = self._free_slot_of_more()
        self._slots[client] = slot
        return slot

    def _free_slot_of_more(self) -> int:
        if SLOT_MASK not in self._clients:  # cannot happen: the last slot goes last
            self._clients[SLOT_MASK], self._bytes[SLOT_MASK] = MORE_CLIENTS, 0
        clients = self._clients
        if clients[SLOT_MASK] != MORE_CLIENTS:
            # Its own client keeps its charges; the slot now names the crowd for both.
            owner = clients[SLOT_MASK]
            self._shares.let_go(owner, self._bytes[SLOT_MASK])
            self._shares.hold(MORE_CLIENTS, self._bytes[SLOT_MASK])
            clients[SLOT_MASK] = MORE_CLIENTS
        return SLOT_MASK

    def released(self, token: int, cost: int) -> None:
        """The pool bytes (``cost``) of messages under ``token`` were released: given
        back to its client too."""
        slot = token & SLOT_MASK
        if not slot:
            return
        left = self._bytes[slot] - cost
        if left < 0:
            raise ValueError(f"slot {slot} gave back {cost} bytes but held {self._bytes[slot]}")
        client = self._clients[slot]
        self._shares.let_go(client, cost)
        if left:
            self._bytes[slot] = left
            return
        del self._bytes[slot], self._clients[slot]
        for name in [name for name, taken in self._slots.items() if taken == slot]:
            del self._slots[name]
        self._free.append(slot)

    @staticmethod
    def inner(token: int) -> int:
        """The wrapped token ``token`` was made of."""
        return (token & _SEGMENT_BITS) | ((token & _GENERATION_MASK) >> SLOT_BITS)

    def close(self, token: int, n: int = 1) -> None:
        # inner(token), written out: a close per token of every batch of reports.
        self._inner.close((token & _SEGMENT_BITS) | ((token & _GENERATION_MASK) >> SLOT_BITS), n)

    def keep(self, token: int, n: int = 1) -> None:
        self._inner.keep(self.inner(token), n)

    def settled_as(self, token: int, topic: str, outcome: str, n: int = 1) -> None:
        if self._tallies is not None:
            self._tallies.settled_as(self.inner(token), topic, outcome, n)

    @property
    def charged(self) -> int:
        """Bytes of accepted messages charged to clients now."""
        return sum(self._bytes.values())
