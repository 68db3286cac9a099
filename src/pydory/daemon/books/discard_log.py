"""Where discards are written besides the books: Dory's discard log file and ``logDiscards``.

Both are :class:`~pydory.daemon.books.accounting.DiscardSink` s that the books call on every
discard.
:class:`DiscardLog` builds what the config asks for and hands the books one sink.

**The discard log file** (``<discardLogging>``, for debugging) has Dory's line format, so
Dory's tools keep reading it. One line per event (shown here on two)::

    now: 1795246679301 ts: 1795246679208 event: DISC info: RATE_LIMIT
        topic: 5[clock] key: 0[] msg: 8[aGVsbG8=]

- ``now``: when pydory recorded the event; ``ts``: the client's timestamp, or ``now`` when
  none could be read (malformed bytes, ...), as Dory does. Both in ms since the epoch.
- ``event``: ``DISC`` (a discard), ``DUP`` (a possible duplicate, ``info: NONE``) or
  pydory's ``MAYBE`` (a message possibly delivered: its last attempt ended in an error
  after which Kafka may have it or not; ``info: POSSIBLY_DELIVERED(<error>)``).
- ``info``: the reason in Dory's words (:func:`dory_info`).
- ``topic``, ``key``, ``msg``: a byte length, then the field in brackets. ``key`` and
  ``msg`` are base64 (binary-safe), of at most ``maxMsgPrefixSize`` bytes of the original.
  ``msg`` is the value, or the raw bytes received when the message could not be decoded.

When the next write would push the file past ``maxFileSize``, ``f`` is renamed to
``f.<epoch-ms>`` and a new ``f`` is started; rotated files beyond ``maxArchiveSize`` bytes
in total are deleted, oldest first (:class:`~pydory.daemon.books.files.RotatingFile`).

Threading: the books call :meth:`DiscardLogFile.discarded` on the event loop, which only
queues the event; a writer thread (:class:`~pydory.daemon.books.files.QueuedWriter`)
cuts, formats and writes entries in batches, so the loop never waits for the disk. The
queue is bounded; what does not fit is counted as ``discard_log_dropped``. An I/O failure
(a full disk, a missing directory, ...) is logged once; entries that could not be written
are counted as ``discard_log_lost``, and writing is retried every ``retry_after_s`` and
on SIGUSR1 (:meth:`DiscardLog.reopen`).

**logDiscards** (``<logging><logDiscards>``): :class:`DiscardLogLines` logs each discard at
WARNING on logger ``pydory.discards``, at most ``lines_per_window`` lines per window, then
one line saying how many more it did not log.

Rule: Dory's discard log line (:func:`format_line`) is spelled here alone, and so is the
choice of discard outputs from ``<discardLogging>`` and ``<logDiscards>``.
"""

from __future__ import annotations

import asyncio
import binascii
import functools
import logging
import re
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

from pydory.config.model import Config
from pydory.daemon.books import counters as counter_names
from pydory.daemon.books.counters import Counters
from pydory.daemon.books.events import (
    DiscardEvent,
    DiscardReason,
    DiscardSink,
    OpenOutcome,
    Transport,
)
from pydory.daemon.books.files import (
    MAX_BACKLOG_BYTES,
    MAX_BACKLOG_ENTRIES,
    QueuedWriter,
    RotatingFile,
)

__all__ = [
    "DiscardLog",
    "DiscardLogFile",
    "DiscardLogLines",
    "DiscardLogRotatingFile",
    "PossibleDuplicate",
    "dory_info",
    "format_line",
]

log = logging.getLogger(__name__)


# Dory's blurbs (discard_file_logger.cc ReasonToBlurb and friends).
_PLAIN_INFO = {
    DiscardReason.MALFORMED: "MALFORMED",
    DiscardReason.BAD_TOPIC: "BAD_TOPIC",
    DiscardReason.TOO_LONG: "LONG_MSG",
    DiscardReason.NO_MEMORY: "NO_MEM",
    DiscardReason.RATE_LIMIT: "RATE_LIMIT",
    DiscardReason.FAILED_DELIVERY_ATTEMPTS: "DELIVERY_ATTEMPT_LIMIT",
    DiscardReason.SHUTDOWN_DELAY: "SERVER_SHUTDOWN",
    DiscardReason.SPOOL_CORRUPT: "SPOOL_CORRUPT",  # pydory's: ``msg`` has the damaged bytes
}
_NOT_A_TOKEN = re.compile(r"[^A-Za-z0-9_.-]")
# Size:int32 then ApiKey:int16 at the start of every Dory message.
_API_KEY_OFFSET = 4


