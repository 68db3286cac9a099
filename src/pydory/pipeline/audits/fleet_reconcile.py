"""The fleet audit's arithmetic: every daemon run's books against the identities in the
lake. No I/O, no Spark (:mod:`pydory.pipeline.audits.fleet_audit` gathers both sides).

The books side is the books topic (docs/accounting.md, "The books topic"): one record per
daemon run (*incarnation*), keyed ``<host>/<incarnation>``, final once the run stopped
cleanly or the next start rebuilt it after a crash. The lake side is the landing job's
``pydory_id`` column: per host, incarnation and topic, how many rows and how many distinct
identities landed, and whether a given identity landed.

A message's identity names the run that *first* accepted it; a replay after a crash or a
stop sends it again under that identity from a later run, whose books then count it
(``replayed``) and settle it. So the outcomes of one run's messages are spread over the
runs after it, and the books can be proved per host and topic, over the chain of its runs
(the *incarnation* of an identity only bounds: no run's identities land more often than
it accepted new messages). For a host and topic, summed over its runs:

- ``new``: messages first accepted there, ``accepted − replayed`` of each run;
- ``discarded`` after acceptance (by reason), ``possibly_delivered`` (each listed one
  looked up in the lake by identity: found or not; beyond the record's list, unlisted);
- ``outstanding``: what a run kept in its spool (left for the next start, handed over
  after a crash, still in flight) that no later run replayed yet.

Each new message ends in exactly one of: landed (once: the landing job drops second
copies), discarded, possibly delivered and not landed, outstanding. So::

    landed == new − discarded − outstanding − possibly_delivered + found

exactly, when every possibly delivered message is listed and no run is still running;
otherwise ``landed`` may exceed that by the unlisted ones and by what a running run has in
flight (either may be in Kafka already), and never more. A landed identity twice is a
second copy the landing job did not drop; an identity of a run the books topic has no
record of, a run whose books cannot be proved. Each fails the audit.

What stays unprovable, and is said so in docs/accounting.md: messages a run accepted while
its spool could not take them (``unprotected``), whose fate a crash loses; and a clean
stop's partly settled group, replayed whole, whose already settled messages are counted
again by the next run (``excess``: they land once but may be settled twice).

A host's *open* run (its last run, books not final: it still runs, or it crashed and the
host never came back to rebuild them) is proved from its last books record, which a daemon
writes every 5 s (``BOOKS_PUBLISH_INTERVAL_S``): it may count up to 5 s fewer messages than
the run accepted. Its identities that landed beyond the record's count (``after_record``,
per topic: distinct identities of that run landed, less the messages the record says it
first accepted) are messages accepted after its last record; they widen the upper bound by
exactly that many and are reported as such. The lower bound stays the record's: a
message it counts delivered that is not in the lake fails the audit unless as many of the
run's messages landed beyond the record (the stated bound: within an open run's last
record interval, a loss and a later message are told apart by nothing the books hold).

A run whose books record was deleted (a tombstone on the compacted books topic) is proved
from its last record the audit read, if any (``tombstoned``, said so); with no record left
its identities in the lake are listed as *books deleted*, unproved but not a failure: an
operator removed them on purpose.

Rule: the fleet audit's verdict is decided here alone (``reconcile_fleet``).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydory.pipeline.errors import PipelineError
from pydory.wording import counted

__all__ = [
    "FleetReport",
    "HostTopic",
    "LakeIdentities",
    "RunRecord",
    "RunTopic",
    "UnreadableBooksRecord",
    "reconcile_fleet",
]

RUN_KEY_SEPARATOR = "/"


class UnreadableBooksRecord(PipelineError):
    """A record of the books topic is not a pydory books record (another writer, or a
    newer schema): counted and left out; a run without a readable record is unproved."""


# --- the books ------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunTopic:
    """One topic in one run's books."""

    accepted: int = 0
    delivered: int = 0
    possibly_delivered: int = 0
    possibly_delivered_ids: tuple[str, ...] = ()
    discarded: Mapping[str, int] = field(default_factory=dict)
    left_for_next_start: int = 0
    handed_over: int = 0
    in_flight: int = 0
    replayed: int = 0

    @property
    def pending(self) -> int:
        """Kept in the spool for a later run (or, in a running run, not settled yet)."""
        return self.left_for_next_start + self.handed_over + self.in_flight


