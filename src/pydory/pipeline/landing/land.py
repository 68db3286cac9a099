"""The landing job: Kafka topics into a Parquet lake, exactly once.

A Spark Structured Streaming query reads the topics (Spark's own JVM ``kafka`` source,
``connector="native"``, the default; or pydory's ``pydory-kafka``, ``connector="python"``,
for hosts without the connector's jars) and writes every record through Spark's file
sink::

    LAKE/_spark_metadata/<batch>          the sink's commit log: the files of each batch
    LAKE/topic=<topic>/date=<yyyy-MM-dd>/part-*.parquet

Data columns: key, value (binary), partition (int), offset (long), timestamp (UTC),
timestampType (int), pydory_id (the ``pydory-id`` header, null without it); partition
columns: topic, date (the UTC day of the Kafka timestamp, as a ``yyyy-MM-dd`` string).
Read the lake with ``spark.read.parquet(LAKE)``, which honours the commit log. Why this
is exactly once: docs/pipeline.md. A second copy of a message (a daemon's replay after a
crash) is dropped by its identity: :mod:`pydory.pipeline.landing.dedup`.
"""

from __future__ import annotations

import functools
import json
import operator
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from subprocess import Popen
from typing import Any, Literal, TextIO

from py4j.protocol import (  # type: ignore[import-untyped]
    Py4JError,
    Py4JJavaError,
    Py4JNetworkError,
)
from pyspark import SparkContext
from pyspark.errors import PySparkException
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.listener import StreamingQueryListener
from pyspark.sql.streaming.query import StreamingQuery
from pyspark.sql.streaming.readwriter import DataStreamWriter

from pydory.pipeline.errors import ConnectorUnavailable, PipelineError
from pydory.pipeline.faults import (
    EXIT_COULD_NOT_RUN,
    CouldNotRun,
    ExecutorsGone,
    fault_line,
    require_kafka,
)
from pydory.pipeline.lake_files import LakeFiles, LocalFiles, is_local, lake_files
from pydory.pipeline.landing.dedup import (
    DEFAULT_WINDOW_S,
    IDENTITY_COLUMN,
    LANDED_METRICS,
    READ_METRICS,
    SESSION_CONF,
    drop_lake_copies,
    drop_second_copies,
    dropped_per_topic,
    drops_second_copies,
    identity_of,
    observe_topics,
    prepare_session,
    seed_state,
)
from pydory.pipeline.landing.lake_binding import (
    LakeCheckpointMismatch,
    Pairing,
    PairingKind,
    check_pairing,
    ensure_checkpoint_id,
    record_binding,
    record_landed_batch,
    seed_checkpoint,
)
from pydory.pipeline.landing.nothing_new import nothing_to_land
from pydory.pipeline.landing.skip_report import plan_of_run, skips_of_run
from pydory.pipeline.source.broker_offsets import BrokerOffsets
from pydory.pipeline.source.kafka_source import SOURCE_NAME
from pydory.pipeline.source.offsets import (
    EARLIEST,
    PartitionId,
    offsets_to_json,
    parse_offset_spec,
    resolve_offsets,
)
from pydory.pipeline.spark import (
    DEFAULT_MASTER,
    SPARK_KAFKA_JARS_ENV,
    spark_kafka_connector_jar,
    spark_kafka_connector_may_load,
    spark_kafka_jars_dir,
    spark_session,
)
from pydory.wording import counted

__all__ = [
    "DATA_COLUMNS",
    "DEFAULT_CONNECTOR",
    "DEFAULT_EXECUTOR_WAIT_S",
    "EXIT_COULD_NOT_RUN",
    "EXIT_RECORDS_SKIPPED",
    "PARTITION_COLUMNS",
    "SINK_CONF",
    "LandSettings",
    "LandSummary",
    "SparkJvmDied",
    "landing_writer",
    "run_landing",
    "start_landing",
    "utc_date",
]

#: The lake's layout (the audit reads it): partition directories, then Parquet columns.
PARTITION_COLUMNS = ("topic", "date")
DATA_COLUMNS = (
    "key",
    "value",
    "partition",
    "offset",
    "timestamp",
    "timestampType",
    IDENTITY_COLUMN,
)

#: What the landing keeps of its history, stated rather than left to Spark's defaults
#: (the same values): the checkpoint keeps the offsets, commits and state of its last 100
#: batches; the sink's commit log is compacted every 10 batches and the log files a
#: compaction replaces are deleted 10 minutes later (a reader listing the lake meanwhile
#: still finds them). The compacted log lists every file of the lake, as readers need:
#: the sink's ``retention`` option, which would bound it, is not set (docs/pipeline.md).
#: ``--conf`` overrides each.
SINK_CONF = {
    "spark.sql.streaming.minBatchesToRetain": "100",
    "spark.sql.streaming.fileSink.log.deletion": "true",
    "spark.sql.streaming.fileSink.log.compactInterval": "10",
    "spark.sql.streaming.fileSink.log.cleanupDelay": "10m",
}

