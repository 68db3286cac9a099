"""The one place the pipeline builds a SparkSession.

Every job gets the same session settings: Python workers on this interpreter, times in
UTC, the web UI off, a small shuffle when running locally, the ``pydory-kafka`` source
registered, and Spark's own Kafka connector (the ``kafka`` source) on ``spark.jars`` when
its jars are on this machine.

Those jars come from Maven Central at set-up: ``./dev jars`` copies what
``jvm/spark-kafka/pom.xml`` pins into the checkout's ``.jars/spark-kafka/``;
``$PYDORY_SPARK_KAFKA_JARS`` names another directory. Nothing downloads at run time.
Without them the session starts all the same, and only ``--connector native`` fails
(:func:`pydory.pipeline.landing.land.landing_writer` says where the jars were looked for;
the landing job says it before Spark starts when :func:`spark_kafka_connector_may_load`
finds the connector nowhere a JVM could load it from).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from pathlib import Path

import pyspark
from pyspark import SparkContext
from pyspark.sql import SparkSession

from pydory.pipeline.faults import require_spark_master
from pydory.pipeline.source.kafka_source import KafkaDataSource

__all__ = [
    "DEFAULT_MASTER",
    "SPARK_KAFKA_JARS_ENV",
    "find_spark_kafka_jars",
    "job_session",
    "spark_kafka_connector_jar",
    "spark_kafka_connector_may_load",
    "spark_kafka_jars_dir",
    "spark_session",
    "with_spark_kafka_jars",
    "worker_python",
]

#: Spark's master URL when none is given. ``spark://HOST:PORT`` runs the jobs on a standalone
#: cluster (``pydory_tools.testing.spark_cluster`` starts one on loopback), ``yarn`` or
#: ``k8s://...`` on those; every pipeline command takes it as ``--master``.
DEFAULT_MASTER = "local[*]"

#: Names a directory holding Spark's Kafka connector and its dependencies (overrides the
#: checkout's ``.jars/spark-kafka``).
SPARK_KAFKA_JARS_ENV = "PYDORY_SPARK_KAFKA_JARS"

#: The console script of :mod:`pydory.pipeline.worker_python`, beside the interpreter.
WORKER_PYTHON = "pydory-spark-python"

# Local jobs here are small: Spark's default of 200 shuffle partitions would mostly
# schedule empty tasks. On a cluster, Spark's defaults (or --conf) apply.
_LOCAL_SHUFFLE_PARTITIONS = "4"


def spark_session(
    master: str = DEFAULT_MASTER,
    app_name: str = "pydory",
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """Build (or reuse) the process's SparkSession, with ``pydory-kafka`` registered.

    ``conf`` adds or overrides Spark settings; a ``spark.jars`` there is kept, with Spark's
    Kafka connector (:func:`find_spark_kafka_jars`) added to it. A session already running
    in this process is reused (Spark allows one per process); ``master``, ``app_name`` and
    the jars then keep their first values. A ``spark://`` master that does not answer
    raises :class:`~pydory.pipeline.faults.SparkMasterUnreachable` before a JVM starts.
    """
    if SparkContext._active_spark_context is None:
        require_spark_master(master)
    _use_this_interpreter_for_workers()
    if master.startswith("local") or _master_on_loopback(master):
        # Only loopback networking here: bind the driver there (where a loopback cluster's
        # executors call it back), without Spark first warning that the host name
        # resolves to a loopback address.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        # The jobs print their own progress; Spark's progress bar would garble it.
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        # The lake must not depend on the worker's locale or time zone either.
        .config("spark.driver.extraJavaOptions", "-Duser.timezone=UTC")
        .config("spark.executor.extraJavaOptions", "-Duser.timezone=UTC")
    )
    if master.startswith("local"):
        builder = builder.config("spark.sql.shuffle.partitions", _LOCAL_SHUFFLE_PARTITIONS)
    for key, value in with_spark_kafka_jars(conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    _register_source(spark)
    return spark


@contextmanager
def job_session(
    master: str = DEFAULT_MASTER,
    app_name: str = "pydory",
    conf: Mapping[str, str] | None = None,
) -> Iterator[SparkSession]:
    """:func:`spark_session` for one job, stopped when the job ends if this call started
    it (its executors and JVM go cleanly); one already running in the process (a test's,
    a notebook's) is reused and left running."""
    starts = SparkContext._active_spark_context is None
    spark = spark_session(master, app_name, conf)
    try:
        yield spark
    finally:
        if starts:
            spark.stop()


def spark_kafka_jars_dir() -> Path:
    """Where Spark's Kafka connector is looked for: ``$PYDORY_SPARK_KAFKA_JARS``, else the
    checkout's ``.jars/spark-kafka`` (where ``./dev jars`` puts it)."""
    configured = os.environ.get(SPARK_KAFKA_JARS_ENV)
    return Path(configured) if configured else _project_root() / ".jars" / "spark-kafka"


def spark_kafka_connector_jar() -> str:
    """The file name of the connector built for this PySpark, e.g.
    ``spark-sql-kafka-0-10_2.13-4.2.0.jar`` (a connector is built against one Spark release)."""
    return f"spark-sql-kafka-0-10_2.13-{pyspark.__version__}.jar"


def find_spark_kafka_jars() -> tuple[Path, ...]:
    """Every jar of :func:`spark_kafka_jars_dir`, or none when it lacks the connector jar
    for this PySpark's release (missing directory, nothing fetched yet, another Spark)."""
    directory = spark_kafka_jars_dir()
    if not (directory / spark_kafka_connector_jar()).is_file():
        return ()
    return tuple(sorted(directory.glob("*.jar")))


def spark_kafka_connector_may_load(conf: Mapping[str, str]) -> bool:
    """Whether a session started now with ``conf`` may have Spark's ``kafka`` source on
    its classpath, as far as can be told before a JVM starts: False only when it is
    nowhere a JVM could load it from (not in :func:`spark_kafka_jars_dir`, not among the
    Spark distribution's own jars, and no setting, ``PYSPARK_SUBMIT_ARGS``, class path
    variable or ``spark-defaults.conf`` naming anything Kafka), so that a job can say so
    at once instead of after starting Spark. Anything that may name it: True, and the
    session's JVM tells."""
    if find_spark_kafka_jars():
        return True
    homes = {Path(pyspark.__file__).resolve().parent}
    if os.environ.get("SPARK_HOME"):
        homes.add(Path(os.environ["SPARK_HOME"]))
    if any(any((home / "jars").glob("spark-sql-kafka*.jar")) for home in homes):
        return True
    conf_dirs = [Path(os.environ["SPARK_CONF_DIR"])] if os.environ.get("SPARK_CONF_DIR") else []
    named = [
        *conf.values(),
        *(os.environ.get(name, "") for name in _JAR_VARIABLES),
        *(_text_of(directory / "spark-defaults.conf") for directory in conf_dirs),
        *(_text_of(home / "conf" / "spark-defaults.conf") for home in homes),
    ]
    return any("kafka" in text.lower() for text in named)


#: The environment variables through which Spark's launcher may take more jars.
_JAR_VARIABLES = ("PYSPARK_SUBMIT_ARGS", "SPARK_CLASSPATH", "SPARK_DIST_CLASSPATH")


def _text_of(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def with_spark_kafka_jars(conf: Mapping[str, str]) -> dict[str, str]:
    """``conf`` with the jars of :func:`find_spark_kafka_jars` first in ``spark.jars``
    (a ``spark.jars`` given there is kept after them); unchanged when there are none."""
    settings = dict(conf)
    jars = [str(jar) for jar in find_spark_kafka_jars()]
    if jars:
        settings["spark.jars"] = ",".join(filter(None, [*jars, settings.get("spark.jars")]))
    return settings


def _project_root() -> Path:
    # src/pydory/pipeline/spark.py -> the checkout (pydory is installed editable). An
    # installed wheel has no .jars next to it: there only the environment variable helps.
    return Path(__file__).resolve().parents[3]


def _master_on_loopback(master: str) -> bool:
    """Whether ``master`` is a standalone master on this machine's loopback
    (``spark://127.0.0.1:7077``, as :mod:`pydory_tools.testing.spark_cluster` starts one)."""
    if not master.startswith("spark://"):
        return False
    hosts = [address.rsplit(":", 1)[0] for address in master[len("spark://") :].split(",")]
    return all(host in ("127.0.0.1", "localhost") for host in hosts)


def _register_source(spark: SparkSession) -> None:
    """Register ``pydory-kafka`` once per session (Spark warns when it is replaced)."""
    manager = spark._jsparkSession.sessionState().dataSourceManager()
    if not manager.dataSourceExists(KafkaDataSource.name()):
        spark.dataSource.register(KafkaDataSource)


def _use_this_interpreter_for_workers(environ: MutableMapping[str, str] = os.environ) -> None:
    """Make Spark's Python workers run this interpreter (this venv, with its packages).

    Without it they run the first ``python3`` on PATH, which lacks confluent-kafka and
    pyarrow, and the worker processes must import pydory's source by module name. They
    run it through ``pydory-spark-python`` beside it when installed (:func:`worker_python`),
    and so does the Python work Spark's JVM starts on its own (``PYSPARK_DRIVER_PYTHON``:
    its lookup of Python data sources at each driver's start), where anything else (a
    ``spark-submit app.py`` of a child process) runs as this interpreter.
    """
    environ.setdefault("PYSPARK_PYTHON", worker_python())
    environ.setdefault("PYSPARK_DRIVER_PYTHON", worker_python())


def worker_python() -> str:
    """The interpreter for Spark's Python workers: this environment's
    ``pydory-spark-python`` (:mod:`pydory.pipeline.worker_python`: PySpark imported from
    its package, compiled once, not from Spark's ``pyspark.zip`` at every worker's start),
    else this interpreter."""
    launcher = Path(sys.executable).with_name(WORKER_PYTHON)
    return str(launcher) if os.access(launcher, os.X_OK) else sys.executable
