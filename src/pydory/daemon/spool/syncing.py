"""When the spool's writes reach the disk: the fsync policy of this run's segments.

``interval_ms``: None = never fsync (the OS writes back: survives SIGKILL, not a power
cut); 0 = after every append; N = every write is fsynced within N ms.

On an interval, a segment that stops being written (it rotated, or a write failed) is not
fsynced then: it waits, its file kept open, for the next interval's sync. A segment whose
messages all settle before that sync is deleted unsynced: settled messages need no disk,
and at a high rate most segments settle within milliseconds of their last write. So the
loop never waits for a rotation's fsync, and the disk never writes what is already gone.
A new segment's header and name (its directory entry) are synced with the same sync.
With ``always`` nothing waits: an append returns only when its bytes, and the file's
name, are on the disk.

Rule: the only code that fsyncs this run's segment files and their directory, and that
decides when.
"""

from __future__ import annotations

import os
from collections.abc import Callable


class SegmentSync:
    """The fsync state of the spool's segments: which were written since their last fsync."""

    def __init__(self, directory: str, interval_ms: int | None, clock: Callable[[], float]) -> None:
        if interval_ms is not None and interval_ms < 0:
            raise ValueError("fsync_interval_ms must be None or >= 0")
        self.directory = directory
        self.interval_ms = interval_ms
        self._clock = clock
        self._last_sync = clock()
        #: The current segment was written since its last fsync.
        self.current_dirty = False
        #: Segments no longer written, written since their last fsync: id -> their open fd.
        self._retired: dict[int, int] = {}
        self._new_names = False  # a segment created since the directory's last fsync
        self.fsyncs_total = 0
        """fsync calls made (segment data and the directory)."""
        self.errors_total = 0
        """fsyncs of retired segments or the directory that failed (counted, not raised)."""

    @property
    def waiting(self) -> bool:
        """Something was written since its last fsync."""
        return self.current_dirty or bool(self._retired) or self._new_names

    def due(self) -> bool:
        """An append must sync now: always, or ``interval_ms`` since the last sync."""
        if self.interval_ms is None:
            return False
        return self.interval_ms == 0 or (self._clock() - self._last_sync) * 1000 >= self.interval_ms

    def created(self, fd: int) -> None:
        """A segment file was created and its header written to ``fd``. Raises OSError
        (``always`` only) if it cannot be synced."""
        if self.interval_ms is None:
            return
        if self.interval_ms == 0:  # an append's return promises its file's name durable
            os.fsync(fd)
            self._sync_directory()
            self.fsyncs_total += 1
            self._last_sync = self._clock()
        else:
            self.current_dirty = True
            self._new_names = True

    def sync(self, current_fd: int | None) -> None:
        """fsync what was written since its last fsync: the current segment (``current_fd``)
        first, raising OSError if that fails (the caller writes no more to it); then the
        retired segments (closed after) and the directory. Their failures are counted, not
        raised: their messages are still held in memory and delivered, only a power cut
        could now lose them."""
        if current_fd is not None and self.current_dirty:
            os.fdatasync(current_fd)
            self.fsyncs_total += 1
            self.current_dirty = False
        retired, self._retired = self._retired, {}
        for fd in retired.values():
            try:
                os.fdatasync(fd)
                self.fsyncs_total += 1
            except OSError:
                self.errors_total += 1
            os.close(fd)
        if self._new_names:
            try:
                self._sync_directory()
            except OSError:
                self.errors_total += 1
        self._last_sync = self._clock()

    def retired(self, segment_id: int, fd: int) -> None:
        """The current segment (``fd``) is written no more: closed now if it is synced (or
        never will be), else kept open until the next sync or its deletion."""
        if self.current_dirty and self.interval_ms is not None:
            self._retired[segment_id] = fd
        else:
            os.close(fd)
        self.current_dirty = False

    def deleted(self, segment_id: int) -> None:
        """A segment's messages are all settled and its file is going: its writes need no
        fsync any more."""
        fd = self._retired.pop(segment_id, None)
        if fd is not None:
            os.close(fd)

    def _sync_directory(self) -> None:
        """The directory's entries (new segment names) survive a power cut."""
        fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        self.fsyncs_total += 1
        self._new_names = False
