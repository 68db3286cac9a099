"""`pydory serve` as a user first meets it, in its own process: what it prints in the
foreground, and one line naming the config element when an address is taken (issue 23
items 8 and 9)."""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pydory_tools.testing.daemon_config import DaemonConfig
from pydory_tools.testing.mock_cluster import MockCluster

PYDORY = str(Path(sys.executable).parent / "pydory")
START_TIMEOUT_S = 60


@pytest.fixture
def socket_dir() -> Iterator[str]:
    # UNIX socket paths are limited to ~108 bytes: keep them short.
    with tempfile.TemporaryDirectory(prefix="pydory-sv-") as path:
        yield path


def write_config(config: DaemonConfig) -> str:
    path = os.path.join(config.socket_dir, "pydory.xml")
    Path(path).write_text(config.render())
    return path


def serve(config: DaemonConfig) -> subprocess.CompletedProcess[str]:
    """`pydory serve` on a config it must refuse: its exit status and output."""
    return subprocess.run(
        [PYDORY, "serve", "--config-path", write_config(config)],
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT_S,
        check=False,
    )


def stderr_lines_until(process: subprocess.Popen[bytes], marker: str) -> list[str]:
    """The lines ``process`` writes to stderr, up to the first one holding ``marker``
    (read from the pipe itself: a buffered reader would hide lines from select)."""
    assert process.stderr is not None
    fd = process.stderr.fileno()
    received = b""
    deadline = time.monotonic() + START_TIMEOUT_S
    while marker.encode() not in received:
        assert process.poll() is None, f"pydory serve exited: {received!r}"
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"no {marker!r} on stderr in {START_TIMEOUT_S} s: {received!r}"
        readable, _, _ = select.select([fd], [], [], remaining)
        if readable:
            received += os.read(fd, 65536)
    return received.decode().splitlines()


def test_serve_in_the_foreground_says_where_it_logs_and_when_it_is_ready(
    mock_cluster: MockCluster, socket_dir: str
) -> None:
    config = DaemonConfig(mock_cluster.bootstrap_servers, socket_dir)
    process = subprocess.Popen(
        [PYDORY, "serve", "--config-path", write_config(config)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        lines = stderr_lines_until(process, "ready:")
    finally:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=START_TIMEOUT_S)

    starting, ready = lines[0], next(line for line in lines if "ready:" in line)
    assert starting.startswith(f"pydory serve: starting (pid {process.pid}")
    # DaemonConfig logs nowhere at all: the line says so, and how to see the log.
    assert "logging to nowhere" in starting
    assert "--log-stderr" in starting
    assert ready.startswith("pydory serve: ready: ")
    assert f"UNIX datagram socket {config.datagram_path}" in ready
    assert f"TCP port 127.0.0.1:{config.tcp_port}" in ready
    assert f"status pages http://127.0.0.1:{config.http_port}/" in ready


def refusal(result: subprocess.CompletedProcess[str]) -> str:
    """The one line saying why the daemon did not start (no traceback)."""
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    [line] = [x for x in result.stderr.splitlines() if x.startswith("Error in config file")]
    return line


def test_a_tcp_port_in_use_is_one_line_naming_the_element_and_the_port(
    mock_cluster: MockCluster, socket_dir: str
) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        config = DaemonConfig(mock_cluster.bootstrap_servers, socket_dir, tcp_port=port)

        line = refusal(serve(config))

    assert line.startswith("Error in config file: /doryConfig/inputSources/tcp/port: ")
    assert f"127.0.0.1 port {port}: Address already in use" in line


def test_the_status_port_in_use_is_one_line_naming_the_element(
    mock_cluster: MockCluster, socket_dir: str
) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        config = DaemonConfig(mock_cluster.bootstrap_servers, socket_dir, http_port=port)

        line = refusal(serve(config))

    assert line.startswith("Error in config file: /doryConfig/httpInterface/port: ")
    assert f"port {port}" in line


@pytest.mark.parametrize(
    ("kind", "element"),
    [(socket.SOCK_STREAM, "unixStream"), (socket.SOCK_DGRAM, "unixDatagram")],
    ids=["stream", "datagram"],
)
def test_a_socket_path_in_use_is_one_line_naming_the_element(
    mock_cluster: MockCluster, socket_dir: str, kind: int, element: str
) -> None:
    config = DaemonConfig(mock_cluster.bootstrap_servers, socket_dir)
    path = config.stream_path if kind == socket.SOCK_STREAM else config.datagram_path
    with socket.socket(socket.AF_UNIX, kind) as other_process:
        other_process.bind(path)
        if kind == socket.SOCK_STREAM:
            other_process.listen()

        line = refusal(serve(config))

    assert line.startswith(f"Error in config file: /doryConfig/inputSources/{element}/path: ")
    assert path in line


def test_the_daemon_freezes_start_up_objects_and_widens_the_young_generation() -> None:
    """Run in a child: it changes the collector of the whole process."""
    probe = (
        "import gc; from pydory.commands.serve import GC_YOUNG_THRESHOLD, "
        "tune_garbage_collector as tune; before = gc.get_threshold(); tune(); "
        "after = gc.get_threshold(); "
        "assert after == (GC_YOUNG_THRESHOLD, *before[1:]), (before, after); "
        "assert gc.get_freeze_count() > 1000, gc.get_freeze_count(); print('ok')"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.stdout.strip() == "ok", done.stderr
