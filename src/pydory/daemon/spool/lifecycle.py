"""The spool's life on the event loop: opened, replayed, kept synced, closed.

At start the spool directory is taken (refused, as a config error, if a running daemon
holds it) and what an earlier run left unsettled is replayed before any input is read; the
replay's report is logged and counted, and the books file learns what the previous run's
marks settled. While the daemon runs, up to three tasks of the server's task group serve
the spool: the interval fsync, the bursts the spool overload policy kept on disk (admitted
again, oldest first, as the pool has room), and the deletion of the previous run's segments
once the messages replayed from them settle (when the spool could not take them again).
At shutdown, the deferred bursts stay on disk for the next start and the spool is closed.

Without a spool directory every step is nothing, except that the books file hears that
there was nothing to replay.

Rule: :class:`SpoolLifecycle` is the only code that opens, replays and closes the spool
and starts its tasks on the loop; ``Server`` only calls it at the lifecycle's steps.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

from pydory.daemon.books import counters as counter_names
from pydory.daemon.books.accounting import Books
from pydory.daemon.books.commit_point import CommitPoint
from pydory.daemon.books.counters import Counters
from pydory.daemon.books.keeper import DurableBooks
from pydory.daemon.spool.errors import SpoolError
from pydory.daemon.spool.recovery import RecoveryReport
from pydory.daemon.spool.segments import Spool
from pydory.daemon.spool.write_ahead import (
    Replay,
    Replayer,
    WriteAhead,
    delete_replayed_segments_when_settled,
    replay_spool,
)
from pydory.errors import ConfigError
from pydory.wording import counted

log = logging.getLogger(__name__)


class SpoolIntake(Replayer, Protocol):
    """What the spool's life needs of the intake: replayed bursts in, deferred ones again."""

    defer_when_memory_short: bool

    def admit_deferred(self) -> bool: ...


class SpoolLifecycle:
    """The spool (or None: no spool directory) and its write-ahead, run on the loop."""

    def __init__(
        self,
        spool: Spool | None,
        write_ahead: WriteAhead | None,
        *,
        intake: SpoolIntake,
        wait_for_room: Callable[[], Awaitable[None]],
        books: Books,
        durable_books: DurableBooks,
        commit_point: CommitPoint,
        counters: Counters,
    ) -> None:
        self.spool = spool
        self.write_ahead = write_ahead
        self._intake = intake
        self._wait_for_room = wait_for_room
        self._books = books
        self._durable_books = durable_books
        self._commit_point = commit_point
        self._counters = counters
        # Set when the replay left the previous run's segments in place (see replay).
        self._replay_ended_at: float | None = None

    def open(self) -> None:
        """Take the spool directory (refused if a running daemon holds it)."""
        if self.spool is None:
            return
        try:
            self.spool.open()
        except SpoolError as error:
            raise ConfigError(
                f"cannot use the spool directory: {error}", path="/doryConfig/spool/path"
            ) from error

    async def replay(self, stop: asyncio.Event) -> bool:
        """Replay what an earlier run left unsettled, before any new input is read.
        False if a stop request came first (what is left stays in the spool)."""
        if self.spool is None:
            self._durable_books.after_replay({}, {})  # nothing to rebuild: the first write
            return True
        replay = asyncio.ensure_future(
            replay_spool(self.spool, self._intake, self._wait_for_room, self._books)
        )
        stopped = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait({replay, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
            if not replay.done():
                replay.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await replay
        if replay.cancelled():
            return False
        self._replayed(replay.result())
        return True

    def _replayed(self, replay: Replay) -> None:
        """The replay's report logged and counted; the books file told what was settled."""
        report = replay.report
        _log_report(report)
        self._counters.inc(counter_names.SPOOL_REPAIRED_SEGMENTS, report.repaired_segments)
        self._counters.inc(counter_names.SPOOL_TRUNCATED_BYTES, report.truncated_bytes)
        self._counters.inc(counter_names.SPOOL_SETTLED_NOT_REPLAYED, report.acknowledged)
        settled = {key: (acked.tally, acked.untallied) for key, acked in report.settled.items()}
        self._durable_books.after_replay(settled, report.handed_over)
        if replay.old_segments_kept:
            # Their only copy: the old segments go once those messages have settled.
            self._replay_ended_at = self._commit_point.wall_now()
            log.warning(
                "spool: %d replayed messages could not be written ahead again; the previous "
                "run's segments stay until they settle",
                replay.unprotected,
            )

    def start_tasks(self, tasks: asyncio.TaskGroup) -> list[asyncio.Task[None]]:
        """The spool's background tasks, started in ``tasks`` (the server cancels them at
        shutdown): the interval fsync, the deferred bursts, the replayed segments' deletion."""
        started = []
        if self.spool is not None and self.spool.fsync_interval_ms:
            started.append(tasks.create_task(self._fsync_every_interval(), name="spool-fsync"))
        if self.write_ahead is not None and self._intake.defer_when_memory_short:
            started.append(tasks.create_task(self._admit_deferred(), name="spool-deferred"))
        if self.spool is not None and self._replay_ended_at is not None:
            delete_old = delete_replayed_segments_when_settled(
                self.spool, self._commit_point, self._replay_ended_at
            )
            started.append(tasks.create_task(delete_old, name="spool-replayed"))
        return started

    async def _admit_deferred(self) -> None:
        """The spool overload policy: admit the bursts kept on disk, oldest first, each
        once the pool has room again."""
        assert self.write_ahead is not None
        waiting = self.write_ahead.deferred_waiting
        while True:
            await waiting.wait()
            await self._wait_for_room()
            self._intake.admit_deferred()
            await asyncio.sleep(0)  # let the inputs and delivery reports in between

    async def _fsync_every_interval(self) -> None:
        """The interval fsync policy: what a burst wrote reaches the disk within it."""
        assert self.spool is not None
        interval_s = (self.spool.fsync_interval_ms or 0) / 1000
        while True:
            await asyncio.sleep(interval_s)
            try:
                self.spool.maybe_fsync()
            except SpoolError:
                log.exception("spool: fsync failed")

    def keep_deferred_for_next_start(self) -> None:
        """At shutdown: the bursts still deferred stay on disk, unadmitted."""
        if self.write_ahead is not None:
            left = self.write_ahead.abandon_deferred()
            if left:
                log.log(25, "spool: %d messages kept on disk for the next start", left)

    def close(self) -> None:
        """At shutdown, after delivery: what is still unsettled stays for the next start."""
        if self.spool is not None:
            self.spool.close()


def _log_report(report: RecoveryReport) -> None:
    for problem in report.problems:
        log.warning("spool: %s", problem)
    if report.problems_not_listed:
        log.warning("spool: and %d more problems like these", report.problems_not_listed)
    if report.records or report.problems:
        log.log(
            25,
            "spool: replayed %d messages from %d segments (%d repaired, %d bytes cut)%s%s",
            report.records - report.acknowledged,
            report.segments,
            report.repaired_segments,
            report.truncated_bytes,
            f"; {counted(report.corrupt_messages, 'message')} lost to damage (spool_corrupt)"
            if report.corrupt_messages
            else "",
            f"; {report.acknowledged} settled before the crash, not replayed"
            if report.acknowledged
            else "",
        )
