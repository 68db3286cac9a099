"""Log files written off the event loop: a rotating, size-capped file and its writer thread.

:class:`RotatingFile` appends lines to a file. When the next write would push the file
past ``max_file_size``, ``f`` is renamed to ``f.<epoch-ms>`` and a new ``f`` is started;
rotated files beyond ``max_archive_size`` bytes in total are deleted, oldest first. An I/O
failure (a full disk, a missing directory, ...) is logged once and the entries lost are
counted; writing is retried every ``retry_after_s`` and at :meth:`RotatingFile.reopen`.

:class:`QueuedWriter` gives such a file a thread of its own: the event loop only queues
items, the thread formats and writes them in batches, so the loop never waits for the
disk. The queue is bounded; what does not fit is counted.

Its users name the file in log lines and the counters it updates: the discard log file
(:mod:`pydory.daemon.books.discard_log`) and the message debug files
(:mod:`pydory.daemon.books.msg_debug`).

Rule: the daemon's own log files (the discard log, the message debug files) are written
and rotated only by :class:`RotatingFile`, off the event loop (:class:`QueuedWriter`'s
thread). (The daemon's ``<logging>`` file is Python logging's: ``daemon/logsetup.py``.)
"""

from __future__ import annotations

import logging
import os
import queue
import re
import stat
import threading
import time
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

from pydory.daemon.books.counters import Counters

__all__ = [
    "CLOSE_TIMEOUT_S",
    "FILE_MODE",
    "MAX_BACKLOG_BYTES",
    "MAX_BACKLOG_ENTRIES",
    "RETRY_AFTER_S",
    "WRITE_BATCH",
    "QueuedWriter",
    "RotatingFile",
]

log = logging.getLogger(__name__)

#: Queue bounds: about a second of a discard flood, and memory for it.
MAX_BACKLOG_ENTRIES = 200_000
MAX_BACKLOG_BYTES = 64 * 1024 * 1024
#: Entries per write() call: large writes are cheap, and the queue drains in order.
WRITE_BATCH = 2048
#: After an I/O failure, how long the file is left alone before trying again.
RETRY_AFTER_S = 30.0
#: Mode of a new log file (before the umask): discard logs and message traces hold
#: message contents.
FILE_MODE = 0o640
#: How long closing waits for the writer thread to write what is queued.
CLOSE_TIMEOUT_S = 10.0


# --- the file: rotation, archive cap, failures (writer thread only) ------------------------


class RotatingFile:
    """Appends formatted entries to a log file, rotating it and capping the archive.

    Synchronous and single-threaded: a :class:`QueuedWriter` drives it from its writer
    thread. It never raises :class:`OSError`: a failure is logged once, the entries that
    could not be written are counted as ``lost_counter``, and the file is tried again
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
        label: str,
        written_counter: str,
        lost_counter: str,
    ) -> None:
        """``path`` is absolute; sizes are bytes (Dory's maxFileSize, maxArchiveSize).

        ``label`` names the file in log lines; the two counters count the entries written
        and those lost to I/O errors (each user of this class, the discard log and the
        message debug files, counts its own).
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
