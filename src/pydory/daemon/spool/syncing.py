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

Rule: when this run's segment files and their directory are fsynced is decided by
:class:`SegmentSync` alone; the syncs run here, or on the ``DiskWorker`` it hands an
interval's syncs to. (Two syncs are ``Spool``'s, under the same policy: at its close,
whatever waits, unless the policy is never; and a segment of an earlier run that recovery
repaired.)
"""

from __future__ import annotations

import os
from collections.abc import Callable

from pydory.daemon.spool.disk_worker import DiskWorker, fdatasync_each, fsync_directory


class SegmentSync:
    """The fsync state of the spool's segments: which were written since their last fsync.

    With a ``worker`` (the daemon's), an interval's syncs run on its thread: the loop
    hands over what waits and goes on (a duplicate of the current segment's descriptor,
    the retired segments' own). Without one (tests, tools), they run here, in the call.
    """

    def __init__(
        self,
        directory: str,
        interval_ms: int | None,
        clock: Callable[[], float],
        worker: DiskWorker | None = None,
    ) -> None:
        if interval_ms is not None and interval_ms < 0:
            raise ValueError("fsync_interval_ms must be None or >= 0")
        self.directory = directory
        self.interval_ms = interval_ms
        self._clock = clock
        self._worker = worker
        self._last_sync = clock()
        #: The current segment was written since its last fsync.
        self.current_dirty = False
        #: Segments no longer written, written since their last fsync: id -> their open fd.
        self._retired: dict[int, int] = {}
        self._new_names = False  # a segment created since the directory's last fsync
        self._fsyncs = 0
        self._errors = 0

    @property
    def fsyncs_total(self) -> int:
        """fsync calls made (segment data, the directory, acknowledgement marks)."""
        return self._fsyncs + (self._worker.fsyncs_total if self._worker else 0)

    @property
    def errors_total(self) -> int:
        """fsyncs of retired segments or the directory that failed (counted, not raised),
        and the worker's failed syncs and deletions."""
        return self._errors + (self._worker.errors_total if self._worker else 0)

    def counted(self, fsyncs: int) -> None:
        """``fsyncs`` made elsewhere in the spool (recovery, acknowledgement marks)."""
        self._fsyncs += fsyncs

    @property
    def waiting(self) -> bool:
        """Something was written since its last fsync."""
        return self.current_dirty or bool(self._retired) or self._new_names

    def due(self) -> bool:
        """An append must sync now: always, or ``interval_ms`` since the last sync."""
        if self.interval_ms is None:
            return False
        return self.interval_ms == 0 or (self._clock() - self._last_sync) * 1000 >= self.interval_ms

    def failed(self, segment_id: int) -> bool:
        """Whether the worker failed to sync ``segment_id`` since the last time asked: then
        write no more to it (after a failed fsync the kernel may have dropped other dirty
        pages of the file, and a later fsync may succeed anyway)."""
        failed = self._worker.failed_segments if self._worker else None
        if not failed:
            return False
        ids = set()
        while failed:  # popleft: the worker may append meanwhile
            ids.add(failed.popleft())
        return segment_id in ids

    def created(self, fd: int) -> None:
        """A segment file was created and its header written to ``fd``. Raises OSError
        (``always`` only) if it cannot be synced."""
        if self.interval_ms is None:
            return
        if self.interval_ms == 0:  # an append's return promises its file's name durable
            os.fsync(fd)
            fsync_directory(self.directory)
            self._fsyncs += 2
            self._last_sync = self._clock()
        else:
            self.current_dirty = True
            self._new_names = True

    def sync(self, current: tuple[int, int] | None) -> None:
        """fsync what was written since its last fsync: the current segment (``current``:
        its id and fd) first, raising OSError if that fails (the caller writes no more to
        it); then the retired segments (closed after) and the directory. Their failures
        are counted, not raised: their messages are still held in memory and delivered,
        only a power cut could now lose them. On an interval with a worker, all of it is
        handed to the worker's thread (a failure of the current one: ``failed``)."""
        if self._worker is not None and self.interval_ms:
            self._hand_over(current)
            return
        if current is not None and self.current_dirty:
            os.fdatasync(current[1])
            self._fsyncs += 1
            self.current_dirty = False
        retired, self._retired = self._retired, {}
        made, failures = fdatasync_each(retired.items())
        for fd in retired.values():
            os.close(fd)
        self._fsyncs += made
        self._errors += len(failures)
        if self._new_names:
            try:
                fsync_directory(self.directory)
                self._fsyncs += 1
                self._new_names = False
            except OSError:
                self._errors += 1
        self._last_sync = self._clock()

    def _hand_over(self, current: tuple[int, int] | None) -> None:
        assert self._worker is not None
        fds = []
        if current is not None and self.current_dirty:
            fds.append((current[0], os.dup(current[1])))  # the worker's own, closed by it
        fds.extend(self._retired.items())
        if fds or self._new_names:
            self._worker.sync(fds, self.directory if self._new_names else None)
        self._retired = {}
        self.current_dirty = self._new_names = False
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

    def drain(self) -> None:
        """Wait for the worker's syncs and deletions handed over so far (close, tests)."""
        if self._worker is not None:
            self._worker.drain()
