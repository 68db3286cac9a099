"""The daemon: one ``Server`` owns every component and the lifecycle.

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
import functools
import logging
import signal
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from confluent_kafka import KafkaException

from pydory.config import Config, load_config
from pydory.daemon.admission.intake import Intake
from pydory.daemon.admission.overload import Overload
from pydory.daemon.admission.ratelimit import TopicRateLimiter
from pydory.daemon.books import counters as counter_names
from pydory.daemon.books.accounting import Books
from pydory.daemon.books.commit_point import CommitPoint
from pydory.daemon.books.counters import Counters
from pydory.daemon.books.discard_log import DiscardLog
from pydory.daemon.books.keeper import DurableBooks
from pydory.daemon.books.msg_debug import MsgDebug
from pydory.daemon.books.pool import MemoryPool
from pydory.daemon.books.publisher import BooksPublisher
from pydory.daemon.delivery.dispatcher import Dispatcher
from pydory.daemon.delivery.kafka_stats import KafkaStats
from pydory.daemon.delivery.librdkafka_settings import delivery_settings, producer_profile
from pydory.daemon.delivery.metadata import MetadataClient, MetadataService
from pydory.daemon.delivery.outcomes import DeliveryLedger
from pydory.daemon.delivery.router import Router
from pydory.daemon.inputs.datagram import DatagramInput
from pydory.daemon.inputs.input_set import InputSet, InputSwap, describe
from pydory.daemon.inputs.stream import StreamInput
from pydory.daemon.logsetup import LogFiles
from pydory.daemon.reload import ReloadHistory, ReloadOutcome, ReloadPlan, plan_reload
from pydory.daemon.spool.disk_worker import DiskWorker
from pydory.daemon.spool.errors import SpoolError
from pydory.daemon.spool.identity import MessageIds, new_incarnation, resolve_host_id
from pydory.daemon.spool.segments import Spool
from pydory.daemon.spool.write_ahead import (
    WriteAhead,
    delete_replayed_segments_when_settled,
    replay_spool,
)
from pydory.daemon.systemd import notify as systemd_notify
from pydory.errors import ConfigError, ConfigErrors
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
    ) -> None:
        """``config_path``: the file SIGHUP reloads (None: reloads need a Config given)."""
        self.config = config
        self.started_at = time.time()
        self._log_files = log_files
        self.config_path = config_path
        self.reloads = ReloadHistory(config_path, self.started_at)
        self._reload_lock = asyncio.Lock()
        self.counters = Counters()
        self.discard_log = DiscardLog.from_config(config, self.counters)
        self.msg_debug = MsgDebug(config.msg_debug, self.counters)
        self.books = Books(
            config.http.discard_report_interval_s,
            config.http.bad_msg_prefix_size,
            counters=self.counters,
            discard_sink=self.discard_log.sink,
            # Client-given names Kafka does not have get bounded records (issue 21).
            unknown_topic_limit=config.http.max_unknown_topics,
            topic_known=lambda topic: self.router.knows(topic),
        )
        self.pool = MemoryPool(config.input_config.max_buffer)
        self.limiter = TopicRateLimiter(
            config.rate_limit_for, unknown_topic_limit=config.http.max_unknown_topics
        )
        self.router = Router(counters=self.counters)
        self.kafka_stats = KafkaStats()  # every producer's librdkafka statistics, merged
        settings = delivery_settings(config)
        self.commit_point = CommitPoint(lambda: self.inputs.mark())
        self.spool = _spool_of(config)
        identity = config.message_identity  # every message's name (issue 24)
        self.message_ids = MessageIds(
            resolve_host_id(identity.host_id, config.spool.path),
            new_incarnation() if self.spool is None else self.spool.incarnation,
            headers=identity.headers,
        )
        # The run's books, kept in the spool directory and published (issue 24, item 3).
        self.durable_books = DurableBooks(
            self.books,
            self.message_ids.host_id,
            self.message_ids.incarnation,
            config.spool.path,
            unprotected=lambda: self.counters.get(counter_names.SPOOL_UNPROTECTED),
            publisher=_books_publisher(config, settings.properties()),
        )
        self.write_ahead = (
            None
            if self.spool is None
            else WriteAhead(
                self.commit_point,
                self.spool,
                self.counters,
                ids=self.message_ids,
                on_fold=self.durable_books.fold,
            )
        )
        # Intake and the ledger count messages under tokens: the write-ahead's, which
        # settle the spool as well as the commit point, when there is a spool.
        tokens = self.commit_point if self.write_ahead is None else self.write_ahead
        self.metadata = MetadataService(
            settings.properties(), self.router, **_metadata_timings(config)
        )
        self.dispatcher = Dispatcher(
            settings,
            functools.partial(producer_profile, config),
            self.router,
            DeliveryLedger(self.books, self.pool, tokens, tallies=self.write_ahead),
            on_partition_trouble=self.metadata.request_refresh,
            stats=self.kafka_stats,
            counters=self.counters,
            in_flight_by_topic=self.books.in_flight_by_topic,
            msg_debug=self.msg_debug,
            kept_on_disk=(lambda token: False)
            if self.write_ahead is None
            else self.write_ahead.in_spool,
        )
        self.intake = Intake(
            books=self.books,
            pool=self.pool,
            limiter=self.limiter,
            router=self.router,
            dispatcher=self.dispatcher,
            commit_point=tokens,
            message_max_bytes=config.batching.message_max_bytes,
            prefix_size=config.http.bad_msg_prefix_size,
            on_unknown_topic=lambda topic: self.metadata.request_refresh(),
            autocreate=self._autocreate_of(config),
            msg_debug=self.msg_debug,
            write_ahead=self.write_ahead,
            unknown_topic_limit=config.http.max_unknown_topics,
            ids=self.message_ids,
        )
        self.inputs = InputSet(self.intake, self.counters, self.pool)
        self.overload = Overload(
            config.spool.overload_policy, self.pool, self.intake, self.inputs.all, self.counters
        )
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
        # Set when the replay left the previous run's segments in place (see _replay_spool).
        self._replay_ended_at: float | None = None

    # -- lifecycle ------------------------------------------------------------------------

    async def serve(self) -> None:
        """Run until asked to stop; returns after a bounded graceful shutdown."""
        loop = self._loop = asyncio.get_running_loop()
        stop = self._stop = asyncio.Event()
        self._install_signal_handlers(loop)
        metadata: asyncio.Task[None] | None = None
        try:
            self._open_spool()
            if self.durable_books.publisher is not None:
                self.durable_books.publisher.start(loop.call_soon_threadsafe)
            self.dispatcher.start(loop)
            self.dispatcher.prepare(self._configured_topics())
            # Fetched from now on, waited for by nothing: the replay and the inputs hold
            # what they take in until it comes (so it must already run during the replay).
            metadata = asyncio.ensure_future(self._follow_metadata(stop))
            if not await self._replay_spool(stop):
                return
            await self.inputs.open(self.config, loop)
            self.overload.inputs_opened()
            self.status = StatusServer(self.status_view(), count=self.counters.inc)
            await self.status.start()
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
                if self.spool is not None and self.spool.fsync_interval_ms:
                    background.append(tasks.create_task(self._fsync_spool(), name="spool-fsync"))
                if self.write_ahead is not None and self.intake.defer_when_memory_short:
                    background.append(
                        tasks.create_task(self._admit_deferred(), name="spool-deferred")
                    )
                if self.spool is not None and self._replay_ended_at is not None:
                    delete_old = delete_replayed_segments_when_settled(
                        self.spool, self.commit_point, self._replay_ended_at
                    )
                    background.append(tasks.create_task(delete_old, name="spool-replayed"))
                await stop.wait()
                for task in [*background, *self._autocreations]:
                    task.cancel()
        finally:
            self._tasks = None
            if metadata is not None and not metadata.done():
                metadata.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await metadata
            await self._shutdown()
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

    # -- the spool -----------------------------------------------------------------------

    def _open_spool(self) -> None:
        """Take the spool directory (refused if a running daemon holds it)."""
        if self.spool is None:
            return
        try:
            self.spool.open()
        except SpoolError as error:
            raise ConfigError(
                f"cannot use the spool directory: {error}", path="/doryConfig/spool/path"
            ) from error

    async def _replay_spool(self, stop: asyncio.Event) -> bool:
        """Replay what an earlier run left unsettled, before any new input is read.
        False if a stop request came first (what is left stays in the spool)."""
        if self.spool is None:
            self.durable_books.after_replay({}, {})  # nothing to rebuild: the first write
            return True
        replay = asyncio.ensure_future(
            replay_spool(self.spool, self.intake, self.overload.wait_for_room, self.books)
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
        report = replay.result().report
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
                f"; {report.corrupt_messages} messages lost to damage (spool_corrupt)"
                if report.corrupt_messages
                else "",
                f"; {report.acknowledged} settled before the crash, not replayed"
                if report.acknowledged
                else "",
            )
        self.counters.inc(counter_names.SPOOL_REPAIRED_SEGMENTS, report.repaired_segments)
        self.counters.inc(counter_names.SPOOL_TRUNCATED_BYTES, report.truncated_bytes)
        self.counters.inc(counter_names.SPOOL_SETTLED_NOT_REPLAYED, report.acknowledged)
        settled = {key: (acked.tally, acked.untallied) for key, acked in report.settled.items()}
        self.durable_books.after_replay(settled, report.handed_over)
        if replay.result().old_segments_kept:
            # Their only copy: the old segments go once those messages have settled.
            self._replay_ended_at = self.commit_point.wall_now()
            log.warning(
                "spool: %d replayed messages could not be written ahead again; the previous "
                "run's segments stay until they settle",
                replay.result().unprotected,
            )
        return True

    async def _admit_deferred(self) -> None:
        """The spool overload policy: admit the bursts kept on disk, oldest first, each
        once the pool has room again."""
        assert self.write_ahead is not None
        waiting = self.write_ahead.deferred_waiting
        while True:
            await waiting.wait()
            await self.overload.wait_for_room()
            self.intake.admit_deferred()
            await asyncio.sleep(0)  # let the inputs and delivery reports in between

    async def _fsync_spool(self) -> None:
        """The interval fsync policy: what a burst wrote reaches the disk within it."""
        assert self.spool is not None
        interval_s = (self.spool.fsync_interval_ms or 0) / 1000
        while True:
            await asyncio.sleep(interval_s)
            try:
                self.spool.maybe_fsync()
            except SpoolError:
                log.exception("spool: fsync failed")

    def _configured_topics(self) -> list[str]:
        """A topic of the default profile ("" is never configured) and every topic that
        the config gives its own batching or compression."""
        return _configured_topics(self.config)

    def _autocreate_of(self, config: Config) -> Callable[[str], None] | None:
        return self._create_topic if config.delivery.topic_autocreate else None

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
        if self.write_ahead is not None:
            left = self.write_ahead.abandon_deferred()
            if left:
                log.log(25, "spool: %d messages kept on disk for the next start", left)
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
        if self.spool is not None:
            self.spool.close()  # what is still unsettled stays for the next start
        await self.durable_books.close_clean()
        self._log_totals()
        self.msg_debug.close()
        self.discard_log.close()  # last, so the shutdown discards above are in the file

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
            return _refused(attempt, ["the daemon is shutting down"])
        if loaded is None and self.config_path is None:
            return _refused(attempt, ["no config file to reload (the daemon was given a Config)"])
        try:
            if loaded is None:
                assert self.config_path is not None
                try:
                    loaded = load_config(self.config_path)
                except OSError as error:
                    raise ConfigError(
                        f"cannot read config file {self.config_path}: {error.strerror}"
                    ) from None
            plan = plan_reload(self.config, loaded)
            await self._apply(plan)
        except ConfigErrors as errors:
            return _refused(attempt, [str(error) for error in errors.errors])
        except ConfigError as error:
            return _refused(attempt, [str(error)])
        except OSError as error:  # a new socket or log file could not be opened
            return _refused(attempt, [str(error)])
        for element in plan.restart_needed:
            log.warning("config reload: <%s> changed; it takes effect at the next restart", element)
        for warning in loaded.warnings:
            log.warning("config reload: %s", warning)
        log.log(
            25,
            "config reloaded from %s: changed %s",
            self.config_path or "<given config>",
            ", ".join(plan.changed) or "nothing",
        )
        return ReloadOutcome(
            attempt, True, time.time(), changed=plan.changed, restart_needed=plan.restart_needed
        )

    async def _apply(self, plan: ReloadPlan) -> None:
        """Apply a reload plan: first each step that can fail, undone if a later one
        does (:meth:`_prepare`); then the steps that cannot fail. Messages already taken
        in settle on the producers that took them; every message read after this
        returns meets the new config."""
        new = plan.effective
        inputs, metadata_client = await self._prepare(plan)
        if metadata_client is not None:
            self.metadata.use_client(metadata_client)
        if plan.changes("rate_limiting"):
            self.limiter.reconfigure(new.rate_limit_for)
        if plan.changes("delivery"):
            self.metadata.reconfigure(**_metadata_timings(new))
        if plan.changes("input_config"):
            self.pool.resize(new.input_config.max_buffer)
            self.inputs.apply_limits(new)
        self.intake.reconfigure(new.batching.message_max_bytes, self._autocreate_of(new))
        if plan.changes("discard_logging") or plan.changes("logging"):
            await self._swap_discard_log(new)
        running, self.config = self.config, new
        await self.inputs.swap(inputs, running, new, on_idle=self._close_retired_input)
        if inputs.opened:
            self.overload.inputs_opened()  # memory short right now: they start paused too
        if plan.changes("quotas"):
            self.inputs.set_quotas(new.quotas)  # a new input already has them

    async def _prepare(self, plan: ReloadPlan) -> tuple[InputSwap, MetadataClient | None]:
        """The steps of a reload that can fail: check the datagram size, open the inputs
        added or moved, install the new log handlers, create a new metadata client and
        the new producers. If one fails, those done are undone and the error raised."""
        new, running = plan.effective, self.config
        undo: list[Callable[[], Awaitable[None]]] = []
        try:
            if new.inputs.unix_datagram.enabled:
                limits = new.input_config
                DatagramInput.check_limits(
                    limits.max_datagram_msg_size, limits.allow_large_unix_datagrams
                )
            inputs = await self.inputs.open_changed(running, new, asyncio.get_running_loop())
            undo.append(inputs.close_opened)
            log_files = self._log_files
            if plan.changes("logging") and log_files is not None:
                log_files.apply(new.logging)

                async def restore_logging() -> None:
                    log_files.apply(running.logging)

                undo.append(restore_logging)
            metadata_client = self._new_metadata_client(plan)
            if any(plan.changes(f) for f in _PRODUCER_SECTIONS):
                self.dispatcher.reconfigure(
                    delivery_settings(new),
                    functools.partial(producer_profile, new),
                    _configured_topics(new),
                )
        except BaseException:
            for step in reversed(undo):
                await step()
            raise
        return inputs, metadata_client

    def _new_metadata_client(self, plan: ReloadPlan) -> MetadataClient | None:
        """A metadata client for new brokers, librdkafka properties or client id (None:
        none of them changed)."""
        if not any(plan.changes(f) for f in ("initial_brokers", "librdkafka", "kafka")):
            return None
        try:
            return MetadataService.new_client(delivery_settings(plan.effective).properties())
        except KafkaException as exc:
            raise ConfigError(
                f"librdkafka refuses the new settings: {exc.args[0].str()}",
                "/doryConfig/librdkafka",
            ) from None

    def _close_retired_input(self, stream_input: StreamInput) -> None:
        """A stream listener a reload retired has no connection left: close it. (At
        shutdown, the shutdown closes it with the others.)"""
        if self._tasks is None or self._stop_requested_at is not None:
            return
        if self.inputs.let_go(stream_input):
            log.info("config reload: %s closed (its last client left)", describe(stream_input))
            self._tasks.create_task(stream_input.close(), name="close-retired-input")

    async def _swap_discard_log(self, new: Config) -> None:
        """Hand the books the discard outputs of the new config before closing the old
        ones that are not reused, so that no discard falls between the two."""
        old = self.discard_log
        self.discard_log = old.reconfigured(self.config, new, self.counters)
        self.books.set_discard_sink(self.discard_log.sink)
        await asyncio.to_thread(old.close_replaced, self.discard_log)

    # -- signals --------------------------------------------------------------------------

    def _install_signal_handlers(self, loop: asyncio.AbstractEventLoop) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # tests run servers in threads; signals only reach the main thread
        assert self._stop is not None
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._request_stop)
        loop.add_signal_handler(signal.SIGHUP, self.request_reload)
        loop.add_signal_handler(signal.SIGUSR1, self._reopen_log_files)

    def _reopen_log_files(self) -> None:
        """SIGUSR1 (logrotate): reopen the log file, the discard log file and the message
        debug files."""
        if self._log_files is not None:
            self._log_files.reopen()
        self.discard_log.reopen()
        self.msg_debug.reopen()

    def _remove_signal_handlers(self, loop: asyncio.AbstractEventLoop) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1):
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


#: The Config fields that make the producers' settings (delivery_settings, producer_profile).
_PRODUCER_SECTIONS = (
    "input_config",  # librdkafka's queue limit follows maxBuffer
    "batching",
    "compression",
    "kafka",
    "delivery",
    "initial_brokers",
    "librdkafka",
)


def _metadata_timings(config: Config) -> dict[str, Any]:
    """The metadata service's refresh settings, from <msgDelivery>."""
    delivery = config.delivery
    return {
        "refresh_interval_s": delivery.metadata_refresh_interval_min * 60,
        "compare_on_refresh": delivery.compare_metadata_on_refresh,
        "min_pause_delay_s": delivery.min_pause_delay_ms / 1000,
        "pause_initial_s": delivery.pause_rate_limit_initial_ms / 1000,
        "pause_max_double": delivery.pause_rate_limit_max_double,
    }


