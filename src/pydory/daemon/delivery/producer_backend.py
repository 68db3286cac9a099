"""The producer seam: one interface, :class:`ProducerBackend`, between a ``ProducerHandle``
and librdkafka, and the records a backend's polls leave for the loop.

Two backends implement it, each in a module of its own (uvicorn's two HTTP protocols behind
one interface): ``compiled_producer`` (``pydory._cproducer``: no Python object per
message or per acknowledgement) and ``confluent_producer`` (confluent-kafka's ``Producer``,
the reference). ``backends`` chooses one; ``tests/producer_backends.py`` runs the delivery
and fault tests on both.

A backend serves librdkafka's queue on whichever thread polls it (the loop while the daemon
runs, a closing thread at shutdown; the compiled one's report thread does the C part of it
beforehand, without the GIL) and only *records* what it served: reports become
:class:`AckReport`, :class:`AckSum` and :class:`FailureReport` entries of
:class:`DeliveryReports` (appends to a deque are atomic), statistics, errors and log lines
go to its :class:`PollSinks`. Every decision is taken later, on the loop, by the dispatcher.

Rule: a backend's polls reach the dispatcher only as :class:`DeliveryReports` entries and
:class:`PollSinks` calls.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple, Protocol

__all__ = [
    "AckReport",
    "AckSum",
    "DeliveryReports",
    "FailureReport",
    "PollSinks",
    "ProducerBackend",
    "ReportedMessage",
    "SendMessage",
]

#: ``send_message(topic, partition, value, key, timestamp_ms, partition_key, attempt,
#: token, maybe_in_kafka, headers)`` -> 0, or librdkafka's error code when it refused the
#: message (it holds nothing then): ``Dispatcher.send``'s fields, in its order.
SendMessage = Callable[..., int]


class AckReport(NamedTuple):
    """One acknowledged message (message debugging, the possible-duplicate window)."""

    message: Any  # confluent-kafka's Message, or a ReportedMessage
    token: int  # the caller's token (the commit point's epoch)
    timestamp_ms: int  # the client's timestamp it was sent with (not the broker's)


class AckSum(Protocol):
    """Acknowledged messages summed per (token, topic): the compiled backend's
    ``_cproducer.AckSum`` records, kept as its poll made them (not copied per poll)."""

    @property
    def token(self) -> int: ...
    @property
    def topic(self) -> str: ...
    @property
    def messages(self) -> int: ...
    @property
    def data_bytes(self) -> int:  # their keys' and values' bytes
        ...


class FailureReport(NamedTuple):
    """A failed delivery: what settling it, or a resend, needs."""

    error: Any  # confluent_kafka.KafkaError
    message: Any  # confluent-kafka's Message, or a ReportedMessage
    timestamp_ms: int  # the timestamp it was sent with (librdkafka reports a failure without)
    partition_key: int | None  # None: AnyPartition
    attempt: int  # how many times it has been sent
    token: int
    handle: Any  # the producer.ProducerHandle that reported it
    maybe_in_kafka: bool  # an earlier attempt may have reached the log
    headers: Any  # its record headers (its identity), for a resend
    #: librdkafka says this attempt may have been written although it failed: a request
    #: holding it was sent and timed out, then retried (rd_kafka_message_status ==
    #: POSSIBLY_PERSISTED), whatever the error its last attempt got.
    possibly_persisted: bool


class ReportedMessage:
    """A message a compiled poll gave back: what confluent-kafka's ``Message`` offers the
    dispatcher (``topic()``, ``partition()``, ``key()``, ``value()``, ``headers()``,
    ``len()``: the value's length)."""

    __slots__ = ("_headers", "_key", "_partition", "_topic", "_value")

    def __init__(
        self,
        topic: str,
        partition: int,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, bytes | None]] | None = None,
    ) -> None:
        self._topic, self._partition = topic, partition
        self._key, self._value, self._headers = key, value, headers

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def headers(self) -> list[tuple[str, bytes | None]] | None:
        return self._headers

    def __len__(self) -> int:
        return len(self._value or b"")


class DeliveryReports:
    """Delivery reports waiting for the loop to settle them, a batch at a time."""

    __slots__ = ("ack_sums", "acks", "failures")

    def __init__(self) -> None:
        self.acks: collections.deque[AckReport] = collections.deque()
        self.ack_sums: collections.deque[AckSum] = collections.deque()
        self.failures: collections.deque[FailureReport] = collections.deque()

    def __len__(self) -> int:
        """Messages reported, not yet settled."""
        summed = sum(entry.messages for entry in list(self.ack_sums))
        return len(self.acks) + len(self.failures) + summed


@dataclass(frozen=True)
class PollSinks:
    """Where a backend's polls put what they serve, each safe to call on the serving
    thread: the reports, the handle failures name, and the handlers of statistics (the
    raw JSON), non-fatal errors and a fatal error (confluent_kafka.KafkaError each)."""

    reports: DeliveryReports
    handle: object
    on_statistics: Callable[[str], None] | None
    on_broker_error: Callable[[Any], None] | None
    on_fatal_error: Callable[[Any], None]
    logger: logging.Logger


class ProducerBackend(Protocol):
    """One librdkafka producer instance, as a ``ProducerHandle`` drives it.

    ``__init__(properties, sinks)``: confluent-kafka's ``Producer`` properties (librdkafka's
    names; raises confluent_kafka.KafkaException if librdkafka refuses one).
    """

    #: How the daemon's log and status name it: "compiled" or "confluent-kafka".
    name: ClassVar[str]
    #: The call per message (see SendMessage), bound once: the hot path.
    produce: SendMessage
    #: ``produce_burst(parsed, headers, topic, max_data, runs, token)`` ->
    #: ``[(index, code)]`` refused (admission/burst_path.py), or None if the backend has
    #: no burst call (then every message goes through ``produce``).
    produce_burst: Callable[..., list[tuple[int, int]]] | None
    #: A file descriptor readable when a thread of the backend's has served reports a
    #: poll would take (the loop adds a reader and polls then; the poll reads it), or None:
    #: the polls on the loop's timers and after each burst serve everything.
    wake_fd: int | None

    def __init__(self, properties: dict[str, Any], sinks: PollSinks) -> None: ...

    def poll(self, timeout_s: float, each_ack: bool) -> None:
        """Serve what librdkafka has ready, waiting up to ``timeout_s`` for the first
        event; acknowledgements one by one if ``each_ack`` (else the backend may sum)."""

    def flush(self, timeout_s: float) -> None:
        """Serve reports until nothing is held, or for up to ``timeout_s``."""

    def report_each_ack(self) -> None:
        """From now on report every acknowledgement on its own, until a poll without
        ``each_ack`` (message debugging started: before the next poll asks)."""

    def purge(self) -> None:
        """Fail every message queued or in flight at once (their reports follow)."""

    def close(self) -> None:
        """Destroy the librdkafka instance (never while a poll of it runs)."""

    def __len__(self) -> int:
        """Messages librdkafka holds (queued, in flight, or reported and not served)."""
