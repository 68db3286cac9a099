"""The compiled producer's report thread (pydory._cproducer, ``Producer(thread=True)``;
issue 34, lever 4), on librdkafka's mock cluster: it sums the acknowledgements without the
GIL and hands everything else over whole, in order; after a failure it sums nothing until
the loop has taken it; its ring is bounded (the thread stops, nothing is dropped, it goes
on once the loop takes); ``report_each_ack`` holds from the moment it is asked; a close
joins it wherever it waits; its eventfd wakes an asyncio loop. The delivery and fault
suites run on it too: it is the compiled backend's default (tests/producer_backends.py).
"""

from __future__ import annotations

import asyncio
import select
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import KafkaError

import producer_backends
from helpers import reports_until_empty, wait_until
from pydory.daemon.delivery import backends, compiled_producer
from pydory.daemon.delivery import dispatcher as dispatcher_module
from pydory.daemon.delivery.dispatcher import Dispatcher
from pydory.daemon.delivery.librdkafka_settings import DeliverySettings, ProducerProfile
from pydory.daemon.delivery.router import MetadataSnapshot, Router
from pydory_tools.testing.mock_cluster import ApiKey, MockCluster

pytestmark = pytest.mark.skipif(
    compiled_producer.bound() is None,
    reason=f"the compiled producer does not run here: {backends.WHY}",
)

if compiled_producer.bound() is not None:
    from pydory import _cproducer


#: How long a poll waits for the thread before it answers (then it is asked again).
#: Not a deadline: a far-off safety net for a wait on a condition (load 50 included).
SAFETY_NET_S = 600
POLL_WAIT_S = 0.05  # not a deadline: a wait that goes on


def producer(mock_cluster: MockCluster, **properties: Any) -> Any:
    """A producer with a report thread; one message per request (so one per report event)."""
    settings = {
        "bootstrap.servers": mock_cluster.bootstrap_servers,
        "linger.ms": "0",
        "batch.num.messages": "1",
        "max.in.flight.requests.per.connection": "1",
    }
    settings.update({name.replace("_", "."): str(value) for name, value in properties.items()})
    return _cproducer.Producer(settings, thread=True)


def counts(p: Any) -> dict[str, int]:
    found = p.thread_counts()
    assert found is not None
    return found  # type: ignore[no-any-return]


class Gathered:
    """Every poll's records, gathered: acknowledgements per token (summed or one by one)."""

    def __init__(self) -> None:
        self.tokens: Counter[int] = Counter()
        self.summed: Counter[int] = Counter()
        self.each: list[Any] = []
        self.failures: list[Any] = []

    def poll(self, p: Any, each_ack: bool = False, timeout_s: float = POLL_WAIT_S) -> Any:
        polled = p.poll(timeout_s, each_ack)
        if polled is not None:
            assert polled.stopped_by is None
            for entry in polled.ack_sums:
                self.tokens[entry.token] += entry.messages
                self.summed[entry.token] += entry.messages
            for ack in polled.acks or []:
                self.tokens[ack.token] += 1
                self.each.append(ack)
            self.failures.extend(polled.failures)
        return polled


@pytest.fixture
def topic(mock_cluster: MockCluster, unique_topic: Callable[[str], str]) -> str:
    name = unique_topic("reaper")
    mock_cluster.create_topic(name, 1)
    return name


