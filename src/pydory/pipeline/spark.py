"""The one place the pipeline builds a SparkSession.

Every job gets the same session settings: Python workers on this interpreter, times in
UTC, the web UI off, a small shuffle when running locally, and the ``pydory-kafka``
source registered.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from pyspark.sql import SparkSession

from pydory.pipeline.kafka_source import KafkaDataSource

__all__ = ["DEFAULT_MASTER", "spark_session"]

DEFAULT_MASTER = "local[*]"

# Local jobs here are small: Spark's default of 200 shuffle partitions would mostly
# schedule empty tasks. On a cluster, Spark's defaults (or --conf) apply.
_LOCAL_SHUFFLE_PARTITIONS = "4"


def spark_session(
    master: str = DEFAULT_MASTER,
    app_name: str = "pydory",
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """Build (or reuse) the process's SparkSession, with ``pydory-kafka`` registered.

    ``conf`` adds or overrides Spark settings. A session already running in this
    process is reused (Spark allows one per process); ``master`` and ``app_name``
    then keep their first values.
    """
    _use_this_interpreter_for_workers()
    if master.startswith("local"):
        # Only loopback networking here: bind the driver there, without Spark first
        # warning that the host name resolves to a loopback address.
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
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    _register_source(spark)
    return spark


def _register_source(spark: SparkSession) -> None:
    """Register ``pydory-kafka`` once per session (Spark warns when it is replaced)."""
    manager = spark._jsparkSession.sessionState().dataSourceManager()
    if not manager.dataSourceExists(KafkaDataSource.name()):
        spark.dataSource.register(KafkaDataSource)


def _use_this_interpreter_for_workers() -> None:
    """Make Spark's Python workers run this interpreter (this venv, with its packages).

    Without it they run the first ``python3`` on PATH, which lacks confluent-kafka and
    pyarrow, and the worker processes must import pydory's source by module name.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
