"""Quotas on the stream listeners (``<quotas>``): the pure logic of pydory.daemon.inputs.quotas
(rate windows, throttle times, connection limits, clients shared by uid), then the
stream input on uvloop with real sockets and an intake that records what it is handed:
the connection quota, a throttled client slowed without losing a byte, the throttle's
interplay with the input's own pause (backpressure, shutdown), the shutdown drain of a
throttled connection, and quotas replaced at run time.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import socket
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
import uvloop
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import SchedulingDelay
from pydory.config.model import ClientRate, ListenerQuotas, QuotasConfig
from pydory.daemon.books.counters import Counters
from pydory.daemon.books.events import Transport
from pydory.daemon.inputs.quotas import ClientQuota, ListenerQuota, RateWindow
from pydory.daemon.inputs.stream import StreamInput
from pydory.daemon.inputs.stream_connection import StreamInputProtocol
from pydory.errors import ClientProtocolError
from pydory.wire import encode_any_partition

# --- RateWindow: the rate over a window and the throttle ----------------------------------


def test_a_client_within_its_window_is_not_throttled() -> None:
    window = RateWindow(1000, 1.0)  # 1000 units/s over 1 s: 1000 units of credit
    assert window.record(10.0, 400) == 0.0
    assert window.record(10.0, 600) == 0.0  # exactly a window's worth
    assert window.rate(10.0) == pytest.approx(1000)
    assert window.record(10.0, 100) == pytest.approx(0.1)  # 100 over: 0.1 s at 1000/s


def test_the_throttle_is_kip13s_total_over_quota_minus_elapsed() -> None:
    """A client over its quota since t=10 sent ``total`` over a window starting one window
    before: throttle = total / quota - elapsed, and the rate is at the quota after it."""
    window = RateWindow(1000, 1.0)
    total = 0
    now = 10.0
    for amount in (1500, 700, 2500, 10):
        total += amount
        wait = window.record(now, amount)
        elapsed = now - (10.0 - 1.0)
        assert wait == pytest.approx(max(0.0, total / 1000 - elapsed))
        assert window.rate(now + wait) == pytest.approx(1000)
        now += wait  # the client obeys: its next read comes when the throttle is over


def test_a_long_throttle_does_not_forget_what_caused_it() -> None:
    """Kafka's sampled window forgets a read once it is older than the window, so after a
    throttle longer than the window the next read gets a window of credit again; here a
    client sending 10 windows' worth per read waits for all of it, every time."""
    window = RateWindow(100, 0.5)  # 50 units of credit
    now = 0.0
    waits = []
    for _ in range(5):
        waits.append(window.record(now, 1000))
        now += waits[-1]
    assert waits[0] == pytest.approx(10 - 0.5)  # the credit once
    assert waits[1:] == pytest.approx([10.0] * 4)  # then exactly 1000 / 100 per read
    assert 5000 / now == pytest.approx(100, rel=0.06)


def test_idle_time_is_credit_up_to_one_window_only() -> None:
    window = RateWindow(100, 1.0)
    assert window.record(0.0, 100) == 0.0
    # A day idle buys one window's worth, not a day's.
    assert window.record(86_400.0, 150) == pytest.approx(0.5)
    assert window.rate(86_400.0) == pytest.approx(150)
    assert window.rate(86_402.0) == 0.0


def test_a_rate_window_needs_a_positive_quota_and_length() -> None:
    with pytest.raises(ValueError, match="positive quota and length"):
        RateWindow(0, 1.0)
    with pytest.raises(ValueError, match="positive quota and length"):
        RateWindow(10, 0.0)


reads = st.lists(
    st.tuples(
        st.integers(min_value=0, max_value=300_000),  # bytes in one read (uvloop: <= 256 KiB)
        st.floats(min_value=0, max_value=3, allow_nan=False),  # extra idle time after it
    ),
    min_size=1,
    max_size=60,
)


