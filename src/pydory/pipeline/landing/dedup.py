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

A new checkpoint that continues a lake (``--starting-offsets`` on a lake that has batches,
:mod:`pydory.pipeline.landing.lake_binding`) starts with batches committed and so would
have no state either, and the identities the lake holds are in the old checkpoint's
state, not in it. So its seeding (:func:`seed_state`) gives it an empty RocksDB snapshot
at the version its first batch loads (one per shuffle partition: a snapshot whose
metadata lists no files, which RocksDB opens as an empty database) and a record of when
it was seeded (:data:`SEED_FILE`); from then on Spark keeps its state as for any other.
What the lake held before the seed is then dropped by :func:`drop_lake_copies`: every
run of such a checkpoint drops the rows whose identity is in a lake file written
(the file's modification time, the file system's clock) within the window before the
run started and before the seed. Bounded by the window as the state is: the identities
landed within one window before the seed, read by every batch of a run that starts
within a window of the seed, none after that. Only with the RocksDB provider (the
default); a checkpoint seeded with another lands without dropping second copies, as
one that predates them.

Rule: how a second copy is recognised and dropped lives here alone (``drop_second_copies``).
"""

from __future__ import annotations

import io
import json
import time
import zipfile
from collections.abc import Mapping, Sequence
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from pydory.message_identity import HEADER_NAME
from pydory.pipeline.lake_files import LakeFiles, join, lake_files

__all__ = [
    "DEFAULT_WINDOW_S",
    "IDENTITY_COLUMN",
    "LANDED_METRICS",
    "NO_DATA_BATCHES",
    "READ_METRICS",
    "SEED_FILE",
    "SESSION_CONF",
    "STATE_MEMORY_MB",
    "STATE_STORE_CONF",
    "drop_lake_copies",
    "drop_second_copies",
    "dropped_per_topic",
    "drops_second_copies",
    "identity_of",
    "observe_topics",
    "prepare_session",
    "seed_state",
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

#: In the root of a checkpoint seeded to continue a lake: when, after which lake batch.
SEED_FILE = "pydory_seed.json"
_PROVIDER = "spark.sql.streaming.stateStore.providerClass"
_SHUFFLE_PARTITIONS = "spark.sql.shuffle.partitions"
# File modification times are the file system's clock, the run's start the driver's.
_CLOCK_MARGIN_S = 60.0

_LANDED_AT = "_pydory_landed_at"
_LAKE_IDENTITY = "_pydory_lake_id"
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


def prepare_session(spark: SparkSession, overrides: Mapping[str, str]) -> None:
    """Set ``spark`` up for a query that drops second copies: no batches without data, and
    the state store of :data:`STATE_STORE_CONF` (each unless ``overrides`` names it)."""
    spark.conf.set(NO_DATA_BATCHES, "false")
    for key, value in STATE_STORE_CONF.items():
        if key not in overrides:
            spark.conf.set(key, value)


def seed_state(checkpoint: str, lake_batch: int, conf: Mapping[str, str], files: LakeFiles) -> bool:
    """Give a checkpoint seeded after ``lake_batch`` an empty state for its first batch.

    ``conf``: the settings the seed records for the checkpoint (its state store provider
    and shuffle partitions). Returns False, writing nothing, when the provider is not
    RocksDB: the checkpoint then lands without dropping second copies.
    """
    if conf.get(_PROVIDER) != STATE_STORE_CONF[_PROVIDER]:
        return False
    snapshot = _empty_rocksdb_snapshot()
    # Operator 0 (the only stateful one); its first batch loads version lake_batch + 1.
    for partition in range(int(conf[_SHUFFLE_PARTITIONS])):
        path = join(checkpoint, "state", "0", str(partition), f"{lake_batch + 1}.zip")
        files.write_bytes(path, snapshot)
    seed = {"lake_batch": lake_batch, "seeded_at_ms": round(time.time() * 1000)}
    files.write_text(join(checkpoint, SEED_FILE), json.dumps(seed))
    return True


def _empty_rocksdb_snapshot() -> bytes:
    """A RocksDB state snapshot holding nothing: its metadata alone, listing no files."""
    data = io.BytesIO()
    with zipfile.ZipFile(data, "w") as snapshot:
        snapshot.writestr("metadata", 'v1\n{"sstFiles":[],"logFiles":[],"numKeys":0}')
    return data.getvalue()


def drop_lake_copies(
    rows: DataFrame,
    spark: SparkSession,
    lake: str,
    checkpoint: str,
    window_s: float,
    files: LakeFiles,
) -> DataFrame:
    """``rows`` without a row whose identity the lake held when ``checkpoint`` was seeded,
    in a file written within ``window_s`` before now; ``rows`` itself when it was not.

    The lake is read as Spark lists it when the query starts (a stream-static join): a
    batch's own rows and those of this run's earlier batches are dropped by the state.
    """
    text = files.read_text(join(checkpoint, SEED_FILE))
    if text is None:
        return rows
    seeded_s = json.loads(text)["seeded_at_ms"] / 1000
    since_s = time.time() - window_s - _CLOCK_MARGIN_S
    until_s = seeded_s + _CLOCK_MARGIN_S
    modified = F.col("_metadata.file_modification_time")
    # The column named, not inferred from one file: a file landed before the lake had
    # identities has none (null here), and may be the one Spark would infer from.
    landed = (
        spark.read.schema(f"{IDENTITY_COLUMN} string")
        .parquet(lake)
        .where(modified.between(_timestamp(since_s), _timestamp(until_s)))
        .where(F.col(IDENTITY_COLUMN).isNotNull())
        .select(F.col(IDENTITY_COLUMN).alias(_LAKE_IDENTITY))
    )
    # A condition, not a column name: a join on a name would move the column first.
    held = F.col(IDENTITY_COLUMN) == F.col(_LAKE_IDENTITY)
    return rows.join(landed, held, "left_anti")


def _timestamp(seconds: float) -> Column:
    return F.timestamp_micros(F.lit(round(seconds * 1_000_000)))


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
