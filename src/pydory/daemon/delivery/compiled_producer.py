"""The compiled backend: ``pydory._cproducer`` (a librdkafka producer driven from C)
behind the producer seam (``producer_backend.ProducerBackend``).

confluent-kafka's ``Producer`` stays the reference (``confluent_producer``): the same
librdkafka, the same properties, the same reports. What differs is the cost per message:
no callback object per message and no ``Message`` object or Python call per delivery
report; a poll hands back a ``Polled`` record (named fields, built in C): the
acknowledged messages summed per (token, topic), failures one by one with what a resend
needs, and the statistics, errors and log lines librdkafka queued (its event API).

One copy of librdkafka in the process: the extension links none; :func:`bind` gives it the
library confluent-kafka's own extension module (``confluent_kafka.cimpl``) loaded.

The report thread (issue 34, lever 4): each producer's event queue is served by a C thread
of its own that never holds the GIL: it sums the acknowledgements and destroys their
events (librdkafka's frees of messages and headers off the loop thread), hands every other
event over whole, in order, and tells the loop through an eventfd (:attr:`wake_fd`, for
``loop.add_reader``). OFF by default: measured natively it costs more CPU than it saves
the loop (librdkafka frees on that thread what the loop thread allocated, and glibc's
arenas make every such free a lock and a cache miss; BENCHMARKS.md, "Session 15"), so
``PYDORY_REPORT_THREAD=1`` (read once, at import: :data:`REPORT_THREAD`) turns it on and
the polling thread serves the queue itself otherwise.

Rule: a compiled poll's records become ``DeliveryReports`` entries and ``PollSinks`` calls
in `CompiledBackend` alone.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, Final

from confluent_kafka import KafkaError, KafkaException, cimpl

from pydory.daemon.delivery.producer_backend import (
    AckReport,
    FailureReport,
    PollSinks,
    ReportedMessage,
)

if TYPE_CHECKING:
    from pydory import _cproducer

log = logging.getLogger(__name__)

__all__ = [
    "REPORT_THREAD",
    "REPORT_THREAD_VARIABLE",
    "CompiledBackend",
    "LibrdkafkaTooOld",
    "bind",
    "burst_topics",
    "check_librdkafka",
]

#: The environment variable that turns the report thread on (``1``); off by default.
REPORT_THREAD_VARIABLE: Final = "PYDORY_REPORT_THREAD"
#: Whether a compiled producer's event queue is served by a thread of its own (a test may
#: set it before making producers).
REPORT_THREAD = os.environ.get(REPORT_THREAD_VARIABLE, "") == "1"

#: rd_kafka_msg_status_t: librdkafka knows the message never reached a broker's log.
MSG_STATUS_NOT_PERSISTED: Final = 0
#: librdkafka's syslog levels as Python's logging levels (confluent-kafka's own map).
_LOG_LEVELS: Final = (50, 50, 50, 40, 30, 20, 20, 10)

_module: Any = None
#: Whether the compiled backend is the one running (``backends.use`` sets it): the
#: intake's burst path, which sends through it, follows.
in_use = False


class LibrdkafkaTooOld(ImportError):
    """The librdkafka confluent-kafka loaded is older than the header ``pydory._cproducer``
    was compiled against: the functions and fields that header declares may not all be
    there, so the compiled backend does not bind to it (the reference runs instead)."""


def version_text(version: int) -> str:
    """librdkafka's ``0xMMmmrrxx`` version number as ``MM.mm.rr``."""
    return f"{version >> 24 & 0xFF}.{version >> 16 & 0xFF}.{version >> 8 & 0xFF}"


def check_librdkafka(found: int, built_against: int, library: str) -> None:
    """Whether the compiled backend may bind the librdkafka ``library`` (version ``found``)
    when it was compiled against the header of ``built_against`` (both as
    ``rd_kafka_version()`` gives them): at least that version (its ABI only grows), else
    :class:`LibrdkafkaTooOld` naming both and what to do."""
    if found >= built_against:
        return
    raise LibrdkafkaTooOld(
        f"librdkafka {version_text(found)} ({library}, loaded by confluent-kafka) is older "
        f"than librdkafka {version_text(built_against)}, whose header pydory._cproducer was "
        f"compiled against; to run the compiled producer, install a confluent-kafka that "
        f"bundles librdkafka {version_text(built_against)} or newer, or rebuild pydory "
        f"against librdkafka {version_text(found)}'s header (./dev setup)"
    )


def _found_librdkafka(module: Any) -> tuple[int, str]:
    """The version and path of the librdkafka confluent-kafka's cimpl loaded (a seam: a
    test names an older one)."""
    found: tuple[int, str] = module.library_version(cimpl.__file__)
    return found


