"""The heap given back when the daemon goes quiet (daemon/heap_trim.py): when it trims, on
a loop whose timers the test fires, and a real daemon trimming after start-up and again
after a load, on both implementations of ``trim_heap``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from helpers import settled, wait_until
from pydory import hotpath
from pydory.client import UnixStreamSender
from pydory.daemon import heap_trim
from pydory.daemon.heap_trim import MIN_INTERVAL_S, QUIET_DELAY_S, HeapTrim
from pydory.wire import encode_any_partition
from pydory_tools.testing.daemon import DaemonConfig, running_daemon
from pydory_tools.testing.mock_cluster import MockCluster


class Handle:
    def __init__(self) -> None:
        self.is_cancelled = False

    def cancel(self) -> None:
        self.is_cancelled = True


class Timers:
    """The part of a loop HeapTrim uses, its timers fired by the test."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.pending: list[tuple[float, Callable[[], None], Handle]] = []

    def call_later(self, delay: float, callback: Callable[[], None]) -> Handle:
        handle = Handle()
        self.pending.append((delay, callback, handle))
        return handle

    def fire(self) -> float:
        """Run the one timer set (time moves to it); its delay."""
        ((delay, callback, handle),) = self.pending
        self.pending.clear()
        self.now += delay
        if not handle.is_cancelled:
            callback()
        return delay


class Daemon:
    def __init__(self) -> None:
        self.busy = False
        self.trimmed = 0

    def trim(self) -> bool:
        self.trimmed += 1
        return True


@pytest.fixture
def setup() -> tuple[HeapTrim, Timers, Daemon]:
    timers, daemon = Timers(), Daemon()
    trim = HeapTrim(busy=lambda: daemon.busy, trim=daemon.trim, clock=lambda: timers.now)
    trim.start(timers)  # type: ignore[arg-type]
    return trim, timers, daemon


def test_a_quiet_daemon_is_trimmed_once_after_the_delay(
    setup: tuple[HeapTrim, Timers, Daemon],
) -> None:
    trim, timers, daemon = setup
    trim.quiet()
    trim.quiet()  # one trim waits at a time
    assert timers.fire() == QUIET_DELAY_S
    assert daemon.trimmed == 1
    assert timers.pending == []


def test_a_load_that_came_back_is_not_trimmed_and_its_end_asks_again(
    setup: tuple[HeapTrim, Timers, Daemon],
) -> None:
    trim, timers, daemon = setup
    trim.quiet()
    daemon.busy = True
    timers.fire()
    assert daemon.trimmed == 0
    daemon.busy = False
    trim.quiet()
    timers.fire()
    assert daemon.trimmed == 1


def test_trims_are_at_least_the_minimum_interval_apart(
    setup: tuple[HeapTrim, Timers, Daemon],
) -> None:
    trim, timers, daemon = setup
    trim.quiet()
    timers.fire()
    trim.quiet()  # at once after a trim: waits out the interval
    assert timers.fire() == pytest.approx(MIN_INTERVAL_S)
    assert daemon.trimmed == 2
    timers.now += 10 * MIN_INTERVAL_S  # long after: the quiet delay only
    trim.quiet()
    assert timers.fire() == QUIET_DELAY_S
    assert daemon.trimmed == 3


def test_the_end_of_start_up_trims_at_once_and_starts_the_interval(
    setup: tuple[HeapTrim, Timers, Daemon],
) -> None:
    trim, timers, daemon = setup
    trim.after_start_up()
    assert daemon.trimmed == 1
    assert timers.pending == []
    trim.quiet()  # a load ended right after start-up
    assert timers.fire() == pytest.approx(MIN_INTERVAL_S)
    assert daemon.trimmed == 2


def test_a_start_up_that_left_messages_in_librdkafka_trims_once_they_are_delivered(
    setup: tuple[HeapTrim, Timers, Daemon],
) -> None:
    trim, timers, daemon = setup
    daemon.busy = True  # the spool's replay handed messages over
    trim.after_start_up()
    assert daemon.trimmed == 0
    daemon.busy = False
    trim.quiet()
    assert timers.fire() == QUIET_DELAY_S
    assert daemon.trimmed == 1


def test_nothing_is_trimmed_before_start_or_after_stop(
    setup: tuple[HeapTrim, Timers, Daemon],
) -> None:
    trim, timers, daemon = setup
    trim.quiet()
    trim.stop()
    timers.fire()  # cancelled
    trim.quiet()
    assert timers.pending == []
    assert daemon.trimmed == 0
    never_started = HeapTrim(busy=lambda: False, trim=daemon.trim)
    never_started.quiet()  # no loop: nothing to schedule on, no error
    assert daemon.trimmed == 0


@pytest.mark.skipif(hotpath.IMPLEMENTATION != "compiled", reason="needs pydory._cwire")
def test_both_implementations_of_trim_heap_answer_whether_pages_went_back() -> None:
    from pydory import _cwire

    for trim_heap in (_cwire.trim_heap, hotpath._pure_trim_heap):
        garbage = [bytearray(4096) for _ in range(10_000)]
        del garbage[::2]  # freed chunks inside the heap, live ones between them
        assert isinstance(trim_heap(), bool)


@pytest.fixture
def quick_trims(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(heap_trim, "QUIET_DELAY_S", 0.01)
    monkeypatch.setattr(heap_trim, "MIN_INTERVAL_S", 0.0)


def test_a_daemon_trims_after_start_up_and_after_each_load(
    quick_trims: None,
    mock_cluster: MockCluster,
    unique_topic: Callable[[str], str],
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    topic = unique_topic("trim")
    mock_cluster.create_topic(topic, 2)
    config = DaemonConfig(mock_cluster.bootstrap_servers, str(tmp_path_factory.mktemp("s")))
    with running_daemon(config) as daemon:
        trims: Any = daemon.server.heap_trim
        assert trims.trims == 1  # at the end of start-up, before it said it was ready
        for load in (1, 2):
            before = trims.trims
            with UnixStreamSender(config.stream_path) as sender:
                sender.send_many(encode_any_partition(topic, b"m") for _ in range(500))
            wait_until(settled(daemon, topic, 500 * load), what=f"load {load} delivered")
            wait_until(lambda: trims.trims > before, what=f"a trim after load {load}")  # noqa: B023
