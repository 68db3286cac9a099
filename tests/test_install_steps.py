"""docs/install.md's deploy steps, run as written: the wheel they name is the one the build
makes, and it installs and runs in a fresh venv of the host's Python; so does the pure
wheel, installed by the same steps in a venv of its own.

The blocks are read from install.md (each follows a ``<!-- deploy: NAME ... -->`` line) and
run line by line in a copy of the checkout (its tracked files, with the set-up's `.venv` and
`.tools` linked in), offline. What is changed, and why:

- ``sudo`` is dropped and ``/opt/pydory`` is a scratch directory (a test is no root);
- ``python3.11`` is the interpreter the project's ``.venv`` was made from (the same version);
- ``pip install --require-hashes -r requirements.txt`` becomes ``uv sync --locked --offline
  --no-dev --no-install-project`` into the venv: the lock that file was exported from, its
  wheels from uv's cache (which ``./dev setup`` filled), because the test downloads nothing;
  then every pin in the file is checked against what the venv holds (``pip freeze``), and
  ``pip check`` (the next documented step) that the set is complete;
- pip runs with ``PIP_NO_INDEX=1``: anything it would fetch is a failure.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
UV = ROOT / ".tools" / "bin" / "uv"
INSTALL_MD = ROOT / "docs" / "install.md"
STEP_TIMEOUT_S = 600  # a safety net: a build or an install of the locked set
BLOCK = re.compile(r"<!-- deploy: (\w+)[^>]*-->\n```sh\n(.*?)\n```", re.DOTALL)
HASHED_INSTALL = re.compile(r"^(\S+)/bin/pip install --require-hashes -r (\S+)$")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not UV.is_file(), reason="no .tools/bin/uv: run ./dev setup"),
]


def deploy_blocks() -> dict[str, list[str]]:
    """install.md's deploy blocks: their commands, continuation lines joined, no comments."""
    blocks = {}
    for name, body in BLOCK.findall(INSTALL_MD.read_text(encoding="utf-8")):
        joined = re.sub(r"\\\n\s*", "", body)
        blocks[name] = [
            line.strip() for line in joined.splitlines() if line.strip() and line[0] != "#"
        ]
    return blocks


def as_run_here(command: str, prefix: Path) -> list[str]:
    """One documented command as this test runs it (the module docstring says what differs)."""
    command = command.removeprefix("sudo ").replace("/opt/pydory", str(prefix))
    argv = shlex.split(command)
    if argv[0] == "python3.11":
        argv[0] = os.path.realpath(sys.executable)  # the interpreter .venv was made from
    hashed = HASHED_INSTALL.match(command)
    if hashed:
        argv = [f"UV_PROJECT_ENVIRONMENT={hashed[1]}", str(UV), "sync", "--locked", "--offline"]
        argv += ["--no-dev", "--no-install-project", "--python", f"{hashed[1]}/bin/python"]
    return argv


def pins(requirements: Path) -> set[str]:
    """The ``name==version`` lines of an exported requirements file that apply everywhere."""
    lines = requirements.read_text(encoding="utf-8").splitlines()
    return {
        line.split()[0].lower().replace("_", "-")
        for line in lines
        if "==" in line and not line.startswith((" ", "#")) and ";" not in line
    }


def run_block(commands: list[str], checkout: Path, prefix: Path, env: dict[str, str]) -> str:
    output = []
    for command in commands:
        argv = as_run_here(command, prefix)
        assignments = {}
        while re.fullmatch(r"[A-Z_]+=\S*", argv[0]):  # the shell's VAR=value before a command
            name, _, value = argv.pop(0).partition("=")
            assignments[name] = value
        if argv[0] == "ls":  # a block's check that the named file is there
            made = sorted(checkout.glob("dist/**/*.whl"))
            assert all((checkout / name).is_file() for name in argv[1:]), (
                f"install.md names {argv[1:]}; the build made {made}"
            )
            continue
        done = subprocess.run(
            argv,
            cwd=checkout,
            env=env | assignments,
            capture_output=True,
            text=True,
            timeout=STEP_TIMEOUT_S,
            check=False,
        )
        assert done.returncode == 0, f"{command}\n-> {argv}\n{done.stdout}\n{done.stderr}"
        output.append(done.stdout)
    return "".join(output)


