"""What Linux's /proc says about a process (CPU time, memory) and the host's socket limits."""

from __future__ import annotations

import os
from pathlib import Path

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
#: Fields of /proc/<pid>/stat after the command name: utime and stime are the 12th and 13th.
_UTIME_AFTER_COMM = 11
MAX_DGRAM_QLEN_FILE = Path("/proc/sys/net/unix/max_dgram_qlen")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of every thread of ``pid`` so far (10 ms resolution)."""
    return sum(_cpu_ticks(pid)) / _CLOCK_TICKS


def system_cpu_seconds(pid: int) -> float:
    """The system (kernel) part of :func:`cpu_seconds`: the sockets' work, the writes."""
    return _cpu_ticks(pid)[1] / _CLOCK_TICKS


def _cpu_ticks(pid: int) -> tuple[int, int]:
    """(utime, stime) of every thread of ``pid`` so far, in clock ticks."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    # The command name is in parentheses and may hold spaces: split after its ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[_UTIME_AFTER_COMM]), int(fields[_UTIME_AFTER_COMM + 1])


def memory_mb(pid: int, field: str) -> float:
    """A memory line of /proc/<pid>/status in MiB: ``VmRSS`` now, ``VmHWM`` its peak."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name == field:
            return int(value.split()[0]) / 1024  # the kernel reports kB
    raise LookupError(f"/proc/{pid}/status has no {field} line")


def max_dgram_qlen() -> int | None:
    """``net.unix.max_dgram_qlen``: how many datagrams a UNIX socket queues before senders block."""
    try:
        return int(MAX_DGRAM_QLEN_FILE.read_text())
    except (OSError, ValueError):
        return None
