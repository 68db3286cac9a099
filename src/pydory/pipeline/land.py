"""The landing job: Kafka topics into a Parquet lake, exactly once.

A Spark Structured Streaming query reads the topics (Spark's own JVM ``kafka`` source,
``connector="native"``, the default; or pydory's ``pydory-kafka``, ``connector="python"``,
for hosts without the connector's jars) and writes every record through Spark's file
sink::

    LAKE/_spark_metadata/<batch>          the sink's commit log: the files of each batch
    LAKE/topic=<topic>/date=<yyyy-MM-dd>/part-*.parquet

Data columns: key, value (binary), partition (int), offset (long), timestamp (UTC),
timestampType (int); partition columns: topic, date (the UTC day of the Kafka
timestamp, as a ``yyyy-MM-dd`` string). Read the lake with ``spark.read.parquet(LAKE)``,
which honours the commit log. Why this is exactly once: docs/pipeline.md.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, TextIO

from py4j.protocol import Py4JJavaError  # type: ignore[import-untyped]
from pyspark.errors import PySparkException
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.listener import StreamingQueryListener
from pyspark.sql.streaming.query import StreamingQuery
from pyspark.sql.streaming.readwriter import DataStreamWriter

from pydory.pipeline.errors import ConnectorUnavailable
from pydory.pipeline.kafka_source import SOURCE_NAME
from pydory.pipeline.spark import (
    DEFAULT_MASTER,
    SPARK_KAFKA_JARS_ENV,
    spark_kafka_connector_jar,
    spark_kafka_jars_dir,
    spark_session,
)

__all__ = [
    "DATA_COLUMNS",
    "DEFAULT_CONNECTOR",
    "PARTITION_COLUMNS",
    "LandSettings",
    "LandSummary",
    "landing_writer",
    "run_landing",
    "start_landing",
    "utc_date",
]

#: The lake's layout (the audit reads it): partition directories, then Parquet columns.
PARTITION_COLUMNS = ("topic", "date")
DATA_COLUMNS = ("key", "value", "partition", "offset", "timestamp", "timestampType")

DEFAULT_TRIGGER_INTERVAL_S = 5.0
# How long a stopped query's final events may take to reach the progress printer.
_LAST_REPORT_WAIT_S = 30.0
QUERY_NAME = "pydory_land"

Connector = Literal["python", "native"]
#: The default connector: Spark's own (see LandSettings).
DEFAULT_CONNECTOR: Connector = "native"
_FORMATS: dict[str, str] = {"python": SOURCE_NAME, "native": "kafka"}
_MICROS_PER_DAY = 86_400 * 1_000_000


@dataclass(frozen=True)
class LandSettings:
    """Everything the landing job needs, checked once on construction.

    ``trigger_interval_s`` applies when ``available_now`` is false (default
    :data:`DEFAULT_TRIGGER_INTERVAL_S`). ``spark_conf`` adds Spark settings.
    ``connector``: ``native`` (default, :data:`DEFAULT_CONNECTOR`) lands through Spark's
    ``kafka`` source, faster and cheaper per record (BENCHMARKS.md); ``python`` through
    ``pydory-kafka``, which needs no jar. Both land the same lake.
    """

    bootstrap_servers: str
    topics: tuple[str, ...]
    lake: str
    checkpoint: str
    available_now: bool = False
    trigger_interval_s: float | None = None
    master: str = DEFAULT_MASTER
    connector: Connector = DEFAULT_CONNECTOR
    max_offsets_per_trigger: int | None = None
    fail_on_data_loss: bool = True
    spark_conf: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.bootstrap_servers.strip():
            raise ValueError("bootstrap_servers is empty")
        if not self.topics:
            raise ValueError("name at least one topic")
        if self.connector not in _FORMATS:
            raise ValueError(f"connector must be python or native, not {self.connector!r}")
        if self.available_now and self.trigger_interval_s is not None:
            raise ValueError("choose available_now or a trigger interval, not both")
        if self.trigger_interval_s is not None and not self.trigger_interval_s > 0:
            raise ValueError(f"trigger_interval_s must be positive, not {self.trigger_interval_s}")
        if self.max_offsets_per_trigger is not None and self.max_offsets_per_trigger < 1:
            raise ValueError("max_offsets_per_trigger must be at least 1")

    def source_options(self) -> dict[str, str]:
        """The source's options: the same for ``pydory-kafka`` and Spark's ``kafka``."""
        options = {
            "kafka.bootstrap.servers": self.bootstrap_servers,
            "subscribe": ",".join(self.topics),
            "startingOffsets": "earliest",
            "failOnDataLoss": str(self.fail_on_data_loss).lower(),
        }
        if self.max_offsets_per_trigger is not None:
            options["maxOffsetsPerTrigger"] = str(self.max_offsets_per_trigger)
        return options


@dataclass
class LandSummary:
    """What a landing run did, from the query's progress reports."""

    batches: int = 0
    records: int = 0
    seconds: float = 0.0
    error: str | None = None


