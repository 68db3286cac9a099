"""The producer: one librdkafka producer instance and the delivery reports it hands back.

librdkafka (seed 003) does the network work: its broker threads batch, compress, send and
retry. A :class:`ProducerHandle` owns one instance through the producer seam
(``producer_backend.ProducerBackend``): the backend ``backends`` chose, compiled or
confluent-kafka's, the same calls either way. While the daemon runs, the dispatcher
serves it on the loop thread (``poll(0)``, which never blocks); once it is stopped, a
closing thread of its own flushes it until a deadline, purges what is left and destroys
it, so several producers tear down in parallel and the loop never waits for one. A poll
only appends reports to :class:`DeliveryReports`; every decision is taken later, on the
loop, by the dispatcher (and :mod:`outcomes`).

Rule: a sending `ProducerHandle` is polled, flushed, purged and destroyed here alone, each on
its proper thread (``send_message`` itself is the dispatcher's call).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from pydory.daemon.delivery import backends
from pydory.daemon.delivery.kafka_stats import ProducerStats, parse_statistics
from pydory.daemon.delivery.librdkafka_settings import ProducerProfile
from pydory.daemon.delivery.producer_backend import (
    AckReport,
    AckSum,
    DeliveryReports,
    FailureReport,
    PollSinks,
    ProducerBackend,
    SendMessage,
)

__all__ = ["AckReport", "AckSum", "DeliveryReports", "FailureReport", "ProducerHandle"]

log = logging.getLogger(__name__)

#: At shutdown, how often the flush looks again at its deadline.
FLUSH_STEP_S = 0.1
#: After a purge, how long the poller waits for librdkafka to report the purged messages.
PURGE_REPORTS_WAIT_S = 2.0


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
        self._on_reports = on_reports
        self._on_statistics = on_statistics
        self._on_fatal = on_fatal
        self._on_broker_error = on_broker_error
        #: The dispatcher's call per message (producer_backend.SendMessage).
        self.send_message: SendMessage
        #: Report each acknowledged message on its own (message debugging, the
        #: possible-duplicate window), not summed: set by the dispatcher before a poll.
        self.report_each_ack = False
        sinks = PollSinks(
            reports,
            self,
            self._statistics if on_statistics is not None else None,
            self._broker_error if on_broker_error is not None else None,
            self._fatal,
            properties.get("logger") or logging.getLogger("pydory.librdkafka"),
        )
        self.backend: ProducerBackend | None = backends.BACKEND(properties, sinks)
        self.send_message = self.backend.produce
        # Set (once) when librdkafka reports a fatal error: the instance is unusable and
        # everything it still holds fails.
        self.fatal_error: str | None = None
        self.retired = False  # the dispatcher no longer sends through it
        self.stopping = False  # handed to its closing thread: the loop no longer serves it
        self._flush_until: Callable[[], float] = time.monotonic
        self.finished: asyncio.Future[None] | None = None
        self._wake_fd: int | None = None  # watched by the loop while it serves this producer

    def start(
        self, loop: asyncio.AbstractEventLoop, on_ready: Callable[[], None] | None = None
    ) -> None:
        """Loop thread: ``on_ready()`` is called on the loop whenever the backend's thread
        has reports ready (its ``wake_fd``; a poll reads it), until :meth:`request_stop`."""
        self.finished = loop.create_future()
        self._loop = loop
        self._wake_fd = self.backend.wake_fd if self.backend is not None else None
        if self._wake_fd is not None and on_ready is not None:
            loop.add_reader(self._wake_fd, on_ready)
        else:
            self._wake_fd = None

    def report_each_ack_now(self) -> None:
        """Loop thread: every acknowledgement from now on one by one (message debugging
        started), not only from the next poll on."""
        self.report_each_ack = True
        if not self.stopping and self.backend is not None:
            self.backend.report_each_ack()

    @property
    def closed(self) -> bool:
        """Destroyed: nothing can be sent through it any more."""
        return self.backend is None

    # -- the backend's sinks: on the loop thread while running, on the closing thread after

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
        """Loop thread: serve what librdkafka has ready, without waiting."""
        if not self.stopping and self.backend is not None:
            self.backend.poll(0, self.report_each_ack)

    def _serve_for(self, timeout_s: float, flush: bool) -> None:
        """Any thread: serve reports, waiting up to ``timeout_s`` (``flush``: until
        nothing is held, or that long)."""
        backend = self.backend
        if backend is None:
            return
        if flush:
            backend.flush(timeout_s)
        else:
            backend.poll(timeout_s, self.report_each_ack)

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
        if self._wake_fd is not None:  # the closing thread's polls read it from now on
            self._loop.remove_reader(self._wake_fd)
            self._wake_fd = None
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
        # Non-blocking (the backends'): purged messages are reported at once.
        if self.backend is not None:
            self.backend.purge()
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
        backend, self.backend = self.backend, None
        if backend is not None:
            backend.close()
        log.debug("producer %s destroyed in %.3f s", self.name, time.monotonic() - started)

    def _set_finished(self) -> None:
        if self.finished is not None and not self.finished.done():
            self.finished.set_result(None)

    # -- any thread -----------------------------------------------------------------------

    def queue_length(self) -> int:
        return len(self.backend) if self.backend is not None else 0
