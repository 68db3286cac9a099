"""Routing: the cluster metadata the daemon trusts, and the partition each message goes to.

Pure logic, no I/O: ``MetadataSnapshot`` is built from librdkafka's ClusterMetadata (or by
hand in tests) and ``Router`` answers "is this topic known?" and "which partition?".

Between metadata refreshes the router also takes liveness as input (``set_unavailable``):
brokers librdkafka cannot reach and partitions it has no broker for, from its statistics.
Their partitions count as leaderless until the next call, for both rules below, so traffic
moves away from a downed broker within a statistics interval and comes back when it is up.

Dory's rules (spec §1):
- PartitionKey: the topic's partition ids sorted ascending; ``partitions[key % n]``; if that
  partition has no leader, the next partition in the array that has one (wrapping).
- AnyPartition: spread over available partitions so that each broker's share follows its
  share of the topic's leaders. Dory picks a broker per batch, then a partition of that
  broker per produce request. librdkafka batches per partition, so we stay on one
  available partition for a short run of messages (``ANY_PARTITION_RUN``) and then move to
  the next one, round-robin: over time every available partition gets an equal share, and
  so every broker a share proportional to the partitions it leads, while batches stay full.

Rule: the partition a message goes to is chosen by ``Router`` alone (Dory's PartitionKey and
AnyPartition rules), from the metadata snapshot the router holds; pure logic.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydory.daemon.books import counters as counter_names
from pydory.daemon.books.counters import Counters

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
        partitions with an error are treated as having no leader, and so are partitions
        whose leader is not among the brokers listed (a broker that left the cluster).
        """
        brokers = {b.id: f"{b.host}:{b.port}" for b in metadata.brokers.values()}
        topics: dict[str, dict[int, int]] = {}
        for name, topic in metadata.topics.items():
            if topic.error is not None or name.startswith("__"):
                continue
            topics[name] = {
                p.id: (NO_LEADER if p.error is not None or p.leader not in brokers else p.leader)
                for p in topic.partitions.values()
            }
        return cls.build(brokers, topics, down_brokers)

    def same_layout(self, other: MetadataSnapshot) -> bool:
        """Whether routing would be identical under ``other`` (Dory's compareMetadataOnRefresh)."""
        return self.brokers == other.brokers and {
            n: dict(t.leaders) for n, t in self.topics.items()
        } == {n: dict(t.leaders) for n, t in other.topics.items()}


