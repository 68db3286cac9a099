"""Dory's per-topic message rate limiting: at most ``max_count`` messages per interval.

The purpose (Dory design, "Rate limiting"): contain a buggy client that floods one topic,
so that Kafka does not slow down and force discards on every other topic. Messages over
the limit are discarded with reason ``rate_limit``.

Windows are fixed, per topic, and follow Dory's ``TMsgRateLimiter`` exactly: the first
message of a topic opens a window ``[start, start + interval)``; the windows then tile
time from that anchor (``start`` advances by whole intervals), and the count restarts in
each new window. Within one window the first ``max_count`` messages are admitted and the
rest refused. ``max_count=None`` means unlimited; ``max_count=0`` refuses everything.

Time is a monotonic clock (``time.monotonic`` by default, injectable), so setting the
wall clock back can never cause a wrong discard. Times are kept in whole milliseconds
(the config's unit), rounded to the nearest millisecond.

Memory: one small state record per topic Kafka has (the cluster bounds them), created on
first use. A name Kafka does not have (yet: before the first metadata, or while it is
being auto-created) is judged before the router refuses it, so it gets a window too, but
only among the ``unknown_topic_limit`` most recently seen such names: a client cycling
through endless names evicts the oldest window, which then starts afresh if its name
comes back (and moves to the topics Kafka has once Kafka has it).

Single-threaded: driven from the daemon's event loop only, so there are no locks.

Rule: whether a topic's message is within its rate is decided by :class:`TopicRateLimiter`
alone, on a clock passed in.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from pydory.daemon.books.accounting import DEFAULT_UNKNOWN_TOPIC_LIMIT

__all__ = ["RateLimit", "TopicRateLimiter"]


class RateLimit(Protocol):
    """A topic's rate limit setting (the config module's dataclass fits this)."""

    @property
    def interval_ms(self) -> int:
        """Window length in milliseconds (> 0 when ``max_count`` is not None)."""
        ...

    @property
    def max_count(self) -> int | None:
        """Messages admitted per window; None = unlimited, 0 = discard everything."""
        ...


@dataclass
class _TopicWindow:
    """The current window of one rate-limited topic."""

    interval_ms: int
    max_count: int
    start_ms: int
    count: int = 0


_UNSEEN = _TopicWindow(interval_ms=1, max_count=0, start_ms=0)  # a sentinel, never used


class TopicRateLimiter:
    """Admits or refuses each message of a topic according to that topic's rate limit."""

    def __init__(
        self,
        config_for: Callable[[str], RateLimit],
        clock: Callable[[], float] = time.monotonic,
        unknown_topic_limit: int = DEFAULT_UNKNOWN_TOPIC_LIMIT,
    ) -> None:
        """``config_for(topic)`` gives a topic's limit; ``clock`` returns monotonic seconds;
        ``unknown_topic_limit``: how many names Kafka does not have keep their windows.

        ``config_for`` is asked once per topic, on its first message, and again after
        :meth:`reconfigure` (a config reload).
        """
        self._config_for = config_for
        self._clock = clock
        # None marks a topic known to be unlimited, so it costs one dict lookup per message.
        self._windows: dict[str, _TopicWindow | None] = {}
        # The same for names Kafka does not have, the most recently seen last.
        self._unknown: OrderedDict[str, _TopicWindow | None] = OrderedDict()
        self._unknown_limit = unknown_topic_limit

    def reconfigure(self, config_for: Callable[[str], RateLimit]) -> None:
        """A config reload: limits come from ``config_for`` from now on. A topic whose
        limit is unchanged keeps its window and count (a reload is no way to reset a
        flooding topic's allowance); any other topic starts afresh with its next message."""
        self._config_for = config_for
        for windows in (self._windows, self._unknown):
            for topic, window in list(windows.items()):
                limit = config_for(topic)
                unchanged = (
                    limit.max_count is None
                    if window is None
                    else (limit.interval_ms, limit.max_count)
                    == (window.interval_ms, window.max_count)
                )
                if not unchanged:
                    del windows[topic]

    def is_unlimited(self, topic: str) -> bool:
        """True if ``topic`` is known to have no limit: :meth:`admit` would admit its
        messages without counting them, so a caller may skip it. False for a topic not
        seen yet (its first :meth:`admit` looks its limit up)."""
        return self._windows.get(topic, _UNSEEN) is None

    def admit(self, topic: str, now: float | None = None, *, known: bool = True) -> bool:
        """Count one message of ``topic``; True if it is within the limit, False to discard.

        ``now`` (monotonic seconds) defaults to the limiter's clock; ``known``: whether
        Kafka has ``topic`` (if not, its window is one of the bounded unknown ones).
        """
        now_ms = round((self._clock() if now is None else now) * 1000)
        windows = self._windows
        if topic in windows:
            window = windows[topic]
        elif known:
            window = self._unknown.pop(topic, _UNSEEN)
            if window is _UNSEEN:
                window = self._open_first_window(topic, now_ms)
            windows[topic] = window
        else:
            window = self._unknown_window(topic, now_ms)
        if window is None:
            return True
        self._advance(window, now_ms)
        window.count += 1
        return window.count <= window.max_count

    def _unknown_window(self, topic: str, now_ms: int) -> _TopicWindow | None:
        """The window of a name Kafka does not have, among the most recent few."""
        unknown = self._unknown
        window = unknown.get(topic, _UNSEEN)
        if window is not _UNSEEN:
            unknown.move_to_end(topic)
            return window
        window = unknown[topic] = self._open_first_window(topic, now_ms)
        if len(unknown) > self._unknown_limit:
            unknown.popitem(last=False)  # the least recently seen name
        return window

    def _open_first_window(self, topic: str, now_ms: int) -> _TopicWindow | None:
        limit = self._config_for(topic)
        if limit.max_count is None:
            return None
        if limit.interval_ms <= 0:
            raise ValueError(
                f"rate limit for topic {topic!r} has interval_ms={limit.interval_ms}; "
                "it must be positive when max_count is set"
            )
        return _TopicWindow(limit.interval_ms, limit.max_count, start_ms=now_ms)

    @staticmethod
    def _advance(window: _TopicWindow, now_ms: int) -> None:
        """Move to the window containing ``now_ms``, keeping windows on the topic's grid.

        A ``now_ms`` before the window start (impossible with a monotonic clock, possible
        with a caller's explicit ``now``) stays in the current window.
        """
        elapsed = now_ms - window.start_ms
        if elapsed >= window.interval_ms:
            window.start_ms += (elapsed // window.interval_ms) * window.interval_ms
            window.count = 0
