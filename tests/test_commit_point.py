"""The commit point's logic, on a fake clock and a fake input probe; its HTTP routes."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import given, settings
from hypothesis import strategies as st

from pydory.daemon.books.commit_point import EPOCH_S, TIMER_RESOLUTION_S, CommitPoint
from pydory.daemon.books.events import AccountingError
from pydory.status.commit_point import commit_point_routes

T = TypeVar("T")
WALL_OFFSET = 1_700_000_000.0  # the fake wall clock = the fake monotonic clock + this


@dataclass
class World:
    """A fake monotonic clock, a fake input socket (a queue of arrival times) whose marks
    are reached once the daemon has read what had arrived, and deferred sweeps."""

    now: float = 100.0
    unread: deque[float] = field(default_factory=deque)
    arrived: int = 0
    read_count: int = 0
    scheduled: list[tuple[float, Callable[[], None]]] = field(default_factory=list)  # due
    marks: int = 0
    wall_offset: float = WALL_OFFSET

    def clock(self) -> float:
        return self.now

    def wall_clock(self) -> float:
        return self.now + self.wall_offset

    def schedule(self, delay_s: float, callback: Callable[[], None]) -> bool:
        self.scheduled.append((self.now + delay_s, callback))
        return True

    def run_scheduled(self) -> None:
        """Run the callbacks due by now (those they schedule wait for the next call)."""
        due = [callback for when, callback in self.scheduled if when <= self.now]
        self.scheduled = [(when, c) for when, c in self.scheduled if when > self.now]
        for callback in due:
            callback()

    def arrive(self) -> None:
        """A client's message lands in the socket now."""
        self.unread.append(self.now)
        self.arrived += 1

    def read(self, commit_point: CommitPoint) -> tuple[int, float]:
        """The daemon reads and accepts the oldest unread message: its token, its arrival."""
        arrival = self.unread.popleft()
        self.read_count += 1
        return commit_point.open(), arrival

    def mark(self) -> FakeMark:
        self.marks += 1
        return FakeMark(self, self.arrived)

    def commit_point(self, **kwargs: Any) -> CommitPoint:
        return CommitPoint(
            self.mark,
            clock=self.clock,
            wall_clock=self.wall_clock,
            schedule=self.schedule,
            **kwargs,
        )


@dataclass
class FakeMark:
    world: World
    arrived: int  # messages arrived when the mark was taken

    def reached(self) -> bool:
        return self.world.read_count >= self.arrived


def value(commit_point: CommitPoint, sweep: bool = True, wall_offset: float = WALL_OFFSET) -> float:
    """The commit point on the fake monotonic clock."""
    return commit_point.current(sweep).commit_point - wall_offset


def test_with_nothing_open_the_commit_point_is_the_last_time_all_input_was_read() -> None:
    world = World(now=100.0)
    commit_point = world.commit_point()
    world.now = 105.0
    world.arrive()  # it waits unread in the socket: the commit point cannot pass 105
    world.now = 106.0
    assert value(commit_point) == pytest.approx(100.0)
    token, _ = world.read(commit_point)
    world.now = 107.0
    view = commit_point.current()
    assert view.commit_point - WALL_OFFSET == pytest.approx(100.0)  # read, not yet settled
    assert view.open_messages == 1
    commit_point.close(token)
    view = commit_point.current()
    assert view.commit_point - WALL_OFFSET == pytest.approx(107.0)
    assert view.lag_s == pytest.approx(0.0)
    assert view.open_messages == 0


def test_a_message_holds_the_commit_point_at_the_last_quiet_moment_before_it_was_read() -> None:
    world = World(now=100.0)
    commit_point = world.commit_point()
    world.now = 100.5
    world.arrive()
    world.now = 101.0
    assert not commit_point.sweep()  # unread input at 101: it may have arrived at 100.5
    world.now = 102.0
    token, arrival = world.read(commit_point)
    world.now = 103.0
    view = commit_point.current()
    assert view.commit_point - WALL_OFFSET <= arrival
    assert view.commit_point - WALL_OFFSET == pytest.approx(100.0)
    assert view.lag_s == pytest.approx(3.0)
    commit_point.close(token)
    assert value(commit_point) == pytest.approx(103.0)


