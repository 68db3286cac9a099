"""The fleet audit job: every daemon's books from the books topic, every identity from
the lake, proved against each other by :mod:`pydory.pipeline.audits.fleet_reconcile`.

No daemon is asked anything: the books come from Kafka (the topic each daemon publishes
its runs' books to, ``<messageIdentity><booksTopic>``), so a host that is down, or gone,
is audited like the others. Both sides are read with Spark:

- the books topic in one batch read (Spark's ``kafka`` source, or ``pydory-kafka``), the
  latest record per run kept (the topic is compacted; older records may still be there).
  A run whose latest entry is a tombstone (its books deleted) keeps its last record
  before it, marked so, or, with none left, is named as deleted
  (:mod:`pydory.pipeline.audits.fleet_reconcile` says how each is proved);
- the lake through the file sink's commit log (``spark.read.parquet(lake)`` lists only the
  files of committed batches), its ``pydory_id`` column parsed into host, incarnation,
  stream and sequence, and aggregated in Spark: per (host, incarnation, topic) the rows
  and the distinct identities; per (host, incarnation, stream) the runs of consecutive
  sequences landed (*ranges*: a stream's sequences are dense, so a few ranges stand for
  millions of identities), which is all the driver collects.

Incremental (``state_dir``, a local directory or a URI like the lake's): the ranges, the
counts, how far the lake was read and the books topic's next offsets are kept in
``fleet-audit-state.json``; a later run reads only the lake files committed since, checks
their identities against the kept ranges (a second copy that landed in a later batch is
found so), and only the books records published since. Without a state every run reads
everything. A run whose local lake and state show nothing new since (the books topic's
offsets, the lake files' times: :mod:`~pydory.pipeline.audits.fleet_nothing_new`) is
:func:`audit_from_state`'s: the state's report, no Spark started.

How far the lake was read is a mark, not a list of every file ever read (which grows with
the lake): the newest modification time among the files read, and the names of the files
with exactly that time. The file sink runs its batches one after another and commits a
batch only after its files are closed, so every file of a later batch was written after
every file of an earlier one: the files committed since the last run are those modified
after the mark (or at it, not yet read). Spark prunes the lake's files on that condition
(``_metadata.file_modification_time``) before reading any. The lake's times come from one
clock (HDFS's namenode, the object store, the landing host's kernel).

Rule: ``fleet_audit`` is the only code that reads the lake by identity and the books topic.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import json
import os
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from pydory.message_identity import INCARNATION_PATTERN, SEPARATOR, parse_identity
from pydory.pipeline import faults
from pydory.pipeline.audits.audit import COMMIT_LOG_DIR, NotALake
from pydory.pipeline.audits.fleet_nothing_new import nothing_to_audit
from pydory.pipeline.audits.fleet_reconcile import (
    FleetReport,
    LakeIdentities,
    RunRecord,
    UnreadableBooksRecord,
    reconcile_fleet,
)
from pydory.pipeline.errors import PipelineError
from pydory.pipeline.lake_files import LakeFiles, is_local, join, lake_files
from pydory.pipeline.landing.dedup import IDENTITY_COLUMN
from pydory.pipeline.source.kafka_source import SOURCE_NAME

__all__ = [
    "DEFAULT_BOOKS_TOPIC",
    "BooksTopicUnavailable",
    "FleetState",
    "StateMismatch",
    "audit_from_state",
    "fleet_audit",
    "require_lake",
]

#: The daemon's default ``<messageIdentity><booksTopic>``.
DEFAULT_BOOKS_TOPIC = "pydory.books"
STATE_FILE = "fleet-audit-state.json"
STATE_VERSION = 2  # 1 listed every lake file read; 2 keeps a mark
_FORMATS = {"native": "kafka", "python": SOURCE_NAME}
_LAKE_COLUMNS = StructType(
    [StructField(IDENTITY_COLUMN, StringType()), StructField("topic", StringType())]
)


class BooksTopicUnavailable(PipelineError):
    """The books topic could not be read (no such topic, Kafka unreachable). Check the
    bootstrap servers and ``--books-topic`` (the daemons' ``<booksTopic>``)."""


class StateMismatch(PipelineError):
    """The ``--state`` directory belongs to another lake or books topic: give each
    audited lake a state directory of its own."""


# --- the state kept between runs --------------------------------------------------------------

Stream = tuple[str, str, int]  # host, incarnation, stream


@dataclass
class FleetState:
    """What earlier runs read: how far in the lake, identity ranges, counts, books records."""

    lake: str
    books_topic: str
    #: The newest modification time (epoch microseconds) of the lake files read, -1: none.
    read_through_us: int = -1
    #: The files read whose modification time is the mark (a later file may share it).
    files_at_mark: set[str] = field(default_factory=set)
    files_audited: int = 0
    ranges: dict[Stream, list[list[int]]] = field(default_factory=dict)
    per_run_topic: dict[tuple[str, str, str], list[int]] = field(default_factory=dict)
    without_identity: dict[str, int] = field(default_factory=dict)
    unreadable_identity: dict[str, int] = field(default_factory=dict)
    books_offsets: dict[int, int] = field(default_factory=dict)  # partition -> next offset
    books: dict[str, dict[str, Any]] = field(default_factory=dict)  # key -> record JSON
    unreadable_books: int = 0
    #: Runs whose latest books entry is a tombstone (their record, if read, kept in books).
    deleted: set[str] = field(default_factory=set)

    @classmethod
    def load(
        cls, state_dir: str | None, lake: str, books_topic: str, files: LakeFiles | None = None
    ) -> FleetState:
        if state_dir is None:
            return cls(lake, books_topic)
        path = join(state_dir, STATE_FILE)
        text = (files or lake_files(None, state_dir)).read_text(path)
        if text is None:
            return cls(lake, books_topic)
        document = json.loads(text)
        if document.get("version") != STATE_VERSION:
            raise StateMismatch(
                f"{path}: state version {document.get('version')!r}, not {STATE_VERSION} "
                "(written by another pydory): give a new --state directory to audit the "
                "lake from its start"
            )
        if (document["lake"], document["books_topic"]) != (lake, books_topic):
            raise StateMismatch(
                f"{path} is the state of lake {document['lake']} and books topic "
                f"{document['books_topic']}, not of {lake} and {books_topic}"
            )
        return cls(
            lake,
            books_topic,
            read_through_us=int(document["read_through_us"]),
            files_at_mark=set(document["files_at_mark"]),
            files_audited=int(document["files_audited"]),
            ranges={_stream(key): value for key, value in document["ranges"].items()},
            per_run_topic={
                _run_topic_key(key): value for key, value in document["per_run_topic"].items()
            },
            without_identity=document["without_identity"],
            unreadable_identity=document["unreadable_identity"],
            books_offsets={int(p): int(o) for p, o in document["books_offsets"].items()},
            books=document["books"],
            unreadable_books=int(document["unreadable_books"]),
            # Absent from a state kept before tombstones were told apart.
            deleted=set(document.get("deleted", [])),
        )

    def save(self, state_dir: str, files: LakeFiles | None = None) -> None:
        """Write the state whole (a new file renamed over the old one)."""
        document = {
            "version": STATE_VERSION,
            "lake": self.lake,
            "books_topic": self.books_topic,
            "read_through_us": self.read_through_us,
            "files_at_mark": sorted(self.files_at_mark),
            "files_audited": self.files_audited,
            "ranges": {"\n".join(map(str, key)): value for key, value in self.ranges.items()},
            "per_run_topic": {"\n".join(key): value for key, value in self.per_run_topic.items()},
            "without_identity": self.without_identity,
            "unreadable_identity": self.unreadable_identity,
            "books_offsets": {str(p): o for p, o in self.books_offsets.items()},
            "books": self.books,
            "unreadable_books": self.unreadable_books,
            "deleted": sorted(self.deleted),
        }
        (files or lake_files(None, state_dir)).write_text(
            join(state_dir, STATE_FILE), json.dumps(document)
        )

    def landed(self, identity: str) -> bool:
        """Whether ``identity`` (``host/incarnation/stream/sequence``) is in the lake."""
        parsed = parse_identity(identity)
        if parsed is None:
            return False
        key, number = (parsed.host, parsed.incarnation, parsed.stream), parsed.sequence
        ranges = self.ranges.get(key, [])
        at = bisect.bisect_right(ranges, [number, float("inf")]) - 1
        return at >= 0 and ranges[at][0] <= number <= ranges[at][1]

    def add_ranges(self, new: Iterable[tuple[Stream, int, int]]) -> None:
        """Fold new ranges in, merging those that touch."""
        touched: set[Stream] = set()
        for key, low, high in new:
            self.ranges.setdefault(key, []).append([low, high])
            touched.add(key)
        for key in touched:
            merged: list[list[int]] = []
            for low, high in sorted(self.ranges[key]):
                if merged and low <= merged[-1][1] + 1:
                    merged[-1][1] = max(merged[-1][1], high)
                else:
                    merged.append([low, high])
            self.ranges[key] = merged


def _run_topic_key(key: str) -> tuple[str, str, str]:
    host, incarnation, topic = key.split("\n")
    return host, incarnation, topic


def _stream(key: str) -> Stream:
    host, incarnation, stream = key.split("\n")
    return host, incarnation, int(stream)


# --- the job ----------------------------------------------------------------------------------


def fleet_audit(
    spark: SparkSession,
    lake: str | os.PathLike[str],
    *,
    bootstrap_servers: str,
    books_topic: str = DEFAULT_BOOKS_TOPIC,
    state_dir: str | None = None,
    connector: str = "native",
    kafka_options: Mapping[str, str] | None = None,
    topics: Collection[str] | None = None,
) -> FleetReport:
    """Read what is new in the books topic and the lake, and prove the books; with
    ``state_dir``, keep what was read for the next run; ``topics``: audit only these (a
    lake that lands some of the topics the daemons send). Raises :class:`NotALake`,
    :class:`BooksTopicUnavailable` or :class:`StateMismatch`."""
    lake_path = require_lake(lake, spark)
    state_files = None if state_dir is None else lake_files(spark, state_dir)
    state = FleetState.load(state_dir, lake_path, books_topic, state_files)
    options = {"kafka.bootstrap.servers": bootstrap_servers, **(kafka_options or {})}
    books_read = _read_books(spark, state, options, _FORMATS[connector])
    files_read = _read_lake(spark, state)
    report = _prove(state, books_read, files_read, state_dir is not None, topics, spark=True)
    if state_dir is not None:
        state.save(state_dir, state_files)
    return report


def audit_from_state(
    lake: str | os.PathLike[str],
    *,
    bootstrap_servers: str,
    books_topic: str = DEFAULT_BOOKS_TOPIC,
    state_dir: str | None = None,
    kafka_options: Mapping[str, str] | None = None,
    topics: Collection[str] | None = None,
) -> FleetReport | None:
    """The report of an incremental run that has nothing new to read, made from
    ``state_dir`` alone, without Spark (:mod:`~pydory.pipeline.audits.fleet_nothing_new`);
    None when the run is :func:`fleet_audit`'s: something may be new, no state yet, the
    lake or the state off this machine's file system. Raises :class:`NotALake` or
    :class:`StateMismatch` as :func:`fleet_audit` does."""
    if state_dir is None or not (is_local(os.fspath(lake)) and is_local(state_dir)):
        return None
    lake_path = require_lake(lake)
    state = FleetState.load(state_dir, lake_path, books_topic)
    kafka = {
        k[len("kafka.") :]: v for k, v in (kafka_options or {}).items() if k.startswith("kafka.")
    }
    if not nothing_to_audit(state, {**kafka, "bootstrap.servers": bootstrap_servers}):
        return None
    return _prove(state, 0, 0, True, topics, spark=False)


def _prove(
    state: FleetState,
    books_read: int,
    files_read: int,
    incremental: bool,
    topics: Collection[str] | None,
    *,
    spark: bool,
) -> FleetReport:
    """The books of ``state`` proved against what it holds of the lake."""
    runs = []
    for key, value in state.books.items():
        with contextlib.suppress(UnreadableBooksRecord):  # counted when it was read
            run = RunRecord.from_json(value)
            runs.append(dataclasses.replace(run, tombstoned=key in state.deleted))
    return reconcile_fleet(
        runs,
        LakeIdentities(
            per_run_topic={key: (rows, n) for key, (rows, n) in state.per_run_topic.items()},
            without_identity=state.without_identity,
            unreadable_identity=state.unreadable_identity,
            landed=state.landed,
        ),
        sources={
            "lake": state.lake,
            "books_topic": state.books_topic,
            "lake_files_read": files_read,
            "lake_files_audited": state.files_audited,
            "books_records_read": books_read,
            "runs": len(runs),
            "unreadable_books_records": state.unreadable_books,
            "incremental": incremental,
            "topics": None if topics is None else sorted(topics),
            "read_with_spark": spark,
        },
        deleted=state.deleted - set(state.books),
        topics=topics,
    )


def require_lake(lake: str | os.PathLike[str], spark: SparkSession | None = None) -> str:
    """The lake's absolute path or qualified URI; raises :class:`NotALake` without a
    file-sink commit log (reading the directory would count files of batches that never
    committed). A lake on HDFS or S3 needs ``spark`` (its Hadoop client)."""
    files = lake_files(spark, os.fspath(lake))
    lake_path = files.qualify(os.fspath(lake))
    if not files.is_dir(join(lake_path, COMMIT_LOG_DIR)):
        raise NotALake(
            f"{lake_path} has no {COMMIT_LOG_DIR}/ commit log: it is not the path of a Spark "
            "file sink (give the landing job's --lake directory or URI)"
        )
    return lake_path


# --- the books topic --------------------------------------------------------------------------


def _read_books(
    spark: SparkSession, state: FleetState, options: Mapping[str, str], source: str
) -> int:
    """Read the books records published since the last run; the latest per run kept."""
    partitions = _books_partitions(options["kafka.bootstrap.servers"], state.books_topic, options)
    starting = {str(p): state.books_offsets.get(p, -2) for p in partitions}
    reader = spark.read.format(source)
    for key, value in options.items():
        reader = reader.option(key, value)
    records = (
        reader.option("subscribe", state.books_topic)
        .option("startingOffsets", json.dumps({state.books_topic: starting}))
        .option("endingOffsets", "latest")
        .option("failOnDataLoss", "false")  # compaction and retention remove old records
        .load()
        .select(
            F.col("key").cast("string").alias("key"),
            F.col("value").cast("string").alias("value"),
            "partition",
            "offset",
        )
    )
    latest = records.groupBy("key").agg(
        # The latest record, and whether a tombstone (a null value) came after it: max_by
        # passes over rows whose ordering is null.
        F.max_by("value", F.when(F.col("value").isNotNull(), F.col("offset"))).alias("value"),
        F.max_by(F.col("value").isNull(), "offset").alias("deleted"),
        F.count("*").alias("n"),
    )
    ends = records.groupBy("partition").agg(F.max("offset").alias("last"))
    read = 0
    for row in latest.collect():
        read += row["n"]
        if row["key"] is None:  # not a run's record (the daemon always keys them)
            state.unreadable_books += 1
            continue
        if row["deleted"]:
            state.deleted.add(row["key"])
        else:
            state.deleted.discard(row["key"])
        if row["value"] is None:  # only a tombstone: an earlier run's record, if any, stays
            continue
        try:
            state.books[row["key"]] = json.loads(row["value"])
            RunRecord.from_json(state.books[row["key"]])
        except (TypeError, ValueError, UnreadableBooksRecord):
            state.books.pop(row["key"], None)
            state.unreadable_books += 1
    for row in ends.collect():
        state.books_offsets[row["partition"]] = row["last"] + 1
    return read


def _books_partitions(bootstrap: str, topic: str, options: Mapping[str, str]) -> list[int]:
    """The books topic's partitions, asked of Kafka (librdkafka, on the driver)."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    properties = {k[len("kafka.") :]: v for k, v in options.items() if k.startswith("kafka.")}
    # Never created by looking: a metadata request may ask the broker to auto-create it.
    admin = AdminClient(
        {**properties, "bootstrap.servers": bootstrap, "allow.auto.create.topics": False}
    )
    try:
        metadata = admin.list_topics(topic, timeout=faults.KAFKA_ANSWER_TIMEOUT_S).topics.get(topic)
    except KafkaException as error:
        raise BooksTopicUnavailable(
            f"cannot read books topic {topic}: {error.args[0].str()}"
        ) from None
    if metadata is None or metadata.error is not None or not metadata.partitions:
        why = "no such topic" if metadata is None or metadata.error else "no partitions"
        raise BooksTopicUnavailable(
            f"books topic {topic} at {bootstrap}: {why} (the daemons' <booksTopic>, "
            "created by a daemon with topicAutocreate on, or by hand: docs/operations.md)"
        )
    return sorted(metadata.partitions)


# --- the lake ---------------------------------------------------------------------------------


def _read_lake(spark: SparkSession, state: FleetState) -> int:
    """Read the lake files committed since the last run into ``state``; how many."""
    new_files = _files_since_mark(spark, state)
    if not new_files:
        return 0
    rows = (
        spark.read.schema(_LAKE_COLUMNS)
        .option("basePath", state.lake)
        .parquet(*sorted(new_files))
        .select("topic", IDENTITY_COLUMN)
    )
    _count_unidentified(rows, state)
    identified = _identities(rows)
    copies = identified.groupBy("host", "incarnation", "stream", "sequence", "topic").agg(
        F.count("*").alias("copies")
    )
    # Two aggregations read it: kept (memory, then disk) instead of reading the files twice.
    seen = _seen_before(spark, copies, state).persist()
    try:
        per_run = seen.groupBy("host", "incarnation", "topic").agg(
            F.sum("copies").alias("rows"),
            F.sum(F.when(~F.col("seen"), 1).otherwise(0)).alias("new"),
        )
        for row in per_run.collect():
            key = (row["host"], row["incarnation"], row["topic"])
            rows_before, distinct_before = state.per_run_topic.get(key, [0, 0])
            state.per_run_topic[key] = [rows_before + row["rows"], distinct_before + row["new"]]
        state.add_ranges(_ranges(seen.where(~F.col("seen"))))
    finally:
        seen.unpersist()
    mark = max(new_files.values())
    at_mark = {name for name, modified in new_files.items() if modified == mark}
    state.files_at_mark = at_mark | (
        state.files_at_mark if mark == state.read_through_us else set()
    )
    state.read_through_us = mark
    state.files_audited += len(new_files)
    return len(new_files)


def _files_since_mark(spark: SparkSession, state: FleetState) -> dict[str, int]:
    """The committed lake files modified after the state's mark (or at it and not yet
    read), with their modification times in epoch microseconds."""
    modified = F.col("_metadata.file_modification_time")
    path = F.col("_metadata.file_path")
    committed = spark.read.schema(_LAKE_COLUMNS).parquet(state.lake)
    if state.read_through_us >= 0:
        mark = F.timestamp_micros(F.lit(state.read_through_us))
        later = modified > mark
        if state.files_at_mark:
            later = later | ((modified == mark) & ~path.isin(sorted(state.files_at_mark)))
        committed = committed.where(later)
    files = committed.select(path.alias("path"), F.unix_micros(modified).alias("us")).distinct()
    return {row["path"]: row["us"] for row in files.collect()}


def _count_unidentified(rows: DataFrame, state: FleetState) -> None:
    """Rows without a pydory-id, and rows whose pydory-id is not one, per topic."""
    valid = _valid_identity(F.col(IDENTITY_COLUMN))
    counts = rows.groupBy("topic").agg(
        F.sum(F.when(F.col(IDENTITY_COLUMN).isNull(), 1).otherwise(0)).alias("none"),
        F.sum(F.when(F.col(IDENTITY_COLUMN).isNotNull() & ~valid, 1).otherwise(0)).alias("bad"),
    )
    for row in counts.collect():
        for into, n in (
            (state.without_identity, row["none"]),
            (state.unreadable_identity, row["bad"]),
        ):
            if n:
                into[row["topic"]] = into.get(row["topic"], 0) + n


def _valid_identity(column: Any) -> Any:
    parts = F.split(column, SEPARATOR)
    return (
        (F.size(parts) == 4)
        & (F.length(parts[0]) > 0)
        & parts[1].rlike(INCARNATION_PATTERN)
        & parts[2].rlike(r"^[0-9]{1,10}$")
        & parts[3].rlike(r"^[0-9]{1,10}$")
    )


def _identities(rows: DataFrame) -> DataFrame:
    parts = F.split(F.col(IDENTITY_COLUMN), SEPARATOR)
    return rows.where(_valid_identity(F.col(IDENTITY_COLUMN))).select(
        "topic",
        parts[0].alias("host"),
        parts[1].alias("incarnation"),
        parts[2].cast("long").alias("stream"),
        parts[3].cast("long").alias("sequence"),
    )


def _seen_before(spark: SparkSession, copies: DataFrame, state: FleetState) -> DataFrame:
    """``copies`` with ``seen``: the identity landed in a file an earlier run read."""
    if not state.ranges:
        return copies.withColumn("seen", F.lit(False))
    known = spark.createDataFrame(
        [
            (h, i, s, low, high)
            for (h, i, s), ranges in state.ranges.items()
            for low, high in ranges
        ],
        "host string, incarnation string, stream long, low long, high long",
    )
    joined = copies.join(
        F.broadcast(known),
        on=(
            (copies["host"] == known["host"])
            & (copies["incarnation"] == known["incarnation"])
            & (copies["stream"] == known["stream"])
            & copies["sequence"].between(known["low"], known["high"])
        ),
        how="left",
    )
    return joined.select(
        copies["host"],
        copies["incarnation"],
        copies["stream"],
        copies["sequence"],
        copies["topic"],
        copies["copies"],
        known["low"].isNotNull().alias("seen"),
    )


def _ranges(identities: DataFrame) -> list[tuple[Stream, int, int]]:
    """Runs of consecutive sequences per stream (gaps and islands: in a run, sequence
    minus its rank is constant)."""
    in_stream = Window.partitionBy("host", "incarnation", "stream").orderBy("sequence")
    islands = (
        identities.select("host", "incarnation", "stream", "sequence")
        .withColumn("island", F.col("sequence") - F.row_number().over(in_stream))
        .groupBy("host", "incarnation", "stream", "island")
        .agg(F.min("sequence").alias("low"), F.max("sequence").alias("high"))
    )
    return [
        ((row["host"], row["incarnation"], row["stream"]), row["low"], row["high"])
        for row in islands.collect()
    ]
