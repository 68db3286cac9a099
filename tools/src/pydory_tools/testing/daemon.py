"""Run a real pydory daemon for tests and demos: a generated config, a thread, a clean stop.

``DaemonConfig`` renders a complete Dory XML config (the same format users write) for
given brokers, socket directory and limits; ``RunningDaemon`` runs ``Server`` on its own
uvloop loop in a background thread and stops it gracefully.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import uvloop

from pydory.config import parse_config
from pydory.daemon.reload import ReloadOutcome
from pydory.server import Server
from pydory_tools.testing.daemon_config import DaemonConfig

T = TypeVar("T")

__all__ = ["DaemonConfig", "RunningDaemon", "running_daemon"]


class RunningDaemon:
    """A ``Server`` on its own event loop thread."""

    def __init__(self, config: DaemonConfig) -> None:
        self.daemon_config = config
        self.server = Server(parse_config(config.render(), source="<test config>"))
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="pydory-daemon", daemon=True)

    def _run(self) -> None:
        try:
            uvloop.run(self.server.serve())
        except BaseException as exc:  # noqa: BLE001 -- re-raised in the test thread by start()/stop()
            self._error = exc
            self.server.ready.set()
            self.server.metadata_ready.set()

    def start(self, timeout: float = 60.0, *, wait_for_metadata: bool = True) -> RunningDaemon:
        """Start the daemon; return once its inputs are open and, unless
        ``wait_for_metadata`` is False, its first metadata is in (until then it holds
        what it reads: tests that want routing from the first message wait)."""
        deadline = time.monotonic() + timeout
        self._thread.start()
        if not self.server.ready.wait(timeout):
            raise TimeoutError("pydory did not open its inputs")
        self._raise_if_failed()
        if wait_for_metadata and not self.server.metadata_ready.wait(
            max(0.0, deadline - time.monotonic())
        ):
            raise TimeoutError("pydory got no metadata from the brokers")
        self._raise_if_failed()
        return self

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise RuntimeError("the pydory server failed") from self._error

    @property
    def tcp_port(self) -> int:
        port = self.server.inputs.tcp_port()
        if port is None:
            raise LookupError("TCP input is not enabled")
        return port

    def call(self, fn: Any, timeout: float = 60.0) -> Any:
        """Run ``fn()`` on the daemon's loop (read the books consistently)."""
        return self.server.call_soon(fn, timeout)

    def snapshot(self) -> dict[str, Any]:
        return self.call(self.server.snapshot)  # type: ignore[no-any-return]

    def reload(self, config: DaemonConfig, timeout: float = 60.0) -> ReloadOutcome:
        """Reload the daemon with ``config`` (what SIGHUP does with the file) and return
        how it went; the daemon keeps running either way."""
        loaded = parse_config(config.render(), source="<test config>")
        future = asyncio.run_coroutine_threadsafe(self.server.reload(loaded), self._loop())
        outcome: ReloadOutcome = future.result(timeout)
        if outcome.ok:
            self.daemon_config = config
        return outcome

    def _loop(self) -> asyncio.AbstractEventLoop:
        loop = self.server._loop
        assert loop is not None, "the daemon is not running"
        return loop

    def stop(self, timeout: float = 60.0) -> None:
        self.server.request_shutdown()
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError("pydory did not shut down in time")
        self._raise_if_failed()


@contextmanager
def running_daemon(config: DaemonConfig) -> Iterator[RunningDaemon]:
    daemon = RunningDaemon(config).start()
    try:
        yield daemon
    finally:
        daemon.stop()
