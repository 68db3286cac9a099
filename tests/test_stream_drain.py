"""The UNIX stream connections' drain thread (pydory._cwire.StreamDrain, issue 34 lever 1
for the streams): every connection's bytes handed on whole and in order (hypothesis: many
connections, any write sizes, any take limits), its end (EOF, a reset) only after its last
byte, a paused connection neither read nor taken (its writer blocks, the others flow), what
the thread holds handed back when a connection is removed or the thread stops, the bound on
what it holds (per connection and in all), and ``unread`` exact while the thread reads.
"""

from __future__ import annotations

import asyncio
import errno
import itertools
import os
import select
import socket
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
import uvloop
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import StreamIntake
from hotpaths import compiled_module, using
from pydory.daemon.books.events import Transport
from pydory.daemon.inputs import stream_drain
from pydory.daemon.inputs.marks import mark_inputs
from pydory.daemon.inputs.stream import StreamInput
from pydory.wire import encode_any_partition

cwire = compiled_module()
pytestmark = pytest.mark.skipif(cwire is None, reason="pydory._cwire is not built here")

#: The longest any wait here may take: a safety net for a broken drain, never a deadline.
SAFETY_NET_S = 600


def pairs(count: int) -> list[tuple[socket.socket, socket.socket]]:
    """(daemon's side, client's side) UNIX stream socket pairs."""
    made = [socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(count)]
    for receiver, _ in made:
        receiver.setblocking(False)
    return made


@pytest.fixture
def drain() -> Iterator[Any]:
    made = cwire.StreamDrain()
    made.start()
    yield made
    made.stop()


def wait_until(condition: Callable[[], bool], what: str) -> None:
    """Until the thread has done what ``condition`` sees (it has no event for the test)."""
    for _ in range(SAFETY_NET_S * 100):  # not a deadline: the thread's progress
        if condition():
            return
        select.select([], [], [], 0.01)
    raise AssertionError(what)


def take_until_ended(drain: Any, tokens: list[int], limit: Callable[[], int]) -> dict[int, Any]:
    """Take what the drain signals until every connection's end came: token -> (bytes,
    end); nothing may follow an end."""
    data = {token: bytearray() for token in tokens}
    ends: dict[int, int] = {}
    while len(ends) < len(tokens):
        ready, _, _ = select.select([drain.wake_fd], [], [], SAFETY_NET_S)
        assert ready, f"ended: {len(ends)} of {len(tokens)}"
        for token in drain.ready():
            got, end = drain.take(token, limit())
            assert token not in ends, "bytes or an end after the end"
            assert len(got) <= drain.connection_capacity
            data[token] += got
            if end is not None:
                ends[token] = end
    return {token: (bytes(data[token]), ends[token]) for token in tokens}


@settings(max_examples=40, deadline=None)
@given(
    writes=st.lists(st.tuples(st.integers(0, 5), st.integers(1, 70_000)), min_size=1, max_size=30),
    limits=st.lists(st.integers(100, 80_000), min_size=1, max_size=8),
)
def test_every_connection_is_handed_on_whole_and_in_order_then_its_end(
    writes: list[tuple[int, int]], limits: list[int]
) -> None:
    """Writes of any size on six connections at once, taken with any limit: each
    connection's bytes in order, none lost or repeated, then EOF (0)."""
    drain = cwire.StreamDrain()
    drain.start()
    made = pairs(6)
    tokens = [drain.add(receiver.fileno()) for receiver, _ in made]
    sent = [bytearray() for _ in made]
    for number, (which, size) in enumerate(writes):
        sent[which] += bytes([number % 251]) * size

    def write() -> None:  # blocks when the kernel and the drain are full: the taker frees
        for number, (which, size) in enumerate(writes):
            made[which][1].sendall(bytes([number % 251]) * size)
        for _, client in made:
            client.close()

    writer = threading.Thread(target=write)
    writer.start()
    turn = itertools.cycle(limits)
    try:
        got = take_until_ended(drain, tokens, lambda: next(turn))
    finally:
        writer.join()
        drain.stop()
    for token, expected in zip(tokens, sent, strict=True):
        assert got[token] == (bytes(expected), 0)
    assert drain.stats()["held"] == 0
    for token in tokens:
        assert drain.remove(token) == (b"", None)  # the end was handed already
    for receiver, _ in made:
        os.fstat(receiver.fileno())  # still open: the drain closed its duplicate only
        receiver.close()


