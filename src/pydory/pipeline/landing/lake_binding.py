"""Which checkpoint a lake belongs to: recorded in the lake, checked before every landing.

Spark's file sink skips every batch whose number its commit log (``LAKE/_spark_metadata``)
already holds, and a new checkpoint numbers its batches from 0 again. So a new checkpoint
on a lake that already has batches 0..N lands nothing until batch N+1, and its offsets
move on all the same: the records of those batches are never landed, silently. A
checkpoint whose lake was deleted or restored from an older copy diverges the same way.

So the landing job records in the lake which checkpoint it belongs to
(``LAKE/_pydory_landing.json``: the checkpoint's path and Spark's id for it, from
``CHECKPOINT/metadata``, and the last batch landed with its end offsets), and before
starting compares the pair: the checkpoint's id with the lake's record, and the batch
numbers of the checkpoint's offset and commit logs with the lake's. A mismatched pair is
refused with what to do. A new checkpoint may join a lake only with explicit starting
offsets: it is then *seeded*, its offset and commit logs given the lake's last batch
number and, per partition, the later of the chosen offset and the lake's next one, so
its first batch is numbered after the lake's and nothing already landed lands again.

File-system logic, no Spark job: local paths through the operating system, ``hdfs://``,
``s3a://`` and other URIs through Spark's Hadoop client (:mod:`pydory.pipeline.lake_files`;
each function takes the :class:`~pydory.pipeline.lake_files.LakeFiles` to use, local ones
when none is given).

Rule: the lake and its checkpoint are compared here (`check_pairing`) before any batch
runs, and only here.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from pydory.pipeline.errors import PipelineError
from pydory.pipeline.lake_files import LakeFiles, join, lake_files
from pydory.pipeline.source.offsets import Offsets, offsets_to_json

__all__ = [
    "BINDING_FILE",
    "LakeCheckpointMismatch",
    "Pairing",
    "PairingKind",
    "check_pairing",
    "ensure_checkpoint_id",
    "record_binding",
    "record_landed_batch",
    "recorded_bootstrap_servers",
    "seed_checkpoint",
]

#: In the lake's root; a leading underscore keeps it out of Spark's file listings.
BINDING_FILE = "_pydory_landing.json"

_BATCH_FILE = re.compile(r"^(\d+)(\.compact)?$")
# Spark reads offset and commit log entries of this version.
_LOG_VERSION = "v1"


class LakeCheckpointMismatch(PipelineError):
    """The lake and the checkpoint do not belong together; the message says what to do."""


class PairingKind(Enum):
    """What a landing run does with its lake and checkpoint."""

    FRESH = "a new lake and a new checkpoint"
    RESUME = "the checkpoint resumes its lake"
    SEED = "a new checkpoint joins the lake at the chosen offsets"


@dataclass(frozen=True)
class Pairing:
    """The verdict on a lake and a checkpoint (see :func:`check_pairing`)."""

    kind: PairingKind
    #: The lake's last committed batch (-1: none); a seeded checkpoint continues after it.
    lake_batch: int
    #: A note for the operator (e.g. starting offsets ignored when resuming), or None.
    note: str | None = None


@dataclass(frozen=True)
class _CheckpointState:
    checkpoint_id: str | None
    last_planned: int  # the offset log's last batch, -1 when none
    last_committed: int  # the commit log's last batch, -1 when none


def check_pairing(
    lake: str, checkpoint: str, starting_offsets: str | None, files: LakeFiles | None = None
) -> Pairing:
    """Compare ``lake`` with ``checkpoint``; raise :class:`LakeCheckpointMismatch` if they
    diverge. ``starting_offsets`` is the operator's explicit choice, if any. A file that
    cannot be read raises ``OSError``."""
    files = files or lake_files(None, lake, checkpoint)
    lake_batch = _last_batch(files, join(lake, "_spark_metadata"))
    state = _checkpoint_state(files, checkpoint)
    if state.last_planned < 0:
        return _new_checkpoint(files, lake, checkpoint, lake_batch, starting_offsets)
    _check_resumes(files, lake, checkpoint, lake_batch, state)
    note = None
    if starting_offsets is not None:
        note = (
            f"--starting-offsets ignored: the checkpoint {checkpoint} resumes where it stopped "
            "(starting offsets apply to a new checkpoint only)"
        )
    return Pairing(PairingKind.RESUME, lake_batch, note=note)


def ensure_checkpoint_id(checkpoint: str, files: LakeFiles | None = None) -> str:
    """Spark's id of ``checkpoint`` (``CHECKPOINT/metadata``), created if it is new.

    Spark reads an existing id when the query starts; creating it first lets the lake
    record its checkpoint before the first batch can land.
    """
    files = files or lake_files(None, checkpoint)
    existing = _checkpoint_id(files, checkpoint)
    if existing is not None:
        return existing
    new_id = str(uuid.uuid4())
    files.write_text(join(checkpoint, "metadata"), json.dumps({"id": new_id}))
    return new_id


def record_binding(
    lake: str,
    checkpoint: str,
    checkpoint_id: str,
    files: LakeFiles | None = None,
    bootstrap_servers: str | None = None,
) -> None:
    """Record in ``lake`` that it belongs to ``checkpoint`` (its landed offsets kept when
    the checkpoint is the same), and the Kafka it lands from (the audit reads its gaps)."""
    files = files or lake_files(None, lake, checkpoint)
    previous = _read_binding(files, lake) or {}
    same = previous.get("checkpoint_id") == checkpoint_id
    binding = {
        "checkpoint": files.qualify(checkpoint),
        "checkpoint_id": checkpoint_id,
        "landed_batch": previous.get("landed_batch") if same else None,
        "landed_offsets": previous.get("landed_offsets") if same else None,
    }
    servers = bootstrap_servers or previous.get("bootstrap_servers")
    if servers:  # where the audit reads a gap's records (none given: none recorded)
        binding["bootstrap_servers"] = servers
    _write_binding(files, lake, binding)


def recorded_bootstrap_servers(lake: str, files: LakeFiles | None = None) -> str | None:
    """The Kafka bootstrap servers the landing job last recorded in ``lake``, if any."""
    files = files or lake_files(None, lake)
    try:
        binding = _read_binding(files, lake) or {}
    except LakeCheckpointMismatch:  # unreadable: the audit then has no default
        return None
    servers = binding.get("bootstrap_servers")
    return servers if isinstance(servers, str) and servers else None


def record_landed_batch(
    lake: str, batch: int, end_offsets: Mapping[str, Any] | None, files: LakeFiles | None = None
) -> None:
    """After a batch landed: its number and end offsets, for the operator to read."""
    files = files or lake_files(None, lake)
    binding = _read_binding(files, lake)
    if binding is None:
        return
    binding["landed_batch"] = batch
    binding["landed_offsets"] = end_offsets
    _write_binding(files, lake, binding)


def seed_checkpoint(
    checkpoint: str,
    lake_batch: int,
    start: Offsets,
    files: LakeFiles | None = None,
    conf: Mapping[str, str] | None = None,
) -> None:
    """Make the new ``checkpoint`` continue the lake: batch ``lake_batch`` planned and
    committed with end offsets ``start``, so its first batch is ``lake_batch + 1``.

    ``conf``: the session settings Spark records with a batch and keeps for the
    checkpoint's life (its shuffle partitions, state store provider...); Spark's own
    defaults for a checkpoint that lacks them when None.
    """
    files = files or lake_files(None, checkpoint)
    metadata = {"batchWatermarkMs": 0, "batchTimestampMs": 0, "conf": dict(conf or {})}
    offsets = json.dumps(offsets_to_json(start), separators=(",", ":"))
    files.write_text(
        join(checkpoint, "offsets", str(lake_batch)),
        f"{_LOG_VERSION}\n{json.dumps(metadata, separators=(',', ':'))}\n{offsets}",
    )
    files.write_text(
        join(checkpoint, "commits", str(lake_batch)),
        f'{_LOG_VERSION}\n{{"nextBatchWatermarkMs":0}}',
    )


# --- the verdicts --------------------------------------------------------------------------


def _new_checkpoint(
    files: LakeFiles, lake: str, checkpoint: str, lake_batch: int, starting_offsets: str | None
) -> Pairing:
    if lake_batch < 0:
        return Pairing(PairingKind.FRESH, lake_batch)
    if starting_offsets is not None:
        return Pairing(PairingKind.SEED, lake_batch)
    raise LakeCheckpointMismatch(
        f"the lake {lake} already holds {_batches_up_to(lake_batch)}{_owner(files, lake)}, "
        f"and the checkpoint {checkpoint} is new. A new checkpoint numbers its batches "
        "from 0 again and Spark's file sink skips every batch number the lake already has: "
        "those records would never land. To proceed, either\n"
        f"{_RESUME_OWN}\n{_CHOOSE_OFFSETS}"
    )


_RESUME_OWN = "  - resume with the lake's own checkpoint (--checkpoint DIR), or"
_CHOOSE_OFFSETS = (
    "  - start a new, empty checkpoint with --starting-offsets earliest|latest|JSON: records "
    "the lake already holds (up to its highest offset in each partition) are skipped, so "
    "nothing lands twice"
)


def _check_resumes(
    files: LakeFiles, lake: str, checkpoint: str, lake_batch: int, state: _CheckpointState
) -> None:
    binding = _read_binding(files, lake)
    owner_id = None if binding is None else binding.get("checkpoint_id")
    if owner_id is not None and owner_id != state.checkpoint_id:
        raise LakeCheckpointMismatch(
            f"the lake {lake} belongs to another checkpoint{_owner(files, lake)}, not to "
            f"{checkpoint} (id {state.checkpoint_id}). To proceed, either\n"
            f"{_RESUME_OWN}\n  - land into a new lake with this checkpoint, or\n{_CHOOSE_OFFSETS}"
        )
    # The sink commits a batch before the checkpoint's commit log records it: the lake's
    # last batch is the checkpoint's last committed one, or the one planned after it.
    if state.last_committed <= lake_batch <= state.last_planned:
        return
    if lake_batch < 0:
        problem = (
            f"the checkpoint has landed batches up to {state.last_committed}, but the lake "
            "has none (was it deleted or moved?). To land everything again, delete the "
            "checkpoint too, or use a new one"
        )
    elif lake_batch < state.last_committed:
        problem = (
            f"the lake's last batch is {lake_batch} but the checkpoint has landed up to "
            f"{state.last_committed} (was the lake restored from an older copy?): batches "
            f"{lake_batch + 1} to {state.last_committed} would be missing. To proceed, "
            f"either\n  - land into a new lake with a new checkpoint, or\n{_CHOOSE_OFFSETS}"
        )
    else:
        problem = (
            f"the lake has batches up to {lake_batch}, beyond the checkpoint's last planned "
            f"batch {state.last_planned}: another checkpoint landed them. To proceed, "
            f"either\n{_RESUME_OWN}\n{_CHOOSE_OFFSETS}"
        )
    raise LakeCheckpointMismatch(
        f"the lake {lake} and the checkpoint {checkpoint} diverge: {problem}"
    )


def _batches_up_to(last: int) -> str:
    return "batch 0" if last == 0 else f"batches 0 to {last}"


def _owner(files: LakeFiles, lake: str) -> str:
    """``" (landed by checkpoint ...)"`` from the lake's record, or nothing."""
    binding = _read_binding(files, lake)
    if binding is None:
        return ""
    landed = ""
    if binding.get("landed_offsets") is not None:
        offsets = json.dumps(binding["landed_offsets"], separators=(",", ":"))
        landed = f", up to batch {binding.get('landed_batch')}, offsets {offsets}"
    return f" (landed by checkpoint {binding.get('checkpoint')}{landed})"