DEFAULT_TRIGGER_INTERVAL_S = 5.0
# How long a stopped query's final events may take to reach the progress printer.
_LAST_REPORT_WAIT_S = 30.0
QUERY_NAME = "pydory_land"
# How often the driver, waiting for the query's end, checks that Spark's JVM still runs.
_JVM_CHECK_S = 0.5
#: How long a landing on a cluster waits with no executor before it stops (exit 2).
DEFAULT_EXECUTOR_WAIT_S = 300.0
# Bounds each request to the brokers when seeding a new checkpoint.
_BROKER_TIMEOUT_S = 30.0
# Spark (4.2) gives a Python worker it starts a fixed 10 s to connect back; a loaded host
# can take longer, and the query fails with this. The checkpoint makes a restart exactly
# once, so the job restarts the query, this many times at most.
_WORKER_DID_NOT_CONNECT = "Python worker failed to connect back"
_WORKER_RESTARTS = 3

Connector = Literal["python", "native"]
#: The default connector: Spark's own (see LandSettings).
DEFAULT_CONNECTOR: Connector = "native"
_FORMATS: dict[str, str] = {"python": SOURCE_NAME, "native": "kafka"}
_MICROS_PER_DAY = 86_400 * 1_000_000
#: The exit status of a run that finished but skipped records lost to Kafka
#: (``--fail-on-data-loss false``): not 0, so a supervisor notices; not 1, which says
#: the job failed and should be retried.
EXIT_RECORDS_SKIPPED = 3
#: Offsets as Kafka sources report them: topic -> partition number (text) -> offset.
OffsetsJson = dict[str, dict[str, int]]


