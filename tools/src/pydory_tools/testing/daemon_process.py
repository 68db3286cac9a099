"""``pydory serve`` as a process of its own, for tests and demos that kill it or measure it.

Moved here from ``tests/daemon_process.py`` (which re-exports it) so that the kill loop
(:mod:`pydory_tools.testing.kill_loop`) and ``pydory demo --sigkill`` run the same daemon process
as the tests.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from pydory.status_client import DaemonUnreachable, NotAStatusPage, StatusHttp
from pydory_tools.testing.daemon_config import DaemonConfig

START_TIMEOUT_S = 60.0


class DaemonDidNotStart(AssertionError):
    """``pydory serve`` exited or did not answer in time (its log is in the message); an
    AssertionError, so a test that waits for a daemon fails on it like on an assert."""


class DaemonProcess:
    """``pydory serve`` in a process of its own, its output in a log file."""

    def __init__(
        self, config: DaemonConfig, config_path: Path, log_path: Path, *, wait_ready: bool = True
    ) -> None:
        config_path.write_text(config.render())
        self.url = f"http://127.0.0.1:{config.http_port}"
        self._log = log_path.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "pydory", "serve", "--config-path", str(config_path)],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        self.log_path = log_path
        if wait_ready:
            self.wait_ready()

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S, *, metadata: bool = True) -> None:
        """Until the status pages answer and, if ``metadata``, the first metadata is in
        (the daemon opens before Kafka answers and holds what it reads until then;
        tests that count deliveries from the first message wait for it)."""
        deadline = time.monotonic() + timeout_s
        while not (self.answers() and (not metadata or self.has_metadata())):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise DaemonDidNotStart(f"pydory serve did not start: {self.log_path.read_text()}")
            time.sleep(0.05)

    def has_metadata(self) -> bool:
        return bool(self.books().get("metadata_known", True))

    def answers(self) -> bool:
        """Whether the status pages answer (the daemon has replayed its spool and opened)."""
        try:
            self.books()
        except (DaemonUnreachable, NotAStatusPage):
            return False
        return True

    def peak_rss_bytes(self) -> int:
        """``VmHWM``: the process's peak resident set so far."""
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmHWM in /proc/PID/status")

    def page(self, name: str) -> Any:
        return StatusHttp(self.url, timeout_s=30).get_json(name)

    def books(self) -> dict[str, Any]:
        books: dict[str, Any] = self.page("books/json")
        return books

    def counters(self) -> dict[str, int]:
        return {c["name"]: c["value"] for c in self.page("counters/json")["counters"]}

    def kill(self) -> None:
        """SIGKILL: no flush, no shutdown, nothing written after this instant."""
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)
        self._log.close()

    def stop(self) -> int:
        """SIGTERM, and the exit status; a daemon that does not exit in time is killed."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=60)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait(timeout=30)
            self._log.close()
