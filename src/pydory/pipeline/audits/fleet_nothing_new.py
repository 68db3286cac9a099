"""Whether an incremental fleet audit has anything new to read, told before Spark starts.

A run with ``--state`` reads only the books records published and the lake files committed
since its state; when there are none it still paid Spark's fixed cost (a JVM, a session,
a batch read of the books topic and a listing of the lake) to find that out. This asks
the brokers for the books topic's offsets and lists the lake's files with the operating
system's calls: when nothing is new, the report is the state's, and no JVM starts.

Nothing is new only when that is certain: every partition of the books topic ends where
the state's next offset for it is (a partition the state never read: holds nothing), and
no file of the lake is younger than the state's mark (its modification time in
milliseconds, as Spark's local file system gives it, later than the mark, or at the mark
and not among the files read there). Files Spark would not read (a batch in flight,
leftovers of one that failed) are counted too: they only make the run read with Spark,
which tells them apart through the commit log. Anything else, including a broker that
does not answer, a state not yet written and a lake or state off this machine's file
system (HDFS, S3: only Spark's JVM speaks to them), reads with Spark as before.

Rule: when a fleet audit may skip Spark lives here alone (``nothing_to_audit``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Protocol
from urllib.parse import unquote, urlparse

from confluent_kafka import KafkaException

from pydory.pipeline.errors import KafkaReadError
from pydory.pipeline.source.broker_offsets import BrokerOffsets

__all__ = ["nothing_to_audit"]

# Bounds each request to the brokers; a slower answer reads with Spark, which says more.
_BROKER_TIMEOUT_S = 10.0


class _ReadThrough(Protocol):
    """What of the fleet audit's state this reads (``fleet_audit.FleetState``)."""

    lake: str
    books_topic: str
    read_through_us: int
    files_at_mark: set[str]
    books_offsets: dict[int, int]


def nothing_to_audit(state: _ReadThrough, kafka: Mapping[str, object]) -> bool:
    """True when neither the books topic nor the local lake of ``state`` holds anything
    the state has not read; ``kafka``: the librdkafka settings to ask the brokers with."""
    if state.read_through_us < 0:
        return False  # no lake file read yet
    return _no_new_books(state, kafka) and _no_new_files(state)


def _no_new_books(state: _ReadThrough, kafka: Mapping[str, object]) -> bool:
    try:
        brokers = BrokerOffsets(
            {**kafka, "group.id": "pydory-fleet-audit", "allow.auto.create.topics": False},
            _BROKER_TIMEOUT_S,
        )
    except KafkaException:  # a configuration librdkafka refuses: Spark's read says more
        return False
    try:
        available = brokers.available([state.books_topic])
    except KafkaReadError:
        return False
    finally:
        brokers.close()
    if not available:
        return False  # no such topic: the read with Spark names it
    return all(
        marks.latest == state.books_offsets.get(partition.partition, marks.earliest)
        for partition, marks in available.items()
    )


def _no_new_files(state: _ReadThrough) -> bool:
    read_at_mark = {_name(path) for path in state.files_at_mark}
    for path, modified_us in _data_files(Path(state.lake)):
        if modified_us > state.read_through_us:
            return False
        if modified_us == state.read_through_us and path.name not in read_at_mark:
            return False
    return True


def _data_files(lake: Path) -> Iterator[tuple[Path, int]]:
    """Every file under ``lake`` Spark would list as data (none under a name starting
    with ``_`` or ``.``: the commit log, checksums), with its modification time in
    epoch microseconds at millisecond precision (Hadoop's local file system's)."""
    for directory, subdirectories, names in os.walk(lake):
        subdirectories[:] = [name for name in subdirectories if not name.startswith(("_", "."))]
        for name in names:
            if not name.startswith(("_", ".")):
                path = Path(directory, name)
                yield path, path.stat().st_mtime_ns // 1_000_000 * 1_000


def _name(path: str) -> str:
    """A read file's name, from the path or URI Spark gave for it."""
    return unquote(urlparse(path).path).rsplit("/", 1)[-1]