def test_under_constant_input_the_quiet_mark_follows_what_has_been_read() -> None:
    """The sockets are never empty, yet each mark is reached once what it noted is read."""
    world = World(now=100.0)
    commit_point = world.commit_point()
    world.arrive()
    for step in range(1, 6):
        world.now = 100.0 + step
        commit_point.sweep()  # notes the message waiting now
        world.arrive()  # another one lands before the first is read
        token, _ = world.read(commit_point)
        commit_point.close(token)
    world.now = 106.0
    # The mark taken at 105 noted one message; it has been read: nothing from before 105
    # is left, though the socket has not been empty since 100.
    assert value(commit_point) == pytest.approx(105.0)


def test_generations_settle_in_any_order_and_the_oldest_decides() -> None:
    world = World(now=100.0)
    commit_point = world.commit_point()
    first = commit_point.open()
    world.now = 100.0 + EPOCH_S
    assert commit_point.sweep()  # all read: a new generation begins here
    second = commit_point.open()
    assert second != first
    world.now = 101.0
    commit_point.close(second)
    assert value(commit_point, sweep=False) == pytest.approx(100.0)
    commit_point.close(first)
    assert value(commit_point, sweep=False) == pytest.approx(100.0 + EPOCH_S)
    assert value(commit_point) == pytest.approx(101.0)


def test_messages_within_one_epoch_share_a_token() -> None:
    world = World(now=100.0)
    commit_point = world.commit_point()
    tokens = {commit_point.open()}
    world.now += EPOCH_S / 2
    commit_point.sweep()
    tokens.add(commit_point.open())
    assert len(tokens) == 1
    world.now += EPOCH_S
    commit_point.sweep()
    tokens.add(commit_point.open())
    assert len(tokens) == 2


def test_settling_a_token_twice_is_an_accounting_error() -> None:
    commit_point = World().commit_point()
    token = commit_point.open()
    commit_point.close(token)
    with pytest.raises(AccountingError):
        commit_point.close(token)


def test_settling_several_messages_of_a_token_at_once_counts_each() -> None:
    commit_point = World().commit_point()
    token = commit_point.open()
    commit_point.open()
    commit_point.open()
    commit_point.close(token, 2)
    assert commit_point.open_messages == 1
    with pytest.raises(AccountingError):
        commit_point.close(token, 2)  # only one is left
    assert commit_point.open_messages == 1
    commit_point.close(token)
    assert commit_point.open_messages == 0


def test_accepting_messages_sweeps_at_most_once_per_epoch() -> None:
    world = World(now=100.0)
    commit_point = world.commit_point()  # its creation counts as a sweep
    for _ in range(3):
        commit_point.open()
    assert len(world.scheduled) == 1
    world.run_scheduled()
    assert world.marks == 0  # under an epoch since the last sweep: later
    world.now += EPOCH_S
    world.run_scheduled()
    assert world.marks == 1
    commit_point.open()
    world.run_scheduled()
    assert world.marks == 1
    world.now += EPOCH_S
    world.run_scheduled()
    assert world.marks == 2
    world.now += EPOCH_S
    world.run_scheduled()
    assert world.marks == 2  # no message since: no sweep


def test_a_sweep_just_early_waits_at_least_the_loop_timers_resolution() -> None:
    """Early by less than the event loop's timers resolve, the sweep asks again for no
    less than that resolution (asked for less, uvloop runs it at the next turn: a spin)."""
    world = World(now=100.0)
    delays: list[float] = []

    def schedule(delay_s: float, callback: Callable[[], None]) -> bool:
        delays.append(delay_s)
        return world.schedule(delay_s, callback)

    commit_point = CommitPoint(
        world.mark, clock=world.clock, wall_clock=world.wall_clock, schedule=schedule
    )
    commit_point.open()
    world.now += EPOCH_S - TIMER_RESOLUTION_S / 10  # early by a tenth of the resolution
    world.run_scheduled()
    assert world.marks == 0
    assert delays == [0.0, TIMER_RESOLUTION_S]
    world.now += TIMER_RESOLUTION_S
    world.run_scheduled()
    assert world.marks == 1


