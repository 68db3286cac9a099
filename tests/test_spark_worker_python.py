"""``pydory-spark-python``, the interpreter of Spark's Python workers
(:mod:`pydory.pipeline.worker_python`): ``python -m MODULE`` with PySpark imported from its
installed package, not from the bytecode-less ``pyspark.zip`` Spark puts first on every
worker's ``PYTHONPATH``. That a Spark session's workers run it: test_pipeline_land.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyspark
import pytest

from pydory.pipeline import spark as spark_module
from pydory.pipeline.spark import WORKER_PYTHON, worker_python
from pydory.pipeline.worker_python import installed_first

SPARK_LIB = Path(pyspark.__file__).parent / "python" / "lib"
#: What Spark (PythonUtils.sparkPythonPath) puts first on a worker's PYTHONPATH.
SPARK_ZIPS = [str(SPARK_LIB / "py4j-0.10.9.9-src.zip"), str(SPARK_LIB / "pyspark.zip")]
_PROBE = """
import json, sys
import pyspark
print(json.dumps({"name": __name__, "argv": sys.argv, "path0": sys.path[0],
                  "pyspark": pyspark.__file__}))
"""


def test_spark_s_zips_go_behind_an_installed_pyspark_and_stay_without_one(tmp_path: Path) -> None:
    site = tmp_path / "site-packages"
    (site / "pyspark").mkdir(parents=True)
    (site / "pyspark" / "__init__.py").write_text("")

    moved = installed_first([*SPARK_ZIPS, "/stdlib", str(site)])
    assert moved == ["/stdlib", str(site), *SPARK_ZIPS]
    assert installed_first([*SPARK_ZIPS, "/stdlib"]) == [*SPARK_ZIPS, "/stdlib"]
    assert installed_first(["/stdlib", str(site)]) == ["/stdlib", str(site)]


def test_a_worker_runs_its_module_as_python_m_with_pyspark_from_the_package(
    tmp_path: Path,
) -> None:
    assert worker_python() == str(Path(sys.executable).with_name(WORKER_PYTHON))
    assert all(Path(zip_path).is_file() for zip_path in SPARK_ZIPS), SPARK_ZIPS
    (tmp_path / "probe.py").write_text(_PROBE)
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(SPARK_ZIPS)}

    def run(interpreter: str) -> dict[str, str]:
        done = subprocess.run(
            [interpreter, "-m", "probe", "a", "b"],
            cwd=tmp_path,
            env=environment,
            capture_output=True,
            text=True,
            check=True,
            timeout=600,  # a safety net only
        )
        found: dict[str, str] = json.loads(done.stdout)
        return found

    # What Spark's own start gives a worker: PySpark from the zip, compiled at each start.
    assert "pyspark.zip" in run(sys.executable)["pyspark"]
    probe = run(worker_python())
    assert probe["pyspark"] == pyspark.__file__
    assert probe["name"] == "__main__"
    assert probe["argv"][1:] == ["a", "b"]
    assert probe["path0"] == str(tmp_path)


def test_anything_but_a_module_runs_as_this_interpreter_would(tmp_path: Path) -> None:
    """A script, ``-c``, no argument at all (the ``pyspark`` shell): it is also
    ``PYSPARK_DRIVER_PYTHON``, which Spark runs for those."""
    (tmp_path / "probe.py").write_text(_PROBE)
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(SPARK_ZIPS)}

    def run(*arguments: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [worker_python(), *arguments],
            cwd=tmp_path,
            env=environment,
            input=stdin,
            capture_output=True,
            text=True,
            check=False,
            timeout=600,  # a safety net only
        )

    script = run("probe.py", "a")
    assert script.returncode == 0, script.stderr
    assert json.loads(script.stdout)["argv"] == ["probe.py", "a"]
    # As this interpreter: Spark's zip, first on the path, gives PySpark (nothing moved).
    assert "pyspark.zip" in json.loads(script.stdout)["pyspark"]
    command = run("-c", "import sys; print(sys.argv, sys.executable)", "x")
    assert command.stdout.split() == ["['-c',", "'x']", sys.executable]
    shell = run(stdin="print(6 * 7)\n")
    assert (shell.returncode, shell.stdout) == (0, "42\n")
    assert run("-c", "raise SystemExit(3)").returncode == 3


@pytest.mark.slow
def test_spark_submit_of_a_python_application_runs_it_with_the_driver_python(
    tmp_path: Path,
) -> None:
    """A session started here leaves ``PYSPARK_DRIVER_PYTHON`` to its children; a
    ``spark-submit app.py`` among them runs the application with it (Spark's launcher
    JVM only: the application starts no SparkContext)."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK_")}
    environment["SPARK_HOME"] = str(Path(pyspark.__file__).parent)
    spark_module._use_this_interpreter_for_workers(environment)
    assert environment["PYSPARK_DRIVER_PYTHON"] == worker_python()
    (tmp_path / "app.py").write_text(_PROBE)

    done = subprocess.run(
        [str(Path(pyspark.__file__).parent / "bin" / "spark-submit"), "app.py", "a"],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        check=False,
        timeout=600,  # a safety net only
    )

    assert done.returncode == 0, done.stderr[-3000:]
    ran = json.loads(done.stdout.splitlines()[-1])
    assert (ran["name"], ran["argv"][1:]) == ("__main__", ["a"])
    assert Path(ran["argv"][0]).name == "app.py"
