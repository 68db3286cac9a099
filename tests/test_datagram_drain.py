"""The datagram socket's drain thread (pydory._cwire.DatagramDrain and
pydory.daemon.inputs.datagram_drain, issue 34 lever 1): the same items as the loop's
``recvmmsg`` reader (hypothesis), a bounded ring that stops reading when full (the kernel's
queue then backs up: the sender is refused, nothing is dropped), everything read handed on
after a stop, and the datagram input on it: paused, resumed, reloaded, closed, in order.

The daemon-level datagram suites run on it too (tests/hotpaths.py's ``"drain"``).
"""

from __future__ import annotations

import asyncio
import os
import select
import socket
from collections.abc import Iterator
from typing import Any

import pytest
import uvloop
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import DatagramIntake as Recording
from hotpaths import compiled_module, using
from pydory.config.model import ClientRate
from pydory.daemon.inputs import datagram_drain
from pydory.daemon.inputs.datagram import DatagramInput

cwire = compiled_module()
pytestmark = pytest.mark.skipif(cwire is None, reason="pydory._cwire is not built here")


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    receiver, sender = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    receiver.setblocking(False)
    sender.setblocking(False)
    with receiver, sender:
        yield receiver, sender


def take_until(drain: Any, count: int) -> list[Any]:
    """Take bursts as the drain signals them until ``count`` items came."""
    items: list[Any] = []
    while len(items) < count:
        ready, _, _ = select.select([drain.wake_fd], [], [], 60)  # a safety net only
        assert ready, f"the drain handed on {len(items)} of {count}"
        got, _, error, uids = drain.take()
        assert error == 0
        assert uids is None  # not asked for
        items += got
    return items


@settings(max_examples=60, deadline=None)
@given(
    max_size=st.integers(1, 300),
    sizes=st.lists(st.integers(0, 400), min_size=1, max_size=40),
    burst=st.integers(1, 8),
)
def test_the_drain_hands_on_what_the_loop_reader_reads(
    max_size: int, sizes: list[int], burst: int
) -> None:
    datagrams = [bytes([i % 251]) * size for i, size in enumerate(sizes)]
    results = []
    for use_drain in (False, True):
        receiver, sender = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        receiver.setblocking(False)
        with receiver, sender:
            sender.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
            receiver.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
            if use_drain:
                drain = cwire.DatagramDrain(receiver.fileno(), max_size, burst)
                drain.start()
                for data in datagrams:  # the thread reads as they come: never blocks
                    sender.send(data)
                results.append(take_until(drain, len(datagrams)))
                drain.stop()
                assert drain.take() == ([], False, 0, None)
            else:  # with each sender's runs, cut in C (one sender here: one run a read)
                receiver.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
                reader = cwire.DatagramReader(receiver.fileno(), max_size, True)
                items: list[Any] = []
                for data in datagrams:
                    sender.send(data)
                    got, _, _, runs = reader.read_runs(64)
                    assert runs == [(os.getuid(), len(got))]
                    items += got
                results.append(items)
    assert results[0] == results[1]
    # An oversized one: its size, and what a slot of max_size + 1 bytes kept (at most 64).
    kept = min(max_size + 1, 64)
    expected = [d if len(d) <= max_size else (len(d), d[:kept]) for d in datagrams]
    assert results[1] == expected