def dory_info(event: DiscardEvent) -> str:
    """The ``info`` field of a discard: Dory's blurb for the reason.

    Dory's parameterised forms are kept: ``API_KEY(300)``, ``VERSION(1)``, ``UNCLEAN_T``
    (TCP) and ``UNCLEAN_U`` (UNIX stream). pydory adds the Kafka error name:
    ``KAFKA_ERROR_ACK(TOPIC_AUTHORIZATION_FAILED)``. Never contains a space.
    """
    reason = event.reason
    if reason is OpenOutcome.POSSIBLY_DELIVERED:
        detail = _NOT_A_TOKEN.sub("_", event.detail)
        return f"POSSIBLY_DELIVERED({detail})" if detail else "POSSIBLY_DELIVERED"
    assert isinstance(reason, DiscardReason), reason
    plain = _PLAIN_INFO.get(reason)
    if plain is not None:
        return plain
    if reason is DiscardReason.UNSUPPORTED_API_KEY:
        header = event.message[_API_KEY_OFFSET : _API_KEY_OFFSET + 2]
        if len(header) < 2:
            return "API_KEY"
        return f"API_KEY({int.from_bytes(header, 'big', signed=True)})"
    if reason is DiscardReason.UNSUPPORTED_VERSION:
        return "VERSION" if event.api_version is None else f"VERSION({event.api_version})"
    if reason is DiscardReason.KAFKA_ERROR:
        detail = _NOT_A_TOKEN.sub("_", event.detail)
        return f"KAFKA_ERROR_ACK({detail})" if detail else "KAFKA_ERROR_ACK"
    assert reason is DiscardReason.UNCLEAN_DISCONNECT, reason
    return "UNCLEAN_T" if event.transport is Transport.TCP else "UNCLEAN_U"


class PossibleDuplicate(NamedTuple):
    """A message sent again after an unknown outcome: a ``DUP`` line."""

    topic: str
    client_timestamp_ms: int


def format_line(
    now_ms: int, what: DiscardEvent | PossibleDuplicate, prefix_size: int | None
) -> bytes:
    """The log line (newline-terminated) for ``what``, recorded at ``now_ms``.

    Key and message are cut to ``prefix_size`` bytes (None = whole) before encoding.
    """
    if isinstance(what, PossibleDuplicate):
        timestamp_ms, event, info = what.client_timestamp_ms, b"DUP", "NONE"
        topic, key, message = what.topic, b"", b""
    else:
        timestamp_ms = now_ms if what.client_timestamp_ms is None else what.client_timestamp_ms
        event = b"MAYBE" if what.reason is OpenOutcome.POSSIBLY_DELIVERED else b"DISC"
        info = dory_info(what)
        topic, key, message = what.topic or "", what.key, what.message
    if prefix_size is not None:
        key, message = key[:prefix_size], message[:prefix_size]
    if not (topic.isascii() and topic.isprintable()):
        # Only a rejected (bad_topic) name can be odd: keep the file one line per entry.
        topic = topic.encode("unicode_escape").decode("ascii")
    key64 = binascii.b2a_base64(key, newline=False)
    message64 = binascii.b2a_base64(message, newline=False)
    return b"now: %d ts: %d event: %s info: %s topic: %d[%s] key: %d[%s] msg: %d[%s]\n" % (
        now_ms,
        timestamp_ms,
        event,
        info.encode("ascii"),
        len(topic),
        topic.encode("ascii"),
        len(key64),
        key64,
        len(message64),
        message64,
    )


# --- the file and its writer thread (pydory.daemon.books.files) ----------------------------


#: The discard log's :class:`~pydory.daemon.books.files.RotatingFile`: named ``discard log``
#: in log lines, counting ``discard_log_written`` and ``discard_log_lost``; called as
#: ``RotatingFile`` is (``path`` absolute, sizes in bytes: Dory's maxFileSize,
#: maxArchiveSize).
DiscardLogRotatingFile = functools.partial(
    RotatingFile,
    label="discard log",
    written_counter=counter_names.DISCARD_LOG_WRITTEN,
    lost_counter=counter_names.DISCARD_LOG_LOST,
)


