"""Message debugging (``<msgDebug>``): its pure parts, its limits, its files, and the intake
tracing only the selected topics (the daemon on a real broker: test_msg_debug_kafka.py)."""

from __future__ import annotations

import base64
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest
from hypothesis import given
from hypothesis import strategies as st

from helpers import RecordingDispatcher
from pydory.config.model import MsgDebugConfig
from pydory.daemon.admission.intake import Intake
from pydory.daemon.admission.ratelimit import RateLimit, TopicRateLimiter
from pydory.daemon.books.accounting import Books
from pydory.daemon.books.commit_point import CommitPoint
from pydory.daemon.books.counters import MSG_DEBUG_WRITTEN, Counters
from pydory.daemon.books.events import Transport
from pydory.daemon.books.msg_debug import (
    FILE_NAMES,
    MsgDebug,
    Selection,
    Stage,
    format_line,
)
from pydory.daemon.books.pool import MemoryPool
from pydory.daemon.delivery.dispatcher import Dispatcher
from pydory.daemon.delivery.router import MetadataSnapshot, Router
from pydory.wire import encode_any_partition, encode_partition_key

NOW_S = 1_795_246_679.301
LINE = re.compile(
    rb"ts: (-?\d+) topic: (\d+)\[([^]]*)\] key: (\d+)\[([^]]*)\] value: (\d+)\[([^]]*)\]"
    rb"(?:( partition: (\d+))? now: (\d+))?\n"
)


# --- the line ------------------------------------------------------------------------------


def test_a_line_is_exactly_dorys() -> None:
    """Dory's debug_logger.cc: ts, topic, key, value, nothing after."""
    line = format_line(1795246679208, "clock", b"", b"hello", partition=3)
    assert line == b"ts: 1795246679208 topic: 5[clock] key: 0[] value: 8[aGVsbG8=]\n"


def test_with_the_extra_fields_partition_and_now_follow() -> None:
    line = format_line(1795246679208, "clock", b"", b"hello", partition=3, now_ms=1795246679301)
    assert line == (
        b"ts: 1795246679208 topic: 5[clock] key: 0[] value: 8[aGVsbG8=] partition: 3"
        b" now: 1795246679301\n"
    )


def test_lines_are_dorys_unless_the_extra_fields_are_asked_for() -> None:
    for extra in (False, True):
        sinks = [ListSink() for _ in FILE_NAMES]
        config = MsgDebugConfig("/nowhere", extra_fields=extra)
        msg_debug = MsgDebug(config, Counters(), writers=sinks, wall_clock=lambda: NOW_S)
        msg_debug.add_topic("a")
        msg_debug.acknowledged("a", 2, b"k", b"v", 11)
        [line] = sinks[Stage.ACKNOWLEDGED].lines
        assert line.endswith(b" partition: 2 now: 1795246679301\n" if extra else b"[dg==]\n")


def test_key_and_value_are_base64_and_partition_only_when_known() -> None:
    key, value = b"\x00\xffk\n", bytes(range(256))
    line = format_line(-1, "t", key, memoryview(value), now_ms=7)
    match = LINE.fullmatch(line)
    assert match is not None
    assert match.group(8) is None  # no partition before routing
    assert base64.b64decode(match.group(5)) == key
    assert base64.b64decode(match.group(7)) == value
    assert int(match.group(6)) == len(match.group(7))
    assert line.count(b"\n") == 1


# --- the selection (Dory's rules) ----------------------------------------------------------


KAFKA_TOPIC_NAME = re.compile(r"[a-zA-Z0-9._-]{1,249}")


@pytest.mark.parametrize(
    "name", ["", "\x00", "a/b", "x" * 250, "x" * 5000, ".", "..", "caf\u00e9", "a b", "a\nb"]
)
def test_selection_refuses_names_kafka_refuses(name: str) -> None:
    assert Selection().add(name) is None
    assert Selection(topics=frozenset({"ok"})).add(name) is None


@given(
    st.text(alphabet=st.characters(codec="utf-8"), max_size=300)
    | st.from_regex(KAFKA_TOPIC_NAME, fullmatch=True)
)
def test_selection_accepts_exactly_kafkas_topic_names(name: str) -> None:
    legal = KAFKA_TOPIC_NAME.fullmatch(name) is not None and name not in (".", "..")
    added = Selection().add(name)
    assert (added is not None) == legal
    if added is not None:
        assert added.topics == frozenset({name})


