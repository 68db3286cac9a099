"""The command line as a user meets it: help for every command (the demo: test_demo.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pydory.cli import build_parser, main

COMMANDS = ("serve", "send", "config", "demo")


def test_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    for command in COMMANDS:
        assert command in out


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main([command, "--help"])
    assert exited.value.code == 0
    assert "usage: pydory " + command in capsys.readouterr().out


def test_no_command_prints_usage_and_fails(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "usage: pydory" in capsys.readouterr().err


def test_parser_knows_the_version_flag() -> None:
    assert any("--version" in action.option_strings for action in build_parser()._actions)


def test_a_reader_that_goes_away_stops_the_command_quietly() -> None:
    """`pydory config check ... | head -1`: no BrokenPipeError traceback (issue 23 item 8)."""
    sample = Path(__file__).parent.parent / "docs" / "pydory.sample.xml"
    command = [sys.executable, "-m", "pydory", "config", "check", str(sample)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stdout is not None
    assert process.stderr is not None
    process.stdout.close()  # the reader is gone before the command writes a byte
    stderr = process.stderr.read().decode()
    assert process.wait(timeout=60) == 1
    assert "Traceback" not in stderr
    assert "BrokenPipeError" not in stderr