def test_a_reset_comes_after_the_connections_last_bytes(drain: Any) -> None:
    """A client that closes while the daemon's socket has bytes for it unread resets the
    connection (Linux: ECONNRESET): the drain hands its bytes first, then the error."""
    [(receiver, client)] = pairs(1)
    with receiver:
        token = drain.add(receiver.fileno())
        receiver.send(b"unread by the client")  # (the daemon never writes: the reset's cause)
        client.sendall(b"x" * 100_000)
        client.close()
        assert take_until_ended(drain, [token], lambda: 4096) == {
            token: (b"x" * 100_000, errno.ECONNRESET)
        }


def test_a_paused_connection_is_neither_read_nor_taken_and_its_writer_blocks(
    drain: Any,
) -> None:
    (a, a_client), (b, b_client) = pairs(2)
    with a, a_client, b, b_client:
        first = b"read before the pause"
        a_token = drain.add(a.fileno())
        b_token = drain.add(b.fileno())
        a_client.sendall(first)
        wait_until(lambda: drain.held(a_token) == len(first), "the thread reads A")
        drain.pause(a_token)
        assert drain.take(a_token, 1 << 20) == (b"", None)  # held, not handed while paused
        # A's writer fills its socket's buffer and is refused: the thread reads no more.
        a_client.setblocking(False)
        blocked = 0
        try:
            while True:
                blocked += a_client.send(b"a" * 4096)
        except BlockingIOError:
            pass
        assert drain.held(a_token) == len(first)
        assert drain.unread(a_token) == len(first) + blocked
        # B flows meanwhile: more than its socket and the drain can hold at once.
        flood = os.urandom(8 << 20)
        writer = threading.Thread(target=lambda: (b_client.sendall(flood), b_client.close()))
        writer.start()
        taken = take_until_ended(drain, [b_token], lambda: 32 * 1024)
        writer.join()
        assert taken == {b_token: (flood, 0)}
        assert drain.held(a_token) == len(first)  # still not read
        assert drain.ready() == []
        # Resumed: what it held, then what its writer was refused for, in order.
        drain.resume(a_token)
        a_client.close()
        expected = first + b"a" * blocked
        assert take_until_ended(drain, [a_token], lambda: 32 * 1024) == {a_token: (expected, 0)}


def test_the_thread_holds_no_more_than_its_bounds_and_the_writers_block(drain: Any) -> None:
    """The loop takes nothing: the thread fills each connection up to its capacity and all
    of them up to the drain's, then reads no more; every writer is refused; then every
    byte is handed on, in order."""
    count = drain.capacity // drain.connection_capacity + 4  # more than the pool can hold
    made = pairs(count)
    tokens = [drain.add(receiver.fileno()) for receiver, _ in made]
    sent = []
    for _, client in made:
        client.setblocking(False)
        written = bytearray()
        try:
            while True:  # blocks (refused) once its socket's buffer is full
                chunk = bytes([len(written) % 251]) * 1000
                written += chunk[: client.send(chunk)]
        except BlockingIOError:
            pass
        sent.append(written)
    # The thread reads until no chunk is free (more connections wait than the pool holds),
    # then no more until a take: what it holds stays put from then on.
    wait_until(lambda: drain.stats()["waits_for_chunks"] > 0, "the thread fills its pool")
    held = [drain.held(token) for token in tokens]
    assert max(held) <= drain.connection_capacity
    assert sum(held) == drain.stats()["held"] <= drain.capacity
    for token, written in zip(tokens, sent, strict=True):
        assert drain.unread(token) == len(written)  # nothing lost in between
    for _, client in made:
        client.close()
    got = take_until_ended(drain, tokens, lambda: 32 * 1024)
    for token, written in zip(tokens, sent, strict=True):
        assert got[token] == (bytes(written), 0)
    for receiver, _ in made:
        receiver.close()


