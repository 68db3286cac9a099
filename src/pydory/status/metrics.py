"""``/metrics``: the daemon's books in Prometheus form, read at scrape time.

Nothing here counts anything. A :class:`DaemonCollector` reads the same books the status
pages read (``Books``, ``MemoryPool``, librdkafka's statistics, the metadata service, the
commit point) each time Prometheus scrapes, so the hot path pays nothing for metrics and
the numbers can never drift from ``/books/json``.

Each daemon gets its own :class:`~prometheus_client.CollectorRegistry`
(:func:`build_registry`) rather than the process-global one, so several daemons in one
process (tests) never collide. The process metrics (CPU seconds, resident memory) come from
prometheus-client's ``ProcessCollector`` under their standard ``process_*`` names, which
every Prometheus dashboard already knows; everything else is ``pydory_*``.

Collectors run on the daemon's event loop (the aiohttp handler calls them), the thread that
owns the books, so a scrape is a consistent snapshot without locks.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.registry import Collector

from pydory import __version__
from pydory.daemon.books import counters as counter_names
from pydory.daemon.books.accounting import TopicTotals
from pydory.daemon.books.events import DiscardReason, Transport
from pydory.daemon.delivery.kafka_stats import USABLE_STATES, BrokerStats

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from pydory.status.view import DaemonView

__all__ = ["QUEUE_STAGES", "DaemonCollector", "build_registry"]

#: The librdkafka queues a message passes through, in order (Dory's /queues names).
QUEUE_STAGES = ("batch", "send_wait", "ack_wait")
#: The listeners that have quotas (pydory.daemon.inputs.stream_connection counts per transport).
QUOTA_TRANSPORTS = (Transport.UNIX_STREAM, Transport.TCP)


def build_registry(view: DaemonView) -> CollectorRegistry:
    """A registry of its own for one daemon: its books and the process metrics."""
    registry = CollectorRegistry()
    registry.register(DaemonCollector(view))
    ProcessCollector(registry=registry)
    return registry


class DaemonCollector(Collector):
    """Reads a running daemon's view into Prometheus metric families at scrape time."""

    def __init__(self, view: DaemonView, clock: Callable[[], float] = time.time) -> None:
        """``clock`` gives epoch seconds (ages are measured against it)."""
        self._view = view
        self._clock = clock

    def collect(self) -> Iterable[Metric]:
        """Every ``pydory_*`` family, freshly read from the books."""
        now = self._clock()
        yield from self._identity()
        yield from self._traffic()
        yield from self._pool()
        yield from self._spool()
        yield from self._overload()
        yield from self._quotas()
        yield from self._config()
        yield from self._queues()
        yield from self._brokers(now)
        yield from self._metadata(now)
        yield from self._commit_point()
        yield from self._events()

    # -- who is this ----------------------------------------------------------------------

    def _identity(self) -> Iterator[Metric]:
        info = InfoMetricFamily("pydory_build", "The pydory version serving these metrics.")
        info.add_metric([], {"version": __version__})
        yield info
        yield GaugeMetricFamily(
            "pydory_start_time_seconds",
            "When the daemon started, in seconds since the epoch.",
            value=self._view.started_at,
        )

    # -- messages -------------------------------------------------------------------------

    def _traffic(self) -> Iterator[Metric]:
        books = self._view.books
        yield _per_transport(
            "pydory_received_messages",
            "Messages framed on each client transport (before admission checks).",
            ((str(transport), n) for transport, n in books.received_by_transport().items()),
        )

        # One reading of the books for every per-topic family; each family is yielded as
        # soon as it is built, so a scraper rendering in slices (status/rendering.py)
        # gives the loop a turn between two.
        per_topic = sorted(books.per_topic().items())
        lifetime_discards = books.lifetime_discards_by_reason()
        for name, family, documentation, value_of in _PER_TOPIC_FAMILIES:
            metric = family(name, documentation, labels=["topic"])
            for topic, totals in per_topic:
                metric.add_metric([topic], value_of(totals))
            yield metric
        yield _discards(dict(per_topic), lifetime_discards)
        yield CounterMetricFamily(
            "pydory_rerouted_messages",
            "Messages sent again to another partition after their partition failed.",
            value=self._view.rerouted(),
        )

    # -- the memory pool (KIP-72 sensors) -------------------------------------------------

    def _pool(self) -> Iterator[Metric]:
        pool = self._view.pool
        gauges = (
            (
                "pydory_pool_budget_bytes",
                "The memory pool's budget (Dory's maxBuffer).",
                pool.budget,
            ),
            ("pydory_pool_used_bytes", "Bytes of messages held by the daemon.", pool.used),
            (
                "pydory_pool_available_bytes",
                "Budget minus used, never below 0.",
                pool.available,
            ),
            (
                "pydory_pool_over_budget_bytes",
                "Bytes held above the budget (KIP-72 over-allocation, or held anyway).",
                pool.over_budget,
            ),
            (
                "pydory_pool_depleted_time_percent",
                "Percentage of the time since start-up that the pool was depleted.",
                pool.percent_time_depleted(),
            ),
        )
        for name, documentation, value in gauges:
            yield GaugeMetricFamily(name, documentation, value=value)
        yield CounterMetricFamily(
            "pydory_pool_depleted_seconds",
            "Seconds the pool spent depleted; rate() of it is the recent share of time.",
            value=pool.depleted_seconds(),
        )

    # -- the spool and the overload policy ------------------------------------------------

    def _spool(self) -> Iterator[Metric]:
        spool = self._view.spool
        if spool is None:
            return
        gauges = (
            (
                "pydory_spool_bytes",
                "Bytes of the spool's segment files on disk.",
                spool.bytes_on_disk,
            ),
            (
                "pydory_spool_max_bytes",
                "The spool's size cap (<spool><maxSize>).",
                spool.max_bytes,
            ),
            ("pydory_spool_segments", "The spool's segment files on disk.", spool.segments),
            (
                "pydory_spool_outstanding_messages",
                "Messages written ahead to the spool and not yet settled.",
                spool.outstanding,
            ),
        )
        for name, documentation, value in gauges:
            yield GaugeMetricFamily(name, documentation, value=value)
        counters = (
            (
                "pydory_spool_appended_messages",
                "Messages written ahead to the spool since start-up.",
                spool.appended_total,
            ),
            ("pydory_spool_fsyncs", "fsync calls made by the spool.", spool.fsyncs_total),
            ("pydory_spool_errors", "Disk errors the spool met.", spool.errors_total),
            (
                "pydory_spool_full_bursts",
                "Read bursts refused by the spool at its size cap.",
                spool.full_total,
            ),
            (
                "pydory_spool_replayed_messages",
                "Messages replayed from the spool at start-up (possible duplicates).",
                self._view.counters.get(counter_names.SPOOL_REPLAYED),
            ),
            (
                "pydory_spool_unprotected_messages",
                "Messages processed without the write-ahead (spool full or failing).",
                self._view.counters.get(counter_names.SPOOL_UNPROTECTED),
            ),
        )
        for name, documentation, value in counters:
            yield CounterMetricFamily(name, documentation, value=value)

    def _overload(self) -> Iterator[Metric]:
        overload = self._view.overload
        if overload is None:
            return
        policy = InfoMetricFamily("pydory_overload_policy", "The overload policy in force.")
        policy.add_metric([], {"policy": overload.policy_name})
        yield policy
        yield GaugeMetricFamily(
            "pydory_overload_paused",
            "1 while the inputs are paused because the memory pool is depleted.",
            value=1 if overload.paused else 0,
        )
        yield CounterMetricFamily(
            "pydory_overload_paused_seconds",
            "Seconds the inputs spent paused for memory (backpressure).",
            value=overload.paused_seconds(),
        )
        yield CounterMetricFamily(
            "pydory_overload_pauses",
            "Times the inputs were paused for memory (backpressure).",
            value=self._view.counters.get(counter_names.BACKPRESSURE_PAUSES),
        )

    # -- the quotas on the stream listeners -----------------------------------------------

    def _quotas(self) -> Iterator[Metric]:
        counters = self._view.counters

        def per_listener(names: Mapping[Transport, str]) -> list[tuple[str, int]]:
            return [(transport, counters.get(names[transport])) for transport in QUOTA_TRANSPORTS]

        # All three read before the first is yielded: one moment's counts.
        families = (
            _per_transport(
                "pydory_quota_refused_connections",
                "Connections closed at once because the listener was at <maxConnections>.",
                per_listener(counter_names.QUOTA_CONNECTIONS_REFUSED),
            ),
            _per_transport(
                "pydory_quota_throttles",
                "Times a client above its <clientRate> had its reads paused.",
                per_listener(counter_names.QUOTA_THROTTLES),
            ),
            _per_transport(
                "pydory_quota_throttled_seconds",
                "Total throttle time imposed on clients above their <clientRate>.",
                [(t, ms / 1000) for t, ms in per_listener(counter_names.QUOTA_THROTTLED_MS)],
            ),
        )
        yield from families

    # -- the config and its reloads ---------------------------------------------------------

    def _config(self) -> Iterator[Metric]:
        """Like Prometheus' own ``prometheus_config_last_reload_successful``."""
        history = self._view.reloads
        if history is None:
            return
        yield GaugeMetricFamily(
            "pydory_config_last_reload_successful",
            "1 if the last config reload succeeded (or none was tried), 0 if it was refused.",
            value=1 if history.last_ok else 0,
        )
        yield GaugeMetricFamily(
            "pydory_config_loaded_timestamp_seconds",
            "When the running config was loaded: start-up or the last successful reload.",
            value=history.loaded_at,
        )
        reloads = CounterMetricFamily(
            "pydory_config_reloads",
            "Config reloads (SIGHUP, pydory reload) by outcome.",
            labels=["outcome"],
        )
        reloads.add_metric(["success"], history.succeeded)
        reloads.add_metric(["failure"], history.failed)
        yield reloads

    # -- librdkafka's queues and brokers --------------------------------------------------

    def _queues(self) -> Iterator[Metric]:
        snapshot = self._view.kafka_stats.latest()
        queued = GaugeMetricFamily(
            "pydory_queue_messages",
            "Messages in librdkafka per topic and stage: batch (not yet in a request), "
            "send_wait (in a produce request not yet sent), "
            "ack_wait (sent, awaiting the broker's ack).",
            labels=["topic", "stage"],
        )
        for topic, queues in sorted(snapshot.topics.items()):
            queued.add_metric([topic, "batch"], queues.batch)
            queued.add_metric([topic, "send_wait"], queues.send_wait)
            queued.add_metric([topic, "ack_wait"], queues.ack_wait)
        yield queued
        yield GaugeMetricFamily(
            "pydory_queue_new_messages",
            "Messages received, not yet handed to librdkafka: waiting for the first "
            "metadata or for a topic's creation.",
            value=self._view.pending_topic_messages(),
        )
        yield GaugeMetricFamily(
            "pydory_kafka_stats_age_seconds",
            "Seconds since librdkafka's statistics behind the queue and broker metrics.",
            value=max(0.0, self._clock() - snapshot.taken_at) if snapshot.producers else 0.0,
        )

    def _brokers(self, now: float) -> Iterator[Metric]:
        brokers = [b for b in self._view.kafka_stats.latest().brokers if b.node_id >= 0]
        labels = ["broker", "node_id"]
        families = {
            name: family(name, documentation, labels=labels)
            for name, (family, documentation) in _BROKER_FAMILIES.items()
        }
        state = GaugeMetricFamily(
            "pydory_broker_state",
            "1 for the broker's current librdkafka state (UP, DOWN, CONNECT, ...).",
            labels=[*labels, "state"],
        )
        for broker in brokers:
            key = [broker.name, str(broker.node_id)]
            for name, value in _broker_values(broker).items():
                families[name].add_metric(key, value)
            state.add_metric([*key, broker.state], 1)
        yield from families.values()
        yield state

    # -- metadata -------------------------------------------------------------------------

    def _metadata(self, now: float) -> Iterator[Metric]:
        metadata = self._view.metadata
        updated_ms, modified_ms = metadata.last_updated_ms, metadata.last_modified_ms
        yield GaugeMetricFamily(
            "pydory_metadata_known",
            "1 once a metadata fetch has succeeded; 0: no metadata yet (no broker has "
            "answered since start-up; what the inputs read waits in the memory pool).",
            value=0 if updated_ms is None else 1,
        )
        if updated_ms is not None:
            yield GaugeMetricFamily(
                "pydory_metadata_last_updated_timestamp_seconds",
                "When cluster metadata was last fetched.",
                value=updated_ms / 1000,
            )
            yield GaugeMetricFamily(
                "pydory_metadata_age_seconds",
                "Seconds since cluster metadata was last fetched.",
                value=max(0.0, now - updated_ms / 1000),
            )
        if modified_ms is not None:
            yield GaugeMetricFamily(
                "pydory_metadata_last_modified_timestamp_seconds",
                "When a metadata fetch last changed the routing.",
                value=modified_ms / 1000,
            )
        yield CounterMetricFamily(
            "pydory_metadata_fetch_failures",
            "Metadata fetches that no broker answered.",
            value=metadata.fetch_failures,
        )

    # -- the commit point -----------------------------------------------------------------

    def _commit_point(self) -> Iterator[Metric]:
        # current() first looks whether the input sockets are empty (one poll(2)), so an
        # idle daemon reports a lag near zero rather than the time since the last reader.
        view = self._view.commit_point.current()
        yield GaugeMetricFamily(
            "pydory_commit_point_timestamp_seconds",
            "The commit point: every message received before it is settled.",
            value=view.commit_point,
        )
        yield GaugeMetricFamily(
            "pydory_commit_point_lag_seconds",
            "How far the commit point is behind now.",
            value=view.lag_s,
        )
        yield GaugeMetricFamily(
            "pydory_commit_point_open_messages",
            "Accepted messages the commit point waits for (neither delivered nor discarded).",
            value=view.open_messages,
        )

    # -- Dory's event counters ------------------------------------------------------------

    def _events(self) -> Iterator[Metric]:
        events = CounterMetricFamily(
            "pydory_events",
            "Every internal event counter, as /counters lists them.",
            labels=["event"],
        )
        # Every fixed name from the first scrape (a series that appears late loses its
        # first increase to rate()), then the open-ended families as they appear.
        counts = self._view.counters.snapshot()
        for name, value in {**dict.fromkeys(counter_names.EVERY_COUNTER, 0), **counts}.items():
            events.add_metric([name], value)
        yield events


