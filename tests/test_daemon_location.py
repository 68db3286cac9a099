"""Where `pydory status`, `wait` and `reload` look for the daemon: ``--url``, then
``--config-path``, then ``PYDORY_STATUS_URL``, then the config at the documented default
path, then Dory's 9090; and a refused connection names which it tried and what to pass."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pydory.cli import main
from pydory.commands import daemon_url
from pydory.commands.daemon_url import DEFAULT_URL, locate_daemon
from pydory_tools.testing.daemon import DaemonConfig, RunningDaemon, running_daemon
from pydory_tools.testing.mock_cluster import MockCluster
from pydory_tools.testing.ports import free_loopback_port

SAMPLE_CONFIG = Path(__file__).parents[1] / "docs" / "pydory.sample.xml"
INSTALL_MD = Path(__file__).parents[1] / "docs" / "install.md"


def config_serving(tmp_path: Path, port: int, name: str = "pydory.xml") -> Path:
    """The shipped sample config with its status port changed to ``port``."""
    text = SAMPLE_CONFIG.read_text(encoding="utf-8")
    assert 'port value="8877"' in text
    path = tmp_path / name
    path.write_text(text.replace('port value="8877"', f'port value="{port}"'), encoding="utf-8")
    return path


def test_the_default_config_path_is_the_one_install_md_documents() -> None:
    assert f"sudo install -m 0644 pydory.sample.xml {daemon_url.DEFAULT_CONFIG_PATH}" in (
        INSTALL_MD.read_text(encoding="utf-8")
    )


def test_the_search_order(tmp_path: Path) -> None:
    default = config_serving(tmp_path, 8877, "default.xml")
    named = config_serving(tmp_path, 8001, "named.xml")
    env = {"PYDORY_STATUS_URL": "127.0.0.1:8002"}
    nowhere = str(tmp_path / "absent.xml")

    def url(
        given: str | None, config: Path | None, environ: dict[str, str], default_path: str
    ) -> str:
        path = None if config is None else str(config)
        return locate_daemon(given, path, environ, default_path).url

    assert url("127.0.0.1:8000", None, env, str(default)) == "http://127.0.0.1:8000"
    assert url(None, named, env, str(default)) == "http://127.0.0.1:8001"
    assert url(None, None, env, str(default)) == "http://127.0.0.1:8002"
    assert url(None, None, {}, str(default)) == "http://127.0.0.1:8877"  # the sample's port
    assert url(None, None, {"PYDORY_STATUS_URL": ""}, nowhere) == DEFAULT_URL
    assert DEFAULT_URL == "http://127.0.0.1:9090"


def test_an_unusable_config_at_the_default_path_is_passed_over_and_said(tmp_path: Path) -> None:
    broken = tmp_path / "pydory.xml"
    broken.write_text("<doryConfig>", encoding="utf-8")

    location = locate_daemon(None, None, {}, str(broken))

    assert location.url == DEFAULT_URL
    assert str(broken) in location.found_by


@pytest.fixture
def daemon(
    mock_cluster: MockCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningDaemon]:
    socket_dir = str(tmp_path_factory.mktemp("s", numbered=True))
    with running_daemon(DaemonConfig(mock_cluster.bootstrap_servers, socket_dir)) as running:
        yield running


@pytest.fixture
def no_hints(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No PYDORY_STATUS_URL, and the default config path in a scratch directory."""
    monkeypatch.delenv("PYDORY_STATUS_URL", raising=False)
    default = tmp_path / "etc" / "pydory.xml"
    monkeypatch.setattr(daemon_url, "DEFAULT_CONFIG_PATH", str(default))
    return default


@pytest.mark.parametrize("command", [["status", "books"], ["wait", "--timeout", "60"]])
def test_bare_status_and_wait_find_the_daemon_by_the_config_at_the_default_path(
    daemon: RunningDaemon,
    no_hints: Path,
    command: list[str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    no_hints.parent.mkdir()
    config_serving(no_hints.parent, daemon.daemon_config.http_port)

    assert main(command) == 0, capsys.readouterr().err


@pytest.mark.parametrize("command", [["status", "books"], ["wait", "--timeout", "60"]])
def test_bare_status_and_wait_find_the_daemon_by_the_environment(
    daemon: RunningDaemon,
    no_hints: Path,
    monkeypatch: pytest.MonkeyPatch,
    command: list[str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("PYDORY_STATUS_URL", f"127.0.0.1:{daemon.daemon_config.http_port}")

    assert main(command) == 0, capsys.readouterr().err


@pytest.mark.parametrize("command", ["status", "wait", "reload"])
def test_a_refused_connection_says_where_it_asked_why_and_what_to_pass(
    no_hints: Path, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([command]) == 2
    err = capsys.readouterr().err

    assert err.count("\n") == 1
    assert "http://127.0.0.1:9090 is Dory's default" in err
    assert str(no_hints) in err  # the default config path it looked for
    assert "pass --url HOST:PORT or --config-path FILE" in err
    assert "PYDORY_STATUS_URL" in err


def test_a_refused_connection_names_the_variable_it_came_from(
    no_hints: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    port = free_loopback_port()
    monkeypatch.setenv("PYDORY_STATUS_URL", f"127.0.0.1:{port}")

    assert main(["status"]) == 2

    assert f"http://127.0.0.1:{port} is $PYDORY_STATUS_URL" in capsys.readouterr().err
