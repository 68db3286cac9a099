"""Dory's message debug files (``<msgDebug>``): trace chosen topics' messages to disk.

An operator asks "did my message reach Kafka?" by turning tracing on for a topic through
the status port (``/msg_debug/add_topic/NAME`` and friends, :mod:`pydory.status.msg_debug`)
and reading three files in ``<msgDebug><path>``, one line per message and stage:

- ``msg_receive``: received from a client (a well-formed message, before admission);
- ``msg_send``: handed to librdkafka (``produce()`` took it; again on each reroute);
- ``msg_got_ack``: acknowledged by Kafka.

A line, exactly Dory's (``debug_logger.cc``), so that a parser written for Dory's files
reads pydory's::

    ts: 1795246679208 topic: 5[clock] key: 0[] value: 8[aGVsbG8=]

``ts`` is the client's timestamp (ms since the epoch) on all three files, ``msg_got_ack``
included (not the broker's: a LogAppendTime topic's acknowledgement carries the broker's
append time); ``topic``, ``key`` and ``value`` are a length then the field in brackets, key
and value base64. With ``<msgDebug extraFields="true">`` (pydory's attribute; Dory ignores
it) each line also ends with `` partition: 3`` (where known: on ``msg_send`` and
``msg_got_ack`` lines) and `` now: 1795246679301``, when the stage happened.

Tracing starts when the selection goes from no topic to some (the three files are emptied
then, as Dory does), and stops by itself after ``<timeLimit>`` seconds or once the three
files together would pass ``<byteLimit>`` bytes: the selection is then cleared (the reason
is logged and shown on the dashboard). ``truncate_files`` empties the files and leaves the
selection as it is (as Dory's code does). SIGUSR1 reopens the files.

The files are written by :class:`~pydory.daemon.books.files.QueuedWriter` threads (one per
file), so the loop never waits for the disk: a disk error is logged once and counted
(``msg_debug_lost``), an overflowing queue counted (``msg_debug_dropped``).

Cost: while no topic is selected, :attr:`MsgDebug.active` is False and the hot path checks
only that, once per burst (intake) or per batch of acknowledgements (dispatch). A selected
topic's messages leave intake's short path for the reference path, which traces them; the
other topics keep the short path.

Rule: which topics are traced, and when tracing stops by itself (time and byte limits), is
decided here alone; the data path asks ``MsgDebug.active`` and ``MsgDebug.traces`` only.
"""

from __future__ import annotations

import asyncio
import binascii
import enum
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from pydory.config.model import MsgDebugConfig
from pydory.daemon.books import counters as counter_names
from pydory.daemon.books.counters import Counters
from pydory.daemon.books.files import QueuedWriter, RotatingFile
from pydory.wire import topic_name_problem

__all__ = [
    "FILE_NAMES",
    "LineWriter",
    "MsgDebug",
    "Selection",
    "Stage",
    "format_line",
]

log = logging.getLogger(__name__)

#: A message's key or value as the data path has it (None: librdkafka's empty field).
Data = bytes | None


#: The files never rotate: the byte limit stops tracing first.
_NEVER_ROTATE = 1 << 62


class Stage(enum.IntEnum):
    """A message's stage, and the index of its file in :data:`FILE_NAMES`."""

    RECEIVED = 0
    SENT = 1
    ACKNOWLEDGED = 2


#: Dory's file names (``debug_setup.h``), by :class:`Stage`.
FILE_NAMES = ("msg_receive", "msg_send", "msg_got_ack")


def format_line(
    timestamp_ms: int,
    topic: str,
    key: bytes | memoryview | None,
    value: bytes | memoryview | None,
    *,
    partition: int | None = None,
    now_ms: int | None = None,
) -> bytes:
    """One trace line (newline-terminated), Dory's; with ``now_ms`` (the extra fields on),
    pydory's ``partition`` (None = not known yet) and ``now`` follow."""
    key64 = binascii.b2a_base64(key, newline=False) if key else b""
    value64 = binascii.b2a_base64(value, newline=False) if value else b""
    if not (topic.isascii() and topic.isprintable()):
        topic = topic.encode("unicode_escape").decode("ascii")
    extra = b""
    if now_ms is not None:
        where = b"" if partition is None else b" partition: %d" % partition
        extra = b"%s now: %d" % (where, now_ms)
    return b"ts: %d topic: %d[%s] key: %d[%s] value: %d[%s]%s\n" % (
        timestamp_ms,
        len(topic),
        topic.encode("ascii"),
        len(key64),
        key64,
        len(value64),
        value64,
        extra,
    )


