"""The overload policy: what the daemon does when the memory pool runs short.

Unit tests of :class:`pydory.daemon.admission.overload.Overload` on a real pool with a fake clock
and fake inputs; then a real daemon on librdkafka's mock cluster with every broker down,
so that nothing the daemon accepts can leave memory: under ``backpressure`` the writers
block (stream) or meet a full queue (datagram) and nothing is discarded; under
``discard`` (Dory's) the excess is discarded ``no_memory``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import select
import socket
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from helpers import assert_balanced, settled, wait_until
from pydory.config.model import OverloadPolicy
from pydory.daemon.admission.intake import Intake
from pydory.daemon.admission.overload import Overload
from pydory.daemon.books.counters import Counters
from pydory.daemon.books.pool import MemoryPool
from pydory.daemon.spool.records import HEADER_BYTES
from pydory.daemon.spool.segments import Spool
from pydory.wire import encode_any_partition
from pydory_tools.testing.daemon import DaemonConfig, RunningDaemon, running_daemon
from pydory_tools.testing.kafka_util import consume_all
from pydory_tools.testing.mock_cluster import MockCluster

# --- unit: Overload on a fake clock and fake inputs ---------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class FakeInput:
    """Records how often it was paused and resumed."""

    def __init__(self) -> None:
        self.pauses = 0
        self.resumes = 0

    @property
    def paused(self) -> bool:
        return self.pauses > self.resumes

    def pause(self) -> None:
        self.pauses += 1

    def resume(self) -> None:
        self.resumes += 1


class FakeIntake:
    hold_when_memory_short = False


def overload(
    policy: OverloadPolicy, budget: int = 100
) -> tuple[Overload, MemoryPool, list[FakeInput], FakeClock, Counters, FakeIntake]:
    clock = FakeClock()
    pool = MemoryPool(budget, clock=clock)
    inputs = [FakeInput(), FakeInput()]
    counters = Counters()
    intake = FakeIntake()
    policy_object = Overload(
        policy, pool, cast(Intake, intake), lambda: inputs, counters, clock=clock
    )
    return policy_object, pool, inputs, clock, counters, intake


def test_backpressure_pauses_every_input_once_per_episode_and_resumes_on_room() -> None:
    policy, pool, inputs, clock, counters, intake = overload(OverloadPolicy.BACKPRESSURE)
    assert intake.hold_when_memory_short
    assert pool.try_allocate(60)
    assert [i.pauses for i in inputs] == [0, 0]
    assert pool.try_allocate(60)  # depleted (over-allocation)
    assert [i.pauses for i in inputs] == [1, 1]
    assert policy.paused
    pool.force_allocate(30)  # a burst already read is charged: no second pause
    assert not pool.try_allocate(1)
    clock.now += 2.5
    assert policy.paused_seconds() == pytest.approx(2.5)
    pool.release(60)  # 90 of 100 used: room again
    assert [i.resumes for i in inputs] == [1, 1]
    assert not policy.paused
    assert counters.get("backpressure_pauses") == 1
    assert counters.get("backpressure_paused_ms") == 2500
    clock.now += 10
    assert policy.paused_seconds() == pytest.approx(2.5)  # nothing counted while reading
    # A second episode: counted again, the paused time adds up.
    assert pool.try_allocate(20)
    assert [i.pauses for i in inputs] == [2, 2]
    clock.now += 1
    pool.release(20)
    assert [(i.pauses, i.resumes) for i in inputs] == [(2, 2), (2, 2)]
    assert counters.get("backpressure_pauses") == 2
    assert counters.get("backpressure_paused_ms") == 3500


def test_backpressure_does_not_resume_while_still_depleted() -> None:
    _policy, pool, inputs, _clock, _counters, _intake = overload(OverloadPolicy.BACKPRESSURE)
    assert pool.try_allocate(100)
    pool.force_allocate(50)
    pool.release(40)  # 110 used of 100: still depleted
    assert all(i.paused for i in inputs)
    pool.release(10)  # 100 used: still depleted (available == 0)
    assert all(i.paused for i in inputs)
    pool.release(1)
    assert not any(i.paused for i in inputs)
    assert [i.pauses for i in inputs] == [1, 1]


def test_discard_never_pauses_and_lets_intake_discard() -> None:
    policy, pool, inputs, clock, counters, intake = overload(OverloadPolicy.DISCARD)
    assert not intake.hold_when_memory_short
    assert pool.try_allocate(200)
    clock.now += 5
    pool.release(200)
    assert [(i.pauses, i.resumes) for i in inputs] == [(0, 0), (0, 0)]
    assert not policy.paused
    assert counters.get("backpressure_pauses") == 0
    assert policy.paused_seconds() == 0


def test_inputs_stay_paused_once_the_daemon_is_stopping() -> None:
    policy, pool, inputs, clock, counters, _intake = overload(OverloadPolicy.BACKPRESSURE)
    assert pool.try_allocate(100)
    policy.stopping()
    clock.now += 1
    pool.release(100)
    assert [(i.pauses, i.resumes) for i in inputs] == [(1, 0), (1, 0)]
    assert counters.get("backpressure_paused_ms") == 1000  # the episode is still counted
    assert pool.try_allocate(100)  # depleted again while stopping
    pool.release(100)
    assert all(i.resumes == 0 for i in inputs)


def test_inputs_opened_on_a_depleted_pool_start_paused() -> None:
    opened: list[FakeInput] = []
    clock = FakeClock()
    pool = MemoryPool(100, clock=clock)
    policy = Overload(
        OverloadPolicy.BACKPRESSURE,
        pool,
        cast(Intake, FakeIntake()),
        lambda: opened,
        Counters(),
        clock=clock,
    )
    pool.force_allocate(150)  # a spool replay, before any input exists
    opened += [FakeInput(), FakeInput()]
    policy.inputs_opened()
    assert [(i.pauses, i.resumes) for i in opened] == [(1, 0), (1, 0)]
    pool.release(150)
    assert [(i.pauses, i.resumes) for i in opened] == [(1, 1), (1, 1)]
    policy.inputs_opened()  # room: nothing to do
    assert [i.pauses for i in opened] == [1, 1]


def test_wait_for_room_returns_when_the_pool_has_room_again() -> None:
    async def scenario() -> None:
        policy, pool, _inputs, _clock, _counters, _intake = overload(OverloadPolicy.DISCARD)
        await asyncio.wait_for(policy.wait_for_room(), 60)
        assert pool.try_allocate(100)
        waiting = asyncio.ensure_future(policy.wait_for_room())
        await asyncio.sleep(0.01)
        assert not waiting.done()
        pool.release(100)
        await asyncio.wait_for(waiting, 60)

    asyncio.run(scenario())


# --- the daemon, with every broker down -----------------------------------------------------

MESSAGE_COUNT = 4000  # of ~1 KB: 4 MB, far more than the pool, the socket buffers and a burst


@pytest.fixture
def socket_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("s", numbered=True))


def daemon_config(
    mock_cluster: MockCluster, socket_dir: str, spool: Path, policy: str
) -> DaemonConfig:
    return DaemonConfig(
        mock_cluster.bootstrap_servers,
        socket_dir,
        max_buffer="64k",
        spool_path=str(spool),
        overload_policy=policy,
        tcp_port=None,
        # Reconnect soon after the brokers return, rather than after up to 10 s of backoff.
        librdkafka={"reconnect.backoff.max.ms": "500"},
    )


def get_json(daemon: RunningDaemon, path: str, timeout: float) -> Any:
    url = f"http://127.0.0.1:{daemon.daemon_config.http_port}{path}"
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.load(response)


def counters(daemon: RunningDaemon) -> dict[str, int]:
    page = get_json(daemon, "/counters/json", timeout=60)
    return {c["name"]: c["value"] for c in page["counters"]}


def values(prefix: bytes, count: int) -> list[bytes]:
    return [prefix + b"%05d" % i + b"." * 1000 for i in range(count)]


def brokers(mock_cluster: MockCluster, up: bool) -> None:
    for broker in mock_cluster.broker_ids:
        (mock_cluster.broker_up if up else mock_cluster.broker_down)(broker)


@contextlib.contextmanager
def writer_after_the_brokers_went_down(
    daemon: RunningDaemon, mock_cluster: MockCluster, topic: str
) -> Iterator[socket.socket]:
    """A non-blocking UNIX stream writer whose warm-up message was delivered, and then
    every broker down: from here on the daemon's deliveries are held."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as writer:
        writer.connect(daemon.daemon_config.stream_path)
        writer.sendall(encode_any_partition(topic, b"warm-up"))
        wait_until(settled(daemon, topic, 1), what="the warm-up's delivery")
        brokers(mock_cluster, up=False)
        writer.setblocking(False)
        yield writer


