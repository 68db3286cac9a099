"""Connection trouble with a broker, counted as Dory counts it.

Dory's connector threads count each failed connect to a broker (``ConnectorConnectFail``),
each connection the broker closed (``ConnectorSocketBrokerClose``), each one lost to a
socket error (``ConnectorSocketError``) and each produce response that timed out
(``ConnectorSocketTimeout``); its Nagios check sums them against the socket-error
thresholds, so a broker outage turns the check CRITICAL. In pydory librdkafka owns the
connections and tells the application of each such failure through the producer's error
callback (``error_cb``: a ``_TRANSPORT``, ``_RESOLVE``, ``_AUTHENTICATION`` or
``_TIMED_OUT`` error whose text names the broker). librdkafka's statistics are no
substitute: their per-broker counts restart whenever librdkafka re-creates a broker
(it re-bootstraps during a full outage), so a sum of them can go down, and Dory's check
answers UNKNOWN when a counter decreases.

What librdkafka leaves out: it reports an error identical to the previous one of the same
broker at most once every 30 seconds, and not at all the close of an idle connection (a
broker's idle reaper), so a long outage counts fewer failures than Dory's would; they
still rise every 30 seconds per broker while it lasts.

Rule: a librdkafka error becomes a broker-trouble counter here alone (``count_broker_trouble``).
"""

from __future__ import annotations

from typing import Any

from pydory.daemon.books import counters as counter_names
from pydory.daemon.books.counters import Counters

__all__ = ["broker_trouble", "count_broker_trouble"]

#: librdkafka's error names for a connection that could not be made.
_CONNECT_ERRORS = frozenset({"_RESOLVE", "_AUTHENTICATION", "_SSL"})


def broker_trouble(error_name: str, reason: str) -> str | None:
    """The counter of a librdkafka error (its name, e.g. ``_TRANSPORT``, and its text),
    or None when it is no connection trouble (``_ALL_BROKERS_DOWN`` sums the others up)."""
    if error_name in _CONNECT_ERRORS:
        return counter_names.KAFKA_CONNECT_FAILED
    if error_name == "_TIMED_OUT":
        return counter_names.KAFKA_REQUEST_TIMED_OUT
    if error_name != "_TRANSPORT":
        return None
    # librdkafka's texts (rdkafka_broker.c, rdkafka_transport.c): "Connect to ipv4#...
    # failed: ...", "Disconnected (after ...)" when the broker closed the connection,
    # "Receive failed: ...", "Send failed: ..." on a socket error.
    if "Connect to " in reason or "Failed to resolve" in reason:
        return counter_names.KAFKA_CONNECT_FAILED
    if "Disconnected" in reason:
        return counter_names.KAFKA_CLOSED_BY_BROKER
    if "timed out" in reason:
        return counter_names.KAFKA_REQUEST_TIMED_OUT
    return counter_names.KAFKA_SOCKET_ERROR


def count_broker_trouble(counters: Counters, error: Any) -> None:
    """Count a ``confluent_kafka.KafkaError`` from a producer's error callback (loop thread)."""
    counter = broker_trouble(error.name(), error.str())
    if counter is not None:
        counters.inc(counter)
