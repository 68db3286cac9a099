"""The books' vocabulary: where a message came from, why it was dropped, and what a
discard event carries to the outputs besides the books.

Rule: a discard reason (:class:`DiscardReason`), a transport (:class:`Transport`) and the
line between "before" and "after acceptance" (``AFTER_ACCEPTANCE``) are defined here alone;
every stage names them through this module.
"""

from __future__ import annotations

import enum
from typing import NamedTuple, Protocol

from pydory.errors import PydoryError

__all__ = [
    "AFTER_ACCEPTANCE",
    "BEFORE_ACCEPTANCE",
    "STREAM_TRANSPORTS",
    "TOPIC_DISCARDS",
    "AccountingError",
    "DiscardEvent",
    "DiscardReason",
    "DiscardSink",
    "OpenOutcome",
    "Transport",
]


class DiscardReason(enum.StrEnum):
    """Why a message was dropped. Values are stable: metrics and JSON use them."""

    MALFORMED = "malformed"
    UNSUPPORTED_API_KEY = "unsupported_api_key"
    UNSUPPORTED_VERSION = "unsupported_version"
    BAD_TOPIC = "bad_topic"
    TOO_LONG = "too_long"
    NO_MEMORY = "no_memory"
    RATE_LIMIT = "rate_limit"
    KAFKA_ERROR = "kafka_error"
    FAILED_DELIVERY_ATTEMPTS = "failed_delivery_attempts"
    SHUTDOWN_DELAY = "shutdown_delay"
    UNCLEAN_DISCONNECT = "unclean_disconnect"
    #: A message of the previous run's spool that recovery could not read back (a damaged
    #: frame): discarded before acceptance in this run's books, with no topic.
    SPOOL_CORRUPT = "spool_corrupt"


class OpenOutcome(enum.StrEnum):
    """An accepted message's outcome that is neither "delivered" nor "discarded".

    ``possibly_delivered``: the last attempt ended in an error after which the message may
    be in Kafka or not (a timeout or a broken connection after the request may have left);
    librdkafka cannot know, so the books do not pretend to. ``left_for_next_start``: the
    shutdown deadline came first and the message stays in the spool, replayed by the next
    start (never a discard: it is not dropped).
    """

    POSSIBLY_DELIVERED = "possibly_delivered"
    LEFT_FOR_NEXT_START = "left_for_next_start"


class Transport(enum.StrEnum):
    """The client socket a message arrived on."""

    UNIX_DGRAM = "unix_dgram"
    UNIX_STREAM = "unix_stream"
    TCP = "tcp"


AFTER_ACCEPTANCE: frozenset[DiscardReason] = frozenset(
    {
        DiscardReason.KAFKA_ERROR,
        DiscardReason.FAILED_DELIVERY_ATTEMPTS,
        DiscardReason.SHUTDOWN_DELAY,
    }
)
"""Discards of messages the daemon had accepted: they leave ``in_flight``."""

BEFORE_ACCEPTANCE: frozenset[DiscardReason] = frozenset(DiscardReason) - AFTER_ACCEPTANCE
"""Discards at admission: counted per reason, never part of ``accepted``."""

# Discards of a message with a usable topic and client timestamp. Dory reports these in
# "discard_topic" (rate-limit discards appear there too, as well as in
# "rate_limit_discard"), and pydory keeps per-topic totals for them.
TOPIC_DISCARDS: frozenset[DiscardReason] = frozenset(
    {
        DiscardReason.TOO_LONG,
        DiscardReason.NO_MEMORY,
        DiscardReason.RATE_LIMIT,
        *AFTER_ACCEPTANCE,
    }
)

STREAM_TRANSPORTS = frozenset({Transport.UNIX_STREAM, Transport.TCP})


class AccountingError(PydoryError):
    """The daemon reported an impossible lifecycle step for a topic.

    For example a delivery or a post-acceptance discard with no message of that topic in
    flight. This is a bug in the daemon (a message accounted twice or never accepted),
    not in a client; the books are left unchanged.
    """


class DiscardEvent(NamedTuple):
    """One discard as :meth:`Books.discarded` recorded it, for a :class:`DiscardSink`.

    A named tuple: it is built on the hot path, and a tuple is the cheapest immutable
    record Python has.

    ``reason`` is a discard reason, or :data:`OpenOutcome.POSSIBLY_DELIVERED` (written to
    the discard log with the client's bytes, as a discard is, but never counted as one).
    ``message`` holds the bytes the caller had: the value for topic discards that passed
    one (``too_long``, refusals at enqueue), the raw bytes received for ``malformed``,
    ``unsupported_*`` and ``unclean_disconnect``, else empty. ``key`` is empty unless the
    caller passed it. ``client_timestamp_ms`` is None when no timestamp could be read.
    """

    reason: DiscardReason | OpenOutcome
    topic: str | None
    client_timestamp_ms: int | None
    key: bytes
    message: bytes
    detail: str
    transport: Transport | None
    api_version: int | None


class DiscardSink(Protocol):
    """Receives every discard and possible duplicate as the books record it.

    Called on the books' thread (the event loop) in the middle of the hot path: an
    implementation must return at once (queue, never block on I/O) and never raise.
    """

    def discarded(self, event: DiscardEvent) -> None:
        """A message (or partial message) was discarded."""

    def possible_duplicate(self, topic: str, client_timestamp_ms: int) -> None:
        """A message of ``topic`` was sent again after a send whose outcome was unknown."""
