"""A one-shot landing ends before Spark only when the checkpoint holds every offset."""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path

import pytest
from pyspark import SparkContext

from pydory.pipeline.lake_files import LocalFiles
from pydory.pipeline.landing.land import LandSettings, run_landing
from pydory.pipeline.landing.nothing_new import _committed_end, landed_all, nothing_to_land
from pydory.pipeline.source.offsets import PartitionId, Watermarks
from pydory_tools.testing.kafka_broker import KafkaCluster

P0, P1 = PartitionId("t", 0), PartitionId("t", 1)
METADATA = '{"batchWatermarkMs":0,"batchTimestampMs":1,"conf":{}}'


def checkpoint(root: Path, batches: dict[int, str], committed: set[int]) -> Path:
    """A checkpoint laid out as Spark writes one: offsets/N (3 lines), commits/N."""
    (root / "offsets").mkdir(parents=True)
    (root / "commits").mkdir()
    for batch, ends in batches.items():
        (root / "offsets" / str(batch)).write_text(f"v1\n{METADATA}\n{ends}")
        (root / "offsets" / f".{batch}.crc").write_text("")
    for batch in committed:
        (root / "commits" / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}')
    return root


def test_a_checkpoint_that_committed_every_latest_offset_has_nothing_to_land() -> None:
    committed = {P0: 5, P1: 7}
    assert landed_all(committed, {P0: Watermarks(0, 5), P1: Watermarks(3, 7)})
    # A record more, a new partition, a partition that went backwards: Spark runs.
    assert not landed_all(committed, {P0: Watermarks(0, 6), P1: Watermarks(3, 7)})
    assert not landed_all(
        committed,
        {P0: Watermarks(0, 5), P1: Watermarks(3, 7), PartitionId("t", 2): Watermarks(0, 0)},
    )
    assert not landed_all(committed, {P0: Watermarks(0, 4), P1: Watermarks(3, 7)})
    assert not landed_all(committed, {})  # the topic does not exist (yet)


def test_a_new_checkpoint_has_nothing_to_land_only_on_empty_partitions() -> None:
    assert landed_all(None, {P0: Watermarks(0, 0), P1: Watermarks(9, 9)})
    assert not landed_all(None, {P0: Watermarks(0, 0), P1: Watermarks(8, 9)})


def committed_end(path: Path | str) -> dict[PartitionId, int] | None:
    return _committed_end(str(path), LocalFiles())


def test_the_last_batch_is_read_only_when_committed(tmp_path: Path) -> None:
    ends = '{"t":{"0":5,"1":7}}'
    done = checkpoint(tmp_path / "done", {0: '{"t":{"0":1,"1":1}}', 1: ends}, {0, 1})
    assert committed_end(done) == {P0: 5, P1: 7}
    # A file: URI names the same checkpoint (it was once taken for a new one).
    assert committed_end(f"file://{done}") == {P0: 5, P1: 7}
    planned = checkpoint(tmp_path / "planned", {0: ends, 1: '{"t":{"0":9,"1":9}}'}, {0})
    assert committed_end(planned) == {}  # matches no topic: Spark finishes batch 1
    other_form = checkpoint(tmp_path / "other", {0: '["not", "offsets"]'}, {0})
    assert committed_end(other_form) == {}
    (other_form / "commits" / "0").unlink()
    (other_form / "commits" / "0").mkdir()  # not a file: read as not committed
    assert committed_end(other_form) == {}
    assert committed_end(tmp_path / "new") is None


def test_a_new_checkpoint_starting_elsewhere_than_earliest_always_runs_spark(
    tmp_path: Path,
) -> None:
    # Decided before any broker is asked (none listens at this address).
    assert not nothing_to_land("127.0.0.1:9", ("t",), str(tmp_path / "new"), "latest")


@pytest.mark.kafka
def test_a_one_shot_run_on_empty_partitions_ends_before_spark_starts(
    kafka_broker: KafkaCluster, unique_topic: Callable[[str], str], tmp_path: Path
) -> None:
    topic = unique_topic("empty")
    kafka_broker.create_topic(topic, 2)
    session_before = SparkContext._active_spark_context
    out = io.StringIO()
    settings = LandSettings(
        bootstrap_servers=kafka_broker.bootstrap_servers,
        topics=(topic,),
        lake=f"file://{tmp_path}/lake",  # a file: URI is a local pair too
        checkpoint=str(tmp_path / "checkpoint"),
        available_now=True,
    )

    assert run_landing(settings, out) == 0, out.getvalue()

    assert "nothing new to land: the checkpoint holds every offset; Spark not started" in (
        out.getvalue()
    )
    assert SparkContext._active_spark_context is session_before
    assert not (tmp_path / "lake").exists()
    assert not (tmp_path / "checkpoint").exists()
