"""The command line starts fast: a command imports only what it needs (issue 23 item 5).

The time itself is a benchmark (BENCHMARKS.md, "CLI start-up"); what a test can hold
steady on a busy machine is which modules a command imports, counted in a fresh process.
"""

from __future__ import annotations

import ast
import json
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from pydory.commands import wait as wait_command
from pydory.status import commit_point
from pydory.status_client import DaemonUnreachable, NotAStatusPage, StatusHttp
from pydory_tools.testing.daemon_config import DaemonConfig
from pydory_tools.testing.mock_cluster import MockCluster
from receivers import receive_datagram

# Run the command as the console script does, then list every module the process holds.
PROGRAM = """
import json, sys
from pydory.cli import main
try:
    status = main(sys.argv[1:])
except SystemExit as exit:
    status = exit.code
sys.stdout.flush()
print(json.dumps(sorted(sys.modules)), file=sys.stderr)
"""

#: The daemon, its status interface, the Spark side and the benchmark, and their libraries.
HEAVY = (
    "pydory.daemon",
    "pydory.server",
    "pydory.status",
    "pydory.pipeline",
    "pydory_tools.bench",
    "pydory_tools.testing",
    "pydory_tools.demo",
    "confluent_kafka",
    "aiohttp",
    "uvloop",
    "prometheus_client",
    "pyspark",
)


#: What a production host never needs: the tools' distribution (test brokers, harnesses,
#: kill loop, pytest fixtures, the benchmark and its _cloadgen, the demos) and pytest.
TOOLS = ("pydory_tools", "pytest", "_pytest")


def modules_imported_by(argv: list[str]) -> set[str]:
    result = subprocess.run(
        [sys.executable, "-c", PROGRAM, *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    modules: list[str] = json.loads(result.stderr.splitlines()[-1])
    return set(modules)


def heavy(modules: set[str], names: tuple[str, ...] = HEAVY) -> list[str]:
    return sorted(m for m in modules if any(m == h or m.startswith(f"{h}.") for h in names))


def test_pydory_send_imports_nothing_of_the_daemon_spark_or_the_bench(
    datagram_path: str, datagram_receiver: socket.socket
) -> None:
    modules = modules_imported_by(
        ["send", "--socket-path", datagram_path, "--topic", "t", "--value", "v"]
    )

    assert receive_datagram(datagram_receiver).value == b"v"  # it did send
    assert "pydory.commands.send" in modules
    assert heavy(modules) == []
    assert "importlib.metadata" not in modules  # tens of ms just to read the version


@pytest.mark.parametrize(
    "argv",
    [["--help"], ["send", "--help"], ["status", "--help"], ["wait", "--help"]],
    ids=" ".join,
)
def test_the_quick_commands_import_no_server_library(argv: list[str]) -> None:
    modules = modules_imported_by(argv)

    # `pydory status` names the counters and discard reasons as the books spell them.
    allowed = {"pydory.daemon", "pydory.daemon.books"} | {
        m for m in modules if m.startswith("pydory.daemon.books.")
    }
    assert heavy(modules - allowed) == []


def test_help_imports_no_command_module() -> None:
    modules = modules_imported_by(["--help"])

    assert sorted(m for m in modules if m.startswith("pydory.commands.")) == []


def test_wait_long_polls_no_longer_than_the_status_server_allows() -> None:
    assert wait_command.LONG_POLL_MAX_S == commit_point.LONG_POLL_MAX_S


def test_pydory_serve_runs_without_any_module_of_the_tools(mock_cluster: MockCluster) -> None:
    """Issue 30 item 5: the daemon's whole import closure, from start through delivery to a
    graceful stop (modules imported late included), holds nothing of the tools."""
    topic = "serve-closure"
    mock_cluster.create_topic(topic, 1)
    with tempfile.TemporaryDirectory(prefix="pydory-sc-") as short:  # socket paths are short
        config = DaemonConfig(mock_cluster.bootstrap_servers, short)
        config_path = Path(short) / "pydory.xml"
        config_path.write_text(config.render())
        serve = subprocess.Popen(
            [sys.executable, "-c", PROGRAM, "serve", "--config-path", str(config_path)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            status = StatusHttp(f"http://127.0.0.1:{config.http_port}", timeout_s=60)
            wait_until(lambda: delivered(status, topic) == 0, serve)  # open, metadata in
            subprocess.run(
                [
                    *(sys.executable, "-m", "pydory", "send"),
                    *("--socket-path", config.datagram_path, "--topic", topic, "--value", "v"),
                ],
                check=True,
                timeout=60,
            )
            wait_until(lambda: delivered(status, topic) == 1, serve)
            serve.send_signal(signal.SIGTERM)
            _, stderr = serve.communicate(timeout=120)
        finally:
            if serve.poll() is None:
                serve.kill()
                serve.wait()

    assert serve.returncode == 0, stderr
    modules = set(json.loads(stderr.splitlines()[-1]))
    assert "pydory.server" in modules  # it is the daemon's closure
    assert heavy(modules, TOOLS) == []


def test_the_daemons_package_imports_nothing_of_the_tools() -> None:
    """The arrow runs one way (ARCHITECTURE.md): every import statement under src/pydory,
    those inside functions included; the CLI names the tools' two commands by string."""
    package = Path(__file__).parents[1] / "src" / "pydory"
    found = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            found += [f"{path}: {name}" for name in names if name.split(".")[0] in TOOLS]
    assert found == []


def delivered(status: StatusHttp, topic: str) -> int | None:
    """The topic's delivered count; None while the daemon does not answer or has no
    metadata yet."""
    try:
        books = status.get_json("books/json")
    except (DaemonUnreachable, NotAStatusPage):
        return None
    if not books.get("metadata_known", True):
        return None
    lines = [line for line in books["topics"] if line["topic"] == topic]
    return lines[0]["delivered"] if lines else 0


def wait_until(condition: Callable[[], bool], process: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 120  # a safety net only
    while not condition():
        assert process.poll() is None, f"pydory serve exited: {process.communicate()[1]}"
        assert time.monotonic() < deadline, "pydory serve did not get there in 120 s"
        time.sleep(0.05)