@dataclass(frozen=True, slots=True)
class Selection:
    """Which topics are traced: some by name, or all of them. Pure; Dory's rules."""

    all_topics: bool = False
    topics: frozenset[str] = frozenset()

    @property
    def empty(self) -> bool:
        """Nothing is traced."""
        return not self.all_topics and not self.topics

    def traces(self, topic: str) -> bool:
        return self.all_topics or topic in self.topics

    def add(self, topic: str) -> Selection | None:
        """The selection with ``topic`` added; None (refused) when "all topics" is on, the
        topic is already there, or Kafka would refuse the name (empty, over 249 bytes, a
        character outside [a-zA-Z0-9._-], "." or ".."): no such topic can ever be traced,
        and a refused name is never kept, so a client cannot grow the selection with junk."""
        if self.all_topics or topic in self.topics or topic_name_problem(topic) is not None:
            return None
        return Selection(False, self.topics | {topic})

    def remove(self, topic: str) -> Selection | None:
        """The selection without ``topic``; None (refused) when "all topics" is on (Dory
        has no "all but these") or the topic is not selected."""
        if self.all_topics or topic not in self.topics:
            return None
        return Selection(False, self.topics - {topic})

    def describe(self) -> str:
        """Dory's ``/msg_debug/get_topics`` answer (topics sorted)."""
        if self.all_topics:
            return "All message debug topics are currently enabled\n"
        if not self.topics:
            return "No message debug topics are currently enabled\n"
        return "".join(f"topic: [{topic}]\n" for topic in sorted(self.topics))


class LineSink(Protocol):
    """Where one file's lines go (a :class:`LineWriter`, or a test's list)."""

    def write_line(self, line: bytes) -> None: ...
    def truncate(self) -> None: ...
    def reopen(self) -> None: ...
    def close(self) -> None: ...


class LineWriter(QueuedWriter[bytes]):
    """One debug file: formatted lines, written by a thread of its own."""

    def write_line(self, line: bytes) -> None:
        self._enqueue(line, len(line))

    def _format(self, now_ms: int, item: bytes) -> bytes:
        return item

    def _size(self, item: bytes) -> int:
        return len(item)


class _Cancellable(Protocol):
    def cancel(self) -> None: ...


Schedule = Callable[[float, Callable[[], None]], _Cancellable | None]


