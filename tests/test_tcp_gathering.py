"""A TCP connection whose read was small gathers (pydory.daemon.inputs.stream_connection):
its socket's SO_RCVLOWAT is raised for GATHER_S, then lowered to 1 again, so a client
writing small messages fast wakes the daemon once per GATHER_BYTES, and no message waits
longer than GATHER_S. Real sockets, a real StreamInput, the inputs' recording intake."""

from __future__ import annotations

import asyncio
import socket

import pytest

from pydory.config.model import QuotasConfig
from pydory.daemon.books.counters import Counters
from pydory.daemon.books.events import Transport
from pydory.daemon.inputs import stream_connection
from pydory.daemon.inputs.stream import StreamInput
from pydory.daemon.inputs.stream_connection import GATHER_BYTES, StreamInputProtocol
from test_quotas import MESSAGE, RecordingIntake, connected, eventually, only_connection, run


def low_water(connection: StreamInputProtocol) -> int:
    """The daemon's side of the connection: its socket's SO_RCVLOWAT now."""
    with socket.socket(fileno=socket.dup(connection.fd)) as sock:
        return sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT)


async def started(kind: Transport, path: str, intake: RecordingIntake) -> StreamInput:
    quotas, counters = QuotasConfig(), Counters()
    if kind is Transport.TCP:
        stream_input = StreamInput(kind, 1 << 20, intake, port=0, quotas=quotas, counters=counters)
    else:
        stream_input = StreamInput(
            kind, 1 << 20, intake, path=path, quotas=quotas, counters=counters
        )
    await stream_input.start(asyncio.get_running_loop())
    return stream_input


async def one_connection(
    kind: Transport, path: str, intake: RecordingIntake
) -> tuple[StreamInput, socket.socket, StreamInputProtocol]:
    """A started input, a client connected to it, and the daemon's side of it."""
    stream_input = await started(kind, path, intake)
    client = await connected(kind, stream_input)
    await intake.until(lambda: stream_input.connection_count == 1)
    return stream_input, client, only_connection(stream_input)


def test_a_small_read_raises_the_mark_and_more_data_or_a_close_is_read_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(stream_connection, "GATHER_S", 600.0)  # raised for the whole test

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        intake = RecordingIntake()
        stream_input, client, connection = await one_connection(Transport.TCP, "", intake)
        assert low_water(connection) == 1
        await loop.sock_sendall(client, MESSAGE)
        await intake.until(lambda: intake.frames_seen == 1)
        assert low_water(connection) == GATHER_BYTES  # a small read: gathering
        # The mark reached: read at once.
        burst = MESSAGE * (GATHER_BYTES // len(MESSAGE) + 1)
        await loop.sock_sendall(client, burst)
        total = 1 + len(burst) // len(MESSAGE)
        await intake.until(lambda: intake.frames_seen == total)
        # A close below the mark is seen at once, with what came before it.
        await loop.sock_sendall(client, MESSAGE + MESSAGE[:10])
        client.close()
        await intake.until(lambda: intake.closed == 1)
        assert intake.frames_seen == total + 1
        assert intake.unclean == [MESSAGE[:10]]
        await stream_input.close()

    run(scenario())


def test_a_message_below_the_mark_waits_no_longer_than_the_gathering() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        intake = RecordingIntake()
        stream_input, client, connection = await one_connection(Transport.TCP, "", intake)
        for expected in range(1, 6):  # each read small, each followed by nothing
            await loop.sock_sendall(client, MESSAGE)
            await intake.until(lambda n=expected: intake.frames_seen == n)  # type: ignore[misc]
        await eventually(lambda: low_water(connection) == 1)
        client.close()
        await intake.until(lambda: intake.closed == 1)
        await stream_input.close()

    run(scenario())


def test_a_unix_stream_connection_never_gathers(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stream_connection, "GATHER_S", 600.0)
    path = str(tmp_path_factory.mktemp("g", numbered=True) / "s")

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        intake = RecordingIntake()
        stream_input, client, connection = await one_connection(Transport.UNIX_STREAM, path, intake)
        await loop.sock_sendall(client, MESSAGE)
        await intake.until(lambda: intake.frames_seen == 1)
        assert low_water(connection) == 1
        client.close()
        await intake.until(lambda: intake.closed == 1)
        await stream_input.close()

    run(scenario())