@dataclass(frozen=True)
class RunRecord:
    """One daemon run's books, as the books topic holds them."""

    host: str
    incarnation: str
    final: bool
    ended: str
    started_ms: int
    topics: Mapping[str, RunTopic]
    replayed_from: Mapping[str, Mapping[str, int]]
    unprotected: int = 0
    #: When the run last wrote its books (the record's ``updated_ms``).
    updated_ms: int = 0
    #: The books topic's latest entry for this run is a tombstone (deleted); this record
    #: is the last one before it.
    tombstoned: bool = False

    @property
    def key(self) -> str:
        return f"{self.host}{RUN_KEY_SEPARATOR}{self.incarnation}"

    @classmethod
    def from_json(cls, record: Any) -> RunRecord:
        """Parse a books topic record's JSON value; raises :class:`UnreadableBooksRecord`."""
        try:
            if record["schema"] != 1:
                raise UnreadableBooksRecord(f"books record schema {record['schema']!r}")
            return cls(
                host=str(record["host"]),
                incarnation=str(record["incarnation"]),
                final=bool(record["final"]),
                ended=str(record["ended"]),
                started_ms=int(record["started_ms"]),
                topics={str(t): _run_topic(v) for t, v in dict(record["topics"]).items()},
                replayed_from={
                    str(run): {str(t): int(n) for t, n in dict(topics).items()}
                    for run, topics in dict(record["replayed_from"]).items()
                },
                unprotected=int(record.get("unprotected", 0)),
                updated_ms=int(record.get("updated_ms", record["started_ms"])),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise UnreadableBooksRecord(f"not a pydory books record: {error!r}") from None


def _run_topic(entry: Mapping[str, Any]) -> RunTopic:
    return RunTopic(
        accepted=int(entry["accepted"]),
        delivered=int(entry["delivered"]),
        possibly_delivered=int(entry.get("possibly_delivered", 0)),
        possibly_delivered_ids=tuple(str(i) for i in entry.get("possibly_delivered_ids", ())),
        discarded={str(r): int(n) for r, n in dict(entry.get("discarded", {})).items()},
        left_for_next_start=int(entry.get("left_for_next_start", 0)),
        handed_over=int(entry.get("handed_over", 0)),
        in_flight=int(entry.get("in_flight", 0)),
        replayed=int(entry.get("replayed", 0)),
    )


# --- the lake -------------------------------------------------------------------------------


@dataclass(frozen=True)
class LakeIdentities:
    """What the lake holds, by identity: per ``(host, incarnation, topic)`` the rows and
    the distinct identities landed; rows without a readable identity per topic; and
    ``landed(identity)``, whether one identity is in the lake."""

    per_run_topic: Mapping[tuple[str, str, str], tuple[int, int]]
    without_identity: Mapping[str, int]
    unreadable_identity: Mapping[str, int]
    landed: Callable[[str], bool]

    def distinct_of_run(self, host: str, incarnation: str, topic: str | None = None) -> int:
        """Distinct identities of one run landed (in ``topic``, or in all)."""
        return sum(
            distinct
            for (h, inc, t), (_, distinct) in self.per_run_topic.items()
            if h == host and inc == incarnation and topic in (None, t)
        )


# --- the report -----------------------------------------------------------------------------


@dataclass(frozen=True)
class HostTopic:
    """One host's books for one topic over all its runs, against the lake."""

    host: str
    topic: str
    new: int
    landed: int
    rows: int
    discarded: Mapping[str, int]
    possibly_delivered: int
    possibly_found: int
    possibly_unlisted: int
    outstanding: int
    in_flight: int
    excess: int
    unprotected: int = 0
    #: Identities of the host's open run landed beyond its last books record's count:
    #: accepted after that record (see the module docstring).
    after_record: int = 0

    @property
    def duplicates(self) -> int:
        """Rows beyond the first of each identity: second copies not dropped."""
        return self.rows - self.landed

    @property
    def expected_low(self) -> int:
        discarded = sum(self.discarded.values())
        return (
            self.new - discarded - self.outstanding - self.possibly_delivered + self.possibly_found
        )

    @property
    def expected_high(self) -> int:
        return (
            self.expected_low
            + self.possibly_unlisted
            + self.in_flight
            + self.unprotected
            + self.after_record
        )

    @property
    def exact(self) -> bool:
        return self.expected_low == self.expected_high

    @property
    def balanced(self) -> bool:
        return self.duplicates == 0 and self.expected_low <= self.landed <= self.expected_high

    def as_dict(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "accepted": self.new,
            "landed": self.landed,
            "rows": self.rows,
            "duplicates": self.duplicates,
            "discarded": dict(sorted(self.discarded.items())),
            "possibly_delivered": self.possibly_delivered,
            "possibly_delivered_found": self.possibly_found,
            "possibly_delivered_unlisted": self.possibly_unlisted,
            "outstanding": self.outstanding,
            "in_flight": self.in_flight,
            "unprotected_before_a_crash": self.unprotected,
            "second_copies_settled_again": self.excess,
            "accepted_after_last_books_record": self.after_record,
            "expected_landed": [self.expected_low, self.expected_high],
            "exact": self.exact,
            "balanced": self.balanced,
        }


@dataclass(frozen=True)
class RunLine:
    """One run, as the report lists it."""

    record: RunRecord
    new: int
    landed: int  # distinct identities it gave out that landed
    #: The host's last run, books not final: running, or crashed and never rebuilt.
    open: bool = False

    def as_dict(self) -> dict[str, Any]:
        record = self.record
        return {
            "incarnation": record.incarnation,
            "ended": record.ended,
            "final": record.final,
            "started_ms": record.started_ms,
            "accepted": sum(t.accepted for t in record.topics.values()),
            "new": self.new,
            "replayed": sum(t.replayed for t in record.topics.values()),
            "landed_under_its_identity": self.landed,
            "unprotected": record.unprotected,
            "updated_ms": record.updated_ms,
            "open": self.open,
            "tombstoned": record.tombstoned,
        }


@dataclass(frozen=True)
class HostReport:
    host: str
    topics: tuple[HostTopic, ...]
    runs: tuple[RunLine, ...]
    problems: tuple[str, ...]
    #: What the audit could not prove and why, without failing (an open run's messages
    #: accepted after its last record, a run whose books were deleted).
    notes: tuple[str, ...] = ()

    @property
    def balanced(self) -> bool:
        return not self.problems and all(topic.balanced for topic in self.topics)

    def as_dict(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "balanced": self.balanced,
            "topics": [topic.as_dict() for topic in self.topics],
            "runs": [run.as_dict() for run in self.runs],
            "problems": list(self.problems),
            "notes": list(self.notes),
        }


@dataclass(frozen=True)
class FleetReport:
    hosts: tuple[HostReport, ...]
    problems: tuple[str, ...]
    without_identity: Mapping[str, int]
    unreadable_identity: Mapping[str, int]
    sources: Mapping[str, Any] = field(default_factory=dict)

    @property
    def balanced(self) -> bool:
        return not self.problems and all(host.balanced for host in self.hosts)

    @property
    def second_copies_in_lake(self) -> int:
        return sum(topic.duplicates for host in self.hosts for topic in host.topics)

    def as_dict(self) -> dict[str, Any]:
        return {
            "balanced": self.balanced,
            "second_copies_in_lake": self.second_copies_in_lake,
            "hosts": [host.as_dict() for host in self.hosts],
            "problems": list(self.problems),
            "rows_without_identity": dict(sorted(self.without_identity.items())),
            "rows_with_unreadable_identity": dict(sorted(self.unreadable_identity.items())),
            "sources": dict(self.sources),
        }

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), indent=2) + "\n"

    def render(self) -> str:
        """The report as a table per host, then the verdict."""
        lines: list[str] = []
        for host in self.hosts:
            lines += _host_lines(host)
        lines += [f"problem: {problem}" for problem in self.problems]
        for topic, rows in sorted(self.without_identity.items()):
            lines.append(f"{topic}: {rows} rows without a pydory-id (not audited)")
        lines.append(self.verdict())
        return "\n".join(lines) + "\n"

    def verdict(self) -> str:
        runs = sum(len(host.runs) for host in self.hosts)
        where = f"{counted(len(self.hosts), 'host')}, {counted(runs, 'run')}"
        if self.balanced:
            exact = all(topic.exact for host in self.hosts for topic in host.topics)
            how = "exactly" if exact else "within what the books leave open"
            return (
                f"fleet audit: balanced {how} ({where}): every accepted message landed once, "
                f"or is discarded with a reason, or is accounted as possibly delivered or "
                f"outstanding; second copies in the lake: {self.second_copies_in_lake}"
            )
        return f"fleet audit: NOT balanced ({where})"