_PER_TOPIC_FAMILIES: tuple[
    tuple[str, type[CounterMetricFamily | GaugeMetricFamily], str, Callable[[TopicTotals], int]],
    ...,
] = (
    (
        "pydory_accepted_messages",
        CounterMetricFamily,
        "Messages that passed admission; the daemon answers for them from then on.",
        lambda totals: totals.accepted,
    ),
    (
        "pydory_delivered_messages",
        CounterMetricFamily,
        "Accepted messages that Kafka acknowledged.",
        lambda totals: totals.delivered,
    ),
    (
        "pydory_in_flight_messages",
        GaugeMetricFamily,
        "Accepted messages neither acknowledged nor discarded yet.",
        lambda totals: totals.in_flight,
    ),
)


def _per_transport(
    name: str, documentation: str, values: Iterable[tuple[str, float]]
) -> CounterMetricFamily:
    """A counter family with one sample per client transport: (transport, value) pairs."""
    family = CounterMetricFamily(name, documentation, labels=["transport"])
    for transport, value in values:
        family.add_metric([transport], value)
    return family


def _discards(
    per_topic: Mapping[str, TopicTotals], lifetime: Mapping[DiscardReason, int]
) -> CounterMetricFamily:
    """Discards by reason and topic; ``topic=""`` holds those with no usable topic
    (malformed, bad topic names, ...), so ``sum by (reason)`` gives every discard once."""
    family = CounterMetricFamily(
        "pydory_discarded_messages",
        'Discarded messages by reason and topic (topic="" when the message had none).',
        labels=["reason", "topic"],
    )
    with_topic = dict.fromkeys(DiscardReason, 0)
    for topic, totals in sorted(per_topic.items()):
        for reason, count in totals.discarded_by_reason.items():
            family.add_metric([str(reason), topic], count)
            with_topic[reason] += count
    for reason, count in lifetime.items():
        family.add_metric([str(reason), ""], count - with_topic[reason])
    return family


