"""Log lines that repeat, let through once per interval with a count of those held back.

A client decides how often some lines are logged: a framing error, a datagram too
large, a connection refused or set up wrong, each comes again as fast as the client
sends it (one client made 21,122 ERROR lines, 3.6 MB, in 10 s). librdkafka repeats its
lines for as long as a broker is down. Both go through one limiter, :class:`RepeatGate`
(pure logic, the clock passed in): of the events of one kind (a key), the first is let
through, then none until ``interval_s`` has passed since; the next one let through says
how many were held back meanwhile. The keys it remembers are bounded: past
``max_keys`` it starts afresh (each kind then comes through once more, never more
often than once per interval per key, since a flood of one kind keeps one key).

:class:`ClientLines` is the logger of a module whose lines a client's bytes reach: each
call names its kind (a fixed string: the class of error, never client text), and the
counters keep the exact numbers (the line says which). ``logsetup.RepeatedLines`` keys
librdkafka's lines by their text.

Two lines a client causes keep limits of their own, each also at most so many per
interval with the count of the rest: Dory's ``<logDiscards>`` lines (its window of N
lines, ``books/discard_log.py``) and the status port's malformed requests
(``status/limits.py``'s ``QuietRequestErrors``: the count at the interval's end, on the
loop's timers, as an HTTP client may never send again).

Rule: every other log line a client's bytes can cause goes through :class:`ClientLines`,
and every repeated line of the daemon's own is limited by :class:`RepeatGate`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass

__all__ = ["CLIENT_LINE_INTERVAL_S", "ClientLines", "Passed", "RepeatGate"]

#: A kind of line a client can cause is logged at most once per this many seconds.
CLIENT_LINE_INTERVAL_S = 60.0
#: Kinds remembered at most by one gate.
MAX_KEYS = 1000


@dataclass(frozen=True)
class Passed:
    """An event let through: ``held`` like it were held back in the ``since_s`` before."""

    held: int
    since_s: float


class RepeatGate:
    """Which of the repeated events of each key are let through: one per ``interval_s``.

    Not thread-safe (a caller on several threads holds a lock around :meth:`admit`)."""

    def __init__(self, interval_s: float, max_keys: int = MAX_KEYS) -> None:
        self.interval_s = interval_s
        self._max_keys = max_keys
        self._seen: dict[Hashable, tuple[float, int]] = {}  # key -> (let through at, held)

    def admit(self, key: Hashable, now: float) -> Passed | None:
        """None: hold this event back (counted); else let it through, with what was held
        back since the last one of ``key`` let through."""
        seen = self._seen.get(key)
        if seen is not None and now - seen[0] < self.interval_s:
            self._seen[key] = (seen[0], seen[1] + 1)
            return None
        if seen is None and len(self._seen) >= self._max_keys:
            self._seen.clear()
        self._seen[key] = (now, 0)
        if seen is None:
            return Passed(0, 0.0)
        return Passed(seen[1], now - seen[0])


class ClientLines:
    """The lines of one logger that a client's bytes can cause: each kind at most once
    per ``interval_s``; a line after some were held back says how many."""

    def __init__(
        self,
        logger: logging.Logger,
        interval_s: float = CLIENT_LINE_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self._gate = RepeatGate(interval_s)
        self._clock = clock

    def log(
        self, level: int, kind: Hashable, msg: str, *args: object, exc_info: bool = False
    ) -> None:
        """``logger.log(level, msg, *args, exc_info=exc_info)``, unless a line of ``kind``
        was logged less than the interval ago (then only counted). Nothing is formatted
        for a line held back, nor for a level the logger does not log."""
        if not self.logger.isEnabledFor(level):
            return
        passed = self._gate.admit(kind, self._clock())
        if passed is None:
            return
        if passed.held:
            msg += " (%d more like it in the last %.0f s, not logged)"
            args = (*args, passed.held, passed.since_s)
        else:
            msg += " (at most one line like it per %.0f s)"
            args = (*args, self._gate.interval_s)
        self.logger.log(level, msg, *args, exc_info=exc_info)
