"""The audit job: does the lake hold what the daemon says it delivered, exactly once?

Two inputs, read here, compared in :mod:`pydory.pipeline.audits.reconcile`:

- the lake, through Spark. ``spark.read.parquet(LAKE)`` on the file sink's own path
  reads the sink's commit log (``LAKE/_spark_metadata``) and only the files it lists, so
  files of a batch that never committed (a job killed mid-batch) are not counted. A
  directory without that log is refused: reading it would count every file in it.
  Aggregation runs in Spark (one row per Kafka partition comes back to the driver, plus
  at most a few sample offsets when something is wrong), never the data itself.
- the daemon's books: ``/books/json`` from its status server, or a copy saved earlier
  (a daemon that has exited can no longer be asked).

A gap in a partition's offsets is either a record that never landed or a second copy
the landing job dropped (a daemon's replay after a crash: its identity is in the lake
already). With Kafka's address (``bootstrap_servers``, or the one the landing job
recorded in the lake) the audit reads the gaps' records from Kafka (Spark's ``kafka``
source, by ``assign``) and counts those whose ``pydory-id`` the lake holds as dropped
second copies, not missing; a gap record without an identity, with one the lake lacks,
or no longer in Kafka (retention) stays missing.

The books are lifetime totals of one daemon process: audit a lake that holds the topics
of that run, after the daemon has settled (``in_flight`` 0) and the landing job has
caught up. A lake that also holds what a later run delivered of the messages the earlier
one left in its spool (``left_for_next_start``) is audited with both runs' books, summed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

from pydory.pipeline.audits.reconcile import (
    AuditReport,
    DaemonBooks,
    DuplicateOffset,
    OffsetGap,
    PartitionLanding,
    reconcile,
)
from pydory.pipeline.errors import PipelineError
from pydory.pipeline.faults import require_kafka
from pydory.pipeline.lake_files import join, lake_files
from pydory.pipeline.landing.dedup import IDENTITY_COLUMN, identity_of
from pydory.pipeline.landing.lake_binding import recorded_bootstrap_servers
from pydory.status_client import DaemonUnreachable, NotAStatusPage, StatusHttp, StatusUrlError

__all__ = [
    "BooksUnavailable",
    "LakeSummary",
    "NotALake",
    "audit",
    "fetch_books",
    "load_books",
    "summarize_lake",
]

#: The file sink's commit log, inside the sink's path.
COMMIT_LOG_DIR = "_spark_metadata"
#: How many missing ranges and duplicated offsets a report shows (the counts are exact).
SAMPLE_SIZE = 10
_HTTP_TIMEOUT_S = 10.0
#: The lake columns the audit reads (the landing job's layout, docs/pipeline.md). Naming
#: them keeps an empty lake readable (nothing to infer a schema from) and lets Parquet
#: skip the key and value columns.
AUDITED_COLUMNS = StructType(
    [
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
    ]
)


#: The columns read to tell a dropped second copy from a missing record.
_IDENTITY_COLUMNS = StructType(
    [*AUDITED_COLUMNS.fields, StructField(IDENTITY_COLUMN, StringType())]
)


class NotALake(PipelineError):
    """The lake path is not the path of a Spark file sink (no ``_spark_metadata`` in it).

    Pass the directory given to the landing job as ``--lake``: without the sink's commit
    log, files of batches that never committed would be counted.
    """


class BooksUnavailable(PipelineError):
    """The daemon's books could not be read: the status server did not answer, or the
    saved file is missing. Check the URL (the daemon's httpInterface port) or the path."""


# --- the lake ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class LakeSummary:
    """Per Kafka partition facts about the lake, and samples of what is wrong."""

    partitions: tuple[PartitionLanding, ...]
    gaps: tuple[OffsetGap, ...]
    duplicate_offsets: tuple[DuplicateOffset, ...]
    #: Per partition with offsets missing: the first and last of them (inclusive).
    gap_spans: Mapping[tuple[str, int], tuple[int, int]] = field(default_factory=dict)


def summarize_lake(
    spark: SparkSession, lake: str | os.PathLike[str], *, from_offset_zero: bool = False
) -> LakeSummary:
    """Aggregate the committed part of the lake per (topic, partition) in Spark.

    ``lake`` is a local path or a URI (``hdfs://``, ``s3a://``...). Raises
    :class:`NotALake` when ``lake`` has no file-sink commit log.
    """
    path = os.fspath(lake)
    if not lake_files(spark, path).is_dir(join(path, COMMIT_LOG_DIR)):
        raise NotALake(
            f"{path} has no {COMMIT_LOG_DIR}/ commit log: it is not the path of a Spark file "
            "sink (give the landing job's --lake directory or URI)"
        )
    copies = _copies_per_offset(spark, path)
    partitions = _partition_landings(copies)
    gaps: list[OffsetGap] = []
    if from_offset_zero:
        gaps.extend(
            OffsetGap(p.topic, p.partition, 0, p.first_offset - 1)
            for p in partitions
            if p.first_offset > 0
        )
    spans: dict[tuple[str, int], tuple[int, int]] = {}
    if from_offset_zero:
        spans.update(
            ((p.topic, p.partition), (0, p.first_offset - 1))
            for p in partitions
            if p.first_offset > 0
        )
    if any(p.missing_inside for p in partitions):
        gaps.extend(_gaps_inside(copies, SAMPLE_SIZE))
        for key, (low, high) in _gap_spans(copies).items():
            spans[key] = (min(low, spans.get(key, (low, high))[0]), high)
    duplicates = _duplicated(copies, SAMPLE_SIZE) if any(p.duplicates for p in partitions) else ()
    return LakeSummary(tuple(partitions), tuple(gaps[:SAMPLE_SIZE]), tuple(duplicates), spans)


def _gap_spans(copies: DataFrame) -> dict[tuple[str, int], tuple[int, int]]:
    """Per partition with a gap: its first and last offset missing between landed ones."""
    in_partition = Window.partitionBy("topic", "partition").orderBy("offset")
    spans = (
        copies.select("topic", "partition", "offset")
        .withColumn("previous", F.lag("offset").over(in_partition))
        .where(F.col("offset") - F.col("previous") > 1)
        .groupBy("topic", "partition")
        .agg(F.min(F.col("previous") + 1).alias("low"), F.max(F.col("offset") - 1).alias("high"))
    )
    return {(row["topic"], row["partition"]): (row["low"], row["high"]) for row in spans.collect()}


def second_copies_in_gaps(
    spark: SparkSession,
    lake: str,
    spans: Mapping[tuple[str, int], tuple[int, int]],
    bootstrap_servers: str,
) -> dict[str, int]:
    """Per topic, the records in the lake's gaps (``spans``) that Kafka still holds and
    whose identity the lake holds: second copies the landing job dropped."""
    if not spans:
        return {}
    assign: dict[str, list[int]] = {}
    starting: dict[str, dict[str, int]] = {}
    ending: dict[str, dict[str, int]] = {}
    for (topic, partition), (low, high) in spans.items():
        assign.setdefault(topic, []).append(partition)
        starting.setdefault(topic, {})[str(partition)] = low
        ending.setdefault(topic, {})[str(partition)] = high + 1
    in_kafka = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap_servers)
        .option("assign", json.dumps(assign))
        .option("startingOffsets", json.dumps(starting))
        .option("endingOffsets", json.dumps(ending))
        .option("failOnDataLoss", "false")  # aged out: not in Kafka, stays missing
        .option("includeHeaders", "true")
        .load()
        .select("topic", "partition", "offset", identity_of(F.col("headers")).alias("id"))
    )
    landed = spark.read.schema(_IDENTITY_COLUMNS).parquet(lake)
    not_landed = in_kafka.join(
        landed.select("topic", "partition", "offset"),
        on=["topic", "partition", "offset"],
        how="left_anti",
    )
    identities = landed.select(F.col(IDENTITY_COLUMN).alias("id")).where(F.col("id").isNotNull())
    dropped = (
        not_landed.where(F.col("id").isNotNull())
        .join(identities.distinct(), on="id", how="left_semi")
        .groupBy("topic")
        .count()
    )
    return {row["topic"]: row["count"] for row in dropped.collect()}


