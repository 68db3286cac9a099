"""The daemon under test, as its own process: ``pydory serve`` on a generated config.

A separate process, so that its CPU time and memory (/proc/<pid>) are the daemon's alone,
and so that it runs exactly as users run it. The harness sees it only through its sockets
and its status interface (/books/json), like any monitoring tool would.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydory.status_client import StatusHttp
from pydory_tools.bench.child import STOP_GRACE_S, BenchError, stderr_tail
from pydory_tools.testing.daemon_config import DaemonConfig
from pydory_tools.testing.daemon_process import DaemonDidNotStart, DaemonProcess, serve_command

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


class BenchDaemon:
    """The daemon under test (the one :class:`DaemonProcess`), measured: its config file
    and stderr live in ``workdir``; its books and settling read through its status pages.

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
        self._cpus = cpus
        self._config_path = workdir / "pydory.xml"
        self._stderr_path = workdir / "pydory.stderr"
        self._daemon: DaemonProcess | None = None

    @property
    def pid(self) -> int:
        return self._process().process.pid

    def start(self, timeout_s: float) -> None:
        """Start the daemon and return once its status interface answers (inputs are open)
        and its first metadata is in (before that it holds what it reads: a round's
        first messages would take the slow path)."""
        self._daemon = DaemonProcess(
            self.config,
            self._config_path,
            self._stderr_path,
            wait_ready=False,
            source=self._source,
            cpus=self._cpus,
        )
        try:
            self._daemon.wait_ready(timeout_s)
        except DaemonDidNotStart as error:
            why = str(error).partition(":")[0]  # the log follows: its tail is enough here
            raise BenchError(f"{why}{self.stderr_tail()}") from None

    @property
    def command(self) -> list[str]:
        """The daemon's command line (under ``taskset`` when pinned)."""
        return serve_command(self._config_path, cpus=self._cpus)

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
        if self._daemon is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):  # killed: nothing to measure
                self._daemon.stop(STOP_GRACE_S)

    def _process(self) -> DaemonProcess:
        if self._daemon is None:
            raise BenchError("pydory has not been started")
        return self._daemon