class Router:
    """Chooses partitions from the current snapshot and liveness. Owned by the event-loop
    thread."""

    def __init__(
        self, snapshot: MetadataSnapshot | None = None, counters: Counters | None = None
    ) -> None:
        self._snapshot = snapshot or MetadataSnapshot({}, {})
        # Until the first snapshot, an unknown topic is not a bad topic: nothing is known.
        self._has_metadata = snapshot is not None
        self._counters = counters if counters is not None else Counters()
        self._unavailable_brokers: frozenset[int] = frozenset()
        self._unavailable_partitions: frozenset[tuple[str, int]] = frozenset()
        # topic -> the partitions to route to now (never empty: see _routable)
        self._routable: dict[str, tuple[int, ...]] = {}
        # topic -> [index into routable partitions, messages left in the current run,
        #           the partition of the current run]
        self._cursor: dict[str, list[int]] = {}

    @property
    def snapshot(self) -> MetadataSnapshot:
        return self._snapshot

    @property
    def has_metadata(self) -> bool:
        """Whether the router has had a snapshot: before the first metadata fetch
        succeeds, it knows no topic, and that says nothing about the cluster."""
        return self._has_metadata

    @property
    def unavailable_brokers(self) -> frozenset[int]:
        return self._unavailable_brokers

    def replace(self, snapshot: MetadataSnapshot) -> None:
        """Route by ``snapshot`` from now on."""
        self._snapshot = snapshot
        self._has_metadata = True
        self._forget_choices()

    def set_unavailable(
        self,
        brokers: Collection[int] = (),
        partitions: Collection[tuple[str, int]] = (),
    ) -> bool:
        """Treat partitions led by ``brokers``, and ``partitions`` (topic, id), as
        leaderless until the next call. Returns whether that changed anything."""
        brokers, partitions = frozenset(brokers), frozenset(partitions)
        if brokers == self._unavailable_brokers and partitions == self._unavailable_partitions:
            return False
        self._unavailable_brokers, self._unavailable_partitions = brokers, partitions
        self._forget_choices()
        return True

    def _forget_choices(self) -> None:
        self._routable.clear()
        self._cursor.clear()

    def knows(self, topic: str) -> bool:
        return topic in self._snapshot.topics

    def layout(self, topic: str) -> TopicLayout | None:
        return self._snapshot.topics.get(topic)

    def available(self, topic: str) -> tuple[int, ...]:
        """``topic``'s partitions that have a leader and are not marked unavailable,
        ascending (empty when none has). The topic must be known."""
        layout = self._snapshot.topics[topic]
        return tuple(p for p in layout.available if self._reachable(topic, p, layout))

    def _reachable(self, topic: str, partition: int, layout: TopicLayout) -> bool:
        return (
            layout.leaders[partition] not in self._unavailable_brokers
            and (topic, partition) not in self._unavailable_partitions
        )

    def _routable_partitions(self, topic: str) -> tuple[int, ...]:
        """Where AnyPartition traffic goes: the available partitions; if liveness rules
        them all out, those metadata names a leader for; if none, every partition
        (librdkafka then holds the messages until a leader appears)."""
        routable = self._routable.get(topic)
        if routable is None:
            layout = self._snapshot.topics[topic]
            available = self.available(topic)
            if not available:
                # Dory's TopicHasNoAvailablePartitions: once per layout or liveness change.
                self._counters.inc(counter_names.TOPIC_NO_AVAILABLE_PARTITIONS)
            routable = available or layout.available or layout.partitions
            self._routable[topic] = routable
        return routable

    def partition_key_partition(self, topic: str, key: int) -> int:
        """Dory's PartitionKey rule. The topic must be known."""
        layout = self._snapshot.topics[topic]
        partitions = layout.partitions
        start = (key & 0xFFFFFFFF) % len(partitions)
        # Liveness first; if it rules out every partition, metadata's leaders alone.
        for heed_liveness in (True, False):
            for step in range(len(partitions)):
                candidate = partitions[(start + step) % len(partitions)]
                if layout.leaders[candidate] != NO_LEADER and (
                    not heed_liveness or self._reachable(topic, candidate, layout)
                ):
                    return candidate
        return partitions[start]  # nothing has a leader: librdkafka holds it until one appears

    def any_partition_runs(self, topic: str, count: int) -> list[tuple[int, int]]:
        """The partitions of ``count`` AnyPartition messages, as ``(partition, n)`` runs:
        the very ones ``count`` calls of :meth:`any_partition` would give, in order."""
        runs = []
        while count > 0:
            partition = self.any_partition(topic)  # the first of a run, or one of the run
            cursor = self._cursor[topic]
            more = min(cursor[1], count - 1)  # the run goes on for these
            cursor[1] -= more
            runs.append((partition, 1 + more))
            count -= 1 + more
        return runs

    def any_partition(self, topic: str, avoid: int | None = None) -> int:
        """Next partition for an AnyPartition message; ``avoid`` skips one partition (a
        reroute away from a partition that just failed) when another is available."""
        cursor = self._cursor.get(topic)
        if cursor is not None and cursor[1] > 0 and avoid is None:
            cursor[1] -= 1  # the hot path: the run goes on
            return cursor[2]
        choices = self._routable_partitions(topic)
        if avoid is not None and len(choices) > 1 and avoid in choices:
            choices = tuple(p for p in choices if p != avoid)
        if cursor is None:
            cursor = self._cursor[topic] = [0, ANY_PARTITION_RUN, NO_LEADER]
        if cursor[1] <= 0:
            cursor[0] += 1
            cursor[1] = ANY_PARTITION_RUN
        cursor[1] -= 1
        # The run's partition among every routable one: what the hot path returns.
        routable = self._routable_partitions(topic)
        cursor[2] = routable[cursor[0] % len(routable)]
        return choices[cursor[0] % len(choices)]