def test_a_full_ring_stops_reading_and_the_kernel_queue_backs_up(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    receiver, sender = pair
    drain = cwire.DatagramDrain(receiver.fileno(), 100, 3)
    # What it says it holds at most (the kill loop's bound and /books/json count it).
    assert drain.capacity == cwire.DRAIN_BURSTS * 3
    drain.start()
    sent = 0
    refused = False
    # The loop takes nothing: the thread fills its bursts of 3, then the kernel's queue.
    while not refused:
        try:
            sender.send(b"%d" % sent)
            sent += 1
        except BlockingIOError:
            # The thread may be between two reads: refused only once it waits for room.
            if drain.stats()["waits_for_room"] > 0 and drain.position()[0] == drain.capacity:
                refused = True
            else:
                select.select([], [sender], [], 1)  # not a deadline: the thread's progress
    assert drain.position()[0] == drain.capacity  # held: its bursts of 3, no more
    assert sent > drain.capacity  # the rest waited in the kernel's queue
    items = take_until(drain, sent)
    assert items == [b"%d" % i for i in range(sent)]  # in order, nothing dropped
    drain.stop()


def test_what_the_thread_read_is_taken_after_it_stops(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    receiver, sender = pair
    drain = cwire.DatagramDrain(receiver.fileno(), 100, 2)
    drain.start()
    for i in range(7):
        sender.send(b"%d" % i)
    select.select([drain.wake_fd], [], [], 60)  # a safety net only
    while drain.position()[0] < 7:  # not a deadline: the thread reads what was sent
        select.select([], [], [], 0.01)
    drain.stop()
    items: list[Any] = []
    while True:
        got, _, _, _ = drain.take()
        if not got:
            break
        assert len(got) <= 2
        items += got
    assert items == [b"%d" % i for i in range(7)]
    assert drain.position() == (0, drain.stats()["empty_queues"])


def test_with_credentials_each_burst_carries_its_senders_runs(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    receiver, sender = pair
    receiver.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
    drain = cwire.DatagramDrain(receiver.fileno(), 100, 512, True)
    drain.start()
    for i in range(20):
        sender.send(b"%d" % i)
    items: list[Any] = []
    runs: list[Any] = []
    while len(items) < 20:
        select.select([drain.wake_fd], [], [], 60)  # a safety net only
        got, _, _, senders = drain.take()
        assert senders == [(os.getuid(), len(got))]  # one sender: one run, cut in C
        items += got
        runs += senders
    drain.stop()
    assert items == [b"%d" % i for i in range(20)]
    assert sum(end for _, end in runs) == 20


def test_the_drain_refuses_a_size_it_has_no_slots_for() -> None:
    with pytest.raises(ValueError, match="max_size"):
        cwire.DatagramDrain(0, 256 * 1024)
    with pytest.raises(ValueError, match="burst_datagrams"):
        cwire.DatagramDrain(0, 100, 0)


# --- the datagram input on the drain ------------------------------------------------------


def test_the_choice_is_on_by_default_and_off_when_named() -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv(datagram_drain.DRAIN_VARIABLE, raising=False)
        assert datagram_drain._choose() == (cwire.DatagramDrain, "on by default")
        patch.setenv(datagram_drain.DRAIN_VARIABLE, "0")
        assert datagram_drain._choose()[0] is None
        patch.setenv(datagram_drain.DRAIN_VARIABLE, "1")
        assert datagram_drain._choose()[0] is cwire.DatagramDrain
        patch.setattr(datagram_drain.hotpath, "DatagramDrain", None)  # the pure hot path
        assert datagram_drain._choose()[0] is None
        patch.delenv(datagram_drain.DRAIN_VARIABLE)
        assert datagram_drain._choose()[0] is None


def test_the_input_drained_hands_on_in_order_through_pause_reload_quota_and_close(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    path = os.path.join(str(tmp_path_factory.mktemp("d")), "d")

    async def scenario() -> None:
        intake = Recording()
        # The quota's clock stands still: its one message of credit never comes back.
        datagram_input = DatagramInput(path, None, 100, False, intake, clock=lambda: 1000.0)
        datagram_input.start(asyncio.get_running_loop())
        assert datagram_input._drain is not None  # drained by a thread
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as client:
            client.connect(path)
            client.setblocking(False)
            sent: list[bytes] = []

            def send(count: int) -> None:
                for _ in range(count):
                    sent.append(b"m%d" % len(sent))
                    client.send(sent[-1])

            send(5)
            await intake.until(5)
            datagram_input.pause()
            send(8)  # read by the thread, held: not handed on while paused
            drain = datagram_input._drain
            assert drain is not None
            while drain.position()[0] < 8:  # not a deadline: the thread reads them
                await asyncio.sleep(0.01)
            await asyncio.sleep(0)
            assert len(intake.received) == 5
            mark = datagram_input.mark_unread(set())
            assert mark  # held by the thread: not read yet
            assert not mark[0].reached()
            datagram_input.resume()
            await intake.until(13)
            assert mark[0].reached()
            send(3)
            await intake.until(16)
            datagram_input.set_max_msg_size(2)  # a reload: the thread rebuilt at the limit
            send(1)
            await intake.until(17)
            assert intake.too_large == [(3, b"m16")]
            datagram_input.set_max_msg_size(100)
            # A quota: the thread keeps each sender's uid, the loop judges (a credit of 1).
            datagram_input.set_quota(ClientRate(msgs_per_sec=1, window_ms=1000))
            assert datagram_input._drain is not None
            send(2)
            await intake.until(19)
            assert intake.over == [sent[-1]]
            datagram_input.set_quota(ClientRate())
            assert datagram_input._drain is not None
            send(4)
            datagram_input.close()
        assert intake.received == [d for d in sent if d not in (b"m16", b"m18")]  # in order
        assert intake.over == [b"m18"]

    with using("drain"):
        uvloop.run(scenario())
