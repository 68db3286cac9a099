"""Named event counters, like Dory's ``/counters``, and every counter's name.

Rule: a counter's name is spelled here alone (``ACCEPTED`` and the rest; :class:`Counters`
holds their values). The stage that counts an event and the page
that shows it both name the counter through this module, so a typo is an import error
(and a mypy error), not a counter that reads 0 for ever. Names are plain strings: they are
the keys of ``/counters`` and of the ``pydory_events_total`` metric, stable across
releases.

Every upper-case constant here is a counter name (or a mapping whose values are), and
``EVERY_COUNTER`` collects them: ``/counters`` lists exactly those, zeros included, from
the first request to the last, because Dory's Nagios check answers UNKNOWN when the set of
names changes between two runs. The one open-ended family,
``discarded_kafka_error_<error name>``, is therefore not on ``/counters``: it is on
``/metrics`` and in ``/counters/json``'s ``discarded_by_kafka_error``
(``discarded_by_kafka_error()`` reads it).
"""

from __future__ import annotations

from collections.abc import Mapping

from pydory.daemon.books.events import DiscardReason, Transport

# --- the message lifecycle (the books) ----------------------------------------------------
ACCEPTED = "accepted"
DELIVERED = "delivered"
POSSIBLE_DUPLICATE = "possible_duplicate"
#: Accepted messages whose outcome librdkafka cannot know (books/events.py OpenOutcome).
POSSIBLY_DELIVERED = "possibly_delivered"
#: Accepted messages kept in the spool at shutdown for the next start.
LEFT_FOR_NEXT_START = "left_for_next_start"
DISCARD_REPORT_UNREAD = "discard_report_unread"
#: Events (discards before acceptance, possible duplicates) of topic names beyond
#: <maxUnknownTopics>, counted under the books' "(other)" topic (books/accounting.py).
OTHER_TOPIC_EVENTS = "other_topic_events"
#: received_<transport>: messages framed on each transport.
RECEIVED = {transport: f"received_{transport}" for transport in Transport}
#: discarded_<reason>.
DISCARDED = {reason: f"discarded_{reason}" for reason in DiscardReason}


_KAFKA_ERROR_PREFIX = f"discarded_{DiscardReason.KAFKA_ERROR}_"


def discarded_kafka_error(error_name: str) -> str:
    """discarded_kafka_error_<librdkafka error name>: one counter per Kafka error seen."""
    return f"{_KAFKA_ERROR_PREFIX}{error_name}"


def discarded_by_kafka_error(counts: Mapping[str, int]) -> dict[str, int]:
    """The ``discarded_kafka_error_<name>`` family of ``counts``, by error name."""
    prefix = _KAFKA_ERROR_PREFIX
    return {name[len(prefix) :]: n for name, n in counts.items() if name.startswith(prefix)}


# --- inputs and admission --------------------------------------------------------------------
DATAGRAM_OVER_MAX_SIZE = "datagram_over_max_size"
HELD_WHEN_MEMORY_SHORT = "held_when_memory_short"
#: Messages discarded no_memory because their client held its share of the pool (its
#: accepted messages not yet settled and its partial frames: books/charges.py).
NO_MEMORY_CLIENT_SHARE = "no_memory_client_share"
#: Messages for a topic to auto-create, discarded bad_topic because <maxUnknownTopics>
#: topics already waited for their creation (admission/intake.py).
AUTOCREATE_OVER_LIMIT = "autocreate_over_limit"
#: Messages that waited for metadata and were then discarded bad_topic, never accepted
#: (admission/waiting_room.py): Dory counts a message in MsgCreate from its receipt, so a
#: waiting message stays in MsgCreate through this count when it leaves discarded.
WAITED_THEN_BAD_TOPIC = "waited_then_bad_topic"
CONNECTION_OPENED = {transport: f"connection_opened_{transport}" for transport in Transport}
CONNECTION_CLOSED = {transport: f"connection_closed_{transport}" for transport in Transport}
STREAM_SOCKET_ERROR = {transport: f"stream_socket_error_{transport}" for transport in Transport}
STREAM_FRAMING_ERROR = {transport: f"stream_framing_error_{transport}" for transport in Transport}
STREAM_OVERSIZED_FRAME = {
    transport: f"stream_oversized_frame_{transport}" for transport in Transport
}
UNCLEAN_DISCONNECT = {transport: f"unclean_disconnect_{transport}" for transport in Transport}
#: Stream connections closed because the partial frame they held found no room in the
#: memory pool in time (daemon/inputs/stream_connection.py); the frame is also counted an
#: unclean disconnect.
STREAM_PARTIAL_FRAME_NO_ROOM = {
    transport: f"stream_partial_frame_no_room_{transport}" for transport in Transport
}
#: The quotas of the stream listeners (<quotas>), per transport.
QUOTA_CONNECTIONS_REFUSED = {
    transport: f"quota_connections_refused_{transport}" for transport in Transport
}
QUOTA_THROTTLES = {transport: f"quota_throttles_{transport}" for transport in Transport}
QUOTA_THROTTLED_MS = {transport: f"quota_throttled_ms_{transport}" for transport in Transport}
#: Datagrams discarded (as rate_limit) because their sender's uid was over its quota.
QUOTA_DISCARDS_UNIX_DGRAM = f"quota_discards_{Transport.UNIX_DGRAM}"
#: The stream listeners at the process's file descriptor limit (EMFILE/ENFILE on accept,
#: inputs/acceptor.py): episodes begun, and accept(2) calls refused during them.
ACCEPT_FD_LIMIT_EPISODES = "accept_fd_limit_episodes"
ACCEPT_FD_LIMIT_REFUSED = "accept_fd_limit_refused"
BACKPRESSURE_PAUSES = "backpressure_pauses"
BACKPRESSURE_PAUSED_MS = "backpressure_paused_ms"