# --- the arithmetic -------------------------------------------------------------------------


def reconcile_fleet(
    runs: Iterable[RunRecord],
    lake: LakeIdentities,
    sources: Mapping[str, Any] | None = None,
    deleted: Iterable[str] = (),
    topics: Collection[str] | None = None,
) -> FleetReport:
    """Prove each host's books against the lake; see the module docstring. ``deleted``:
    the keys (``host/incarnation``) of runs whose only books entry left is a tombstone;
    ``topics``: prove only these (the books' other topics and the lake's left out)."""
    if topics is not None:
        runs, lake = _only_topics(runs, lake, set(topics))
    by_host: dict[str, list[RunRecord]] = {}
    for run in runs:
        by_host.setdefault(run.host, []).append(run)
    gone: dict[str, set[str]] = {}
    for key in deleted:
        host, _, incarnation = key.rpartition(RUN_KEY_SEPARATOR)
        gone.setdefault(host, set()).add(incarnation)
    landed_hosts = {host for host, _, _ in lake.per_run_topic}
    problems = [
        f"host {host}: identities in the lake, but no run of it in the books topic"
        for host in sorted(landed_hosts - set(by_host) - set(gone))
    ]
    hosts = tuple(
        _reconcile_host(
            host,
            sorted(by_host.get(host, []), key=lambda r: r.started_ms),
            lake,
            gone.get(host, set()),
        )
        for host in sorted(set(by_host) | (set(gone) & landed_hosts))
    )
    return FleetReport(
        hosts,
        tuple(problems),
        dict(lake.without_identity),
        dict(lake.unreadable_identity),
        dict(sources or {}),
    )


