"""What every launcher of a process shares: ``with`` stops what the constructor started,
and a process is stopped with SIGTERM, then SIGKILL if it outlasts its grace period."""

from __future__ import annotations

import subprocess
from abc import ABC, abstractmethod
from types import TracebackType
from typing import Any, Self


def terminate_then_kill(process: subprocess.Popen[Any], grace_s: float) -> bool:
    """SIGTERM ``process`` (ours: it is signalled by its Popen, never by name) and reap
    it, SIGKILLing it if it has not exited after ``grace_s``. True when it exited in time."""
    process.terminate()
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        return False
    return True


class StopsOnExit(ABC):
    """A service started by its constructor; leaving a ``with`` block stops it, even on error."""

    @abstractmethod
    def stop(self) -> None:
        """End everything the service started. Stopping twice is harmless."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
