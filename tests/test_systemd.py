"""sd_notify: ``pydory serve`` tells systemd READY=1 once open, RELOADING=1 and READY=1
around a reload, and STOPPING=1 on the way out."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from pydory.daemon import systemd
from pydory_tools.testing.daemon_config import DaemonConfig
from pydory_tools.testing.mock_cluster import MockCluster


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A directory with a short path (UNIX socket paths are limited to 107 bytes)."""
    with tempfile.TemporaryDirectory(prefix="pydory-sd-") as path:
        yield Path(path)


def bound_socket(address: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(address)
    sock.settimeout(60)
    return sock


def test_without_notify_socket_it_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert systemd.notify("READY=1") is False


def test_it_sends_the_state_to_a_socket_path(
    monkeypatch: pytest.MonkeyPatch, short_dir: Path
) -> None:
    path = str(short_dir / "notify")
    with bound_socket(path) as receiver:
        monkeypatch.setenv("NOTIFY_SOCKET", path)
        assert systemd.notify("READY=1") is True
        assert receiver.recv(4096) == b"READY=1"


def test_an_at_sign_means_the_abstract_namespace(monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"pydory-test-notify-{os.getpid()}"
    with bound_socket("\0" + name) as receiver:
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        assert systemd.notify("STOPPING=1") is True
        assert receiver.recv(4096) == b"STOPPING=1"


def test_a_socket_nobody_reads_is_logged_not_raised(
    monkeypatch: pytest.MonkeyPatch, short_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", str(short_dir / "absent"))
    assert systemd.notify("READY=1") is False
    assert "could not tell systemd" in caplog.text


@pytest.mark.slow
def test_serve_is_ready_after_its_inputs_open_and_says_when_it_stops(
    mock_cluster: MockCluster, short_dir: Path
) -> None:
    config = DaemonConfig(mock_cluster.bootstrap_servers, str(short_dir))
    config_path = short_dir / "pydory.xml"
    config_path.write_text(config.render())
    with bound_socket(str(short_dir / "notify")) as receiver:
        process = subprocess.Popen(
            [sys.executable, "-m", "pydory", "serve", "--config-path", str(config_path)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={**os.environ, "NOTIFY_SOCKET": str(short_dir / "notify")},
        )
        try:
            assert receiver.recv(4096) == b"READY=1"
            # Ready means open: both sockets accept messages from here on.
            assert Path(config.datagram_path).exists()
            assert Path(config.stream_path).exists()
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
                client.connect(config.stream_path)
            # A reload (ExecReload's SIGHUP) says RELOADING=1, then READY=1 when done
            # (what Type=notify-reload expects; Type=notify ignores it).
            process.send_signal(signal.SIGHUP)
            reloading = receiver.recv(4096).split(b"\n")
            assert reloading[0] == b"RELOADING=1"
            assert reloading[1].startswith(b"MONOTONIC_USEC=")
            assert receiver.recv(4096) == b"READY=1"
            process.send_signal(signal.SIGTERM)
            assert receiver.recv(4096) == b"STOPPING=1"
            assert process.wait(timeout=60) == 0
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
