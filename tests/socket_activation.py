"""The test as systemd: it creates the input sockets, as a ``.socket`` unit does, and starts
``pydory serve`` on them the way systemd starts a socket-activated service (sd_listen_fds:
the sockets at descriptors 3, 4, ..., ``LISTEN_FDS``, ``LISTEN_FDNAMES``, and
``LISTEN_PID`` naming the process itself, which only a launcher in the child can know).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from pydory.status_client import DaemonUnreachable, NotAStatusPage, StatusHttp
from pydory_tools.testing.daemon_config import DaemonConfig

#: Run in the child: the passed sockets moved to 3, 4, ...; the variables set; exec.
LAUNCHER = """
import fcntl, os, sys
fds = [int(fd) for fd in sys.argv[1].split(",") if fd]
high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 100) for fd in fds]
for index, fd in enumerate(high):
    os.dup2(fd, 3 + index)  # inheritable
    os.close(fd)
os.environ.update(
    LISTEN_FDS=str(len(fds)), LISTEN_PID=str(os.getpid()), LISTEN_FDNAMES=sys.argv[2]
)
os.execv(sys.argv[3], sys.argv[3:])
"""


class UnitSockets:
    """What a ``.socket`` unit holds: the datagram, stream and TCP sockets a config names,
    open for as long as the test (not any daemon) keeps them."""

    def __init__(self, config: DaemonConfig) -> None:
        self.sockets: list[tuple[str, socket.socket]] = []
        if config.unix_datagram:
            datagram = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            datagram.bind(config.datagram_path)
            os.chmod(config.datagram_path, 0o666)
            self.sockets.append(("datagram", datagram))
        if config.unix_stream:
            stream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            stream.bind(config.stream_path)
            os.chmod(config.stream_path, 0o666)
            stream.listen(128)
            self.sockets.append(("stream", stream))
        if config.tcp_port is not None:
            tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            tcp.bind(("127.0.0.1", config.tcp_port))
            tcp.listen(128)
            self.sockets.append(("tcp", tcp))

    def close(self) -> None:
        for _, sock in self.sockets:
            sock.close()


class ActivatedDaemon:
    """``pydory serve`` started on ``sockets`` as systemd starts it."""

    def __init__(
        self,
        sockets: list[tuple[str, socket.socket]],
        config: DaemonConfig,
        config_path: Path,
        log_path: Path,
        *,
        env: dict[str, str] | None = None,
    ) -> None:
        config_path.write_text(config.render())
        self.url = f"http://127.0.0.1:{config.http_port}"
        self.log_path = log_path
        fds = [sock.fileno() for _, sock in sockets]
        names = ":".join(name for name, _ in sockets)
        command = [sys.executable, "-m", "pydory", "serve", "--config-path", str(config_path)]
        with log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-c", LAUNCHER, ",".join(map(str, fds)), names, *command],
                pass_fds=fds,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            )

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        """Until the status pages answer and the first metadata is in (a far-off net)."""
        deadline = time.monotonic() + timeout_s
        while not self._ready():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"pydory serve did not start: {self.log_path.read_text()}")
            time.sleep(0.05)

    def _ready(self) -> bool:
        try:
            return bool(self.books().get("metadata_known", True))
        except (DaemonUnreachable, NotAStatusPage):
            return False

    def books(self) -> dict[str, object]:
        books: dict[str, object] = StatusHttp(self.url, timeout_s=60).get_json("books/json")
        return books

    def received(self) -> dict[str, int]:
        received = self.books()["received"]
        assert isinstance(received, dict)
        return {str(k): int(v) for k, v in received.items()}
