"""The books that survive the process (issue 24, item 3): one record per daemon run
("incarnation"), kept in the spool directory as ``books-<incarnation>.json`` and
published to Kafka (:mod:`pydory.daemon.books.publisher`), so that the books leave the
host with the data and a run killed by SIGKILL still has its final books.

A running daemon keeps its record current: the live books (:class:`Books`, per topic)
written every few seconds, and, just before a spool segment is deleted or cut back, the
outcomes of that segment's messages folded in (``fold``; the segment's acknowledgement
marks go with it, so they must be kept first). A clean stop writes the final record
(``final: true, ended: "clean"``). The next start rebuilds the record of a run that did
not stop cleanly (:func:`rebuild_crashed`) from what that run left on disk:

- the outcomes of its settled groups, from the acknowledgement marks of its segments
  still there (each mark record holds a group's frames and their outcomes together), plus
  those already folded into its books file (the folded ``(segment, stream)`` pairs named
  there are not counted twice if the crash came between a fold and the deletion);
- what it handed over: every frame of its segments not marked settled, which this start
  replays (counted per topic by recovery): so ``handed_over`` of the killed run equals
  ``replayed_from`` it in the next one, by construction;
- the rest (discards before acceptance, ``unprotected``: messages the spool could not
  take, whose outcome a crash loses) from its last live write: best effort, and said so.

Per topic, a rebuilt record balances ``accepted = delivered + possibly_delivered +
discarded (after acceptance, by reason) + handed_over`` over the messages the spool
protected; a clean one ``accepted = delivered + possibly_delivered + discarded +
left_for_next_start`` (``in_flight`` 0) over all of them. The record's JSON is
documented in docs/accounting.md ("The books topic").

Rule: the only code that knows the durable books record (:class:`RunBooks`), its file
(:class:`BooksFile`), and how a crashed run's books are rebuilt (``rebuild_crashed``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydory.daemon.books.accounting import Books
from pydory.daemon.books.events import AFTER_ACCEPTANCE

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
BOOKS_FILE = re.compile(r"books-([0-9a-f]{16})\.json", re.ASCII)
#: The folded (segment, stream) pairs a books file names: only the last can be on disk
#: still after a crash (a fold is followed at once by its deletion), a few more kept.
FOLDED_STREAMS_KEPT = 64
RUNNING, CLEAN, REBUILT = "running", "clean", "rebuilt_after_crash"

#: Topic -> outcome -> count (:mod:`pydory.daemon.spool.tallies`).
Tally = dict[str, dict[str, int]]


def books_file_name(incarnation: int) -> str:
    return f"books-{incarnation:016x}.json"


def incarnation_name(incarnation: int) -> str:
    return f"{incarnation:016x}"


@dataclass
class RunBooks:
    """One run's durable books (its file, and the record published)."""

    host: str
    incarnation: int
    started_ms: int
    previous_incarnation: int | None = None
    updated_ms: int = 0
    final: bool = False
    ended: str = RUNNING
    live: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per topic, the live books at the last write (see ``topic_books``)."""
    unprotected: int = 0
    """Messages accepted while the spool could not take them (a crash loses their fate)."""
    folded: Tally = field(default_factory=dict)
    folded_streams: list[tuple[int, int]] = field(default_factory=list)
    replayed_from: dict[str, dict[str, int]] = field(default_factory=dict)
    """Per incarnation (16 hex digits), per topic: frames of its spool this run replayed."""
    rebuilt: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per topic, after a crash: the books from the marks (see ``rebuild_crashed``)."""
    untallied: int = 0  # frames marked settled by a mark with no outcomes (version 1)

    @property
    def key(self) -> str:
        """The record's key in the books topic (compacted: the latest per run stays)."""
        return f"{self.host}/{incarnation_name(self.incarnation)}"

    def record(self) -> dict[str, Any]:
        """The published record (and the file's content)."""
        return {
            "schema": SCHEMA_VERSION,
            "host": self.host,
            "incarnation": incarnation_name(self.incarnation),
            "previous_incarnation": (
                None
                if self.previous_incarnation is None
                else incarnation_name(self.previous_incarnation)
            ),
            "started_ms": self.started_ms,
            "updated_ms": self.updated_ms,
            "final": self.final,
            "ended": self.ended,
            "topics": self.rebuilt if self.ended == REBUILT else self.live,
            "unprotected": self.unprotected,
            "untallied": self.untallied,
            "replayed_from": self.replayed_from,
            "folded": self.folded,
            "folded_streams": [list(pair) for pair in self.folded_streams],
        }

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> RunBooks:
        """A record read back; KeyError, TypeError or ValueError if it is not one."""
        if record["schema"] != SCHEMA_VERSION:
            raise ValueError(f"books schema {record['schema']!r}")
        previous = record["previous_incarnation"]
        books = cls(
            host=str(record["host"]),
            incarnation=int(record["incarnation"], 16),
            started_ms=int(record["started_ms"]),
            previous_incarnation=None if previous is None else int(previous, 16),
            updated_ms=int(record["updated_ms"]),
            final=bool(record["final"]),
            ended=str(record["ended"]),
            unprotected=int(record["unprotected"]),
            untallied=int(record.get("untallied", 0)),
            folded=_tally(record["folded"]),
            folded_streams=[(int(s), int(t)) for s, t in record["folded_streams"]],
            replayed_from={str(k): dict(v) for k, v in record["replayed_from"].items()},
        )
        topics = dict(record["topics"])
        if books.ended == REBUILT:
            books.rebuilt = topics
        else:
            books.live = topics
        return books


