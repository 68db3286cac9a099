"""The daemon under test, as its own process: ``pydory serve`` on a generated config.

A separate process, so that its CPU time and memory (/proc/<pid>) are the daemon's alone,
and so that it runs exactly as users run it. The harness sees it only through its sockets
and its status interface (/books/json), like any monitoring tool would.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydory.status_client import DaemonUnreachable, NotAStatusPage, StatusHttp
from pydory_tools.bench.child import BenchError, stderr_tail, stop_process
from pydory_tools.testing.daemon_config import DaemonConfig

#: Between two looks at the status interface while the daemon starts.
STARTUP_POLL_S = 0.05
#: Bounds on the interval between two looks at /books/json while waiting for the last
#: acknowledgement: the error on the end time is at most the interval (plus one request).
SETTLE_POLL_MIN_S = 0.005
SETTLE_POLL_MAX_S = 0.2
HTTP_TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True)
class TopicBooks:
    """One topic's line of /books/json."""

    accepted: int
    delivered: int
    discarded: dict[str, int]  # reason -> count, before and after acceptance

    @property
    def settled(self) -> int:
        """Messages with a final outcome: delivered, or discarded for a reason."""
        return self.delivered + sum(self.discarded.values())


class DaemonProcess:
    """``pydory serve`` in a child process; its config file and stderr live in ``workdir``.

    ``source``: a directory holding the ``pydory`` package to run instead of the installed
    one (put first on the daemon's PYTHONPATH), e.g. ``src`` of another checkout.
    ``cpus``: the CPUs the daemon may run on (``taskset -c``; None: any).
    """

    def __init__(
        self,
        config: DaemonConfig,
        workdir: Path,
        source: Path | None = None,
        cpus: str | None = None,
    ) -> None:
        self.config = config
        self._source = source
        self._pinned = [] if cpus is None else ["taskset", "-c", cpus]
        self._config_path = workdir / "pydory.xml"
        self._stderr_path = workdir / "pydory.stderr"
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        return self._process().pid

    def start(self, timeout_s: float) -> None:
        """Start the daemon and return once its status interface answers (inputs are open)
        and its first metadata is in (before that it holds what it reads: a round's
        first messages would take the slow path)."""
        self._config_path.write_text(self.config.render())
        with open(self._stderr_path, "wb") as stderr:
            self._proc = subprocess.Popen(
                self.command,
                stdin=subprocess.DEVNULL,
                stdout=stderr,
                stderr=stderr,
                env=self._environment(),
            )
        deadline = time.monotonic() + timeout_s
        while not self._answers():
            if self._proc.poll() is not None:
                raise BenchError(
                    f"pydory exited with status {self._proc.returncode} at start-up"
                    f"{self.stderr_tail()}"
                )
            if time.monotonic() > deadline:
                raise BenchError(
                    f"pydory was not ready after {timeout_s:.0f} s{self.stderr_tail()}"
                )
            time.sleep(STARTUP_POLL_S)

    @property
    def command(self) -> list[str]:
        """The daemon's command line (under ``taskset`` when pinned)."""
        serve = [sys.executable, "-m", "pydory", "serve", "--config-path", str(self._config_path)]
        return [*self._pinned, *serve]

    def _environment(self) -> dict[str, str]:
        env = dict(os.environ)
        if self._source is not None:
            path = [str(self._source.resolve()), env.get("PYTHONPATH", "")]
            env["PYTHONPATH"] = os.pathsep.join(p for p in path if p)
        return env

    def _answers(self) -> bool:
        try:
            books = self._get("/books/json")
        except (DaemonUnreachable, NotAStatusPage):
            return False
        return bool(books.get("metadata_known", True))  # absent: a daemon from before it

    def books(self, topic: str) -> TopicBooks:
        """The daemon's lifetime accounting for ``topic`` (zeros before its first message)."""
        for line in self._get("/books/json")["topics"]:
            if line["topic"] == topic:
                return TopicBooks(line["accepted"], line["delivered"], dict(line["discarded"]))
        return TopicBooks(0, 0, {})

    def wait_settled(self, topic: str, expected: int, deadline: float) -> tuple[float, TopicBooks]:
        """Return (the monotonic time, the books) when ``expected`` messages of ``topic``
        have their final outcome.

        The status interface is the only window into the daemon, so this polls it, as
        rarely as the remaining work allows: the interval shrinks with the estimated time
        left, to SETTLE_POLL_MIN_S near the end, so the end time is sharp while the
        requests cost the daemon little.
        """
        previous_time, previous_settled = time.monotonic(), self.books(topic).settled
        while True:
            now = time.monotonic()
            books = self.books(topic)
            if books.settled >= expected:
                return now, books
            if now > deadline:
                raise BenchError(
                    f"pydory settled {books.settled} of {expected} messages before the "
                    f"deadline; books: {books}{self.stderr_tail()}"
                )
            rate = (books.settled - previous_settled) / max(now - previous_time, 1e-6)
            previous_time, previous_settled = now, books.settled
            left_s = (expected - books.settled) / rate if rate > 0 else SETTLE_POLL_MAX_S
            time.sleep(min(SETTLE_POLL_MAX_S, max(SETTLE_POLL_MIN_S, left_s / 4)))

    def _get(self, path: str) -> Any:
        return StatusHttp(f"127.0.0.1:{self.config.http_port}", HTTP_TIMEOUT_S).get_json(path)

    def stderr_tail(self) -> str:
        return stderr_tail("pydory", self._stderr_path)

    def stop(self) -> None:
        """SIGTERM (a graceful shutdown), then SIGKILL if it outlasts the grace period."""
        if self._proc is not None:
            stop_process(self._proc)

    def _process(self) -> subprocess.Popen[bytes]:
        if self._proc is None:
            raise BenchError("pydory has not been started")
        return self._proc
