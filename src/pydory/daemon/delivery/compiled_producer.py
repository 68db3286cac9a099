"""The compiled producer: ``pydory._cproducer`` (a librdkafka producer driven from C), and
what its polls report turned into the dispatcher's delivery reports.

confluent-kafka's ``Producer`` stays the reference (``PYDORY_PURE_PYTHON=1``, or when the
extension is not built here): the same librdkafka, the same properties, the same reports.
What differs is the cost per message: no callback object per message and no ``Message``
object or Python call per delivery report; a poll hands back the acknowledged messages
summed per (token, topic), failures one by one with what a resend needs, and the
statistics, errors and log lines librdkafka queued (its event API).

One copy of librdkafka in the process: the extension links none; ``bind`` gives it the
library confluent-kafka loaded (``loaded_librdkafka``).

Rule: a compiled poll's results become ``DeliveryReports`` entries in ``CompiledProducer`` alone.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from confluent_kafka import KafkaError, KafkaException

from pydory.hotpath import PURE_PYTHON_VARIABLE

log = logging.getLogger(__name__)

__all__ = [
    "CompiledProducer",
    "ReportedMessage",
    "burst_topics",
    "compiled_producer_class",
    "why",
]

#: librdkafka's syslog levels as Python's logging levels (confluent-kafka's own map).
_LOG_LEVELS: Final = (50, 50, 50, 40, 30, 20, 20, 10)


class ReportedMessage:
    """A message a failed delivery report gave back: what confluent-kafka's ``Message``
    offers the dispatcher (``topic()``, ``partition()``, ``key()``, ``value()``,
    ``headers()``, ``len()``: the value's length)."""

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


def loaded_librdkafka() -> Path:
    """The librdkafka confluent-kafka loaded into this process (raises FileNotFoundError)."""
    # confluent_kafka is imported (above): its cimpl, and so its librdkafka, is mapped.
    with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
        for line in maps:
            path = line.rstrip("\n").partition("/")[2]
            if path and "librdkafka" in Path("/" + path).name:
                return Path("/" + path)
    raise FileNotFoundError("librdkafka is not mapped into this process")


def _load() -> tuple[Any, str]:
    """The extension's module, bound to librdkafka, and why; or None and why not."""
    if os.environ.get(PURE_PYTHON_VARIABLE, "") not in ("", "0"):
        return None, f"{PURE_PYTHON_VARIABLE} is set"
    try:
        from pydory import _cproducer
    except ImportError as error:
        return None, f"the C extension is not built here ({error})"
    try:
        library = loaded_librdkafka()
        version = _cproducer.bind(str(library))
    except (OSError, ImportError) as error:
        return None, f"cannot bind librdkafka: {error}"
    return _cproducer, f"pydory._cproducer on librdkafka {version} ({library.name})"


_module, why = _load()


def compiled_producer_class() -> type[CompiledProducer] | None:
    """CompiledProducer if the extension runs here, else None (use confluent-kafka)."""
    return CompiledProducer if _module is not None else None


def burst_topics() -> Callable[[list[Any], int], dict[str, tuple[int, int]] | None] | None:
    """``burst_topics(parsed, max_data)`` (per topic of a parsed burst: how many messages
    fit ``max_data`` and their bytes) where the compiled producer runs, else None."""
    return _module.burst_topics if _module is not None else None


def _property_text(value: Any) -> str:
    # As confluent-kafka passes a property to librdkafka.
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


@dataclass
class PollSinks:
    """Where a poll's results go (see ProducerHandle): the reports, and the handlers of
    statistics, non-fatal errors and a fatal error, each safe to call from its thread."""

    reports: Any  # producer.DeliveryReports (not imported: producer.py imports this)
    handle: object  # the producer.ProducerHandle the failures name
    on_statistics: Callable[[str], None] | None
    on_broker_error: Callable[[Any], None] | None
    on_fatal_error: Callable[[KafkaError], None]
    logger: logging.Logger


class CompiledProducer:
    """A ``pydory._cproducer.Producer`` with confluent-kafka's ``Producer`` properties
    (callables and the logger are pydory's own, not librdkafka's: taken out)."""

    def __init__(self, properties: dict[str, Any]) -> None:
        self.logger: logging.Logger = properties.get("logger") or logging.getLogger(
            "pydory.librdkafka"
        )
        settings = {
            name: _property_text(value)
            for name, value in properties.items()
            if not callable(value) and not isinstance(value, logging.Logger)
        }
        try:
            self._producer = _module.Producer(settings)
        except ValueError as error:  # librdkafka refused a property: its own words
            raise KafkaException(KafkaError(KafkaError._INVALID_ARG, str(error))) from None
        #: The C call itself, bound once: ``produce(topic, partition, value, key,
        #: timestamp_ms, partition_key, attempt, token, maybe_in_kafka, headers)`` (the
        #: fields of ``Dispatcher.send``, in its order) -> 0 or librdkafka's error code.
        self.produce: Callable[..., int] = self._producer.produce
        #: ``produce_burst(parsed, headers, topic, max_data, runs, token)`` ->
        #: ``[(index, code)]`` refused (see admission/burst_path.py).
        self.produce_burst: Callable[..., list[tuple[int, int]]] = self._producer.produce_burst

    def __len__(self) -> int:
        return len(self._producer)

    def purge(self) -> None:
        self._producer.purge()

    def close(self) -> None:
        self._producer.close()

    def serve(self, timeout_s: float, each_ack: bool, sinks: PollSinks) -> bool:
        """One poll: waits up to ``timeout_s`` for the first event; False if none came."""
        result = self._producer.poll(timeout_s, each_ack)
        if result is None:
            return False
        sums, acks, failures, events = result
        reports = sinks.reports
        if sums:
            reports.ack_sums.extend(sums)
        if acks:
            append = reports.acks.append
            for topic, partition, key, value, timestamp_ms, token in acks:
                append((ReportedMessage(topic, partition, key, value), token, timestamp_ms))
        for failure in failures:
            reports.failures.append(self._failure_report(failure, sinks.handle))
        for event in events:
            self._event(event, sinks)
        return True

    @staticmethod
    def _failure_report(failure: tuple[Any, ...], handle: object) -> Any:
        # librdkafka's persisted status (last) is not read: outcomes.py decides by the
        # error code, for both producers alike.
        code, topic, partition, key, value, timestamp_ms, headers = failure[:7]
        token, partition_key, attempt, maybe_in_kafka, _status = failure[7:]
        message = ReportedMessage(topic, partition, key, value, headers)
        return (
            KafkaError(code),
            message,
            timestamp_ms,
            partition_key,
            attempt,
            token,
            handle,
            maybe_in_kafka,
            headers,
        )

    def _event(self, event: tuple[Any, ...], sinks: PollSinks) -> None:
        kind = event[0]
        if kind == "stats":
            if sinks.on_statistics is not None:
                sinks.on_statistics(event[1])
        elif kind == "error":
            _, code, text, fatal = event
            if fatal:
                sinks.on_fatal_error(KafkaError(code, text, fatal=True))
            elif sinks.on_broker_error is not None:
                sinks.on_broker_error(KafkaError(code, text))
        elif kind == "log":
            _, level, facility, name, text = event
            level = _LOG_LEVELS[level] if 0 <= level < len(_LOG_LEVELS) else logging.DEBUG
            sinks.logger.log(level, "%s [%s] %s", facility, name, text)
