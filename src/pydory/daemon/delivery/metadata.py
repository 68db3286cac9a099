"""Cluster metadata: fetched through librdkafka, refreshed on a timer and on demand.

librdkafka keeps its own metadata for sending; this copy is the one pydory routes by
(Dory's partition rules need partition ids and leaders before the message is produced)
and the one the status interface reports (last updated / last modified).

Fetches run in a thread of their own (``list_topics`` blocks); one down broker does not
break a fetch, because librdkafka asks any broker it can reach. A failed fetch keeps the
previous snapshot and retries after Dory's pause delay, doubling up to
``pauseRateLimitMaxDouble``. Its warning says what failed: librdkafka's own error for
each broker it could not use (address, and refused, timed out, unresolved...), which the
metadata client's error callback keeps (``MetadataClient``); the pause delay spaces the
warnings, and librdkafka's log lines are rate-limited by ``daemon/logsetup.py``.

Rule: ``MetadataService`` alone fetches metadata (and creates topics), off the loop, hands it to
the router whole.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
import re
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from confluent_kafka import KafkaError, KafkaException, Producer

from pydory.daemon.delivery.librdkafka_settings import metadata_client_properties
from pydory.daemon.delivery.router import MetadataSnapshot, Router
from pydory.daemon.log_limits import ClientLines

log = logging.getLogger(__name__)
# A client names the topics auto-created: their lines, one per kind per minute.
_lines = ClientLines(log)

#: How long one metadata request may take before it counts as failed.
FETCH_TIMEOUT_S = 10.0
#: Dory adds "a bit of randomness" to the refresh interval: +/- this fraction.
REFRESH_JITTER = 0.1
#: Kafka creates a topic a moment after the metadata request that asks for it (Kafka 4
#: answers that request "unknown topic"), so autocreation looks for the topic in fresh
#: metadata until it shows: first this long after the request, then twice as long each
#: time ...
AUTOCREATE_FIRST_LOOK_S = 0.05
#: ... giving up this long after the request (Dory looks after 3, 6 and 12 s).
AUTOCREATE_GIVE_UP_S = 21.0
# Answers to the creating request that mean "not there yet" rather than "refused".
_BEING_CREATED = frozenset({KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError.LEADER_NOT_AVAILABLE})


T = TypeVar("T")


def _now_ms() -> int:
    return int(time.time() * 1000)


class BrokerErrors:
    """The latest error librdkafka reported for each broker since the last successful
    fetch: a metadata client's error callback. Kept apart from the client so that the
    callback holds no reference back to it (a cycle would keep the librdkafka handle, and
    its connections, alive after the daemon let go of it)."""

    def __init__(self) -> None:
        self.by_broker: dict[str, str] = {}

    def remember(self, error: KafkaError) -> None:
        # "127.0.0.1:9092/bootstrap: Connect to ipv4#127.0.0.1:9092 failed: Connection
        # refused (after 0ms in state CONNECT)": the broker, then what went wrong.
        broker, separator, what = error.str().partition(": ")
        if separator and error.code() != KafkaError._ALL_BROKERS_DOWN:
            self.by_broker[broker] = _AFTER_STATE.sub("", what)


class MetadataClient(Producer):
    """A producer that never produces, used for metadata; its failed fetches say what
    failed, broker by broker (:class:`BrokerErrors`)."""

    def __init__(self, properties: dict[str, Any]) -> None:
        errors = BrokerErrors()
        super().__init__({**properties, "error_cb": errors.remember})
        self.broker_errors = errors.by_broker

    def list_topics_or_say_why(self, topic: str | None) -> Any:
        """``list_topics``; on failure, the KafkaException names each broker's error."""
        try:
            metadata = self.list_topics(topic=topic, timeout=FETCH_TIMEOUT_S)
        except KafkaException as exc:
            self.poll(0)  # serves the error callbacks librdkafka queued meanwhile
            raise KafkaException(_with_reasons(exc, self.broker_errors)) from exc
        self.broker_errors.clear()
        return metadata


#: librdkafka's suffix on a broker error, e.g. " (after 0ms in state CONNECT)".
_AFTER_STATE = re.compile(r" \(after \d+ms in state \w+(, \d+ identical error\(s\) suppressed)?\)$")


def why(exc: KafkaException) -> str:
    """A failed fetch in words: librdkafka's error text, with each broker's reason."""
    error = exc.args[0] if exc.args else None
    return error.str() if isinstance(error, KafkaError) else str(exc)


def _with_reasons(exc: KafkaException, broker_errors: dict[str, str]) -> KafkaError:
    error: KafkaError = exc.args[0]
    if not broker_errors:
        return error
    reasons = "; ".join(f"{broker}: {what}" for broker, what in sorted(broker_errors.items()))
    return KafkaError(error.code(), f"{error.str()}: {reasons}")


