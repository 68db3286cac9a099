"""The local Spark the pipeline's test modules share: one SparkContext per test process
(an xdist worker), a SparkSession of its own per module.

Every module started a SparkContext and stopped it again. The JVM under them was already
one per process (PySpark keeps its gateway when a context stops, and Spark looks up the
Python data sources once per JVM), so that cost little: in a warm JVM a context's start
took 0.5 CPU-s and its stop 0.7 (measured here). Now the first module of a worker starts
the context and the ones after it reuse it, each with a session of its own
(``SparkSession.newSession``: its own SQL settings, streaming queries and listeners,
registered data sources), so what one module set (a landing's state store, a time zone)
never reaches the next. The module's session is made the process's default, so the jobs
a test runs in this process (``run_landing``, ``main(["pipeline", ...])``, which call
``spark_session``) run on it, as they ran on the module's own session before.

A module that needs another master (``test_distributed.py``: a standalone cluster) stops
the shared context first and its own at its end; the next module here starts a new one.

Rule: `module_session` is the only code that hands a test module the shared local Spark.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from pyspark import SparkContext
from pyspark.sql import SparkSession

from pydory.pipeline.spark import spark_session

__all__ = ["LOCAL_MASTER", "module_session", "stop_local_spark"]

#: The master every local pipeline test module runs on.
LOCAL_MASTER = "local[2]"
_APP_NAME = "pydory-tests"


@contextmanager
def module_session() -> Iterator[SparkSession]:
    """A session of the module's own on the process's local context (started at the first
    call, or again after a module stopped it), the process's default while the module
    runs; at its end its streaming queries still running are stopped and what it cached
    dropped, the context left running for the next module."""
    session = _fresh_session()
    try:
        yield session
    finally:
        if session.sparkContext._jsc is not None:  # not stopped by a test of the module
            for query in session.streams.active:
                query.stop()
            session.catalog.clearCache()


def stop_local_spark() -> None:
    """Stop the process's SparkContext, if one runs (at the end of the test process)."""
    running = SparkContext._active_spark_context
    if running is not None:
        running.stop()


def _fresh_session() -> SparkSession:
    running = SparkContext._active_spark_context
    if running is not None and running.master != LOCAL_MASTER:
        # Another master's context (a cluster's) left running: the module would silently
        # run on it.
        running.stop()
        running = None
    shared = spark_session(master=LOCAL_MASTER, app_name=_APP_NAME)
    if running is None:
        return shared  # a new context: its first session is fresh
    own = shared.newSession()
    _make_default(own)
    # The pipeline's session settings and pydory-kafka on the new session, as on a first.
    return spark_session(master=LOCAL_MASTER, app_name=_APP_NAME)


def _make_default(session: SparkSession) -> None:
    """Make ``session`` what ``SparkSession.builder.getOrCreate()`` returns in this
    process, in PySpark and in the JVM, as PySpark does for the first session."""
    SparkSession._instantiatedSession = session
    SparkSession._activeSession = session
    jvm_class = SparkSession._get_j_spark_session_class(session._jvm)
    jvm_class.setDefaultSession(session._jsparkSession)
    jvm_class.setActiveSession(session._jsparkSession)
