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
- ``event``: ``DISC`` (a discard) or ``DUP`` (a possible duplicate, ``info: NONE``).
- ``info``: the reason in Dory's words (:func:`dory_info`).
- ``topic``, ``key``, ``msg``: a byte length, then the field in brackets. ``key`` and
  ``msg`` are base64 (binary-safe), of at most ``maxMsgPrefixSize`` bytes of the original.
  ``msg`` is the value, or the raw bytes received when the message could not be decoded.

When the next write would push the file past ``maxFileSize``, ``f`` is renamed to
``f.<epoch-ms>`` and a new ``f`` is started; rotated files beyond ``maxArchiveSize`` bytes
in total are deleted, oldest first (:class:`RotatingFile`).

Threading: the books call :meth:`DiscardLogFile.discarded` on the event loop, which only
queues the event; a writer thread cuts, formats and writes entries in batches, so the loop
never waits for the disk. The queue is bounded; what does not fit is counted
as ``discard_log_dropped``. An I/O failure (a full disk, a missing directory, ...) is
logged once; entries that could not be written are counted as ``discard_log_lost``, and
writing is retried every ``retry_after_s`` and on SIGUSR1 (:meth:`DiscardLog.reopen`).

**logDiscards** (``<logging><logDiscards>``): :class:`DiscardLogLines` logs each discard at
WARNING on logger ``pydory.discards``, at most ``lines_per_window`` lines per window, then
one line saying how many more it did not log.
"""

from __future__ import annotations

import asyncio
import binascii
import logging
import os
import queue
import re
import stat
import threading
import time
from collections.abc import Callable, Sequence
from typing import Generic, NamedTuple, TypeVar

from pydory.config.model import Config
from pydory.daemon.books.accounting import (
    Counters,
    DiscardEvent,
    DiscardReason,
    DiscardSink,
    Transport,
)

__all__ = [
    "DISCARD_LOG_DROPPED",
    "DISCARD_LOG_LOST",
    "DISCARD_LOG_WRITTEN",
    "DiscardLog",
    "DiscardLogFile",
    "DiscardLogLines",
    "PossibleDuplicate",
    "QueuedWriter",
    "RotatingFile",
    "dory_info",
    "format_line",
]

log = logging.getLogger(__name__)

#: Counter: entries the writer thread could not keep up with (the queue was full).
DISCARD_LOG_DROPPED = "discard_log_dropped"
#: Counter: entries lost to an I/O error (file unwritable, disk full, ...).
DISCARD_LOG_LOST = "discard_log_lost"
#: Counter: entries written to the file.
DISCARD_LOG_WRITTEN = "discard_log_written"

#: Queue bounds: about a second of a discard flood, and memory for it.
MAX_BACKLOG_ENTRIES = 200_000
MAX_BACKLOG_BYTES = 64 * 1024 * 1024
#: Entries per write() call: large writes are cheap, and the queue drains in order.
WRITE_BATCH = 2048
#: After an I/O failure, how long the file is left alone before trying again.
RETRY_AFTER_S = 30.0
#: Mode of a new discard log file (before the umask): it holds message contents.
FILE_MODE = 0o640
#: How long closing waits for the writer thread to write what is queued.
CLOSE_TIMEOUT_S = 10.0

# Dory's blurbs (discard_file_logger.cc ReasonToBlurb and friends).
_PLAIN_INFO = {
    DiscardReason.MALFORMED: "MALFORMED",
    DiscardReason.BAD_TOPIC: "BAD_TOPIC",
    DiscardReason.TOO_LONG: "LONG_MSG",
    DiscardReason.NO_MEMORY: "NO_MEM",
    DiscardReason.RATE_LIMIT: "RATE_LIMIT",
    DiscardReason.FAILED_DELIVERY_ATTEMPTS: "DELIVERY_ATTEMPT_LIMIT",
    DiscardReason.SHUTDOWN_DELAY: "SERVER_SHUTDOWN",
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
        event, info = b"DISC", dory_info(what)
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


# --- the file: rotation, archive cap, failures (writer thread only) ------------------------


class RotatingFile:
    """Appends formatted entries to the discard log, rotating it and capping the archive.

    Synchronous and single-threaded: :class:`DiscardLogFile` drives it from its writer
    thread. It never raises :class:`OSError`: a failure is logged once, the entries that
    could not be written are counted as ``discard_log_lost``, and the file is tried again
    after ``retry_after_s`` or at :meth:`reopen`. A path that is not a regular file (a
    FIFO, ``/dev/stderr``) is written to but never rotated.
    """

    def __init__(
        self,
        path: str,
        max_file_size: int,
        max_archive_size: int,
        counters: Counters,
        *,
        retry_after_s: float = RETRY_AFTER_S,
        wall_clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        label: str = "discard log",
        written_counter: str = DISCARD_LOG_WRITTEN,
        lost_counter: str = DISCARD_LOG_LOST,
    ) -> None:
        """``path`` is absolute; sizes are bytes (Dory's maxFileSize, maxArchiveSize).

        ``label`` names the file in log lines; the two counters count the entries written
        and those lost to I/O errors (another user of this class, such as the message
        debug files, counts its own).
        """
        self.path = path
        self.label = label
        self.written_counter = written_counter
        self.lost_counter = lost_counter
        self._directory, self._name = os.path.split(path)
        self._archive_name = re.compile(re.escape(self._name) + r"\.(\d+)")
        self._max_file_size = max_file_size
        self._max_archive_size = max_archive_size
        self._counters = counters
        self._retry_after_s = retry_after_s
        self._wall_clock = wall_clock
        self._monotonic = monotonic
        self._fd: int | None = None
        self._size = 0
        self._regular = True
        self._failing = False  # an I/O failure was logged and has not been resolved yet
        self._retry_at: float | None = None  # monotonic time before which not to retry
        self._lost_since_failure = 0
        self._last_archive_ms = 0

    # -- writing ---------------------------------------------------------------------------

    def write(self, entries: Sequence[bytes]) -> None:
        """Append ``entries`` (formatted lines), rotating before one that would not fit."""
        if not entries:
            return
        if not self._ensure_open():
            self._lose(len(entries))
            return
        written = 0
        pending: list[bytes] = []
        pending_size = 0
        try:
            for entry in entries:
                if self._must_rotate_before(len(entry), pending_size):
                    self._append(pending)
                    written += len(pending)
                    pending, pending_size = [], 0
                    self._rotate()
                pending.append(entry)
                pending_size += len(entry)
            self._append(pending)
        except OSError as error:
            self._fail("write", error)
            self._lose(len(entries) - written)
            return
        if self._failing:
            self._recovered()

    def _must_rotate_before(self, entry_size: int, pending_size: int) -> bool:
        """True when ``entry_size`` more bytes would push a non-empty file past the limit.

        An empty file takes any entry, so an entry larger than maxFileSize gets a file
        of its own instead of an endless rotation.
        """
        in_file = self._size + pending_size
        return self._regular and in_file > 0 and in_file + entry_size > self._max_file_size

    def _append(self, lines: list[bytes]) -> None:
        if not lines:
            return
        assert self._fd is not None
        data = memoryview(b"".join(lines))
        while data:
            count = os.write(self._fd, data)
            data = data[count:]
            self._size += count
        self._counters.inc(self.written_counter, len(lines))

    def _lose(self, count: int) -> None:
        self._lost_since_failure += count
        self._counters.inc(self.lost_counter, count)

    # -- opening, rotating, cleaning -------------------------------------------------------

    def _ensure_open(self) -> bool:
        """True when the file is open for append, opening it if the retry time has come."""
        if self._fd is not None:
            return True
        if self._retry_at is not None and self._monotonic() < self._retry_at:
            return False
        try:
            self._open()
        except OSError as error:
            self._fail("open", error)
            return False
        self._retry_at = None
        if self._regular:
            self._clean_archive()
        return True

    def _open(self) -> None:
        os.makedirs(self._directory, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
        try:
            status = os.fstat(fd)
        except OSError:
            os.close(fd)
            raise
        self._fd = fd
        self._regular = stat.S_ISREG(status.st_mode)
        self._size = status.st_size if self._regular else 0

    def _rotate(self) -> None:
        """Rename the full file to ``f.<epoch-ms>`` (unique), start a new one, clean."""
        self._close_fd()
        archive_ms = max(int(self._wall_clock() * 1000), self._last_archive_ms + 1)
        os.rename(self.path, f"{self.path}.{archive_ms}")
        self._last_archive_ms = archive_ms
        self._open()
        self._clean_archive()

    def _clean_archive(self) -> None:
        """Delete rotated files, oldest first, until they total at most maxArchiveSize."""
        archives: list[tuple[int, int, str]] = []  # (epoch ms, size, path)
        try:
            with os.scandir(self._directory) as entries:
                for entry in entries:
                    match = self._archive_name.fullmatch(entry.name)
                    if match is None or not entry.is_file(follow_symlinks=False):
                        continue
                    archives.append((int(match.group(1)), entry.stat().st_size, entry.path))
        except OSError as error:
            log.warning("%s %s: cannot list old files: %s", self.label, self.path, error)
            return
        total = sum(size for _, size, _ in archives)
        for _, size, path in sorted(archives):
            if total <= self._max_archive_size:
                break
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            except OSError as error:
                log.warning("%s: cannot delete old file %s: %s", self.label, path, error)
                continue
            total -= size

    # -- failures and reopening ------------------------------------------------------------

    def _fail(self, action: str, error: OSError) -> None:
        self._close_fd()
        if not self._failing:
            log.error(
                "%s %s: cannot %s: %s. Entries are not written to it (counted "
                "as %s) until it works again; retried every %.0f s and on SIGUSR1",
                self.label,
                self.path,
                action,
                error.strerror or error,
                self.lost_counter,
                self._retry_after_s,
            )
        self._failing = True
        self._retry_at = self._monotonic() + self._retry_after_s

    def _recovered(self) -> None:
        log.warning(
            "%s %s: writing again; %d entries were lost meanwhile",
            self.label,
            self.path,
            self._lost_since_failure,
        )
        self._failing = False
        self._lost_since_failure = 0

    def reopen(self) -> None:
        """Close the file and open it again now (a new one if it was moved away), even
        during a failure's retry wait."""
        self._close_fd()
        self._retry_at = None
        self._ensure_open()

    def truncate(self) -> None:
        """Empty the file (creating it if need be); a failure is logged once, like a
        failed write."""
        if not self._ensure_open():
            return
        assert self._fd is not None
        try:
            if self._regular:
                os.ftruncate(self._fd, 0)
        except OSError as error:
            self._fail("truncate", error)
            return
        self._size = 0

    def close(self) -> None:
        """Close the file."""
        self._close_fd()

    def _close_fd(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError as error:
                log.warning("%s %s: close failed: %s", self.label, self.path, error)


# --- the writer thread ---------------------------------------------------------------------


class _Reopen:
    """Queue marker: reopen the file (SIGUSR1)."""


class _Truncate:
    """Queue marker: empty the file."""


class _Stop:
    """Queue marker: write what precedes, close the file and end the thread."""


T = TypeVar("T")


class QueuedWriter(Generic[T]):
    """A :class:`RotatingFile` written by a thread of its own from a bounded queue.

    The event loop only queues items (:meth:`_enqueue`); the writer thread formats them
    (:meth:`_format`) and writes them in batches, so the loop never waits for the disk.
    What does not fit in the queue is counted as ``dropped_counter``. The discard log
    file and the message debug files (:mod:`pydory.daemon.books.msg_debug`) are both one.

    :meth:`_enqueue` is for the event loop thread only; :meth:`reopen`,
    :meth:`truncate`, :meth:`flush` and :meth:`close` may be called from any thread.
    """

    def __init__(
        self,
        file: RotatingFile,
        counters: Counters,
        *,
        dropped_counter: str,
        file_counters: Sequence[str],
        label: str,
        thread_name: str,
        max_backlog_entries: int = MAX_BACKLOG_ENTRIES,
        max_backlog_bytes: int = MAX_BACKLOG_BYTES,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        """Start the writer thread for ``file``; ``file_counters`` are the counters it
        updates (created here, on the loop thread); ``label`` names it in log lines."""
        self.file = file
        self._counters = counters
        self._dropped_counter = dropped_counter
        self._label = label
        self._max_backlog_entries = max_backlog_entries
        self._max_backlog_bytes = max_backlog_bytes
        self._wall_clock = wall_clock
        # The backlog is "put minus taken". Each count has a single writer (the loop
        # thread puts, the writer thread takes), so no lock is needed to read them.
        self._put = self._put_bytes = 0
        self._taken = self._taken_bytes = 0
        self._closed = False
        # Created here, on the loop thread, so the writer thread only ever updates
        # existing counters (never inserts into the shared dict).
        for name in (dropped_counter, *file_counters):
            counters.inc(name, 0)
        self._queue: queue.SimpleQueue[
            tuple[int, T] | _Reopen | _Truncate | _Stop | threading.Event
        ] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=thread_name, daemon=True)
        self._thread.start()

    # -- to override -----------------------------------------------------------------------

    def _format(self, now_ms: int, item: T) -> bytes:
        """The line for ``item``, queued at ``now_ms`` (writer thread)."""
        raise NotImplementedError

    def _size(self, item: T) -> int:
        """The bytes ``item`` holds while queued (counted against the backlog bound)."""
        raise NotImplementedError

    # -- queueing (event loop thread) ------------------------------------------------------

    def _enqueue(self, item: T, size: int) -> bool:
        """Queue ``item`` (``size``: its ``_size``); False if it was dropped."""
        backlog_bytes = self._put_bytes - self._taken_bytes
        if (
            self._closed
            or self._put - self._taken >= self._max_backlog_entries
            or (backlog_bytes > 0 and backlog_bytes + size > self._max_backlog_bytes)
        ):
            self._counters.inc(self._dropped_counter)
            return False
        self._put += 1
        self._put_bytes += size
        self._queue.put((int(self._wall_clock() * 1000), item))
        return True

    # -- control (any thread) --------------------------------------------------------------

    def reopen(self) -> None:
        """Reopen the file after what is queued (SIGUSR1; also retries after a failure)."""
        self._queue.put(_Reopen())

    def truncate(self) -> None:
        """Empty the file after writing what is queued (later entries start it again)."""
        self._queue.put(_Truncate())

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every entry queued before this call is written (or lost).

        Returns False if ``timeout`` seconds passed first. After :meth:`close`, True once
        the writer thread has finished.
        """
        if self._closed:
            return not self._thread.is_alive()
        done = threading.Event()
        self._queue.put(done)
        return done.wait(timeout)

    def close(self, timeout: float = CLOSE_TIMEOUT_S) -> None:
        """Write what is queued, close the file and end the thread. Idempotent.

        Later entries are counted as dropped.
        """
        if self._closed:
            return
        self._closed = True
        self._queue.put(_Stop())
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("%s %s: not all entries written at close", self._label, self.file.path)

    # -- the writer thread -----------------------------------------------------------------

    def _run(self) -> None:
        while True:
            batch = [self._queue.get()]
            while len(batch) < WRITE_BATCH:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            if not self._write_batch(batch):
                return

    def _write_batch(
        self, batch: list[tuple[int, T] | _Reopen | _Truncate | _Stop | threading.Event]
    ) -> bool:
        """Write ``batch`` in order, obeying its markers; False once told to stop."""
        lines: list[bytes] = []
        for item in batch:
            if isinstance(item, tuple):
                now_ms, what = item
                lines.append(self._format(now_ms, what))
                self._taken += 1
                self._taken_bytes += self._size(what)
                continue
            self.file.write(lines)
            lines = []
            if isinstance(item, _Stop):
                self.file.close()
                return False
            if isinstance(item, _Reopen):
                self.file.reopen()
            elif isinstance(item, _Truncate):
                self.file.truncate()
            else:
                item.set()
        self.file.write(lines)
        return True


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
            dropped_counter=DISCARD_LOG_DROPPED,
            file_counters=(DISCARD_LOG_LOST, DISCARD_LOG_WRITTEN),
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
    return f"discarded a message ({reason})" + (": " + ", ".join(facts) if facts else "")


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
    rotating = RotatingFile(
        settings.path, settings.max_file_size, settings.max_archive_size, counters
    )
    return DiscardLogFile(rotating, settings.max_msg_prefix_size, counters)