@given(
    quota=st.integers(min_value=1, max_value=10_000_000),
    window_ms=st.integers(min_value=100, max_value=60_000),
    start=st.floats(min_value=0, max_value=1e6, allow_nan=False),
    reads=reads,
)
@settings(max_examples=300, deadline=None)
def test_a_client_obeying_its_throttles_never_beats_its_quota(
    quota: int, window_ms: int, start: float, reads: list[tuple[int, float]]
) -> None:
    """Over any stretch of reads, a client that waits every throttle out sent at most
    quota * (stretch + window) plus one read, whatever its read sizes and pauses."""
    window = RateWindow(quota, window_ms / 1000)
    now = start
    times: list[float] = []
    for amount, idle in reads:
        times.append(now)
        wait = window.record(now, amount)
        assert wait >= 0.0
        now += wait + idle
    largest = max(amount for amount, _ in reads)
    slack = 1e-6 * quota * (1 + now - start)  # float rounding on large clocks
    for first in range(len(reads)):
        total = 0
        for last in range(first, len(reads)):
            total += reads[last][0]
            span = times[last] - times[first]
            assert total <= quota * (span + window_ms / 1000) + largest + slack


@given(
    quota=st.integers(min_value=1, max_value=10_000_000),
    window_ms=st.integers(min_value=100, max_value=60_000),
    gaps=st.lists(st.floats(min_value=0, max_value=5, allow_nan=False), min_size=1, max_size=50),
    fill=st.floats(min_value=0, max_value=1, allow_nan=False),
)
@settings(max_examples=300, deadline=None)
def test_a_client_within_its_quota_is_never_throttled(
    quota: int, window_ms: int, gaps: list[float], fill: float
) -> None:
    """Reads no larger than a window's worth, none sending faster than the quota since the
    one before: never a throttle."""
    window_s = window_ms / 1000
    window = RateWindow(quota, window_s)
    now = 1000.0
    assert window.record(now, math.floor(quota * window_s * fill)) == 0.0
    for gap in gaps:
        now += gap
        amount = math.floor(quota * min(gap, window_s) * fill * 0.999)
        assert window.record(now, amount) == 0.0


# --- ClientQuota and ListenerQuota --------------------------------------------------------


def test_a_client_waits_for_the_longer_of_its_byte_and_message_throttles() -> None:
    client = ClientQuota("c", ClientRate(bytes_per_sec=1000, msgs_per_sec=10, window_ms=1000))
    assert client.on_read(5.0, 1000, 10) == 0.0
    assert client.on_read(5.0, 500, 1) == pytest.approx(0.5)  # bytes: 500 over
    # Messages: 41 sent since 4.0 (one window back), paid for at 10/s by 8.1.
    assert client.on_read(5.5, 0, 30) == pytest.approx(2.6)
    bytes_only = ClientQuota("b", ClientRate(bytes_per_sec=1000))
    assert bytes_only.messages is None
    assert bytes_only.on_read(0.0, 10, 1_000_000) == 0.0  # messages are not limited


def test_the_connection_quota_admits_up_to_its_limit_and_counts_refusals() -> None:
    quota = ListenerQuota(ListenerQuotas(max_connections=2))
    assert quota.admit(0)
    assert quota.admit(1)
    assert not quota.admit(2)
    assert not quota.admit(5)
    assert quota.stats.refused_connections == 2
    assert ListenerQuota(ListenerQuotas()).admit(10**6)  # no limit


def test_connections_of_one_client_share_its_quota_until_the_last_closes() -> None:
    quota = ListenerQuota(ListenerQuotas(client_rate=ClientRate(bytes_per_sec=100)))
    first, second = quota.attach(("uid", 1000)), quota.attach(("uid", 1000))
    other = quota.attach(("uid", 1001))
    assert first is not None
    assert second is not None
    assert second is first
    assert other is not None
    assert other is not first
    assert quota.clients == 2
    assert first.on_read(0.0, 100, 1) == 0.0
    assert second.on_read(0.0, 100, 1) == pytest.approx(1.0)  # the first's bytes count
    quota.detach(first)
    assert quota.attach(("uid", 1000)) is second  # still one open: the same window
    quota.detach(second)
    quota.detach(second)
    assert quota.clients == 1
    fresh = quota.attach(("uid", 1000))
    assert fresh is not None
    assert fresh is not second
    assert fresh.on_read(0.0, 100, 1) == 0.0