def send_until_blocked(sock: socket.socket, data: memoryview, quiet_s: float = 1.0) -> int:
    """Write ``data`` on non-blocking ``sock`` until the socket stays unwritable for
    ``quiet_s``; return how many bytes were written (all of them if it never blocks)."""
    sent = 0
    deadline = time.monotonic() + 60
    while sent < len(data):
        assert time.monotonic() < deadline, "the writer neither blocked nor finished"
        try:
            sent += sock.send(data[sent:])
        except BlockingIOError:
            _, writable, _ = select.select([], [sock], [], quiet_s)
            if not writable:
                return sent
    return sent


def fill_datagram_queue(path: str, topic: str, limit: int = 10_000) -> list[bytes]:
    """Send datagrams without blocking until the daemon's queue is full; return those sent."""
    sent: list[bytes] = []
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.setblocking(False)
        for value in values(b"d", limit):
            try:
                sock.sendto(encode_any_partition(topic, value), path)
            except BlockingIOError:
                return sent
            sent.append(value)
    raise AssertionError(f"{limit} datagrams went through: the daemon kept reading")


@pytest.mark.slow
def test_backpressure_blocks_writers_discards_nothing_and_delivers_everything_after(
    mock_cluster: MockCluster,
    unique_topic: Callable[[str], str],
    socket_dir: str,
    tmp_path: Path,
) -> None:
    topic, dgram_topic = unique_topic("bp"), unique_topic("bpd")
    for name in (topic, dgram_topic):
        mock_cluster.create_topic(name, 4)
    config = daemon_config(mock_cluster, socket_dir, tmp_path / "spool", "backpressure")
    stream_values = values(b"s", MESSAGE_COUNT)
    data = memoryview(b"".join(encode_any_partition(topic, v) for v in stream_values))
    with running_daemon(config) as daemon:
        with writer_after_the_brokers_went_down(daemon, mock_cluster, topic) as writer:
            sent = send_until_blocked(writer, data)
            # The writer is blocked: far short of the whole, the daemon paused, nothing lost.
            assert 0 < sent < len(data)
            wait_until(
                lambda: counters(daemon).get("backpressure_pauses", 0) >= 1,
                what="the inputs paused",
            )
            # Datagrams stay queued in the kernel: a non-blocking sender meets EAGAIN.
            datagrams = fill_datagram_queue(config.datagram_path, dgram_topic)
            # Still responsive: the status pages answer within a second while paused.
            books = get_json(daemon, "/books/json", timeout=60.0)
            assert books is not None
            held = daemon.snapshot()
            assert held["pool_used"] >= 64 * 1024
            assert held["discards"]["no_memory"] == 0
            # Still blocked. A first try may fill room the kernel found after the writer
            # first blocked (the daemon reads 32 KiB at a time, and a socket buffer frees
            # its memory whole buffers at a time); the second must get nothing in.
            sent += send_until_blocked(writer, data[sent:], quiet_s=0.5)
            assert send_until_blocked(writer, data[sent:], quiet_s=0.5) == 0
            brokers(mock_cluster, up=True)
            writer.settimeout(120)
            writer.sendall(data[sent:])  # the writer resumes and finishes
        total = 1 + MESSAGE_COUNT
        wait_until(settled(daemon, topic, total), 120, what="every stream message's delivery")
        wait_until(settled(daemon, dgram_topic, len(datagrams)), 60, what="the datagrams")
        snapshot = daemon.snapshot()
        after = counters(daemon)
    assert {reason: n for reason, n in snapshot["discards"].items() if n} == {}
    assert snapshot["topics"][topic]["accepted"] == snapshot["topics"][topic]["delivered"] == total
    dgram_books = snapshot["topics"][dgram_topic]
    assert dgram_books["accepted"] == dgram_books["delivered"] == len(datagrams) > 0
    assert_balanced(snapshot)
    assert snapshot["pool_used"] == 0
    assert after["backpressure_pauses"] >= 1
    assert after["backpressure_paused_ms"] > 0


