"""A lake and its checkpoint: recorded, compared, refused when they diverge (no Spark).

The end-to-end runs with both connectors are in test_pipeline_land.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pydory.pipeline.lake_files import NeedsSpark
from pydory.pipeline.landing.lake_binding import (
    BINDING_FILE,
    LakeCheckpointMismatch,
    PairingKind,
    check_pairing,
    ensure_checkpoint_id,
    record_binding,
    record_landed_batch,
    seed_checkpoint,
)
from pydory.pipeline.source.offsets import PartitionId


def make_lake(path: Path, batches: int, compacted: int | None = None) -> str:
    """A lake whose sink log holds batches 0..batches-1 (``compacted`` as N.compact)."""
    log = path / "_spark_metadata"
    log.mkdir(parents=True)
    for batch in range(batches):
        name = f"{batch}.compact" if batch == compacted else str(batch)
        (log / name).write_text("v1\n")
        (log / f".{name}.crc").write_text("")  # Hadoop's checksum files are not batches
    return str(path)


def make_checkpoint(path: Path, planned: int, committed: int) -> str:
    """A checkpoint with an id, offsets 0..planned and commits 0..committed."""
    for directory, last in (("offsets", planned), ("commits", committed)):
        (path / directory).mkdir(parents=True)
        for batch in range(last + 1):
            (path / directory / str(batch)).write_text("v1\n")
    ensure_checkpoint_id(str(path))
    return str(path)


def test_a_new_lake_and_a_new_checkpoint_start_fresh(tmp_path: Path) -> None:
    pairing = check_pairing(str(tmp_path / "lake"), str(tmp_path / "cp"), None)

    assert pairing.kind is PairingKind.FRESH
    assert pairing.note is None


def test_a_new_checkpoint_on_a_landed_lake_is_refused_naming_the_lake_s_own(
    tmp_path: Path,
) -> None:
    lake = make_lake(tmp_path / "lake", batches=3)
    own = make_checkpoint(tmp_path / "own", planned=2, committed=2)
    record_binding(lake, own, ensure_checkpoint_id(own))
    record_landed_batch(lake, 2, {"events": {"0": 1653}})

    with pytest.raises(LakeCheckpointMismatch) as refusal:
        check_pairing(lake, str(tmp_path / "new"), None)

    message = str(refusal.value)
    assert "already holds batches 0 to 2" in message
    assert f"landed by checkpoint {tmp_path / 'own'}" in message
    assert 'up to batch 2, offsets {"events":{"0":1653}}' in message
    assert "--checkpoint" in message
    assert "--starting-offsets earliest|latest|JSON" in message
    assert "nothing lands twice" in message


def test_a_lake_landed_before_the_binding_existed_refuses_a_new_checkpoint(
    tmp_path: Path,
) -> None:
    lake = make_lake(tmp_path / "lake", batches=12, compacted=9)

    with pytest.raises(LakeCheckpointMismatch, match="already holds batches 0 to 11"):
        check_pairing(lake, str(tmp_path / "new"), None)


def test_chosen_starting_offsets_seed_a_new_checkpoint_after_the_lake_s_last_batch(
    tmp_path: Path,
) -> None:
    lake = make_lake(tmp_path / "lake", batches=3)
    checkpoint = str(tmp_path / "new")

    pairing = check_pairing(lake, checkpoint, "earliest")
    assert pairing.kind is PairingKind.SEED
    assert pairing.lake_batch == 2
    seed_checkpoint(checkpoint, pairing.lake_batch, {PartitionId("events", 0): 40})

    offsets = (tmp_path / "new" / "offsets" / "2").read_text().splitlines()
    assert offsets[0] == "v1"
    assert json.loads(offsets[1])["batchWatermarkMs"] == 0
    assert json.loads(offsets[2]) == {"events": {"0": 40}}
    assert (tmp_path / "new" / "commits" / "2").read_text().splitlines()[0] == "v1"
    # The seeded checkpoint now resumes the lake like its own.
    record_binding(lake, checkpoint, ensure_checkpoint_id(checkpoint))
    assert check_pairing(lake, checkpoint, None).kind is PairingKind.RESUME


def test_the_lake_s_own_checkpoint_resumes_and_ignores_starting_offsets(tmp_path: Path) -> None:
    lake = make_lake(tmp_path / "lake", batches=3)
    # The sink has committed batch 2; the checkpoint's commit of it was not written.
    own = make_checkpoint(tmp_path / "own", planned=2, committed=1)
    record_binding(lake, own, ensure_checkpoint_id(own))

    assert check_pairing(lake, own, None).kind is PairingKind.RESUME
    resumed = check_pairing(lake, own, "latest")
    assert resumed.kind is PairingKind.RESUME
    assert resumed.note is not None
    assert "--starting-offsets ignored" in resumed.note


def test_another_checkpoint_is_refused_even_when_its_batches_line_up(tmp_path: Path) -> None:
    lake = make_lake(tmp_path / "lake", batches=2)
    own = make_checkpoint(tmp_path / "own", planned=1, committed=1)
    record_binding(lake, own, ensure_checkpoint_id(own))
    other = make_checkpoint(tmp_path / "other", planned=1, committed=1)

    with pytest.raises(LakeCheckpointMismatch, match="belongs to another checkpoint"):
        check_pairing(lake, other, None)


@pytest.mark.parametrize(
    ("lake_batches", "planned", "committed", "problem"),
    [
        (0, 4, 4, "but the lake has none"),
        (2, 5, 5, "restored from an older copy"),
        (7, 4, 4, "another checkpoint landed them"),
    ],
)
def test_batch_numbers_that_diverge_are_refused(
    tmp_path: Path, lake_batches: int, planned: int, committed: int, problem: str
) -> None:
    lake = str(tmp_path / "lake")
    if lake_batches:
        make_lake(tmp_path / "lake", batches=lake_batches)
    checkpoint = make_checkpoint(tmp_path / "cp", planned=planned, committed=committed)

    with pytest.raises(LakeCheckpointMismatch, match=problem):
        check_pairing(lake, checkpoint, None)


def test_a_checkpoint_that_died_in_its_first_batch_resumes_an_empty_lake(tmp_path: Path) -> None:
    checkpoint = make_checkpoint(tmp_path / "cp", planned=0, committed=-1)

    assert check_pairing(str(tmp_path / "lake"), checkpoint, None).kind is PairingKind.RESUME


def test_the_binding_records_the_checkpoint_and_the_last_landed_batch(tmp_path: Path) -> None:
    lake = make_lake(tmp_path / "lake", batches=1)
    checkpoint = str(tmp_path / "cp")
    checkpoint_id = ensure_checkpoint_id(checkpoint)
    assert checkpoint_id == ensure_checkpoint_id(checkpoint)  # created once, then read

    record_binding(lake, checkpoint, checkpoint_id)
    record_landed_batch(lake, 0, {"events": {"0": 10}})
    record_binding(lake, checkpoint, checkpoint_id)  # a restart keeps what landed

    assert json.loads((tmp_path / "lake" / BINDING_FILE).read_text()) == {
        "checkpoint": str((tmp_path / "cp").resolve()),
        "checkpoint_id": checkpoint_id,
        "landed_batch": 0,
        "landed_offsets": {"events": {"0": 10}},
    }


def test_a_file_uri_is_compared_like_its_path_and_a_remote_one_needs_spark(
    tmp_path: Path,
) -> None:
    lake = make_lake(tmp_path / "lake", batches=3)
    new = tmp_path / "new"

    with pytest.raises(LakeCheckpointMismatch, match=r"already holds batches 0 to 2"):
        check_pairing(f"file://{lake}", f"file://{new}", None)
    # HDFS and S3 are compared through Spark's Hadoop client (tests/test_distributed.py).
    with pytest.raises(NeedsSpark, match="s3a://bucket/lake"):
        check_pairing("s3a://bucket/lake", str(tmp_path / "cp"), None)
