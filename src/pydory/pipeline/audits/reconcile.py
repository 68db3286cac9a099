"""The audit's arithmetic: the daemon's books against what landed in the lake. No I/O, no Spark.

Inputs are two small summaries: :class:`DaemonBooks` (parsed from the daemon's
``/books/json``) and per Kafka partition :class:`PartitionLanding` (aggregated from the
lake by :mod:`pydory.pipeline.audits.audit`). :func:`reconcile` turns them into an
:class:`AuditReport`: one :class:`TopicReconciliation` per topic and a verdict.

What is provable, and therefore what fails the audit:

- ``landed`` outside ``delivered .. delivered + possibly_delivered + left_for_next_start``.
  Every message the daemon delivered is one Kafka record, so the lake holds at least that
  many rows of the topic. A message the books call *possibly delivered* (its last attempt
  ended in an error after which Kafka may have it or not) may be one record more, or not.
  So may a message *left for the next start* (kept in the spool at shutdown): the shutdown
  deadline purges messages whose request may already have reached the leader
  (``_PURGE_INFLIGHT``), and those stay in the spool like the ones never sent. Without
  either outcome the two bounds meet: ``landed == delivered``. Discards happen before
  Kafka, so they are shown, never landed. A second copy the daemon flagged as a possible
  duplicate (a resend after such an error) is a row the per-topic books do not count:
  it fails the audit as more rows than the books allow.
- a duplicate: the same (topic, partition, offset) landed more than once.
- a gap between a partition's first and last landed offset. pydory's producer is
  idempotent and not transactional, so a partition's offsets are dense: a missing
  offset in the middle is a record that never landed (retention only removes a
  partition's oldest records; a compacted topic would break this rule), unless it is a
  second copy the landing job dropped (a daemon's replay after a crash: its identity is
  in the lake). The audit job counts those from Kafka (``second_copies``, per topic),
  and they are not missing; without Kafka every gap counts.

Offsets below a partition's first landed offset are only provably missing if the lake
was meant to start at offset 0 (``from_offset_zero``: fresh topics, nothing aged out).
Otherwise they are reported as "before first" and not held against the lake: the
landing job may have started at ``latest``, or retention may have removed them.

A message left for the next start is accepted again by that start (replayed from the
spool) and counted in its books: books combined over a restart count it in the later
run's ``accepted`` and, once Kafka acknowledges it, ``delivered``. It is never counted
missing.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydory.pipeline.errors import PipelineError

__all__ = [
    "AuditReport",
    "BooksFormatError",
    "DaemonBooks",
    "DuplicateOffset",
    "OffsetGap",
    "PartitionLanding",
    "TopicBooks",
    "TopicReconciliation",
    "reconcile",
]


class BooksFormatError(PipelineError):
    """The daemon's books (``/books/json`` or a saved copy) do not have the expected shape.

    Point the audit at a pydory status server (``--status``) or at a file saved from
    its ``/books/json`` page (``--books``).
    """


# --- the daemon's side ------------------------------------------------------------------------


@dataclass(frozen=True)
class TopicBooks:
    """One topic in the daemon's books: what it accepted, delivered and discarded, and the
    accepted messages whose place the books cannot state (possibly delivered, left for the
    next start)."""

    topic: str
    accepted: int
    delivered: int
    discarded: Mapping[str, int]  # reason -> count, before and after acceptance
    discarded_after_acceptance: int
    in_flight: int
    possibly_delivered: int = 0  # in Kafka or not: the last attempt's error cannot tell
    left_for_next_start: int = 0  # in the spool at shutdown: the next start accepts them

    @property
    def balances(self) -> bool:
        """The daemon's own invariant: accepted = delivered + possibly delivered + left for
        the next start + discarded after acceptance + in flight."""
        return self.accepted == (
            self.delivered
            + self.possibly_delivered
            + self.left_for_next_start
            + self.discarded_after_acceptance
            + self.in_flight
        )

    @property
    def maybe_in_kafka(self) -> int:
        """Accepted messages that may be a Kafka record of this run, or not: the possibly
        delivered, and those left for the next start (one purged in flight at the shutdown
        deadline may have reached the leader)."""
        return self.possibly_delivered + self.left_for_next_start


@dataclass(frozen=True)
class DaemonBooks:
    """The daemon's lifetime books, as served at ``/books/json``."""

    topics: Mapping[str, TopicBooks]
    received: Mapping[str, int]  # transport -> framed messages
    # Received, neither accepted nor discarded yet (held until metadata or a topic's creation).
    waiting_for_metadata: int = 0

    @classmethod
    def from_json(cls, page: Any) -> DaemonBooks:
        """Parse a ``/books/json`` document; raises :class:`BooksFormatError`."""
        try:
            topics = {entry["topic"]: _topic_books(entry) for entry in page["topics"]}
            received = {str(name): int(n) for name, n in page.get("received", {}).items()}
            # Absent from books saved by a pydory that never held a message for metadata.
            waiting = int(page.get("waiting_for_metadata", 0))
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise BooksFormatError(
                f"not a /books/json document ({type(error).__name__}: {error}): "
                "expected {topics: [{topic, accepted, delivered, discarded, "
                "discarded_after_acceptance, in_flight}], received: {...}}"
            ) from None
        return cls(topics=topics, received=received, waiting_for_metadata=waiting)

    @classmethod
    def combined(cls, fleet: Sequence[DaemonBooks]) -> DaemonBooks:
        """The books of several daemons (one per host) that feed the same topics, summed."""
        topics: dict[str, TopicBooks] = {}
        received: Counter[str] = Counter()
        for books in fleet:
            received.update(books.received)
            for name, totals in books.topics.items():
                topics[name] = totals if name not in topics else _sum(topics[name], totals)
        waiting = sum(books.waiting_for_metadata for books in fleet)
        return cls(topics=topics, received=dict(received), waiting_for_metadata=waiting)

    @property
    def discarded_without_topic(self) -> int:
        """Framed messages discarded before their topic was known (malformed, bad_topic...).

        The books count every framed message once: accepted, discarded before acceptance
        (per topic when it had one), or still waiting for metadata. What is left has no
        topic row.
        """
        accounted = self.waiting_for_metadata + sum(
            books.accepted + _before_acceptance(books) for books in self.topics.values()
        )
        return max(sum(self.received.values()) - accounted, 0)