@pytest.mark.slow
def test_discard_policy_discards_the_excess_no_memory_in_the_same_scenario(
    mock_cluster: MockCluster,
    unique_topic: Callable[[str], str],
    socket_dir: str,
    tmp_path: Path,
) -> None:
    topic = unique_topic("dis")
    mock_cluster.create_topic(topic, 4)
    config = daemon_config(mock_cluster, socket_dir, tmp_path / "spool", "discard")
    stream_values = values(b"s", MESSAGE_COUNT)
    data = memoryview(b"".join(encode_any_partition(topic, v) for v in stream_values))
    with running_daemon(config) as daemon:
        with writer_after_the_brokers_went_down(daemon, mock_cluster, topic) as writer:
            # The daemon keeps reading (and discarding): the writer never blocks for long.
            assert send_until_blocked(writer, data, quiet_s=10) == len(data)

        def all_admitted_or_refused() -> bool:
            books = daemon.snapshot()["topics"][topic]
            return books["accepted"] - 1 + books["discarded"].get("no_memory", 0) == MESSAGE_COUNT

        wait_until(all_admitted_or_refused, what="every message admitted or refused")
        brokers(mock_cluster, up=True)
        wait_until(settled(daemon, topic, 1), 60, what="the held messages' delivery")
        snapshot = daemon.snapshot()
        after = counters(daemon)
    books = snapshot["topics"][topic]
    assert books["discarded"]["no_memory"] > 0
    assert books["accepted"] == books["delivered"]
    assert books["accepted"] - 1 + books["discarded"]["no_memory"] == MESSAGE_COUNT
    assert_balanced(snapshot)
    assert after.get("backpressure_pauses", 0) == 0