def test_no_rate_quota_no_client_state() -> None:
    quota = ListenerQuota(ListenerQuotas(max_connections=3))
    assert not quota.rate_limited
    assert quota.attach(("uid", 0)) is None
    assert quota.clients == 0


def test_new_settings_start_fresh_windows_and_keep_old_clients_harmless() -> None:
    quota = ListenerQuota(ListenerQuotas(client_rate=ClientRate(bytes_per_sec=100)))
    old = quota.attach("k")
    assert old is not None
    quota.configure(ListenerQuotas(client_rate=ClientRate(bytes_per_sec=1000)))
    new = quota.attach("k")
    assert new is not None
    assert new is not old
    quota.detach(old)  # the old one's connection closes: the new one is kept
    assert quota.clients == 1
    assert new.on_read(0.0, 1000, 1) == 0.0  # the new rate
    quota.configure(ListenerQuotas())
    assert quota.attach("k") is None


# --- the stream input with real sockets ---------------------------------------------------


@dataclass
class RecordingIntake:
    """The inputs' Intake: counts what it is handed, wakes whoever waits for a change."""

    frames_seen: int = 0
    bytes_seen: int = 0
    unclean: list[bytes] = field(default_factory=list)
    opened: int = 0
    closed: int = 0
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def datagrams(self, burst: Sequence[bytes], client: object = None) -> None:
        raise AssertionError("no datagram input here")

    def datagram_too_large(self, size: int, prefix: bytes) -> None:
        raise AssertionError("no datagram input here")

    def frames(self, burst: Sequence[bytes], transport: Transport, client: object = None) -> None:
        self.frames_seen += len(burst)
        self.bytes_seen += sum(len(frame) for frame in burst)
        self.changed.set()

    def broken_stream(self, error: ClientProtocolError, transport: Transport) -> None:
        raise AssertionError(f"a broken stream: {error}")

    def unclean_disconnect(self, prefix: bytes, transport: Transport) -> None:
        self.unclean.append(prefix)

    def connection_opened(self, transport: Transport) -> None:
        self.opened += 1
        self.changed.set()

    def connection_closed(self, transport: Transport, error: BaseException | None = None) -> None:
        self.closed += 1
        self.changed.set()

    async def until(self, condition: Callable[[], bool], timeout_s: float = 60) -> None:
        async with asyncio.timeout(timeout_s):
            while not condition():
                self.changed.clear()
                await self.changed.wait()


async def eventually(condition: Callable[[], bool], timeout_s: float = 60) -> None:
    """Poll ``condition`` (for changes no intake call signals, such as a throttle's end)."""
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.01)


def run(coroutine: Coroutine[Any, Any, None]) -> None:
    uvloop.run(coroutine)


@pytest.fixture
def socket_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("q", numbered=True))  # UNIX paths are short


MESSAGE = encode_any_partition("t", b"x" * 90)  # 100 bytes on the wire


def tcp_quotas(**rate: int) -> QuotasConfig:
    return QuotasConfig(tcp=ListenerQuotas(client_rate=ClientRate(**rate)))


async def started(
    kind: Transport, socket_dir: str, quotas: QuotasConfig, intake: RecordingIntake
) -> tuple[StreamInput, Counters]:
    counters = Counters()
    if kind is Transport.TCP:
        stream_input = StreamInput(kind, 1 << 20, intake, port=0, quotas=quotas, counters=counters)
    else:
        path = os.path.join(socket_dir, "s")
        stream_input = StreamInput(
            kind, 1 << 20, intake, path=path, quotas=quotas, counters=counters
        )
    await stream_input.start(asyncio.get_running_loop())
    return stream_input, counters


