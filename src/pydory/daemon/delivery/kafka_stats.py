"""librdkafka's statistics: what each producer holds, and how its brokers are doing.

Every producer emits a statistics JSON document every ``STATS_INTERVAL_MS``
(``statistics.interval.ms``, served by ``stats_cb`` inside ``poll()``). This module turns
one document into a frozen ``ProducerStats`` (``parse_statistics``, pure) and merges the
latest report of every producer into one ``StatsSnapshot`` (``KafkaStats``), which the
status pages (Dory's /queues) and the router's broker liveness read.

Where librdkafka's numbers come from (STATISTICS.md, src/rdkafka.c ``rd_kafka_stats_emit_*``):

- a partition's ``msgq_cnt`` is its produce queue; ``xmit_msgq_cnt`` is always 0 (librdkafka
  moves messages to a broker-thread-local transmit queue it does not report), so messages
  lingering there are invisible per topic. When the caller knows how many messages of each
  topic librdkafka holds (``held_by_topic``: the daemon passes its books' in-flight count),
  ``batch`` is derived from that instead.
- a partition's ``msgs_inflight`` counts messages in produce requests, both those still in
  the broker's output buffer and those sent and waiting for a response; the broker's
  ``outbuf_msg_cnt`` / ``waitresp_msg_cnt`` give that split per broker, and it is applied to
  each partition the broker leads.
- times are in microseconds.

Rule: librdkafka's statistics JSON is read here alone, into a frozen ``StatsSnapshot``; every other
module reads the snapshots.
"""

from __future__ import annotations

import json
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

#: librdkafka ``statistics.interval.ms`` for every producer.
STATS_INTERVAL_MS = 1000

#: Broker states in which a connection carries requests.
USABLE_STATES = frozenset({"UP", "UPDATE"})
#: librdkafka has not tried to connect (sparse connections: nothing to send there yet).
UNTRIED_STATE = "INIT"
#: A connection failed and librdkafka is waiting to try again.
FAILED_STATES = frozenset({"DOWN", "TRY_CONNECT"})
#: Any other state is a connection being set up (TCP connect, TLS, SASL, ApiVersion). It is
#: normal for a few milliseconds; a broker still there after this long is not usable.
STUCK_CONNECTING_S = STATS_INTERVAL_MS / 1000


@dataclass(frozen=True, slots=True)
class TopicQueues:
    """Messages of one topic inside librdkafka, by stage (Dory's /queues "sending" entry)."""

    topic: str
    batch: int  # in librdkafka, not yet in a produce request
    send_wait: int  # in a produce request waiting to be sent
    ack_wait: int  # sent, waiting for the broker's acknowledgement


@dataclass(frozen=True, slots=True)
class BrokerStats:
    """One broker as the producers see it."""

    node_id: int  # -1 for the bootstrap pseudo-brokers
    name: str  # "127.0.0.1:39123/1"
    state: str  # "UP", "DOWN", "CONNECT", ...
    rtt_avg_ms: float
    rtt_p99_ms: float
    tx_errors: int
    rx_errors: int
    request_timeouts: int
    outbuf_requests: int  # waiting to be sent
    waitresp_requests: int  # waiting for a response
    leader_partitions: int  # partitions this broker leads (from the topics it serves)
    state_age_s: float = 0.0  # how long the connection has been in ``state``
    connects: int = 0  # connection attempts, failed ones included
    disconnects: int = 0  # connections the broker or the network closed

    @property
    def unreachable(self) -> bool:
        """Whether librdkafka cannot send to this broker now: its connection failed, or has
        been setting up for longer than a statistics interval. A broker librdkafka has not
        tried yet counts as reachable: only sending there makes it try."""
        if self.state in USABLE_STATES or self.state == UNTRIED_STATE:
            return False
        return self.state in FAILED_STATES or self.state_age_s >= STUCK_CONNECTING_S


@dataclass(frozen=True, slots=True)
class StatsSnapshot:
    """Every producer's latest statistics, merged."""

    taken_at: float  # epoch seconds of the newest report in it; 0.0 before the first
    topics: Mapping[str, TopicQueues]
    brokers: Sequence[BrokerStats]
    producers: int  # how many producers contributed
    # Partitions librdkafka has no broker to send to (leader unknown or not in its broker
    # list, e.g. a broker that left the cluster's metadata).
    unroutable: frozenset[tuple[str, int]] = frozenset()

    def unreachable_brokers(self) -> frozenset[int]:
        """Node ids of the brokers no producer can send to now (see ``BrokerStats``)."""
        return frozenset(b.node_id for b in self.brokers if b.node_id >= 0 and b.unreachable)


EMPTY_SNAPSHOT = StatsSnapshot(taken_at=0.0, topics={}, brokers=(), producers=0)


@dataclass(frozen=True, slots=True)
class _PartitionStage:
    """One topic's messages inside one producer, before the per-topic totals."""

    queued: int = 0  # partition produce queues (msgq + xmit_msgq)
    in_requests: float = 0.0  # msgs_inflight
    unsent: float = 0.0  # the part of in_requests still in a broker's output buffer