def bind() -> str:
    """Bind ``pydory._cproducer`` to the librdkafka confluent-kafka loaded; what runs (raises
    ImportError or OSError: why it cannot; :class:`LibrdkafkaTooOld`: an older librdkafka
    than the extension was compiled against)."""
    global _module
    from pydory import _cproducer

    found, path = _found_librdkafka(_cproducer)
    check_librdkafka(found, _cproducer.HEADER_VERSION, path)
    version, library = _cproducer.bind(cimpl.__file__)
    _module = _cproducer
    served = (
        f"reports served by a thread ({REPORT_THREAD_VARIABLE}=1)"
        if REPORT_THREAD
        else "reports served by the loop"
    )
    return f"pydory._cproducer on librdkafka {version} ({library.rsplit('/', 1)[-1]}), {served}"


def bound() -> Any:
    """``pydory._cproducer`` bound to librdkafka, or None if :func:`bind` did not run (or
    could not)."""
    return _module


def burst_topics() -> Callable[[Any, int], dict[str, tuple[int, int]] | None] | None:
    """``burst_topics(parsed, max_data)`` (per topic of a parsed burst: how many messages
    fit ``max_data`` and their bytes) where the compiled backend runs, else None."""
    if not in_use or _module is None:
        return None
    counts: Callable[[Any, int], dict[str, tuple[int, int]] | None]
    counts = _module.burst_topics
    return counts


def _property_text(value: Any) -> str:
    # As confluent-kafka passes a property to librdkafka.
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


class CompiledBackend:
    """A ``pydory._cproducer.Producer`` with confluent-kafka's ``Producer`` properties
    (callables and the logger are pydory's own, not librdkafka's: taken out)."""

    name: ClassVar[str] = "compiled"

    def __init__(self, properties: dict[str, Any], sinks: PollSinks) -> None:
        self._sinks = sinks
        settings = {
            name: _property_text(value)
            for name, value in properties.items()
            if not callable(value) and not isinstance(value, logging.Logger)
        }
        if _module is None:
            raise RuntimeError("compiled_producer.bind() was not called")
        try:
            self._producer: _cproducer.Producer = _module.Producer(settings, thread=REPORT_THREAD)
        except ValueError as error:  # librdkafka refused a property: its own words
            raise KafkaException(KafkaError(KafkaError._INVALID_ARG, str(error))) from None
        self.produce: Callable[..., int] = self._producer.produce
        self.produce_burst: Callable[..., list[tuple[int, int]]] | None
        self.produce_burst = self._producer.produce_burst
        wake_fd = self._producer.wake_fd
        self.wake_fd: int | None = wake_fd if wake_fd >= 0 else None

    def __len__(self) -> int:
        return len(self._producer)

    def purge(self) -> None:
        self._producer.purge()

    def close(self) -> None:
        self._producer.close()

    def report_each_ack(self) -> None:
        self._producer.report_each_ack()

    def flush(self, timeout_s: float) -> None:
        # One poll waiting up to timeout_s: the closing thread asks again until done.
        self.poll(timeout_s, False)

    def poll(self, timeout_s: float, each_ack: bool) -> None:
        polled = self._producer.poll(timeout_s, each_ack)
        if polled is None:
            return
        sinks = self._sinks
        reports = sinks.reports
        if polled.ack_sums:
            reports.ack_sums.extend(polled.ack_sums)  # AckSum records, named in C
        if polled.acks:
            append = reports.acks.append
            for ack in polled.acks:
                message = ReportedMessage(ack.topic, ack.partition, ack.key, ack.value)
                append(AckReport(message, ack.token, ack.timestamp_ms))
        for failure in polled.failures:
            reports.failures.append(self._failure_report(failure, sinks.handle))
        for event in polled.events:
            self._event(event)
        if polled.stopped_by is not None:
            # The report it could not convert, and all after it, stay held: the next poll
            # serves them (nothing is lost; the loop goes on polling).
            log.error("a poll stopped on %s; the rest stays queued", polled.stopped_by.__name__)

    @staticmethod
    def _failure_report(failure: _cproducer.Failure, handle: object) -> FailureReport:
        message = ReportedMessage(
            failure.topic, failure.partition, failure.key, failure.value, failure.headers
        )
        return FailureReport(
            KafkaError(failure.code),
            message,
            failure.timestamp_ms,
            failure.partition_key,
            failure.attempt,
            failure.token,
            handle,
            failure.maybe_in_kafka,
            failure.headers,
            failure.status != MSG_STATUS_NOT_PERSISTED,
        )

    def _event(self, event: _cproducer.Statistics | _cproducer.Error | _cproducer.Log) -> None:
        sinks = self._sinks
        if isinstance(event, _module.Statistics):
            if sinks.on_statistics is not None:
                sinks.on_statistics(event.json)
        elif isinstance(event, _module.Error):
            if event.fatal:
                sinks.on_fatal_error(KafkaError(event.code, event.text, fatal=True))
            elif sinks.on_broker_error is not None:
                sinks.on_broker_error(KafkaError(event.code, event.text))
        elif isinstance(event, _module.Log):
            level = event.level
            level = _LOG_LEVELS[level] if 0 <= level < len(_LOG_LEVELS) else logging.DEBUG
            sinks.logger.log(level, "%s [%s] %s", event.facility, event.name, event.text)
