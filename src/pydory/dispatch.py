"""Dispatch: the librdkafka producers, their delivery reports, reroutes and the final word on
every accepted message.

librdkafka (seed 003) does the network work: its broker threads batch, compress, send and
retry. This module only decides *which* producer a message goes to, maps Dory's settings
onto librdkafka properties (docs/librdkafka-mapping.md), and turns each delivery report
into one outcome on the ``Ledger``: delivered, rerouted, or discarded with a reason.

Threads: ``send`` runs on the event-loop thread. Each producer has one poller thread that
blocks in ``poll()`` (librdkafka wakes it when reports are ready); its delivery callback
only appends to an inbox and asks the loop to drain it, so every decision and every
counter update still happens on the loop thread, without locks.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from confluent_kafka import KafkaError, KafkaException, Producer

from pydory.accounting import DiscardReason
from pydory.errors import ConfigError, PydoryError
from pydory.router import NO_LEADER, Router

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


class Ledger(Protocol):
    """Where dispatch reports each message's final outcome (the daemon's books and pool)."""

    def delivered(self, topic: str, cost: int, token: int) -> None: ...

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


# One delivery report waiting for the loop: the message, its PartitionKey (None for
# AnyPartition), how many times it has been sent, and the caller's token (an opaque int
# given to ``send``, returned to the ledger with the outcome: the commit point's epoch).
_Report = tuple[Any, int | None, int, int]


class _ProducerHandle:
    """One librdkafka producer and the thread that serves its delivery reports."""

    def __init__(self, name: str, properties: dict[str, Any], inbox: Callable[[_Report], None]):
        self.name = name
        self._inbox = inbox
        self.producer = Producer(properties)
        # One callback per token for first-attempt AnyPartition messages (the hot path):
        # tokens are coarse epochs, so this stays small and saves a partial per message.
        self._first_attempt_callbacks: dict[int, Callable[[Any, Any], None]] = {}
        self._stop = threading.Event()
        self._drain_deadline: float | None = None
        self._thread = threading.Thread(target=self._serve, name=f"pydory-dr-{name}", daemon=True)
        self.finished: asyncio.Future[None] | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.finished = loop.create_future()
        self._loop = loop
        self._thread.start()

    def first_attempt_callback(self, token: int) -> Callable[[Any, Any], None]:
        callback = self._first_attempt_callbacks.get(token)
        if callback is None:
            if len(self._first_attempt_callbacks) > 1024:
                self._first_attempt_callbacks.clear()
            callback = functools.partial(self.on_delivery, None, 1, token)
            self._first_attempt_callbacks[token] = callback
        return callback

    # librdkafka calls this from poll(), on this handle's thread.
    def on_delivery(
        self, partition_key: int | None, attempt: int, token: int, err: Any, msg: Any
    ) -> None:
        self._inbox((msg, partition_key, attempt, token))

    def _serve(self) -> None:
        try:
            while not self._stop.is_set():
                self.producer.poll(0.2)
            self._drain()
        finally:
            self._loop.call_soon_threadsafe(self._set_finished)

    def _drain(self) -> None:
        """Shutdown: deliver what can be delivered before the deadline, then purge the rest
        (their reports come back as _PURGE_QUEUE / _PURGE_INFLIGHT and become discards)."""
        deadline = self._drain_deadline if self._drain_deadline is not None else time.monotonic()
        remaining = self.producer.flush(max(0.0, deadline - time.monotonic()))
        if remaining:
            log.warning("producer %s: %d messages undelivered at shutdown", self.name, remaining)
            self.producer.purge(in_queue=True, in_flight=True, blocking=True)
            self.producer.flush(5.0)  # collects the purge reports

    def _set_finished(self) -> None:
        if self.finished is not None and not self.finished.done():
            self.finished.set_result(None)

    def request_stop(self, deadline: float) -> None:
        self._drain_deadline = deadline
        self._stop.set()

    def queue_length(self) -> int:
        return len(self.producer)


class Dispatcher:
    """Owns the producers; sends accepted messages and settles their delivery reports."""

    def __init__(
        self,
        settings: DeliverySettings,
        profile_for: Callable[[str], ProducerProfile],
        router: Router,
        ledger: Ledger,
        on_partition_trouble: Callable[[], None] = lambda: None,
    ) -> None:
        self._settings = settings
        self._profile_for = profile_for
        self._router = router
        self._ledger = ledger
        self._on_partition_trouble = on_partition_trouble
        self._max_attempts = max(1, settings.max_failed_delivery_attempts)
        self._by_profile: dict[ProducerProfile, _ProducerHandle] = {}
        self._by_topic: dict[str, _ProducerHandle] = {}
        self._reports: collections.deque[_Report] = collections.deque()
        self._drain_scheduled = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self.rerouted = 0
        self._closing = False

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

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
        if handle is None:
            raise EnqueueRefused(DiscardReason.KAFKA_ERROR, "producer unavailable")
        try:
            if partition_key is None and attempt == 1:
                callback = handle.first_attempt_callback(token)
            else:
                callback = functools.partial(handle.on_delivery, partition_key, attempt, token)
            handle.producer.produce(
                topic, value, key, partition, on_delivery=callback, timestamp=timestamp_ms
            )
        except BufferError:
            raise EnqueueRefused(DiscardReason.NO_MEMORY, "librdkafka queue full") from None
        except KafkaException as exc:
            err = exc.args[0]
            if err.code() == KafkaError.MSG_SIZE_TOO_LARGE:
                raise EnqueueRefused(DiscardReason.TOO_LONG, err.name()) from None
            raise EnqueueRefused(DiscardReason.KAFKA_ERROR, err.name()) from None

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
        name = f"p{len(self._by_profile)}"
        # The config's <librdkafka> section has the last word (e.g. message.timeout.ms).
        properties = {**self._settings.properties(), **profile.properties(), **self._settings.extra}
        handle = _ProducerHandle(name, properties, self._post_report)
        assert self._loop is not None, "Dispatcher.start() was not called"
        handle.start(self._loop)
        log.info("producer %s: %s", name, profile.properties())
        return handle

    # -- delivery reports (poller threads -> loop thread) ------------------------------

    def _post_report(self, report: _Report) -> None:
        self._reports.append(report)
        if not self._drain_scheduled and self._loop is not None:
            self._drain_scheduled = True
            self._loop.call_soon_threadsafe(self._drain_reports)

    def _drain_reports(self) -> None:
        self._drain_scheduled = False
        reports = self._reports
        while reports:
            self._settle(*reports.popleft())

    def _settle(self, msg: Any, partition_key: int | None, attempt: int, token: int) -> None:
        err = msg.error()
        topic: str = msg.topic()
        if err is None:
            self._ledger.delivered(topic, pool_cost(topic, msg.key(), msg.value()), token)
            return
        code = err.code()
        timestamp_ms = msg.timestamp()[1]
        if code in _PURGED or (self._closing and code not in _PERMANENT):
            # Nothing will poll for a resend's report once the producers stop.
            self._discard(msg, DiscardReason.SHUTDOWN_DELAY, err.name(), token)
        elif code in _PERMANENT or err.fatal() or not self._router.knows(topic):
            self._discard(msg, DiscardReason.KAFKA_ERROR, err.name(), token)
        elif attempt >= self._max_attempts:
            self._discard(msg, DiscardReason.FAILED_DELIVERY_ATTEMPTS, err.name(), token)
        else:
            if code in _POSSIBLY_PERSISTED:
                self._ledger.possible_duplicate(topic, timestamp_ms)
            self._reroute(msg, partition_key, attempt + 1, token)

    def _discard(self, msg: Any, reason: DiscardReason, detail: str, token: int) -> None:
        topic = msg.topic()
        cost = pool_cost(topic, msg.key(), msg.value())
        self._ledger.discarded(reason, topic, msg.timestamp()[1], detail, cost, token)

    def _reroute(self, msg: Any, partition_key: int | None, attempt: int, token: int) -> None:
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
        timestamp_ms = msg.timestamp()[1]
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
            self._discard(msg, DiscardReason.FAILED_DELIVERY_ATTEMPTS, refusal.detail, token)

    # -- lifecycle ----------------------------------------------------------------------

    def in_librdkafka(self) -> int:
        """Messages librdkafka holds (queued, in flight, or reports not yet served)."""
        return sum(h.queue_length() for h in self._by_profile.values()) + len(self._reports)

    @property
    def producers(self) -> Mapping[ProducerProfile, _ProducerHandle]:
        return self._by_profile

    async def shutdown(self, max_delay_s: float) -> None:
        """Deliver what can be delivered within ``max_delay_s``; the rest is purged and
        discarded with reason shutdown_delay. Returns when every report is settled."""
        deadline = time.monotonic() + max_delay_s
        self._closing = True
        handles = list(self._by_profile.values())
        for handle in handles:
            handle.request_stop(deadline)
        for handle in handles:
            assert handle.finished is not None
            await handle.finished
        self._drain_reports()
