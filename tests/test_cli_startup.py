"""The command line starts fast: a command imports only what it needs (issue 23 item 5).

The time itself is a benchmark (BENCHMARKS.md, "CLI start-up"); what a test can hold
steady on a busy machine is which modules a command imports, counted in a fresh process.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest

from pydory.commands import wait as wait_command
from pydory.status import commit_point
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


def heavy(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if any(m == h or m.startswith(f"{h}.") for h in HEAVY))


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
