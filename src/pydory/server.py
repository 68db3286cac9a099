"""The daemon's lifecycle: one ``Server`` serves, handles signals, runs the background tasks
and shuts down.

What it runs is built elsewhere: ``daemon/assembly.py`` wires the components from the
``Config``, ``daemon/spool/lifecycle.py`` opens, replays and closes the spool, and
``daemon/reloading.py`` applies a reload (SIGHUP, ``pydory reload``) and undoes it if a step
fails. The server calls them at the lifecycle's steps and hands the status interface its
``DaemonView``.

Start-up: the spool replayed, then the input sockets and the status pages open at once,
as Dory's do, whether or not Kafka answers yet: the metadata fetch is retried in the
background until a broker answers, and messages for topics it does not show yet wait in
the memory pool (``Intake.metadata_arrived`` routes them when it comes).
Running: background tasks (metadata refresh, discard report periods) live in one
TaskGroup; a task that dies takes the server down loudly instead of leaving it half-alive.
Shutdown (SIGTERM / SIGINT / ``request_shutdown``): inputs close first (socket files
removed), then librdkafka gets shutdownMaxDelay to deliver what it holds; whatever is left
is purged and discarded with reason shutdown_delay, so the books balance at exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from pydory.config import Config
from pydory.daemon.assembly import assemble, configured_topics
from pydory.daemon.books import counters as counter_names
from pydory.daemon.inputs.handover import Handover
from pydory.daemon.inputs.input_set import describe
from pydory.daemon.inputs.stream import StreamInput
from pydory.daemon.logsetup import LogFiles
from pydory.daemon.reload import ReloadHistory, ReloadOutcome
from pydory.daemon.reloading import RunningDaemon, refused, reload_config
from pydory.daemon.systemd import notify as systemd_notify
from pydory.status import DaemonView, StatusServer

log = logging.getLogger(__name__)

#: Beyond shutdownMaxDelay, how long purging and settling the last reports may take.
SHUTDOWN_GRACE_S = 10.0
#: Longest sleep between checks that the discard report period should roll over.
REPORT_ROLL_CHECK_S = 60.0

T = TypeVar("T")


class Server:
    """Dory's data path, from client sockets to Kafka acknowledgements."""

    def __init__(
        self,
        config: Config,
        log_files: LogFiles | None = None,
        config_path: str | None = None,
        handover: Handover | None = None,
    ) -> None:
        """``config_path``: the file SIGHUP reloads (None: reloads need a Config given);
        ``handover``: input sockets bound before (by ``pydory serve``, or systemd's)."""
        self.config = config
        self.started_at = time.time()
        self._log_files = log_files
        self.config_path = config_path
        self.reloads = ReloadHistory(config_path, self.started_at)
        self.handover = Handover() if handover is None else handover
        self._reload_lock = asyncio.Lock()
        parts = self.parts = assemble(config, create_topic=self._create_topic)
        # The components the lifecycle, the status view and the tests reach by name.
        self.counters = parts.counters
        self.msg_debug = parts.msg_debug
        self.books = parts.books
        self.pool = parts.pool
        self.router = parts.router
        self.kafka_stats = parts.kafka_stats
        self.commit_point = parts.commit_point
        self.spool = parts.spool
        self.durable_books = parts.durable_books
        self.metadata = parts.metadata
        self.dispatcher = parts.dispatcher
        self.intake = parts.intake
        self.inputs = parts.inputs
        self.overload = parts.overload
        self.spool_life = parts.spool_life
        self.heap_trim = parts.heap_trim
        self.status: StatusServer | None = None
        self.ready = threading.Event()  # set once inputs are open (for tests and tools)
        # ... and this once the first metadata is in (the daemon routes from then on).
        self.metadata_ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        # monotonic time of the first stop request: shutdownMaxDelay counts from here, not
        # from when a busy loop got round to the shutdown sequence.
        self._stop_requested_at: float | None = None
        self._tasks: asyncio.TaskGroup | None = None
        # Topic autocreations under way; cancelled at shutdown, which then settles the
        # messages they held (intake.settle_pending_topics).
        self._autocreations: set[asyncio.Task[None]] = set()

    # -- lifecycle ------------------------------------------------------------------------

    async def serve(self) -> None:
        """Run until asked to stop; returns after a bounded graceful shutdown."""
        loop = self._loop = asyncio.get_running_loop()
        stop = self._stop = asyncio.Event()
        self._install_signal_handlers(loop)
        metadata: asyncio.Task[None] | None = None
        try:
            self.spool_life.open()
            if self.durable_books.publisher is not None:
                self.durable_books.publisher.start(loop.call_soon_threadsafe)
            self.dispatcher.start(loop)
            self.dispatcher.prepare(configured_topics(self.config))
            # Fetched from now on, waited for by nothing: the replay and the inputs hold
            # what they take in until it comes (so it must already run during the replay).
            metadata = asyncio.ensure_future(self._follow_metadata(stop))
            if not await self.spool_life.replay(stop):
                return
            await self.inputs.open(self.config, loop, self.handover)
            self.handover.close_rest()  # bound early for an address the config does not name
            self.overload.inputs_opened()
            self.status = StatusServer(self.status_view(), count=self.counters.inc)
            await self.status.start()
            self.heap_trim.start(loop)
            self.heap_trim.after_start_up()  # before "ready": what start-up freed goes back
            self.ready.set()
            log.log(25, "pydory ready; bootstrap %s", self.config.bootstrap_servers)
            # Type=notify: the inputs and pages are open. Metadata may not be in yet, as
            # with Dory: what clients send meanwhile waits in memory (docs/operations.md).
            systemd_notify("READY=1")
            async with asyncio.TaskGroup() as tasks:
                self._tasks = tasks
                background = [
                    tasks.create_task(_until_done(metadata), name="metadata-refresh"),
                    tasks.create_task(self._roll_discard_reports(), name="discard-report"),
                    tasks.create_task(self._check_report_reads(), name="discard-query-check"),
                    tasks.create_task(self.durable_books.keep_current(), name="books-durable"),
                ]
                background += self.spool_life.start_tasks(tasks)
                await stop.wait()
                for task in [*background, *self._autocreations]:
                    task.cancel()
        finally:
            self._tasks = None
            self.heap_trim.stop()
            if metadata is not None and not metadata.done():
                metadata.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await metadata
            await self._shutdown()
            self.handover.close_rest()  # if the inputs never opened
            self._remove_signal_handlers(loop)

    async def _follow_metadata(self, stop: asyncio.Event) -> None:
        """The first metadata (retried until a broker answers), then what waited for it
        routed; then a refresh every metadataRefreshInterval and on demand."""
        if not await self.metadata.initial(stop):
            return
        held = self.intake.pending_topic_messages
        self.intake.metadata_arrived()
        self.metadata_ready.set()
        if held:
            log.log(25, "metadata is in: %d messages that waited for it routed", held)
        await self.metadata.run()

    def request_shutdown(self) -> None:
        """Thread-safe: begin a graceful shutdown."""
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._request_stop)

    def _request_stop(self) -> None:
        """On the loop (signal handler or request_shutdown): note when, then stop."""
        if self._stop_requested_at is None:
            self._stop_requested_at = time.monotonic()
            self.overload.stopping()
            # Under a flood the loop would keep reading input and reach the shutdown late;
            # paused, the inputs leave it in the kernel for the shutdown read.
            self.inputs.pause()
        assert self._stop is not None
        self._stop.set()

    def call_soon(self, fn: Callable[[], T], timeout: float = 10.0) -> T:
        """Thread-safe: run ``fn`` on the server's loop and return its result (tests, tools)."""
        assert self._loop is not None, "server not running"

        async def call() -> T:
            return fn()

        return asyncio.run_coroutine_threadsafe(call(), self._loop).result(timeout)

    async def _shutdown(self) -> None:
        log.log(25, "pydory shutting down")
        systemd_notify("STOPPING=1")
        await self.inputs.close()  # each reads what clients already sent, then closes
        self.commit_point.release_waiters()  # long-polls answer now, not at the close timeout
        if self.status is not None:
            await self.status.close()
        self.intake.settle_pending_topics()
        self.spool_life.keep_deferred_for_next_start()
        max_delay_s = self.config.delivery.shutdown_max_delay_ms / 1000
        try:
            await asyncio.wait_for(
                self.dispatcher.shutdown(max_delay_s, requested_at=self._stop_requested_at),
                max_delay_s + SHUTDOWN_GRACE_S,
            )
        except TimeoutError:
            log.exception(
                "librdkafka did not settle every message within the shutdown grace period"
            )
        self.metadata.close()
        self.spool_life.close()  # what is still unsettled stays for the next start
        # The final books record is on disk already; publishing it may take only what is
        # left of shutdownMaxDelay (slow brokers must not stretch the stop past it).
        started = self._stop_requested_at or time.monotonic()
        await self.durable_books.close_clean(max(0.0, started + max_delay_s - time.monotonic()))
        self._log_totals()
        self.msg_debug.close()
        self.parts.discard_log.close()  # last, so the shutdown discards above are in the file

    def _log_totals(self) -> None:
        for topic, totals in sorted(self.books.per_topic().items()):
            log.log(
                25,
                "topic %s: accepted %d, delivered %d, possibly delivered %d, "
                "left for next start %d, discarded %s, in flight %d",
                topic,
                totals.accepted,
                totals.delivered,
                totals.possibly_delivered,
                totals.left_for_next_start,
                {str(reason): n for reason, n in totals.discarded_by_reason.items()},
                totals.in_flight,
            )

    # -- background work ------------------------------------------------------------------

    async def _roll_discard_reports(self) -> None:
        interval = self.config.http.discard_report_interval_s
        if interval <= 0:
            return
        while True:
            await asyncio.sleep(min(interval, REPORT_ROLL_CHECK_S))
            self.books.maybe_roll()

    async def _check_report_reads(self) -> None:
        """Dory's discard query check: every report interval + 1 s, warn (and count) when
        nobody asked for the discard report during a whole interval."""
        interval = self.config.http.discard_report_interval_s
        if interval <= 0:
            return
        while True:
            await asyncio.sleep(interval + 1)
            self.books.check_report_read()

    def _create_topic(self, topic: str) -> None:
        async def create() -> None:
            await self.metadata.create_topic(topic)
            self.intake.topic_creation_settled(topic)

        if self._tasks is not None:
            task = self._tasks.create_task(create(), name=f"autocreate-{topic}")
            self._autocreations.add(task)
            task.add_done_callback(self._autocreations.discard)
        else:
            self.intake.topic_creation_settled(topic)

    # -- config reload (SIGHUP, ``pydory reload``) -----------------------------------------

    def request_reload(self) -> None:
        """On the loop (SIGHUP): reload the config file, in the background."""
        if self._tasks is None or self._stop_requested_at is not None:
            log.warning("config reload asked for while starting or stopping: ignored")
            return
        self._tasks.create_task(self.reload(), name="config-reload")

    async def reload(self, loaded: Config | None = None) -> ReloadOutcome:
        """Read the config file again (or take ``loaded``) and apply it without losing,
        duplicating or double-counting a message. An invalid file changes nothing: the
        daemon runs on, every error is logged and the failure counted. One at a time."""
        async with self._reload_lock:
            attempt = self.reloads.next_attempt()
            systemd_notify(f"RELOADING=1\nMONOTONIC_USEC={time.monotonic_ns() // 1000}")
            try:
                outcome = await self._reload(attempt, loaded)
            finally:
                systemd_notify("READY=1")
            self.reloads.record(outcome)
            self.counters.inc(
                counter_names.CONFIG_RELOADS if outcome.ok else counter_names.CONFIG_RELOAD_FAILURES
            )
            return outcome

    async def _reload(self, attempt: int, loaded: Config | None) -> ReloadOutcome:
        if self._stop_requested_at is not None:
            return refused(attempt, ["the daemon is shutting down"])
        running = RunningDaemon(
            self.parts,
            self._log_files,
            adopt=self._adopt,
            on_input_idle=self._close_retired_input,
            create_topic=self._create_topic,
        )
        return await reload_config(attempt, self.config, loaded, self.config_path, running)

    def _adopt(self, config: Config) -> None:
        """A reload's config is the running one from here on."""
        self.config = config

    def _close_retired_input(self, stream_input: StreamInput) -> None:
        """A stream listener a reload retired has no connection left: close it. (At
        shutdown, the shutdown closes it with the others.)"""
        if self._tasks is None or self._stop_requested_at is not None:
            return
        if self.inputs.let_go(stream_input):
            log.info("config reload: %s closed (its last client left)", describe(stream_input))
            self._tasks.create_task(stream_input.close(), name="close-retired-input")

    # -- signals --------------------------------------------------------------------------

    def _install_signal_handlers(self, loop: asyncio.AbstractEventLoop) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # tests run servers in threads; signals only reach the main thread
        assert self._stop is not None
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._request_stop)
        loop.add_signal_handler(signal.SIGHUP, self.request_reload)
        loop.add_signal_handler(signal.SIGUSR1, self._reopen_log_files)
        # Dory blocks every signal it does not handle: SIGQUIT does nothing to it. Its
        # default here (a core dump) would end the daemon without its shutdown.
        loop.add_signal_handler(signal.SIGQUIT, _ignore_sigquit)

    def _reopen_log_files(self) -> None:
        """SIGUSR1 (logrotate): reopen the log file, the discard log file and the message
        debug files."""
        if self._log_files is not None:
            self._log_files.reopen()
        self.parts.discard_log.reopen()
        self.msg_debug.reopen()

    def _remove_signal_handlers(self, loop: asyncio.AbstractEventLoop) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGQUIT):
            with contextlib.suppress(ValueError, RuntimeError):
                loop.remove_signal_handler(sig)

    # -- views for status and tests -------------------------------------------------------

    def status_view(self) -> DaemonView:
        """What the status interface may read of this daemon (it never sees the server)."""
        return DaemonView(
            started_at=self.started_at,
            http=self.config.http,
            books=self.books,
            pool=self.pool,
            counters=self.counters,
            kafka_stats=self.kafka_stats,
            metadata=self.metadata,
            commit_point=self.commit_point,
            layout=lambda: self.router.snapshot,
            pending_topic_messages=lambda: self.intake.pending_topic_messages,
            rerouted=lambda: self.dispatcher.rerouted,
            request_metadata_refresh=self._request_metadata_refresh,
            msg_debug=self.msg_debug if self.msg_debug.enabled else None,
            spool=self.spool,
            overload=self.overload,
            reloads=self.reloads,
            stopping=lambda: self._stop_requested_at is not None,
            datagram_input=lambda: self.inputs.datagram,
            stream_input=lambda: self.inputs.unix_stream,
        )

    def _request_metadata_refresh(self) -> None:
        self.metadata.request_refresh()
        self.counters.inc(counter_names.METADATA_UPDATE_REQUESTED)

    def snapshot(self) -> dict[str, Any]:
        """A plain summary of the books (the status interface renders richer views)."""
        return {
            "received": {str(k): v for k, v in self.books.received_by_transport().items()},
            "topics": {
                topic: {
                    "accepted": t.accepted,
                    "delivered": t.delivered,
                    "discarded": {str(r): n for r, n in t.discarded_by_reason.items()},
                    "in_flight": t.in_flight,
                    "possibly_delivered": t.possibly_delivered,
                    "left_for_next_start": t.left_for_next_start,
                }
                for topic, t in self.books.per_topic().items()
            },
            "discards": {str(r): n for r, n in self.books.lifetime_discards_by_reason().items()},
            "pool_used": self.pool.used,
            "rerouted": self.dispatcher.rerouted,
        }


async def _until_done(task: asyncio.Task[None]) -> None:
    """Await ``task``, started before the task group: its failure takes the server down
    like any background task's, and cancelling this cancels it."""
    await task


def _ignore_sigquit() -> None:
    log.warning("SIGQUIT ignored, as Dory ignores it: stop the daemon with SIGTERM or SIGINT")