def checkout_copy(into: Path) -> Path:
    """The tracked files, as a fresh clone has them, with the set-up's .venv and .tools."""
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=60
    )
    for name in listed.stdout.decode().split("\0"):
        if name and (ROOT / name).is_file():
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, into / name)
    for linked in (".venv", ".tools"):
        (into / linked).symlink_to(ROOT / linked)
    return into


def test_the_deploy_blocks_are_there_and_the_service_steps_repeat_them() -> None:
    blocks = deploy_blocks()
    every_sh_block = re.findall(r"```sh\n(.*?)\n\s*```", INSTALL_MD.read_text(), re.DOTALL)
    installs = [
        [line.strip() for line in block.splitlines() if line.strip()]
        for block in every_sh_block
        if "/opt/pydory/bin/pip install --no-deps" in block
    ]

    assert set(blocks) == {"build", "server", "pure"}
    assert installs == [blocks["server"]] * 2  # "Reproducible" and the service's step 2
    assert any(
        c.startswith("sudo /opt/pydory/bin/pip install --no-deps dist/") for c in blocks["server"]
    )


def test_install_md_deploy_steps_build_install_and_run_the_wheel_they_name(
    tmp_path: Path,
) -> None:
    if sys.version_info[:2] != (3, 11):
        pytest.skip("install.md's compiled wheel is cp311; this .venv has another Python")
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler (./dev setup installs one): the build would be pure")
    blocks = deploy_blocks()
    checkout = checkout_copy(tmp_path / "checkout")
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env |= {"UV_OFFLINE": "1", "UV_PYTHON_DOWNLOADS": "never", "PIP_NO_INDEX": "1"}
    env |= {"PIP_DISABLE_PIP_VERSION_CHECK": "1"}

    run_block(blocks["build"], checkout, tmp_path / "opt", env)
    run_block(blocks["pure"], checkout, tmp_path / "opt", env)
    version = run_block(blocks["server"], checkout, tmp_path / "opt", env)

    assert re.fullmatch(r"pydory \d+\.\d+\.\d+", version.splitlines()[-1]), version
    frozen = subprocess.run(
        [str(tmp_path / "opt" / "bin" / "pip"), "freeze", "--exclude", "pydory"],
        env=env,
        capture_output=True,
        text=True,
        timeout=STEP_TIMEOUT_S,
        check=True,
    ).stdout
    held = {line.lower().replace("_", "-") for line in frozen.split()}
    assert pins(checkout / "requirements.txt") <= held
    (installed,) = (tmp_path / "opt").glob("lib/python3.11/site-packages/pydory/_cwire.*.so")
    assert installed.name.startswith("_cwire.cpython-311")  # the compiled wheel was installed

    # "install that file instead": the server steps with the pure wheel, in a venv of its own.
    (pure,) = [line.split()[1] for line in blocks["pure"] if line.startswith("ls ")]
    (compiled,) = [line.split()[1] for line in blocks["build"] if line.startswith("ls ")]
    server = [command.replace(compiled, pure) for command in blocks["server"]]
    assert server != blocks["server"], "the server steps name the compiled wheel"
    version = run_block(server, checkout, tmp_path / "opt-pure", env)
    assert re.fullmatch(r"pydory \d+\.\d+\.\d+", version.splitlines()[-1]), version
    site = tmp_path / "opt-pure" / "lib" / "python3.11" / "site-packages"
    assert (site / "pydory" / "wire.py").is_file()
    assert not list(site.glob("pydory/*.so")), "the pure wheel holds no compiled module"