async def connected(kind: Transport, stream_input: StreamInput) -> socket.socket:
    """A non-blocking client connection, connected."""
    loop = asyncio.get_running_loop()
    if kind is Transport.TCP:
        client = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        client.setblocking(False)
        await loop.sock_connect(client, ("127.0.0.1", stream_input.port))
    else:
        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        client.setblocking(False)
        assert stream_input.path is not None
        await loop.sock_connect(client, stream_input.path)
    return client


def only_connection(stream_input: StreamInput) -> StreamInputProtocol:
    (connection,) = stream_input.connections()
    return connection


@pytest.mark.parametrize("kind", [Transport.UNIX_STREAM, Transport.TCP])
def test_the_connection_above_the_limit_is_closed_at_once_and_the_others_served(
    socket_dir: str, kind: Transport
) -> None:
    limited = ListenerQuotas(max_connections=2)
    quotas = QuotasConfig(unix_stream=limited, tcp=limited)

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        intake = RecordingIntake()
        stream_input, counters = await started(kind, socket_dir, quotas, intake)
        first = await connected(kind, stream_input)
        second = await connected(kind, stream_input)
        await intake.until(lambda: stream_input.connection_count == 2)
        third = await connected(kind, stream_input)
        began = time.monotonic()
        # Closed with its data unread: a reset is as good as an end-of-file here.
        with SchedulingDelay() as lateness, contextlib.suppress(ConnectionResetError):
            assert await asyncio.wait_for(loop.sock_recv(third, 1), 60) == b""
        # At once, not after some timeout (a margin that grows with the machine's load).
        assert time.monotonic() - began < lateness.margin_s(1.0)
        counter = f"quota_connections_refused_{kind}"
        assert counters.get(counter) == 1
        assert stream_input.quota.stats.refused_connections == 1
        # The first two are served as if nothing happened.
        await loop.sock_sendall(first, MESSAGE * 10)
        await loop.sock_sendall(second, MESSAGE * 10)
        await intake.until(lambda: intake.frames_seen == 20)
        assert (intake.opened, intake.closed) == (2, 0)  # the refused one never opened
        # One closes: a newcomer fits again.
        first.close()
        await intake.until(lambda: stream_input.connection_count == 1)
        fourth = await connected(kind, stream_input)
        await loop.sock_sendall(fourth, MESSAGE)
        await intake.until(lambda: intake.frames_seen == 21)
        assert counters.get(counter) == 1
        await stream_input.close()
        for client in (second, third, fourth):
            client.close()
        assert intake.opened == intake.closed == 3

    run(scenario())


def test_a_throttled_client_is_slowed_to_its_quota_and_loses_nothing(socket_dir: str) -> None:
    quota_bps, window_ms, count = 200_000, 200, 6000  # 600 kB at 200 kB/s, 40 kB of credit

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        intake = RecordingIntake()
        quotas = tcp_quotas(bytes_per_sec=quota_bps, window_ms=window_ms)
        stream_input, counters = await started(Transport.TCP, socket_dir, quotas, intake)
        client = await connected(Transport.TCP, stream_input)
        began = time.monotonic()
        with SchedulingDelay() as lateness:
            await loop.sock_sendall(client, MESSAGE * count)
            await intake.until(lambda: intake.frames_seen == count, timeout_s=60)
        took = time.monotonic() - began
        # Everything, and no faster than the quota allows: the credit, and the last read
        # (at most 256 KiB) is charged after it was read.
        assert intake.bytes_seen == len(MESSAGE) * count
        at_least = (len(MESSAGE) * count - quota_bps * window_ms / 1000 - 256 * 1024) / quota_bps
        assert at_least < took < len(MESSAGE) * count / quota_bps + lateness.margin_s(2.0)
        assert counters.get("quota_throttles_tcp") >= 1
        assert counters.get("quota_throttled_ms_tcp") >= 1000 * at_least
        assert stream_input.quota.stats.throttles == counters.get("quota_throttles_tcp")
        client.close()
        await stream_input.close()

    run(scenario())