def test_selection_adds_and_removes_topics_by_dorys_rules() -> None:
    none = Selection()
    assert none.empty
    assert none.describe() == "No message debug topics are currently enabled\n"
    one = none.add("b")
    assert one is not None
    assert one.traces("b")
    assert not one.traces("a")
    assert one.add("b") is None  # already there: Dory's "Failed to enable"
    assert none.add("") is None
    two = one.add("a")
    assert two is not None
    assert two.describe() == "topic: [a]\ntopic: [b]\n"
    assert two.remove("c") is None  # not there: "Failed to disable"
    back = two.remove("b")
    assert back is not None
    assert back.topics == {"a"}
    every = Selection(all_topics=True)
    assert every.traces("anything")
    assert not every.empty
    assert every.describe() == "All message debug topics are currently enabled\n"
    assert every.add("x") is None  # "all" already covers it
    assert every.remove("x") is None  # Dory has no "all but these"


# --- MsgDebug: switching, limits, truncation ---------------------------------------------


@dataclass
class ListSink:
    lines: list[bytes] = field(default_factory=list)
    truncations: int = 0
    reopened: int = 0
    closed: bool = False

    def write_line(self, line: bytes) -> None:
        self.lines.append(line)

    def truncate(self) -> None:
        self.truncations += 1
        self.lines.clear()

    def reopen(self) -> None:
        self.reopened += 1

    def close(self) -> None:
        self.closed = True


@dataclass
class Timers:
    pending: list[tuple[float, Callable[[], None]]] = field(default_factory=list)
    cancelled: int = 0

    def schedule(self, delay_s: float, callback: Callable[[], None]) -> Any:
        self.pending.append((delay_s, callback))
        timers = self

        class Handle:
            def cancel(self) -> None:
                timers.cancelled += 1
                timers.pending.remove((delay_s, callback))

        return Handle()


@dataclass
class Traced:
    msg_debug: MsgDebug
    sinks: list[ListSink]
    timers: Timers


def traced(time_limit_s: int = 60, byte_limit: int = 10_000) -> Traced:
    sinks = [ListSink() for _ in FILE_NAMES]
    timers = Timers()
    msg_debug = MsgDebug(
        MsgDebugConfig("/nowhere", time_limit_s, byte_limit, extra_fields=True),
        Counters(),
        writers=sinks,
        schedule=timers.schedule,
        wall_clock=lambda: NOW_S,
    )
    return Traced(msg_debug, sinks, timers)


def test_disabled_traces_nothing_and_starts_no_thread() -> None:
    msg_debug = MsgDebug.disabled()
    assert not msg_debug.enabled
    assert msg_debug.add_topic("t")  # the selection may change, but nothing is traced
    assert not msg_debug.active


def test_adding_a_first_topic_starts_fresh_files_and_the_time_limit() -> None:
    t = traced(time_limit_s=60)
    assert not t.msg_debug.active
    assert t.msg_debug.add_topic("a")
    assert t.msg_debug.active
    assert [s.truncations for s in t.sinks] == [1, 1, 1]  # Dory starts with empty files
    assert [delay for delay, _ in t.timers.pending] == [60.0]
    assert t.msg_debug.add_topic("b")  # already on: no new start
    assert [s.truncations for s in t.sinks] == [1, 1, 1]
    assert len(t.timers.pending) == 1


def test_a_start_tells_its_listeners_once_per_start() -> None:
    """The dispatcher listens: every acknowledgement one by one from a start on (a
    producer's report thread would otherwise sum those before the next poll asks)."""
    t = traced()
    started: list[bool] = []
    t.msg_debug.on_start(lambda: started.append(t.msg_debug.active))
    assert t.msg_debug.add_topic("a")
    assert t.msg_debug.add_topic("b")  # already on: no new start
    assert started == [True]
    t.msg_debug.del_all_topics()
    t.msg_debug.add_all_topics()
    assert started == [True, True]


def test_each_stage_goes_to_its_file() -> None:
    t = traced()
    t.msg_debug.add_topic("a")
    t.msg_debug.received("a", b"k", b"v", 11)
    t.msg_debug.sent("a", 2, b"k", b"v", 11)
    t.msg_debug.acknowledged("a", 2, b"k", b"v", 11)
    received, sent, acked = (s.lines for s in t.sinks)
    now_ms = int(NOW_S * 1000)
    assert received == [format_line(11, "a", b"k", b"v", now_ms=now_ms)]
    assert sent == acked == [format_line(11, "a", b"k", b"v", partition=2, now_ms=now_ms)]
    assert t.msg_debug.bytes_written == sum(len(line) for s in t.sinks for line in s.lines)