def test_removing_a_connection_hands_back_what_the_thread_holds(drain: Any) -> None:
    [(receiver, client)] = pairs(1)
    with receiver, client:
        token = drain.add(receiver.fileno())
        client.sendall(b"held" * 1000)
        wait_until(lambda: drain.held(token) == 4000, "the thread reads it")
        assert drain.remove(token) == (b"held" * 1000, None)
        assert drain.remove(token) == (b"", None)  # gone: nothing more, no error
        assert drain.unread(token) == 0
        client.sendall(b"after")  # the socket is the caller's again, still open
        assert receiver.recv(100) == b"after"


def test_what_the_thread_read_stays_after_it_stops() -> None:
    drain = cwire.StreamDrain()
    drain.start()
    made = pairs(3)
    tokens = [drain.add(receiver.fileno()) for receiver, _ in made]
    for number, (_, client) in enumerate(made):
        client.sendall(b"%d" % number * 5000)
        client.close()
    wait_until(lambda: drain.stats()["ends"] == 3, "the thread reads to the ends")
    drain.stop()
    for number, token in enumerate(tokens):
        assert drain.take(token, 2000) == (b"%d" % number * 2000, None)
    assert drain.remove(tokens[0]) == (b"0" * 3000, 0)  # the rest, then its end
    got = take_until_ended(drain, tokens[1:], lambda: 1 << 20)
    assert got == {tokens[1]: (b"1" * 3000, 0), tokens[2]: (b"2" * 3000, 0)}
    for receiver, _ in made:
        receiver.close()


def test_unread_counts_each_byte_once_while_the_thread_reads(drain: Any) -> None:
    """unread = the kernel's unread bytes + those the thread holds for the connection,
    never a byte in both or in neither, whatever the thread is doing when asked (it reads
    as the bytes come, the test asks at once)."""
    [(receiver, client)] = pairs(1)
    with receiver, client:
        token = drain.add(receiver.fileno())
        sent = taken = 0
        for step in range(3000):
            client.sendall(bytes([step % 251]) * 3000)
            sent += 3000
            assert drain.unread(token) == sent - taken
            if step % 7 == 0:  # the loop takes now and then: the rest stays held
                data, end = drain.take(token, 1 << 20)
                assert end is None
                taken += len(data)
                assert drain.unread(token) == sent - taken


# --- the UNIX stream input on the drain thread ---------------------------------------------


@dataclass
class FramedIntake(StreamIntake):
    """Records the frames handed on, in order, and how each connection ended."""

    framed: list[bytes] = field(default_factory=list)
    errors: list[BaseException | None] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def frames(self, burst: Sequence[bytes], transport: Transport, client: object = None) -> None:
        assert transport is Transport.UNIX_STREAM
        self.framed += burst
        self.changed.set()

    def connection_closed(self, transport: Transport, error: BaseException | None = None) -> None:
        super().connection_closed(transport, error)
        self.errors.append(error)
        self.changed.set()

    async def until(self, condition: Callable[[], bool]) -> None:
        async with asyncio.timeout(SAFETY_NET_S):  # a safety net only
            while not condition():
                self.changed.clear()
                await self.changed.wait()


def messages(label: str, count: int) -> list[bytes]:
    return [encode_any_partition("t", f"{label}-{i}".encode()) for i in range(count)]


def test_the_choice_is_on_by_default_where_compiled_and_off_when_named() -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(stream_drain.hotpath, "StreamDrain", cwire.StreamDrain)  # compiled
        patch.delenv(stream_drain.DRAIN_VARIABLE, raising=False)
        assert stream_drain._choose() == (cwire.StreamDrain, "on by default")
        patch.setenv(stream_drain.DRAIN_VARIABLE, "0")
        assert stream_drain._choose() == (None, f"{stream_drain.DRAIN_VARIABLE}=0")
        patch.setenv(stream_drain.DRAIN_VARIABLE, "1")
        assert stream_drain._choose()[0] is cwire.StreamDrain
        patch.setattr(stream_drain.hotpath, "StreamDrain", None)  # the pure hot path
        assert stream_drain._choose()[0] is None