def _tally(value: Any) -> Tally:
    return {
        str(topic): {str(o): int(n) for o, n in outcomes.items()}
        for topic, outcomes in value.items()
    }


def topic_books(books: Books, replayed: Mapping[str, int]) -> dict[str, dict[str, Any]]:
    """Per topic, the live books as the record shows them (``replayed``: per topic, the
    messages this run replayed from an earlier one's spool, within ``accepted``)."""
    topics: dict[str, dict[str, Any]] = {}
    for topic, totals in books.per_topic().items():
        discarded = {r.value: n for r, n in totals.discarded_by_reason.items() if n}
        topics[topic] = {
            "accepted": totals.accepted,
            "delivered": totals.delivered,
            "possibly_delivered": totals.possibly_delivered,
            "possibly_delivered_ids": list(totals.possibly_delivered_ids),
            "discarded": {r: n for r, n in discarded.items() if r in AFTER_ACCEPTANCE},
            "refused": {r: n for r, n in discarded.items() if r not in AFTER_ACCEPTANCE},
            "left_for_next_start": totals.left_for_next_start,
            "in_flight": totals.in_flight,
            "replayed": replayed.get(topic, 0),
        }
    return topics


def rebuilt_topic_books(
    tally: Mapping[str, Mapping[str, int]],
    handed_over: Mapping[str, int],
    live: Mapping[str, Mapping[str, Any]],
    replayed: Mapping[str, int],
) -> dict[str, dict[str, Any]]:
    """Per topic, a crashed run's books: outcomes from its marks and folds (``tally``),
    what the next start replayed (``handed_over``), what it replayed itself at its start
    (``replayed``: its own ``replayed_from``, summed per topic; its last live write may
    predate the replayed messages' admission), and discards before acceptance from its
    last live write (best effort)."""
    topics: dict[str, dict[str, Any]] = {}
    for topic in sorted({*tally, *handed_over, *live}):
        outcomes = dict(tally.get(topic, {}))
        delivered = outcomes.pop("delivered", 0)
        possibly = outcomes.pop("possibly_delivered", 0)
        handed = handed_over.get(topic, 0)
        last_live = live.get(topic, {})
        topics[topic] = {
            "accepted": delivered + possibly + sum(outcomes.values()) + handed,
            "delivered": delivered,
            "possibly_delivered": possibly,
            # Best effort, like ``refused``: the marks count them, they do not name them.
            "possibly_delivered_ids": list(last_live.get("possibly_delivered_ids", [])),
            "discarded": {r: n for r, n in sorted(outcomes.items()) if n},
            "refused": dict(last_live.get("refused", {})),
            "left_for_next_start": 0,
            "handed_over": handed,
            "in_flight": 0,
            "replayed": replayed.get(topic, 0),
        }
    return topics


def replayed_per_topic(books: RunBooks) -> dict[str, int]:
    """Per topic, the messages ``books``' run replayed from earlier runs' spools."""
    replayed: dict[str, int] = {}
    for topics in books.replayed_from.values():
        for topic, n in topics.items():
            replayed[topic] = replayed.get(topic, 0) + n
    return replayed


