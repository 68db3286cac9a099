"""The audit's arithmetic: the daemon's books against what landed in the lake. No I/O, no Spark.

Inputs are two small summaries: :class:`DaemonBooks` (parsed from the daemon's
``/books/json``) and per Kafka partition :class:`PartitionLanding` (aggregated from the
lake by :mod:`pydory.pipeline.audit`). :func:`reconcile` turns them into an
:class:`AuditReport`: one :class:`TopicReconciliation` per topic and a verdict.

What is provable, and therefore what fails the audit:

- ``landed != delivered``: every message the daemon delivered is one Kafka record, so
  the lake must hold exactly that many rows of the topic. (Discards happen before
  Kafka, so they are shown, never landed.)
- a duplicate: the same (topic, partition, offset) landed more than once.
- a gap between a partition's first and last landed offset. pydory's producer is
  idempotent and not transactional, so a partition's offsets are dense: a missing
  offset in the middle is a record that never landed (retention only removes a
  partition's oldest records; a compacted topic would break this rule).

Offsets below a partition's first landed offset are only provably missing if the lake
was meant to start at offset 0 (``from_offset_zero``: fresh topics, nothing aged out).
Otherwise they are reported as "before first" and not held against the lake: the
landing job may have started at ``latest``, or retention may have removed them.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
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
    """One topic in the daemon's books: what it accepted, delivered and discarded."""

    topic: str
    accepted: int
    delivered: int
    discarded: Mapping[str, int]  # reason -> count, before and after acceptance
    discarded_after_acceptance: int
    in_flight: int

    @property
    def balances(self) -> bool:
        """The daemon's own invariant: accepted = delivered + discarded after + in flight."""
        return self.accepted == (self.delivered + self.discarded_after_acceptance + self.in_flight)


@dataclass(frozen=True)
class DaemonBooks:
    """The daemon's lifetime books, as served at ``/books/json``."""

    topics: Mapping[str, TopicBooks]
    received: Mapping[str, int]  # transport -> framed messages

    @classmethod
    def from_json(cls, page: Any) -> DaemonBooks:
        """Parse a ``/books/json`` document; raises :class:`BooksFormatError`."""
        try:
            topics = {entry["topic"]: _topic_books(entry) for entry in page["topics"]}
            received = {str(name): int(n) for name, n in page.get("received", {}).items()}
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise BooksFormatError(
                f"not a /books/json document ({type(error).__name__}: {error}): "
                "expected {topics: [{topic, accepted, delivered, discarded, "
                "discarded_after_acceptance, in_flight}], received: {...}}"
            ) from None
        return cls(topics=topics, received=received)

    @classmethod
    def combined(cls, fleet: Sequence[DaemonBooks]) -> DaemonBooks:
        """The books of several daemons (one per host) that feed the same topics, summed."""
        topics: dict[str, TopicBooks] = {}
        received: Counter[str] = Counter()
        for books in fleet:
            received.update(books.received)
            for name, totals in books.topics.items():
                topics[name] = totals if name not in topics else _sum(topics[name], totals)
        return cls(topics=topics, received=dict(received))

    @property
    def discarded_without_topic(self) -> int:
        """Framed messages discarded before their topic was known (malformed, bad_topic...).

        The books count every framed message once: accepted, or discarded before
        acceptance (per topic when it had one). What is left has no topic row.
        """
        accounted = sum(
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
    )


