"""A stream listener retired by a reload (``StreamInput.stop_accepting``): no new
connection, the socket file gone, and every connection it had -- those still waiting in
the listen backlog included -- read on until its client closes it. On real sockets and
uvloop, with an intake that records what it is handed."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import uvloop

from helpers import StreamIntake
from pydory.daemon.books.events import Transport
from pydory.daemon.inputs.stream import StreamInput
from pydory.wire import encode_any_partition


@dataclass
class Recorded(StreamIntake):
    """The inputs' Intake: the values of the frames handed over, and connection counts."""

    values: list[bytes] = field(default_factory=list)

    def frames(self, burst: Sequence[bytes], transport: Transport, client: object = None) -> None:
        self.values += [frame[-8:] for frame in burst]


def message(n: int, i: int) -> bytes:
    return encode_any_partition("t", b"v-%02d-%03d" % (n, i))  # the last 8 bytes: its id


async def eventually(condition: object, timeout_s: float = 60) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():  # type: ignore[operator]
            await asyncio.sleep(0.01)


@pytest.mark.parametrize("kind", [Transport.UNIX_STREAM, Transport.TCP])
def test_a_retired_listener_serves_its_connections_and_backlog_until_they_close(
    kind: Transport, tmp_path_factory: pytest.TempPathFactory
) -> None:
    path = str(tmp_path_factory.mktemp("r", numbered=True) / "s")
    intake = Recorded()

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        if kind is Transport.TCP:
            stream_input = StreamInput(kind, 1 << 20, intake, port=0)
        else:
            stream_input = StreamInput(kind, 1 << 20, intake, path=path)
        await stream_input.start(loop)
        address = ("127.0.0.1", stream_input.port) if kind is Transport.TCP else path
        family = socket.AF_INET if kind is Transport.TCP else socket.AF_UNIX
        clients = []
        # Connected by the kernel, not yet accepted by the loop (no await in between):
        # they are in the listen backlog when the listener retires.
        for n in range(3):
            client = socket.socket(family, socket.SOCK_STREAM)
            client.connect(address)
            client.sendall(b"".join(message(n, i) for i in range(50)))
            clients.append(client)
        await stream_input.stop_accepting(loop)
        if kind is Transport.UNIX_STREAM:
            assert not os.path.exists(path)
        else:
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection(address, timeout=60).close()  # type: ignore[arg-type]
        await eventually(lambda: len(intake.values) == 150)
        # Served on: the clients go on sending on their connections.
        for n, client in enumerate(clients):
            client.setblocking(False)
            await loop.sock_sendall(client, b"".join(message(n, i) for i in range(50, 100)))
        await eventually(lambda: len(intake.values) == 300)
        assert not stream_input.idle
        for client in clients:
            client.close()
        await eventually(lambda: stream_input.idle)
        await stream_input.close()

    uvloop.run(scenario())
    assert sorted(intake.values) == sorted(
        b"v-%02d-%03d" % (n, i) for n in range(3) for i in range(100)
    )
    assert intake.opened == intake.closed == 3


def test_close_after_stop_accepting_leaves_a_new_socket_file_alone(tmp_path: Path) -> None:
    path = str(tmp_path / "s")
    intake = Recorded()

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        old = StreamInput(Transport.UNIX_STREAM, 1 << 20, intake, path=path)
        await old.start(loop)
        await old.stop_accepting(loop)
        new = StreamInput(Transport.UNIX_STREAM, 1 << 20, intake, path=path)  # moved back
        await new.start(loop)
        await old.close()
        assert os.path.exists(path)  # the new listener's file
        await new.close()
        assert not os.path.exists(path)

    uvloop.run(scenario())
