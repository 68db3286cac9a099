"""`pydory send --lines`: standard input cut into lines, one message each.

As kafka-console-producer reads its input: a line ends at ``\\n`` (a ``\\r`` before it is
part of the ending, as Java's ``readLine``), the ending is not part of the message, and a
last line without one is a line all the same. An empty line is an empty message.

Lines are handed over in the groups they arrived in: :func:`line_batches` reads what is
available (one ``read`` of up to ``read_bytes``) and yields its whole lines at once, so a
stream sender writes them in one write, and a line typed at a terminal leaves as soon as
it is typed. A line longer than the limit is not kept in memory: it is yielded as a
:class:`LongLine` (its number and length) and the rest of it is skipped.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass

READ_BYTES = 1 << 20


@dataclass(frozen=True)
class Line:
    """A whole line: its number (from 1) and its bytes, without the line ending."""

    number: int
    value: bytes


@dataclass(frozen=True)
class LongLine:
    """A line longer than the limit: its number and length (without its final ``\n``)."""

    number: int
    length: int


def line_batches(
    read: Callable[[int], bytes], max_line_bytes: int, read_bytes: int = READ_BYTES
) -> Iterator[list[Line | LongLine]]:
    """The lines of what ``read(n)`` returns until it returns b"" (end of input), grouped
    by the read that completed them."""
    cutter = _LineCutter(max_line_bytes)
    while chunk := read(read_bytes):
        batch = cutter.feed(chunk)
        if batch:
            yield batch
    last = cutter.finish()
    if last:
        yield last


def read_fd(fd: int) -> Callable[[int], bytes]:
    """``read(n)`` on a file descriptor: what is there now, waiting only when nothing is."""
    return lambda size: os.read(fd, size)


class _LineCutter:
    def __init__(self, max_line_bytes: int) -> None:
        self._max = max_line_bytes
        self._partial = bytearray()
        self._long_length: int | None = None  # set while skipping the rest of a long line
        self._number = 0

    def feed(self, chunk: bytes) -> list[Line | LongLine]:
        lines: list[Line | LongLine] = []
        start = 0
        while (end := chunk.find(b"\n", start)) != -1:
            lines.append(self._complete(chunk[start:end]))
            start = end + 1
        self._hold(chunk[start:])
        return lines

    def finish(self) -> list[Line | LongLine]:
        if not self._partial and self._long_length is None:
            return []
        return [self._complete(b"")]

    def _hold(self, piece: bytes) -> None:
        if self._long_length is not None:
            self._long_length += len(piece)
            return
        self._partial += piece
        # One byte of slack: a "\r" that turns out to be part of "\r\n" does not count.
        if len(self._partial) > self._max + 1:
            self._long_length = len(self._partial)
            self._partial.clear()

    def _complete(self, tail: bytes) -> Line | LongLine:
        self._number += 1
        if self._long_length is not None:
            length = self._long_length + len(tail)
            self._long_length = None
            return LongLine(self._number, length)
        value = bytes(self._partial) + tail
        self._partial.clear()
        if value.endswith(b"\r"):
            value = value[:-1]
        if len(value) > self._max:
            return LongLine(self._number, len(value))
        return Line(self._number, value)