def test_the_time_limit_clears_the_selection() -> None:
    t = traced(time_limit_s=5)
    t.msg_debug.add_topic("a")
    [(_, time_is_up)] = t.timers.pending
    time_is_up()
    assert not t.msg_debug.active
    assert t.msg_debug.selection.empty
    assert t.msg_debug.stopped_reason == "timeLimit reached (5 s)"
    t.msg_debug.received("a", b"", b"late", 1)
    assert t.sinks[Stage.RECEIVED].lines == []
    # Turned on again: a new start, the reason forgotten.
    assert t.msg_debug.add_topic("a")
    assert t.msg_debug.active
    assert t.msg_debug.stopped_reason is None


def test_the_byte_limit_stops_before_a_line_that_would_pass_it() -> None:
    size = len(format_line(1, "a", b"", b"x" * 30, now_ms=int(NOW_S * 1000)))
    t = traced(byte_limit=3 * size + size // 2)
    t.msg_debug.add_all_topics()
    for _ in range(5):
        t.msg_debug.received("a", b"", b"x" * 30, 1)
    assert len(t.sinks[Stage.RECEIVED].lines) == 3
    assert not t.msg_debug.active
    assert t.msg_debug.stopped_reason == f"byteLimit reached ({3 * size + size // 2} bytes)"
    assert t.timers.cancelled == 1  # the time limit's timer goes with it


def test_truncate_empties_the_files_and_keeps_tracing() -> None:
    t = traced()
    t.msg_debug.add_topic("a")
    t.msg_debug.received("a", b"", b"v", 1)
    t.msg_debug.truncate_files()
    assert [s.truncations for s in t.sinks] == [2, 2, 2]
    assert t.msg_debug.bytes_written == 0
    assert t.msg_debug.active
    t.msg_debug.received("a", b"", b"w", 1)
    assert len(t.sinks[Stage.RECEIVED].lines) == 1


def test_removing_the_last_topic_stops_and_cancels_the_timer() -> None:
    t = traced()
    t.msg_debug.add_topic("a")
    assert not t.msg_debug.del_topic("b")
    assert t.msg_debug.del_topic("a")
    assert not t.msg_debug.active
    assert t.timers.pending == []
    assert t.timers.cancelled == 1
    assert t.msg_debug.seconds_left() is None
    t.msg_debug.add_all_topics()
    t.msg_debug.del_all_topics()
    assert not t.msg_debug.active


def test_reopen_only_once_the_files_were_used_and_close_closes_them() -> None:
    t = traced()
    t.msg_debug.reopen()
    assert [s.reopened for s in t.sinks] == [0, 0, 0]
    t.msg_debug.add_topic("a")
    t.msg_debug.reopen()
    assert [s.reopened for s in t.sinks] == [1, 1, 1]
    t.msg_debug.close()
    assert all(s.closed for s in t.sinks)
    assert not t.msg_debug.active


# --- the real files ----------------------------------------------------------------------


@pytest.fixture
def on_disk(tmp_path: Path) -> Iterator[tuple[MsgDebug, Counters, Path]]:
    counters = Counters()
    directory = tmp_path / "debug"  # created on first use
    msg_debug = MsgDebug(MsgDebugConfig(str(directory), 60, 10_000), counters)
    yield msg_debug, counters, directory
    msg_debug.close()


def flush(msg_debug: MsgDebug) -> None:
    for writer in msg_debug._writers:
        assert writer.flush(10)  # type: ignore[attr-defined]


def test_the_files_are_dorys_three_and_truncate_and_reopen_work(
    on_disk: tuple[MsgDebug, Counters, Path],
) -> None:
    msg_debug, counters, directory = on_disk
    msg_debug.add_topic("a")
    msg_debug.received("a", b"k", b"one", 5)
    msg_debug.sent("a", 0, b"k", b"one", 5)
    flush(msg_debug)
    assert sorted(p.name for p in directory.iterdir()) == sorted(FILE_NAMES)
    assert len((directory / "msg_receive").read_bytes().splitlines()) == 1
    assert (directory / "msg_got_ack").read_bytes() == b""
    assert counters.get(MSG_DEBUG_WRITTEN) == 2
    msg_debug.truncate_files()
    msg_debug.received("a", b"k", b"two", 6)
    flush(msg_debug)
    [line] = (directory / "msg_receive").read_bytes().splitlines(keepends=True)
    assert LINE.fullmatch(line) is not None
    assert b"[dHdv]" in line
    assert (directory / "msg_send").read_bytes() == b""
    # SIGUSR1 after logrotate moved the file away: a new file takes the next lines.
    (directory / "msg_receive").rename(directory / "msg_receive.1")
    msg_debug.reopen()
    msg_debug.received("a", b"k", b"three", 7)
    flush(msg_debug)
    assert b"[dGhyZWU=]" in (directory / "msg_receive").read_bytes()
    assert b"three" not in (directory / "msg_receive.1").read_bytes()


def test_a_disk_error_is_counted_and_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_bytes(b"")
    counters = Counters()
    msg_debug = MsgDebug(MsgDebugConfig(str(blocker / "debug"), 60, 10_000), counters)
    try:
        msg_debug.add_topic("a")
        for i in range(5):
            msg_debug.received("a", b"", b"v", i)
        flush(msg_debug)
    finally:
        msg_debug.close()
    errors = [r for r in caplog.records if "message debug" in r.getMessage()]
    assert len(errors) == 3  # once per file (each has its own writer)
    assert counters.get("msg_debug_lost") == 5


# --- the intake traces the selected topics only ------------------------------------------


def intake(msg_debug: MsgDebug) -> tuple[Intake, Books, RecordingDispatcher]:
    books = Books(600, 64, wall_clock=lambda: 1_700_000_000.0)

    def no_limit(topic: str) -> RateLimit:
        @dataclass(frozen=True)
        class Limit:
            interval_ms: int = 1000
            max_count: int | None = None

        return Limit()

    dispatcher = RecordingDispatcher()
    topics = {name: {0: 1, 1: 1} for name in ("traced", "plain")}
    return (
        Intake(
            books=books,
            pool=MemoryPool(1_000_000, clock=lambda: 0.0),
            limiter=TopicRateLimiter(no_limit, clock=lambda: 0.0),
            router=Router(MetadataSnapshot.build({1: "b1"}, topics)),
            dispatcher=cast(Dispatcher, dispatcher),
            commit_point=CommitPoint(schedule=lambda delay, callback: False),
            message_max_bytes=10_000,
            prefix_size=64,
            msg_debug=msg_debug,
        ),
        books,
        dispatcher,
    )


def test_the_intake_traces_a_selected_topic_and_leaves_the_others_alone() -> None:
    t = traced()
    assert t.msg_debug.add_topic("traced")
    the_intake, books, dispatcher = intake(t.msg_debug)
    burst = [
        encode_any_partition("plain", b"p1", b"", 100),
        encode_any_partition("traced", b"t1", b"k1", 101),
        encode_partition_key("traced", b"t2", 7, b"", 102),
        encode_any_partition("plain", b"p2", b"", 103),
    ]
    the_intake.messages(burst, Transport.UNIX_DGRAM)
    assert len(dispatcher.sent) == 4
    assert books.per_topic()["traced"].accepted == 2
    assert books.per_topic()["plain"].accepted == 2
    received = [LINE.fullmatch(line) for line in t.sinks[Stage.RECEIVED].lines]
    sent = [LINE.fullmatch(line) for line in t.sinks[Stage.SENT].lines]
    assert all(m is not None for m in [*received, *sent])
    assert [base64.b64decode(m.group(7)) for m in received if m] == [b"t1", b"t2"]
    assert [int(m.group(1)) for m in sent if m] == [101, 102]
    partitions = {value: p for topic, p, value, *_ in dispatcher.sent}
    assert [int(m.group(9)) for m in sent if m] == [partitions[b"t1"], partitions[b"t2"]]
    assert all(b"plain" not in line for s in t.sinks for line in s.lines)


def test_untraced_the_burst_path_is_taken_and_nothing_is_written() -> None:
    t = traced()
    the_intake, _books, dispatcher = intake(t.msg_debug)
    the_intake.messages(
        [encode_any_partition("traced", b"x%d" % i) for i in range(10)], Transport.UNIX_DGRAM
    )
    assert len(dispatcher.sent) == 10
    assert all(s.lines == [] for s in t.sinks)
