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
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest
import uvloop

from helpers import StreamIntake
from hotpaths import DATAGRAM_IMPLEMENTATIONS, module_fixture
from pydory.daemon.books.events import Transport
from pydory.daemon.inputs.datagram import DatagramInput
from pydory.daemon.inputs.sockets import unread_bytes_on
from pydory.daemon.inputs.stream import StreamInput
from pydory.daemon.inputs.turns import READ_BYTES, TURN_READ_BYTES
from pydory.wire import encode_any_partition

# Every test here runs on the compiled hot path and on the pure-Python one (issue 25).
implementation = module_fixture(DATAGRAM_IMPLEMENTATIONS)

PER_CLIENT_BYTES = 6 * 1024 * 1024
MESSAGES = {tag: encode_any_partition(tag, b"x" * 90) for tag in ("aaaa", "bbbb")}


@dataclass
class ReadOrder(StreamIntake):
    """The inputs' Intake: notes which client each read (burst of frames) came from."""

    reads: list[str] = field(default_factory=list)
    bytes_by_client: dict[str, int] = field(default_factory=dict)

    def frames(self, burst: Sequence[bytes], transport: Transport, client: object = None) -> None:
        tag = "aaaa" if b"aaaa" in burst[0] else "bbbb"
        self.reads.append(tag)
        self.bytes_by_client[tag] = self.bytes_by_client.get(tag, 0) + sum(map(len, burst))