@dataclass(frozen=True)
class LandSettings:
    """Everything the landing job needs, checked once on construction.

    ``trigger_interval_s`` applies when ``available_now`` is false (default
    :data:`DEFAULT_TRIGGER_INTERVAL_S`). ``spark_conf`` adds Spark settings.
    ``connector``: ``native`` (default, :data:`DEFAULT_CONNECTOR`) lands through Spark's
    ``kafka`` source, faster and cheaper per record (BENCHMARKS.md); ``python`` through
    ``pydory-kafka``, which needs no jar. Both land the same lake.
    ``starting_offsets`` (``earliest``, ``latest`` or JSON) applies to a new checkpoint
    only (default ``earliest``); on a lake that already holds batches it is required,
    and what the lake holds is skipped (:mod:`pydory.pipeline.landing.lake_binding`).
    ``dedup_window_s``: a second copy of a message landing this long after its first is
    still dropped (:mod:`pydory.pipeline.landing.dedup`; default :data:`DEFAULT_WINDOW_S`).
    ``executor_wait_s``: on a cluster (a master not ``local``), how long the job runs on
    with no executor before it stops with exit status 2 (its workers are gone).
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
    starting_offsets: str | None = None
    spark_conf: Mapping[str, str] = field(default_factory=dict)
    dedup_window_s: float = DEFAULT_WINDOW_S
    executor_wait_s: float = DEFAULT_EXECUTOR_WAIT_S

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
        if self.starting_offsets is not None:
            parse_offset_spec(self.starting_offsets, "--starting-offsets", unlisted=EARLIEST)
        if not self.dedup_window_s > 0:
            raise ValueError(f"dedup_window_s must be positive, not {self.dedup_window_s}")
        if not self.executor_wait_s > 0:
            raise ValueError(f"executor_wait_s must be positive, not {self.executor_wait_s}")

    def source_options(self) -> dict[str, str]:
        """The source's options: the same for ``pydory-kafka`` and Spark's ``kafka``."""
        options = {
            "kafka.bootstrap.servers": self.bootstrap_servers,
            "subscribe": ",".join(self.topics),
            "startingOffsets": self.starting_offsets or "earliest",
            "failOnDataLoss": str(self.fail_on_data_loss).lower(),
            # The identity header: second copies are recognised by it.
            "includeHeaders": "true",
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
    #: Second copies dropped, per topic (topics with none left out).
    dropped: dict[str, int] = field(default_factory=dict)
    #: Whether this run dropped second copies (False: its checkpoint predates them).
    deduplicating: bool = True
    #: Each batch's start and end offsets (topic -> partition -> offset), as the source
    #: reported them; a start is None when the source gave none.
    batch_offsets: list[tuple[OffsetsJson | None, OffsetsJson | None]] = field(default_factory=list)
    #: Beside each of ``batch_offsets``: the second copies that batch dropped, per topic.
    batch_dropped: list[dict[str, int]] = field(default_factory=list)


def landing_writer(spark: SparkSession, settings: LandSettings) -> DataStreamWriter:
    """The landing query, ready to ``start()``: source, lake columns, second copies
    dropped (unless the checkpoint predates that: :func:`drops_second_copies`), sink and
    trigger."""
    if settings.connector == "native":
        _require_native_kafka(spark)
    records = (
        spark.readStream.format(_FORMATS[settings.connector])
        .options(**settings.source_options())
        .load()
    )
    rows = _lake_rows(records)
    files = lake_files(spark, settings.lake, settings.checkpoint)
    if drops_second_copies(settings.checkpoint, files):
        prepare_session(spark, settings.spark_conf)
        rows = observe_topics(rows, READ_METRICS, settings.topics)
        # A checkpoint seeded to continue the lake: what the lake held is not in its state.
        rows = drop_lake_copies(
            rows, spark, settings.lake, settings.checkpoint, settings.dedup_window_s, files
        )
        rows = drop_second_copies(rows, settings.dedup_window_s)
        rows = observe_topics(rows, LANDED_METRICS, settings.topics)
    writer = (
        rows.writeStream.format("parquet")
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
    """Start the landing query on ``spark`` and return it (it runs in the background).

    The bare query: unlike :func:`run_landing`, it neither compares the lake with the
    checkpoint nor records the pair (:mod:`pydory.pipeline.landing.lake_binding`).
    """
    return landing_writer(spark, settings).start()


def run_landing(settings: LandSettings, out: TextIO | None = None) -> int:
    """Run the landing job to its end; print progress and a summary to ``out`` (stdout).

    Returns 0 when the query finished (available-now) or was stopped by SIGINT/SIGTERM
    (interval trigger), 1 when it failed, could not start (including a lake and
    checkpoint that do not belong together: :mod:`pydory.pipeline.landing.lake_binding`), was
    interrupted before landing everything available, or Spark's JVM died;
    :data:`EXIT_COULD_NOT_RUN` (2) when a fault of its surroundings stopped it (the lake
    or checkpoint not writable, the disk full, Kafka, a ``spark://`` master or HDFS not
    answering, a cluster with no executor for ``executor_wait_s``: its last line names
    it, :mod:`pydory.pipeline.faults`); :data:`EXIT_RECORDS_SKIPPED` when it finished
    but, with ``fail_on_data_loss`` false, skipped records no longer in Kafka (listed per
    partition). A session this call starts
    is stopped before it returns; one already running in the process (a test's, a
    notebook's) is left running.
    """
    out = out or sys.stdout
    began = time.monotonic()
    starts_spark = SparkContext._active_spark_context is None
    conf = {**SESSION_CONF, **SINK_CONF, **settings.spark_conf}
    if settings.connector == "native" and starts_spark and not spark_kafka_connector_may_load(conf):
        # Said before anything else (Kafka asked, Spark started): nothing could land.
        _say(out, f"cannot start: {_native_kafka_missing()}")
        return 1
    pairing: Pairing | None = None
    if is_local(settings.lake) and is_local(settings.checkpoint):
        # Before Spark starts: a pair that does not belong together is told at once.
        local = _pair(settings, LocalFiles(), out)
        if isinstance(local, int):
            return local
        pairing = local
        nothing = _nothing_new(settings, pairing, LocalFiles(), out, "Spark not started", began)
        if nothing is not None:
            return nothing
    progress = _ProgressPrinter(out, settings.lake, settings.topics)
    try:
        spark = spark_session(settings.master, app_name="pydory-land", conf=conf)
        spark.streams.addListener(progress)
    except CouldNotRun as error:  # the master is gone
        return _could_not_run(out, error)
    except (PySparkException, Py4JError) as error:
        _say(out, f"cannot start Spark: {_cause(error)}")
        return 1
    jvm = _JvmWatch(spark, _ExecutorWatch(spark, settings.master, settings.executor_wait_s))
    try:
        files = progress.files = lake_files(spark, settings.lake, settings.checkpoint)
        if pairing is None:  # HDFS, S3...: the pair and what is new, read through Spark
            remote = _pair(settings, files, out)
            if isinstance(remote, int):
                return remote
            pairing = remote
            nothing = _nothing_new(settings, pairing, files, out, "no query started", began)
            if nothing is not None:
                return nothing
        return _land(spark, settings, pairing, files, progress, jvm, out, began)
    except Py4JError:
        if jvm.death() is None:
            raise
        _say(out, f"landing FAILED: {jvm.death()}")
        return 1
    finally:
        if jvm.death() is None:
            spark.streams.removeListener(progress)
            if starts_spark:
                # Stop the executors and the JVM cleanly: a process that just exits
                # leaves a cluster master relaunching executors into a dead driver.
                spark.stop()


def _nothing_new(
    settings: LandSettings,
    pairing: Pairing,
    files: LakeFiles,
    out: TextIO,
    spared: str,
    began: float,
) -> int | None:
    """A one-shot run whose checkpoint holds every offset the topics hold ends here
    (:mod:`~pydory.pipeline.landing.nothing_new`): said, summarised, exit status 0; a
    checkpoint that cannot be read, :data:`EXIT_COULD_NOT_RUN`. None: the query runs.
    ``spared`` says what the run did not start."""
    if not settings.available_now or pairing.kind is PairingKind.SEED:
        return None
    try:
        nothing = nothing_to_land(
            settings.bootstrap_servers,
            settings.topics,
            settings.checkpoint,
            settings.starting_offsets,
            files,
        )
    except OSError as error:
        return _could_not_run(out, error)
    if not nothing:
        return None
    _say(out, f"nothing new to land: the checkpoint holds every offset; {spared}")
    _print_summary(out, settings, LandSummary(seconds=time.monotonic() - began), False)
    return 0


def _pair(settings: LandSettings, files: LakeFiles, out: TextIO) -> Pairing | int:
    """The verdict on the lake and the checkpoint, or the exit status (said to ``out``): 1
    when the pair is refused, :data:`EXIT_COULD_NOT_RUN` when it cannot be read."""
    try:
        pairing = check_pairing(
            settings.lake, settings.checkpoint, settings.starting_offsets, files
        )
    except LakeCheckpointMismatch as error:
        _say(out, f"refused: {error}")
        return 1
    except OSError as error:
        return _could_not_run(out, error)
    if pairing.note is not None:
        _say(out, pairing.note)
    return pairing


def _land(
    spark: SparkSession,
    settings: LandSettings,
    pairing: Pairing,
    files: LakeFiles,
    progress: _ProgressPrinter,
    jvm: _JvmWatch,
    out: TextIO,
    began: float,
) -> int:
    """Prepare the checkpoint, run the query to its end, print the summary."""
    try:
        if settings.connector == "native":
            _require_native_kafka(spark)  # its own words first: a connector missing
        # Before any file is written: a Kafka that does not answer is said at once.
        require_kafka(settings.bootstrap_servers)  # faults.KAFKA_ANSWER_TIMEOUT_S
        if pairing.kind is PairingKind.SEED:
            _seed_checkpoint(spark, settings, pairing, files, out)
        deduplicating = drops_second_copies(settings.checkpoint, files)
        if not deduplicating:
            _say(
                out,
                f"second copies are not dropped: the checkpoint {settings.checkpoint} holds "
                "batches landed without their state (before pydory dropped them, or seeded "
                "to continue a lake with a state store other than RocksDB), and Spark cannot "
                "add state to it. To drop them, land into a new lake with a new checkpoint "
                "(docs/pipeline.md, 'Second copies')",
            )
        checkpoint_id = ensure_checkpoint_id(settings.checkpoint, files)
        if pairing.kind is not PairingKind.FRESH:  # the lake exists: record the pair first
            record_binding(
                settings.lake, settings.checkpoint, checkpoint_id, files, settings.bootstrap_servers
            )
        with _stop_on_signals(progress.stop_requested) as interrupted:
            query = _run_with_restarts(spark, settings, progress, jvm, interrupted, out)
            if pairing.kind is PairingKind.FRESH:
                # Only once the query ran, so a job that cannot start makes no lake. A
                # batch landed before this line is adopted: the batch numbers match.
                record_binding(
                    settings.lake,
                    settings.checkpoint,
                    checkpoint_id,
                    files,
                    settings.bootstrap_servers,
                )
    except SparkJvmDied as error:
        _say(out, f"landing FAILED: {error}")
        return 1
    except (OSError, CouldNotRun) as error:
        return _could_not_run(out, error)
    except (ConnectorUnavailable, PipelineError, PySparkException, Py4JJavaError) as error:
        if fault_line(error) is not None and not isinstance(error, ConnectorUnavailable):
            return _could_not_run(out, error)
        _say(out, f"cannot start: {_cause(error)}")
        return 1
    summary = progress.summary_of(query, seconds=time.monotonic() - began)
    summary.deduplicating = deduplicating
    _print_summary(out, settings, summary, interrupted.is_set())
    exception = query.exception()
    if exception is not None and fault_line(exception) is not None:
        return _could_not_run(out, exception)
    if summary.error is not None:
        return 1
    if interrupted.is_set() and settings.available_now:
        return 1
    if not settings.fail_on_data_loss and _report_skips(spark, settings, summary, out):
        return EXIT_RECORDS_SKIPPED
    return 0


def _run_with_restarts(
    spark: SparkSession,
    settings: LandSettings,
    progress: _ProgressPrinter,
    jvm: _JvmWatch,
    interrupted: threading.Event,
    out: TextIO,
) -> StreamingQuery:
    """Run the query to its end (or a stop request) and return it, stopped.

    When it fails, or cannot start, because a Spark Python worker did not connect back
    in time, it is started again from its checkpoint, at most :data:`_WORKER_RESTARTS`
    times, each said on ``out``; every other error stays the query's (or is raised).
    """
    restarts = 0
    while True:
        may_restart = restarts < _WORKER_RESTARTS and not interrupted.is_set()
        try:
            query: StreamingQuery | None = start_landing(spark, settings)
        except (PySparkException, Py4JJavaError) as error:
            if not (may_restart and _WORKER_DID_NOT_CONNECT in str(error)):
                raise
            query = None
        if query is not None:
            progress.watch(query)
            try:
                jvm.wait_for(progress.stop_requested)
            except ExecutorsGone:
                query.stop()  # its batch is redone by the next run
                raise
            query.stop()
            progress.wait_for_last_report()
            if not (may_restart and not interrupted.is_set() and _worker_failed(query)):
                return query
        restarts += 1
        _say(
            out,
            "the query failed because a Spark Python worker did not connect back within "
            "Spark's fixed 10 s (a loaded host); restarting it from its checkpoint "
            f"(restart {restarts} of at most {_WORKER_RESTARTS})",
        )
        progress.rearm()
        if interrupted.is_set():  # a signal between the check and the rearm
            progress.stop_requested.set()


def _worker_failed(query: StreamingQuery) -> bool:
    """Whether ``query`` failed because a Spark Python worker did not connect back."""
    exception = query.exception()
    return exception is not None and _WORKER_DID_NOT_CONNECT in str(exception)


def _report_skips(
    spark: SparkSession, settings: LandSettings, summary: LandSummary, out: TextIO
) -> int:
    """Print what the run skipped, per partition (data loss accepted); return how many."""
    plan = plan_of_run(summary.batch_offsets, summary.batch_dropped)
    landed = _landed_within(spark, settings.lake, plan.forward)
    skips = skips_of_run(plan, landed, reads_new_log=settings.connector == "python")
    total = sum(skip.total for skip in skips)
    if total:
        _say(
            out,
            f"SKIPPED {total:,} records (--fail-on-data-loss false): they were no longer in "
            "Kafka when the job read their partitions, so the lake will never hold them:",
        )
    elif skips:
        _say(out, "Kafka's offsets went backwards; nothing was skipped:")
    for skip in skips:
        print(f"  {skip.describe()}", file=out, flush=True)
    return total


def _landed_within(
    spark: SparkSession, lake: str, ranges: Mapping[PartitionId, list[tuple[int, int]]]
) -> dict[PartitionId, int]:
    """Rows the lake holds per partition within ``ranges`` (counted in Spark)."""
    if not ranges:
        return {}
    within = [
        (F.col("topic") == partition_id.topic)
        & (F.col("partition") == partition_id.partition)
        & (F.col("offset") >= start)
        & (F.col("offset") < end)
        for partition_id, spans in ranges.items()
        for start, end in spans
    ]
    condition = functools.reduce(operator.or_, within)
    rows = spark.read.parquet(lake).where(condition).groupBy("topic", "partition").count().collect()
    return {PartitionId(row.topic, row.partition): row["count"] for row in rows}


def _could_not_run(out: TextIO, error: BaseException) -> int:
    """The one line naming a fault of the job's surroundings; :data:`EXIT_COULD_NOT_RUN`."""
    _say(out, f"could not run: {fault_line(error) or _cause(error)}")
    return EXIT_COULD_NOT_RUN


def _say(out: TextIO, text: str) -> None:
    print(f"pydory pipeline land: {text}", file=out, flush=True)


# --- a new checkpoint on an existing lake --------------------------------------------------


def _seed_checkpoint(
    spark: SparkSession, settings: LandSettings, pairing: Pairing, files: LakeFiles, out: TextIO
) -> None:
    """Start the new checkpoint where the operator chose, past what the lake holds."""
    chosen_text = settings.starting_offsets or "earliest"  # a SEED pairing has them
    spec = parse_offset_spec(chosen_text, "--starting-offsets", unlisted=EARLIEST)
    brokers = BrokerOffsets(
        {"bootstrap.servers": settings.bootstrap_servers, "group.id": "pydory-land"},
        _BROKER_TIMEOUT_S,
    )
    try:
        chosen = resolve_offsets(spec, brokers.available(settings.topics))
    finally:
        brokers.close()
    landed = _lake_next_offsets(spark, settings.lake, settings.topics)
    start = {
        partition_id: max(offset, landed.get(partition_id, offset))
        for partition_id, offset in chosen.items()
    }
    # What Spark records with a batch and keeps for the checkpoint's life, as it would.
    prepare_session(spark, settings.spark_conf)
    jvm: Any = spark.sparkContext._jvm
    metadata = jvm.org.apache.spark.sql.execution.streaming.checkpointing.OffsetSeqMetadata
    recorded = json.loads(metadata.apply(0, 0, spark._jsparkSession.conf()).json())["conf"]
    # It leaves out (null) a setting the session holds at its default: the shuffle's.
    conf: dict[str, str] = {}
    for key, value in recorded.items():
        setting = value or spark.conf.get(key, None)
        if setting is not None:
            conf[key] = setting
    # The state first: a crash before the commit leaves a new checkpoint, seeded again.
    seed_state(settings.checkpoint, pairing.lake_batch, conf, files)
    seed_checkpoint(settings.checkpoint, pairing.lake_batch, start, files, conf)
    skipped = sum(start[partition_id] - chosen[partition_id] for partition_id in start)
    _say(
        out,
        f"the new checkpoint {settings.checkpoint} continues the lake after its batch "
        f"{pairing.lake_batch}, from {json.dumps(offsets_to_json(start))} "
        f"({skipped:,} offsets skipped that the lake already holds)",
    )


def _lake_next_offsets(
    spark: SparkSession, lake: str, topics: tuple[str, ...]
) -> dict[PartitionId, int]:
    """Per partition of ``topics``, the offset after the highest the lake holds."""
    rows = (
        spark.read.parquet(lake)
        .where(F.col("topic").isin(list(topics)))
        .groupBy("topic", "partition")
        .agg(F.max("offset").alias("last"))
        .collect()
    )
    return {PartitionId(row.topic, row.partition): row["last"] + 1 for row in rows}


# --- Spark's JVM ---------------------------------------------------------------------------


class SparkJvmDied(PipelineError):
    """Spark's JVM exited while the job waited on it; the batch in flight is redone later."""


class _JvmWatch:
    """Notices that Spark's JVM has gone, so the driver never waits on it forever.

    The query's end reaches Python as a listener event from the JVM: if the JVM dies,
    none comes. The JVM is this process's child when PySpark launched it (its exit code
    tells how it died); otherwise a request to it that fails says it is gone.
    """

    def __init__(self, spark: SparkSession, executors: _ExecutorWatch | None = None) -> None:
        self._spark = spark
        gateway = spark.sparkContext._gateway
        self._process: Popen[bytes] | None = getattr(gateway, "proc", None)
        self._death: str | None = None
        self._executors = executors

    def wait_for(self, event: threading.Event) -> None:
        """Wait until ``event`` is set; raise :class:`SparkJvmDied` if the JVM dies first,
        :class:`~pydory.pipeline.faults.ExecutorsGone` if a cluster keeps no executor."""
        while not event.wait(_JVM_CHECK_S):
            if self.death() is not None:
                raise SparkJvmDied(f"{self.death()}; the batch in flight is redone by the next run")
            if self._executors is not None:
                self._executors.check()

    def death(self) -> str | None:
        """How the JVM died, or None while it lives."""
        if self._death is None:
            self._death = self._look()
        return self._death

    def _look(self) -> str | None:
        if self._process is not None:
            code = self._process.poll()
            if code is None:
                return None
            how = f"killed by signal {-code}" if code < 0 else f"exit status {code}"
            return f"Spark's JVM (pid {self._process.pid}) exited ({how})"
        jvm: Any = self._spark.sparkContext._jvm
        try:
            jvm.java.lang.System.currentTimeMillis()
        except Py4JNetworkError as error:
            return f"Spark's JVM stopped answering ({error})"
        return None


class _ExecutorWatch:
    """Notices that a job on a cluster has had no executor for ``wait_s``.

    Spark never fails a batch for want of executors: with every worker gone it waits for
    one, forever (the standalone master only logs that the job has no resources). A
    worker's loss alone is not a fault: its tasks run again on the others, or on a
    worker that comes back within ``wait_s``. Not applied in local mode (the driver runs
    the tasks) nor with dynamic allocation, which may release every executor of an idle
    job on purpose.
    """

    def __init__(
        self,
        spark: SparkSession,
        master: str,
        wait_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._master = master
        self._wait_s = wait_s
        self._clock = clock
        context: Any = spark.sparkContext
        dynamic = context is not None and context.getConf().get(_DYNAMIC_ALLOCATION) == "true"
        self._applies = not master.startswith("local") and not dynamic
        self._since: float | None = None
        # Block managers: the driver's and one per executor.
        self.executors: Callable[[], int] = lambda: (
            context._jsc.sc().getExecutorMemoryStatus().size() - 1
        )

    def check(self) -> None:
        """Raise :class:`~pydory.pipeline.faults.ExecutorsGone` once no executor has run
        for ``wait_s`` (counted from the first check that found none)."""
        if not self._applies:
            return
        if self.executors() > 0:
            self._since = None
            return
        now = self._clock()
        if self._since is None:
            self._since = now
        elif now - self._since >= self._wait_s:
            raise ExecutorsGone(
                f"no Spark executor for {self._wait_s:g} s on {self._master}: the cluster's "
                "workers are gone or have no cores or memory left for the job; the batch in "
                "flight is redone by the next run"
            )


_DYNAMIC_ALLOCATION = "spark.dynamicAllocation.enabled"


# --- the lake's rows -----------------------------------------------------------------------


def _lake_rows(records: DataFrame) -> DataFrame:
    """The source's rows in the lake's columns, with the identity and UTC date of each."""
    return records.select(
        *DATA_COLUMNS[:-1],
        identity_of(F.col("headers")).alias(IDENTITY_COLUMN),
        "topic",
        utc_date(F.col("timestamp")).alias("date"),
    )


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
        raise _native_kafka_missing() from None


def _native_kafka_missing() -> ConnectorUnavailable:
    """What a native landing says when Spark's ``kafka`` source is not on the classpath."""
    return ConnectorUnavailable(
        "--connector native needs Spark's kafka source, which is not on the classpath: "
        f"no {spark_kafka_connector_jar()} in {spark_kafka_jars_dir()}. Run ./dev jars "
        "(it fetches Spark's Kafka connector from Maven Central into .jars/spark-kafka/), "
        f"or set {SPARK_KAFKA_JARS_ENV} to a directory holding it and its dependencies "
        "(the jars join the SparkSession when it starts), or use --connector python"
    )


# --- progress ------------------------------------------------------------------------------


class _ProgressPrinter(StreamingQueryListener):
    """Prints one line per non-empty batch and notices when the watched query ends.

    Spark calls it on its listener thread, in event order, possibly before
    :meth:`watch` names the query (a fast query may even have ended by then), so it
    keeps totals per query id. Until a query is watched it prints every query's batches.
    """

    def __init__(self, out: TextIO, lake: str, topics: tuple[str, ...]) -> None:
        self._out = out
        self._lake = lake
        #: How the lake is reached (set once Spark runs); local paths when None.
        self.files: LakeFiles | None = None
        self._topics = topics
        self._lock = threading.Lock()
        self._watched: str | None = None
        self._watched_run: str | None = None
        self._summaries: dict[str, LandSummary] = {}
        self._ended: set[str] = set()  # run ids: a restart from the checkpoint keeps the id
        self._watched_ended = threading.Event()
        #: Set when the watched query ends; others (a signal handler) may set it too.
        self.stop_requested = threading.Event()

    def watch(self, query: StreamingQuery) -> None:
        """Report on ``query`` only (its totals add to those of its earlier runs)."""
        with self._lock:
            self._watched = str(query.id)
            self._watched_run = str(query.runId)
            if self._watched_run in self._ended:
                self._watched_ended.set()
                self.stop_requested.set()

    def rearm(self) -> None:
        """Before the watched query runs again: it has not ended, and no stop is asked."""
        with self._lock:
            self._watched_ended.clear()
            self.stop_requested.clear()

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
        source = progress.sources[0] if progress.sources else None
        start, end = _offsets_json(source, "startOffset"), _offsets_json(source, "endOffset")
        dropped = dropped_per_topic(progress.observedMetrics or {}, self._topics)
        with self._lock:
            summary = self._summaries.setdefault(str(progress.id), LandSummary())
            # A batch without rows still counts here: its offsets may have jumped.
            summary.batch_offsets.append((start, end))
            summary.batch_dropped.append(dropped)
            if progress.numInputRows > 0:
                summary.batches += 1
                summary.records += progress.numInputRows
            for topic, count in dropped.items():
                summary.dropped[topic] = summary.dropped.get(topic, 0) + count
        # The sink committed the batch before Spark reported it: the lake records it.
        try:
            record_landed_batch(self._lake, progress.batchId, end, self.files)
        except (OSError, LakeCheckpointMismatch) as error:
            # The record only informs the operator; the pair was checked at the start.
            print(
                f"pydory pipeline land: batch {progress.batchId} not recorded in the lake: {error}",
                file=self._out,
                flush=True,
            )
        if progress.numInputRows > 0 and self._reports_on(str(progress.id)):
            copies = sum(dropped.values())
            print(
                f"batch {progress.batchId}: {progress.numInputRows:,} records "
                f"({summary.records:,} in {counted(summary.batches, 'batch')} so far)"
                + (f", {copies:,} second copies dropped" if copies else ""),
                file=self._out,
                flush=True,
            )

    def onQueryIdle(self, event: Any) -> None:
        """Nothing to report: the query waits for data."""

    def onQueryTerminated(self, event: Any) -> None:
        with self._lock:
            self._ended.add(str(event.runId))
            if str(event.runId) == self._watched_run:
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


def _offsets_json(source: Any, name: str) -> OffsetsJson | None:
    """A source progress's ``startOffset`` or ``endOffset``: JSON text, or ``null``."""
    if source is None:
        return None
    try:
        decoded = json.loads(getattr(source, name))
    except (TypeError, ValueError):
        return None
    return decoded if isinstance(decoded, dict) else None


def _print_summary(
    out: TextIO, settings: LandSettings, summary: LandSummary, interrupted: bool
) -> None:
    how = "stopped by signal" if interrupted else "finished"
    if summary.error is not None:
        how = "FAILED"
    print(
        f"landing {how}: {summary.records:,} records in {counted(summary.batches, 'batch')} "
        f"from {', '.join(settings.topics)} into {settings.lake} ({summary.seconds:.1f} s); "
        + _copies_dropped(summary)
        + ("" if summary.error is None else f"; the cause:\n{summary.error}"),
        file=out,
        flush=True,
    )


def _copies_dropped(summary: LandSummary) -> str:
    """``12 second copies dropped (events 10, logs 2)``, or why none could be."""
    if not summary.deduplicating:
        return "second copies not dropped (the checkpoint predates it)"
    total = sum(summary.dropped.values())
    per_topic = ", ".join(f"{topic} {count:,}" for topic, count in sorted(summary.dropped.items()))
    return f"{total:,} second copies dropped" + (f" ({per_topic})" if per_topic else "")


def _cause(error: BaseException) -> str:
    """The part of a (possibly Python-worker, wrapped by the JVM) error naming the cause.

    A pydory error raised in a Spark worker reaches the driver inside a JVM exception
    with a traceback around it; keep only its own message, which may span lines.
    """
    text = str(error).strip()
    spark_data_loss = _spark_data_loss(text)
    if spark_data_loss is not None:
        return spark_data_loss
    lines = text.splitlines()
    for index, line in enumerate(lines):
        if _OWN_ERRORS in line:
            cause = [line[line.index(_OWN_ERRORS) + len(_OWN_ERRORS) :]]
            for follower in lines[index + 1 :]:
                if not follower.strip() or follower.startswith(_NOT_THE_MESSAGE):
                    break
                cause.append(follower.rstrip())
            return "\n".join(cause)
    return lines[0] if lines else type(error).__name__


def _spark_data_loss(text: str) -> str | None:
    """Spark's Kafka source's data-loss error, said with its cause (None if it is not one).

    Its first line blames retention whatever happened; the cause is in a later line.
    """
    if _SPARK_DATA_LOSS not in text:
        return None
    went_back = sorted(
        {f"{m[1]}/{m[2]} from {m[3]} to {m[4]}" for m in _OFFSET_CHANGED.finditer(text)}
    )
    if went_back:
        cause = (
            "Kafka's offsets went backwards (the topic was deleted and recreated, or its log "
            f"truncated): {', '.join(went_back)}"
        )
    else:
        reasons = [
            line.removeprefix("Reason: ")
            for line in text.splitlines()
            if line.startswith("Reason: ")
        ]
        cause = "offsets to land are no longer in Kafka (aged out of retention)" + (
            f": {'; '.join(dict.fromkeys(reasons))}" if reasons else ""
        )
    return (
        f"{cause}. --fail-on-data-loss false lands what Kafka still holds and reports what "
        "it skipped"
    )


_SPARK_DATA_LOSS = "Some data may have been lost because they are not available in Kafka"
_OFFSET_CHANGED = re.compile(r"Partition (\S+)-(\d+)(?:'s)? offset was changed from (\d+) to (\d+)")
_OWN_ERRORS = "pydory.pipeline.errors."
_NOT_THE_MESSAGE = ("\tat ", " SQLSTATE", "Traceback", "JVM stacktrace", "\n")