# --- the status port (status/limits.py) ---------------------------------------------------
#: Status connections beyond the cap, answered 503 and closed at once.
STATUS_CONNECTIONS_REFUSED = "status_connections_refused"
#: Status connections closed because their first request head was not in on time.
STATUS_HEADER_TIMEOUTS = "status_header_timeouts"

# --- delivery --------------------------------------------------------------------------------
PRODUCERS_RETIRED = "producers_retired"
PRODUCER_RECREATED = "producer_recreated"
TOPIC_NO_AVAILABLE_PARTITIONS = "topic_no_available_partitions"
METADATA_UPDATE_REQUESTED = "metadata_update_requested"
#: Connection trouble with a broker, as librdkafka reports it to the producers' error
#: callback (daemon/delivery/broker_trouble.py): Dory's ConnectorConnectFail,
#: ConnectorSocketBrokerClose, ConnectorSocketError and ConnectorSocketTimeout.
KAFKA_CONNECT_FAILED = "kafka_connect_failed"
KAFKA_CLOSED_BY_BROKER = "kafka_closed_by_broker"
KAFKA_SOCKET_ERROR = "kafka_socket_error"
KAFKA_REQUEST_TIMED_OUT = "kafka_request_timed_out"

# --- the spool -------------------------------------------------------------------------------
SPOOL_REPLAYED = "spool_replayed"
SPOOL_UNPROTECTED = "spool_unprotected"
SPOOL_DEFERRED = "spool_deferred"
SPOOL_DEFERRED_UNREADABLE = "spool_deferred_unreadable"
SPOOL_REPAIRED_SEGMENTS = "spool_repaired_segments"
SPOOL_TRUNCATED_BYTES = "spool_truncated_bytes"
#: At start-up: frames of the previous run's segments their acknowledgement marks say
#: settled (delivered or discarded then), so not replayed.
SPOOL_SETTLED_NOT_REPLAYED = "spool_settled_not_replayed"

# --- files written off the loop (books/files.py) ---------------------------------------------
#: Discard log entries the writer thread's queue had no room for.
DISCARD_LOG_DROPPED = "discard_log_dropped"
#: Discard log entries lost to an I/O error (file unwritable, disk full, ...).
DISCARD_LOG_LOST = "discard_log_lost"
#: Discard log entries written to the file.
DISCARD_LOG_WRITTEN = "discard_log_written"
MSG_DEBUG_WRITTEN = "msg_debug_written"
MSG_DEBUG_LOST = "msg_debug_lost"
MSG_DEBUG_DROPPED = "msg_debug_dropped"

# --- the config ------------------------------------------------------------------------------
CONFIG_RELOADS = "config_reloads"
CONFIG_RELOAD_FAILURES = "config_reload_failures"


def _every_counter() -> tuple[str, ...]:
    names: list[str] = []
    for constant, value in list(globals().items()):
        if not constant.isupper() or constant.startswith("_"):
            continue
        if isinstance(value, str):
            names.append(value)
        elif isinstance(value, dict):
            names.extend(value.values())
    return tuple(dict.fromkeys(names))


#: Every counter with a fixed name, in the order this module spells them.
EVERY_COUNTER: tuple[str, ...] = _every_counter()


class Counters:
    """Named event counters, like Dory's ``/counters``: name -> count, cheap increments."""

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}

    def inc(self, name: str, n: int = 1) -> None:
        """Add ``n`` to counter ``name`` (created at 0 on first use)."""
        self._counts[name] = self._counts.get(name, 0) + n

    def get(self, name: str) -> int:
        """The current value of ``name``; 0 if it was never incremented."""
        return self._counts.get(name, 0)

    def snapshot(self) -> dict[str, int]:
        """A copy of every counter, in order of first use."""
        return dict(self._counts)
