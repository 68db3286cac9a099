"""`./dev`, the project's entry point, as a newcomer meets it: `./dev help` is a success
that prints the usage, and what Maven prints while fetching jars reaches neither stdout
nor the terminal with its colour codes."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

ROOT = Path(__file__).parents[1]
COMMANDS = ("setup", "test", "demo", "jars", "fuzz", "help")

#: A stand-in for Maven: the escape codes Debian's Maven writes even with
#: --batch-mode -Dstyle.color=never, then the directory the real one fills.
FAKE_MVN = r"""#!/bin/sh
printf '\033[0m\033[0m'
printf '\033[1;33mWARNING\033[m a warning\n'
for arg in "$@"; do
    case "$arg" in -DoutputDirectory=*) mkdir -p "${arg#-DoutputDirectory=}" ;; esac
done
"""


def dev(
    *args: str, cwd: Path = ROOT, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(cwd / "dev"), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,  # a safety net: help and jars with a stand-in Maven take milliseconds
        check=False,
    )


def test_dev_help_exits_0_and_prints_every_command() -> None:
    for spelling in ("help", "--help", "-h"):
        done = dev(spelling)

        assert done.returncode == 0, done.stderr
        assert done.stderr == ""
        for command in COMMANDS:
            assert f"./dev {command}" in done.stdout


def test_an_unknown_command_is_a_usage_error_on_stderr() -> None:
    done = dev("nope")

    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.startswith("dev: no command 'nope'\n")
    assert "./dev test" in done.stderr


def test_fetching_jars_puts_no_escape_code_on_stdout_or_the_terminal(tmp_path: Path) -> None:
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    shutil.copy2(ROOT / "dev", checkout / "dev")
    shutil.copytree(ROOT / "jvm", checkout / "jvm")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("mvn", FAKE_MVN), ("java", "#!/bin/sh\n")):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(stat.S_IRWXU)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}

    done = dev("jars", cwd=checkout, env=env)

    assert done.returncode == 0, done.stderr
    assert done.stdout == ""  # Maven's lines are progress, on stderr
    assert "\033" not in done.stderr
    assert "WARNING a warning" in done.stderr  # what Maven says is kept, without colour
    assert (checkout / ".jars" / "kafka" / ".stamp").is_file()
