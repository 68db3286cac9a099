"""``pydory serve`` as a process of its own, for tests and demos that kill it or measure it.

The one such class (issue 30): the tests (``tests/daemon_process.py`` re-exports it), the
kill loop (:mod:`pydory_tools.testing.kill_loop`), ``pydory demo`` and ``pydory bench``
(:mod:`pydory_tools.bench.daemon` measures through it) all run this one.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydory.status_client import DaemonUnreachable, NotAStatusPage, StatusHttp
from pydory_tools.testing.daemon_config import DaemonConfig

START_TIMEOUT_S = 60.0


class DaemonDidNotStart(AssertionError):
    """``pydory serve`` exited or did not answer in time (its log is in the message); an
    AssertionError, so a test that waits for a daemon fails on it like on an assert."""


class DaemonProcess:
    """``pydory serve`` in a process of its own, its output in a log file.

    ``arguments``: more of ``pydory serve``'s options (the demo's ``--log-stderr``).
    ``source``: a directory holding the ``pydory`` package to run instead of the installed
    one (put first on the daemon's PYTHONPATH), e.g. ``src`` of another checkout.
    ``cpus``: the CPUs the daemon may run on (``taskset -c``; None: any).
    """

    def __init__(
        self,
        config: DaemonConfig,
        config_path: Path,
        log_path: Path,
        *,
        wait_ready: bool = True,
        arguments: Sequence[str] = (),
        source: Path | None = None,
        cpus: str | None = None,
    ) -> None:
        config_path.write_text(config.render())
        self.url = f"http://127.0.0.1:{config.http_port}"
        self._log = log_path.open("ab")
        self.process = subprocess.Popen(
            serve_command(config_path, arguments, cpus),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=_environment(source),
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
            exited = self.process.poll()
            if exited is not None or time.monotonic() > deadline:
                self.kill()
                why = (
                    f"exited with status {exited} before it was ready"
                    if exited is not None
                    else f"was not ready after {timeout_s:.0f} s"
                )
                raise DaemonDidNotStart(f"pydory serve {why}: {self.log_path.read_text()}")
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
        return StatusHttp(self.url, timeout_s=60).get_json(name)

    def books(self) -> dict[str, Any]:
        books: dict[str, Any] = self.page("books/json")
        return books

    def counters(self) -> dict[str, int]:
        return {c["name"]: c["value"] for c in self.page("counters/json")["counters"]}

    def kill(self) -> None:
        """SIGKILL: no flush, no shutdown, nothing written after this instant."""
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=60)
        self._log.close()

    def stop(self, timeout_s: float = 60.0) -> int:
        """SIGTERM, and the exit status; a daemon that does not exit in ``timeout_s`` is
        killed (and ``subprocess.TimeoutExpired`` raised). Stopping twice is fine."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=timeout_s)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait(timeout=60)
            self._log.close()


def serve_command(
    config_path: Path, arguments: Sequence[str] = (), cpus: str | None = None
) -> list[str]:
    """``pydory serve``'s command line (under ``taskset`` when pinned to ``cpus``)."""
    serve = [sys.executable, "-m", "pydory", "serve", "--config-path", str(config_path)]
    return [*([] if cpus is None else ["taskset", "-c", cpus]), *serve, *arguments]


def _environment(source: Path | None) -> dict[str, str] | None:
    """The daemon's environment: this one, with ``source`` first on PYTHONPATH if given."""
    if source is None:
        return None
    env = dict(os.environ)
    path = [str(source.resolve()), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in path if p)
    return env
