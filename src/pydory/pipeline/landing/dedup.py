"""Second copies dropped: the landing job lands each message once, by its identity.

Every message the daemon accepts carries its identity in the record header ``pydory-id``
(``<host>/<incarnation>/<stream>/<sequence>``, :mod:`pydory.message_identity`), and a
replay after a daemon crash resends a message under the same identity. The landing job
reads the headers (``includeHeaders``, both connectors), keeps the identity as the lake's
``pydory_id`` column (null for a record without the header: headers turned off, an older
daemon, another producer), and drops every row whose identity it has already landed
within the window, with Spark's own ``dropDuplicatesWithinWatermark``.

Why Spark's streaming deduplication, and not a state of sequence ranges per (host,
incarnation, stream) kept beside the lake: its state lives in the query's checkpoint,
versioned with each batch and committed with it, so a job killed at any moment resumes
with exactly the state of the batches the lake holds (the file sink and the state store
are Spark's exactly-once pair); nothing of ours has to be kept consistent with the lake,
and every record stays in the JVM (no Python per record on the native connector). The
price is state per message for the window, where ranges would cost almost nothing.

Where that state lives (issue 31): in RocksDB (:data:`STATE_STORE_CONF`, Spark's own
provider, no extra jar), with its memory capped (``boundedMemoryUsage``: block cache and
write buffers share :data:`STATE_MEMORY_MB`), not on the JVM heap. Spark's default
provider keeps every key of the window in heap maps, so a catch-up that lands a backlog
in one window (a job down for an hour, a first landing, a rebuilt lake) held the whole
backlog in memory, beside the batch itself: the driver's RSS grew with the backlog.
RocksDB keeps what does not fit on the local disk, so the state's memory stays within
the cap whatever the backlog (the checkpoint's changelog held 5,000,000 identities in
28 MB: BENCHMARKS.md, "Landing a backlog"). Changelog checkpointing makes each batch
upload only the keys it changed, not a snapshot. Ranges per (host, incarnation, stream)
would bound the state by the gaps, not the window, but cost Python per record
(``transformWithStateInPandas``) where this costs none. A checkpoint records its
provider and keeps it: checkpoints started before this keep Spark's default (heap)
provider; ``--conf spark.sql.streaming.stateStore.providerClass=...`` chooses another
for a new one. What still grows with a batch is the JVM's heap (shuffle and Parquet
buffers), up to its maximum: BENCHMARKS.md.

Why the watermark is the landing time (the batch's timestamp, ``current_timestamp()``),
not the Kafka timestamp: Spark drops a row older than the watermark as late, silently,
and the Kafka timestamp is the client's CreateTime, anything at all (a client's clock,
replayed messages of a host that was down for an hour). Landing time only grows, so no
row is ever late (unless the host's clock steps back by more than the window), and a
second copy is dropped when it lands within the window of its first: at least
``window_s`` after it, at most twice that (Spark evicts an identity once the watermark,
the latest landing time less the window, passes its first landing time plus the window).

Records without the header are never dropped: their key is their own (topic, partition,
offset, landing time), which no other row has (a topic deleted and recreated gives its
offsets again, but in a later batch).

Spark runs a batch without data whenever a watermark moves, to evict state; landing time
moves with every batch, so that would double the batches (and the lake's commits). They
are turned off (:data:`NO_DATA_BATCHES`): state is evicted in the next batch with data.

A checkpoint that landed batches before this stage existed has no state, and Spark
refuses to add a stateful operator to it (``STREAMING_STATEFUL_OPERATOR_MISSING_STATE_
DIRECTORY``): :func:`drops_second_copies` tells, and such a checkpoint lands as before.

Rule: how a second copy is recognised and dropped lives here alone (``drop_second_copies``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from pydory.message_identity import HEADER_NAME
from pydory.pipeline.lake_files import LakeFiles, join, lake_files

__all__ = [
    "DEFAULT_WINDOW_S",
    "IDENTITY_COLUMN",
    "LANDED_METRICS",
    "NO_DATA_BATCHES",
    "READ_METRICS",
    "SESSION_CONF",
    "STATE_MEMORY_MB",
    "STATE_STORE_CONF",
    "drop_second_copies",
    "dropped_per_topic",
    "drops_second_copies",
    "identity_of",
    "observe_topics",
]

#: The lake's column holding each record's identity (null without the header).
IDENTITY_COLUMN = "pydory_id"
#: How long after its first copy a second one is still dropped. It must cover a daemon
#: restart's replay: a message in flight at the crash was sent at most message.timeout.ms
#: before it (linger + 30 s by default, more with reroutes), then the daemon is down, then
#: it replays. Ten minutes leaves room for a restart of several minutes.
DEFAULT_WINDOW_S = 600.0
#: Observed metrics of each batch: rows per topic read from Kafka, and landed.
READ_METRICS = "pydory_read"
LANDED_METRICS = "pydory_landed"

#: Spark's setting for batches without data; off for the landing query (see above).
NO_DATA_BATCHES = "spark.sql.streaming.noDataMicroBatches.enabled"

#: RocksDB's memory for the landing's state (block cache and write buffers together).
STATE_MEMORY_MB = 128
#: The state store of a new landing checkpoint (see above); ``--conf`` overrides each.
STATE_STORE_CONF = {
    "spark.sql.streaming.stateStore.providerClass": (
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
    ),
    "spark.sql.streaming.stateStore.rocksdb.boundedMemoryUsage": "true",
    "spark.sql.streaming.stateStore.rocksdb.maxMemoryUsageMB": str(STATE_MEMORY_MB),
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
}

#: Settings of the landing's session, fixed when its JVM starts (``--conf`` overrides).
#: Dropping second copies shuffles every row of a batch by identity, and Spark sorts the
#: shuffle in pages on the heap, up to ``spark.memory.fraction`` of it (0.6 by default),
#: before it spills: with a backlog in one batch that filled the default 1 GB heap, and the
#: driver's RSS passed 1.3 GB. A third of it spills sooner, at no measured cost in CPU
#: (BENCHMARKS.md, "Landing a backlog").
SESSION_CONF = {"spark.memory.fraction": "0.3"}

_LANDED_AT = "_pydory_landed_at"
_NO_IDENTITY = "_pydory_no_identity"


def identity_of(headers: Column) -> Column:
    """A record's ``pydory-id`` header value as text; null when it has none."""
    named = F.filter(headers, lambda header: header["key"] == F.lit(HEADER_NAME))
    return F.try_element_at(named, F.lit(1))["value"].cast("string")


