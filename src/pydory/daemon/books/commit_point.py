"""The commit point: a moment before which everything the daemon received is settled.

Definition (issue 4): the time T such that every message received before T has been
acknowledged by Kafka or reported as discarded. ``pydory wait`` and the long-poll
``/commit_point/json?after=`` let a short-lived script send, wait, and know its messages
are safe. docs/commit-point.md has the argument in full, and its limits.

"Received" means "in one of the daemon's input sockets", read yet or not: a client's
``send()`` returns once the kernel holds its bytes, and the daemon cannot tell when bytes
arrived, only what an input socket holds. So:

* An *input mark* (pydory.daemon.inputs.marks.mark_inputs) notes what every input socket
  holds at one instant: unread datagrams, bytes on each connection, connections not yet accepted. It
  is *reached* once the daemon has read all of that, whatever arrived since. The instant
  of the latest mark reached is the *quiet mark*: whatever the daemon reads from then on
  arrived after it. (With idle sockets a mark is reached the moment it is taken.)
* Accepted messages are counted in *generations*. A message is counted in the current
  generation, whose start is the quiet mark when its first message was read, so every
  message in it arrived after that start. When the quiet mark moves at least ``epoch_s``
  after the current generation began, a new one begins, so there are few generations (the
  tokens dispatch carries) however many messages flow.
* The commit point is the start of the oldest generation with unsettled messages, or
  the quiet mark when every message is settled. It never moves backwards.

A *sweep* checks the pending mark and takes a new one. Sweeps run when someone reads the
commit point, at most every ``epoch_s`` while messages flow (after the burst of reads in
progress), and every ``epoch_s`` while someone waits for a moment the quiet mark has not
reached. Settling the last message of the oldest generation wakes the waiters it
satisfies: no timer.

:class:`CommitPoint` is the logic (injectable clocks and input probe, no I/O of its own);
:mod:`pydory.status.commit_point` serves it on the status server.

Rule: when the commit point moves is decided by :class:`CommitPoint` alone, from the tokens
opened and closed and the input marks reached; no I/O.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from pydory.daemon.books.events import AccountingError

__all__ = [
    "EPOCH_S",
    "CommitPoint",
    "CommitPointView",
]

#: The shortest generation: the commit point's granularity while messages flow, and the
#: pause between sweeps while a waiter needs one.
EPOCH_S = 0.010
#: Beyond this many generations with unsettled messages (a long outage), the current
#: generation keeps growing instead: dispatch caches one callback per live token.
MAX_LIVE_GENERATIONS = 1000

#: The event loop's timer resolution: uvloop (libuv) keeps its timers in whole
#: milliseconds of a clock read once per turn of the loop, so a timer asked for less than
#: half a millisecond runs at the next turn, often before ``time.monotonic()`` has reached
#: it. A sweep that found itself early and asked again for what was left spun the loop
#: ~75 turns an epoch (a session-15 profile: 5,500 calls a second while messages flowed).
TIMER_RESOLUTION_S = 0.001

#: ``schedule(delay_s, callback)`` runs ``callback`` after ``delay_s`` seconds (0: after the
#: callbacks in progress); returns False if it cannot.
Schedule = Callable[[float, Callable[[], None]], bool]


class InputMark(Protocol):
    """What the input sockets held at one instant (pydory.daemon.inputs.marks.mark_inputs)."""

    def reached(self) -> bool:
        """Whether the daemon has read everything the sockets held at that instant."""
        ...


class _NoInputs:
    """The mark of a daemon without input sockets: nothing to read, ever."""

    def reached(self) -> bool:
        return True


@dataclass(frozen=True, slots=True)
class _PendingMark:
    taken_at: float  # monotonic seconds
    mark: InputMark


def _on_running_loop(delay_s: float, callback: Callable[[], None]) -> bool:
    """Schedule ``callback`` on the running event loop. Outside an event loop, don't:
    sweeps then happen only when the commit point is read or waited for."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return False
    if delay_s > 0:
        loop.call_later(delay_s, callback)
    else:
        loop.call_soon(callback)
    return True


@dataclass(slots=True)
class _Generation:
    """Messages read after ``start`` (monotonic seconds) and not yet settled."""

    id: int
    start: float
    open: int = 0


@dataclass(order=True)
class _Waiter:
    target: float  # monotonic seconds the commit point must reach
    seq: int
    future: asyncio.Future[bool] = field(compare=False)