def test_the_input_drained_hands_on_in_order_through_pause_marks_and_close(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    path = os.path.join(str(tmp_path_factory.mktemp("s")), "s")
    sent = messages("m", 400)

    async def scenario() -> None:
        intake = FramedIntake()
        stream_input = StreamInput(Transport.UNIX_STREAM, 1 << 20, intake, path=path)
        await stream_input.start(asyncio.get_running_loop())
        drain = stream_input._connections.drain
        assert drain is not None
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect(path)
            client.sendall(b"".join(sent[:10]))
            await intake.until(lambda: len(intake.framed) == 10)
            [connection] = stream_input.connections()
            assert connection.drained  # its transport read once; the thread reads from now on
            # Paused: the thread reads none of it, the mark waits for it.
            stream_input.pause()
            client.sendall(b"".join(sent[10:60]))
            mark = mark_inputs(None, [stream_input])
            # Every byte reaches the socket and stays unread (kernel + thread): none taken.
            paused_bytes = sum(len(m) for m in sent[10:60])
            await intake.until(lambda: connection.unread() == paused_bytes)
            assert len(intake.framed) == 10
            assert not mark.reached()
            stream_input.resume()
            await intake.until(lambda: len(intake.framed) == 60)
            assert mark.reached()
            # Read by the thread and not taken yet (the loop runs nothing until close):
            # handed on at the close, before what the kernel still holds.
            before = drain.stats()["bytes"]
            client.sendall(b"".join(sent[60:]))
            while drain.stats()["bytes"] == before:  # not a deadline: the thread reads some
                select.select([], [], [], 0.01)
            mark = mark_inputs(None, [stream_input])
            assert not mark.reached()  # held by the thread: not read yet
            await stream_input.close()
            assert mark.reached()
        assert intake.framed == sent
        assert intake.opened == intake.closed == 1
        assert intake.errors == [None]
        assert drain.stats()["connections"] == 0

    with using("sdrain"):
        uvloop.run(scenario())


def test_a_drained_connection_ends_after_its_last_message(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """EOF met by the thread closes the connection after its last bytes, as the
    transport's EOF does, connection after connection."""
    path = os.path.join(str(tmp_path_factory.mktemp("s")), "s")
    sent = messages("e", 300)

    async def scenario() -> None:
        intake = FramedIntake()
        stream_input = StreamInput(Transport.UNIX_STREAM, 1 << 20, intake, path=path)
        await stream_input.start(asyncio.get_running_loop())
        for _ in range(3):
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
                client.connect(path)
                client.sendall(sent[0])
                await intake.until(
                    lambda: stream_input.connection_count == 1 and bool(intake.framed)
                )
                assert stream_input.connections()[0].drained
                client.sendall(b"".join(sent[1:]))
            await intake.until(lambda: intake.closed == 1)
            assert intake.framed == sent
            assert intake.errors == [None]
            assert stream_input.connection_count == 0
            intake.framed.clear()
            intake.closed = 0
            intake.errors.clear()
        await stream_input.close()

    with using("sdrain"):
        uvloop.run(scenario())


@pytest.mark.parametrize("implementation", ["compiled", "sdrain"])
def test_a_reset_ends_the_connection_after_its_messages_as_the_transport_says_it(
    tmp_path_factory: pytest.TempPathFactory, implementation: str
) -> None:
    """A client that closes with bytes unread on its side resets the connection: its
    messages are handed on, then connection_closed is told the error, whoever reads."""
    path = os.path.join(str(tmp_path_factory.mktemp("s")), "s")
    sent = messages("r", 200)

    async def scenario() -> None:
        intake = FramedIntake()
        stream_input = StreamInput(Transport.UNIX_STREAM, 1 << 20, intake, path=path)
        await stream_input.start(asyncio.get_running_loop())
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect(path)
            client.sendall(sent[0])
            await intake.until(lambda: len(intake.framed) == 1)
            [connection] = stream_input.connections()
            assert connection.drained == (implementation == "sdrain")
            os.write(connection.fd, b"unread")  # (the daemon never writes: the reset's cause)
            client.sendall(b"".join(sent[1:]))
        await intake.until(lambda: intake.closed == 1)
        assert intake.framed == sent
        [error] = intake.errors
        assert isinstance(error, ConnectionResetError)
        await stream_input.close()

    with using(implementation):
        uvloop.run(scenario())
