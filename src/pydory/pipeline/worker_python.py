"""``pydory-spark-python``: the interpreter Spark starts its Python workers with
(``PYSPARK_PYTHON``, set by :mod:`pydory.pipeline.spark`), which imports PySpark from its
installed package instead of the ``pyspark.zip`` Spark puts first on every worker's path.

Spark (4.2) runs each Python worker as ``PYSPARK_PYTHON -m MODULE`` with
``$SPARK_HOME/python/lib/pyspark.zip`` and Py4J's zip ahead of everything on its
``PYTHONPATH`` (``PythonUtils.sparkPythonPath``). A zip holds no bytecode (only ``.py``
files) and Python caches none for it, so every worker compiled every PySpark module it
imported, each time it started: for the driver-side worker of a Python streaming source,
1.2-1.4 CPU-s before it connects back, against 0.7 from the package's ``__pycache__``
(measured here). Spark gives that worker a fixed 10 s to connect back
(``PythonWorkerFactory.createSimpleWorker``, not configurable; the daemon's workers get
60 s), which a loaded host missed. This is ``python -m MODULE`` with the zips moved behind
the installed packages when those hold PySpark; nothing else differs.

It is the driver's Python for Spark too (``PYSPARK_DRIVER_PYTHON``): the JVM runs that
for the Python work it starts itself, above all its lookup of installed Python data
sources once per driver JVM (``python -m pyspark.daemon
pyspark.sql.worker.lookup_data_sources``: what it imports took 0.9-1.1 CPU-s from the
zip, 0.5-0.7 from the package, measured here). Spark also runs that variable for a
``spark-submit app.py`` and the ``pyspark`` shell: anything but ``-m MODULE`` becomes
this interpreter, unchanged.

Rule: `main` is the only code that changes a Spark Python worker's module path.
"""

from __future__ import annotations

import os
import runpy
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

__all__ = ["as_this_interpreter", "installed_first", "main"]


def main() -> int:
    """Run ``-m MODULE [ARGUMENT ...]`` as ``python -m`` would, PySpark from its package;
    run anything else as this interpreter (:func:`as_this_interpreter`)."""
    arguments = sys.argv[1:]
    if len(arguments) < 2 or arguments[0] != "-m":
        as_this_interpreter(arguments)
    module = arguments[1]
    # As `python -m`: the working directory first, not this script's directory.
    script_dir = os.path.dirname(os.path.abspath(sys.argv[0]))
    rest = sys.path[1:] if sys.path and os.path.abspath(sys.path[0]) == script_dir else sys.path
    sys.path[:] = [os.getcwd(), *installed_first(rest)]
    sys.argv = [module, *arguments[2:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
    return 0


def as_this_interpreter(arguments: Sequence[str]) -> NoReturn:
    """Become this interpreter run with ``arguments`` (a script, ``-c``, none: a shell).

    It is also ``PYSPARK_DRIVER_PYTHON`` (:mod:`pydory.pipeline.spark`), which Spark runs
    for more than workers: ``spark-submit app.py`` runs the application with it, the
    ``pyspark`` shell starts it bare, and a child process of a job inherits it.
    """
    os.execv(sys.executable, [sys.executable, *arguments])


def installed_first(path: Sequence[str]) -> list[str]:
    """``path`` with Spark's zips of PySpark and Py4J moved to its end, when another entry
    holds an installed PySpark (else unchanged: the zips are all there is)."""
    zips = [entry for entry in path if _is_spark_zip(entry)]
    rest = [entry for entry in path if not _is_spark_zip(entry)]
    if not zips or not any(Path(entry, "pyspark", "__init__.py").is_file() for entry in rest):
        return list(path)
    return [*rest, *zips]


def _is_spark_zip(entry: str) -> bool:
    name = os.path.basename(entry)
    return name == "pyspark.zip" or (name.startswith("py4j-") and name.endswith("-src.zip"))
