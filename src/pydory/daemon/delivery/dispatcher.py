"""Dispatch: the facade of delivery. It sends each accepted message through the right
producer, serves the producers, and settles their delivery reports on the ``Ledger``.

librdkafka (seed 003) does the network work: its broker threads batch, compress, send and
retry. This module only decides *which* producer a message goes to (one per
``ProducerProfile``: librdkafka_settings maps Dory's settings onto librdkafka properties,
docs/librdkafka-mapping.md), and hands each batch of delivery reports to ``settlement``
(the outcome decided in ``outcomes``): delivered, rerouted, or discarded with a reason.

Threads: everything runs on the event-loop thread, librdkafka's own C threads (and the
compiled producer's report threads, which sum acknowledgements without the GIL) aside.
The loop serves each producer's callbacks with ``poll(0)``, which never blocks: once after
every burst of sends (``call_soon``), whenever a producer's report thread says reports are
ready (its ``wake_fd``, the compiled backend's), then every BUSY_POLL_INTERVAL_S while
librdkafka holds messages, and every IDLE_POLL_INTERVAL_S otherwise (statistics,
librdkafka's log lines and fatal errors also arrive through ``poll``). A delivery callback
only appends to a queue; the loop then settles the queue in one batch (``settlement``):
failures one by one (reroute or discard), then acknowledgements counted per topic and per
token. The statistics (``kafka_stats``) also tell the router which brokers it cannot
reach; a fatal error retires the producer and a new one replaces it. Only a producer being
closed (shutdown, or after a fatal error) is served by a thread of its own
(``producer``): it flushes, purges, and hands its reports to the loop in batches.

Rule: every accepted message handed to ``send`` reaches the ledger exactly once, with its
token: delivered, or discarded; a reroute is a new ``Dispatcher.send`` of the same message.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Iterable, Mapping

from confluent_kafka import KafkaException

from pydory.daemon.books import counters as counter_names
from pydory.daemon.books.counters import Counters
from pydory.daemon.books.msg_debug import MsgDebug
from pydory.daemon.delivery.broker_trouble import count_broker_trouble
from pydory.daemon.delivery.kafka_stats import (
    STATS_INTERVAL_MS,
    KafkaStats,
    ProducerStats,
    StatsSnapshot,
)
from pydory.daemon.delivery.librdkafka_settings import (
    DeliverySettings,
    ProducerProfile,
    producer_properties,
)
from pydory.daemon.delivery.outcomes import (
    Ledger,
    no_producer_refusal,
    produce_refusal,
)
from pydory.daemon.delivery.producer import DeliveryReports, ProducerHandle
from pydory.daemon.delivery.router import Router
from pydory.daemon.delivery.settlement import Settlement
from pydory.daemon.log_limits import ClientLines
from pydory.errors import ConfigError

log = logging.getLogger(__name__)
_lines = ClientLines(log)  # lines a client's messages can repeat

#: While librdkafka holds messages, the longest the loop goes without serving their
#: reports (besides the poll after every burst of sends).
BUSY_POLL_INTERVAL_S = 0.005
#: With nothing held, the loop still polls this often: statistics (broker liveness),
#: librdkafka's log lines and a fatal error arrive only through poll().
IDLE_POLL_INTERVAL_S = STATS_INTERVAL_MS / 1000
#: At shutdown, the time it takes to report one message still held (the closing thread
#: serving its report and the loop settling it in the books): 7-8 us measured here for a
#: purge of 50,000 messages, more on a loaded machine. The flush stops
#: early by that much per message held, so that shutdownMaxDelay bounds the reporting too,
#: not only the flush ...
SETTLE_TIME_PER_MESSAGE_S = 30e-6
#: ... but the flush always gets at least this share of shutdownMaxDelay.
MIN_FLUSH_SHARE = 0.5


class Dispatcher:
    """Owns the producers; sends accepted messages and settles their delivery reports."""

    def __init__(
        self,
        settings: DeliverySettings,
        profile_for: Callable[[str], ProducerProfile],
        router: Router,
        ledger: Ledger,
        on_partition_trouble: Callable[[], None] = lambda: None,
        stats: KafkaStats | None = None,
        counters: Counters | None = None,
        in_flight_by_topic: Callable[[], Mapping[str, int]] | None = None,
        msg_debug: MsgDebug | None = None,
        kept_on_disk: Callable[[int], bool] = lambda token: False,
        on_quiet: Callable[[], None] = lambda: None,
    ) -> None:
        """``in_flight_by_topic`` (the books' accepted, unsettled messages per topic) lets
        the statistics tell how many wait for a produce request; ``kept_on_disk(token)``:
        in the spool, so a shutdown that cannot deliver it leaves it for the next start;
        ``on_quiet()``: librdkafka has just settled the last message it held."""
        self._settings = settings
        self._profile_for = profile_for
        self._router = router
        self._ledger = ledger
        self._on_partition_trouble = on_partition_trouble
        self._stats = stats
        self._counters = counters if counters is not None else Counters()
        self._by_profile: dict[ProducerProfile, ProducerHandle] = {}
        self._by_topic: dict[str, ProducerHandle] = {}
        self._retired: set[ProducerHandle] = set()  # replaced, still settling what they held
        self._handles_created = 0
        self._reports = DeliveryReports()
        self._drain_scheduled = False  # a closing thread asked the loop to settle reports
        self._poll_scheduled = False  # a poll runs once the callbacks in progress are done
        # The poll timer and when it is due: uvloop's call_at returns a plain Handle, with
        # no when(), for a time already past, so the due time is kept beside it.
        self._poll_timer: asyncio.Handle | None = None
        self._poll_due = 0.0
        self._in_flight_by_topic = in_flight_by_topic
        self._msg_debug = msg_debug if msg_debug is not None else MsgDebug.disabled()
        self._kept_on_disk = kept_on_disk
        self._on_quiet = on_quiet
        self._busy = False  # librdkafka held messages at the last poll
        # The newest token sent (tokens never decrease in send order): the
        # possible-duplicate window (settlement) opens up to it.
        self._newest_token = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closing = False
        self._settlement = Settlement(
            ledger,
            router,
            self._msg_debug,
            kept_on_disk,
            resend=self.send,
            on_partition_trouble=on_partition_trouble,
            newest_token=lambda: self._newest_token,
            shutting_down=lambda: self._closing,
        )
        self._settlement.max_attempts = max(1, settings.max_failed_delivery_attempts)
        if stats is not None:
            stats.subscribe(self._apply_liveness)
        self._msg_debug.on_start(self._report_each_ack_now)

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._arm_poll_timer(IDLE_POLL_INTERVAL_S)

    # -- sending (loop thread) ---------------------------------------------------------

    def send(
        self,
        topic: str,
        partition: int,
        value: bytes,
        key: bytes | None,
        timestamp_ms: int,
        partition_key: int | None = None,
        attempt: int = 1,
        token: int = 0,
        maybe_in_kafka: bool = False,
        headers: list[tuple[str, str | bytes | None]] | None = None,
    ) -> None:
        """Hand one message to librdkafka; its outcome reaches the ledger later, with
        ``token``. ``maybe_in_kafka``: an earlier attempt may have reached the log.
        ``headers`` (its identity) come back with a failure, for a resend. Tokens never
        decrease from one first attempt to the next (the commit point's generations do
        not): the possible-duplicate window relies on it. Raises ``EnqueueRefused`` when
        librdkafka refuses it at once (queue full, too large): the caller books it."""
        handle = self._by_topic.get(topic) or self._handle_for(topic)
        if handle is not None and handle.fatal_error is not None:
            # A poll saw a fatal error that the loop has not handled yet.
            self._replace(handle)
            handle = self._by_topic.get(topic) or self._handle_for(topic)
        if handle is None or handle.closed:
            raise no_producer_refusal()
        refused = handle.send_message(
            topic,
            partition,
            value,
            key,
            timestamp_ms,
            partition_key,
            attempt,
            token,
            maybe_in_kafka,
            headers,
        )
        if refused:
            raise produce_refusal(refused)
        if attempt == 1:
            self.note_sent(token)
        elif not self._poll_scheduled:
            self.note_sent(self._newest_token)

    def burst_sender(self, topic: str) -> Callable[..., list[tuple[int, int]]] | None:
        """``produce_burst`` of ``topic``'s producer (admission/burst_path.py), or None if
        its backend has none (then ``send`` each message)."""
        handle = self._by_topic.get(topic) or self._handle_for(topic)
        if handle is not None and handle.fatal_error is not None:
            self._replace(handle)  # as send() does
            handle = self._by_topic.get(topic) or self._handle_for(topic)
        backend = handle.backend if handle is not None else None
        return backend.produce_burst if backend is not None else None

    def note_sent(self, token: int) -> None:
        """First attempts under ``token`` were handed to librdkafka: poll soon."""
        self._newest_token = token
        if not self._poll_scheduled:
            self._poll_scheduled = True
            self._busy = True  # so the poll that finds it all settled calls on_quiet
            assert self._loop is not None, "Dispatcher.start() was not called"
            self._loop.call_soon(self._poll)

    def prepare(self, topics: Iterable[str]) -> None:
        """Create the producers these topics need now, so that a librdkafka property it
        refuses stops start-up (raises ConfigError) instead of failing the first message."""
        for topic in topics:
            profile = self._profile_for(topic)
            if profile not in self._by_profile:
                try:
                    self._by_profile[profile] = self._new_handle(profile)
                except KafkaException as exc:
                    raise ConfigError(
                        f"librdkafka refuses the producer settings for topic {topic!r}: "
                        f"{exc.args[0].str()}"
                    ) from None

    def _handle_for(self, topic: str) -> ProducerHandle | None:
        profile = self._profile_for(topic)
        handle = self._by_profile.get(profile)
        if handle is None:
            try:
                handle = self._by_profile[profile] = self._new_handle(profile)
            except KafkaException:
                # Tried again at the topic's next message: a line per minute, not each.
                _lines.log(
                    logging.ERROR,
                    "producer creation failed",
                    "cannot create a producer for topic %s",
                    topic,
                    exc_info=True,
                )
                return None
        self._by_topic[topic] = handle
        return handle

    def _new_handle(self, profile: ProducerProfile) -> ProducerHandle:
        name = f"p{self._handles_created}"
        statistics = self._stats is not None
        properties = producer_properties(self._settings, profile, statistics=statistics)
        handle = ProducerHandle(
            name,
            profile,
            properties,
            self._reports,
            self._reports_waiting,
            self._take_statistics if statistics else None,
            self._replace,
            functools.partial(count_broker_trouble, self._counters),
        )
        self._handles_created += 1
        assert self._loop is not None, "Dispatcher.start() was not called"
        handle.start(self._loop, self._on_reports_ready)
        log.info("producer %s: %s", name, profile.properties())
        return handle

    # -- config reload (loop thread) -----------------------------------------------------

    def reconfigure(
        self,
        settings: DeliverySettings,
        profile_for: Callable[[str], ProducerProfile],
        topics: Iterable[str],
    ) -> None:
        """A config reload: from now on messages go to producers with the new settings.

        The producers the new config needs for ``topics`` and for every topic seen so far
        are created first; a producer whose settings did not change is kept. If librdkafka
        refuses a new one, nothing changes (raises ConfigError). A producer no longer
        needed is retired, not purged: a closing thread flushes it until it holds nothing
        (librdkafka's message.timeout.ms bounds that), and its delivery reports settle as
        always -- a failure rerouted through the new producers -- so no message is lost,
        sent twice by us, or counted twice.
        """
        keep = settings == self._settings
        wanted: dict[ProducerProfile, ProducerHandle] = {}
        created: list[ProducerHandle] = []
        previous_settings, self._settings = self._settings, settings  # _new_handle reads it
        try:
            for topic in dict.fromkeys([*topics, *self._by_topic]):
                profile = profile_for(topic)
                if profile in wanted:
                    continue
                handle = self._by_profile.get(profile) if keep else None
                if handle is None or handle.fatal_error is not None:
                    handle = self._new_handle(profile)
                    created.append(handle)
                wanted[profile] = handle
        except KafkaException as exc:
            self._settings = previous_settings
            for handle in created:
                handle.request_stop(time.monotonic)  # never sent anything
            raise ConfigError(
                f"librdkafka refuses the new producer settings: {exc.args[0].str()}"
            ) from None
        retiring = [h for h in self._by_profile.values() if h not in wanted.values()]
        self._profile_for = profile_for
        self._settlement.max_attempts = max(1, settings.max_failed_delivery_attempts)
        self._by_profile = wanted
        self._by_topic = {}  # each topic finds its producer again with its next message
        for handle in retiring:
            self._retire(handle)
        if retiring:
            log.info(
                "config reload: producers %s retired (they deliver what they hold), %s new",
                [h.name for h in retiring],
                [h.name for h in created],
            )

    def _retire(self, handle: ProducerHandle) -> None:
        """Stop sending through ``handle``; let it deliver what it holds, then close."""
        handle.retired = True
        self._retired.add(handle)
        handle.request_stop(lambda: float("inf"))
        assert handle.finished is not None
        handle.finished.add_done_callback(lambda _: self._retired.discard(handle))
        if self._stats is not None:
            self._stats.forget(handle.name)
        self._counters.inc(counter_names.PRODUCERS_RETIRED)

    # -- fatal errors (loop thread) ------------------------------------------------------

    def _replace(self, handle: ProducerHandle) -> None:
        """A fatal error made ``handle``'s producer unusable (librdkafka: the instance must
        be destroyed). Retire it: what it still holds comes back and is discarded with
        reason kafka_error; its topics move to a new producer with the same profile."""
        if handle.retired:
            return
        handle.retired = True
        self._retired.add(handle)
        handle.request_stop(time.monotonic)  # nothing to wait for: purge at once
        assert handle.finished is not None
        handle.finished.add_done_callback(lambda _: self._retired.discard(handle))
        if self._stats is not None:
            self._stats.forget(handle.name)
        topics = [topic for topic, h in self._by_topic.items() if h is handle]
        for topic in topics:
            del self._by_topic[topic]
        if self._by_profile.get(handle.profile) is handle:
            del self._by_profile[handle.profile]
        if self._closing:
            return
        self._counters.inc(counter_names.PRODUCER_RECREATED)
        log.error(
            "producer %s failed (%s): replacing it; its messages are discarded as kafka_error",
            handle.name,
            handle.fatal_error,
        )
        try:
            replacement = self._by_profile[handle.profile] = self._new_handle(handle.profile)
        except KafkaException:
            log.exception(
                "cannot recreate producer %s; the next message will try again", handle.name
            )
            return
        for topic in topics:
            self._by_topic[topic] = replacement

    # -- statistics and broker liveness (loop thread) -----------------------------------

    def _take_statistics(self, handle: ProducerHandle, report: ProducerStats) -> None:
        if self._stats is not None and not handle.retired:
            in_flight = self._in_flight_by_topic() if self._in_flight_by_topic else None
            self._stats.update(handle.name, report, in_flight)

    def _apply_liveness(self, snapshot: StatsSnapshot) -> None:
        """Route around brokers librdkafka cannot reach and partitions it has no broker
        for. Any change also asks for fresh metadata: leaders may have moved, and the
        daemon's own copy must learn that a broker left the cluster or came back."""
        before = self._router.unavailable_brokers
        unreachable = snapshot.unreachable_brokers()
        if not self._router.set_unavailable(unreachable, snapshot.unroutable):
            return
        if lost := unreachable - before:
            log.warning("brokers %s unreachable: routing around their partitions", sorted(lost))
        if back := before - unreachable:
            log.info("brokers %s reachable again", sorted(back))
        self._on_partition_trouble()

    # -- delivery reports (served and settled on the loop thread) ----------------------

    def _poll(self) -> None:
        """Serve every running producer's ready callbacks, settle the reports, and come
        back soon if librdkafka still holds messages (else at the idle pace)."""
        self._poll_scheduled = False
        each_ack = self._msg_debug.active or self._settlement.window_open
        for handle in list(self._by_profile.values()):
            handle.report_each_ack = each_ack
            handle.serve()
        self._drain_reports()
        busy = self.in_librdkafka() > 0
        if not busy:
            self._settlement.close_window()  # everything sent before the failure has settled
            if self._busy:
                self._on_quiet()
        self._busy = busy
        self._arm_poll_timer(BUSY_POLL_INTERVAL_S if busy else IDLE_POLL_INTERVAL_S)

    def _on_reports_ready(self) -> None:
        """A producer's report thread has reports ready (its wake_fd): serve and settle
        them now, not at the next timer (unless a poll is due this turn of the loop
        anyway: it reads the wake_fd)."""
        if not self._poll_scheduled:
            self._poll()

    def _report_each_ack_now(self) -> None:
        """Message debugging started: every acknowledgement from now on one by one (the
        next poll would ask only for what its thread has not summed yet)."""
        for handle in self._by_profile.values():
            handle.report_each_ack_now()

    def _arm_poll_timer(self, delay_s: float) -> None:
        """Make sure a poll happens within ``delay_s`` (one timer, moved earlier if need be)."""
        loop = self._loop
        if loop is None or self._closing:
            return
        due = loop.time() + delay_s
        timer = self._poll_timer
        if timer is not None:
            if self._poll_due <= due:
                return
            timer.cancel()
        self._poll_timer = loop.call_at(due, self._on_poll_timer)
        self._poll_due = due

    def _on_poll_timer(self) -> None:
        self._poll_timer = None
        self._poll()

    def _reports_waiting(self) -> None:
        """Any thread (a closing producer's): have the loop settle the reports waiting."""
        if not self._drain_scheduled and self._loop is not None:
            self._drain_scheduled = True
            with contextlib.suppress(RuntimeError):  # the loop is gone: nothing to settle
                self._loop.call_soon_threadsafe(self._drain_reports)

    def _drain_reports(self) -> None:
        """Settle every report waiting: failures one by one (each needs its own decision),
        then acknowledgements as one batch, per topic and per token."""
        self._drain_scheduled = False
        self._settlement.settle(self._reports)

    # -- lifecycle ----------------------------------------------------------------------

    def in_librdkafka(self) -> int:
        """Messages librdkafka holds (queued, in flight, or reports not yet served)."""
        handles = [*self._by_profile.values(), *self._retired]
        return sum(h.queue_length() for h in handles) + len(self._reports)

    @property
    def rerouted(self) -> int:
        """Messages sent again after a failed attempt."""
        return self._settlement.rerouted

    @property
    def producers(self) -> Mapping[ProducerProfile, ProducerHandle]:
        return self._by_profile

    @property
    def producers_recreated(self) -> int:
        """How many producers were replaced after a fatal error."""
        return self._counters.get(counter_names.PRODUCER_RECREATED)

    async def shutdown(self, max_delay_s: float, requested_at: float | None = None) -> None:
        """Deliver what can be delivered within ``max_delay_s`` of ``requested_at`` (a
        ``time.monotonic()`` value; default now); the rest is purged and discarded with
        reason shutdown_delay. Returns when every report is settled.

        The flush stops early enough to report what is left within ``max_delay_s`` (see
        SETTLE_TIME_PER_MESSAGE_S). Every producer drains, purges and is destroyed on a
        closing thread of its own, all at once, so shutdown costs one producer's teardown, not
        the sum of them."""
        start = time.monotonic() if requested_at is None else requested_at
        deadline = start + max_delay_s
        latest_reserve = max_delay_s * (1 - MIN_FLUSH_SHARE)
        self._closing = True
        if self._poll_timer is not None:
            self._poll_timer.cancel()
            self._poll_timer = None
        handles = [*self._by_profile.values(), *self._retired]

        def flush_until() -> float:
            held = sum(h.queue_length() for h in handles)
            return deadline - min(latest_reserve, held * SETTLE_TIME_PER_MESSAGE_S)

        for handle in handles:
            handle.request_stop(flush_until)
        for handle in handles:
            assert handle.finished is not None
            await handle.finished
        self._drain_reports()
