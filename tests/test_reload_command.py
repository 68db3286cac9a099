"""``pydory reload`` and SIGHUP on a ``pydory serve`` process: the file is read again;
an invalid file is refused (by the command before any signal, or by the daemon, which
runs on unchanged); the outcome is on /config/json and in the exit status."""

from __future__ import annotations

import dataclasses
import signal
from pathlib import Path

import pytest

from daemon_process import DaemonProcess
from helpers import wait_until
from pydory.cli import main
from pydory.client import UnixStreamSender
from pydory.client.messages import encode_message
from pydory_tools.testing.daemon_config import DaemonConfig
from pydory_tools.testing.mock_cluster import MockCluster
from pydory_tools.testing.ports import free_loopback_port

pytestmark = [pytest.mark.timeout(120)]


@pytest.fixture
def daemon(
    mock_cluster: MockCluster, tmp_path_factory: pytest.TempPathFactory
) -> tuple[DaemonProcess, DaemonConfig, Path]:
    mock_cluster.create_topic("t", partitions=2)
    socket_dir = tmp_path_factory.mktemp("s", numbered=True)
    config = DaemonConfig(mock_cluster.bootstrap_servers, str(socket_dir))
    config_path = socket_dir / "pydory.xml"
    process = DaemonProcess(config, config_path, socket_dir / "pydory.log")
    yield process, config, config_path
    assert process.stop() == 0


def test_reload_applies_a_valid_file_and_says_what_changed(
    daemon: tuple[DaemonProcess, DaemonConfig, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    process, config, config_path = daemon
    config_path.write_text(dataclasses.replace(config, compression="gzip").render())
    assert main(["reload", "--config-path", str(config_path)]) == 0
    assert capsys.readouterr().out == "reloaded: compression\n"
    page = process.page("config/json")
    assert page["path"] == str(config_path)
    assert page["reloads"] == {"attempted": 1, "succeeded": 1, "failed": 0}
    assert page["last_reload"]["changed"] == ["compression"]
    assert process.counters()["config_reloads"] == 1


def test_a_restart_only_change_is_named(
    daemon: tuple[DaemonProcess, DaemonConfig, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    process, config, config_path = daemon
    moved = dataclasses.replace(config, http_port=free_loopback_port(), max_buffer="32m")
    config_path.write_text(moved.render())
    assert main(["reload", "--url", process.url]) == 0
    assert capsys.readouterr().out == (
        "reloaded: inputConfig\n  <httpInterface> changed: takes effect at the next restart\n"
    )
    assert process.books()["pool"]["budget"] == 32 * 1024 * 1024  # on the old port still


def test_the_command_refuses_an_invalid_file_without_signalling(
    daemon: tuple[DaemonProcess, DaemonConfig, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    process, config, config_path = daemon
    config_path.write_text(
        config.render().replace('<level value="INFO" />', '<level value="LOUD" />')
    )
    assert main(["reload", "--config-path", str(config_path)]) == 1
    assert "/doryConfig/logging/level" in capsys.readouterr().err
    assert process.page("config/json")["reloads"]["attempted"] == 0


def test_sighup_with_an_invalid_file_keeps_the_daemon_running_on_the_old_config(
    daemon: tuple[DaemonProcess, DaemonConfig, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    process, config, config_path = daemon
    config_path.write_text(config.render().replace("<batching>", "<batching><bogus/>", 1))
    # Through the URL, the command does not check the file: the daemon refuses it.
    assert main(["reload", "--url", process.url]) == 1
    assert "reload refused" in capsys.readouterr().out
    page = process.page("config/json")
    assert page["reloads"] == {"attempted": 1, "succeeded": 0, "failed": 1}
    assert "bogus" in page["last_reload"]["errors"][0]
    assert process.counters()["config_reload_failures"] == 1
    assert "config reload refused" in process.log_path.read_text()
    # A plain SIGHUP, as systemd's ExecReload sends it, with the file fixed again.
    config_path.write_text(dataclasses.replace(config, batching_time_ms=7).render())
    process.process.send_signal(signal.SIGHUP)
    wait_until(lambda: process.page("config/json")["reloads"]["succeeded"] == 1)
    with UnixStreamSender(config.stream_path) as client:
        client.send_many(encode_message("t", b"%d" % i) for i in range(50))
    wait_until(lambda: _delivered(process, "t") == 50)


def _delivered(process: DaemonProcess, topic: str) -> int:
    for totals in process.books()["topics"]:
        if totals["topic"] == topic:
            return int(totals["delivered"])
    return 0


def test_reload_without_a_daemon_is_unreachable(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["reload", "--url", "127.0.0.1:1", "--timeout", "1"]) == 2
    assert "cannot reach" in capsys.readouterr().err