@pytest.mark.slow
def test_inputs_opened_after_a_replay_that_left_the_pool_depleted_start_paused(
    mock_cluster: MockCluster,
    unique_topic: Callable[[str], str],
    socket_dir: str,
    tmp_path: Path,
) -> None:
    """The replay depletes the pool before the inputs exist; under backpressure they must
    open paused, not read (and charge to the pool) everything until the first delivery."""
    topic = unique_topic("bpr")
    mock_cluster.create_topic(topic, 4)
    spool_dir = tmp_path / "spool"
    replayed = values(b"r", 200)  # ~200 KiB: three times the pool
    with Spool(
        str(spool_dir), segment_bytes=4 << 20, max_bytes=1 << 30, fsync_interval_ms=None
    ) as spool:
        spool.append_payloads([encode_any_partition(topic, v) for v in replayed])
    for broker in mock_cluster.broker_ids:
        mock_cluster.set_rtt(broker, 3000)  # the replayed messages stay in the pool a while
    config = daemon_config(mock_cluster, socket_dir, spool_dir, "backpressure")
    stream_values = values(b"s", MESSAGE_COUNT)
    data = memoryview(b"".join(encode_any_partition(topic, v) for v in stream_values))
    with running_daemon(config) as daemon:
        assert daemon.snapshot()["pool_used"] > 64 * 1024  # depleted by the replay
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as writer:
            writer.connect(config.stream_path)
            writer.setblocking(False)
            sent = send_until_blocked(writer, data, quiet_s=0.5)
            held = daemon.snapshot()
            assert sent < len(data)
            # The new connection was read once at most (uvloop reads a new connection once
            # before a pause holds; a read is at most 256 KiB), then left waiting.
            one_read = 256 * 1024 // len(encode_any_partition(topic, stream_values[0])) + 1
            assert len(replayed) <= held["topics"][topic]["accepted"] <= len(replayed) + one_read
            for broker in mock_cluster.broker_ids:
                mock_cluster.set_rtt(broker, 0)
            writer.settimeout(120)
            writer.sendall(data[sent:])
        total = len(replayed) + MESSAGE_COUNT
        wait_until(settled(daemon, topic, total), 120, what="every message's delivery")
        snapshot = daemon.snapshot()
    assert snapshot["topics"][topic]["delivered"] == total
    assert {reason: n for reason, n in snapshot["discards"].items() if n} == {}