def drop_second_copies(rows: DataFrame, window_s: float) -> DataFrame:
    """``rows`` without a row whose identity landed within ``window_s`` before it.

    A row without an identity is keyed by its (topic, partition, offset, landing time),
    so it is never dropped. The key columns, the landing time and the state stay out of
    the result. Start the query with :data:`NO_DATA_BATCHES` false.
    """
    identity = F.col(IDENTITY_COLUMN)
    unnamed = F.when(identity.isNull(), F.struct("topic", "partition", "offset", _LANDED_AT))
    return (
        rows.withColumn(_LANDED_AT, F.current_timestamp())
        .withWatermark(_LANDED_AT, f"{round(window_s * 1000)} milliseconds")
        .withColumn(_NO_IDENTITY, unnamed)
        .dropDuplicatesWithinWatermark([IDENTITY_COLUMN, _NO_IDENTITY])
        .drop(_LANDED_AT, _NO_IDENTITY)
    )


def observe_topics(rows: DataFrame, name: str, topics: Sequence[str]) -> DataFrame:
    """``rows``, counting each batch's rows per topic as Spark's observed metric ``name``."""
    counts = [F.count_if(F.col("topic") == topic).alias(f"t{i}") for i, topic in enumerate(topics)]
    return rows.observe(name, *counts)


def dropped_per_topic(observed: Mapping[str, Any], topics: Sequence[str]) -> dict[str, int]:
    """Per topic, the rows of one batch read but not landed (from its observed metrics)."""
    read, landed = observed.get(READ_METRICS), observed.get(LANDED_METRICS)
    if read is None or landed is None:
        return {}
    dropped = {topic: read[f"t{i}"] - landed[f"t{i}"] for i, topic in enumerate(topics)}
    return {topic: count for topic, count in dropped.items() if count}


def drops_second_copies(checkpoint: str, files: LakeFiles | None = None) -> bool:
    """Whether a query on ``checkpoint`` can drop second copies (has, or may start, state).

    False for a checkpoint that has committed batches and no state: it was landed before
    this stage existed. ``files`` reaches a checkpoint on HDFS or S3 (local when None).
    """
    files = files or lake_files(None, checkpoint)
    committed = any(name.isdigit() for name in files.names(join(checkpoint, "commits")))
    return not committed or files.is_dir(join(checkpoint, "state"))