def _topic_books(entry: Mapping[str, Any]) -> TopicBooks:
    return TopicBooks(
        topic=str(entry["topic"]),
        accepted=int(entry["accepted"]),
        delivered=int(entry["delivered"]),
        discarded={str(reason): int(n) for reason, n in entry["discarded"].items()},
        discarded_after_acceptance=int(entry["discarded_after_acceptance"]),
        in_flight=int(entry["in_flight"]),
        # Both absent from books saved by a pydory before these outcomes existed: its
        # runs had none (a timeout was a discard, a graceful stop discarded the rest).
        possibly_delivered=int(entry.get("possibly_delivered", 0)),
        left_for_next_start=int(entry.get("left_for_next_start", 0)),
    )


def _sum(a: TopicBooks, b: TopicBooks) -> TopicBooks:
    return TopicBooks(
        topic=a.topic,
        accepted=a.accepted + b.accepted,
        delivered=a.delivered + b.delivered,
        discarded=dict(Counter(a.discarded) + Counter(b.discarded)),
        discarded_after_acceptance=a.discarded_after_acceptance + b.discarded_after_acceptance,
        in_flight=a.in_flight + b.in_flight,
        possibly_delivered=a.possibly_delivered + b.possibly_delivered,
        left_for_next_start=a.left_for_next_start + b.left_for_next_start,
    )


def _before_acceptance(books: TopicBooks) -> int:
    return sum(books.discarded.values()) - books.discarded_after_acceptance


# --- the lake's side --------------------------------------------------------------------------


@dataclass(frozen=True)
class PartitionLanding:
    """What landed for one Kafka partition: row count and the offsets' shape."""

    topic: str
    partition: int
    rows: int
    distinct_offsets: int
    first_offset: int
    last_offset: int

    @property
    def duplicates(self) -> int:
        """Rows beyond the first copy of each offset."""
        return self.rows - self.distinct_offsets

    @property
    def missing_inside(self) -> int:
        """Offsets between the first and last landed offset that did not land."""
        return self.last_offset - self.first_offset + 1 - self.distinct_offsets