def _call_later(delay_s: float, callback: Callable[[], None]) -> asyncio.TimerHandle | None:
    """On the running loop (tracing is switched on from a status request, on the loop)."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return None
    return loop.call_later(delay_s, callback)


def _open_writers(directory: str, counters: Counters) -> list[LineSink]:
    writers: list[LineSink] = []
    for name in FILE_NAMES:
        file = RotatingFile(
            os.path.join(os.path.abspath(directory), name),
            _NEVER_ROTATE,
            _NEVER_ROTATE,
            counters,
            label="message debug file",
            written_counter=counter_names.MSG_DEBUG_WRITTEN,
            lost_counter=counter_names.MSG_DEBUG_LOST,
        )
        writers.append(
            LineWriter(
                file,
                counters,
                dropped_counter=counter_names.MSG_DEBUG_DROPPED,
                file_counters=(counter_names.MSG_DEBUG_LOST, counter_names.MSG_DEBUG_WRITTEN),
                label="message debug file",
                thread_name=f"pydory-{name}",
            )
        )
    return writers


class MsgDebug:
    """The selection, its limits and the three files. Event loop thread only.

    Data path: check :attr:`active` (one attribute) before anything else; then
    :meth:`traces` per topic, and :meth:`received` / :meth:`sent` / :meth:`acknowledged`
    for the messages of traced topics. Control (the status interface): :attr:`selection`,
    :meth:`add_topic`, :meth:`del_topic`, :meth:`add_all_topics`, :meth:`del_all_topics`,
    :meth:`truncate_files`.
    """

    def __init__(
        self,
        config: MsgDebugConfig,
        counters: Counters,
        *,
        writers: Sequence[LineSink] | None = None,
        schedule: Schedule = _call_later,
        wall_clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """``config.path`` None: disabled (nothing can be traced, no thread started).
        ``writers``: the three files' sinks, by :class:`Stage` (default: the files)."""
        self.enabled = config.path is not None
        self.directory = config.path or ""
        self.time_limit_s = config.time_limit_s
        self.byte_limit = config.byte_limit
        self.extra_fields = config.extra_fields  # pydory's partition and now on each line
        self._writers: Sequence[LineSink] = ()
        if config.path is not None:
            self._writers = writers if writers is not None else _open_writers(config.path, counters)
        self._schedule = schedule
        self._wall_clock = wall_clock
        self._monotonic = monotonic
        self.selection = Selection()
        #: True while some topic is traced: the data path's one check.
        self.active = False
        self.bytes_written = 0  # since tracing started or the files were emptied
        self.started_at: float | None = None  # monotonic
        #: Why tracing last stopped by itself (a limit), None if it did not.
        self.stopped_reason: str | None = None
        self._timer: _Cancellable | None = None
        self._files_used = False
        self._on_start: list[Callable[[], None]] = []

    def on_start(self, callback: Callable[[], None]) -> None:
        """``callback()`` whenever tracing starts (the dispatcher: every acknowledgement
        one by one from then on, before its next poll asks)."""
        self._on_start.append(callback)

    @classmethod
    def disabled(cls) -> MsgDebug:
        """No ``<msgDebug>``: :attr:`active` stays False."""
        return cls(MsgDebugConfig(), Counters())

    # -- the data path (only for traced topics, after checking ``active``) ------------------

    def traces(self, topic: str) -> bool:
        return self.selection.traces(topic)

    def received(self, topic: str, key: Data, value: Data, timestamp_ms: int) -> None:
        self._trace(Stage.RECEIVED, topic, key, value, None, timestamp_ms)

    def sent(self, topic: str, partition: int, key: Data, value: Data, timestamp_ms: int) -> None:
        self._trace(Stage.SENT, topic, key, value, partition, timestamp_ms)

    def acknowledged(
        self, topic: str, partition: int, key: Data, value: Data, timestamp_ms: int
    ) -> None:
        self._trace(Stage.ACKNOWLEDGED, topic, key, value, partition, timestamp_ms)

    def _trace(
        self,
        stage: Stage,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        partition: int | None,
        timestamp_ms: int,
    ) -> None:
        if not self.active:
            return
        now_ms = int(self._wall_clock() * 1000) if self.extra_fields else None
        line = format_line(timestamp_ms, topic, key, value, partition=partition, now_ms=now_ms)
        if self.bytes_written + len(line) > self.byte_limit:
            self._stop_by_itself(f"byteLimit reached ({self.byte_limit} bytes)")
            return
        self.bytes_written += len(line)
        self._writers[stage].write_line(line)

    # -- control (the status interface) ----------------------------------------------------

    def add_topic(self, topic: str) -> bool:
        """``/msg_debug/add_topic/NAME``: False (Dory's "Failed to enable") when refused."""
        return self._select_if(self.selection.add(topic))

    def del_topic(self, topic: str) -> bool:
        """``/msg_debug/del_topic/NAME``: False (Dory's "Failed to disable") when refused."""
        return self._select_if(self.selection.remove(topic))

    def _select_if(self, new: Selection | None) -> bool:
        """Trace ``new`` unless the selection refused the change (None)."""
        if new is None:
            return False
        self._select(new)
        return True

    def add_all_topics(self) -> None:
        self._select(Selection(all_topics=True))

    def del_all_topics(self) -> None:
        self._select(Selection())

    def truncate_files(self) -> None:
        """Empty the three files (after what is queued); tracing goes on if it was on."""
        if not self._writers:
            return
        for writer in self._writers:
            writer.truncate()
        self._files_used = True
        self.bytes_written = 0

    def seconds_left(self) -> float | None:
        """Until the time limit stops tracing; None when not tracing."""
        if self.started_at is None:
            return None
        return max(0.0, self.started_at + self.time_limit_s - self._monotonic())

    def _select(self, new: Selection) -> None:
        if not self.enabled:
            return
        was_active = self.active
        self.selection = new
        self.active = not new.empty
        if self.active and not was_active:
            self._start()
        elif was_active and not self.active:
            self._cancel_timer()
            self.started_at = None
        log.info("message debug: %s", new.describe().strip().replace("\n", ", "))

    def _start(self) -> None:
        """From nothing traced to something: fresh files, fresh limits (Dory)."""
        for writer in self._writers:
            writer.truncate()
        self._files_used = True
        self.bytes_written = 0
        self.stopped_reason = None
        self.started_at = self._monotonic()
        self._cancel_timer()
        self._timer = self._schedule(float(self.time_limit_s), self._time_is_up)
        for callback in self._on_start:
            callback()

    def _time_is_up(self) -> None:
        self._timer = None
        if self.active:
            self._stop_by_itself(f"timeLimit reached ({self.time_limit_s} s)")

    def _stop_by_itself(self, reason: str) -> None:
        log.warning("message debug stopped: %s; the files in %s are kept", reason, self.directory)
        self.stopped_reason = reason
        self._select(Selection())

    def _cancel_timer(self) -> None:
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()

    # -- lifecycle ---------------------------------------------------------------------------

    def reopen(self) -> None:
        """SIGUSR1: reopen the files (if tracing ever wrote them)."""
        if self._files_used:
            for writer in self._writers:
                writer.reopen()

    def close(self) -> None:
        """Shutdown: write what is queued, close the files, end the threads."""
        self._cancel_timer()
        self.active = False
        for writer in self._writers:
            writer.close()
