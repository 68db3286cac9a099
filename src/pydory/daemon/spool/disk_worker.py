"""The spool's slow disk calls, off the loop thread: one worker thread runs them in the
order they were handed over.

On a real disk an ``fdatasync`` of a segment written for a second, or the ``unlink`` of a
settled 64 MiB segment (the kernel drops its pages), takes 10-20 ms (measured: strace
-T, stream 64/write at 1.1M msgs/s). On the loop thread every input waits that long,
and a datagram socket's queue can overflow meanwhile. Here they run beside the loop,
which never waits for them but at ``close`` (``drain``): a slow disk delays the
segments' and acknowledgement marks' syncs and the deletions, not the reading.

What is handed over is owned by the worker from then on: file descriptors (closed by it
after their sync) and paths (unlinked in order: a segment before its acknowledgement
mark, so a crash between the two leaves a mark without its segment, which the next start
removes, never a segment without its mark, which it would replay whole). A job lost to a
crash leaves what it would have removed on disk, as if the crash had come a moment
earlier: settled frames are marked, so the next start does not send them again.

Rule: :class:`DiskWorker` is the only thread of the spool besides the loop's; it touches
nothing but what it was handed and its own counters.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections import deque
from collections.abc import Callable, Iterable, Sequence

log = logging.getLogger(__name__)


class DiskWorker:
    """A thread that syncs and deletes the spool's files in the order asked."""

    def __init__(self, name: str = "pydory-spool-disk") -> None:
        self._name = name
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self.fsyncs_total = 0  # written by the worker thread only
        self.errors_total = 0  # written by the worker thread only
        #: Segment ids whose fsync failed: the loop writes no more to them (``failed``).
        self.failed_segments: deque[int] = deque()
        #: Segment ids whose acknowledgement mark's fsync failed: no more marks to it.
        self.failed_marks: deque[int] = deque()

    def sync(self, fds: Sequence[tuple[int, int]], directory: str | None) -> None:
        """fdatasync then close each ``(segment id, fd)``; then fsync ``directory``."""
        self._submit(lambda: self._sync(fds, directory))

    def sync_marks(self, fds: Sequence[tuple[int, int]]) -> None:
        """fdatasync then close each ``(segment id, fd)`` of an acknowledgement mark."""
        self._submit(lambda: self._sync_each(fds, self.failed_marks, "acknowledgement mark"))

    def unlink(self, paths: Sequence[str]) -> None:
        """Remove ``paths``, in order (one already gone is not an error)."""
        self._submit(lambda: self._unlink(paths))

    def drain(self) -> None:
        """Wait until every job handed over so far has run."""
        if self._thread is None:
            return
        done = threading.Event()
        self._jobs.put(done.set)
        done.wait()

    def close(self) -> None:
        """Drain, then stop the thread. The worker can be used again afterwards."""
        if self._thread is None:
            return
        self.drain()
        self._jobs.put(None)
        self._thread.join()
        self._thread = None

    def _submit(self, job: Callable[[], None]) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()
        self._jobs.put(job)

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            try:
                job()
            except Exception:  # a bug (the disk's errors are counted): loud, and go on,
                log.exception("spool: a disk job failed")  # or drain() would wait forever

    def _sync(self, fds: Sequence[tuple[int, int]], directory: str | None) -> None:
        self._sync_each(fds, self.failed_segments, "segment")
        if directory is not None:
            try:
                fsync_directory(directory)
                self.fsyncs_total += 1
            except OSError as exc:
                self.errors_total += 1
                log.warning("spool: cannot fsync [%s]: %s", directory, exc.strerror)

    def _sync_each(self, fds: Sequence[tuple[int, int]], failed: deque[int], what: str) -> None:
        made, failures = fdatasync_each(fds)
        for fd in (fd for _, fd in fds):
            os.close(fd)
        self.fsyncs_total += made
        self.errors_total += len(failures)
        for segment_id, error in failures:
            failed.append(segment_id)
            log.warning("spool: cannot fsync %s %d: %s", what, segment_id, error)

    def _unlink(self, paths: Sequence[str]) -> None:
        for path in paths:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            except OSError as exc:
                self.errors_total += 1
                log.warning("spool: cannot delete [%s]: %s", path, exc.strerror)


def fdatasync_each(fds: Iterable[tuple[int, int]]) -> tuple[int, list[tuple[int, str]]]:
    """fdatasync each ``(segment id, fd)`` (leaving them open): how many were synced, and
    the segment id and error of each that failed."""
    made, failures = 0, []
    for segment_id, fd in fds:
        try:
            os.fdatasync(fd)
            made += 1
        except OSError as exc:
            failures.append((segment_id, exc.strerror or str(exc)))
    return made, failures


def fsync_directory(directory: str) -> None:
    """The directory's entries (new segment names) survive a power cut."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