@dataclass(frozen=True)
class OffsetGap:
    """Offsets ``first..last`` (inclusive) of one partition that did not land."""

    topic: str
    partition: int
    first: int
    last: int

    def __str__(self) -> str:
        span = str(self.first) if self.first == self.last else f"{self.first}-{self.last}"
        return f"{self.topic}[{self.partition}] offsets {span}"


@dataclass(frozen=True)
class DuplicateOffset:
    """One offset that landed ``copies`` times."""

    topic: str
    partition: int
    offset: int
    copies: int

    def __str__(self) -> str:
        return f"{self.topic}[{self.partition}] offset {self.offset} x{self.copies}"


# --- the reconciliation -----------------------------------------------------------------------


@dataclass(frozen=True)
class TopicReconciliation:
    """One topic: the daemon's books next to the lake's rows, and what does not match."""

    topic: str
    books: TopicBooks | None  # None: the lake has the topic, the daemon never saw it
    partitions: int
    landed: int
    duplicates: int
    missing: int  # provably missing offsets (gaps; below the first too if from offset 0)
    before_first: int  # offsets below the first landed one, when not counted as missing
    problems: tuple[str, ...]
    #: Offsets not landed that are second copies the landing job dropped (not missing).
    second_copies: int = 0

    @property
    def delivered(self) -> int:
        return 0 if self.books is None else self.books.delivered

    @property
    def possibly_delivered(self) -> int:
        return 0 if self.books is None else self.books.possibly_delivered

    @property
    def left_for_next_start(self) -> int:
        return 0 if self.books is None else self.books.left_for_next_start

    @property
    def possibly_delivered_landed(self) -> int | None:
        """How many of the messages that may be in Kafka or not (possibly delivered, left
        for the next start) landed: ``landed - delivered``. None when ``landed`` is outside
        the bounds, where the difference is not theirs to explain."""
        maybe_in_kafka = self.possibly_delivered + self.left_for_next_start
        beyond = self.landed - self.delivered
        return beyond if 0 <= beyond <= maybe_in_kafka else None

    @property
    def balanced(self) -> bool:
        return not self.problems