_BROKER_FAMILIES: dict[str, tuple[type[GaugeMetricFamily | CounterMetricFamily], str]] = {
    "pydory_broker_up": (
        GaugeMetricFamily,
        "1 if librdkafka's connection to the broker carries requests (state UP or UPDATE).",
    ),
    "pydory_broker_rtt_avg_seconds": (
        GaugeMetricFamily,
        "Average request round-trip time over librdkafka's last statistics window.",
    ),
    "pydory_broker_rtt_p99_seconds": (
        GaugeMetricFamily,
        "99th percentile request round-trip time over the last statistics window.",
    ),
    "pydory_broker_tx_errors": (CounterMetricFamily, "Request transmit errors."),
    "pydory_broker_rx_errors": (CounterMetricFamily, "Response receive errors."),
    "pydory_broker_request_timeouts": (CounterMetricFamily, "Requests that timed out."),
    "pydory_broker_outbuf_requests": (GaugeMetricFamily, "Requests waiting to be sent."),
    "pydory_broker_waitresp_requests": (GaugeMetricFamily, "Requests awaiting a response."),
    "pydory_broker_leader_partitions": (
        GaugeMetricFamily,
        "Partitions of the daemon's topics this broker leads.",
    ),
}


def _broker_values(broker: BrokerStats) -> dict[str, float]:
    """One broker's value for each of :data:`_BROKER_FAMILIES`, in seconds where timed."""
    return {
        "pydory_broker_up": 1.0 if broker.state in USABLE_STATES else 0.0,
        "pydory_broker_rtt_avg_seconds": broker.rtt_avg_ms / 1000,
        "pydory_broker_rtt_p99_seconds": broker.rtt_p99_ms / 1000,
        "pydory_broker_tx_errors": broker.tx_errors,
        "pydory_broker_rx_errors": broker.rx_errors,
        "pydory_broker_request_timeouts": broker.request_timeouts,
        "pydory_broker_outbuf_requests": broker.outbuf_requests,
        "pydory_broker_waitresp_requests": broker.waitresp_requests,
        "pydory_broker_leader_partitions": broker.leader_partitions,
    }
