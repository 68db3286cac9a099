"""What a landing run with ``failOnDataLoss=false`` skipped, per partition. Pure logic.

With data loss accepted, both connectors read on from what Kafka still holds, and say so
only in Spark's log. The landing job reports it instead: from each batch's start and end
offsets (the query's progress), and the rows the lake holds in those ranges.

- A range that went forward, ``[start, end)``: every offset in it should have landed;
  the ones that did not aged out of Kafka (retention) before they were read. Counting
  them assumes dense offsets, as pydory's producer writes them (no transaction markers,
  no compaction), the same assumption the audit makes.
- A range that went backwards (``end < start``: the topic was deleted and recreated, or
  its log truncated): Spark's own source (``native``) moves on to ``end`` without
  reading the new log below it, so up to ``end`` records were not landed; ``pydory-kafka``
  reads the new log from its earliest offset, so nothing is skipped there.

A range's offsets that did not land may also be second copies the landing job dropped (a
daemon's replay after a crash): those were read, not skipped. Each batch reports per
topic how many it dropped (``dropped``); they are taken off the topic's shortfall first.
Where a topic dropped none, each partition's count is exact; where it dropped some, the
dropped copies are counted per topic only, so what remains is reported for the topic and
the partitions that fell short (:class:`TopicSkips`), never a dropped copy as skipped.

Rule: a skipped record is counted in ``skips_of_run``, from offsets planned and rows landed,
once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from pydory.pipeline.source.offsets import PartitionId

__all__ = ["PartitionSkips", "PlannedRanges", "TopicSkips", "plan_of_run", "skips_of_run"]

#: A batch's offsets as the query's progress reports them: topic -> partition -> offset.
BatchOffsets = Mapping[str, Mapping[str, int]]


@dataclass
class PlannedRanges:
    """Per partition: the ranges a run planned forward, and the jumps backwards."""

    forward: dict[PartitionId, list[tuple[int, int]]] = field(default_factory=dict)
    backwards: dict[PartitionId, list[tuple[int, int]]] = field(default_factory=dict)
    #: Per topic, second copies the planned batches read and dropped.
    dropped: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class PartitionSkips:
    """What one partition lost in a run."""

    partition: PartitionId
    aged_out: int
    #: (from, to) of each jump backwards, and how many records of the new log below
    #: ``to`` were not read (0 when the connector reads them).
    backwards: tuple[tuple[int, int, int], ...] = ()

    @property
    def total(self) -> int:
        return self.aged_out + sum(unread for _, _, unread in self.backwards)

    def describe(self) -> str:
        parts = []
        if self.aged_out:
            parts.append(f"{self.aged_out:,} offsets aged out of Kafka before they were read")
        for start, end, unread in self.backwards:
            jump = (
                f"offsets went backwards from {start} to {end} (topic recreated or log truncated)"
            )
            parts.append(
                f"{jump}: up to {unread:,} records below offset {end} not read"
                if unread
                else f"{jump}: the new log read from its earliest offset"
            )
        return f"{self.partition}: " + "; ".join(parts)


@dataclass(frozen=True)
class TopicSkips:
    """What a topic lost in a run where it also dropped second copies: counted per topic."""

    topic: str
    partitions: tuple[int, ...]  # those that landed fewer rows than they planned
    aged_out: int
    second_copies: int

    @property
    def total(self) -> int:
        return self.aged_out

    def describe(self) -> str:
        where = ", ".join(str(partition) for partition in self.partitions)
        return (
            f"{self.topic} (partitions {where}): {self.aged_out:,} offsets aged out of Kafka "
            f"before they were read ({self.second_copies:,} others not landed were second "
            "copies dropped)"
        )


def plan_of_run(
    batches: Iterable[tuple[BatchOffsets | None, BatchOffsets | None]],
    dropped: Iterable[Mapping[str, int]] | None = None,
) -> PlannedRanges:
    """The ranges of a run's batches, contiguous ones merged; ``dropped``, beside
    ``batches`` one for each, the second copies each batch dropped per topic.

    A batch without a start (the first of a new checkpoint) or a partition new in a
    batch has nothing to compare with and is left out.
    """
    plan = PlannedRanges()
    batches = list(batches)
    drops = list(dropped) if dropped is not None else [{}] * len(batches)
    for (start, end), batch_dropped in zip(batches, drops, strict=True):
        if start is None or end is None:
            continue
        for topic, count in batch_dropped.items():
            plan.dropped[topic] = plan.dropped.get(topic, 0) + count
        for partition_id, (begin, finish) in _pairs(start, end):
            if finish < begin:
                plan.backwards.setdefault(partition_id, []).append((begin, finish))
            elif finish > begin:
                _add_range(plan.forward.setdefault(partition_id, []), begin, finish)
    return plan


def skips_of_run(
    plan: PlannedRanges, landed: Mapping[PartitionId, int], reads_new_log: bool
) -> list[PartitionSkips | TopicSkips]:
    """Per partition with a loss (per topic where second copies were dropped): ``landed``
    is the rows the lake holds within ``plan.forward``; ``reads_new_log`` whether the
    connector reads a recreated log."""
    skips: list[PartitionSkips | TopicSkips] = []
    shortfalls: dict[str, dict[int, int]] = {}
    for partition_id in sorted(set(plan.forward) | set(plan.backwards)):
        planned = sum(end - start for start, end in plan.forward.get(partition_id, []))
        aged_out = max(0, planned - landed.get(partition_id, 0))
        if plan.dropped.get(partition_id.topic):
            if aged_out:
                shortfalls.setdefault(partition_id.topic, {})[partition_id.partition] = aged_out
            aged_out = 0  # counted for the topic, below
        backwards = tuple(
            (start, end, 0 if reads_new_log else end)
            for start, end in plan.backwards.get(partition_id, [])
        )
        found = PartitionSkips(partition_id, aged_out, backwards)
        if found.total or backwards:
            skips.append(found)
    for topic, per_partition in sorted(shortfalls.items()):
        copies = plan.dropped[topic]
        aged_out = sum(per_partition.values()) - copies
        if aged_out > 0:
            skips.append(TopicSkips(topic, tuple(sorted(per_partition)), aged_out, copies))
    return skips


def _pairs(start: BatchOffsets, end: BatchOffsets) -> Iterable[tuple[PartitionId, tuple[int, int]]]:
    for topic, partitions in end.items():
        for partition, finish in partitions.items():
            begin = start.get(topic, {}).get(partition)
            if begin is not None:
                yield PartitionId(topic, int(partition)), (int(begin), int(finish))


def _add_range(ranges: list[tuple[int, int]], start: int, end: int) -> None:
    if ranges and ranges[-1][1] == start:
        ranges[-1] = (ranges[-1][0], end)
    else:
        ranges.append((start, end))