@dataclass(frozen=True)
class AuditReport:
    """The audit's result: per-topic rows, samples of what is wrong, and the verdict."""

    topics: tuple[TopicReconciliation, ...]
    discarded_without_topic: int
    received: Mapping[str, int]
    gaps: tuple[OffsetGap, ...] = ()  # a sample, for the reader to look at
    duplicate_offsets: tuple[DuplicateOffset, ...] = ()  # a sample
    in_flight: int = 0
    from_offset_zero: bool = False
    sources: Mapping[str, str] = field(default_factory=dict)  # "lake", "books" -> where
    waiting_for_metadata: int = 0
    #: Whether the gaps were read from Kafka to tell dropped second copies from missing.
    gaps_checked: bool = False

    @property
    def balanced(self) -> bool:
        """True when every topic's lake matches the daemon's books."""
        return all(topic.balanced for topic in self.topics)

    @property
    def possibly_delivered(self) -> int:
        return sum(t.possibly_delivered for t in self.topics)

    @property
    def left_for_next_start(self) -> int:
        return sum(t.left_for_next_start for t in self.topics)

    def verdict(self) -> str:
        """One line a person (or grep) reads first."""
        if not self.balanced:
            failing = [t.topic for t in self.topics if not t.balanced]
            return (
                f"AUDIT FAILED: {len(failing)} of {len(self.topics)} topics do not reconcile "
                f"({', '.join(failing)})"
            )
        delivered = sum(t.delivered for t in self.topics)
        landed = sum(t.landed for t in self.topics)
        possibly, left = self.possibly_delivered, self.left_for_next_start
        if possibly or left:
            # Balanced: every topic's landed - delivered is within its bounds, so the sum
            # is how many of these messages landed.
            line = (
                f"AUDIT BALANCED: {landed} landed over {len(self.topics)} topics: "
                f"{delivered} delivered, {_maybe_in_kafka(possibly, left)}, "
                f"{landed - delivered} of them landed; no duplicate, no missing offset"
            )
        else:
            line = (
                f"AUDIT BALANCED: {landed} landed == {delivered} delivered over "
                f"{len(self.topics)} topics, no duplicate, no missing offset"
            )
        if left:
            line += (
                f"; the {left} left for the next start stay in the spool, unacknowledged: "
                "the next start accepts them again and counts them in its own books"
            )
        waiting = []
        if self.in_flight:
            waiting.append(f"{self.in_flight} still in flight at the daemon")
        if self.waiting_for_metadata:
            waiting.append(f"{self.waiting_for_metadata} waiting for metadata at the daemon")
        if waiting:
            line += f" (provisional: {', '.join(waiting)})"
        return line

    def render(self) -> str:
        """The reconciliation table, the problems, and the verdict, as text."""
        lines = _table(self.topics)
        lines.append("")
        if self.discarded_without_topic:
            lines.append(
                f"discarded before a topic was known (malformed, bad topic...): "
                f"{self.discarded_without_topic} of {sum(self.received.values())} received"
            )
        lines.extend(_maybe_in_kafka_lines(self.topics))
        lines.extend(self._problem_lines())
        lines.append(self.verdict())
        return "\n".join(lines) + "\n"

    def _problem_lines(self) -> list[str]:
        lines = [
            f"{t.topic}: {t.second_copies} offsets not landed are second copies the landing "
            "job dropped (read from Kafka: their identities are in the lake), not missing"
            for t in self.topics
            if t.second_copies
        ]
        if not self.gaps_checked and any(t.missing for t in self.topics):
            lines.append(
                "gaps not read from Kafka (no --bootstrap-servers, none recorded in the lake): "
                "a second copy the landing job dropped counts as missing"
            )
        lines += [f"{t.topic}: {problem}" for t in self.topics for problem in t.problems]
        lines.extend(f"  missing: {gap}" for gap in self.gaps)
        lines.extend(f"  duplicate: {dup}" for dup in self.duplicate_offsets)
        return lines

    def to_json(self) -> str:
        """The report as a JSON document (``pydory pipeline audit --json``)."""
        return json.dumps(self.as_dict(), indent=2) + "\n"

    def as_dict(self) -> dict[str, Any]:
        return {
            "balanced": self.balanced,
            "verdict": self.verdict(),
            "sources": dict(self.sources),
            "from_offset_zero": self.from_offset_zero,
            "topics": [_topic_dict(t) for t in self.topics],
            "received": dict(self.received),
            "discarded_without_topic": self.discarded_without_topic,
            "in_flight": self.in_flight,
            "possibly_delivered": self.possibly_delivered,
            "left_for_next_start": self.left_for_next_start,
            "waiting_for_metadata": self.waiting_for_metadata,
            "gaps_checked_in_kafka": self.gaps_checked,
            "gaps": [vars(gap) for gap in self.gaps],
            "duplicate_offsets": [vars(dup) for dup in self.duplicate_offsets],
        }


def reconcile(
    books: DaemonBooks,
    landings: Iterable[PartitionLanding],
    *,
    topics: Sequence[str] | None = None,
    from_offset_zero: bool = False,
    gaps: Sequence[OffsetGap] = (),
    duplicate_offsets: Sequence[DuplicateOffset] = (),
    sources: Mapping[str, str] | None = None,
    second_copies: Mapping[str, int] | None = None,
    gaps_checked: bool = False,
) -> AuditReport:
    """Compare the books with the lake, topic by topic.

    ``topics`` limits the audit to those topics (default: every topic in either the
    books or the lake). ``gaps`` and ``duplicate_offsets`` are samples shown to the
    reader; the counts come from ``landings``. ``second_copies``: per topic, the offsets
    in the gaps that are second copies the landing job dropped (``gaps_checked``: read
    from Kafka); they are not missing.
    """
    dropped = second_copies or {}
    by_topic: dict[str, list[PartitionLanding]] = {}
    for landing in landings:
        by_topic.setdefault(landing.topic, []).append(landing)
    names = sorted(set(books.topics) | set(by_topic)) if topics is None else list(topics)
    rows = tuple(
        _reconcile_topic(
            name,
            books.topics.get(name),
            by_topic.get(name, []),
            from_offset_zero,
            dropped.get(name, 0),
        )
        for name in names
    )
    missing_in = {row.topic for row in rows if row.missing}
    return AuditReport(
        topics=rows,
        discarded_without_topic=books.discarded_without_topic,
        received=books.received,
        # A gap of second copies only is not shown as missing.
        gaps=tuple(gap for gap in gaps if gap.topic in missing_in),
        duplicate_offsets=tuple(dup for dup in duplicate_offsets if dup.topic in names),
        in_flight=sum(t.books.in_flight for t in rows if t.books is not None),
        from_offset_zero=from_offset_zero,
        sources=dict(sources or {}),
        waiting_for_metadata=books.waiting_for_metadata,
        gaps_checked=gaps_checked,
    )


