"""Outcome tallies: what became of the spooled messages of one run, kept on disk as they
settle, so that the books of a run killed by SIGKILL can be rebuilt by the next start
(issue 24, item 3).

The spool is the durable record of acceptance, the acknowledgement marks
(:mod:`pydory.daemon.spool.acks`) the durable record of settlement. A tally is
``{topic: {outcome: count}}``, the outcomes being the final ones after acceptance:
``delivered``, ``possibly_delivered`` and the after-acceptance discard reasons
(``kafka_error``, ``failed_delivery_attempts``, ``shutdown_delay``). It is kept in three
places, each written with what it counts, so that no crash can separate the two:

- per group (a write-ahead token: :class:`pydory.daemon.spool.acks.SettledGroups`): the
  tally of the group's messages goes into the same acknowledgement record as its frame
  ranges (one CRC'd write: both are read back, or neither);
- per segment stream: everything settled in it, folded into the run's books file
  (:mod:`pydory.daemon.books.durable`) just *before* the segment is deleted or cut back
  to a new stream (its marks go with it); the file names the folded ``(segment,
  stream)`` pairs, so a crash between the fold and the deletion never counts one twice;
- what no group holds (a message the spool could not take: ``spool_unprotected``) is in
  no tally: the live books count it, best effort (``unprotected``).

A message of a group still unmarked at the crash is replayed by the next start, so it is
*handed over* (counted per topic by recovery, from the segment's writer), whatever the
killed run did with it; the rebuilt books are then
``accepted = delivered + possibly_delivered + discarded + handed_over`` per topic.

Rule: the only code that knows a tally's outcomes (``OUTCOMES``), its bytes
(:func:`encode_tally`), and what a run settled per group and per segment stream.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from pydory.daemon.books.events import AFTER_ACCEPTANCE
from pydory.errors import ClientProtocolError
from pydory.wire import decode, parse_any_partition

DELIVERED = "delivered"
POSSIBLY_DELIVERED = "possibly_delivered"
OUTCOMES: frozenset[str] = frozenset({DELIVERED, POSSIBLY_DELIVERED, *AFTER_ACCEPTANCE})
"""A tally's outcomes: every final outcome after acceptance but left for next start
(a message kept at shutdown settles nothing: it is replayed, like an unmarked one)."""

#: Topic -> outcome -> count.
Tally = dict[str, dict[str, int]]

MAX_TALLY_BYTES = 1 << 20
"""A tally larger than this is not believed (a group of a few ms never holds one)."""
_MAX_COUNT = 2**63


class BadTally(ValueError):
    """Bytes or JSON that are not a tally."""


def add(tally: Tally, topic: str, outcome: str, n: int = 1) -> None:
    outcomes = tally.get(topic)
    if outcomes is None:
        outcomes = tally[topic] = {}
    outcomes[outcome] = outcomes.get(outcome, 0) + n


def merge(into: Tally, other: Mapping[str, Mapping[str, int]]) -> Tally:
    """Add ``other`` into ``into`` (returned)."""
    for topic, outcomes in other.items():
        for outcome, n in outcomes.items():
            add(into, topic, outcome, n)
    return into


def total(tally: Mapping[str, Mapping[str, int]]) -> int:
    return sum(n for outcomes in tally.values() for n in outcomes.values())


def encode_tally(tally: Mapping[str, Mapping[str, int]]) -> bytes:
    """Compact JSON (the topic names are a client's: JSON escapes anything)."""
    return json.dumps(tally, separators=(",", ":"), sort_keys=True).encode("utf-8")


def decode_tally(data: bytes) -> Tally:
    """The tally ``data`` holds; BadTally for anything else, whatever the bytes."""
    if len(data) > MAX_TALLY_BYTES:
        raise BadTally("tally too large")
    try:
        parsed = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise BadTally(f"tally is not JSON: {exc}") from None
    return validated_tally(parsed)


def validated_tally(parsed: object) -> Tally:
    """``parsed`` (JSON) as a tally; BadTally if it is not one."""
    if not isinstance(parsed, dict):
        raise BadTally("tally is not an object")
    tally: Tally = {}
    for topic, outcomes in parsed.items():
        if not isinstance(outcomes, dict):
            raise BadTally(f"tally of topic {topic!r} is not an object")
        for outcome, n in outcomes.items():
            if outcome not in OUTCOMES:
                raise BadTally(f"unknown outcome {outcome!r}")
            if type(n) is not int or not 0 <= n < _MAX_COUNT:
                raise BadTally(f"impossible count {n!r}")
            add(tally, topic, outcome, n)
    return tally


def handed_over_topic(value: bytes) -> str | None:
    """The topic of a client message replayed from a spool frame (None: it would not
    decode, so it was never accepted and is handed over to no topic's books)."""
    fields = parse_any_partition(value)
    if fields is not None:
        return fields[0]
    try:
        return decode(value).topic
    except ClientProtocolError:
        return None


class SegmentTallies:
    """This run's tally per segment, until the segment is deleted or cut back to a new
    stream (folded). Keyed by segment alone: a segment is cut back only once every
    message of its stream settled, so nothing of the old stream comes after the fold."""

    def __init__(self) -> None:
        self._segments: dict[int, Tally] = {}

    def settled(self, segment: int, topic: str, outcome: str, n: int) -> None:
        """Recorded before the message's token is closed (which may fold the segment)."""
        tally = self._segments.get(segment)
        if tally is None:
            tally = self._segments[segment] = {}
        add(tally, topic, outcome, n)

    def take(self, segment: int) -> Tally:
        """The tally of a segment stream being folded (deleted or cut back)."""
        return self._segments.pop(segment, None) or {}