def test_connections_of_one_uid_share_a_client_on_unix_and_tcp(socket_dir: str) -> None:
    rate = ListenerQuotas(client_rate=ClientRate(bytes_per_sec=1000))
    quotas = QuotasConfig(unix_stream=rate, tcp=rate)

    async def scenario() -> None:
        for kind, clients in ((Transport.UNIX_STREAM, 1), (Transport.TCP, 1)):
            intake = RecordingIntake()
            stream_input, _ = await started(kind, socket_dir, quotas, intake)
            first = await connected(kind, stream_input)
            second = await connected(kind, stream_input)
            await intake.until(lambda: stream_input.connection_count == 2)  # noqa: B023
            assert stream_input.quota.clients == clients
            loop = asyncio.get_running_loop()
            # 600 bytes each: within a 1000-byte window alone, over it together.
            await loop.sock_sendall(first, MESSAGE * 6)
            await intake.until(lambda: intake.frames_seen == 6)  # noqa: B023
            await loop.sock_sendall(second, MESSAGE * 6)
            await intake.until(lambda: intake.frames_seen == 12)  # noqa: B023
            throttled = [c.throttled for c in stream_input.connections()]
            assert throttled.count(True) == (1 if clients == 1 else 0), kind
            first.close()
            second.close()
            await intake.until(lambda: stream_input.connection_count == 0)  # noqa: B023
            assert stream_input.quota.clients == 0
            await stream_input.close()

    run(scenario())


def test_a_backpressure_resume_does_not_end_a_throttle_nor_a_throttle_a_pause(
    socket_dir: str,
) -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        intake = RecordingIntake()
        # 10 kB/s over 100 ms: 1 kB of credit; 4 kB sent = a throttle of about 0.3 s.
        quotas = tcp_quotas(bytes_per_sec=10_000, window_ms=100)
        stream_input, _counters = await started(Transport.TCP, socket_dir, quotas, intake)
        client = await connected(Transport.TCP, stream_input)
        await intake.until(lambda: stream_input.connection_count == 1)
        connection = only_connection(stream_input)

        async def throttle() -> None:
            before = intake.frames_seen
            await loop.sock_sendall(client, MESSAGE * 40)
            await intake.until(lambda: intake.frames_seen == before + 40)
            assert connection.throttled
            assert not connection.reading

        # A backpressure episode inside a throttle: its resume leaves the throttle alone.
        await throttle()
        stream_input.pause()
        stream_input.resume()
        assert connection.throttled
        assert not connection.reading
        await eventually(lambda: not connection.throttled)
        assert connection.reading  # the throttle's own end resumes it
        # A throttle ending inside a backpressure pause: the pause holds.
        await throttle()
        stream_input.pause()
        await asyncio.sleep(0.6)
        assert not connection.throttled
        assert not connection.reading
        await loop.sock_sendall(client, MESSAGE)
        await asyncio.sleep(0.1)
        assert intake.frames_seen == 80  # not read while paused
        stream_input.resume()
        assert connection.reading
        await intake.until(lambda: intake.frames_seen == 81)
        client.close()
        await stream_input.close()

    run(scenario())


