"""CPU-bound processes beside the daemon (``pydory bench --contend N``): a busy host, made
on purpose so that anyone can repeat it (issue 34's "four CPU hogs per core").

N processes per core, each a Python loop that never sleeps, started before the bench's
first run and stopped after its last, so every run of every round (raw, pydory, direct,
each spool variant) meets the same contention. They run at the bench's own priority
(niceness), which the daemon, the generators and the baselines inherit too: the hogs
compete with the daemon as equals, as another tenant's work would.

Rule: every hog :func:`cpu_hogs` starts is stopped, by its PID, when its block ends,
however it ends (an error, KeyboardInterrupt, the SIGTERM the CLI turns into an exit).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator

from pydory_tools.testing.lifecycle import terminate_then_kill

__all__ = ["HOG_CODE", "cpu_hogs", "hog_count"]

#: One hog: busy on a CPU until it is signalled (no I/O, no memory to speak of).
HOG_CODE = "while True: pass"
#: How long a hog may take to exit on SIGTERM before it is killed (it has nothing to do).
HOG_STOP_GRACE_S = 5.0


def hog_count(per_core: int, cpus: int | None = None) -> int:
    """How many hogs ``per_core`` per core makes on ``cpus`` cores (default: this host's)."""
    return per_core * (cpus if cpus is not None else os.cpu_count() or 1)


@contextlib.contextmanager
def cpu_hogs(per_core: int, cpus: int | None = None) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Run :func:`hog_count` busy processes while the block runs; yield their Popens.

    At the caller's niceness (a child inherits it), so at the daemon's: the bench starts
    both. Each is stopped by its own Popen (SIGTERM, then SIGKILL), never by name.
    """
    hogs: list[subprocess.Popen[bytes]] = []
    try:
        for _ in range(hog_count(per_core, cpus)):
            hogs.append(
                subprocess.Popen(
                    [sys.executable, "-c", HOG_CODE],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        yield hogs
    finally:
        for hog in hogs:
            terminate_then_kill(hog, HOG_STOP_GRACE_S)