@dataclass(frozen=True, slots=True)
class ProducerStats:
    """One producer's statistics report, parsed."""

    producer: str  # librdkafka's handle name, e.g. "pydory#producer-1"
    received_at: float  # epoch seconds
    messages: int  # msg_cnt: every message the producer holds, delivery reports included
    topics: Mapping[str, TopicQueues]
    brokers: Sequence[BrokerStats]
    led: Mapping[str, frozenset[tuple[str, int]]]  # broker name -> partitions it leads
    unroutable: frozenset[tuple[str, int]] = field(default_factory=frozenset)


def parse_statistics(raw: str | bytes, received_at: float | None = None) -> ProducerStats:
    """Parse one librdkafka statistics document (a producer's).

    Raises ``ValueError`` (``json.JSONDecodeError`` included) when it is not one.
    """
    document = json.loads(raw)
    if not isinstance(document, dict) or "brokers" not in document:
        raise ValueError("not a librdkafka statistics document")
    brokers_json: Mapping[str, Any] = document.get("brokers") or {}
    topics_json: Mapping[str, Any] = document.get("topics") or {}
    unsent_share = _unsent_share_by_node(brokers_json)
    led: dict[int, set[tuple[str, int]]] = defaultdict(set)
    topics: dict[str, TopicQueues] = {}
    unroutable: set[tuple[str, int]] = set()
    for name, topic_json in topics_json.items():
        stage = _PartitionStage()
        for partition_json in (topic_json.get("partitions") or {}).values():
            stage = _add_partition(stage, partition_json, unsent_share)
            partition = int(partition_json.get("partition", -1))
            if partition < 0:
                continue  # the unassigned-messages pseudo-partition
            leader = int(partition_json.get("leader", -1))
            if leader >= 0:
                led[leader].add((name, partition))
            if int(partition_json.get("broker", -1)) < 0 and not partition_json.get("unknown"):
                unroutable.add((name, partition))
        topics[name] = _queues(name, stage)
    brokers = tuple(
        _broker(broker_json, len(led.get(int(broker_json.get("nodeid", -1)), ())))
        for broker_json in brokers_json.values()
        if broker_json.get("source") != "internal"
    )
    return ProducerStats(
        producer=str(document.get("name", "")),
        received_at=time.time() if received_at is None else received_at,
        messages=int(document.get("msg_cnt", 0)),
        topics=topics,
        brokers=brokers,
        led={b.name: frozenset(led.get(b.node_id, ())) for b in brokers if b.node_id >= 0},
        unroutable=frozenset(unroutable),
    )


def _unsent_share_by_node(brokers_json: Mapping[str, Any]) -> dict[int, float]:
    """Per broker, the fraction of its in-request messages still in its output buffer."""
    shares: dict[int, float] = {}
    for broker_json in brokers_json.values():
        unsent = int(broker_json.get("outbuf_msg_cnt", 0))
        waiting = int(broker_json.get("waitresp_msg_cnt", 0))
        if unsent + waiting > 0:
            shares[int(broker_json.get("nodeid", -1))] = unsent / (unsent + waiting)
    return shares


def _add_partition(
    stage: _PartitionStage, partition_json: Mapping[str, Any], unsent_share: Mapping[int, float]
) -> _PartitionStage:
    in_requests = int(partition_json.get("msgs_inflight", 0))
    broker = int(partition_json.get("broker", -1))
    return _PartitionStage(
        queued=stage.queued
        + int(partition_json.get("msgq_cnt", 0))
        + int(partition_json.get("xmit_msgq_cnt", 0)),
        in_requests=stage.in_requests + in_requests,
        unsent=stage.unsent + in_requests * unsent_share.get(broker, 0.0),
    )


def _queues(topic: str, stage: _PartitionStage) -> TopicQueues:
    in_requests = round(stage.in_requests)
    send_wait = min(in_requests, round(stage.unsent))
    return TopicQueues(topic, stage.queued, send_wait, in_requests - send_wait)


def _broker(broker_json: Mapping[str, Any], leader_partitions: int) -> BrokerStats:
    rtt = broker_json.get("rtt") or {}
    # Round trips beyond the histogram's range are left out of its percentiles.
    rtt_p99 = rtt.get("max", 0) if rtt.get("outofrange") else rtt.get("p99", 0)
    return BrokerStats(
        node_id=int(broker_json.get("nodeid", -1)),
        name=str(broker_json.get("name", "")),
        state=str(broker_json.get("state", "")),
        rtt_avg_ms=float(rtt.get("avg", 0)) / 1000,
        rtt_p99_ms=float(rtt_p99) / 1000,
        tx_errors=int(broker_json.get("txerrs", 0)),
        rx_errors=int(broker_json.get("rxerrs", 0)),
        request_timeouts=int(broker_json.get("req_timeouts", 0)),
        outbuf_requests=int(broker_json.get("outbuf_cnt", 0)),
        waitresp_requests=int(broker_json.get("waitresp_cnt", 0)),
        leader_partitions=leader_partitions,
        state_age_s=int(broker_json.get("stateage", 0)) / 1_000_000,
        connects=int(broker_json.get("connects", 0)),
        disconnects=int(broker_json.get("disconnects", 0)),
    )