# --- reading and writing -------------------------------------------------------------------


def _last_batch(files: LakeFiles, log_dir: str) -> int:
    """The highest batch number in a Spark metadata log directory (-1 when none)."""
    numbers = [
        int(match.group(1))
        for match in (_BATCH_FILE.match(name) for name in files.names(log_dir))
        if match
    ]
    return max(numbers, default=-1)


def _checkpoint_id(files: LakeFiles, checkpoint: str) -> str | None:
    path = join(checkpoint, "metadata")
    try:
        text = files.read_text(path)
        data = None if text is None else json.loads(text)
    except (OSError, ValueError) as error:
        raise LakeCheckpointMismatch(
            f"cannot read the checkpoint's id from {path}: {error}"
        ) from None
    found = data.get("id") if isinstance(data, dict) else None
    return found if isinstance(found, str) else None


def _checkpoint_state(files: LakeFiles, checkpoint: str) -> _CheckpointState:
    return _CheckpointState(
        checkpoint_id=_checkpoint_id(files, checkpoint),
        last_planned=_last_batch(files, join(checkpoint, "offsets")),
        last_committed=_last_batch(files, join(checkpoint, "commits")),
    )


def _read_binding(files: LakeFiles, lake: str) -> dict[str, Any] | None:
    path = join(lake, BINDING_FILE)
    try:
        text = files.read_text(path)
        data = None if text is None else json.loads(text)
    except (OSError, ValueError) as error:
        raise LakeCheckpointMismatch(
            f"cannot read {path}, which records the lake's checkpoint: {error}"
        ) from None
    return data if isinstance(data, dict) else None


def _write_binding(files: LakeFiles, lake: str, binding: Mapping[str, Any]) -> None:
    files.write_text(join(lake, BINDING_FILE), json.dumps(binding, indent=2) + "\n")
