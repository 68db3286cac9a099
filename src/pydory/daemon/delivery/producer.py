"""The producer: one librdkafka producer instance and the delivery reports it hands back.

librdkafka (seed 003) does the network work: its broker threads batch, compress, send and
retry. A :class:`ProducerHandle` owns one instance: the compiled producer
(``compiled_producer``: no Python object per message or per report) where it is built,
else confluent-kafka's ``Producer`` (the reference; ``PYDORY_PURE_PYTHON=1`` forces it).
While the daemon runs, the dispatcher serves its callbacks on the loop thread
(``poll(0)``, which never blocks); once it is stopped, a closing thread of its own
flushes it until a deadline, purges what is left and destroys it, so several producers
tear down in parallel and the loop never waits for one. A delivery callback (or a
compiled poll) only appends reports to :class:`DeliveryReports`; every decision is taken
later, on the loop, by the dispatcher (and :mod:`outcomes`).

Rule: a sending ``ProducerHandle`` is polled, flushed, purged and destroyed here alone, each on
its proper thread (``send_message`` itself is the dispatcher's call), and its delivery
callback only records the report.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from pydory.daemon.delivery.compiled_producer import (
    CompiledProducer,
    PollSinks,
    compiled_producer_class,
)
from pydory.daemon.delivery.kafka_stats import ProducerStats, parse_statistics
from pydory.daemon.delivery.librdkafka_settings import ProducerProfile

log = logging.getLogger(__name__)

#: At shutdown, how often the flush looks again at its deadline.
FLUSH_STEP_S = 0.1
#: After a purge, how long the poller waits for librdkafka to report the purged messages.
PURGE_REPORTS_WAIT_S = 2.0

# A failed delivery report waiting for the loop: the error, the message, the timestamp it
# was sent with (librdkafka reports a failed message without one), its PartitionKey (None
# for AnyPartition), how many times it has been sent, the caller's token (an opaque int
# given to ``send``, returned to the ledger with the outcome: the commit point's epoch),
# the producer that reported it, whether an earlier attempt may have reached the log, and
# its record headers (its identity: confluent-kafka gives none back in a report, so a
# resend takes them from here).
FailureReport = tuple[Any, Any, int, "int | None", int, int, "ProducerHandle", bool, Any]
# A successful delivery report: the message, its token, and the client's timestamp it was
# sent with (the report's own is the broker's append time on a LogAppendTime topic).
AckReport = tuple[Any, int, int]
# Acknowledged messages summed (the compiled producer's reports): their token, topic, how
# many, and their keys' and values' bytes.
AckSum = tuple[int, str, int, int]


class DeliveryReports:
    """Delivery reports waiting for the loop to settle them.

    librdkafka's delivery callbacks only append here, on whichever thread serves them (the
    loop while the daemon runs, a closing thread at shutdown): appends to a deque are
    atomic, and every decision is taken later, on the loop, a batch at a time.
    """

    __slots__ = ("ack_sums", "acks", "failures")

    def __init__(self) -> None:
        self.acks: collections.deque[AckReport] = collections.deque()
        self.ack_sums: collections.deque[AckSum] = collections.deque()
        self.failures: collections.deque[FailureReport] = collections.deque()

    def __len__(self) -> int:
        """Messages reported, not yet settled."""
        summed = sum(count for _, _, count, _ in list(self.ack_sums))
        return len(self.acks) + len(self.failures) + summed


class ProducerHandle:
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
        reports: DeliveryReports,
        on_reports: Callable[[], None],
        on_statistics: Callable[[ProducerHandle, ProducerStats], None] | None,
        on_fatal: Callable[[ProducerHandle], None],
        on_broker_error: Callable[[Any], None] | None = None,
    ):
        """``on_broker_error(KafkaError)``: a non-fatal error librdkafka reports (a broker
        it cannot reach, a connection lost), called on the loop thread."""
        self.name = name
        self.profile = profile
        self._ack = reports.acks.append
        self._fail = reports.failures.append
        self._on_reports = on_reports
        self._on_statistics = on_statistics
        self._on_fatal = on_fatal
        if on_statistics is not None:
            properties = {**properties, "stats_cb": self._statistics}
        self._on_broker_error = on_broker_error
        self.producer: Producer | None = None
        self.compiled: CompiledProducer | None = None
        #: The dispatcher's call per message, ``Dispatcher.send``'s fields in its order:
        #: ``send_message(topic, partition, value, key, timestamp_ms, partition_key,
        #: attempt, token, maybe_in_kafka, headers)`` -> 0, or librdkafka's error code
        #: when it refused the message (it holds nothing then).
        self.send_message: Callable[..., int]
        #: Report each acknowledged message on its own (message debugging, the
        #: possible-duplicate window), not summed: set by the dispatcher before a poll.
        self.report_each_ack = False
        compiled = compiled_producer_class()
        if compiled is not None:
            self.compiled = compiled(properties)
            self.send_message = self.compiled.produce
            self._sinks = PollSinks(
                reports,
                self,
                self._statistics if on_statistics is not None else None,
                self._broker_error if on_broker_error is not None else None,
                self._fatal,
                self.compiled.logger,
            )
        else:
            if on_broker_error is not None:
                properties = {**properties, "error_cb": self._broker_error}
            self.producer = Producer(properties)
            self.send_message = self._produce_through_confluent
        # Set (once) when librdkafka reports a fatal error: the instance is unusable and
        # everything it still holds fails.
        self.fatal_error: str | None = None
        self.retired = False  # the dispatcher no longer sends through it
        self.stopping = False  # handed to its closing thread: the loop no longer serves it
        # One callback per (token, timestamp) for first-attempt AnyPartition messages
        # without headers (the hot path): tokens are coarse epochs and a burst's messages
        # mostly share their millisecond, so this stays small and saves a partial per
        # message. A message with an identity header needs a callback of its own (the
        # header must come back with a failure: ``first_identified``).
        self.first_attempt_callbacks: dict[tuple[int, int], Callable[[Any, Any], None]] = {}
        #: ``partial(first_identified, token, timestamp_ms, headers)``: the callback of a
        #: first-attempt AnyPartition message with headers (bound once: the hot path).
        self.first_identified = self._on_first_identified_delivery
        self._flush_until: Callable[[], float] = time.monotonic
        self.finished: asyncio.Future[None] | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.finished = loop.create_future()
        self._loop = loop

    @property
    def closed(self) -> bool:
        """Destroyed: nothing can be sent through it any more."""
        return self.producer is None and self.compiled is None

    def _produce_through_confluent(
        self,
        topic: str,
        partition: int,
        value: bytes,
        key: bytes | None,
        timestamp_ms: int,
        partition_key: int | None,
        attempt: int,
        token: int,
        maybe_in_kafka: bool,
        headers: Any,
    ) -> int:
        """``send_message`` on confluent-kafka: a delivery callback carrying what the
        report must give back (cached for first-attempt AnyPartition messages)."""
        producer = self.producer
        if producer is None:
            return KafkaError._DESTROY
        callback: Callable[[Any, Any], None]
        if partition_key is not None or attempt > 1:
            # What a resend needs: a delivery report gives back neither headers nor attempt.
            identified = (partition_key, attempt, token, timestamp_ms, maybe_in_kafka, headers)
            callback = functools.partial(self.on_delivery, *identified)
        elif headers is not None:  # a callback per message: the identity, for a resend
            callback = functools.partial(self.first_identified, token, timestamp_ms, headers)
        else:
            callback = self.first_attempt_callbacks.get(
                (token, timestamp_ms)
            ) or self.first_attempt_callback(token, timestamp_ms)
        try:
            producer.produce(  # headers=None costs nothing measurable
                topic, value, key, partition, callback, timestamp=timestamp_ms, headers=headers
            )
        except BufferError:
            return KafkaError._QUEUE_FULL
        except KafkaException as exc:
            code: int = exc.args[0].code()
            return code
        return 0

    def first_attempt_callback(self, token: int, timestamp_ms: int) -> Callable[[Any, Any], None]:
        """The delivery callback of a first-attempt AnyPartition message under ``token``
        (cached in ``first_attempt_callbacks``, which ``send`` reads first)."""
        cache_key = (token, timestamp_ms)
        callback = self.first_attempt_callbacks.get(cache_key)
        if callback is None:
            if len(self.first_attempt_callbacks) > 1024:
                self.first_attempt_callbacks.clear()
            callback = functools.partial(
                self.on_delivery, None, 1, token, timestamp_ms, False, None
            )
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
        maybe_in_kafka: bool,
        headers: Any,
        err: Any,
        msg: Any,
    ) -> None:
        if err is None:
            self._ack((msg, token, timestamp_ms))
        else:
            self._fail(
                (
                    err,
                    msg,
                    timestamp_ms,
                    partition_key,
                    attempt,
                    token,
                    self,
                    maybe_in_kafka,
                    headers,
                )
            )

    def _on_first_identified_delivery(
        self, token: int, timestamp_ms: int, headers: Any, err: Any, msg: Any
    ) -> None:
        if err is None:
            self._ack((msg, token, timestamp_ms))
        else:
            self._fail((err, msg, timestamp_ms, None, 1, token, self, False, headers))

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

    def _broker_error(self, error: Any) -> None:
        # Served by poll() or flush(): on the loop, or on the closing thread at shutdown,
        # so handed to the loop either way (the counters belong to it).
        assert self._on_broker_error is not None
        self._loop.call_soon_threadsafe(self._on_broker_error, error)

    def serve(self) -> None:
        """Loop thread: serve the callbacks librdkafka has ready, without waiting."""
        if self.stopping:
            return
        if self.compiled is not None:
            self.compiled.serve(0, self.report_each_ack, self._sinks)
        elif self.producer is not None:
            self._serve_callbacks(self.producer.poll, 0)

    def _serve_for(self, timeout_s: float, flush: bool) -> None:
        """Any thread: serve reports, waiting up to ``timeout_s`` (``flush``: until
        nothing is held, or that long)."""
        if self.compiled is not None:
            self.compiled.serve(timeout_s, self.report_each_ack, self._sinks)
        elif self.producer is not None:
            producer = self.producer
            self._serve_callbacks(producer.flush if flush else producer.poll, timeout_s)

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
        else:
            self._fatal(error)

    def _fatal(self, error: Any) -> None:
        """librdkafka reported a fatal error: the instance is unusable."""
        if self.fatal_error is None:
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
            if not self.closed:
                self._drain()
        finally:
            self._destroy_producer()
            self._on_reports()
            self._loop.call_soon_threadsafe(self._set_finished)

    def _drain(self) -> None:
        """Deliver what can be delivered until the flush deadline, then purge the rest
        (their reports come back as _PURGE_QUEUE / _PURGE_INFLIGHT and become discards)."""
        held = self.queue_length
        while held() and (left := self._flush_until() - time.monotonic()) > 0:
            self._serve_for(min(left, FLUSH_STEP_S), flush=True)
            self._on_reports()
        if not held():
            return
        log.warning("producer %s: %d messages undelivered at shutdown", self.name, held())
        # Non-blocking: purged messages are reported at once; blocking would also wait for
        # every broker thread to take note of the purge.
        if self.compiled is not None:
            self.compiled.purge()
        elif self.producer is not None:
            self.producer.purge(in_queue=True, in_flight=True, blocking=False)
        give_up = time.monotonic() + PURGE_REPORTS_WAIT_S
        while held() and time.monotonic() < give_up:
            self._serve_for(0.05, flush=False)  # collects the purge reports
        if held():
            log.error(
                "producer %s: %d messages still unreported after the purge", self.name, held()
            )

    def _destroy_producer(self) -> None:
        """Destroy the librdkafka instance here, on the closing thread, so that several
        producers tear down in parallel and the event loop never waits for one."""
        started = time.monotonic()
        self.producer = None  # the last reference: rd_kafka_destroy() runs now
        compiled, self.compiled = self.compiled, None
        if compiled is not None:
            compiled.close()
        log.debug("producer %s destroyed in %.3f s", self.name, time.monotonic() - started)

    def _set_finished(self) -> None:
        if self.finished is not None and not self.finished.done():
            self.finished.set_result(None)

    # -- any thread -----------------------------------------------------------------------

    def queue_length(self) -> int:
        held = self.compiled if self.compiled is not None else self.producer
        return len(held) if held is not None else 0
