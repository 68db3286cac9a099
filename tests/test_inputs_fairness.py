"""Stream connections take turns: a client with a lot to send cannot hold the loop.

libuv reads a readable connection up to 32 times in a row (8 MiB under uvloop) before
the loop serves anything else, so one flooding client delayed every other input and the
status pages by a quarter of a second (docs/operations.md, Quotas). A stream read large
enough to have left more behind now pauses its connection until the loop's next turn.

Checked without timing, by the order of reads: two clients with megabytes waiting each,
on a real uvloop and real sockets; the reads alternate instead of coming in long runs.
"""

from __future__ import annotations

import asyncio
import itertools
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field

import uvloop

from helpers import StreamIntake
from pydory.daemon.books.events import Transport
from pydory.daemon.inputs.stream import StreamInput
from pydory.daemon.inputs.stream_connection import TURN_READ_BYTES
from pydory.wire import encode_any_partition

PER_CLIENT_BYTES = 6 * 1024 * 1024
MESSAGES = {tag: encode_any_partition(tag, b"x" * 90) for tag in ("aaaa", "bbbb")}


@dataclass
class ReadOrder(StreamIntake):
    """The inputs' Intake: notes which client each read (burst of frames) came from."""

    reads: list[str] = field(default_factory=list)
    bytes_by_client: dict[str, int] = field(default_factory=dict)

    def frames(self, burst: Sequence[bytes], transport: Transport) -> None:
        tag = "aaaa" if b"aaaa" in burst[0] else "bbbb"
        self.reads.append(tag)
        self.bytes_by_client[tag] = self.bytes_by_client.get(tag, 0) + sum(map(len, burst))


async def send_all(client: socket.socket, data: bytes) -> None:
    await asyncio.get_running_loop().sock_sendall(client, data)


async def two_clients_at_once(intake: ReadOrder) -> None:
    loop = asyncio.get_running_loop()
    stream_input = StreamInput(Transport.TCP, 1 << 20, intake, port=0)
    await stream_input.start(loop)
    clients = []
    try:
        for _ in MESSAGES:
            client = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            client.setblocking(False)
            await loop.sock_connect(client, ("127.0.0.1", stream_input.port or 0))
            clients.append(client)
        stream_input.pause()  # let both fill their socket buffers first
        count = PER_CLIENT_BYTES // len(MESSAGES["aaaa"])
        senders = [
            asyncio.ensure_future(send_all(client, message * count))
            for client, message in zip(clients, MESSAGES.values(), strict=True)
        ]
        await asyncio.sleep(0.2)
        stream_input.resume()
        async with asyncio.timeout(30):
            await asyncio.gather(*senders)
            while sum(intake.bytes_by_client.values()) < 2 * count * len(MESSAGES["aaaa"]):
                await asyncio.sleep(0.01)
    finally:
        for client in clients:
            client.close()
        await stream_input.close()


def longest_run(reads: list[str]) -> int:
    return max(len(list(run)) for _, run in itertools.groupby(reads))


def test_two_busy_clients_take_turns() -> None:
    intake = ReadOrder()
    uvloop.run(two_clients_at_once(intake))
    # While both had data, neither was read twice in a row more than once or twice (a
    # read below TURN_READ_BYTES does not yield: the client had nothing more then).
    both_busy = intake.reads[: 2 * (PER_CLIENT_BYTES // (256 * 1024))]
    assert set(both_busy) == {"aaaa", "bbbb"}
    assert longest_run(both_busy) <= 3, both_busy
    assert TURN_READ_BYTES <= 256 * 1024  # uvloop's read buffer: a full read yields