async def backlogs_of(stream_input: StreamInput, connections: int, unread: int) -> None:
    """Until ``connections`` connections each have at least ``unread`` bytes waiting in
    the kernel (the input is paused: their clients have filled their socket buffers)."""
    while not (
        len(ready := stream_input.connections()) >= connections
        and all(unread_bytes_on(connection.fd) >= unread for connection in ready)
    ):
        await asyncio.sleep(0.01)


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
        async with asyncio.timeout(60):  # a safety net only
            await backlogs_of(stream_input, len(MESSAGES), READ_BYTES)
        stream_input.resume()
        async with asyncio.timeout(60):  # a safety net only
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
    # read below READ_BYTES does not yield: the client had nothing more then).
    both_busy = intake.reads[: 2 * (PER_CLIENT_BYTES // (256 * 1024))]
    assert set(both_busy) == {"aaaa", "bbbb"}
    assert longest_run(both_busy) <= 3, both_busy
    assert READ_BYTES <= 256 * 1024  # at most uvloop's own read buffer: a full read yields


# -- issue 21 item 4: every input gets its share of each loop turn ---------------------------

FLOODERS = 6
FLOOD_BYTES = 4 * 1024 * 1024  # per flooder
DATAGRAMS = 2_000

#: A flooding client in a process of its own (no GIL shared with the loop under test):
#: connects, writes its bytes with blocking writes, exits.
FLOODER = """
import socket, sys
path, total = sys.argv[1], int(sys.argv[2])
message = bytes.fromhex(sys.argv[3])
chunk = message * (65536 // len(message))
with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
    s.connect(path)
    sent = 0
    while sent < total:
        s.sendall(chunk)
        sent += len(chunk)
"""
#: A polite datagram sender: blocking sends, one datagram at a time.
DATAGRAM_SENDER = """
import socket, sys
path, count = sys.argv[1], int(sys.argv[2])
message = bytes.fromhex(sys.argv[3])
with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
    for _ in range(count):
        s.sendto(message, path)
"""


@dataclass
class ReadsPerTurn:
    """The inputs' Intake for the shares test: what each input read in each loop turn."""

    turn: int = 0
    stream_bytes: dict[int, int] = field(default_factory=dict)
    datagrams_by_turn: dict[int, int] = field(default_factory=dict)
    opened: int = 0

    def tick(self) -> None:
        """Called once per turn of the loop (it schedules itself again)."""
        self.turn += 1
        asyncio.get_running_loop().call_soon(self.tick)

    def frames(self, burst: Sequence[bytes], transport: Transport, client: object = None) -> None:
        turn = self.turn
        self.stream_bytes[turn] = self.stream_bytes.get(turn, 0) + sum(map(len, burst))

    def datagrams(self, burst: Sequence[bytes], client: object = None) -> None:
        turn = self.turn
        self.datagrams_by_turn[turn] = self.datagrams_by_turn.get(turn, 0) + len(burst)

    def connection_opened(self, transport: Transport) -> None:
        self.opened += 1

    def connection_closed(self, transport: Transport, error: BaseException | None = None) -> None:
        pass

    def datagram_too_large(self, size: int, prefix: bytes) -> None:
        raise AssertionError("no datagram is too large here")

    def broken_stream(self, error: object, transport: Transport) -> None:
        raise AssertionError(f"a broken stream: {error}")

    def unclean_disconnect(self, prefix: bytes, transport: Transport) -> None:
        raise AssertionError("an unclean disconnect")


async def flood_beside_datagrams(intake: ReadsPerTurn, socket_dir: str) -> None:
    loop = asyncio.get_running_loop()
    stream_path, datagram_path = f"{socket_dir}/stream", f"{socket_dir}/dgram"
    stream_input = StreamInput(Transport.UNIX_STREAM, 1 << 20, intake, path=stream_path)
    datagram_input = DatagramInput(datagram_path, None, 1 << 16, False, intake)
    await stream_input.start(loop)
    datagram_input.start(loop)
    message = MESSAGES["aaaa"].hex()
    children: list[subprocess.Popen[bytes]] = []
    try:
        stream_input.pause()  # every flooder's socket buffer full before the first read
        for _ in range(FLOODERS):
            children.append(
                subprocess.Popen(
                    [sys.executable, "-c", FLOODER, stream_path, str(FLOOD_BYTES), message]
                )
            )
        async with asyncio.timeout(60):
            while intake.opened < FLOODERS:
                await asyncio.sleep(0.01)
            await backlogs_of(stream_input, FLOODERS, READ_BYTES)
            # The datagram sender started and blocked on its full queue before the flood is
            # read, so it sends beside the flood (not before or after it, as a sender
            # starting late on a loaded machine could).
            datagram_input.pause()
            children.append(
                subprocess.Popen(
                    [sys.executable, "-c", DATAGRAM_SENDER, datagram_path, str(DATAGRAMS), message]
                )
            )
            (datagram_fd,) = datagram_input.watched_fds()
            # Queued in the kernel, or read by a drain thread (which holds up to 2,048
            # while paused: mark_unread notes them) and not handed on.
            while unread_bytes_on(datagram_fd) == 0 and not datagram_input.mark_unread(set()):
                await asyncio.sleep(0.01)
            stream_input.resume()
            datagram_input.resume()
            loop.call_soon(intake.tick)
            chunk = len(MESSAGES["aaaa"]) * (65536 // len(MESSAGES["aaaa"]))
            flood = FLOODERS * chunk * -(-FLOOD_BYTES // chunk)  # as FLOODER writes it
            while (
                sum(intake.stream_bytes.values()) < flood
                or sum(intake.datagrams_by_turn.values()) < DATAGRAMS
            ):
                await asyncio.sleep(0.01)
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
            child.wait(60)
        await stream_input.close()
        datagram_input.close()


@pytest.fixture
def socket_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("f", numbered=True))  # UNIX paths are short


def test_a_flood_of_stream_clients_reads_a_bounded_share_of_each_turn(socket_dir: str) -> None:
    """Six clients flood a UNIX stream input while a datagram sender writes beside them:
    whatever the number of flooders, a turn of the loop reads one buffer per connection at
    most, and most turns only the turn's budget, so the turns come often and the datagram
    socket (which queues only 10 datagrams here) is read in them."""
    intake = ReadsPerTurn()
    uvloop.run(flood_beside_datagrams(intake, socket_dir))
    # Turn 0 is the poll that resumed them all at once (and the reads at accept time).
    per_turn = sorted(n for turn, n in intake.stream_bytes.items() if turn > 0)
    # Measured in whole frames: a read also completes the frame the previous one began.
    slack = len(MESSAGES["aaaa"])
    # Before: up to 256 KiB per connection per turn (uvloop's read buffer), 1.5 MiB here.
    assert per_turn[-1] <= FLOODERS * (READ_BYTES + slack), per_turn[-10:]
    # The typical turn reads the turn's budget, from the connections whose turn it is.
    assert per_turn[len(per_turn) // 2] <= TURN_READ_BYTES + 2 * slack, per_turn
    # Every datagram was read, in turns interleaved with the flood's.
    assert sum(intake.datagrams_by_turn.values()) == DATAGRAMS
    flood_turns = set(intake.stream_bytes)
    first, last = min(flood_turns), max(flood_turns)
    assert any(first < turn < last for turn in intake.datagrams_by_turn)
