"""What the daemon does when the memory pool runs short: the overload policy.

``discard`` (Dory's, the default): a message that finds the pool depleted is discarded
with reason ``no_memory``. ``backpressure`` (KIP-72's muting): the moment the pool is
depleted the inputs stop being read, so stream and TCP writers block on full socket
buffers and datagram writers meet a full queue; what was already read is kept (the pool
is charged anyway: the overshoot is one read burst), and reading resumes as soon as
deliveries give memory back. The time spent paused is counted. ``spool``: while memory
is short, each burst read is kept in the spool only (written ahead as always, not
admitted), and bursts are read back and admitted, in order, as deliveries free memory
(``Intake.admit_deferred``, driven by ``spool/lifecycle.py``): clients are never slowed, and the
spool's size cap bounds what waits. If the spool refuses a burst too, that burst meets
Dory's discard.

:class:`Overload` also gives the spool replay and the deferred bursts their pace:
:meth:`wait_for_room` returns once the pool has room, an event set by the pool itself,
never a polling loop.

Rule: what admission and the inputs do when the pool runs short (discard, pause every input
until memory is back, or keep bursts on disk) is decided by :class:`Overload` alone, from the
pool's depletion and recovery. (A stream connection's partial frame, not yet a message,
waits for room on its own: ``inputs/stream_connection.py``.)
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from typing import Protocol

from pydory.config.model import OverloadPolicy
from pydory.daemon.admission.intake import Intake
from pydory.daemon.books import counters as counter_names
from pydory.daemon.books.counters import Counters
from pydory.daemon.books.pool import MemoryPool

log = logging.getLogger(__name__)

__all__ = ["Overload", "Pausable"]


class Pausable(Protocol):
    """An input agent: the datagram socket or a stream listener with its connections."""

    def pause(self) -> None: ...
    def resume(self) -> None: ...


class Overload:
    """Applies the overload policy on the pool's depletion and recovery (loop thread)."""

    def __init__(
        self,
        policy: OverloadPolicy,
        pool: MemoryPool,
        intake: Intake,
        inputs: Callable[[], Iterable[Pausable]],
        counters: Counters,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``inputs`` lists the input agents open now; they are paused and resumed."""
        self.policy = policy
        self._pool = pool
        self._intake = intake
        self._inputs = inputs
        self._counters = counters
        self._clock = clock
        self._room = asyncio.Event()
        self._paused_since: float | None = None
        self._stopping = False
        self.paused_seconds_closed = 0.0
        if not pool.is_depleted:
            self._room.set()
        pool.watch(self._on_depleted, self._on_room)
        # Neither backpressure nor the spool policy discards a message already read for
        # memory; the spool policy keeps whole bursts on disk while memory is short.
        intake.hold_when_memory_short = policy is not OverloadPolicy.DISCARD
        intake.defer_when_memory_short = policy is OverloadPolicy.SPOOL

    @property
    def policy_name(self) -> str:
        """The policy as configured: discard, backpressure or spool."""
        return str(self.policy)

    @property
    def paused(self) -> bool:
        return self._paused_since is not None

    def paused_seconds(self) -> float:
        """Total time the inputs were paused for memory (a counter for /metrics)."""
        seconds = self.paused_seconds_closed
        if self._paused_since is not None:
            seconds += self._clock() - self._paused_since
        return seconds

    async def wait_for_room(self) -> None:
        """Return once the pool is not depleted."""
        await self._room.wait()

    def inputs_opened(self) -> None:
        """The inputs have just opened: if the pool is depleted already (a spool replay
        filled it before they existed), they start paused like the others would be."""
        if self.paused and not self._stopping:
            for source in self._inputs():
                source.pause()
            log.debug("memory pool depleted at start-up: inputs open paused")

    def stopping(self) -> None:
        """The daemon is shutting down: the inputs stay paused whatever memory does."""
        self._stopping = True

    def _on_depleted(self) -> None:
        self._room.clear()
        if self.policy is OverloadPolicy.BACKPRESSURE and not self.paused:
            self._paused_since = self._clock()
            self._counters.inc(counter_names.BACKPRESSURE_PAUSES)
            for source in self._inputs():
                source.pause()
            log.debug("memory pool depleted: inputs paused")

    def _on_room(self) -> None:
        self._room.set()
        since = self._paused_since
        if since is None:
            return
        self._paused_since = None
        paused_s = self._clock() - since
        self.paused_seconds_closed += paused_s
        self._counters.inc(counter_names.BACKPRESSURE_PAUSED_MS, round(paused_s * 1000))
        if self._stopping:
            return
        for source in self._inputs():
            source.resume()
        log.debug("memory pool has room: inputs resumed")