def _reconcile_topic(
    topic: str,
    books: TopicBooks | None,
    partitions: Sequence[PartitionLanding],
    from_offset_zero: bool,
    second_copies: int = 0,
) -> TopicReconciliation:
    landed = sum(p.rows for p in partitions)
    duplicates = sum(p.duplicates for p in partitions)
    before_first = sum(p.first_offset for p in partitions)
    missing = sum(p.missing_inside for p in partitions)
    if from_offset_zero:
        missing, before_first = missing + before_first, 0
    # Counted within the gaps: never more than they hold.
    second_copies = min(second_copies, missing)
    missing -= second_copies
    problems: list[str] = []
    if books is None:
        if landed:
            problems.append(f"{landed} rows landed for a topic not in the daemon's books")
    else:
        if not books.balances:
            problems.append(
                f"the daemon's books do not balance: accepted {books.accepted} != delivered "
                f"{books.delivered} + possibly delivered {books.possibly_delivered} + left "
                f"for the next start {books.left_for_next_start} + discarded after "
                f"acceptance {books.discarded_after_acceptance} + in flight {books.in_flight}"
            )
        problems.extend(_landed_out_of_bounds(landed, books))
    if duplicates:
        problems.append(f"{duplicates} duplicate rows (same partition and offset)")
    if missing:
        problems.append(f"{missing} offsets missing from the lake")
    return TopicReconciliation(
        topic=topic,
        books=books,
        partitions=len(partitions),
        landed=landed,
        duplicates=duplicates,
        missing=missing,
        before_first=before_first,
        problems=tuple(problems),
        second_copies=second_copies,
    )


def _landed_out_of_bounds(landed: int, books: TopicBooks) -> list[str]:
    """The bound ``landed`` breaks, if any: ``delivered <= landed <= delivered +
    maybe_in_kafka`` (see the module docstring)."""
    delivered, most = books.delivered, books.delivered + books.maybe_in_kafka
    if landed < delivered:
        return [
            f"landed {landed} < delivered {delivered} "
            f"({delivered - landed} fewer rows than delivered)"
        ]
    if landed <= most:
        return []
    if most == delivered:
        return [
            f"landed {landed} > delivered {delivered} "
            f"({landed - delivered} more rows than delivered)"
        ]
    problem = (
        f"landed {landed} > delivered {delivered} + "
        f"{_maybe_in_kafka(books.possibly_delivered, books.left_for_next_start, ' + ')} "
        f"({landed - most} more rows than the books allow)"
    )
    if books.left_for_next_start:
        # The likeliest cause: the lake also holds what the next start delivered of them.
        problem += (
            "; the next start delivers those left for it: audit with its books too "
            "(--books/--status for every run)"
        )
    return [problem]


def _maybe_in_kafka(possibly: int, left: int, joiner: str = " and ") -> str:
    """'N possibly delivered', 'M left for the next start', or both, by ``joiner``."""
    parts = []
    if possibly:
        parts.append(f"{possibly} possibly delivered")
    if left:
        parts.append(f"{left} left for the next start")
    return joiner.join(parts)


def _maybe_in_kafka_lines(topics: Sequence[TopicReconciliation]) -> list[str]:
    """One line per topic holding messages that may be in Kafka or not: how many landed."""
    lines = []
    for topic in topics:
        if not (topic.possibly_delivered or topic.left_for_next_start):
            continue
        line = (
            f"{topic.topic}: {_maybe_in_kafka(topic.possibly_delivered, topic.left_for_next_start)}"
        )
        landed = topic.possibly_delivered_landed
        lines.append(line if landed is None else f"{line}, {landed} of them landed")
    return lines