# --- merging producers ---------------------------------------------------------------------


def merge(
    reports: Iterable[ProducerStats], held_by_topic: Mapping[str, int] | None = None
) -> StatsSnapshot:
    """One snapshot from the latest report of each producer.

    ``held_by_topic``, when given, is how many messages of each topic the caller has handed
    to librdkafka and not yet had reported: it replaces librdkafka's partial count of
    messages not yet in a request (see the module docstring).
    """
    reports = list(reports)
    if not reports:
        return EMPTY_SNAPSHOT
    return StatsSnapshot(
        taken_at=max(r.received_at for r in reports),
        topics=_merge_topics(reports, held_by_topic),
        brokers=_merge_brokers(reports),
        producers=len(reports),
        unroutable=frozenset().union(*(r.unroutable for r in reports)),
    )


def _merge_topics(
    reports: Sequence[ProducerStats], held_by_topic: Mapping[str, int] | None
) -> dict[str, TopicQueues]:
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for report in reports:
        for name, queues in report.topics.items():
            total = totals[name]
            total[0] += queues.batch
            total[1] += queues.send_wait
            total[2] += queues.ack_wait
    if held_by_topic is not None:
        for name, held in held_by_topic.items():
            if held <= 0 and name not in totals:
                continue
            total = totals[name]
            # Whatever is held and not in a request is waiting for one.
            total[0] = max(total[0], held - total[1] - total[2])
    return {name: TopicQueues(name, *total) for name, total in sorted(totals.items())}


#: When producers disagree about a broker, the state that says most: a working
#: connection, then a failed one, then one being set up, then none tried.
_STATE_RANK = {**dict.fromkeys(USABLE_STATES, 0), **dict.fromkeys(FAILED_STATES, 1)}
_CONNECTING_RANK = 2
_UNTRIED_RANK = 3


def _state_rank(broker: BrokerStats) -> int:
    if broker.state == UNTRIED_STATE:
        return _UNTRIED_RANK
    return _STATE_RANK.get(broker.state, _CONNECTING_RANK)


def _merge_brokers(reports: Sequence[ProducerStats]) -> tuple[BrokerStats, ...]:
    by_name: dict[str, list[BrokerStats]] = defaultdict(list)
    led: dict[str, set[tuple[str, int]]] = defaultdict(set)
    for report in reports:
        for broker in report.brokers:
            by_name[broker.name].append(broker)
        for name, partitions in report.led.items():
            led[name].update(partitions)
    merged = [_merge_one_broker(views, len(led[name])) for name, views in by_name.items()]
    return tuple(sorted(merged, key=lambda b: (b.node_id < 0, b.node_id, b.name)))


def _merge_one_broker(views: Sequence[BrokerStats], leader_partitions: int) -> BrokerStats:
    telling = min(views, key=_state_rank)
    return BrokerStats(
        node_id=telling.node_id,
        name=telling.name,
        state=telling.state,
        rtt_avg_ms=max(v.rtt_avg_ms for v in views),
        rtt_p99_ms=max(v.rtt_p99_ms for v in views),
        tx_errors=sum(v.tx_errors for v in views),
        rx_errors=sum(v.rx_errors for v in views),
        request_timeouts=sum(v.request_timeouts for v in views),
        outbuf_requests=sum(v.outbuf_requests for v in views),
        waitresp_requests=sum(v.waitresp_requests for v in views),
        leader_partitions=leader_partitions,
        state_age_s=telling.state_age_s,
    )


# --- the live view ---------------------------------------------------------------------------


class KafkaStats:
    """The latest statistics of every producer, merged; owned by the event-loop thread.

    Dispatch feeds it (``update`` / ``forget``); the status pages call ``latest()``;
    ``subscribe`` callbacks run on the loop thread after every update.
    """

    def __init__(self) -> None:
        self._reports: dict[str, ProducerStats] = {}
        self._held_by_topic: Mapping[str, int] | None = None
        self._latest = EMPTY_SNAPSHOT
        self._subscribers: list[Callable[[StatsSnapshot], None]] = []

    def latest(self) -> StatsSnapshot:
        """Merged over every producer; ``EMPTY_SNAPSHOT`` before the first report."""
        return self._latest

    def subscribe(self, callback: Callable[[StatsSnapshot], None]) -> None:
        """Call ``callback(snapshot)`` on the loop thread after every new report."""
        self._subscribers.append(callback)

    def update(
        self, producer: str, report: ProducerStats, held_by_topic: Mapping[str, int] | None = None
    ) -> None:
        """``producer``'s new report; ``held_by_topic`` as in ``merge`` (kept until the next)."""
        self._reports[producer] = report
        if held_by_topic is not None:
            self._held_by_topic = held_by_topic
        self._publish()

    def forget(self, producer: str) -> None:
        """The producer is gone (destroyed or replaced): drop its last report."""
        if self._reports.pop(producer, None) is not None:
            self._publish()

    def _publish(self) -> None:
        self._latest = merge(self._reports.values(), self._held_by_topic)
        for callback in self._subscribers:
            callback(self._latest)