def _only_topics(
    runs: Iterable[RunRecord], lake: LakeIdentities, topics: set[str]
) -> tuple[list[RunRecord], LakeIdentities]:
    """The books and the lake of ``topics`` only."""
    kept_runs = [
        dataclasses.replace(
            run,
            topics={t: books for t, books in run.topics.items() if t in topics},
            replayed_from={
                incarnation: {t: n for t, n in per_topic.items() if t in topics}
                for incarnation, per_topic in run.replayed_from.items()
            },
        )
        for run in runs
    ]
    kept_lake = dataclasses.replace(
        lake,
        per_run_topic={key: n for key, n in lake.per_run_topic.items() if key[2] in topics},
        without_identity={t: n for t, n in lake.without_identity.items() if t in topics},
        unreadable_identity={t: n for t, n in lake.unreadable_identity.items() if t in topics},
    )
    return kept_runs, kept_lake


def _reconcile_host(
    host: str, runs: list[RunRecord], lake: LakeIdentities, deleted: set[str]
) -> HostReport:
    known = {run.incarnation for run in runs}
    landed_runs = {inc for h, inc, _ in lake.per_run_topic if h == host}
    problems = [
        f"run {host}/{incarnation}: its identities are in the lake, but the books topic "
        "has no record of it (its books never reached Kafka)"
        for incarnation in sorted(landed_runs - known - deleted)
    ]
    notes = [
        f"run {host}/{incarnation}: its books were deleted from the books topic (a tombstone, "
        f"no earlier record left): {lake.distinct_of_run(host, incarnation)} of its "
        "identities landed, not proved against books"
        for incarnation in sorted((landed_runs - known) & deleted)
    ]
    open_run = runs[-1] if runs and not runs[-1].final else None
    taken = _taken_from(runs)
    topics = sorted({topic for run in runs for topic in run.topics} | _lake_topics(host, lake))
    per_topic = tuple(
        _host_topic(host, topic, runs, taken, lake, open_run)
        for topic in topics
        if runs or topic in _lake_topics(host, lake, known)
    )
    lines = []
    for run in runs:
        new = sum(t.accepted - t.replayed for t in run.topics.values())
        landed = lake.distinct_of_run(host, run.incarnation)
        lines.append(RunLine(run, new, landed, open=run is open_run))
        if run.tombstoned:
            notes.append(
                f"run {run.key}: its books were deleted from the books topic (a tombstone); "
                "proved from the last record before it"
            )
        if landed > new and run is open_run:
            notes.append(_after_record_note(run, landed, new))
        elif landed > new:
            problems.append(
                f"run {run.key}: {landed} of its identities landed, more than the {new} "
                "messages it first accepted"
            )
        if not run.final:
            problems += _not_final(run, runs)
    return HostReport(host, per_topic, tuple(lines), tuple(problems), tuple(notes))


def _after_record_note(run: RunRecord, landed: int, new: int) -> str:
    return (
        f"run {run.key} has no final books (it crashed and was not restarted, or it still "
        f"runs): {landed - new} of its identities landed beyond the {new} messages its last "
        f"books record (updated_ms {run.updated_ms}) counts: accepted after that record "
        "(a daemon writes one every 5 s), not proved against books"
    )


def _not_final(run: RunRecord, runs: list[RunRecord]) -> list[str]:
    """A run whose books are not final is fine while it runs (its newest record counts
    in-flight messages as open); one followed by a later run never will be."""
    if run is runs[-1]:
        return []
    return [
        f"run {run.key}: its books are not final, but a later run started "
        "(started without its spool, or the rebuilt books never reached Kafka)"
    ]


