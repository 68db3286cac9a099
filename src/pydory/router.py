"""Routing: the cluster metadata the daemon trusts, and the partition each message goes to.

Pure logic, no I/O: ``MetadataSnapshot`` is built from librdkafka's ClusterMetadata (or by
hand in tests) and ``Router`` answers "is this topic known?" and "which partition?".

Dory's rules (spec §1):
- PartitionKey: the topic's partition ids sorted ascending; ``partitions[key % n]``; if that
  partition has no leader, the next partition in the array that has one (wrapping).
- AnyPartition: spread over available partitions so that each broker's share follows its
  share of the topic's leaders. Dory picks a broker per batch, then a partition of that
  broker per produce request. librdkafka batches per partition, so we stay on one
  available partition for a short run of messages (``ANY_PARTITION_RUN``) and then move to
  the next one, round-robin: over time every available partition gets an equal share, and
  so every broker a share proportional to the partitions it leads, while batches stay full.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

NO_LEADER = -1

#: AnyPartition messages sent to one partition before moving to the next. Large enough for
#: librdkafka to fill batches, small enough that a trickle of messages still spreads.
ANY_PARTITION_RUN = 64


@dataclass(frozen=True, slots=True)
class TopicLayout:
    """One topic's partitions and their leaders, as metadata last reported them."""

    name: str
    leaders: Mapping[int, int]  # partition id -> leader broker id (NO_LEADER if none)
    partitions: tuple[int, ...] = field(init=False)  # every partition id, ascending
    available: tuple[int, ...] = field(init=False)  # those with a live leader, ascending

    def __post_init__(self) -> None:
        ordered = tuple(sorted(self.leaders))
        object.__setattr__(self, "partitions", ordered)
        object.__setattr__(
            self, "available", tuple(p for p in ordered if self.leaders[p] != NO_LEADER)
        )


@dataclass(frozen=True, slots=True)
class MetadataSnapshot:
    """What the cluster looked like at one metadata fetch."""

    brokers: Mapping[int, str]  # broker id -> "host:port"
    topics: Mapping[str, TopicLayout]

    @classmethod
    def build(
        cls,
        brokers: Mapping[int, str],
        topics: Mapping[str, Mapping[int, int]],
        down_brokers: Iterable[int] = (),
    ) -> MetadataSnapshot:
        """Build from plain dicts; partitions led by a broker in ``down_brokers`` count as
        leaderless (the broker is listed but known to be unreachable)."""
        down = set(down_brokers)
        layouts = {
            name: TopicLayout(
                name,
                {p: (NO_LEADER if leader in down else leader) for p, leader in leaders.items()},
            )
            for name, leaders in topics.items()
        }
        return cls(dict(brokers), layouts)

    @classmethod
    def from_cluster_metadata(
        cls, metadata: Any, down_brokers: Iterable[int] = ()
    ) -> MetadataSnapshot:
        """Build from confluent_kafka's ``ClusterMetadata`` (``Producer.list_topics()``).

        Topics whose metadata carries an error (e.g. still being created) are left out;
        partitions with an error are treated as having no leader.
        """
        brokers = {b.id: f"{b.host}:{b.port}" for b in metadata.brokers.values()}
        topics: dict[str, dict[int, int]] = {}
        for name, topic in metadata.topics.items():
            if topic.error is not None or name.startswith("__"):
                continue
            topics[name] = {
                p.id: (NO_LEADER if p.error is not None else p.leader)
                for p in topic.partitions.values()
            }
        return cls.build(brokers, topics, down_brokers)

    def same_layout(self, other: MetadataSnapshot) -> bool:
        """Whether routing would be identical under ``other`` (Dory's compareMetadataOnRefresh)."""
        return self.brokers == other.brokers and {
            n: dict(t.leaders) for n, t in self.topics.items()
        } == {n: dict(t.leaders) for n, t in other.topics.items()}


class Router:
    """Chooses partitions from the current snapshot. Owned by the event-loop thread."""

    def __init__(self, snapshot: MetadataSnapshot | None = None) -> None:
        self._snapshot = snapshot or MetadataSnapshot({}, {})
        # topic -> [index into available partitions, messages left in the current run]
        self._cursor: dict[str, list[int]] = {}

    @property
    def snapshot(self) -> MetadataSnapshot:
        return self._snapshot

    def replace(self, snapshot: MetadataSnapshot) -> None:
        """Route by ``snapshot`` from now on."""
        self._snapshot = snapshot
        self._cursor.clear()

    def knows(self, topic: str) -> bool:
        return topic in self._snapshot.topics

    def layout(self, topic: str) -> TopicLayout | None:
        return self._snapshot.topics.get(topic)

    def partition_key_partition(self, topic: str, key: int) -> int:
        """Dory's PartitionKey rule. The topic must be known."""
        layout = self._snapshot.topics[topic]
        partitions = layout.partitions
        start = (key & 0xFFFFFFFF) % len(partitions)
        for step in range(len(partitions)):
            candidate = partitions[(start + step) % len(partitions)]
            if layout.leaders[candidate] != NO_LEADER:
                return candidate
        return partitions[start]  # nothing has a leader: librdkafka holds it until one appears

    def any_partition(self, topic: str, avoid: int | None = None) -> int:
        """Next partition for an AnyPartition message; ``avoid`` skips one partition (a
        reroute away from a partition that just failed) when another is available."""
        layout = self._snapshot.topics[topic]
        choices = layout.available or layout.partitions
        if avoid is not None and len(choices) > 1 and avoid in choices:
            choices = tuple(p for p in choices if p != avoid)
        cursor = self._cursor.get(topic)
        if cursor is None:
            cursor = self._cursor[topic] = [0, ANY_PARTITION_RUN]
        if cursor[1] <= 0:
            cursor[0] += 1
            cursor[1] = ANY_PARTITION_RUN
        cursor[1] -= 1
        return choices[cursor[0] % len(choices)]