def test_a_deferred_sweep_never_spins_the_real_event_loop() -> None:
    """On uvloop, the daemon's loop, whose timers resolve whole milliseconds: a sweep
    that finds itself early by less than that waits a resolution, not a turn of the loop.

    The epoch here is 10.3 ms: the timer the sweep asks for at the message (~10.25 ms,
    rounded to 10) comes back ~0.25 ms early; asked again for that (rounded to 0 ms), the
    loop ran it turn after turn until the epoch was over (~130 calls an epoch)."""
    import uvloop

    epochs = 20
    calls = 0

    async def main() -> None:
        nonlocal calls
        swept = asyncio.Event()
        commit_point = CommitPoint(lambda: FakeMark(World(), 0), epoch_s=0.0103)
        scheduled_sweep, sweep = commit_point._scheduled_sweep, commit_point.sweep

        def counted_scheduled_sweep() -> None:
            nonlocal calls
            calls += 1
            scheduled_sweep()

        def noted_sweep() -> bool:
            swept.set()
            return sweep()

        commit_point._scheduled_sweep = counted_scheduled_sweep  # type: ignore[method-assign]
        commit_point.sweep = noted_sweep  # type: ignore[method-assign]
        for _ in range(epochs):
            swept.clear()
            commit_point.sweep()  # an epoch starts now; the message below waits for its end
            swept.clear()
            commit_point.open()
            await swept.wait()

    uvloop.run(main())
    # One call from the message, one when the epoch's timer comes (early), one a
    # resolution later. Before: one per turn of the loop until the epoch was over.
    assert calls <= 5 * epochs


def test_the_deferred_sweep_moves_the_commit_point_once_its_messages_settle() -> None:
    world = World(now=100.0)
    commit_point = world.commit_point()
    world.now = 200.0
    token = commit_point.open()  # read at 200, yet counted from 100: the last quiet mark
    world.run_scheduled()  # after the burst of reads: all read, 200 is quiet
    commit_point.close(token)
    assert value(commit_point, sweep=False) == pytest.approx(200.0)


def test_the_number_of_live_generations_is_capped() -> None:
    world = World(now=100.0)
    commit_point = world.commit_point(max_live_generations=3)
    tokens = []
    for _ in range(10):
        tokens.append(commit_point.open())
        world.now += EPOCH_S
        commit_point.sweep()
    assert len(set(tokens)) == 3
    for token in tokens:
        commit_point.close(token)
    assert commit_point.open_messages == 0


# --- the guarantee, on random histories -----------------------------------------------------

_step = st.one_of(
    st.tuples(st.just("advance"), st.floats(min_value=0.0, max_value=0.05)),
    st.tuples(st.just("arrive"), st.integers(min_value=1, max_value=3)),
    st.tuples(st.just("read"), st.integers(min_value=1, max_value=3)),
    st.tuples(st.just("sweep"), st.just(0)),
    st.tuples(st.just("deferred"), st.just(0)),
    st.tuples(st.just("close"), st.integers(min_value=0, max_value=1000)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_step, max_size=200))
def test_no_unsettled_message_arrived_before_the_commit_point(
    steps: list[tuple[str, Any]],
) -> None:
    """Messages arrive in a socket, are read and accepted, and settle, in any order. No
    message still unread or unsettled arrived before the commit point; the commit point
    never moves backwards, is never after now, and reaches now once all is settled."""
    world = World(now=100.0, wall_offset=0.0)  # no offset: exact float arithmetic
    commit_point = world.commit_point(max_live_generations=4)

    def exact_value(sweep: bool = False) -> float:
        return value(commit_point, sweep, wall_offset=0.0)

    unsettled: list[tuple[int, float]] = []  # token, arrival
    previous = exact_value()
    for action, argument in steps:
        if action == "advance":
            world.now += argument
        elif action == "arrive":
            for _ in range(argument):
                world.arrive()
        elif action == "read":
            for _ in range(min(argument, len(world.unread))):
                unsettled.append(world.read(commit_point))
        elif action == "sweep":
            commit_point.sweep()
        elif action == "deferred":
            world.run_scheduled()
        elif unsettled:
            token, _ = unsettled.pop(argument % len(unsettled))
            commit_point.close(token)
        current = exact_value()
        assert previous <= current <= world.now
        for arrival in [*world.unread, *(arrival for _, arrival in unsettled)]:
            assert current <= arrival
        previous = current
    assert commit_point.open_messages == len(unsettled)
    while world.unread:
        unsettled.append(world.read(commit_point))
    for token, _ in unsettled:
        commit_point.close(token)
    world.now += 1.0
    assert exact_value(sweep=True) == world.now  # all read and settled: it is now


# --- waiting --------------------------------------------------------------------------------


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coroutine)


def test_waiting_for_a_moment_already_passed_returns_at_once() -> None:
    world = World(now=100.0)
    commit_point = world.commit_point()
    world.now = 101.0
    assert run(commit_point.wait_past(None, timeout_s=0))  # not a deadline
    assert run(commit_point.wait_past(WALL_OFFSET + 100.5, timeout_s=0))  # not a deadline


