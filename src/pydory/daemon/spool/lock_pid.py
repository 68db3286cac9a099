"""The pid in the spool directory's ``LOCK`` file: advisory text, so that a second daemon
refused the directory can say which process holds it. The lock itself is the ``flock``
:class:`pydory.daemon.spool.segments.Spool` holds on that file.

Rule: the pid text is advice only: failing to write it (:func:`write_pid`) or read it
(:func:`read_pid`) never stops a daemon.
"""

from __future__ import annotations

import contextlib
import logging
import os

log = logging.getLogger(__name__)


def write_pid(lock_fd: int, path: str) -> None:
    """The holder's pid in LOCK, for the message a second daemon prints. Advisory only
    (the flock is the lock), so a disk that refuses it (full) is logged, not fatal.
    Written over the old pid before the file is cut to length: a file that had a pid
    needs no new block then."""
    pid = f"{os.getpid()}\n".encode()
    try:
        os.pwrite(lock_fd, pid, 0)
        os.ftruncate(lock_fd, len(pid))
    except OSError as exc:
        with contextlib.suppress(OSError):  # no stale pid, then (a cut needs no space)
            os.ftruncate(lock_fd, 0)
        log.warning(
            "spool: cannot write the pid into [%s] (%s); the directory is locked anyway",
            path,
            exc.strerror or exc,
        )


def read_pid(fd: int) -> int | None:
    """The pid a LOCK file names, if it names one."""
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