def _copies_per_offset(spark: SparkSession, lake: str) -> DataFrame:
    """One row per landed (topic, partition, offset) with how many times it landed."""
    rows = spark.read.schema(AUDITED_COLUMNS).parquet(lake)
    return rows.groupBy("topic", "partition", "offset").agg(F.count("*").alias("copies"))


def _partition_landings(copies: DataFrame) -> list[PartitionLanding]:
    per_partition = copies.groupBy("topic", "partition").agg(
        F.sum("copies").alias("rows"),
        F.count("*").alias("distinct_offsets"),
        F.min("offset").alias("first_offset"),
        F.max("offset").alias("last_offset"),
    )
    return [
        PartitionLanding(
            topic=row["topic"],
            partition=row["partition"],
            rows=row["rows"],
            distinct_offsets=row["distinct_offsets"],
            first_offset=row["first_offset"],
            last_offset=row["last_offset"],
        )
        for row in per_partition.orderBy("topic", "partition").collect()
    ]


def _gaps_inside(copies: DataFrame, limit: int) -> list[OffsetGap]:
    """The first ``limit`` runs of offsets missing between landed ones."""
    in_partition = Window.partitionBy("topic", "partition").orderBy("offset")
    gaps = (
        copies.select("topic", "partition", "offset")
        .withColumn("previous", F.lag("offset").over(in_partition))
        .where(F.col("offset") - F.col("previous") > 1)
        .orderBy("topic", "partition", "offset")
        .limit(limit)
    )
    return [
        OffsetGap(row["topic"], row["partition"], row["previous"] + 1, row["offset"] - 1)
        for row in gaps.collect()
    ]


