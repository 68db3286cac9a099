"""Copies of the damaged regions that recovery finds, kept beside the spool's segments for
the operator: ``<spool>/corrupt/<segment file>.<start>-<end>.corrupt`` holds the bytes
recovery could not trust (the first ``CORRUPT_COPY_BYTES`` of a larger region), and all
copies together stay within ``CORRUPT_KEEP_BYTES``, the oldest deleted first. A copy that
cannot be written (a full disk) is reported, never raised: it must not stop a start.

Rule: :class:`CorruptCopies` is the only code that writes ``corrupt/``.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass

CORRUPT_DIRECTORY = "corrupt"
"""Copies of damaged regions, beside the segments: ``<segment>.<start>-<end>.corrupt``."""
CORRUPT_COPY_BYTES = 1024 * 1024
"""A damaged region's copy keeps its first MiB (its name still gives the whole range)."""
CORRUPT_KEEP_BYTES = 64 * 1024 * 1024
"""All copies together; the oldest are deleted to make room for a new one."""


@dataclass(frozen=True, slots=True)
class CorruptRegion:
    """A damaged region of a segment and the messages it held.

    ``messages`` is exact when ``exact``; otherwise a lower bound (the damage reaches the
    end of the segment and took the header of its last frame, or a version 1 segment).
    ``saved_as``: the path of its copy (None if it could not be written); ``sample``: its
    first bytes (what the discard log shows of it).
    """

    segment: str
    start: int
    end: int
    messages: int
    exact: bool
    saved_as: str | None
    sample: bytes


class CorruptCopies:
    """``corrupt/``: a copy of each damaged region's bytes (at most ``CORRUPT_COPY_BYTES``
    each), the oldest deleted to keep them all within ``CORRUPT_KEEP_BYTES``."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        # (mtime, name, size) of each copy, oldest first; read from the directory once.
        self._kept: list[tuple[float, str, int]] | None = None

    def save(self, segment: str, start: int, end: int, data: bytes) -> tuple[str | None, str]:
        """Keep ``data``, the first bytes of ``[start, end)`` of ``segment`` (at most
        ``CORRUPT_COPY_BYTES``); return the copy's name, or None and why it could not be
        written (a full disk: reported, never raised)."""
        name = f"{segment}.{start}-{end}.corrupt"
        path = os.path.join(self.directory, name)
        data = data[:CORRUPT_COPY_BYTES]
        try:
            os.makedirs(self.directory, mode=0o700, exist_ok=True)
            self._make_room(name, len(data))
            out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            try:
                written = 0
                while written < len(data):
                    written += os.write(out, data[written:])
            finally:
                os.close(out)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(path)  # a partial copy would claim the whole range
            return None, exc.strerror or str(exc)
        assert self._kept is not None
        self._kept.append((time.time(), name, len(data)))
        return name, ""

    def _make_room(self, name: str, size: int) -> None:
        if self._kept is None:
            self._kept = []
            for entry in os.scandir(self.directory):
                with contextlib.suppress(OSError):
                    stat = entry.stat()
                    self._kept.append((stat.st_mtime, entry.name, stat.st_size))
            self._kept.sort()
        kept = [entry for entry in self._kept if entry[1] != name]  # rewritten below
        total = sum(entry[2] for entry in kept)
        while kept and total + size > CORRUPT_KEEP_BYTES:
            _mtime, oldest, oldest_size = kept.pop(0)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(self.directory, oldest))
            total -= oldest_size
        self._kept = kept
