"""The KIP-72 memory pool: Dory's ``maxBuffer`` byte budget for messages held in memory.

Every message the daemon holds (from the moment an input agent reads it until Kafka
acknowledges it or it is discarded) is charged against one byte budget. The pool is
non-blocking: :meth:`MemoryPool.try_allocate` answers at once, and a refusal means the
caller discards the message (reason ``no_memory``) or stops reading from that client
(backpressure), never waits.

Over-allocation (KIP-72, "Implementation Concerns" 2): a request is granted while *any*
budget remains, even if it is larger than what remains. A strict pool would starve large
messages under a stream of small ones; the price is that outstanding bytes can exceed the
budget by less than the largest single message::

    used < budget + largest_size_ever_granted

That overshoot (and the bytes :meth:`MemoryPool.force_allocate` holds for the backpressure
policy) is the rule, not an accounting error: :attr:`used` stays exact, :attr:`available`
never goes below zero, and the bytes held above the budget are reported apart as
:attr:`over_budget` (docs/accounting.md, "The memory pool").

Sensors (KIP-72 "New Sensors"): :attr:`available`, :attr:`over_budget`, :attr:`used`, and
:meth:`percent_time_depleted`, the share of time the pool was depleted
(``available <= 0``), measured since the pool was created. For a sliding window, export
the cumulative :meth:`depleted_seconds` as a counter and let the monitoring system take
its rate (Prometheus: ``rate(pydory_pool_depleted_seconds_total[5m])``).

Partial stream frames (:func:`partial_frame_cost`): every byte a stream connection holds
for a frame still arriving counts against the same budget, and against its client's fair
share of it (:attr:`MemoryPool.shares`, ``books/shares.py``: no client can fill the pool
with frames it never completes). The first ``PARTIAL_FRAME_FREE_BYTES`` of a
connection's partial frame never wait for the pool (charged even when it is depleted);
beyond them a connection whose partial frame finds no room waits for
:meth:`MemoryPool.when_room`, and is closed if none comes in time
(``daemon/inputs/stream_connection.py``). The charge is released the moment the frame is
whole, just before the intake charges the message.

Single-threaded: driven from the daemon's event loop only, so there are no locks.

Rule: what a message costs the pool is decided here alone (:func:`message_cost`, and
:func:`partial_frame_cost` while it is still arriving on a stream): the intake charges it
at admission, delivery releases it at the message's outcome, and both compute it with the
same function.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from pydory.daemon.books.shares import ClientShares
from pydory.errors import PydoryError

__all__ = [
    "PARTIAL_FRAME_FREE_BYTES",
    "POOL_OVERHEAD_BYTES",
    "MemoryPool",
    "PoolReleaseError",
    "message_cost",
    "messages_cost",
    "partial_frame_cost",
    "pool_cost",
]

#: Bytes charged to the memory pool for a message besides its topic, key and value.
POOL_OVERHEAD_BYTES = 32
#: Bytes of a partial stream frame that never wait for the pool (charged all the same, even
#: when it is depleted), so that a client of ordinary messages (up to this size) never
#: waits on the pool for the tail of a read; its client's share bounds them (``shares``).
PARTIAL_FRAME_FREE_BYTES = 16 * 1024


def message_cost(topic: str, data_bytes: int) -> int:
    """Bytes a message holds in the memory pool from acceptance to its final outcome:
    its topic, ``data_bytes`` (its key and value), and a fixed overhead."""
    return len(topic) + data_bytes + POOL_OVERHEAD_BYTES


def messages_cost(topic: str, count: int, data_bytes: int) -> int:
    """:func:`message_cost` of ``count`` messages of ``topic`` holding ``data_bytes`` (their
    keys and values) in all."""
    return count * message_cost(topic, 0) + data_bytes


def partial_frame_cost(held_bytes: int) -> int:
    """Bytes a stream connection holding ``held_bytes`` of a frame still arriving owes the
    pool: all of them (none is held outside the budget)."""
    return held_bytes


def pool_cost(topic: str, key: bytes | None, value: bytes | None) -> int:
    """:func:`message_cost` of a message with this key and value."""
    return message_cost(topic, len(key or b"") + len(value or b""))


class PoolReleaseError(PydoryError):
    """More bytes were released than are outstanding.

    This is a bug in the daemon, not in a client: some code path released a message's
    bytes twice or released bytes it never allocated. The pool's books are now wrong;
    fix the caller. The pool state is left unchanged.
    """


class MemoryPool:
    """A non-blocking byte budget that over-allocates rather than starve large messages."""

    def __init__(self, budget_bytes: int, clock: Callable[[], float] = time.monotonic) -> None:
        """Create a full pool of ``budget_bytes`` (> 0); ``clock`` returns seconds."""
        if budget_bytes <= 0:
            raise ValueError(f"memory pool budget must be positive, got {budget_bytes}")
        self._budget = budget_bytes
        self._used = 0
        self._clock = clock
        self._created_at = clock()
        self._depleted_since: float | None = None
        self._depleted_seconds_closed = 0.0
        self._granted_count = 0
        self._refused_count = 0
        # Told when the pool becomes depleted and when it has room again (the
        # backpressure overload policy pauses and resumes the inputs on these).
        self._on_depleted: Callable[[], None] | None = None
        self._on_room: Callable[[], None] | None = None
        # One-shot: told once when the pool has room again (see when_room).
        self._room_waiters: dict[Callable[[], None], None] = {}
        #: Each client's fair share of this pool for what the inputs hold for it.
        self.shares = ClientShares(self)

    @property
    def budget(self) -> int:
        """The configured budget in bytes (Dory's ``maxBuffer``)."""
        return self._budget

    @property
    def used(self) -> int:
        """Bytes currently allocated and not yet released."""
        return self._used

    @property
    def available(self) -> int:
        """Bytes left of the budget: ``budget - used``, and 0 (never negative) while an
        over-allocation holds more than the budget (that excess is :attr:`over_budget`)."""
        return max(0, self._budget - self._used)

    @property
    def over_budget(self) -> int:
        """Bytes held above the budget (an over-allocation, or a forced charge): 0 normally."""
        return max(0, self._used - self._budget)

    @property
    def is_depleted(self) -> bool:
        """True when no further allocation would be granted (``available <= 0``)."""
        return self.available <= 0

    @property
    def granted_count(self) -> int:
        """How many :meth:`try_allocate` calls were granted."""
        return self._granted_count

    @property
    def refused_count(self) -> int:
        """How many :meth:`try_allocate` calls were refused for lack of memory."""
        return self._refused_count

    def try_allocate(self, size: int) -> bool:
        """Charge ``size`` bytes if any budget remains; return whether it was granted.

        Never blocks. A grant may take :attr:`used` above the budget (over-allocation,
        counted in :attr:`over_budget`).
        Every granted allocation must later be given back with :meth:`release`.
        """
        if size <= 0:
            raise ValueError(f"allocation size must be positive, got {size}")
        used = self._used
        if used >= self._budget:
            self._refused_count += 1
            return False
        used = self._used = used + size
        self._granted_count += 1
        if used >= self._budget:  # on the hot path: the depletion check, inlined
            self._note_depletion_state()
        return True

    def try_allocate_all(self, size: int, count: int) -> bool:
        """Charge ``count`` allocations of ``size`` bytes in all at once, only if every one
        of them would be granted without reaching the budget (else nothing is charged and
        the caller goes one by one); whether it was granted."""
        if size <= 0 or count <= 0:
            raise ValueError(f"allocation of {count} messages, {size} bytes: must be positive")
        if self._used + size >= self._budget:
            return False
        self._used += size
        self._granted_count += count
        return True

    def release(self, size: int) -> None:
        """Give back ``size`` bytes from an earlier granted allocation."""
        if size <= 0:
            raise ValueError(f"release size must be positive, got {size}")
        if size > self._used:
            raise PoolReleaseError(
                f"released {size} bytes but only {self._used} are outstanding "
                "(a double release or a release without allocation)"
            )
        self._used -= size
        if self._depleted_since is not None:
            self._note_depletion_state()

    def depleted_seconds(self) -> float:
        """Total seconds the pool has spent depleted since it was created."""
        seconds = self._depleted_seconds_closed
        if self._depleted_since is not None:
            seconds += self._clock() - self._depleted_since
        return seconds

    def percent_time_depleted(self) -> float:
        """Percentage (0-100) of the time since creation that the pool was depleted.

        KIP-72's ``MemoryPoolAvgDepletedPercent``: the share of time requests could not
        be read for lack of memory. Returns 0.0 before any time has passed.
        """
        elapsed = self._clock() - self._created_at
        if elapsed <= 0:
            return 0.0
        return 100.0 * self.depleted_seconds() / elapsed

    def resize(self, budget_bytes: int) -> None:
        """A config reload changed maxBuffer: the new budget applies from now on. Messages
        already held stay charged; if they exceed the new budget the pool is depleted
        until enough of them settle (the overload policy is told, as always)."""
        if budget_bytes <= 0:
            raise ValueError(f"memory pool budget must be positive, got {budget_bytes}")
        self._budget = budget_bytes
        self.shares.resized()  # the shares are the budget divided
        self._note_depletion_state()

    def watch(self, on_depleted: Callable[[], None], on_room: Callable[[], None]) -> None:
        """Call ``on_depleted`` when the pool becomes depleted, ``on_room`` when it has room
        again (both on the thread that allocates and releases: the event loop)."""
        self._on_depleted, self._on_room = on_depleted, on_room

    def when_room(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once, when the pool has room again (at once if it has room
        now); :meth:`cancel_when_room` withdraws it. Called after the ``watch`` callback,
        so the overload policy has resumed the inputs first."""
        if not self.is_depleted:
            callback()
            return
        self._room_waiters[callback] = None

    def cancel_when_room(self, callback: Callable[[], None]) -> None:
        """Withdraw a :meth:`when_room` callback (its waiter went away); no-op if none."""
        self._room_waiters.pop(callback, None)

    @property
    def room_waiters(self) -> int:
        """How many :meth:`when_room` callbacks wait now."""
        return len(self._room_waiters)

    def force_allocate(self, size: int) -> None:
        """Charge ``size`` bytes even if the pool is depleted: for a message already read
        whose client is about to be paused (backpressure), which must not be discarded.
        The overshoot is bounded by what the inputs read before they pause."""
        if size <= 0:
            raise ValueError(f"allocation size must be positive, got {size}")
        self._used += size
        self._granted_count += 1
        if self._used >= self._budget:
            self._note_depletion_state()

    def _note_depletion_state(self) -> None:
        """Open or close a depleted interval when the pool crosses ``available <= 0``."""
        if self.is_depleted and self._depleted_since is None:
            self._depleted_since = self._clock()
            if self._on_depleted is not None:
                self._on_depleted()
        elif not self.is_depleted and self._depleted_since is not None:
            self._depleted_seconds_closed += self._clock() - self._depleted_since
            self._depleted_since = None
            if self._on_room is not None:
                self._on_room()
            self._wake_room_waiters()

    def _wake_room_waiters(self) -> None:
        """Tell every :meth:`when_room` waiter, oldest first, while the room lasts (a waiter
        may use it up: the rest then keep waiting)."""
        waiters = self._room_waiters
        while waiters and not self.is_depleted:
            callback = next(iter(waiters))
            del waiters[callback]
            callback()