class BooksFile:
    """This run's record in the spool directory: rewritten whole (a new file renamed
    over the old, so a crash leaves one or the other, never half of one)."""

    def __init__(self, directory: str, books: RunBooks) -> None:
        self.directory = directory
        self.books = books
        self.path = os.path.join(directory, books_file_name(books.incarnation))
        self.errors = 0

    def fold(self, segment: int, stream: int, tally: Mapping[str, Mapping[str, int]]) -> None:
        """A segment stream's outcomes, kept before its marks go (``WriteAhead`` on_fold)."""
        folded = self.books.folded
        for topic, outcomes in tally.items():
            into = folded.setdefault(topic, {})
            for outcome, n in outcomes.items():
                into[outcome] = into.get(outcome, 0) + n
        streams = self.books.folded_streams
        streams.append((segment, stream))
        del streams[:-FOLDED_STREAMS_KEPT]
        self.write()

    def write(self) -> bool:
        """Write the record now; False (logged once per episode) if the disk refused."""
        self.books.updated_ms = int(time.time() * 1000)
        if write_books(self.path, self.books):
            self.errors = 0
            return True
        self.errors += 1
        if self.errors == 1:
            log.warning("books: cannot write [%s]: a crash would lose this run's books", self.path)
        return False


def write_books(path: str, books: RunBooks) -> bool:
    temporary = f"{path}.tmp"
    data = json.dumps(books.record(), separators=(",", ":"), sort_keys=True).encode()
    try:
        with open(temporary, "wb") as file:
            file.write(data)
        os.replace(temporary, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        return False
    return True


def read_books_files(directory: str) -> dict[int, RunBooks]:
    """Every readable books file in ``directory``, by incarnation (one that cannot be
    read is logged and left alone)."""
    found: dict[int, RunBooks] = {}
    try:
        names = os.listdir(directory)
    except OSError:
        return found
    for name in names:
        match = BOOKS_FILE.fullmatch(name)
        if match is None:
            continue
        path = os.path.join(directory, name)
        try:
            with open(path, "rb") as file:
                books = RunBooks.from_record(json.load(file))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning("books: [%s] cannot be read (%s): left alone", path, exc)
            continue
        found[books.incarnation] = books
    return found


@dataclass(frozen=True)
class SpoolFindings:
    """What recovery found of earlier runs (:class:`RecoveryReport`'s ``settled`` and
    ``handed_over``): per ``(incarnation, segment, stream)``, the outcomes its marks hold
    and how many frames they marked without outcomes; per incarnation and topic, the
    frames replayed."""

    settled: Mapping[tuple[int, int, int], tuple[Tally, int]]
    handed_over: Mapping[int, Mapping[str, int]]


def rebuild_crashed(
    directory: str, findings: SpoolFindings, current: int, host: str
) -> list[RunBooks]:
    """The final books of every earlier run that did not stop cleanly, rebuilt from its
    books file and what its segments and marks held (``findings``), written back
    (``final``, ``ended: rebuilt_after_crash``) and returned, oldest first. A run whose
    file is gone (a crash before its first write) gets a record of its own from its
    segments alone (started 0: unknown)."""
    files = read_books_files(directory)
    runs = {incarnation for incarnation, _, _ in findings.settled}
    runs |= {incarnation for incarnation in findings.handed_over if incarnation}
    rebuilt: list[RunBooks] = []
    for incarnation in sorted(
        runs | set(files), key=lambda i: files[i].started_ms if i in files else 0
    ):
        if incarnation == current:
            continue
        books = files.get(incarnation) or RunBooks(host, incarnation, started_ms=0)
        if books.final:
            continue
        folded = set(books.folded_streams)
        tally: Tally = {}
        for topic, outcomes in books.folded.items():
            tally[topic] = dict(outcomes)
        for (run, segment, stream), (marked, untallied) in findings.settled.items():
            if run != incarnation or (segment, stream) in folded:
                continue
            books.untallied += untallied
            for topic, outcomes in marked.items():
                into = tally.setdefault(topic, {})
                for outcome, n in outcomes.items():
                    into[outcome] = into.get(outcome, 0) + n
        books.rebuilt = rebuilt_topic_books(
            tally, findings.handed_over.get(incarnation, {}), books.live, replayed_per_topic(books)
        )
        books.final, books.ended = True, REBUILT
        books.updated_ms = int(time.time() * 1000)
        if not write_books(os.path.join(directory, books_file_name(incarnation)), books):
            log.warning("books: cannot write the rebuilt books of run %016x", incarnation)
        rebuilt.append(books)
    return rebuilt