@pytest.mark.slow
def test_spool_policy_keeps_bursts_on_disk_and_delivers_them_in_order_as_memory_frees(
    mock_cluster: MockCluster,
    unique_topic: Callable[[str], str],
    socket_dir: str,
    tmp_path: Path,
) -> None:
    """The spool policy: the writer never blocks and nothing is discarded; what memory
    cannot hold waits on disk (the pool stays near its budget) and is delivered, in the
    order it came, once the brokers are back."""
    topic = unique_topic("spp")
    mock_cluster.create_topic(topic, 1)  # one partition: Kafka's order is the daemon's
    config = daemon_config(mock_cluster, socket_dir, tmp_path / "spool", "spool")
    stream_values = values(b"s", MESSAGE_COUNT)
    data = memoryview(b"".join(encode_any_partition(topic, v) for v in stream_values))
    with running_daemon(config) as daemon:
        with writer_after_the_brokers_went_down(daemon, mock_cluster, topic) as writer:
            # The daemon keeps reading, to disk: the writer never blocks for long.
            assert send_until_blocked(writer, data, quiet_s=10) == len(data)

        def all_read() -> bool:
            return daemon.snapshot()["received"]["unix_stream"] == 1 + MESSAGE_COUNT

        wait_until(all_read, what="every message read")
        held = daemon.snapshot()
        deferred = counters(daemon).get("spool_deferred", 0)
        # Most of the 4 MB waits on disk; memory holds about its 64 KB budget and a burst.
        assert deferred > MESSAGE_COUNT // 2
        assert held["pool_used"] < 64 * 1024 + 300 * 1024
        assert held["discards"]["no_memory"] == 0
        # They were received: the commit point waits for them.
        point = get_json(daemon, "/commit_point/json", timeout=60)
        assert point["open_messages"] == MESSAGE_COUNT
        brokers(mock_cluster, up=True)
        wait_until(settled(daemon, topic, 1 + MESSAGE_COUNT), 120, what="every delivery")
        snapshot = daemon.snapshot()
    assert {reason: n for reason, n in snapshot["discards"].items() if n} == {}
    assert_balanced(snapshot)
    assert snapshot["pool_used"] == 0
    records = consume_all(mock_cluster.bootstrap_servers, topic, 1 + MESSAGE_COUNT)
    assert [r.value for r in records] == [b"warm-up", *stream_values]  # in order, once each
    assert not any((tmp_path / "spool").glob("segment-*.spool")) or all(
        p.stat().st_size <= HEADER_BYTES for p in (tmp_path / "spool").glob("segment-*.spool")
    )