def test_acknowledgements_are_summed_on_the_thread_and_their_events_destroyed_there(
    mock_cluster: MockCluster, topic: str
) -> None:
    p = producer(mock_cluster, batch_num_messages=100, linger_ms=5)
    for i in range(2_000):
        assert p.produce(topic, 0, b"v%d" % i, None, 0, None, 1, i // 500, False, None) == 0
    # Summed and destroyed without a poll: librdkafka no longer holds them, the sums do.
    wait_until(lambda: counts(p)["events_summed"] > 0 and counts(p)["sums"] == 4, what="sums")
    got = Gathered()
    wait_until(lambda: got.poll(p) is None and len(p) == 0, what="every report")
    assert got.tokens == Counter({0: 500, 1: 500, 2: 500, 3: 500})
    assert got.each == []
    assert got.failures == []
    p.close()


def test_after_a_failure_every_report_comes_whole_and_in_order_until_the_loop_took_it(
    mock_cluster: MockCluster, topic: str
) -> None:
    """A failure's window (settlement.py) needs each acknowledgement queued after it one by
    one: the thread, having met a failure, hands every later report over whole (in the
    order librdkafka queued them) until the loop has taken the failure and polled again
    in a later turn (after the settlement that may open the window)."""
    p = producer(mock_cluster, retries=0)
    got = Gathered()
    for i in range(10):  # summed: no failure yet
        assert p.produce(topic, 0, b"a%d" % i, None, 0, None, 1, 1, False, None) == 0
    wait_until(lambda: got.poll(p) is None and len(p) == 0, what="the first ten")
    assert got.summed == Counter({1: 10})
    # Retriable, but retries=0: the first message fails, the partition stays.
    mock_cluster.push_request_errors(ApiKey.PRODUCE, [KafkaError.NOT_ENOUGH_REPLICAS])
    count = 60
    for i in range(count):
        assert p.produce(topic, 0, b"m%d" % i, None, 0, None, 1, 2, False, None) == 0
    # Nothing polled meanwhile: the thread keeps every report after the failure whole.
    wait_until(lambda: counts(p)["held_events"] >= count, what="every report held whole")
    assert counts(p)["summing"] == 0
    polled = got.poll(p)
    assert [f.value for f in polled.failures] == [b"m0"]
    assert polled.ack_sums == []
    assert [ack.value for ack in polled.acks] == [b"m%d" % i for i in range(1, count)]
    # The failure is taken; the thread sums again from the second poll after that one.
    got.poll(p)
    assert counts(p)["summing"] == 0
    got.poll(p)
    assert counts(p)["summing"] == 1
    for i in range(10):
        assert p.produce(topic, 0, b"z%d" % i, None, 0, None, 1, 3, False, None) == 0
    wait_until(lambda: got.poll(p) is None and len(p) == 0, what="the last ten")
    assert got.summed[3] == 10
    assert got.tokens == Counter({1: 10, 2: count - 1, 3: 10})
    p.close()


def settle_all(p: Any, got: Gathered) -> None:
    wait_until(lambda: got.poll(p) is None and len(p) == 0, what="every report")


def test_a_failure_on_one_producer_stops_every_thread_summing_until_it_is_settled(
    mock_cluster: MockCluster, topic: str
) -> None:
    """The window covers every producer's acknowledgements: while one producer's failure
    is on its way to the settlement, no producer's thread sums, and each goes on only from
    its second poll after the loop took it (a later turn of the loop than the one that
    settled it, which asks for each_ack if the window opened): what comes in between is
    held whole, so that turn gets it one by one."""
    p0, p1 = producer(mock_cluster, retries=0), producer(mock_cluster, retries=0)
    got0, got1 = Gathered(), Gathered()
    for p, got in ((p0, got0), (p1, got1)):
        assert p.produce(topic, 0, b"warm", None, 0, None, 1, 1, False, None) == 0
        settle_all(p, got)
    assert counts(p1)["summing"] == 1
    mock_cluster.push_request_errors(ApiKey.PRODUCE, [KafkaError.NOT_ENOUGH_REPLICAS])
    assert p0.produce(topic, 0, b"fails", None, 0, None, 1, 2, False, None) == 0
    wait_until(lambda: counts(p0)["held_events"] >= 1, what="p0's failure, held whole")
    assert counts(p1)["summing"] == 0  # another producer's failure is on its way
    # The turn of the loop that takes the failure (and settles it: the window opens).
    assert [f.value for f in got0.poll(p0).failures] == [b"fails"]
    got1.poll(p1)
    assert counts(p1)["summing"] == 0  # not before a later turn
    for _ in range(20):  # acknowledged after the failure, before the next turn
        assert p1.produce(topic, 0, b"after", None, 0, None, 1, 3, False, None) == 0
    wait_until(lambda: counts(p1)["held_events"] >= 20, what="p1's reports, whole")
    # The next turn asks for each acknowledgement (the window is open): one by one.
    got0.poll(p0, each_ack=True)
    polled = got1.poll(p1, each_ack=True)
    assert polled.ack_sums == []
    assert [ack.token for ack in polled.acks] == [3] * 20
    got1.poll(p1)  # the window closed: asked no more
    assert counts(p1)["summing"] == 1
    for _ in range(20):
        assert p1.produce(topic, 0, b"summed", None, 0, None, 1, 4, False, None) == 0
    wait_until(lambda: counts(p1)["sums"] == 1, what="p1's thread summing again")
    settle_all(p1, got1)
    assert got1.summed[4] == 20
    p0.close()
    p1.close()


def test_a_full_ring_stops_the_thread_drops_nothing_and_it_goes_on_once_the_loop_takes(
    mock_cluster: MockCluster, topic: str
) -> None:
    ring = _cproducer.REPORT_RING_EVENTS
    count = ring + 300
    p = producer(mock_cluster)
    p.report_each_ack()  # every report event whole: the ring fills
    for i in range(count):
        assert p.produce(topic, 0, b"v", None, 0, None, 1, i, False, None) == 0
    wait_until(
        lambda: counts(p)["held_events"] == ring and counts(p)["room_waits"] >= 1,
        what="the ring full and the thread waiting",
    )
    # The rest waits in librdkafka's queue; outq_len also counts its queued reports (ops).
    assert len(p) >= count
    got = Gathered()
    wait_until(lambda: got.poll(p, each_ack=True) is None and len(p) == 0, what="the reports")
    assert got.tokens == Counter(range(count))  # every message once
    assert len(got.each) == count
    assert counts(p)["events_whole"] >= count
    p.close()


def test_close_joins_the_thread_waiting_on_the_queue_or_for_room(
    mock_cluster: MockCluster, topic: str
) -> None:
    idle = producer(mock_cluster)
    full = producer(mock_cluster)
    full.report_each_ack()
    ring = _cproducer.REPORT_RING_EVENTS
    for i in range(ring + 10):
        assert full.produce(topic, 0, b"v", None, 0, None, 1, i, False, None) == 0
    wait_until(lambda: counts(full)["room_waits"] >= 1, what="the thread waiting for room")
    for p in (idle, full):
        closer = threading.Thread(target=p.close)
        closer.start()
        closer.join(timeout=SAFETY_NET_S)  # a safety net: close returns at once
        assert not closer.is_alive()
        assert p.thread_counts() is None
        assert len(p) == 0
        with pytest.raises(RuntimeError, match="closed"):
            p.poll(0, False)
        p.close()  # a second close does nothing


def test_each_ack_asked_mid_stream_holds_from_then_on(
    mock_cluster: MockCluster, topic: str
) -> None:
    p = producer(mock_cluster, batch_num_messages=50, linger_ms=5)
    got = Gathered()
    for _i in range(300):
        assert p.produce(topic, 0, b"a", None, 0, None, 1, 1, False, None) == 0
    wait_until(lambda: got.poll(p) is None and len(p) == 0, what="the summed ones")
    assert got.summed == Counter({1: 300})
    assert got.each == []
    p.report_each_ack()  # message debugging started: every acknowledgement from now on
    for _i in range(300):
        assert p.produce(topic, 0, b"b", None, 0, None, 1, 2, False, None) == 0
    wait_until(lambda: got.poll(p, each_ack=True) is None and len(p) == 0, what="each one")
    assert [ack.token for ack in got.each] == [2] * 300
    assert got.summed[2] == 0
    got.poll(p)  # asked no more: summed again
    for _i in range(300):
        assert p.produce(topic, 0, b"c", None, 0, None, 1, 3, False, None) == 0
    wait_until(lambda: got.poll(p) is None and len(p) == 0, what="summed again")
    assert got.summed[3] == 300
    p.close()


def test_a_report_that_cannot_be_converted_is_served_by_the_next_poll(
    mock_cluster: MockCluster, topic: str
) -> None:
    """Armed fault hooks make the thread hand every report over whole (each converted on
    the polling thread, where the hook fails one): still each message reported once."""
    p = producer(mock_cluster, batch_num_messages=20, linger_ms=5)
    _cproducer._inject_faults(57, 0)
    try:
        for i in range(500):
            assert p.produce(topic, 0, b"v", None, 0, None, 1, i, False, None) == 0
        stopped, tokens = reports_until_empty(p)
    finally:
        _cproducer._inject_faults(0, 0)
    assert stopped == [MemoryError]
    assert tokens == Counter(range(500))
    p.close()


def test_the_eventfd_wakes_an_asyncio_loop_once_until_a_poll_takes(
    mock_cluster: MockCluster, topic: str
) -> None:
    p = producer(mock_cluster)
    assert p.wake_fd >= 0
    got = Gathered()

    async def woken() -> int:
        loop = asyncio.get_running_loop()
        wakes = 0
        ready = asyncio.Event()

        def on_ready() -> None:
            nonlocal wakes
            wakes += 1
            got.poll(p, timeout_s=0)  # reads the eventfd
            if sum(got.tokens.values()) == 100:
                ready.set()

        loop.add_reader(p.wake_fd, on_ready)
        try:
            for _i in range(100):
                assert p.produce(topic, 0, b"v", None, 0, None, 1, 7, False, None) == 0
            await asyncio.wait_for(ready.wait(), SAFETY_NET_S)
        finally:
            loop.remove_reader(p.wake_fd)
        return wakes

    assert asyncio.run(woken()) >= 1
    assert got.tokens == Counter({7: 100})
    readable, _, _ = select.select([p.wake_fd], [], [], 0)
    assert readable == []  # taken: nothing more to say
    p.close()


@pytest.fixture
def no_thread_producer(mock_cluster: MockCluster) -> Iterator[Any]:
    p = _cproducer.Producer({"bootstrap.servers": mock_cluster.bootstrap_servers})
    yield p
    p.close()


def test_without_a_thread_there_is_no_eventfd_and_no_counts(no_thread_producer: Any) -> None:
    assert no_thread_producer.wake_fd == -1
    assert no_thread_producer.thread_counts() is None
    no_thread_producer.report_each_ack()  # nothing to tell: the poll decides


class CountingLedger:
    """Counts delivered batches; any other outcome is a failure of the test."""

    def __init__(self) -> None:
        self.delivered_batches = 0
        self.done: asyncio.Event | None = None

    def delivered(self, delivered: Any) -> None:
        self.delivered_batches += 1
        assert self.done is not None
        self.done.set()

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"an outcome other than delivered: {name}")


