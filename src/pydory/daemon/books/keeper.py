"""The run's durable books over its life: opened at start, the segments' tallies folded in
as they go, the crashed runs' books rebuilt after the replay, written and published every
few seconds, final at a clean stop (:mod:`pydory.daemon.books.durable` holds the record,
:mod:`pydory.daemon.books.publisher` the books topic).

Without a spool there is no books file (nothing survives the process but what Kafka
has): the run's record is still published, and a SIGKILL leaves its last one
``final: false`` (``ended: running``) for good.

Rule: :class:`DurableBooks` is the only code that decides when the durable books are written
and published.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Mapping

from pydory.daemon.books.accounting import Books
from pydory.daemon.books.durable import (
    CLEAN,
    BooksFile,
    RunBooks,
    SpoolFindings,
    books_file_name,
    incarnation_name,
    read_books_files,
    rebuild_crashed,
    replayed_per_topic,
    topic_books,
)
from pydory.daemon.books.publisher import BOOKS_FLUSH_S, BOOKS_PUBLISH_INTERVAL_S, BooksPublisher

log = logging.getLogger(__name__)

#: Books files of earlier runs kept in the spool directory (and published again at start).
BOOKS_FILES_KEPT = 16


class DurableBooks:
    """This run's record, its file (with a spool) and its publisher (with a topic)."""

    def __init__(
        self,
        books: Books,
        host: str,
        incarnation: int,
        directory: str | None,
        unprotected: Callable[[], int] = lambda: 0,
        publisher: BooksPublisher | None = None,
    ) -> None:
        self._books = books
        self._directory = directory
        self._unprotected = unprotected
        self.publisher = publisher
        earlier = read_books_files(directory) if directory is not None else {}
        previous = max(earlier.values(), key=lambda b: b.started_ms, default=None)
        self.run = RunBooks(
            host,
            incarnation,
            started_ms=int(time.time() * 1000),
            previous_incarnation=None if previous is None else previous.incarnation,
        )
        self.file = None if directory is None else BooksFile(directory, self.run)
        self.rebuilt: list[RunBooks] = []
        self.started = False  # after the replay: a stop before it writes no final books

    def fold(self, segment: int, stream: int, tally: Mapping[str, Mapping[str, int]]) -> None:
        """A spool segment stream's outcomes, just before its marks go."""
        if self.file is not None:
            self.file.fold(segment, stream, tally)

    def after_replay(
        self,
        settled: Mapping[tuple[int, int, int], tuple[dict[str, dict[str, int]], int]],
        handed_over: Mapping[int, Mapping[str, int]],
    ) -> list[RunBooks]:
        """The spool's replay is over: rebuild (and publish) the books of the runs that
        did not stop cleanly; this run's ``replayed_from`` is what it replayed."""
        self.started = True
        self.run.replayed_from = {
            incarnation_name(incarnation): dict(topics)
            for incarnation, topics in handed_over.items()
            if incarnation and topics
        }
        if self._directory is not None:
            findings = SpoolFindings(settled, handed_over)
            self.rebuilt = rebuild_crashed(
                self._directory, findings, self.run.incarnation, self.run.host
            )
        for books in self.rebuilt:
            log.log(
                25,
                "books: run %s ended without a clean stop: its books rebuilt from the spool",
                incarnation_name(books.incarnation),
            )
        self._republish_and_prune()
        self.write()
        return self.rebuilt

    def _republish_and_prune(self) -> None:
        """The latest earlier runs' final records published again (a stop whose last
        record did not reach Kafka in time is published now; compaction keeps one per
        run), and the books files of older runs deleted (their records are in the
        topic, or were never going to be)."""
        if self._directory is None:
            return
        earlier = sorted(
            read_books_files(self._directory).values(), key=lambda b: b.started_ms, reverse=True
        )
        for books in earlier[:BOOKS_FILES_KEPT]:
            if self.publisher is not None and books.final:
                self.publisher.publish(books)
        for books in earlier[BOOKS_FILES_KEPT:]:
            if books.final:
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(self._directory, books_file_name(books.incarnation)))

    def write(self) -> None:
        """Write this run's record (file and topic) from the live books now."""
        self.run.live = topic_books(self._books, replayed_per_topic(self.run))
        self.run.unprotected = self._unprotected()
        if self.file is not None:
            self.file.write()
        else:
            self.run.updated_ms = int(time.time() * 1000)
        if self.publisher is not None:
            self.publisher.publish(self.run)

    async def keep_current(self) -> None:
        """Every BOOKS_PUBLISH_INTERVAL_S: write and publish (cancel to stop)."""
        while True:
            await asyncio.sleep(BOOKS_PUBLISH_INTERVAL_S)
            self.write()

    async def close_clean(self, publish_within_s: float = BOOKS_FLUSH_S) -> None:
        """A clean stop (the spool closed): the final record, written and published
        (waiting at most ``publish_within_s``, and never more than ``BOOKS_FLUSH_S``, for
        Kafka); then the publisher's producer destroyed, whether this run got to start or
        not."""
        try:
            if not self.started:
                return
            self.run.final, self.run.ended = True, CLEAN
            self.write()
            if self.publisher is not None:
                wait_s = min(publish_within_s, BOOKS_FLUSH_S)
                left = await asyncio.to_thread(self.publisher.flush, wait_s)
                if left:
                    log.warning("books: %d records not published at the stop", left)
        finally:
            if self.publisher is not None:
                await asyncio.to_thread(self.publisher.close)