def landing_writer(spark: SparkSession, settings: LandSettings) -> DataStreamWriter:
    """The landing query, ready to ``start()``: source, lake columns, sink and trigger."""
    if settings.connector == "native":
        _require_native_kafka(spark)
    records = (
        spark.readStream.format(_FORMATS[settings.connector])
        .options(**settings.source_options())
        .load()
    )
    writer = (
        _lake_rows(records)
        .writeStream.format("parquet")
        .queryName(QUERY_NAME)
        .option("path", settings.lake)
        .option("checkpointLocation", settings.checkpoint)
        .partitionBy(*PARTITION_COLUMNS)
    )
    if settings.available_now:
        return writer.trigger(availableNow=True)
    interval = settings.trigger_interval_s or DEFAULT_TRIGGER_INTERVAL_S
    return writer.trigger(processingTime=f"{interval:g} seconds")


def start_landing(spark: SparkSession, settings: LandSettings) -> StreamingQuery:
    """Start the landing query on ``spark`` and return it (it runs in the background)."""
    return landing_writer(spark, settings).start()


def run_landing(settings: LandSettings, out: TextIO | None = None) -> int:
    """Run the landing job to its end; print progress and a summary to ``out`` (stdout).

    Returns 0 when the query finished (available-now) or was stopped by SIGINT/SIGTERM
    (interval trigger), 1 when it failed, could not start, or was interrupted before
    landing everything available.
    """
    out = out or sys.stdout
    began = time.monotonic()
    progress = _ProgressPrinter(out)
    try:
        spark = spark_session(settings.master, app_name="pydory-land", conf=settings.spark_conf)
        spark.streams.addListener(progress)
    except (PySparkException, Py4JJavaError) as error:
        print(f"pydory pipeline land: cannot start Spark: {_cause(error)}", file=out, flush=True)
        return 1
    try:
        with _stop_on_signals(progress.stop_requested) as interrupted:
            query = start_landing(spark, settings)
            progress.watch(query.id)
            progress.stop_requested.wait()
        query.stop()
        progress.wait_for_last_report()
    except (ConnectorUnavailable, PySparkException, Py4JJavaError) as error:
        print(f"pydory pipeline land: cannot start: {_cause(error)}", file=out, flush=True)
        return 1
    finally:
        spark.streams.removeListener(progress)
    summary = progress.summary_of(query, seconds=time.monotonic() - began)
    _print_summary(out, settings, summary, interrupted.is_set())
    if summary.error is not None:
        return 1
    return 1 if interrupted.is_set() and settings.available_now else 0


# --- the lake's rows -----------------------------------------------------------------------


def _lake_rows(records: DataFrame) -> DataFrame:
    """The source's rows in the lake's columns, with the UTC date of each record."""
    return records.select(*DATA_COLUMNS, "topic", utc_date(F.col("timestamp")).alias("date"))


def utc_date(timestamp: Column) -> Column:
    """The lake's ``date``: ``yyyy-MM-dd`` of the UTC day, whatever the session's time zone.

    Counted in whole days from the epoch: formatting the timestamp would use the
    session's time zone.
    """
    days = F.floor(F.unix_micros(timestamp) / _MICROS_PER_DAY).cast("int")
    return F.date_add(F.lit("1970-01-01").cast("date"), days).cast("string")


def _require_native_kafka(spark: SparkSession) -> None:
    """Fail clearly when Spark's ``kafka`` source (spark-sql-kafka) is not on the classpath."""
    jvm: Any = spark.sparkContext._jvm
    lookup = jvm.org.apache.spark.sql.execution.datasources.DataSource.lookupDataSource
    try:
        lookup("kafka", spark._jsparkSession.sessionState().conf())
    except (PySparkException, Py4JJavaError):  # Spark's "Failed to find data source: kafka"
        raise ConnectorUnavailable(
            "--connector native needs Spark's kafka source, which is not on the classpath: "
            f"no {spark_kafka_connector_jar()} in {spark_kafka_jars_dir()}. Run ./dev jars "
            "(it fetches Spark's Kafka connector from Maven Central into .jars/spark-kafka/), "
            f"or set {SPARK_KAFKA_JARS_ENV} to a directory holding it and its dependencies "
            "(the jars join the SparkSession when it starts), or use --connector python"
        ) from None