@dataclass(frozen=True, slots=True)
class CommitPointView:
    """One reading of the commit point, in wall-clock seconds since the epoch."""

    now: float
    commit_point: float
    open_messages: int

    @property
    def lag_s(self) -> float:
        """How far the commit point is behind now."""
        return max(0.0, self.now - self.commit_point)


class CommitPoint:
    """Counts unsettled messages per generation; knows the commit point; wakes waiters.

    Used on the event loop thread only: the intake calls :meth:`open` when it accepts a
    message (or holds it for topic autocreation) and the delivery ledger calls
    :meth:`close` with that token when the message is delivered or discarded.
    """

    def __init__(
        self,
        mark_inputs: Callable[[], InputMark] = _NoInputs,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        epoch_s: float = EPOCH_S,
        schedule: Schedule = _on_running_loop,
        max_live_generations: int = MAX_LIVE_GENERATIONS,
    ) -> None:
        """``mark_inputs`` marks what the input sockets hold now;
        ``clock`` is monotonic, ``wall_clock`` only maps it to epoch seconds for display;
        ``schedule`` runs the sweeps that accepting messages calls for."""
        self._mark_inputs = mark_inputs
        self._clock = clock
        self._wall_clock = wall_clock
        self._epoch_s = epoch_s
        self._schedule = schedule
        self._max_live = max_live_generations
        now = clock()
        # Nothing was received before the daemon existed: creation is the first quiet mark.
        self._quiet_mark = now
        self._last_sweep = now
        self._sweep_scheduled = False
        self._pending_mark: _PendingMark | None = None
        self._ids = itertools.count(1)
        self._current = _Generation(next(self._ids), now)
        # Live generations in id order, which is start order: the oldest is the first.
        self._live: dict[int, _Generation] = {}
        self._waiters: list[_Waiter] = []
        self._waiter_seq = itertools.count()
        self._retry: asyncio.TimerHandle | None = None
        self._released = False

    # -- the intake and the ledger (hot path) -----------------------------------------------

    def open(self, n: int = 1) -> int:
        """``n`` messages were accepted (or read and kept for later): count them, and
        return their token for :meth:`close`."""
        generation = self._current
        if generation.open == 0:
            # Whatever is read now arrived after the latest quiet mark: the tightest start.
            generation.start = self._quiet_mark
            self._live[generation.id] = generation
        generation.open += n
        if not self._sweep_scheduled:  # no clock read here: it costs as much as the rest
            self._sweep_scheduled = self._schedule(0.0, self._scheduled_sweep)
        return generation.id

    def close(self, token: int, n: int = 1) -> None:
        """``n`` messages counted under ``token`` are settled (delivered or discarded)."""
        generation = self._live.get(token)
        if generation is None or n > generation.open:
            raise AccountingError(
                f"commit point: {n} message(s) settled under token {token}, "
                f"but only {0 if generation is None else generation.open} unsettled"
            )
        generation.open -= n
        if generation.open:
            return
        del self._live[token]
        if self._waiters and (not self._live or next(iter(self._live)) > token):
            self._wake_waiters()  # the oldest generation is gone: the commit point moved

    def keep(self, token: int, n: int = 1) -> None:
        """``n`` messages counted under ``token`` stay for the next start (in the spool,
        when there is one): this run no longer waits for them, as if settled."""
        self.close(token, n)

    # -- reading it -----------------------------------------------------------------------

    @property
    def shutting_down(self) -> bool:
        """True once :meth:`release_waiters` ran: waiting no longer makes sense."""
        return self._released

    @property
    def waiters(self) -> int:
        """Calls to :meth:`wait_past` in progress."""
        return len(self._waiters)

    @property
    def open_messages(self) -> int:
        """Messages accepted and not yet settled."""
        return sum(generation.open for generation in self._live.values())

    def sweep(self) -> bool:
        """Move the quiet mark as far as the inputs allow: to the pending input mark if
        the daemon has read what it noted, then to now if a new mark is reached at once.
        Returns whether the quiet mark moved."""
        now = self._last_sweep = self._clock()
        quiet = None
        pending = self._pending_mark
        if pending is not None and pending.mark.reached():
            quiet, pending = pending.taken_at, None
        if pending is None:
            mark = self._mark_inputs()
            if mark.reached():
                quiet = now
            else:
                pending = _PendingMark(now, mark)
        self._pending_mark = pending
        if quiet is None:
            return False
        self._quiet_mark = quiet
        current = self._current
        if current.open and len(self._live) < self._max_live:
            # A waiter whose moment the quiet mark just passed must not wait for messages
            # read from now on: they go to a new generation.
            waiter_needs_it = (
                bool(self._waiters) and current.start < self._waiters[0].target <= quiet
            )
            if waiter_needs_it or quiet - current.start >= self._epoch_s:
                self._current = _Generation(next(self._ids), quiet)
        if self._waiters:
            self._wake_waiters()
        return True

    def current(self, sweep: bool = True) -> CommitPointView:
        """The commit point now (after a sweep, unless ``sweep`` is False)."""
        if sweep:
            self.sweep()
        now = self._clock()
        return CommitPointView(
            now=self._to_wall(now, now),
            commit_point=self._to_wall(self._monotonic_value(), now),
            open_messages=self.open_messages,
        )

    def _monotonic_value(self) -> float:
        if self._live:
            return next(iter(self._live.values())).start
        return self._quiet_mark

    def _to_wall(self, monotonic_s: float, now: float) -> float:
        # Through "now" on both clocks, so that a step of the wall clock since start-up
        # shifts the commit point with it instead of stretching the lag.
        return self._wall_clock() - (now - monotonic_s)

    def wall_now(self) -> float:
        """Now, in epoch seconds (the wall clock this commit point reports in)."""
        return self._wall_clock()

    def to_monotonic(self, wall_s: float) -> float:
        """A wall-clock moment on this commit point's monotonic clock."""
        return self._clock() - (self._wall_clock() - wall_s)

    # -- waiting --------------------------------------------------------------------------

    async def wait_past(self, wall_s: float | None, timeout_s: float) -> bool:
        """Wait until the commit point reaches ``wall_s`` (epoch seconds; None: now).

        True once it has; False after ``timeout_s`` or if the daemon is shutting down.
        """
        target = self._clock() if wall_s is None else self.to_monotonic(wall_s)
        return await self._wait_monotonic(target, timeout_s)

    async def _wait_monotonic(self, target: float, timeout_s: float) -> bool:
        if self._released:
            return False
        self.sweep()
        if self._monotonic_value() >= target:
            return True
        waiter = _Waiter(target, next(self._waiter_seq), asyncio.get_running_loop().create_future())
        heapq.heappush(self._waiters, waiter)
        self._arm_retry()
        try:
            async with asyncio.timeout(timeout_s):
                return await waiter.future
        except TimeoutError:
            return False
        finally:
            self._forget(waiter)

    def release_waiters(self) -> None:
        """Shutdown: answer every waiter "not passed" now, and any later one at once."""
        self._released = True
        for waiter in self._waiters:
            if not waiter.future.done():
                waiter.future.set_result(False)

    def _wake_waiters(self) -> None:
        value = self._monotonic_value()
        waiters = self._waiters
        while waiters and waiters[0].target <= value:
            waiter = heapq.heappop(waiters)
            if not waiter.future.done():
                waiter.future.set_result(True)
        if not waiters and self._retry is not None:
            self._retry.cancel()
            self._retry = None

    def _forget(self, waiter: _Waiter) -> None:
        with contextlib.suppress(ValueError):
            self._waiters.remove(waiter)
            heapq.heapify(self._waiters)
        if not self._waiters and self._retry is not None:
            self._retry.cancel()
            self._retry = None

    # -- sweeps ---------------------------------------------------------------------------

    def _scheduled_sweep(self) -> None:
        """After a burst of reads: sweep, or, if the last sweep was under an epoch ago,
        sweep when the epoch is over (so at most one sweep per epoch while messages flow)."""
        early_by = self._last_sweep + self._epoch_s - self._clock()
        # Never less than the loop's resolution: asked for less, the timer comes back
        # early again at once (TIMER_RESOLUTION_S), so the sweep may come up to that late.
        if early_by > 0 and self._schedule(
            max(early_by, TIMER_RESOLUTION_S), self._scheduled_sweep
        ):
            return
        self._sweep_scheduled = False
        self.sweep()

    def _arm_retry(self) -> None:
        """While a waiter's moment is past the quiet mark, sweep every epoch: only a sweep
        can show that nothing received before that moment is still unread."""
        if self._retry is not None or not self._waiters:
            return
        earliest = self._waiters[0].target
        if earliest <= self._quiet_mark:
            return  # settlements will wake it
        delay = max(self._epoch_s, earliest - self._clock())
        self._retry = asyncio.get_running_loop().call_later(delay, self._retry_sweep)

    def _retry_sweep(self) -> None:
        self._retry = None
        self.sweep()
        self._arm_retry()
