"""Dispatch: the librdkafka producers, their delivery reports, reroutes and the final word on
every accepted message.

librdkafka (seed 003) does the network work: its broker threads batch, compress, send and
retry. This module only decides *which* producer a message goes to, maps Dory's settings
onto librdkafka properties (docs/librdkafka-mapping.md), and turns each delivery report
into one outcome on the ``Ledger``: delivered, rerouted, or discarded with a reason.

Threads: everything runs on the event-loop thread, librdkafka's own C threads aside.
The loop serves each producer's callbacks with ``poll(0)``, which never blocks: once after
every burst of sends (``call_soon``), then every BUSY_POLL_INTERVAL_S while librdkafka
holds messages, and every IDLE_POLL_INTERVAL_S otherwise (statistics, librdkafka's log
lines and fatal errors also arrive through ``poll``). A delivery callback only appends to
a queue; the loop then settles the queue in one batch: acknowledgements counted per topic
and per commit-point token, failures one by one (reroute or discard). The statistics
(``kafka_stats``) also tell the router which brokers it cannot reach; a fatal error
retires the producer and a new one replaces it. Only a producer being closed (shutdown,
or after a fatal error) is served by a thread of its own: it flushes, purges, and hands
its reports to the loop in batches.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from confluent_kafka import KafkaError, KafkaException, Producer

from pydory.daemon.books.accounting import Counters, DiscardReason
from pydory.daemon.books.msg_debug import MsgDebug
from pydory.daemon.delivery.kafka_stats import (
    STATS_INTERVAL_MS,
    KafkaStats,
    ProducerStats,
    StatsSnapshot,
    parse_statistics,
)
from pydory.daemon.delivery.router import NO_LEADER, Router
from pydory.errors import ConfigError, PydoryError

log = logging.getLogger(__name__)

#: librdkafka's per-attempt deadline for a message (``message.timeout.ms``) unless the
#: config's <librdkafka> section sets one. A message whose partition has no leader waits
#: this long in librdkafka before coming back to us for a reroute.
DEFAULT_MESSAGE_TIMEOUT_MS = 30_000
#: Used for ``linger.ms`` when Dory's batching ``time`` is "disable": librdkafka needs a
#: finite linger, smaller than message.timeout.ms.
DISABLED_TIME_LINGER_MS = 10_000
#: Added to Dory's produceRequestDataLimit (key+value bytes) to allow for protocol overhead.
REQUEST_OVERHEAD_BYTES = 64 * 1024
#: Bytes charged to the memory pool for a message besides its topic, key and value.
POOL_OVERHEAD_BYTES = 32
#: While librdkafka holds messages, the longest the loop goes without serving their
#: reports (besides the poll after every burst of sends).
BUSY_POLL_INTERVAL_S = 0.005
#: With nothing held, the loop still polls this often: statistics (broker liveness),
#: librdkafka's log lines and a fatal error arrive only through poll().
IDLE_POLL_INTERVAL_S = STATS_INTERVAL_MS / 1000
#: At shutdown, how often the flush looks again at its deadline.
FLUSH_STEP_S = 0.1
#: At shutdown, the time it takes to report one message still held (the closing thread
#: serving its report and the loop settling it in the books): 7-8 us measured here for a
#: purge of 50,000 messages, more on a loaded machine. The flush stops
#: early by that much per message held, so that shutdownMaxDelay bounds the reporting too,
#: not only the flush ...
SETTLE_TIME_PER_MESSAGE_S = 30e-6
#: ... but the flush always gets at least this share of shutdownMaxDelay.
MIN_FLUSH_SHARE = 0.5
#: After a purge, how long the poller waits for librdkafka to report the purged messages.
PURGE_REPORTS_WAIT_S = 2.0

# Errors after which the message may already be in the log: a resend may duplicate it.
_POSSIBLY_PERSISTED = frozenset({KafkaError._MSG_TIMED_OUT, KafkaError.REQUEST_TIMED_OUT})

# Errors that mean "we are shutting down and ran out of time", not a Kafka verdict.
_PURGED = frozenset({KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT})
# Kafka-side verdicts that no resend will change (Dory: Discard).
_PERMANENT = frozenset(
    {
        KafkaError.MSG_SIZE_TOO_LARGE,
        KafkaError.INVALID_MSG_SIZE,
        KafkaError.RECORD_LIST_TOO_LARGE,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.CLUSTER_AUTHORIZATION_FAILED,
        KafkaError.TOPIC_EXCEPTION,
        KafkaError.INVALID_RECORD,
        KafkaError.UNSUPPORTED_FOR_MESSAGE_FORMAT,
        KafkaError.INVALID_REQUIRED_ACKS,
        KafkaError.POLICY_VIOLATION,
    }
)


def pool_cost(topic: str, key: bytes | None, value: bytes | None) -> int:
    """Bytes a message holds in the memory pool from acceptance to its final outcome."""
    return len(topic) + len(key or b"") + len(value or b"") + POOL_OVERHEAD_BYTES


class EnqueueRefused(PydoryError):
    """librdkafka refused a message at ``produce()``: it never left the daemon."""

    def __init__(self, reason: DiscardReason, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True, slots=True)
class Delivered:
    """A batch of messages Kafka acknowledged: how many per topic and per token (the
    caller's opaque int given to ``send``), and the pool bytes they held in all."""

    by_topic: Mapping[str, int]
    by_token: Mapping[int, int]
    cost: int


class Ledger(Protocol):
    """Where dispatch reports each message's final outcome (the daemon's books and pool)."""

    def delivered(self, batch: Delivered) -> None: ...

    def discarded(
        self,
        reason: DiscardReason,
        topic: str,
        timestamp_ms: int,
        detail: str,
        cost: int,
        token: int,
    ) -> None: ...

    def possible_duplicate(self, topic: str, timestamp_ms: int) -> None: ...


@dataclass(frozen=True, slots=True)
class ProducerProfile:
    """The librdkafka settings that differ between topics: one producer per distinct profile."""

    linger_ms: int
    batch_messages: int
    batch_bytes: int
    compression: str = "none"
    compression_level: int | None = None

    def properties(self) -> dict[str, Any]:
        props: dict[str, Any] = {
            "linger.ms": self.linger_ms,
            # A message gets DEFAULT_MESSAGE_TIMEOUT_MS beyond its linger: librdkafka insists
            # that a message may wait longer than it lingers.
            "message.timeout.ms": self.linger_ms + DEFAULT_MESSAGE_TIMEOUT_MS,
            "batch.num.messages": self.batch_messages,
            "batch.size": self.batch_bytes,
            "compression.type": self.compression,
        }
        if self.compression_level is not None:
            props["compression.level"] = self.compression_level
        return props


@dataclass(frozen=True, slots=True)
class DeliverySettings:
    """Settings common to every producer (from <kafkaConfig>, <msgDelivery>, <batching>)."""

    bootstrap_servers: str
    client_id: str = "pydory"
    replication_timeout_ms: int = 10_000
    socket_timeout_ms: int = 60_000
    message_max_bytes: int = 1_000_000
    produce_request_data_limit: int = 1024 * 1024
    max_failed_delivery_attempts: int = 5
    queue_max_bytes: int = 128 * 1024 * 1024
    extra: Mapping[str, str] = field(default_factory=dict)

    def properties(self) -> dict[str, Any]:
        props: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap_servers,
            "client.id": self.client_id,
            "enable.idempotence": True,
            "request.timeout.ms": self.replication_timeout_ms,
            "socket.timeout.ms": self.socket_timeout_ms,
            "message.max.bytes": self.produce_request_data_limit + REQUEST_OVERHEAD_BYTES,
            "retries": max(1, self.max_failed_delivery_attempts),
            # The memory pool (maxBuffer) is the real limit; librdkafka's queue must never
            # refuse before it does.
            "queue.buffering.max.messages": 2_147_483_647,
            "queue.buffering.max.kbytes": min(2_147_483_647, 2 * self.queue_max_bytes // 1024),
            "logger": logging.getLogger("pydory.librdkafka"),
        }
        props.update(self.extra)  # TLS, SASL, ...: every client of the cluster needs them
        return props


# A failed delivery report waiting for the loop: the error, the message, the timestamp it
# was sent with (librdkafka reports a failed message without one), its PartitionKey (None
# for AnyPartition), how many times it has been sent, the caller's token (an opaque int
# given to ``send``, returned to the ledger with the outcome: the commit point's epoch),
# and the producer that reported it.
_Failure = tuple[Any, Any, int, "int | None", int, int, "_ProducerHandle"]
# A successful delivery report: the message and its token.
_Ack = tuple[Any, int]


class _Reports:
    """Delivery reports waiting for the loop to settle them.

    librdkafka's delivery callbacks only append here, on whichever thread serves them (the
    loop while the daemon runs, a closing thread at shutdown): appends to a deque are
    atomic, and every decision is taken later, on the loop, a batch at a time.
    """

    __slots__ = ("acks", "failures")

    def __init__(self) -> None:
        self.acks: collections.deque[_Ack] = collections.deque()
        self.failures: collections.deque[_Failure] = collections.deque()

    def __len__(self) -> int:
        return len(self.acks) + len(self.failures)


class _ProducerHandle:
    """One librdkafka producer, served on the loop until it is stopped.

    While the daemon runs, the dispatcher serves this producer's callbacks on the loop
    thread with :meth:`serve` (``poll(0)``: never blocks). :meth:`request_stop` hands the
    producer to a closing thread of its own, which flushes it until a deadline, purges
    what is left, collects those reports and destroys the instance; ``finished`` is then
    set on the loop.
    """

    def __init__(
        self,
        name: str,
        profile: ProducerProfile,
        properties: dict[str, Any],
        reports: _Reports,
        on_reports: Callable[[], None],
        on_statistics: Callable[[_ProducerHandle, ProducerStats], None] | None,
        on_fatal: Callable[[_ProducerHandle], None],
    ):
        self.name = name
        self.profile = profile
        self._ack = reports.acks.append
        self._fail = reports.failures.append
        self._on_reports = on_reports
        self._on_statistics = on_statistics
        self._on_fatal = on_fatal
        if on_statistics is not None:
            properties = {
                "statistics.interval.ms": STATS_INTERVAL_MS,
                **properties,
                "stats_cb": self._statistics,
            }
        self.producer: Producer | None = Producer(properties)
        # Set (once) when librdkafka reports a fatal error: the instance is unusable and
        # everything it still holds fails.
        self.fatal_error: str | None = None
        self.retired = False  # the dispatcher no longer sends through it
        self.stopping = False  # handed to its closing thread: the loop no longer serves it
        # One callback per (token, timestamp) for first-attempt AnyPartition messages (the
        # hot path): tokens are coarse epochs and a burst's messages mostly share their
        # millisecond, so this stays small and saves a partial per message.
        self.first_attempt_callbacks: dict[tuple[int, int], Callable[[Any, Any], None]] = {}
        self._flush_until: Callable[[], float] = time.monotonic
        self.finished: asyncio.Future[None] | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.finished = loop.create_future()
        self._loop = loop

    def first_attempt_callback(self, token: int, timestamp_ms: int) -> Callable[[Any, Any], None]:
        """The delivery callback of a first-attempt AnyPartition message under ``token``
        (cached in ``first_attempt_callbacks``, which ``send`` reads first)."""
        cache_key = (token, timestamp_ms)
        callback = self.first_attempt_callbacks.get(cache_key)
        if callback is None:
            if len(self.first_attempt_callbacks) > 1024:
                self.first_attempt_callbacks.clear()
            callback = functools.partial(self.on_delivery, None, 1, token, timestamp_ms)
            self.first_attempt_callbacks[cache_key] = callback
        return callback

    # -- callbacks: on the loop thread while running, on the closing thread after ----------

    # librdkafka calls this from poll() or flush(), once per message.
    def on_delivery(
        self,
        partition_key: int | None,
        attempt: int,
        token: int,
        timestamp_ms: int,
        err: Any,
        msg: Any,
    ) -> None:
        if err is None:
            self._ack((msg, token))
        else:
            self._fail((err, msg, timestamp_ms, partition_key, attempt, token, self))

    def _statistics(self, raw: str) -> None:
        # About once a second per producer: parsed where it arrives, so that the loop
        # only ever receives a small frozen ProducerStats (or nothing, if unreadable).
        try:
            report = parse_statistics(raw)
        except ValueError as exc:
            log.warning("producer %s: unreadable librdkafka statistics: %s", self.name, exc)
            return
        assert self._on_statistics is not None
        self._loop.call_soon_threadsafe(self._on_statistics, self, report)

    def serve(self) -> None:
        """Loop thread: serve the callbacks librdkafka has ready, without waiting."""
        if not self.stopping and self.producer is not None:
            self._serve_callbacks(self.producer.poll, 0)

    def _serve_callbacks(self, serve: Callable[[float], object], timeout_s: float) -> None:
        """``producer.poll`` or ``producer.flush``: both serve callbacks, and both raise
        a fatal error (confluent-kafka never passes one to error_cb)."""
        try:
            serve(timeout_s)
        except KafkaException as exc:
            error = exc.args[0]
        else:
            return
        if not error.fatal():
            log.warning("producer %s: %s", self.name, error.str())
        elif self.fatal_error is None:
            self.fatal_error = error.name()
            log.error("producer %s: fatal librdkafka error: %s", self.name, error.str())
            self._loop.call_soon_threadsafe(self._on_fatal, self)

    # -- the closing thread -----------------------------------------------------------------

    def request_stop(self, flush_until: Callable[[], float]) -> None:
        """Loop thread: stop serving this producer on the loop and close it on a thread of
        its own: flush until ``flush_until()`` (a monotonic time, asked again as the flush
        goes on), purge what is left, destroy it. Its reports reach the loop in batches."""
        if self.stopping:
            # Already closing (retired by a reload, flushing without a deadline): the
            # shutdown's deadline applies to it too.
            earlier = self._flush_until
            self._flush_until = lambda: min(earlier(), flush_until())
            return
        self.stopping = True
        self._flush_until = flush_until
        threading.Thread(target=self._close, name=f"pydory-close-{self.name}", daemon=True).start()

    def _close(self) -> None:
        try:
            if self.producer is not None:
                self._drain(self.producer)
        finally:
            self._destroy_producer()
            self._on_reports()
            self._loop.call_soon_threadsafe(self._set_finished)

    def _drain(self, producer: Producer) -> None:
        """Deliver what can be delivered until the flush deadline, then purge the rest
        (their reports come back as _PURGE_QUEUE / _PURGE_INFLIGHT and become discards)."""
        while len(producer) and (left := self._flush_until() - time.monotonic()) > 0:
            self._serve_callbacks(producer.flush, min(left, FLUSH_STEP_S))
            self._on_reports()
        if not len(producer):
            return
        log.warning("producer %s: %d messages undelivered at shutdown", self.name, len(producer))
        # Non-blocking: purged messages are reported at once; blocking would also wait for
        # every broker thread to take note of the purge.
        producer.purge(in_queue=True, in_flight=True, blocking=False)
        give_up = time.monotonic() + PURGE_REPORTS_WAIT_S
        while len(producer) and time.monotonic() < give_up:
            self._serve_callbacks(producer.poll, 0.05)  # collects the purge reports
        if len(producer):
            log.error(
                "producer %s: %d messages still unreported after the purge",
                self.name,
                len(producer),
            )

    def _destroy_producer(self) -> None:
        """Destroy the librdkafka instance here, on the closing thread, so that several
        producers tear down in parallel and the event loop never waits for one."""
        started = time.monotonic()
        self.producer = None  # the last reference: rd_kafka_destroy() runs now
        log.debug("producer %s destroyed in %.3f s", self.name, time.monotonic() - started)

    def _set_finished(self) -> None:
        if self.finished is not None and not self.finished.done():
            self.finished.set_result(None)

    # -- any thread -----------------------------------------------------------------------

    def queue_length(self) -> int:
        producer = self.producer
        return len(producer) if producer is not None else 0


class Dispatcher:
    """Owns the producers; sends accepted messages and settles their delivery reports."""

    def __init__(
        self,
        settings: DeliverySettings,
        profile_for: Callable[[str], ProducerProfile],
        router: Router,
        ledger: Ledger,
        on_partition_trouble: Callable[[], None] = lambda: None,
        stats: KafkaStats | None = None,
        counters: Counters | None = None,
        in_flight_by_topic: Callable[[], Mapping[str, int]] | None = None,
        msg_debug: MsgDebug | None = None,
    ) -> None:
        """``in_flight_by_topic`` (the books' count of accepted, unsettled messages per
        topic) lets the statistics tell how many messages wait for a produce request."""
        self._settings = settings
        self._profile_for = profile_for
        self._router = router
        self._ledger = ledger
        self._on_partition_trouble = on_partition_trouble
        self._stats = stats
        self._counters = counters if counters is not None else Counters()
        self._max_attempts = max(1, settings.max_failed_delivery_attempts)
        self._by_profile: dict[ProducerProfile, _ProducerHandle] = {}
        self._by_topic: dict[str, _ProducerHandle] = {}
        self._retired: set[_ProducerHandle] = set()  # replaced, still settling what they held
        self._handles_created = 0
        self._reports = _Reports()
        self._drain_scheduled = False  # a closing thread asked the loop to settle reports
        self._poll_scheduled = False  # a poll runs once the callbacks in progress are done
        self._poll_timer: asyncio.TimerHandle | None = None
        self._in_flight_by_topic = in_flight_by_topic
        self._msg_debug = msg_debug if msg_debug is not None else MsgDebug.disabled()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.rerouted = 0
        self._closing = False
        if stats is not None:
            stats.subscribe(self._apply_liveness)

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._arm_poll_timer(IDLE_POLL_INTERVAL_S)

    # -- sending (loop thread) ---------------------------------------------------------

    def send(
        self,
        topic: str,
        partition: int,
        value: bytes,
        key: bytes | None,
        timestamp_ms: int,
        partition_key: int | None = None,
        attempt: int = 1,
        token: int = 0,
    ) -> None:
        """Hand one message to librdkafka; its outcome reaches the ledger later, with
        ``token``.

        Raises ``EnqueueRefused`` when librdkafka refuses it at once (queue full, too
        large): the caller decides what that refusal means for its books.
        """
        handle = self._by_topic.get(topic) or self._handle_for(topic)
        if handle is not None and handle.fatal_error is not None:
            # A poll saw a fatal error that the loop has not handled yet.
            self._replace(handle)
            handle = self._by_topic.get(topic) or self._handle_for(topic)
        producer = handle.producer if handle is not None else None
        if handle is None or producer is None:
            raise EnqueueRefused(DiscardReason.KAFKA_ERROR, "producer unavailable")
        try:
            if partition_key is None and attempt == 1:
                callback = handle.first_attempt_callbacks.get(
                    (token, timestamp_ms)
                ) or handle.first_attempt_callback(token, timestamp_ms)
            else:
                callback = functools.partial(
                    handle.on_delivery, partition_key, attempt, token, timestamp_ms
                )
            producer.produce(
                topic, value, key, partition, on_delivery=callback, timestamp=timestamp_ms
            )
        except BufferError:
            raise EnqueueRefused(DiscardReason.NO_MEMORY, "librdkafka queue full") from None
        except KafkaException as exc:
            err = exc.args[0]
            if err.code() == KafkaError.MSG_SIZE_TOO_LARGE:
                raise EnqueueRefused(DiscardReason.TOO_LONG, err.name()) from None
            raise EnqueueRefused(DiscardReason.KAFKA_ERROR, err.name()) from None
        if not self._poll_scheduled:
            self._poll_scheduled = True
            assert self._loop is not None, "Dispatcher.start() was not called"
            self._loop.call_soon(self._poll)

    def prepare(self, topics: Iterable[str]) -> None:
        """Create the producers these topics need now, so that a librdkafka property it
        refuses stops start-up (raises ConfigError) instead of failing the first message."""
        for topic in topics:
            profile = self._profile_for(topic)
            if profile not in self._by_profile:
                try:
                    self._by_profile[profile] = self._new_handle(profile)
                except KafkaException as exc:
                    raise ConfigError(
                        f"librdkafka refuses the producer settings for topic {topic!r}: "
                        f"{exc.args[0].str()}"
                    ) from None

    def _handle_for(self, topic: str) -> _ProducerHandle | None:
        profile = self._profile_for(topic)
        handle = self._by_profile.get(profile)
        if handle is None:
            try:
                handle = self._by_profile[profile] = self._new_handle(profile)
            except KafkaException:
                log.exception("cannot create a producer for topic %s", topic)
                return None
        self._by_topic[topic] = handle
        return handle

    def _new_handle(self, profile: ProducerProfile) -> _ProducerHandle:
        name = f"p{self._handles_created}"
        # The config's <librdkafka> section has the last word (e.g. message.timeout.ms).
        properties = {**self._settings.properties(), **profile.properties(), **self._settings.extra}
        handle = _ProducerHandle(
            name,
            profile,
            properties,
            self._reports,
            self._reports_waiting,
            self._take_statistics if self._stats is not None else None,
            self._replace,
        )
        self._handles_created += 1
        assert self._loop is not None, "Dispatcher.start() was not called"
        handle.start(self._loop)
        log.info("producer %s: %s", name, profile.properties())
        return handle

    # -- config reload (loop thread) -----------------------------------------------------

    def reconfigure(
        self,
        settings: DeliverySettings,
        profile_for: Callable[[str], ProducerProfile],
        topics: Iterable[str],
    ) -> None:
        """A config reload: from now on messages go to producers with the new settings.

        The producers the new config needs for ``topics`` and for every topic seen so far
        are created first; a producer whose settings did not change is kept. If librdkafka
        refuses a new one, nothing changes (raises ConfigError). A producer no longer
        needed is retired, not purged: a closing thread flushes it until it holds nothing
        (librdkafka's message.timeout.ms bounds that), and its delivery reports settle as
        always -- a failure rerouted through the new producers -- so no message is lost,
        sent twice by us, or counted twice.
        """
        keep = settings == self._settings
        wanted: dict[ProducerProfile, _ProducerHandle] = {}
        created: list[_ProducerHandle] = []
        previous_settings, self._settings = self._settings, settings  # _new_handle reads it
        try:
            for topic in dict.fromkeys([*topics, *self._by_topic]):
                profile = profile_for(topic)
                if profile in wanted:
                    continue
                handle = self._by_profile.get(profile) if keep else None
                if handle is None or handle.fatal_error is not None:
                    handle = self._new_handle(profile)
                    created.append(handle)
                wanted[profile] = handle
        except KafkaException as exc:
            self._settings = previous_settings
            for handle in created:
                handle.request_stop(time.monotonic)  # never sent anything
            raise ConfigError(
                f"librdkafka refuses the new producer settings: {exc.args[0].str()}"
            ) from None
        retiring = [h for h in self._by_profile.values() if h not in wanted.values()]
        self._profile_for = profile_for
        self._max_attempts = max(1, settings.max_failed_delivery_attempts)
        self._by_profile = wanted
        self._by_topic = {}  # each topic finds its producer again with its next message
        for handle in retiring:
            self._retire(handle)
        if retiring:
            log.info(
                "config reload: producers %s retired (they deliver what they hold), %s new",
                [h.name for h in retiring],
                [h.name for h in created],
            )

    def _retire(self, handle: _ProducerHandle) -> None:
        """Stop sending through ``handle``; let it deliver what it holds, then close."""
        handle.retired = True
        self._retired.add(handle)
        handle.request_stop(lambda: float("inf"))
        assert handle.finished is not None
        handle.finished.add_done_callback(lambda _: self._retired.discard(handle))
        if self._stats is not None:
            self._stats.forget(handle.name)
        self._counters.inc("producers_retired")

    # -- fatal errors (loop thread) ------------------------------------------------------

    def _replace(self, handle: _ProducerHandle) -> None:
        """A fatal error made ``handle``'s producer unusable (librdkafka: the instance must
        be destroyed). Retire it: what it still holds comes back and is discarded with
        reason kafka_error; its topics move to a new producer with the same profile."""
        if handle.retired:
            return
        handle.retired = True
        self._retired.add(handle)
        handle.request_stop(time.monotonic)  # nothing to wait for: purge at once
        assert handle.finished is not None
        handle.finished.add_done_callback(lambda _: self._retired.discard(handle))
        if self._stats is not None:
            self._stats.forget(handle.name)
        topics = [topic for topic, h in self._by_topic.items() if h is handle]
        for topic in topics:
            del self._by_topic[topic]
        if self._by_profile.get(handle.profile) is handle:
            del self._by_profile[handle.profile]
        if self._closing:
            return
        self._counters.inc("producer_recreated")
        log.error(
            "producer %s failed (%s): replacing it; its messages are discarded as kafka_error",
            handle.name,
            handle.fatal_error,
        )
        try:
            replacement = self._by_profile[handle.profile] = self._new_handle(handle.profile)
        except KafkaException:
            log.exception(
                "cannot recreate producer %s; the next message will try again", handle.name
            )
            return
        for topic in topics:
            self._by_topic[topic] = replacement

    # -- statistics and broker liveness (loop thread) -----------------------------------

    def _take_statistics(self, handle: _ProducerHandle, report: ProducerStats) -> None:
        if self._stats is not None and not handle.retired:
            in_flight = self._in_flight_by_topic() if self._in_flight_by_topic else None
            self._stats.update(handle.name, report, in_flight)

    def _apply_liveness(self, snapshot: StatsSnapshot) -> None:
        """Route around brokers librdkafka cannot reach and partitions it has no broker
        for. Any change also asks for fresh metadata: leaders may have moved, and the
        daemon's own copy must learn that a broker left the cluster or came back."""
        before = self._router.unavailable_brokers
        unreachable = snapshot.unreachable_brokers()
        if not self._router.set_unavailable(unreachable, snapshot.unroutable):
            return
        if lost := unreachable - before:
            log.warning("brokers %s unreachable: routing around their partitions", sorted(lost))
        if back := before - unreachable:
            log.info("brokers %s reachable again", sorted(back))
        self._on_partition_trouble()

    # -- delivery reports (served and settled on the loop thread) ----------------------

    def _poll(self) -> None:
        """Serve every running producer's ready callbacks, settle the reports, and come
        back soon if librdkafka still holds messages (else at the idle pace)."""
        self._poll_scheduled = False
        for handle in list(self._by_profile.values()):
            handle.serve()
        self._drain_reports()
        busy = self.in_librdkafka() > 0
        self._arm_poll_timer(BUSY_POLL_INTERVAL_S if busy else IDLE_POLL_INTERVAL_S)

    def _arm_poll_timer(self, delay_s: float) -> None:
        """Make sure a poll happens within ``delay_s`` (one timer, moved earlier if need be)."""
        loop = self._loop
        if loop is None or self._closing:
            return
        due = loop.time() + delay_s
        timer = self._poll_timer
        if timer is not None:
            if timer.when() <= due:
                return
            timer.cancel()
        self._poll_timer = loop.call_at(due, self._on_poll_timer)

    def _on_poll_timer(self) -> None:
        self._poll_timer = None
        self._poll()

    def _reports_waiting(self) -> None:
        """Any thread (a closing producer's): have the loop settle the reports waiting."""
        if not self._drain_scheduled and self._loop is not None:
            self._drain_scheduled = True
            with contextlib.suppress(RuntimeError):  # the loop is gone: nothing to settle
                self._loop.call_soon_threadsafe(self._drain_reports)

    def _drain_reports(self) -> None:
        """Settle every report waiting: acknowledgements as one batch, per topic and per
        token, then failures one by one (each needs its own decision)."""
        self._drain_scheduled = False
        acks = self._reports.acks
        if acks:
            self._settle_acks(acks)
        failures = self._reports.failures
        while failures:
            self._settle_failure(*failures.popleft())

    def _settle_acks(self, acks: collections.deque[_Ack]) -> None:
        if self._msg_debug.active:  # one check per batch
            self._trace_acks(acks)
        by_topic: dict[str, int] = {}
        by_token: dict[int, int] = {}
        cost = 0
        pop = acks.popleft
        while acks:
            msg, token = pop()
            topic = msg.topic()
            key = msg.key()
            by_topic[topic] = by_topic.get(topic, 0) + 1
            by_token[token] = by_token.get(token, 0) + 1
            # len(msg) is the value's length, without copying it out.
            cost += len(topic) + len(msg) + (len(key) if key else 0) + POOL_OVERHEAD_BYTES
        self._ledger.delivered(Delivered(by_topic, by_token, cost))

    def _trace_acks(self, acks: collections.deque[_Ack]) -> None:
        """Message debugging: a ``msg_got_ack`` line per acknowledged traced message."""
        msg_debug = self._msg_debug
        for msg, _ in acks:
            topic = msg.topic()
            if msg_debug.traces(topic):
                msg_debug.acknowledged(
                    topic, msg.partition(), msg.key(), msg.value(), msg.timestamp()[1]
                )

    def _settle_failure(
        self,
        err: Any,
        msg: Any,
        timestamp_ms: int,
        partition_key: int | None,
        attempt: int,
        token: int,
        handle: _ProducerHandle,
    ) -> None:
        topic: str = msg.topic()
        code = err.code()
        if handle.fatal_error is not None:
            # Whatever the failed producer still held: its fatal error is the verdict.
            self._discard(msg, timestamp_ms, DiscardReason.KAFKA_ERROR, handle.fatal_error, token)
        elif code in _PURGED or (self._closing and code not in _PERMANENT):
            # Nothing will poll for a resend's report once the producers stop.
            self._discard(msg, timestamp_ms, DiscardReason.SHUTDOWN_DELAY, err.name(), token)
        elif code in _PERMANENT or err.fatal() or not self._router.knows(topic):
            self._discard(msg, timestamp_ms, DiscardReason.KAFKA_ERROR, err.name(), token)
        elif attempt >= self._max_attempts:
            self._discard(
                msg, timestamp_ms, DiscardReason.FAILED_DELIVERY_ATTEMPTS, err.name(), token
            )
        else:
            if code in _POSSIBLY_PERSISTED:
                self._ledger.possible_duplicate(topic, timestamp_ms)
            self._reroute(msg, timestamp_ms, partition_key, attempt + 1, token)

    def _discard(
        self, msg: Any, timestamp_ms: int, reason: DiscardReason, detail: str, token: int
    ) -> None:
        topic = msg.topic()
        cost = pool_cost(topic, msg.key(), msg.value())
        self._ledger.discarded(reason, topic, timestamp_ms, detail, cost, token)

    def _reroute(
        self, msg: Any, timestamp_ms: int, partition_key: int | None, attempt: int, token: int
    ) -> None:
        """Send again: an AnyPartition message to another available partition, a
        PartitionKey message by the key rule (which skips partitions without a leader)."""
        topic = msg.topic()
        failed = msg.partition()
        layout = self._router.layout(topic)
        if layout is not None and layout.leaders.get(failed, NO_LEADER) != NO_LEADER:
            # Metadata still names a leader for the partition that failed: it is stale.
            self._on_partition_trouble()
        if partition_key is None:
            partition = self._router.any_partition(topic, avoid=failed)
        else:
            partition = self._router.partition_key_partition(topic, partition_key)
        self.rerouted += 1
        try:
            self.send(
                topic,
                partition,
                msg.value(),
                msg.key(),
                timestamp_ms,
                partition_key,
                attempt,
                token,
            )
        except EnqueueRefused as refusal:
            self._discard(
                msg, timestamp_ms, DiscardReason.FAILED_DELIVERY_ATTEMPTS, refusal.detail, token
            )
            return
        msg_debug = self._msg_debug
        if msg_debug.active and msg_debug.traces(topic):
            msg_debug.sent(topic, partition, msg.key(), msg.value(), timestamp_ms)

    # -- lifecycle ----------------------------------------------------------------------

    def in_librdkafka(self) -> int:
        """Messages librdkafka holds (queued, in flight, or reports not yet served)."""
        handles = [*self._by_profile.values(), *self._retired]
        return sum(h.queue_length() for h in handles) + len(self._reports)

    @property
    def producers(self) -> Mapping[ProducerProfile, _ProducerHandle]:
        return self._by_profile

    @property
    def producers_recreated(self) -> int:
        """How many producers were replaced after a fatal error."""
        return self._counters.get("producer_recreated")

    async def shutdown(self, max_delay_s: float, requested_at: float | None = None) -> None:
        """Deliver what can be delivered within ``max_delay_s`` of ``requested_at`` (a
        ``time.monotonic()`` value; default now); the rest is purged and discarded with
        reason shutdown_delay. Returns when every report is settled.

        The flush stops early enough to report what is left within ``max_delay_s`` (see
        SETTLE_TIME_PER_MESSAGE_S). Every producer drains, purges and is destroyed on a
        closing thread of its own, all at once, so shutdown costs one producer's teardown, not
        the sum of them."""
        start = time.monotonic() if requested_at is None else requested_at
        deadline = start + max_delay_s
        latest_reserve = max_delay_s * (1 - MIN_FLUSH_SHARE)
        self._closing = True
        if self._poll_timer is not None:
            self._poll_timer.cancel()
            self._poll_timer = None
        handles = [*self._by_profile.values(), *self._retired]

        def flush_until() -> float:
            held = sum(h.queue_length() for h in handles)
            return deadline - min(latest_reserve, held * SETTLE_TIME_PER_MESSAGE_S)

        for handle in handles:
            handle.request_stop(flush_until)
        for handle in handles:
            assert handle.finished is not None
            await handle.finished
        self._drain_reports()
