"""Recovery: the segments a previous run left are read back, repaired, and deleted once replayed.

A segment is always a valid prefix followed at worst by one torn frame (a crash
mid-write): recovery keeps the valid prefix and cuts the rest. A corrupt frame (bad CRC,
impossible lengths) is cut the same way, and a file without a valid header is removed;
both are counted in a :class:`RecoveryReport`, never raised. The :class:`Spool
<pydory.daemon.spool.segments.Spool>` drives it: ``recover()``, ``recovery_report`` and
``finish_recovery()`` delegate here.

Rule: the only code that reads, repairs or removes the segment files found at ``open()``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from pydory.daemon.spool.errors import SpoolError
from pydory.daemon.spool.records import (
    HEADER_BYTES,
    FrameDecoder,
    SpoolRecord,
    header_problem,
    header_segment_id,
)

RECOVERY_CHUNK_BYTES = 1024 * 1024
"""Recovery reads a segment this much at a time (more only for a single larger frame)."""


@dataclass
class RecoveryReport:
    """What ``Spool.recover()`` found. Corrupt data is repaired and counted, never raised.

    ``segments``: segment files read; ``records``: records recovered from them;
    ``repaired_segments``: segments cut at their last good record (torn tail, bad CRC);
    ``removed_segments``: files removed because they held no header (empty, cut inside
    the header, or not a spool file); ``truncated_bytes``: bytes cut or removed;
    ``problems``: one line per file about what was wrong.
    """

    segments: int = 0
    records: int = 0
    repaired_segments: int = 0
    truncated_bytes: int = 0
    problems: list[str] = field(default_factory=list)
    removed_segments: int = 0


class SegmentRecovery:
    """The segments present at ``open()``, until each is read back and then deleted.

    ``error`` turns a failed disk call into the Spool's SpoolError (and counts it);
    ``make_durable`` fsyncs a repaired segment as the Spool's fsync policy says.
    """

    def __init__(
        self,
        error: Callable[[str, OSError], SpoolError],
        make_durable: Callable[[int], None],
    ) -> None:
        self._error = error
        self._make_durable = make_durable
        self.found: list[tuple[int, str]] = []  # segments present at open(), oldest first
        self._recovered: list[tuple[int, str]] = []  # fully read by records(): to delete
        self.bytes_on_disk = 0  # bytes of the files in found and _recovered
        self.report = RecoveryReport()

    @property
    def segments(self) -> int:
        """Segment files awaiting replay: found and not yet deleted."""
        return len(self.found) + len(self._recovered)

    def records(self) -> Iterator[SpoolRecord]:
        """Every record of the found segments, oldest segment first (``Spool.recover()``)."""
        while self.found:
            segment_id, path = self.found[0]
            yield from self._segment_records(segment_id, path)
            self.found.pop(0)

    def _segment_records(self, segment_id: int, path: str) -> Iterator[SpoolRecord]:
        report = self.report
        name = os.path.basename(path)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise self._error(f"cannot open spool segment [{path}]", exc) from exc
        try:
            size = os.fstat(fd).st_size
            header = read_exactly(fd, HEADER_BYTES, 0)
            problem = header_problem(header)
            if problem is not None and problem[1]:  # not a usable spool file: remove it
                report.problems.append(f"{name}: {problem[0]}: removed")
                report.removed_segments += 1
                report.truncated_bytes += size
                os.close(fd)
                fd = -1
                os.unlink(path)
                self.bytes_on_disk -= size
                return
            if problem is not None:  # a newer format: leave it for a newer pydory
                report.problems.append(f"{name}: {problem[0]}: left in place")
                self.bytes_on_disk -= size
                return
            report.segments += 1
            header_id = header_segment_id(header)
            if header_id != segment_id:  # renamed by hand, most likely: records still good
                report.problems.append(f"{name}: its header names segment {header_id}")
            decoder_topics: dict[bytes, str] = {}
            start = HEADER_BYTES  # file offset of buffer[0]
            buffer = b""
            wanted = RECOVERY_CHUNK_BYTES
            while True:
                remaining = size - start - len(buffer)
                if remaining > 0:
                    data = read_exactly(fd, min(wanted, remaining), start + len(buffer))
                    if not data:  # shrunk while being read: its end is here
                        size = start + len(buffer)
                    buffer += data
                decoder = FrameDecoder(buffer, topics=decoder_topics)
                for record in decoder.records():
                    report.records += 1
                    yield record
                start += decoder.offset
                buffer = buffer[decoder.offset :]
                at_end = start + len(buffer) >= size
                reason = decoder.problem
                if reason is None and decoder.needed:
                    if not at_end:
                        wanted = max(RECOVERY_CHUNK_BYTES, decoder.needed - len(buffer))
                        continue
                    reason = (
                        f"torn frame at offset {start}: needs {decoder.needed} bytes, "
                        f"{size - start} left"
                    )
                if reason is None and at_end:
                    break
                if reason is not None:
                    os.ftruncate(fd, start)
                    self._make_durable(fd)
                    report.repaired_segments += 1
                    report.truncated_bytes += size - start
                    report.problems.append(
                        f"{name}: {reason}: truncated to {start} bytes ({size - start} cut)"
                    )
                    self.bytes_on_disk -= size - start
                    break
                wanted = RECOVERY_CHUNK_BYTES
        except OSError as exc:
            raise self._error(f"cannot recover spool segment [{path}]", exc) from exc
        finally:
            if fd >= 0:
                os.close(fd)
        self._recovered.append((segment_id, path))

    def delete_recovered(self) -> None:
        """Delete the segments ``records()`` read to the end (``Spool.finish_recovery()``)."""
        while self._recovered:
            path = self._recovered[0][1]
            try:
                size = os.stat(path).st_size
                os.unlink(path)
            except FileNotFoundError:
                size = 0
            except OSError as exc:
                raise self._error(f"cannot delete recovered segment [{path}]", exc) from exc
            self.bytes_on_disk -= size
            self._recovered.pop(0)


def read_exactly(fd: int, count: int, offset: int) -> bytes:
    """Up to ``count`` bytes at ``offset`` (fewer only at the end of the file)."""
    parts = []
    while count > 0:
        data = os.pread(fd, count, offset)
        if not data:
            break
        parts.append(data)
        count -= len(data)
        offset += len(data)
    return b"".join(parts)