def _sum(a: TopicBooks, b: TopicBooks) -> TopicBooks:
    return TopicBooks(
        topic=a.topic,
        accepted=a.accepted + b.accepted,
        delivered=a.delivered + b.delivered,
        discarded=dict(Counter(a.discarded) + Counter(b.discarded)),
        discarded_after_acceptance=a.discarded_after_acceptance + b.discarded_after_acceptance,
        in_flight=a.in_flight + b.in_flight,
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

    @property
    def delivered(self) -> int:
        return 0 if self.books is None else self.books.delivered

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

    @property
    def balanced(self) -> bool:
        """True when every topic's lake matches the daemon's books."""
        return all(topic.balanced for topic in self.topics)

    def verdict(self) -> str:
        """One line a person (or grep) reads first."""
        delivered = sum(t.delivered for t in self.topics)
        landed = sum(t.landed for t in self.topics)
        if self.balanced:
            line = (
                f"AUDIT BALANCED: {landed} landed == {delivered} delivered over "
                f"{len(self.topics)} topics, no duplicate, no missing offset"
            )
            if self.in_flight:
                line += f" (provisional: {self.in_flight} still in flight at the daemon)"
            return line
        failing = [t.topic for t in self.topics if not t.balanced]
        return (
            f"AUDIT FAILED: {len(failing)} of {len(self.topics)} topics do not reconcile "
            f"({', '.join(failing)})"
        )

    def render(self) -> str:
        """The reconciliation table, the problems, and the verdict, as text."""
        lines = _table(self.topics)
        lines.append("")
        if self.discarded_without_topic:
            lines.append(
                f"discarded before a topic was known (malformed, bad topic...): "
                f"{self.discarded_without_topic} of {sum(self.received.values())} received"
            )
        lines.extend(self._problem_lines())
        lines.append(self.verdict())
        return "\n".join(lines) + "\n"

    def _problem_lines(self) -> list[str]:
        lines = [f"{t.topic}: {problem}" for t in self.topics for problem in t.problems]
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
) -> AuditReport:
    """Compare the books with the lake, topic by topic.

    ``topics`` limits the audit to those topics (default: every topic in either the
    books or the lake). ``gaps`` and ``duplicate_offsets`` are samples shown to the
    reader; the counts come from ``landings``.
    """
    by_topic: dict[str, list[PartitionLanding]] = {}
    for landing in landings:
        by_topic.setdefault(landing.topic, []).append(landing)
    names = sorted(set(books.topics) | set(by_topic)) if topics is None else list(topics)
    rows = tuple(
        _reconcile_topic(name, books.topics.get(name), by_topic.get(name, []), from_offset_zero)
        for name in names
    )
    return AuditReport(
        topics=rows,
        discarded_without_topic=books.discarded_without_topic,
        received=books.received,
        gaps=tuple(gap for gap in gaps if gap.topic in names),
        duplicate_offsets=tuple(dup for dup in duplicate_offsets if dup.topic in names),
        in_flight=sum(t.books.in_flight for t in rows if t.books is not None),
        from_offset_zero=from_offset_zero,
        sources=dict(sources or {}),
    )


def _reconcile_topic(
    topic: str,
    books: TopicBooks | None,
    partitions: Sequence[PartitionLanding],
    from_offset_zero: bool,
) -> TopicReconciliation:
    landed = sum(p.rows for p in partitions)
    duplicates = sum(p.duplicates for p in partitions)
    before_first = sum(p.first_offset for p in partitions)
    missing = sum(p.missing_inside for p in partitions)
    if from_offset_zero:
        missing, before_first = missing + before_first, 0
    delivered = 0 if books is None else books.delivered
    problems: list[str] = []
    if books is None:
        if landed:
            problems.append(f"{landed} rows landed for a topic not in the daemon's books")
    elif not books.balances:
        problems.append(
            f"the daemon's books do not balance: accepted {books.accepted} != delivered "
            f"{books.delivered} + discarded after acceptance "
            f"{books.discarded_after_acceptance} + in flight {books.in_flight}"
        )
    if books is not None and landed != delivered:
        difference = landed - delivered
        problems.append(
            f"landed {landed} != delivered {delivered} "
            f"({abs(difference)} {'more' if difference > 0 else 'fewer'} rows than delivered)"
        )
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
    )


# --- rendering --------------------------------------------------------------------------------

_HEADERS = ("topic", "accepted", "delivered", "landed", "dup", "missing", "discarded", "")


def _table(topics: Sequence[TopicReconciliation]) -> list[str]:
    rows = [_HEADERS, *(_row(t) for t in topics)]
    if len(topics) > 1:
        rows.append(_total_row(topics))
    widths = [max(len(row[i]) for row in rows) for i in range(len(_HEADERS))]

    def line(row: Sequence[str]) -> str:
        cells = [
            cell.ljust(width) if i in (0, 6) else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
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
        "partitions": topic.partitions,
        "landed": topic.landed,
        "duplicates": topic.duplicates,
        "missing": topic.missing,
        "before_first": topic.before_first,
        "balanced": topic.balanced,
        "problems": list(topic.problems),
    }
