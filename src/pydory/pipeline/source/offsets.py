"""Offset planning for the Kafka source: pure functions, no Kafka and no Spark.

Spark drives a streaming source in micro-batches. For each batch the source names an
*end* offset per topic-partition; the batch then reads every record from the previous
batch's end (its *start*) up to, not including, the new end. Spark writes both ends to
its checkpoint before the batch runs, so a batch re-run after a crash reads the same
ranges. Everything here computes those offsets from what the brokers report
(:class:`Watermarks`) and what the user asked for (options).

Offsets travel through Spark's checkpoint as small JSON objects, topic → partition →
offset, e.g. ``{"events": {"0": 23, "1": 40}}`` (the same shape as spark-sql-kafka's).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, TypeAlias

from pydory.pipeline.errors import SourceOptionError

__all__ = [
    "EARLIEST",
    "LATEST",
    "DataLoss",
    "LossKind",
    "OffsetRange",
    "OffsetSpec",
    "Offsets",
    "PartitionId",
    "Watermarks",
    "admit",
    "find_data_loss",
    "next_end_offsets",
    "offsets_from_json",
    "offsets_to_json",
    "parse_offset_spec",
    "plan_ranges",
    "resolve_offsets",
    "starts_to_look_up",
]

# The sentinels spark-sql-kafka uses in startingOffsets / endingOffsets JSON.
EARLIEST = -2
LATEST = -1


@dataclass(frozen=True, order=True, slots=True)
class PartitionId:
    """One Kafka topic-partition."""

    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}/{self.partition}"


Offsets: TypeAlias = Mapping[PartitionId, int]
OffsetsJson: TypeAlias = dict[str, dict[str, int]]


@dataclass(frozen=True, slots=True)
class Watermarks:
    """What a partition holds: offsets ``earliest`` (still retained) up to ``latest`` (next)."""

    earliest: int
    latest: int


@dataclass(frozen=True, slots=True)
class OffsetRange:
    """The records of one partition one Spark task reads: ``start`` inclusive, ``end`` not."""

    partition: PartitionId
    start: int
    end: int


# --- JSON ----------------------------------------------------------------------------------


def offsets_to_json(offsets: Offsets) -> OffsetsJson:
    """The checkpoint form of ``offsets``, in a canonical order.

    Spark compares offsets by their JSON text to decide whether a batch has new data,
    so the same offsets must always serialise to the same text.
    """
    result: OffsetsJson = {}
    for partition_id in sorted(offsets):
        result.setdefault(partition_id.topic, {})[str(partition_id.partition)] = offsets[
            partition_id
        ]
    return result


def offsets_from_json(data: Any, option: str = "offset") -> dict[PartitionId, int]:
    """Parse topic → partition → offset JSON (already decoded); raise on any other shape."""
    if not isinstance(data, dict):
        raise SourceOptionError(
            option, f'expected a JSON object like {{"topic": {{"0": 23}}}}, got {json.dumps(data)}'
        )
    offsets: dict[PartitionId, int] = {}
    for topic, partitions in data.items():
        if not isinstance(partitions, dict):
            raise SourceOptionError(
                option, f"topic {topic!r} must map partition numbers to offsets"
            )
        for partition, offset in partitions.items():
            if not str(partition).isdigit():
                raise SourceOptionError(
                    option, f"topic {topic!r}: partition {partition!r} is not a number"
                )
            if isinstance(offset, bool) or not isinstance(offset, int) or offset < EARLIEST:
                raise SourceOptionError(
                    option,
                    f"{topic}/{partition}: offset {offset!r} is not an offset, "
                    f"{LATEST} (latest) or {EARLIEST} (earliest)",
                )
            offsets[PartitionId(topic, int(partition))] = offset
    return offsets


# --- startingOffsets / endingOffsets -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OffsetSpec:
    """Where to start (or end) reading: a default, and offsets for listed partitions.

    ``default`` is :data:`EARLIEST` or :data:`LATEST`; values in ``specific`` may be
    those sentinels too.
    """

    default: int
    specific: Mapping[PartitionId, int] = field(default_factory=dict)


def parse_offset_spec(text: str, option: str, unlisted: int) -> OffsetSpec:
    """Parse ``earliest``, ``latest`` or JSON like ``{"t": {"0": 23, "1": -2}}``.

    Partitions a JSON value leaves out get ``unlisted`` (:data:`EARLIEST` or :data:`LATEST`).
    """
    word = text.strip().lower()
    if word == "earliest":
        return OffsetSpec(EARLIEST)
    if word == "latest":
        return OffsetSpec(LATEST)
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        raise SourceOptionError(
            option, f'expected earliest, latest or JSON like {{"topic": {{"0": 23}}}}, got {text!r}'
        ) from None
    return OffsetSpec(unlisted, offsets_from_json(data, option))


def resolve_offsets(
    spec: OffsetSpec, available: Mapping[PartitionId, Watermarks]
) -> dict[PartitionId, int]:
    """Concrete offsets for every available partition, the sentinels replaced.

    Raises :class:`SourceOptionError` if ``spec`` names a partition that does not exist.
    """
    unknown = sorted(set(spec.specific) - set(available))
    if unknown:
        raise SourceOptionError(
            "startingOffsets/endingOffsets",
            f"no such partition on the brokers: {', '.join(map(str, unknown))}",
        )
    resolved: dict[PartitionId, int] = {}
    for partition_id, marks in available.items():
        wanted = spec.specific.get(partition_id, spec.default)
        if wanted == EARLIEST:
            resolved[partition_id] = marks.earliest
        elif wanted == LATEST:
            resolved[partition_id] = marks.latest
        else:
            resolved[partition_id] = wanted
    return resolved


# --- data loss -----------------------------------------------------------------------------


class LossKind(Enum):
    """Why the next offset a query wants to read is not in Kafka."""

    AGED_OUT = "aged out of retention"
    PARTITION_GONE = "partition no longer exists"
    OFFSETS_RESET = "offsets went backwards (topic recreated or log truncated)"


@dataclass(frozen=True, slots=True)
class DataLoss:
    """A partition whose next offset to read, ``requested``, cannot be read."""

    partition: PartitionId
    kind: LossKind
    requested: int
    available: Watermarks | None

    @property
    def lost(self) -> int | None:
        """How many offsets are skipped when reading resumes at the earliest, if known."""
        if self.kind is LossKind.AGED_OUT and self.available is not None:
            return self.available.earliest - self.requested
        return None

    def describe(self) -> str:
        """One line naming the partition, the offsets and what happened."""
        if self.kind is LossKind.OFFSETS_RESET and self.available is not None:
            return (
                f"{self.partition}: offsets went backwards (the topic was deleted and "
                f"recreated, or its log truncated): the query had read up to offset "
                f"{self.requested}, the broker now holds offsets {self.available.earliest} "
                f"to {self.available.latest - 1}"
            )
        where = f"{self.partition}: offset {self.requested} {self.kind.value}"
        if self.available is None:
            return where
        marks = self.available
        return f"{where}; the broker holds offsets {marks.earliest} to {marks.latest - 1}" + (
            f" ({self.lost} offsets lost)" if self.lost is not None else ""
        )


def find_data_loss(start: Offsets, available: Mapping[PartitionId, Watermarks]) -> list[DataLoss]:
    """The partitions in ``start`` whose start offset the brokers no longer hold."""
    losses: list[DataLoss] = []
    for partition_id in sorted(start):
        offset = start[partition_id]
        marks = available.get(partition_id)
        if marks is None:
            losses.append(DataLoss(partition_id, LossKind.PARTITION_GONE, offset, None))
        elif offset < marks.earliest:
            losses.append(DataLoss(partition_id, LossKind.AGED_OUT, offset, marks))
        elif offset > marks.latest:
            losses.append(DataLoss(partition_id, LossKind.OFFSETS_RESET, offset, marks))
    return losses


def _readable_starts(
    start: Offsets, available: Mapping[PartitionId, Watermarks]
) -> dict[PartitionId, int]:
    """Where reading can resume: lost offsets skip to the earliest, new partitions start there.

    Partitions that no longer exist are dropped.
    """
    begin: dict[PartitionId, int] = {}
    for partition_id, marks in available.items():
        offset = start.get(partition_id)
        if offset is None or not marks.earliest <= offset <= marks.latest:
            begin[partition_id] = marks.earliest
        else:
            begin[partition_id] = offset
    return begin


# --- admission control ---------------------------------------------------------------------


def admit(start: Offsets, latest: Offsets, max_offsets: int) -> dict[PartitionId, int]:
    """End offsets that admit at most ``max_offsets`` offsets in total from ``start``.

    Like Spark's own Kafka source, the budget is spread over the partitions in
    proportion to how far each lags behind ``latest``, and no partition with data is
    starved while the budget allows one offset each. Unlike Spark's (which rounds small
    shares up), the total never exceeds ``max_offsets``: shares are rounded down and
    the remainder goes to the largest fractions (ties by partition, so the plan is
    deterministic). ``start`` must cover every partition of ``latest``.
    """
    if max_offsets < 1:
        raise ValueError(f"max_offsets must be at least 1, got {max_offsets}")
    pending = {
        partition_id: latest[partition_id] - start[partition_id]
        for partition_id in sorted(latest)
        if latest[partition_id] > start[partition_id]
    }
    if sum(pending.values()) <= max_offsets:
        return {
            partition_id: max(start[partition_id], latest[partition_id]) for partition_id in latest
        }
    end = {partition_id: start[partition_id] for partition_id in latest}
    for partition_id, share in _shares(pending, max_offsets).items():
        end[partition_id] += share
    return end


def _shares(pending: Mapping[PartitionId, int], budget: int) -> dict[PartitionId, int]:
    """Split ``budget`` (less than the total pending) over the partitions with data."""
    if budget < len(pending):
        # Not even one offset each: serve the partitions furthest behind.
        furthest = sorted(pending, key=lambda partition_id: (-pending[partition_id], partition_id))
        return {partition_id: 1 for partition_id in furthest[:budget]}
    total = sum(pending.values())
    # Largest remainder, in integers: floor each exact share, then hand out what is left.
    shares = {partition_id: budget * count // total for partition_id, count in pending.items()}
    by_fraction = sorted(
        pending, key=lambda partition_id: (-(budget * pending[partition_id] % total), partition_id)
    )
    for partition_id in by_fraction[: budget - sum(shares.values())]:
        shares[partition_id] += 1
    # No partition with data starves: each gets one offset, from the largest share.
    for partition_id in [partition_id for partition_id, share in shares.items() if share == 0]:
        largest = max(shares, key=lambda other: (shares[other], other))
        shares[largest] -= 1
        shares[partition_id] = 1
    return shares


# --- one micro-batch -----------------------------------------------------------------------


def next_end_offsets(
    start: Offsets,
    available: Mapping[PartitionId, Watermarks],
    max_offsets: int | None = None,
    target: Offsets | None = None,
) -> dict[PartitionId, int]:
    """The end of the next micro-batch that starts at ``start``.

    ``available`` is what the brokers hold now. ``max_offsets`` caps the batch
    (maxOffsetsPerTrigger); ``target`` caps it at the offsets recorded when a
    Trigger.AvailableNow query began (partitions created since are left for a later run).
    Offsets that are lost (see :func:`find_data_loss`) resume at the earliest available;
    the caller decides beforehand whether that is allowed. Every partition of ``start``
    that still exists appears in the result, so no partition is ever read twice.
    When there is nothing new the result equals ``start``.
    """
    begin = _readable_starts(start, available)
    if target is not None:
        # Partitions born after the target wait for a later run; started ones stay.
        begin = {
            partition_id: offset
            for partition_id, offset in begin.items()
            if partition_id in start or partition_id in target
        }
    upper = {partition_id: available[partition_id].latest for partition_id in begin}
    if target is not None:
        upper = {
            partition_id: max(begin[partition_id], min(latest, target[partition_id]))
            for partition_id, latest in upper.items()
            if partition_id in target
        }
    admitted = upper if max_offsets is None else admit(begin, upper, max_offsets)
    return {**begin, **admitted}


def starts_to_look_up(start: Offsets, end: Offsets) -> list[PartitionId]:
    """Partitions of ``end`` whose range start is unknown from ``start`` alone.

    Those are partitions new since ``start`` and partitions whose offsets went
    backwards; both are read from the earliest offset the broker holds.
    """
    return sorted(
        partition_id
        for partition_id, end_offset in end.items()
        if partition_id not in start or start[partition_id] > end_offset
    )


def plan_ranges(start: Offsets, end: Offsets, earliest: Offsets) -> list[OffsetRange]:
    """One range per partition with records between ``start`` and ``end``.

    ``earliest`` supplies the start of the partitions :func:`starts_to_look_up` names.
    """
    ranges: list[OffsetRange] = []
    for partition_id in sorted(end):
        begin = start.get(partition_id, -1)
        if partition_id not in start or begin > end[partition_id]:
            begin = earliest[partition_id]
        if begin < end[partition_id]:
            ranges.append(OffsetRange(partition_id, begin, end[partition_id]))
    return ranges
