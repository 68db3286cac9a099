"""Freed memory given back to the system when the daemon goes quiet (glibc's ``malloc_trim``).

Why: glibc returns freed heap memory to the system only from the top of its heap. What
start-up frees (the config's parse, the first metadata) and what a load frees (librdkafka's
copies of the messages, the pool's bytes) stays resident when a live chunk sits above it.
``malloc_trim(0)`` gives those free pages back. Measured (BENCHMARKS.md, "Session 16"):
idle after start-up 57.4 -> 56.3-56.6 MB; after 1,000,000 messages 61.6 -> 58.7 MB.

When: once at the end of start-up (``after_start_up``, before the daemon says it is
ready), and each time librdkafka has delivered everything it held after a load (the
dispatcher's ``on_quiet``), ``QUIET_DELAY_S`` later if it is still quiet then, at most
once per ``MIN_INTERVAL_S``: a trim walks the heap's free chunks on the loop, so a load
that stops and starts many times a second never pays it more often than that.

Rule: only :class:`HeapTrim` trims the heap, and only while the daemon holds no message
in librdkafka.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from pydory import hotpath

__all__ = ["MIN_INTERVAL_S", "QUIET_DELAY_S", "HeapTrim"]

log = logging.getLogger(__name__)

#: How long the daemon must stay quiet before a trim: a pause between two bursts of a
#: load is not the end of it.
QUIET_DELAY_S = 2.0
#: At most one trim per this many seconds.
MIN_INTERVAL_S = 30.0


class HeapTrim:
    """Trims the heap on the loop after the daemon went quiet (see the module's text)."""

    def __init__(
        self,
        busy: Callable[[], bool],
        trim: Callable[[], bool] = hotpath.trim_heap,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``busy()``: the daemon holds messages in librdkafka now; ``trim()``: give the
        free heap pages back (True if any were)."""
        self._busy = busy
        self._trim = trim
        self._clock = clock
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._last_trim: float | None = None
        #: Trims done (for the tests and the books of the curious).
        self.trims = 0

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def after_start_up(self) -> None:
        """Start-up is over: what it freed goes back now (or, if the spool's replay left
        messages in librdkafka, once they are delivered: their end calls ``quiet``)."""
        if not self._busy():
            self._trim_now()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._loop = None

    def quiet(self) -> None:
        """The daemon just went quiet: trim ``QUIET_DELAY_S`` from now (or as soon after
        as ``MIN_INTERVAL_S`` allows) if it is quiet then. One trim waits at a time."""
        if self._loop is None or self._timer is not None:
            return
        delay = QUIET_DELAY_S
        if self._last_trim is not None:
            delay = max(delay, self._last_trim + MIN_INTERVAL_S - self._clock())
        self._timer = self._loop.call_later(delay, self._trim_if_quiet)

    def _trim_if_quiet(self) -> None:
        self._timer = None
        if self._busy():
            return  # a load came back: its end calls quiet() again
        self._trim_now()

    def _trim_now(self) -> None:
        self._last_trim = self._clock()
        self.trims += 1
        released = self._trim()
        log.debug("heap trimmed (%s)", "pages given back" if released else "nothing to give")