async def _in_daemon_thread(call: Callable[[], T]) -> T:
    """``call()`` in a daemon thread. Not ``asyncio.to_thread``: the event loop's executor
    is joined when the loop closes, so a metadata request stuck on a slow broker (up to
    FETCH_TIMEOUT_S) would hold up the daemon's exit after its bounded shutdown."""
    loop = asyncio.get_running_loop()
    outcome: asyncio.Future[T] = loop.create_future()

    def run() -> None:
        try:
            result = call()
        except BaseException as error:  # noqa: BLE001 -- handed to the awaiting task
            deliver = functools.partial(_set_exception, outcome, error)
        else:
            deliver = functools.partial(_set_result, outcome, result)
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits
            loop.call_soon_threadsafe(deliver)

    threading.Thread(target=run, name="pydory-metadata-fetch", daemon=True).start()
    return await outcome


def _set_result(future: asyncio.Future[T], result: T) -> None:
    if not future.done():  # not cancelled meanwhile
        future.set_result(result)


def _set_exception(future: asyncio.Future[Any], error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)


class MetadataService:
    """Keeps ``router`` routing by fresh metadata."""

    def __init__(
        self,
        properties: dict[str, Any],
        router: Router,
        *,
        refresh_interval_s: float,
        compare_on_refresh: bool = True,
        min_pause_delay_s: float = 5.0,
        pause_initial_s: float = 5.0,
        pause_max_double: int = 4,
        on_replaced: Callable[[MetadataSnapshot], None] = lambda snapshot: None,
    ) -> None:
        self._client = self.new_client(properties)
        self._router = router
        self._interval_s = refresh_interval_s
        self._compare = compare_on_refresh
        self._min_pause_s = min_pause_delay_s
        self._pause_initial_s = pause_initial_s
        self._pause_max_double = pause_max_double
        self._on_replaced = on_replaced
        self._wanted = asyncio.Event()
        self._last_on_demand = 0.0
        self.last_updated_ms: int | None = None
        self.last_modified_ms: int | None = None
        self.fetch_failures = 0
        self.fetch_successes = 0
        self.updates = 0  # fetches that replaced the routing layout

    async def fetch(self, topic: str | None = None) -> MetadataSnapshot:
        """One metadata request; raises KafkaException when no broker answers in time."""
        client = self._client
        metadata = await _in_daemon_thread(lambda: client.list_topics_or_say_why(topic))
        return MetadataSnapshot.from_cluster_metadata(metadata)

    async def refresh(self) -> bool:
        """Fetch and apply; returns whether routing changed. Raises on failure."""
        snapshot = await self.fetch()
        self.fetch_successes += 1
        self.last_updated_ms = _now_ms()
        changed = not self._router.snapshot.same_layout(snapshot)
        if changed or not self._compare or not self._router.has_metadata:
            self.updates += 1
            self._router.replace(snapshot)
            self.last_modified_ms = self.last_updated_ms
            self._on_replaced(snapshot)
        if changed:
            log.info(
                "metadata changed: %d brokers, %d topics",
                len(snapshot.brokers),
                len(snapshot.topics),
            )
        return changed

    async def initial(self, stop: asyncio.Event) -> bool:
        """Fetch until it works (or ``stop`` is set, then return False). The daemon
        serves meanwhile (its messages wait for this); a refresh asked for (``POST
        /metadata_update``, a producer seeing a broker come back) cuts a pause between
        attempts short, spaced by minPauseDelay as on-demand refreshes always are."""
        attempt = 0
        while not stop.is_set():
            self._wanted.clear()
            try:
                await self.refresh()
            except KafkaException as exc:
                self.fetch_failures += 1
                delay = self._pause_delay(attempt)
                log.warning(
                    "initial metadata fetch failed (%s); retrying in %.1f s", why(exc), delay
                )
                attempt += 1
                await self._pause_before_retry(stop, delay)
            else:
                return True
        return False

    async def _pause_before_retry(self, stop: asyncio.Event, delay_s: float) -> None:
        """Wait ``delay_s``, or until a refresh is asked for (then minPauseDelay after the
        last on-demand one), or until ``stop`` is set."""
        stopped = asyncio.ensure_future(stop.wait())
        wanted = asyncio.ensure_future(self._wanted.wait())
        try:
            done, _ = await asyncio.wait(
                {stopped, wanted}, timeout=delay_s, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            stopped.cancel()
            wanted.cancel()
        if wanted in done and not stop.is_set():
            await self._space_on_demand()

    @staticmethod
    def new_client(properties: dict[str, Any]) -> MetadataClient:
        """A metadata client for ``properties``; raises KafkaException if librdkafka
        refuses them. A producer that never produces: list_topics(topic) on a producer
        also asks the broker to auto-create the topic, which is how Dory requests topic
        creation."""
        return MetadataClient(metadata_client_properties(properties))

    def use_client(self, client: MetadataClient) -> None:
        """A config reload changed the brokers or librdkafka's properties: fetch through
        ``client`` from now on (a fetch under way ends on the old one), and at once."""
        old, self._client = self._client, client
        _destroy_in_background(old)
        self.request_refresh()

    def reconfigure(
        self,
        *,
        refresh_interval_s: float,
        compare_on_refresh: bool,
        min_pause_delay_s: float,
        pause_initial_s: float,
        pause_max_double: int,
    ) -> None:
        """A config reload: the refresh timings and comparison from the next refresh on
        (a wait under way ends at its old time)."""
        self._interval_s = refresh_interval_s
        self._compare = compare_on_refresh
        self._min_pause_s = min_pause_delay_s
        self._pause_initial_s = pause_initial_s
        self._pause_max_double = pause_max_double

    def request_refresh(self) -> None:
        """Ask for a refresh soon (unknown topic, delivery trouble, POST /metadata_update)."""
        self._wanted.set()

    async def create_topic(self, topic: str) -> None:
        """Dory's autocreate: a single-topic metadata request asks the broker to create
        ``topic``; then metadata is refreshed until it shows the topic, unless the broker
        refused (e.g. TOPIC_AUTHORIZATION_FAILED) or AUTOCREATE_GIVE_UP_S passed."""
        try:
            refusal = await self._request_creation(topic)
            if refusal is not None:
                _lines.log(
                    logging.WARNING,
                    "creation refused",
                    "creating topic %s refused: %s",
                    topic,
                    refusal.name(),
                )
                return
            await self._look_for(topic)
        except KafkaException as exc:
            _lines.log(
                logging.WARNING, "creation failed", "creating topic %s failed: %s", topic, why(exc)
            )

    async def _request_creation(self, topic: str) -> KafkaError | None:
        """The single-topic metadata request; returns the broker's refusal, if it refused."""
        client = self._client
        metadata = await _in_daemon_thread(lambda: client.list_topics_or_say_why(topic))
        answer = metadata.topics.get(topic)
        error: KafkaError | None = None if answer is None else answer.error
        if error is None or error.code() in _BEING_CREATED:
            return None
        return error

    async def _look_for(self, topic: str) -> None:
        """Refresh, at growing intervals, until metadata shows ``topic`` or time is up."""
        give_up = time.monotonic() + AUTOCREATE_GIVE_UP_S
        wait = AUTOCREATE_FIRST_LOOK_S
        while True:
            await asyncio.sleep(min(wait, max(0.0, give_up - time.monotonic())))
            await self.refresh()
            if self._router.knows(topic):
                return
            if time.monotonic() >= give_up:
                _lines.log(
                    logging.WARNING,
                    "creation unseen",
                    "topic %s is not in metadata %.0f s after asking to create it",
                    topic,
                    AUTOCREATE_GIVE_UP_S,
                )
                return
            wait *= 2

    async def run(self) -> None:
        """Refresh every metadataRefreshInterval (jittered) and whenever asked to."""
        failures = 0
        while True:
            delay = (
                self._pause_delay(failures - 1)
                if failures
                else self._interval_s * random.uniform(1 - REFRESH_JITTER, 1 + REFRESH_JITTER)
            )
            # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation that
            # arrives as the event fires, and shutdown would then wait out the interval.
            try:
                async with asyncio.timeout(delay):
                    await self._wanted.wait()
            except TimeoutError:
                pass
            else:
                await self._space_on_demand()
            self._wanted.clear()
            try:
                await self.refresh()
            except KafkaException as exc:
                failures += 1
                self.fetch_failures += 1
                log.warning("metadata refresh failed (%s)", why(exc))
            else:
                failures = 0

    async def _space_on_demand(self) -> None:
        """On-demand refreshes come at most every minPauseDelay."""
        wait = self._last_on_demand + self._min_pause_s - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        self._last_on_demand = time.monotonic()

    def _pause_delay(self, failures: int) -> float:
        doublings = min(max(failures, 0), self._pause_max_double)
        jitter = random.uniform(1.0, 1.0 + REFRESH_JITTER)
        return float(self._pause_initial_s * 2**doublings * jitter)

    def close(self) -> None:
        """Shutdown: destroy the metadata client now. Left to the garbage collector (the
        server holds reference cycles), it would go on reconnecting to the brokers for a
        while, to whatever listens on their ports by then."""
        client, self._client = self._client, _CLOSED
        if client is not _CLOSED:
            _destroy_in_background(client)


#: Stands in for the metadata client once closed (a fetch then fails like a refused one).
_CLOSED: Any = None


def _destroy_in_background(client: Producer) -> None:
    """Destroy a librdkafka client off the event loop: ``rd_kafka_destroy`` joins its
    threads. The thread holds the last reference and drops it."""
    holder = [client]
    del client

    def destroy() -> None:
        holder.clear()

    threading.Thread(target=destroy, name="pydory-metadata-client-destroy", daemon=True).start()