async def _until_done(task: asyncio.Task[None]) -> None:
    """Await ``task``, started before the task group: its failure takes the server down
    like any background task's, and cancelling this cancels it."""
    await task


def _configured_topics(config: Config) -> list[str]:
    """A topic of the default profile ("" is never configured) and every topic that the
    config gives its own batching or compression."""
    return ["", *config.batching.topic_configs, *config.compression.topic_configs]


def _refused(attempt: int, errors: list[str]) -> ReloadOutcome:
    for error in errors:
        log.error("config reload refused, running on as before: %s", error)
    return ReloadOutcome(attempt, False, time.time(), errors=tuple(errors))


def _books_publisher(config: Config, properties: dict[str, Any]) -> BooksPublisher | None:
    """The books topic's publisher (None: ``<booksTopic>`` empty)."""
    topic = config.message_identity.books_topic
    if topic is None:
        return None
    return BooksPublisher(properties, topic, create=config.delivery.topic_autocreate)


def _spool_of(config: Config) -> Spool | None:
    spool = config.spool
    if spool.path is None:
        return None
    return Spool(
        spool.path,
        segment_bytes=spool.segment_bytes,
        max_bytes=spool.max_bytes,
        fsync_interval_ms=spool.fsync_interval_ms,
        disk_worker=DiskWorker(),  # the interval's syncs and the deletions off the loop
    )