class DiscardLogFile(QueuedWriter[DiscardEvent | PossibleDuplicate]):
    """The ``<discardLogging>`` file as a :class:`DiscardSink`: queue on the loop, write in
    a thread.

    :meth:`discarded` and :meth:`possible_duplicate` are for the event loop thread only;
    :meth:`reopen`, :meth:`flush` and :meth:`close` may be called from any thread.
    """

    def __init__(
        self,
        file: RotatingFile,
        max_msg_prefix_size: int | None,
        counters: Counters,
        *,
        max_backlog_entries: int = MAX_BACKLOG_ENTRIES,
        max_backlog_bytes: int = MAX_BACKLOG_BYTES,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        """Start the writer thread for ``file``; ``max_msg_prefix_size`` None = unlimited."""
        self._prefix_size = max_msg_prefix_size
        super().__init__(
            file,
            counters,
            dropped_counter=counter_names.DISCARD_LOG_DROPPED,
            file_counters=(counter_names.DISCARD_LOG_LOST, counter_names.DISCARD_LOG_WRITTEN),
            label="discard log",
            thread_name="pydory-discard-log",
            max_backlog_entries=max_backlog_entries,
            max_backlog_bytes=max_backlog_bytes,
            wall_clock=wall_clock,
        )

    # -- the sink (event loop thread) ------------------------------------------------------

    def discarded(self, event: DiscardEvent) -> None:
        """Queue a ``DISC`` line for ``event`` (formatted later, by the writer thread)."""
        # The size counts the whole key and message: the queue holds them uncut until
        # the writer thread formats the line, so that the loop copies nothing.
        self._enqueue(event, len(event.key) + len(event.message))

    def possible_duplicate(self, topic: str, client_timestamp_ms: int) -> None:
        """Queue a ``DUP`` line (Dory logs possible duplicates in the same file)."""
        self._enqueue(PossibleDuplicate(topic, client_timestamp_ms), 0)

    def _format(self, now_ms: int, item: DiscardEvent | PossibleDuplicate) -> bytes:
        return format_line(now_ms, item, self._prefix_size)

    def _size(self, item: DiscardEvent | PossibleDuplicate) -> int:
        return len(item.key) + len(item.message) if isinstance(item, DiscardEvent) else 0


# --- logDiscards: rate-limited log lines ---------------------------------------------------

Schedule = Callable[[float, Callable[[], None]], object]


def _call_later_on_running_loop(delay_s: float, callback: Callable[[], None]) -> object:
    """Run ``callback`` after ``delay_s`` on the running event loop, if there is one."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return None  # no loop (a tool or a test): the summary waits for the next discard
    return loop.call_later(delay_s, callback)


class DiscardLogLines:
    """``logDiscards``: one WARNING per discard, at most ``lines_per_window`` per window.

    Beyond the limit, discards are only counted; when the window ends, one line says how
    many were not logged. The books, ``/discards`` and the counters have every discard.
    """

    def __init__(
        self,
        logger: logging.Logger | None = None,
        *,
        lines_per_window: int = 10,
        window_s: float = 10.0,
        monotonic: Callable[[], float] = time.monotonic,
        schedule: Schedule = _call_later_on_running_loop,
    ) -> None:
        """``schedule(delay_s, callback)`` arranges the end-of-window summary."""
        self._logger = logger if logger is not None else logging.getLogger("pydory.discards")
        self._limit = lines_per_window
        self._window_s = window_s
        self._monotonic = monotonic
        self._schedule = schedule
        self._window_start = -float("inf")
        self._logged = 0
        self._suppressed = 0

    def discarded(self, event: DiscardEvent) -> None:
        """Log ``event``, or count it if this window's lines are used up."""
        now = self._monotonic()
        if now - self._window_start >= self._window_s:
            self._end_window()
            self._window_start = now
        if self._logged < self._limit:
            self._logged += 1
            self._logger.warning("%s", describe_discard(event))
            return
        if self._suppressed == 0:
            self._schedule(self._window_start + self._window_s - now, self._summary_due)
        self._suppressed += 1

    def possible_duplicate(self, topic: str, client_timestamp_ms: int) -> None:
        """Not a discard: not logged."""

    def close(self) -> None:
        """Log the summary of the current window, if anything was left out."""
        self._end_window()

    def _summary_due(self) -> None:
        self._end_window()
        self._window_start = self._monotonic()

    def _end_window(self) -> None:
        if self._suppressed:
            self._logger.warning(
                "%d more discards not logged (logDiscards logs at most %d per %.0f s); "
                "see /discards/json and the discarded_<reason> counters",
                self._suppressed,
                self._limit,
                self._window_s,
            )
        self._logged = 0
        self._suppressed = 0


def describe_discard(event: DiscardEvent) -> str:
    """One line for a person, e.g. ``discarded a message (kafka_error
    TOPIC_AUTHORIZATION_FAILED): topic 'events', client timestamp 1795246679208``."""
    reason = f"{event.reason} {event.detail}" if event.detail else str(event.reason)
    facts = []
    if event.topic is not None:
        facts.append(f"topic {event.topic!r}")
    if event.client_timestamp_ms is not None:
        facts.append(f"client timestamp {event.client_timestamp_ms}")
    if event.transport is not None:
        facts.append(f"on {event.transport}")
    if event.message:
        facts.append(f"{len(event.message)} bytes kept")
    what = "possibly delivered" if event.reason is OpenOutcome.POSSIBLY_DELIVERED else "discarded"
    return f"{what} a message ({reason})" + (": " + ", ".join(facts) if facts else "")


# --- both, as the config asks --------------------------------------------------------------


class _EverySink:
    """Fans each event out to several sinks, in order."""

    def __init__(self, sinks: Sequence[DiscardSink]) -> None:
        self._sinks = tuple(sinks)

    def discarded(self, event: DiscardEvent) -> None:
        for sink in self._sinks:
            sink.discarded(event)

    def possible_duplicate(self, topic: str, client_timestamp_ms: int) -> None:
        for sink in self._sinks:
            sink.possible_duplicate(topic, client_timestamp_ms)


class DiscardLog:
    """The discard outputs the config enables, as one sink for the books.

    The server builds it before the books, passes :attr:`sink` to them, calls
    :meth:`reopen` on SIGUSR1 and :meth:`close` last at shutdown.
    """

    def __init__(self, file: DiscardLogFile | None, lines: DiscardLogLines | None) -> None:
        """Either output may be None (off)."""
        self.file = file
        self.lines = lines
        sinks: list[DiscardSink] = [sink for sink in (file, lines) if sink is not None]
        self.sink: DiscardSink | None = (
            None if not sinks else sinks[0] if len(sinks) == 1 else _EverySink(sinks)
        )
        """What the books call; None when both outputs are off (the books skip it)."""

    @classmethod
    def from_config(cls, config: Config, counters: Counters) -> DiscardLog:
        """``<discardLogging>`` and ``<logging><logDiscards>``; starts the writer thread."""
        lines = DiscardLogLines() if config.logging.log_discards else None
        return cls(_file_of(config, counters), lines)

    def reconfigured(self, running: Config, new: Config, counters: Counters) -> DiscardLog:
        """A config reload: the outputs ``new`` asks for, this log's own where their
        settings did not change (a file is never open twice). Hand the books the new
        sink first, then :meth:`close_replaced` this one, so no discard falls between."""
        file = (
            self.file if new.discard_logging == running.discard_logging else _file_of(new, counters)
        )
        lines = (
            self.lines
            if new.logging.log_discards == running.logging.log_discards
            else DiscardLogLines()
            if new.logging.log_discards
            else None
        )
        return DiscardLog(file, lines)

    def close_replaced(self, successor: DiscardLog) -> None:
        """Close the outputs ``successor`` does not reuse (after a reload)."""
        if self.file is not None and self.file is not successor.file:
            self.file.close()
        if self.lines is not None and self.lines is not successor.lines:
            self.lines.close()

    def reopen(self) -> None:
        """SIGUSR1: reopen the discard log file (after what is queued)."""
        if self.file is not None:
            self.file.reopen()

    def close(self) -> None:
        """Shutdown: write what is queued, close the file, log the last summary."""
        if self.file is not None:
            self.file.close()
        if self.lines is not None:
            self.lines.close()


def _file_of(config: Config, counters: Counters) -> DiscardLogFile | None:
    """The discard log file ``<discardLogging>`` asks for (its writer thread started)."""
    settings = config.discard_logging
    if settings.path is None:
        return None
    rotating = DiscardLogRotatingFile(
        settings.path, settings.max_file_size, settings.max_archive_size, counters
    )
    return DiscardLogFile(rotating, settings.max_msg_prefix_size, counters)