def _taken_from(runs: list[RunRecord]) -> dict[tuple[str, str], int]:
    """Per (incarnation, topic): frames of that run's spool later runs replayed."""
    taken: dict[tuple[str, str], int] = {}
    for run in runs:
        for incarnation, topics in run.replayed_from.items():
            for topic, n in topics.items():
                taken[(incarnation, topic)] = taken.get((incarnation, topic), 0) + n
    return taken


def _lake_topics(host: str, lake: LakeIdentities, incarnations: set[str] | None = None) -> set[str]:
    return {
        topic
        for h, inc, topic in lake.per_run_topic
        if h == host and (incarnations is None or inc in incarnations)
    }


def _host_topic(
    host: str,
    topic: str,
    runs: list[RunRecord],
    taken: Mapping[tuple[str, str], int],
    lake: LakeIdentities,
    open_run: RunRecord | None,
) -> HostTopic:
    entries = [(run, run.topics[topic]) for run in runs if topic in run.topics]
    discarded: dict[str, int] = {}
    outstanding = excess = in_flight = 0
    listed: list[str] = []
    # A crash loses the fate of what the spool could not take: it may have landed.
    unprotected = sum(run.unprotected for run in runs if run.ended != "clean")
    for run, books in entries:
        for reason, n in books.discarded.items():
            discarded[reason] = discarded.get(reason, 0) + n
        left = books.pending - taken.get((run.incarnation, topic), 0)
        outstanding += max(0, left)
        excess += max(0, -left)
        in_flight += books.in_flight if not run.final else 0
        listed += books.possibly_delivered_ids
    known = {run.incarnation for run in runs}
    rows = landed = 0
    for (h, inc, t), (run_rows, distinct) in lake.per_run_topic.items():
        # A run with no books (deleted, or a problem already) is not this sum's to prove.
        if h == host and t == topic and inc in known:
            rows, landed = rows + run_rows, landed + distinct
    after_record = 0
    if open_run is not None:
        books = open_run.topics.get(topic, RunTopic())
        first_accepted = books.accepted - books.replayed
        after_record = max(
            0, lake.distinct_of_run(host, open_run.incarnation, topic) - first_accepted
        )
    possibly = sum(books.possibly_delivered for _, books in entries)
    return HostTopic(
        host=host,
        topic=topic,
        new=sum(books.accepted - books.replayed for _, books in entries),
        landed=landed,
        rows=rows,
        discarded=discarded,
        possibly_delivered=possibly,
        possibly_found=sum(1 for identity in listed if lake.landed(identity)),
        possibly_unlisted=max(0, possibly - len(listed)),
        outstanding=outstanding,
        in_flight=in_flight,
        excess=excess,
        unprotected=unprotected,
        after_record=after_record,
    )


# --- rendering ------------------------------------------------------------------------------

_HEADERS = ("topic", "accepted", "landed", "dup", "discarded", "possibly", "outstanding", "")


def _host_lines(host: HostReport) -> list[str]:
    final = sum(1 for run in host.runs if run.record.final)
    crashed = sum(1 for run in host.runs if run.record.ended == "rebuilt_after_crash")
    lines = [
        f"host {host.host}: {counted(len(host.runs), 'run')}, {final} final, "
        f"{crashed} ended without a clean stop (books rebuilt from the spool)"
    ]
    rows = [_HEADERS] + [_topic_row(topic) for topic in host.topics]
    widths = [max(len(row[i]) for row in rows) for i in range(len(_HEADERS))]
    for row in rows:
        lines.append("  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)))
    lines += [f"  problem: {problem}" for problem in host.problems]
    lines += [f"  note: {note}" for note in host.notes]
    return lines


def _topic_row(topic: HostTopic) -> tuple[str, ...]:
    discarded = ", ".join(f"{r} {n}" for r, n in sorted(topic.discarded.items()) if n)
    possibly = str(topic.possibly_delivered)
    if topic.possibly_delivered:
        possibly += f" ({topic.possibly_found} landed"
        possibly += f", {topic.possibly_unlisted} unlisted)" if topic.possibly_unlisted else ")"
    verdict = "ok" if topic.balanced else _why_not(topic)
    return (
        topic.topic,
        str(topic.new),
        str(topic.landed),
        str(topic.duplicates),
        discarded or "none",
        possibly,
        str(topic.outstanding),
        verdict,
    )


def _why_not(topic: HostTopic) -> str:
    if topic.duplicates:
        return f"NOT OK: {topic.duplicates} second copies landed"
    low, high = topic.expected_low, topic.expected_high
    expected = str(low) if low == high else f"{low}..{high}"
    return f"NOT OK: landed {topic.landed}, the books say {expected}"