# --- progress ------------------------------------------------------------------------------


class _ProgressPrinter(StreamingQueryListener):
    """Prints one line per non-empty batch and notices when the watched query ends.

    Spark calls it on its listener thread, in event order, possibly before
    :meth:`watch` names the query (a fast query may even have ended by then), so it
    keeps totals per query id. Until a query is watched it prints every query's batches.
    """

    def __init__(self, out: TextIO) -> None:
        self._out = out
        self._lock = threading.Lock()
        self._watched: str | None = None
        self._summaries: dict[str, LandSummary] = {}
        self._ended: set[str] = set()
        self._watched_ended = threading.Event()
        #: Set when the watched query ends; others (a signal handler) may set it too.
        self.stop_requested = threading.Event()

    def watch(self, query_id: object) -> None:
        """Report on the query with ``query_id`` only."""
        with self._lock:
            self._watched = str(query_id)
            if self._watched in self._ended:
                self._watched_ended.set()
                self.stop_requested.set()

    def wait_for_last_report(self) -> None:
        """Wait until Spark has delivered the watched query's end (so every batch before it).

        Call it after stopping the query; bounded in case Spark's listener bus is stuck.
        """
        self._watched_ended.wait(timeout=_LAST_REPORT_WAIT_S)

    def summary_of(self, query: StreamingQuery, seconds: float) -> LandSummary:
        """``query``'s totals; its exception, if any, becomes ``error``."""
        with self._lock:
            summary = self._summaries.get(str(query.id), LandSummary())
        summary.seconds = seconds
        exception = query.exception()
        if exception is not None:
            summary.error = _cause(exception)
        return summary

    def onQueryStarted(self, event: Any) -> None:
        if self._reports_on(str(event.id)):
            print(f"landing query started (id {event.id})", file=self._out, flush=True)

    def onQueryProgress(self, event: Any) -> None:
        progress = event.progress
        if progress.numInputRows == 0:
            return
        with self._lock:
            summary = self._summaries.setdefault(str(progress.id), LandSummary())
            summary.batches += 1
            summary.records += progress.numInputRows
        if self._reports_on(str(progress.id)):
            print(
                f"batch {progress.batchId}: {progress.numInputRows:,} records "
                f"({summary.records:,} in {summary.batches} batches so far)",
                file=self._out,
                flush=True,
            )

    def onQueryIdle(self, event: Any) -> None:
        """Nothing to report: the query waits for data."""

    def onQueryTerminated(self, event: Any) -> None:
        with self._lock:
            self._ended.add(str(event.id))
            if str(event.id) == self._watched:
                self._watched_ended.set()
                self.stop_requested.set()

    def _reports_on(self, query_id: str) -> bool:
        with self._lock:
            return self._watched in (None, query_id)


@contextmanager
def _stop_on_signals(stop: threading.Event) -> Iterator[threading.Event]:
    """While inside, SIGINT and SIGTERM set ``stop`` instead of killing the process.

    Yields an event that tells whether a signal arrived. Only the main thread can
    install handlers; elsewhere signals keep their usual effect.
    """
    interrupted = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield interrupted
        return

    def request_stop(signum: int, _frame: object) -> None:
        interrupted.set()
        stop.set()

    previous = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield interrupted
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _print_summary(
    out: TextIO, settings: LandSettings, summary: LandSummary, interrupted: bool
) -> None:
    how = "stopped by signal" if interrupted else "finished"
    if summary.error is not None:
        how = f"FAILED: {summary.error}"
    print(
        f"landing {how}: {summary.records:,} records in {summary.batches} batches "
        f"from {', '.join(settings.topics)} into {settings.lake} ({summary.seconds:.1f} s)",
        file=out,
        flush=True,
    )


def _cause(error: BaseException) -> str:
    """The part of a (possibly Python-worker, wrapped by the JVM) error naming the cause.

    A pydory error raised in a Spark worker reaches the driver inside a JVM exception
    with a traceback around it; keep only its own message, which may span lines.
    """
    lines = str(error).strip().splitlines()
    for index, line in enumerate(lines):
        if _OWN_ERRORS in line:
            cause = [line[line.index(_OWN_ERRORS) + len(_OWN_ERRORS) :]]
            for follower in lines[index + 1 :]:
                if not follower.strip() or follower.startswith(_NOT_THE_MESSAGE):
                    break
                cause.append(follower.rstrip())
            return "\n".join(cause)
    return lines[0] if lines else type(error).__name__


_OWN_ERRORS = "pydory.pipeline.errors."
_NOT_THE_MESSAGE = ("\tat ", " SQLSTATE", "Traceback", "JVM stacktrace", "\n")