def test_the_shutdown_reads_everything_a_throttled_client_sent(socket_dir: str) -> None:
    async def scenario() -> None:
        intake = RecordingIntake()
        rate = ListenerQuotas(client_rate=ClientRate(bytes_per_sec=1000, window_ms=100))
        quotas = QuotasConfig(unix_stream=rate)
        stream_input, _ = await started(Transport.UNIX_STREAM, socket_dir, quotas, intake)
        client = await connected(Transport.UNIX_STREAM, stream_input)
        await intake.until(lambda: stream_input.connection_count == 1)
        connection = only_connection(stream_input)
        data = memoryview(MESSAGE * 20_000)  # 2 MB: far more than the socket buffers hold
        sent = 0
        while True:  # write until the kernel takes no more: throttled after the first read
            try:
                sent += client.send(data[sent:])
            except BlockingIOError:
                if connection.throttled:
                    break
                await asyncio.sleep(0.01)
        assert intake.frames_seen < sent // len(MESSAGE)  # most of it waits, unread
        began = time.monotonic()
        with SchedulingDelay() as lateness:
            await stream_input.close()  # a throttle of minutes: the drain ignores it
        assert time.monotonic() - began < lateness.margin_s(1.0)
        assert intake.frames_seen == sent // len(MESSAGE)
        assert len(intake.unclean) == (1 if sent % len(MESSAGE) else 0)
        client.close()

    run(scenario())


def test_quotas_replaced_at_run_time_apply_to_open_connections(socket_dir: str) -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        intake = RecordingIntake()
        stream_input, counters = await started(Transport.TCP, socket_dir, QuotasConfig(), intake)
        client = await connected(Transport.TCP, stream_input)
        await intake.until(lambda: stream_input.connection_count == 1)
        connection = only_connection(stream_input)
        await loop.sock_sendall(client, MESSAGE * 100)
        await intake.until(lambda: intake.frames_seen == 100)
        assert not connection.throttled
        stream_input.set_quotas(tcp_quotas(bytes_per_sec=10_000, window_ms=100))
        await loop.sock_sendall(client, MESSAGE * 30)  # 3 kB against 1 kB of credit
        await intake.until(lambda: intake.frames_seen == 130)
        assert connection.throttled
        stream_input.set_quotas(QuotasConfig(tcp=ListenerQuotas(max_connections=1)))
        await eventually(lambda: not connection.throttled)
        await loop.sock_sendall(client, MESSAGE * 1000)  # no rate quota any more
        await intake.until(lambda: intake.frames_seen == 1130)
        assert not connection.throttled
        assert stream_input.quota.clients == 0
        # The new connection limit holds for the next connection; the open one stays.
        extra = await connected(Transport.TCP, stream_input)
        assert await asyncio.wait_for(loop.sock_recv(extra, 1), 60) == b""
        assert counters.get("quota_connections_refused_tcp") == 1
        assert counters.get("quota_throttles_tcp") == 1
        for sock in (client, extra):
            sock.close()
        await stream_input.close()

    run(scenario())


def test_a_message_rate_counts_the_frames_each_read_completed(socket_dir: str) -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        intake = RecordingIntake()
        # 1000 messages/s over 100 ms: 100 messages of credit; bytes are not limited.
        quotas = tcp_quotas(msgs_per_sec=1000, window_ms=100)
        stream_input, counters = await started(Transport.TCP, socket_dir, quotas, intake)
        client = await connected(Transport.TCP, stream_input)
        await intake.until(lambda: stream_input.connection_count == 1)
        connection = only_connection(stream_input)
        # Small messages: the 401 below fit in one read (READ_BYTES), so one throttle.
        small = encode_any_partition("t", b"")
        await loop.sock_sendall(client, small * 99 + small[:15])  # 99 and a half
        await intake.until(lambda: intake.frames_seen == 99)
        await asyncio.sleep(0.05)
        assert not connection.throttled
        began = time.monotonic()
        with SchedulingDelay() as lateness:
            await loop.sock_sendall(client, small[15:] + small * 400)  # 401 completed
            await intake.until(lambda: intake.frames_seen == 500)
            assert connection.throttled  # 500 in the window: 0.4 s over at 1000/s
            await eventually(lambda: not connection.throttled)
        # About 0.35 s: 400 over, 50 ms idle (more on a busy machine, by its lateness).
        assert 0.2 < time.monotonic() - began < lateness.margin_s(1.0)
        assert counters.get("quota_throttles_tcp") == 1
        client.close()
        await stream_input.close()

    run(scenario())