def test_the_dispatcher_settles_when_the_thread_wakes_it_and_stops_watching_at_shutdown(
    mock_cluster: MockCluster, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The thread is opt-in (PYDORY_REPORT_THREAD=1): the producers made here have it.
    monkeypatch.setattr(compiled_producer, "REPORT_THREAD", True)
    ledger = CountingLedger()
    dispatcher = Dispatcher(
        DeliverySettings(mock_cluster.bootstrap_servers),
        lambda topic: ProducerProfile(linger_ms=5, batch_messages=100, batch_bytes=100_000),
        Router(MetadataSnapshot.build({1: "b1"}, {topic: {0: 1}})),
        ledger,  # type: ignore[arg-type]
    )
    # No poll timers: after the poll that follows the send (a linger before the message
    # even leaves), only the thread's eventfd can bring its report to the loop.
    for interval in ("BUSY_POLL_INTERVAL_S", "IDLE_POLL_INTERVAL_S"):
        monkeypatch.setattr(dispatcher_module, interval, 3600.0)  # not a deadline: never
    wakes: list[int] = []
    on_ready = dispatcher._on_reports_ready
    monkeypatch.setattr(dispatcher, "_on_reports_ready", lambda: (wakes.append(1), on_ready()))

    async def send_then_shut_down() -> int:
        loop = asyncio.get_running_loop()
        ledger.done = asyncio.Event()
        dispatcher.start(loop)
        dispatcher.send(topic, 0, b"v", None, 0)
        (handle,) = dispatcher.producers.values()
        assert handle.backend is not None
        wake_fd = handle.backend.wake_fd
        assert wake_fd is not None
        await asyncio.wait_for(ledger.done.wait(), SAFETY_NET_S)
        await dispatcher.shutdown(max_delay_s=5.0)
        assert not loop.remove_reader(wake_fd)  # no longer watched
        return wake_fd

    with producer_backends.using("compiled"):
        asyncio.run(send_then_shut_down())
    assert wakes  # the report thread's eventfd woke the loop, which settled the delivery
    assert ledger.delivered_batches >= 1
