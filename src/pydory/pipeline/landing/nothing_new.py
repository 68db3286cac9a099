"""Whether a one-shot landing has anything to land, told before Spark starts.

Spark's fixed cost (a JVM, a session, and a first batch that plans, shuffles and commits
even when it holds no record) is paid by every ``--available-now`` run, ~20 CPU-s here,
and most of it when a scheduled run finds the topics as it left them (BENCHMARKS.md,
"Start-up of a one-shot landing"). This asks the brokers for their offsets, as the query
would, and compares them with what the checkpoint last committed: when nothing is new,
the run ends there, without a JVM.

Nothing is new only when that is certain from the checkpoint alone: a checkpoint whose
last planned batch is committed, with an end offset for exactly the partitions the
topics have now, each equal to the partition's latest offset (a partition that went
backwards or is new is for Spark to land or report); or a new checkpoint starting from
the earliest offsets on topics whose every partition is empty. Anything else, including
a broker that does not answer and an offset log in another form, runs Spark as before.

Where the checkpoint is read decides what is saved. A local one (a path or ``file:`` URI)
is read with the operating system's calls before a JVM starts: the whole fixed cost is
saved. One on HDFS or S3 is read through Spark's Hadoop client (the file systems speak
their own protocols, which only the JVM's client does), so the job asks once its session
runs: that saves the query, its planning and its empty first batch, not the JVM and the
session (docs/pipeline.md, "One-shot runs").

Rule: when a one-shot run may skip Spark lives here alone (``nothing_to_land``).
"""

from __future__ import annotations

import json
from typing import Any

from confluent_kafka import KafkaException

from pydory.pipeline.errors import KafkaReadError
from pydory.pipeline.lake_files import LakeFiles, LocalFiles, join
from pydory.pipeline.source.broker_offsets import BrokerOffsets
from pydory.pipeline.source.offsets import PartitionId, Watermarks

__all__ = ["nothing_to_land"]

# Bounds each request to the brokers; a slower answer runs Spark, which says more.
_BROKER_TIMEOUT_S = 10.0


def nothing_to_land(
    bootstrap_servers: str,
    topics: tuple[str, ...],
    checkpoint: str,
    starting_offsets: str | None,
    files: LakeFiles | None = None,
) -> bool:
    """True when ``checkpoint`` (read through ``files``, by default the local file system)
    has landed every offset ``topics`` hold now."""
    committed = _committed_end(checkpoint, files or LocalFiles())
    if committed is None and starting_offsets not in (None, "earliest"):
        return False
    try:
        brokers = BrokerOffsets(
            {"bootstrap.servers": bootstrap_servers, "group.id": "pydory-land"},
            _BROKER_TIMEOUT_S,
        )
    except KafkaException:  # a configuration librdkafka refuses: Spark will say what is wrong
        return False
    try:
        available = brokers.available(topics)
    except KafkaReadError:
        return False
    finally:
        brokers.close()
    return landed_all(committed, available)


def landed_all(
    committed: dict[PartitionId, int] | None, available: dict[PartitionId, Watermarks]
) -> bool:
    """Whether ``committed`` (None: a new checkpoint) leaves nothing of ``available``."""
    if not available:
        return False  # no partition yet: Spark's source knows how to wait for one
    if committed is None:
        return all(marks.latest == marks.earliest for marks in available.values())
    return committed.keys() == available.keys() and all(
        committed[partition_id] == marks.latest for partition_id, marks in available.items()
    )


def _committed_end(checkpoint: str, files: LakeFiles) -> dict[PartitionId, int] | None:
    """The end offsets of the checkpoint's last batch, None for a new checkpoint.

    Raises only what ``files`` raises listing the offset log (``OSError``: the file system
    does not answer, for the job to name); a checkpoint this cannot read as committed
    gives ``{}``, which no topic matches.
    """
    offsets = join(checkpoint, "offsets")
    batches = [int(name) for name in files.names(offsets) if name.isdigit()]
    if not batches:
        return None
    last = max(batches)
    try:
        if files.read_text(join(checkpoint, "commits", str(last))) is None:
            return {}  # planned, not committed: Spark finishes it
        lines = (files.read_text(join(offsets, str(last))) or "").splitlines()
        ends: Any = json.loads(lines[2]) if len(lines) == 3 else {}
        return {
            PartitionId(topic, int(number)): int(offset)
            for topic, partitions in ends.items()
            for number, offset in partitions.items()
        }
    except (OSError, ValueError, TypeError, AttributeError):
        return {}
