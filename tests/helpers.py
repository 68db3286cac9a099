"""Shared by the tests: waiting for and checking a running daemon's books, a
dispatcher that records what the intake sends, and a stream intake and a datagram intake
for input tests."""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from confluent_kafka import KafkaError

from pydory.daemon.books.events import AFTER_ACCEPTANCE, DiscardReason, Transport
from pydory.daemon.delivery.outcomes import EnqueueRefused
from pydory.errors import ClientProtocolError
from pydory_tools.testing.daemon import RunningDaemon

#: The shutdown totals line pydory logs at NOTICE for every topic (server._log_totals).
TOTALS_LINE = re.compile(
    r"topic (?P<topic>\S+): accepted (?P<accepted>\d+), delivered (?P<delivered>\d+), "
    r"possibly delivered (?P<possibly>\d+), left for next start (?P<left>\d+), "
    r"discarded (?P<discarded>\{.*\}), in flight (?P<in_flight>\d+)"
)
#: The (reason, count) pairs in the logged discard dict.
DISCARD_COUNTS = re.compile(r"'(\w+)':\s*(\d+)")
#: The time logsetup's format puts at the start of a daemon's log line.
LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


def logged_at(line: str) -> float:
    """The daemon's own time of a log line (seconds since the epoch)."""
    found = LOG_TIME.match(line)
    assert found is not None, f"no time at the start of {line!r}"
    return datetime.strptime(found[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()


def shutdown_span_s(lines: Sequence[str]) -> float:
    """From the daemon's "shutting down" line to its last totals line, by its own clock."""
    began = next(logged_at(line) for line in lines if "pydory shutting down" in line)
    ended = max(logged_at(line) for line in lines if TOTALS_LINE.search(line))
    return ended - began


class SchedulingDelay(threading.Thread):
    """How late a 10 ms sleep wakes while it runs: the machine's load, measured, so a
    bound on elapsed time can grow with it instead of failing on a busy runner."""

    TICK_S = 0.01

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.worst_s = 0.0
        self._stop_event = threading.Event()

    def run(self) -> None:
        while True:
            before = time.monotonic()
            if self._stop_event.wait(self.TICK_S):  # not a deadline: the probe's tick
                return
            self.worst_s = max(self.worst_s, time.monotonic() - before - self.TICK_S)

    def __enter__(self) -> SchedulingDelay:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop_event.set()
        self.join()

    def margin_s(self, quiet_s: float = 1.0) -> float:
        """``quiet_s`` on a quiet machine, plus 20 times the worst lateness seen: a step of
        the stop waits on the scheduler at most a few dozen times."""
        return quiet_s + 20 * self.worst_s


def wait_until(condition: Callable[[], bool], timeout_s: float = 60.0, what: str = "") -> None:
    """Wait for an outcome the daemon reaches asynchronously (delivery reports)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or condition}")
        time.sleep(0.02)


def settled(daemon: RunningDaemon, topic: str, expected: int) -> Callable[[], bool]:
    """True once ``expected`` messages of ``topic`` are accepted and none is in flight."""

    def check() -> bool:
        t = daemon.snapshot()["topics"].get(topic)
        return t is not None and t["accepted"] >= expected and t["in_flight"] == 0

    return check


def discarded_after_acceptance(topic_books: dict[str, Any]) -> int:
    """A topic's discards that count against its accepted messages."""
    return sum(n for reason, n in topic_books["discarded"].items() if reason in AFTER_ACCEPTANCE)


def assert_balanced(snapshot: dict[str, Any]) -> None:
    """Per topic: accepted == delivered + possibly delivered + left for the next start +
    post-acceptance discards + in flight."""
    topics = snapshot["topics"]
    assert isinstance(topics, dict)
    for name, t in topics.items():
        settled = t["delivered"] + t["possibly_delivered"] + t["left_for_next_start"]
        assert t["accepted"] == settled + discarded_after_acceptance(t) + t["in_flight"], name


@dataclass
class RecordingDispatcher:
    """Records what the intake sends; refuses every message of ``refused_topic``."""

    refused_topic: str = "refused"
    sent: list[tuple[Any, ...]] = field(default_factory=list)

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
        headers: object = None,  # the message's identity: not recorded
    ) -> None:
        if topic == self.refused_topic:
            raise EnqueueRefused(DiscardReason.KAFKA_ERROR, "TOPIC_AUTHORIZATION_FAILED")
        self.sent.append((topic, partition, value, key, timestamp_ms, partition_key, attempt))

    def burst_sender(self, topic: str) -> Callable[..., list[tuple[int, int]]]:
        """The compiled producer's ``produce_burst``, recorded as ``send`` records."""

        def produce_burst(
            parsed: list[Any], headers: Any, topic: str, max_data: int, runs: Any, token: int
        ) -> list[tuple[int, int]]:
            partitions = iter([p for p, n in runs for _ in range(n)])
            refused = []
            for index, fields in enumerate(parsed):
                if fields is None or fields[0] != topic or len(fields[1] + fields[2]) > max_data:
                    continue
                _, key, value, timestamp_ms = fields
                partition = next(partitions)
                if topic == self.refused_topic:
                    refused.append((index, KafkaError.TOPIC_AUTHORIZATION_FAILED))
                    continue
                self.sent.append(
                    (topic, partition, value, key or None, max(timestamp_ms, 0), None, 1)
                )
            assert next(partitions, None) is None, "as many partitions as messages"
            return refused

        return produce_burst

    def note_sent(self, token: int) -> None:
        pass


@dataclass
class StreamIntake:
    """The inputs' Intake for stream input tests: counts connections; any datagram,
    broken stream or unclean disconnect fails the test. Subclasses say what ``frames``
    records."""

    opened: int = 0
    closed: int = 0

    def frames(self, burst: Sequence[bytes], transport: Transport, client: object = None) -> None:
        raise NotImplementedError

    def datagrams(self, burst: Sequence[bytes], client: object = None) -> None:
        raise AssertionError("no datagram input here")

    def datagram_too_large(self, size: int, prefix: bytes) -> None:
        raise AssertionError("no datagram input here")

    def broken_stream(self, error: ClientProtocolError, transport: Transport) -> None:
        raise AssertionError(f"a broken stream: {error}")

    def unclean_disconnect(self, prefix: bytes, transport: Transport) -> None:
        raise AssertionError("an unclean disconnect")

    def connection_opened(self, transport: Transport) -> None:
        self.opened += 1

    def connection_closed(self, transport: Transport, error: BaseException | None = None) -> None:
        self.closed += 1


#: Where :class:`DatagramIntake` records a datagram too large among the bursts: as its
#: prefix, charged to this client.
TOO_LARGE = "too large"


class DatagramIntake:
    """The inputs' Intake for datagram input tests: what it is handed, in order (each
    burst with the client it is charged to, a datagram too large as its prefix under
    :data:`TOO_LARGE`), and apart: the sizes handed on whole, the datagrams too large
    (size, prefix), those over quota. ``keep_bytes=False`` keeps the sizes only, so the
    datagrams are free to go (a memory test). Any stream call fails the test."""

    def __init__(self, keep_bytes: bool = True) -> None:
        self.keep_bytes = keep_bytes
        self.bursts: list[tuple[list[bytes], object]] = []
        self.sizes: list[int] = []
        self.too_large: list[tuple[int, bytes]] = []
        self.over: list[bytes] = []
        self.changed = asyncio.Event()

    @property
    def received(self) -> list[bytes]:
        """The datagrams handed on whole, in order."""
        return [data for burst, client in self.bursts if client != TOO_LARGE for data in burst]

    def handed(self) -> int:
        """How many datagrams were handed on: whole, too large or over quota."""
        return len(self.sizes) + len(self.too_large) + len(self.over)

    async def until(self, count: int) -> None:
        """Wait until ``count`` datagrams were handed on."""
        async with asyncio.timeout(60):  # a safety net only
            while self.handed() < count:
                self.changed.clear()
                await self.changed.wait()

    def datagrams(self, burst: Sequence[bytes], client: object = None) -> None:
        self.sizes += [len(data) for data in burst]
        if self.keep_bytes:
            self.bursts.append((list(burst), client))
        self.changed.set()

    def datagram_too_large(self, size: int, prefix: bytes) -> None:
        self.too_large.append((size, prefix))
        if self.keep_bytes:
            self.bursts.append(([prefix], TOO_LARGE))
        self.changed.set()

    def over_quota(self, burst: Sequence[bytes]) -> None:
        self.over += burst
        self.changed.set()

    def frames(self, burst: Sequence[bytes], transport: Transport, client: object = None) -> None:
        raise AssertionError("no stream here")

    def broken_stream(self, error: ClientProtocolError, transport: Transport) -> None:
        raise AssertionError("no stream here")

    def unclean_disconnect(self, prefix: bytes, transport: Transport) -> None:
        raise AssertionError("no stream here")

    def connection_opened(self, transport: Transport) -> None:
        raise AssertionError("no stream here")

    def connection_closed(self, transport: Transport, error: BaseException | None = None) -> None:
        raise AssertionError("no stream here")


def reports_until_empty(producer: Any, each_ack: bool = False) -> tuple[list[Any], Counter[int]]:
    """Poll a compiled producer (``pydory._cproducer.Producer``) until it holds nothing:
    the exception types its polls stopped on, and how many acknowledgements each token
    got (one by one or summed)."""
    stopped: list[Any] = []
    tokens: Counter[int] = Counter()

    def more() -> bool:
        polled = producer.poll(0.05, each_ack)
        if polled is not None:
            stopped.extend([polled.stopped_by] if polled.stopped_by else [])
            for ack in polled.acks or []:
                tokens[ack.token] += 1
            for entry in polled.ack_sums:
                tokens[entry.token] += entry.messages
        return len(producer) == 0

    wait_until(more, what="every report")
    return stopped, tokens