def _duplicated(copies: DataFrame, limit: int) -> list[DuplicateOffset]:
    """The first ``limit`` offsets that landed more than once."""
    repeated = (
        copies.where(F.col("copies") > 1).orderBy("topic", "partition", "offset").limit(limit)
    )
    return [
        DuplicateOffset(row["topic"], row["partition"], row["offset"], row["copies"])
        for row in repeated.collect()
    ]


# --- the books --------------------------------------------------------------------------------


def fetch_books(status_url: str, timeout_s: float = _HTTP_TIMEOUT_S) -> dict[str, Any]:
    """GET ``/books/json`` from a running daemon's status server (``STATUS_URL`` in any form
    ``pydory.status_client`` takes); raises :class:`BooksUnavailable`."""
    try:
        return StatusHttp(status_url, timeout_s).get_page("/books/json")
    except (StatusUrlError, DaemonUnreachable, NotAStatusPage) as error:
        raise BooksUnavailable(f"cannot read the daemon's books: {error}") from None


def load_books(*, status_url: str | None = None, books_file: str | None = None) -> DaemonBooks:
    """The daemon's books from its status server or from a saved ``/books/json`` file."""
    if books_file is not None:
        try:
            document = json.loads(Path(books_file).read_text(encoding="utf-8"))
        except OSError as error:
            raise BooksUnavailable(
                f"cannot read saved books {books_file}: {error.strerror}"
            ) from None
        except json.JSONDecodeError as error:
            raise BooksUnavailable(f"{books_file} is not JSON: {error}") from None
        return DaemonBooks.from_json(document)
    if status_url is None:
        raise ValueError("give status_url or books_file")
    return DaemonBooks.from_json(fetch_books(status_url))


# --- the job ----------------------------------------------------------------------------------


def audit(
    spark: SparkSession,
    lake: str | os.PathLike[str],
    books: DaemonBooks,
    *,
    topics: list[str] | None = None,
    from_offset_zero: bool = False,
    books_source: str = "",
    bootstrap_servers: str | None = None,
) -> AuditReport:
    """Reconcile the lake at ``lake`` with ``books``; see :func:`reconcile.reconcile`.

    ``bootstrap_servers`` (default: the landing job's, recorded in the lake): where to
    read the records of the lake's gaps, to tell dropped second copies from missing
    records (see the module docstring); with neither, every gap counts as missing."""
    summary = summarize_lake(spark, lake, from_offset_zero=from_offset_zero)
    servers = bootstrap_servers or recorded_bootstrap_servers(
        str(lake), lake_files(spark, str(lake))
    )
    dropped = {}
    if summary.gap_spans and servers:
        require_kafka(servers)  # a Kafka that does not answer is said, not waited on
        dropped = second_copies_in_gaps(spark, str(lake), summary.gap_spans, servers)
    return reconcile(
        books,
        summary.partitions,
        topics=topics,
        from_offset_zero=from_offset_zero,
        gaps=summary.gaps,
        duplicate_offsets=summary.duplicate_offsets,
        sources={"lake": str(lake), "books": books_source, "kafka": servers or ""},
        second_copies=dropped,
        gaps_checked=bool(servers),
    )
