"""The reference backend: confluent-kafka's ``Producer`` behind the producer seam
(``producer_backend.ProducerBackend``).

A delivery callback per message carries what the report must give back (confluent-kafka
returns neither a message's headers nor anything of ours in a report); the callbacks of
first-attempt AnyPartition messages without headers (the hot path) are cached per (token,
timestamp). librdkafka calls them from ``poll()`` or ``flush()``, once per message, on the
serving thread: they only append to ``DeliveryReports``.

A failed report's "possibly persisted" (librdkafka's rd_kafka_message_status, which
confluent-kafka 2.16 does not expose: its Message has no status and no retry count, and
a report's KafkaError says nothing of earlier attempts) is inferred, erring to
"possibly" (``ConfluentBackend._possibly_persisted``). A broker's error (code > 0) is
possibly persisted if the message was produced at least a request timeout before its
report (its own request may have timed out in flight, then been retried), or before, or
less than ``SUPPRESSED_FOR_S`` after, the last in-flight trouble librdkafka told of: a
request timeout (its ``REQTMOUT`` log line; the disconnect that follows it is logged
only at debug level) or a broken connection (error_cb ``_TRANSPORT``/``_TIMED_OUT``).
A request in flight then fails at once whatever its messages' age, and may have been
written: retried and refused, its messages are in Kafka (the case a loaded machine hit,
issue 30). Other first-try refusals by a broker stay discards, and so do librdkafka's
own errors that come before any send (outcomes.POSSIBLY_PERSISTED holds the ones that
may follow a sent request).

Rule: a `ConfluentBackend`'s delivery, statistics, error or log callback only
records what it is given (into ``DeliveryReports``, a ``PollSinks`` call, the logger,
or the time of in-flight trouble).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any, ClassVar

from confluent_kafka import KafkaError, KafkaException, Producer

from pydory.daemon.delivery.producer_backend import AckReport, FailureReport, PollSinks

log = logging.getLogger(__name__)

__all__ = ["ConfluentBackend"]

#: Cached first-attempt callbacks kept at most (tokens are coarse epochs, and a burst's
#: messages mostly share their millisecond: a few at a time in use).
CALLBACKS_KEPT = 1024
#: librdkafka's defaults, where the properties set none.
DEFAULT_REQUEST_TIMEOUT_MS = 30_000
DEFAULT_SOCKET_TIMEOUT_MS = 60_000
#: librdkafka reports a broker's error through error_cb at most once per this many seconds
#: when it repeats word for word (rd_kafka_broker_set_error: rkb_suppress.fail_error).
SUPPRESSED_FOR_S = 30.0
#: Broker errors after which requests in flight may have been written, then retried.
IN_FLIGHT_TROUBLE = frozenset({KafkaError._TRANSPORT, KafkaError._TIMED_OUT})
#: The facility of librdkafka's log lines on timed-out requests (rd_kafka_broker_timeout_scan,
#: at warning level, never suppressed).
REQUEST_TIMEOUT_FACILITY = "REQTMOUT"


class ConfluentBackend:
    """confluent-kafka's ``Producer``: a callback per message, a Message per report."""

    name: ClassVar[str] = "confluent-kafka"
    produce_burst: Callable[..., list[tuple[int, int]]] | None = None
    #: Served by the polling thread only: the loop's timers poll it.
    wake_fd: int | None = None

    def __init__(self, properties: dict[str, Any], sinks: PollSinks) -> None:
        self._sinks = sinks
        self._ack = sinks.reports.acks.append
        self._fail = sinks.reports.failures.append
        properties = dict(properties)
        if sinks.on_statistics is not None:
            properties["stats_cb"] = sinks.on_statistics
        # Always: a request timeout or broken connection marks what was in flight.
        properties["error_cb"] = self._on_error
        properties["logger"] = _TroubleWatch(self, properties.get("logger") or sinks.logger)
        #: When librdkafka last told of in-flight trouble (time.monotonic()); none yet.
        self._trouble_at = -float("inf")
        # A report later than this after produce() may follow a request that timed out
        # after it was sent, then a retry (see _on_delivery).
        self._request_timeout_s = (
            min(
                int(properties.get("request.timeout.ms", DEFAULT_REQUEST_TIMEOUT_MS)),
                int(properties.get("socket.timeout.ms", DEFAULT_SOCKET_TIMEOUT_MS)),
            )
            / 1000
        )
        self._producer: Producer | None = Producer(properties)
        # One callback per (token, timestamp) for first-attempt AnyPartition messages
        # without headers: saves a partial per message.
        self._first_attempt_callbacks: dict[tuple[int, int], Callable[[Any, Any], None]] = {}
        self.produce: Callable[..., int] = self._produce

    def _produce(
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
        producer = self._producer
        if producer is None:
            return KafkaError._DESTROY
        callback: Callable[[Any, Any], None]
        if partition_key is not None or attempt > 1:
            # What a resend needs: a delivery report gives back neither headers nor attempt.
            identified = (partition_key, attempt, token, timestamp_ms, maybe_in_kafka, headers)
            callback = functools.partial(self._on_delivery, *identified)
        elif headers is not None:  # a callback per message: the identity, for a resend
            callback = functools.partial(
                self._on_delivery, None, 1, token, timestamp_ms, False, headers
            )
        else:
            callback = self._first_attempt_callbacks.get(
                (token, timestamp_ms)
            ) or self._first_attempt_callback(token, timestamp_ms)
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

    def _first_attempt_callback(self, token: int, timestamp_ms: int) -> Callable[[Any, Any], None]:
        if len(self._first_attempt_callbacks) > CALLBACKS_KEPT:
            self._first_attempt_callbacks.clear()
        callback = functools.partial(self._on_delivery, None, 1, token, timestamp_ms, False, None)
        self._first_attempt_callbacks[(token, timestamp_ms)] = callback
        return callback

    def _on_delivery(
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
            self._ack(AckReport(msg, token, timestamp_ms))
        else:
            self._fail(
                FailureReport(
                    err,
                    msg,
                    timestamp_ms,
                    partition_key,
                    attempt,
                    token,
                    self._sinks.handle,
                    maybe_in_kafka,
                    headers,
                    self._possibly_persisted(err, msg),
                )
            )

    def _on_error(self, error: Any) -> None:
        if error.code() in IN_FLIGHT_TROUBLE:
            self.in_flight_trouble()
        if self._sinks.on_broker_error is not None:
            self._sinks.on_broker_error(error)
        else:  # as librdkafka does with an error when no error_cb is set
            self._sinks.logger.error("%s", error.str())

    def in_flight_trouble(self) -> None:
        """librdkafka told of a request timeout or a broken connection just now."""
        self._trouble_at = time.monotonic()

    def _possibly_persisted(self, err: Any, msg: Any) -> bool:
        """confluent-kafka's Message has no rd_kafka_message_status: a broker's error
        (a code > 0: it answers a request) may answer a retry of a request holding the
        message that was written and then timed out or lost its connection; the first
        copy may then be in the log, whatever the retry's error. So it is "possibly" if
        the message was produced at least a request timeout ago (its own request may have
        timed out), or before (or within librdkafka's suppression of repeated errors
        after) the last request timeout or broken connection librdkafka told of: a
        request in flight then fails early, whatever its messages' age (the failure seen
        under load: written behind a late response, retried, refused). Erring to
        "possibly" keeps the books true: possibly delivered, never a false discard.
        librdkafka's own errors (< 0) that may follow a sent request are
        outcomes.POSSIBLY_PERSISTED already; the others were never sent."""
        if err.code() <= 0:
            return False
        latency: float | None = msg.latency()
        if latency is None or latency >= self._request_timeout_s:
            return True
        produced_at = time.monotonic() - latency
        return produced_at < self._trouble_at + SUPPRESSED_FOR_S

    def report_each_ack(self) -> None:
        """Reports always come one by one here."""

    def poll(self, timeout_s: float, each_ack: bool) -> None:
        # Reports always come one by one here: each_ack changes nothing.
        if self._producer is not None:
            self._serve(self._producer.poll, timeout_s)

    def flush(self, timeout_s: float) -> None:
        if self._producer is not None:
            self._serve(self._producer.flush, timeout_s)

    def _serve(self, serve: Callable[[float], object], timeout_s: float) -> None:
        """``poll`` or ``flush``: both serve callbacks, and both raise a fatal error
        (confluent-kafka never passes one to error_cb)."""
        try:
            serve(timeout_s)
        except KafkaException as exc:
            error = exc.args[0]
        else:
            return
        if error.fatal():
            self._sinks.on_fatal_error(error)
        else:
            log.warning("%s", error.str())

    def purge(self) -> None:
        # Non-blocking: purged messages are reported at once; blocking would also wait for
        # every broker thread to take note of the purge.
        if self._producer is not None:
            self._producer.purge(in_queue=True, in_flight=True, blocking=False)

    def close(self) -> None:
        self._producer = None  # the last reference: rd_kafka_destroy() runs now

    def __len__(self) -> int:
        return len(self._producer) if self._producer is not None else 0


class _TroubleWatch:
    """The logger confluent-kafka calls with librdkafka's log lines (on the serving
    thread, in order with the delivery reports): it passes each on, and tells the backend
    of a request timeout, which librdkafka reports nowhere else."""

    def __init__(self, backend: ConfluentBackend, logger: logging.Logger) -> None:
        self._backend = backend
        self._logger = logger

    def log(self, level: int, msg: str, *args: Any, **kwargs: Any) -> None:
        # confluent-kafka: log(level, "%s [%s] %s", facility, instance name, line)
        if args and args[0] == REQUEST_TIMEOUT_FACILITY:
            self._backend.in_flight_trouble()
        self._logger.log(level, msg, *args, **kwargs)
