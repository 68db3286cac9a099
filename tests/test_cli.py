"""The command line as a user meets it: help for every command (the demo: test_demo.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pydory.cli import build_parser, main
from pydory_tools.commands import demo as demo_command

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


# --- the Spark commands on a daemon-only install (issue 23 item 4) ---------------------------

# As on a host with `pip install pydory` only: PySpark, py4j and pyarrow cannot be imported.
WITHOUT_SPARK = """
import sys
for name in ("pyspark", "py4j", "pyarrow"):
    sys.modules[name] = None
from pydory.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize(
    "argv",
    [
        [
            *("pipeline", "land", "--bootstrap", "127.0.0.1:1", "--topics", "t"),
            *("--lake", "lake", "--checkpoint", "checkpoint"),
        ],
        ["pipeline", "audit", "--lake", "lake"],
        ["demo", "--kafka", "127.0.0.1:1", "--workdir", "demo"],
    ],
    ids=lambda argv: " ".join(argv[:2]),
)
def test_a_spark_command_without_the_spark_extra_says_what_to_install(
    argv: list[str], tmp_path: Path
) -> None:
    result = subprocess.run(
        [sys.executable, "-c", WITHOUT_SPARK, *argv],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        check=False,
    )

    assert result.returncode == 1
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(f"pydory {argv[0]}: this needs `pip install 'pydory[spark]'`")
    assert list(tmp_path.iterdir()) == []  # nothing started, nothing written


# --- the tools' commands on a daemon-only install (issue 30 item 5) ---------------------------

# As on a host with `pip install pydory` only: the tools' package cannot be imported.
WITHOUT_TOOLS = """
import sys
sys.modules["pydory_tools"] = None
from pydory.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize(
    "argv",
    [["demo", "--kafka", "mock"], ["bench", "--rounds", "1"], ["bench", "--help"]],
    ids=" ".join,
)
def test_a_tools_command_without_the_tools_says_what_to_install(
    argv: list[str], tmp_path: Path
) -> None:
    result = subprocess.run(
        [sys.executable, "-c", WITHOUT_TOOLS, *argv],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        check=False,
    )

    assert result.returncode == 1
    assert result.stderr == (
        f"pydory {argv[0]}: this needs `pip install pydory-tools` "
        "(no module named 'pydory_tools' here)\n"
    )
    assert list(tmp_path.iterdir()) == []  # nothing started, nothing written


def test_help_lists_the_tools_commands_with_what_they_need(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])

    listing = " ".join(capsys.readouterr().out.split())  # argparse wraps the lines
    for command in ("demo", "bench"):
        assert "(needs pip install pydory-tools" in listing.split(f" {command} ", 1)[1]


def test_help_says_which_commands_need_the_spark_extra(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])

    listing = " ".join(capsys.readouterr().out.split())  # argparse wraps the lines
    for command in ("demo", "pipeline"):
        after = listing.split(f" {command} ", 1)[1]
        assert after.split(" bench ")[0].split(")")[0].endswith("pip install 'pydory[spark]'")


def test_the_demo_on_an_installed_host_says_what_to_do_without_kafkas_jars(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Installed from a wheel, there is no ./dev and no .jars/: the advice must not send the
    user into the venv's directories or to a script they do not have."""
    monkeypatch.setattr(demo_command, "source_checkout", lambda: None, raising=False)
    monkeypatch.setenv("PYDORY_KAFKA_JARS", str(tmp_path / "no-jars-here"))

    status = main(["demo", "--workdir", str(tmp_path / "demo")])

    out, err = capsys.readouterr()
    assert status == 1
    assert err.startswith("pydory demo: ")
    assert "--kafka mock" in err
    assert "PYDORY_KAFKA_JARS" in err
    assert "./dev" not in out + err
    assert "site-packages" not in out + err
    assert not (tmp_path / "demo").exists()  # refused before anything started