# --- rendering --------------------------------------------------------------------------------

_HEADERS = (
    "topic",
    "accepted",
    "delivered",
    "possibly",
    "left",
    "landed",
    "dup",
    "missing",
    "discarded",
    "",
)
_LEFT_ALIGNED = frozenset({"topic", "discarded"})
#: Shown only when some topic has one: the common table stays as it was before them.
_WHEN_ANY: Mapping[str, Callable[[TopicReconciliation], int]] = {
    "possibly": lambda topic: topic.possibly_delivered,
    "left": lambda topic: topic.left_for_next_start,
}


def _table(topics: Sequence[TopicReconciliation]) -> list[str]:
    shown = [
        i
        for i, header in enumerate(_HEADERS)
        if header not in _WHEN_ANY or any(_WHEN_ANY[header](t) for t in topics)
    ]
    full_rows = [_HEADERS, *(_row(t) for t in topics)]
    if len(topics) > 1:
        full_rows.append(_total_row(topics))
    rows = [tuple(row[i] for i in shown) for row in full_rows]
    headers = rows[0]
    widths = [max(len(row[i]) for row in rows) for i in range(len(headers))]

    def line(row: Sequence[str]) -> str:
        cells = [
            cell.ljust(width) if header in _LEFT_ALIGNED else cell.rjust(width)
            for cell, width, header in zip(row, widths, headers, strict=True)
        ]
        return "  ".join(cells).rstrip()

    rule = "  ".join("-" * width for width in widths if width).rstrip()
    body = [line(row) for row in rows[1:]]
    if len(topics) > 1:
        body.insert(-1, rule)
    return [line(rows[0]), rule, *body]


def _row(topic: TopicReconciliation) -> tuple[str, ...]:
    books = topic.books
    return (
        topic.topic,
        "-" if books is None else str(books.accepted),
        "-" if books is None else str(books.delivered),
        "-" if books is None else str(books.possibly_delivered),
        "-" if books is None else str(books.left_for_next_start),
        str(topic.landed),
        str(topic.duplicates),
        str(topic.missing),
        "-" if books is None else _discards(books.discarded),
        "ok" if topic.balanced else "MISMATCH",
    )


def _total_row(topics: Sequence[TopicReconciliation]) -> tuple[str, ...]:
    discards: dict[str, int] = {}
    for topic in topics:
        for reason, n in (topic.books.discarded if topic.books else {}).items():
            discards[reason] = discards.get(reason, 0) + n
    return (
        "total",
        str(sum(t.books.accepted for t in topics if t.books)),
        str(sum(t.delivered for t in topics)),
        str(sum(t.possibly_delivered for t in topics)),
        str(sum(t.left_for_next_start for t in topics)),
        str(sum(t.landed for t in topics)),
        str(sum(t.duplicates for t in topics)),
        str(sum(t.missing for t in topics)),
        _discards(discards),
        "ok" if all(t.balanced for t in topics) else "MISMATCH",
    )


def _discards(by_reason: Mapping[str, int]) -> str:
    shown = [f"{reason} {n}" for reason, n in sorted(by_reason.items()) if n]
    return ", ".join(shown) if shown else "none"


def _topic_dict(topic: TopicReconciliation) -> dict[str, Any]:
    books = topic.books
    return {
        "topic": topic.topic,
        "accepted": None if books is None else books.accepted,
        "delivered": None if books is None else books.delivered,
        "discarded": {} if books is None else dict(books.discarded),
        "in_flight": None if books is None else books.in_flight,
        "possibly_delivered": None if books is None else books.possibly_delivered,
        "left_for_next_start": None if books is None else books.left_for_next_start,
        # landed - delivered when within the bounds; null when a bound broke.
        "possibly_delivered_landed": None if books is None else topic.possibly_delivered_landed,
        "partitions": topic.partitions,
        "landed": topic.landed,
        "duplicates": topic.duplicates,
        "missing": topic.missing,
        "second_copies_dropped": topic.second_copies,
        "before_first": topic.before_first,
        "balanced": topic.balanced,
        "problems": list(topic.problems),
    }