def test_settling_the_last_old_message_wakes_the_waiter() -> None:
    async def scenario() -> None:
        world = World(now=100.0)
        commit_point = world.commit_point()
        token = commit_point.open()
        world.now = 101.0
        waiter = asyncio.create_task(commit_point.wait_past(None, timeout_s=60))
        await asyncio.sleep(0)
        assert not waiter.done()
        other = commit_point.open()  # read after the waiter's moment: irrelevant to it
        commit_point.close(token)
        assert await waiter
        commit_point.close(other)

    run(scenario())


def test_a_waiter_needs_what_arrived_before_its_moment_read() -> None:
    async def scenario() -> None:
        world = World(now=100.0)
        commit_point = world.commit_point()
        world.arrive()
        world.now = 101.0
        waiter = asyncio.create_task(commit_point.wait_past(None, timeout_s=60))
        await asyncio.sleep(5 * EPOCH_S)  # sweeps keep finding the message unread
        assert not waiter.done()
        token, _ = world.read(commit_point)
        await asyncio.sleep(5 * EPOCH_S)  # read, but not settled
        assert not waiter.done()
        commit_point.close(token)
        assert await waiter

    run(scenario())


def test_a_waiter_times_out_while_a_message_is_stuck() -> None:
    async def scenario() -> None:
        world = World(now=100.0)
        commit_point = world.commit_point()
        token = commit_point.open()
        world.now = 101.0
        assert not await commit_point.wait_past(None, timeout_s=0.05)  # not a deadline
        assert not commit_point._waiters  # forgotten, so no sweep timer keeps running
        commit_point.close(token)
        assert await commit_point.wait_past(None, timeout_s=0)  # not a deadline

    run(scenario())


def test_released_waiters_answer_not_passed() -> None:
    async def scenario() -> None:
        world = World(now=100.0)
        commit_point = world.commit_point()
        commit_point.open()
        world.now = 101.0
        waiter = asyncio.create_task(commit_point.wait_past(None, timeout_s=60))
        await asyncio.sleep(0)
        commit_point.release_waiters()
        assert not await waiter
        assert commit_point.shutting_down
        assert not await commit_point.wait_past(None, timeout_s=60)

    run(scenario())


# --- the HTTP routes ------------------------------------------------------------------------


@dataclass
class FakeServer:
    commit_point: CommitPoint
    started_at: float = field(default_factory=time.time)


async def http_get(server: FakeServer, path: str) -> tuple[int, str, Any]:
    app = web.Application()
    app.add_routes(commit_point_routes(server))  # type: ignore[arg-type]  # a partial view
    async with TestClient(TestServer(app)) as client:
        response = await client.get(path)
        text = await response.text()
        body = await response.json() if response.content_type == "application/json" else text
        return response.status, response.content_type, body


def test_the_json_page_reports_the_commit_point() -> None:
    commit_point = CommitPoint()
    commit_point.open()
    status, content_type, page = run(http_get(FakeServer(commit_point), "/commit_point/json"))
    assert status == 200
    assert content_type == "application/json"
    assert set(page) == {
        "pid",
        "version",
        "since",
        "now",
        "commit_point",
        "commit_point_ms",
        "lag_s",
        "open_messages",
    }
    assert page["open_messages"] == 1
    assert page["commit_point_ms"] == int(page["commit_point"] * 1000)
    assert page["commit_point"] <= page["now"] + 1


def test_a_long_poll_says_whether_the_commit_point_passed() -> None:
    commit_point = CommitPoint()
    server = FakeServer(commit_point)
    _, _, passed = run(http_get(server, "/commit_point/json?after=now&timeout=5"))
    assert passed["passed"] is True
    assert passed["commit_point"] >= passed["after"]
    commit_point.open()
    _, _, stuck = run(http_get(server, "/commit_point/json?after=now&timeout=0.05"))
    assert stuck["passed"] is False
    assert stuck["shutting_down"] is False
    assert stuck["open_messages"] == 1
    _, content_type, plain = run(http_get(server, "/commit_point/plain?after=now&timeout=0"))
    assert content_type == "text/plain"
    assert "open messages: 1\n" in plain
    assert "passed: no\n" in plain


@pytest.mark.parametrize(
    "query", ["after=soon", "after=now&timeout=-1", "after=nan", "after=now&timeout=x"]
)
def test_a_bad_long_poll_query_is_refused(query: str) -> None:
    status, _, body = run(http_get(FakeServer(CommitPoint()), f"/commit_point/json?{query}"))
    assert status == 400
    assert "must" in body
