"""The input agents at shutdown (what clients already sent is read, not dropped) and the
commit point's probe of the input sockets.

The unit tests run the inputs on uvloop with an intake that records what it is handed.
Between a test's sends and its call to ``close()`` the test never yields to the loop, so
everything sent is still in the kernel's buffers (connections made then still wait in
the listen backlog) when the inputs close: only the shutdown drain can read it.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
import uvloop

from helpers import assert_balanced, wait_until
from hotpaths import datagram_fixture
from pydory.client import DatagramSender, TcpSender, UnixStreamSender
from pydory.daemon.books.events import Transport
from pydory.daemon.inputs.datagram import DatagramInput
from pydory.daemon.inputs.marks import mark_inputs
from pydory.daemon.inputs.stream import StreamInput
from pydory.errors import ClientProtocolError
from pydory.wire import encode_any_partition
from pydory_tools.testing.daemon import DaemonConfig, RunningDaemon
from pydory_tools.testing.kafka_util import consume_all
from pydory_tools.testing.mock_cluster import MockCluster

datagram_implementation = datagram_fixture()

# The host's net.unix.max_dgram_qlen is 10: more datagrams would block an unread sender.
QUEUED_DATAGRAMS = 8


@dataclass
class RecordingIntake:
    """The inputs' Intake: records everything, wakes whoever waits for a change."""

    received: list[bytes] = field(default_factory=list)  # datagrams, in order
    framed: list[tuple[bytes, Transport]] = field(default_factory=list)
    unclean: list[tuple[bytes, Transport]] = field(default_factory=list)
    broken: list[ClientProtocolError] = field(default_factory=list)
    opened: int = 0
    closed: int = 0
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def datagrams(self, burst: Sequence[bytes], client: object = None) -> None:
        self.received += burst
        self.changed.set()

    def datagram_too_large(self, size: int, prefix: bytes) -> None:
        raise AssertionError("no datagram in these tests is too large")

    def frames(self, burst: Sequence[bytes], transport: Transport, client: object = None) -> None:
        self.framed += [(data, transport) for data in burst]
        self.changed.set()

    def broken_stream(self, error: ClientProtocolError, transport: Transport) -> None:
        self.broken.append(error)

    def unclean_disconnect(self, prefix: bytes, transport: Transport) -> None:
        self.unclean.append((prefix, transport))

    def connection_opened(self, transport: Transport) -> None:
        self.opened += 1
        self.changed.set()

    def connection_closed(self, transport: Transport, error: BaseException | None = None) -> None:
        self.closed += 1

    async def until(self, condition: Callable[[], bool]) -> None:
        async with asyncio.timeout(60):  # a safety net only
            while not condition():
                self.changed.clear()
                await self.changed.wait()


def run(coroutine: Coroutine[Any, Any, None]) -> None:
    uvloop.run(coroutine)


@pytest.fixture
def socket_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    # UNIX socket paths are limited to ~108 bytes: keep them short.
    return str(tmp_path_factory.mktemp("s", numbered=True))


def messages(label: str, count: int) -> list[bytes]:
    return [encode_any_partition("t", f"{label}-{i}".encode()) for i in range(count)]


def connect(kind: Transport, stream_input: StreamInput) -> socket.socket:
    """A client connection: the kernel completes it even while the loop does not accept."""
    if kind is Transport.TCP:
        assert stream_input.port is not None
        return socket.create_connection(("127.0.0.1", stream_input.port))
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    assert stream_input.path is not None
    client.connect(stream_input.path)
    return client


@pytest.mark.usefixtures("datagram_implementation")
def test_closing_the_datagram_input_reads_the_datagrams_already_queued(socket_dir: str) -> None:
    path = os.path.join(socket_dir, "d")
    sent = messages("dgram", QUEUED_DATAGRAMS)

    async def scenario() -> None:
        intake = RecordingIntake()
        datagram_input = DatagramInput(path, None, 65536, False, intake)
        datagram_input.start(asyncio.get_running_loop())
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as client:
            client.connect(path)
            for data in sent:
                client.send(data)
            datagram_input.close()
            assert intake.received == sent
            assert not os.path.exists(path)
            with pytest.raises(ConnectionError):  # refused, not silently lost
                client.send(sent[0])

    run(scenario())


@pytest.mark.parametrize("kind", [Transport.UNIX_STREAM, Transport.TCP])
def test_closing_a_stream_input_reads_what_its_clients_already_sent(
    socket_dir: str, kind: Transport
) -> None:
    open_sent = messages("open", 300)
    waiting_sent = messages("backlog", 300)
    cut_short = messages("cut", 1)[0][:10]

    async def scenario() -> None:
        intake = RecordingIntake()
        if kind is Transport.TCP:
            stream_input = StreamInput(kind, 1 << 20, intake, port=0)
        else:
            stream_input = StreamInput(kind, 1 << 20, intake, path=os.path.join(socket_dir, "s"))
        await stream_input.start(asyncio.get_running_loop())
        accepted = connect(kind, stream_input)
        await intake.until(lambda: stream_input.connection_count == 1)
        # From here to close() the loop runs nothing: every byte below stays in the kernel.
        accepted.sendall(b"".join(open_sent))
        in_backlog = connect(kind, stream_input)
        in_backlog.sendall(b"".join(waiting_sent) + cut_short)
        unread = mark_inputs(None, [stream_input])
        assert not unread.reached()
        await stream_input.close()
        for client in (accepted, in_backlog):
            client.close()
        frames = [frame for frame, _ in intake.framed]
        assert [frame for frame in frames if b"open-" in frame] == open_sent
        assert [frame for frame in frames if b"backlog-" in frame] == waiting_sent
        assert len(frames) == len(open_sent) + len(waiting_sent)
        assert {transport for _, transport in intake.framed} == {kind}
        assert intake.unclean == [(cut_short, kind)]
        assert intake.opened == intake.closed == 2
        assert stream_input.connection_count == 0
        assert unread.reached()

    run(scenario())


def test_a_unix_client_sending_after_the_drain_is_refused(socket_dir: str) -> None:
    async def scenario() -> None:
        intake = RecordingIntake()
        path = os.path.join(socket_dir, "s")
        stream_input = StreamInput(Transport.UNIX_STREAM, 1 << 20, intake, path=path)
        await stream_input.start(asyncio.get_running_loop())
        client = connect(Transport.UNIX_STREAM, stream_input)
        await intake.until(lambda: stream_input.connection_count == 1)
        await stream_input.close()
        with client, pytest.raises(ConnectionError):
            client.sendall(messages("late", 1)[0])  # EPIPE or a reset: never a silent loss
        assert intake.framed == []

    run(scenario())


@pytest.mark.usefixtures("datagram_implementation")
def test_an_input_mark_is_reached_once_what_the_sockets_held_is_read(socket_dir: str) -> None:
    async def scenario() -> None:
        intake = RecordingIntake()
        loop = asyncio.get_running_loop()
        path = os.path.join(socket_dir, "d")
        datagram_input = DatagramInput(path, None, 65536, False, intake)
        datagram_input.start(loop)
        tcp = StreamInput(Transport.TCP, 1 << 20, intake, port=0)
        await tcp.start(loop)

        def mark() -> Any:
            return mark_inputs(datagram_input, [tcp])

        assert mark().reached()  # nothing anywhere

        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sender:
            sender.sendto(messages("d", 1)[0], path)
            queued = mark()
            assert not queued.reached()
            await intake.until(lambda: len(intake.received) == 1)
            assert queued.reached()

        client = connect(Transport.TCP, tcp)
        waiting = mark()
        assert not waiting.reached()  # a client in the listen backlog
        await intake.until(lambda: tcp.connection_count == 1)
        assert waiting.reached()

        client.sendall(messages("s", 1)[0])
        sent = mark()
        assert not sent.reached()  # bytes on an open connection
        await intake.until(lambda: len(intake.framed) == 1)
        assert sent.reached()

        client.close()
        datagram_input.close()
        await tcp.close()
        assert mark().reached()

    run(scenario())


# --- the daemon: a shutdown while a burst waits unread -------------------------------------


@pytest.fixture
def blocked_loop() -> Iterator[Callable[[RunningDaemon], threading.Event]]:
    """Block a daemon's event loop until the returned event is set (or the test ends)."""
    gates: list[threading.Event] = []
    blockers: list[threading.Thread] = []

    def block(daemon: RunningDaemon) -> threading.Event:
        entered, gate = threading.Event(), threading.Event()
        gates.append(gate)

        def hold() -> None:
            entered.set()
            gate.wait(60)

        blocker = threading.Thread(target=daemon.call, args=(hold, 60), daemon=True)
        blocker.start()
        blockers.append(blocker)
        assert entered.wait(60)
        return gate

    yield block
    for gate in gates:
        gate.set()
    for blocker in blockers:
        blocker.join(60)


def test_a_daemon_stopped_with_a_burst_unread_reads_delivers_and_counts_it(
    mock_cluster: MockCluster,
    unique_topic: Callable[[str], str],
    socket_dir: str,
    blocked_loop: Callable[[RunningDaemon], threading.Event],
) -> None:
    topic = unique_topic("drain")
    mock_cluster.create_topic(topic, 4)
    config = DaemonConfig(mock_cluster.bootstrap_servers, socket_dir)
    daemon = RunningDaemon(config).start()
    sent = {
        "unix_dgram": [b"d%d" % i for i in range(QUEUED_DATAGRAMS)],
        "unix_stream": [b"s%d" % i for i in range(500)],
        "tcp": [b"t%d" % i for i in range(500)],
    }
    early = UnixStreamSender(config.stream_path)
    try:
        early.send(topic, b"warm-up")
        wait_until(lambda: daemon.snapshot()["topics"].get(topic, {}).get("delivered") == 1)
        gate = blocked_loop(daemon)
        with DatagramSender(config.datagram_path) as dgram:
            for value in sent["unix_dgram"]:
                dgram.send(topic, value)
        early.send_many(encode_any_partition(topic, value) for value in sent["unix_stream"])
        with TcpSender(daemon.tcp_port) as tcp:  # waits in the backlog: the loop is blocked
            tcp.send_many(encode_any_partition(topic, value) for value in sent["tcp"])
        with socket.create_connection(("127.0.0.1", daemon.tcp_port)) as partial:
            partial.sendall(encode_any_partition(topic, b"cut short")[:12])
        daemon.server.request_shutdown()  # queued behind the blocked loop's current call
        gate.set()
    finally:
        daemon.stop()
        early.close()
    snapshot = daemon.server.snapshot()
    assert snapshot["received"] == {
        "unix_dgram": len(sent["unix_dgram"]),
        "unix_stream": 1 + len(sent["unix_stream"]),
        "tcp": len(sent["tcp"]),
    }
    total = 1 + sum(len(values) for values in sent.values())
    assert snapshot["topics"][topic]["delivered"] == total
    assert {reason: n for reason, n in snapshot["discards"].items() if n} == {
        "unclean_disconnect": 1
    }
    assert_balanced(snapshot)
    values = {record.value for record in consume_all(mock_cluster.bootstrap_servers, topic, total)}
    assert values == {b"warm-up"}.union(*map(set, sent.values()))


class Hammer(threading.Thread):
    """A client sending one message after another until the daemon refuses; it records
    exactly what the kernel accepted from it."""

    def __init__(self, family_type: int, path: str, payloads: Iterator[bytes], limit: int):
        super().__init__(daemon=True)
        self.sock = socket.socket(socket.AF_UNIX, family_type)
        self.sock.settimeout(60)
        self.path = path
        self.payloads = payloads
        self.limit = limit
        self.accepted: list[bytes] = []  # whole sends, in order (datagrams)
        self.accepted_bytes = bytearray()  # the stream, as far as the kernel took it
        self.warmed_up = threading.Event()
        self.refusal: OSError | None = None

    def run(self) -> None:
        stream = self.sock.type == socket.SOCK_STREAM
        with self.sock:
            self.sock.connect(self.path)
            for count, data in enumerate(self.payloads):
                if count == 1000:
                    self.warmed_up.set()
                if count == self.limit:
                    return
                try:
                    if stream:
                        sent = self.sock.send(data)
                        self.accepted_bytes += data[:sent]
                        while sent < len(data):
                            more = self.sock.send(data[sent:])
                            self.accepted_bytes += data[sent : sent + more]
                            sent += more
                    else:
                        self.sock.send(data)
                        self.accepted.append(data)
                except OSError as error:
                    self.refusal = error
                    self.warmed_up.set()
                    return


def test_clients_sending_through_a_shutdown_lose_nothing_the_kernel_accepted(
    mock_cluster: MockCluster, unique_topic: Callable[[str], str], socket_dir: str
) -> None:
    """UNIX clients hammer the daemon while it stops. Every datagram send that succeeded
    and every stream byte the kernel took is read and counted: once the inputs are shut
    for reading, a send fails (EPIPE) instead of vanishing."""
    topic = unique_topic("hammer")
    mock_cluster.create_topic(topic, 4)
    config = DaemonConfig(mock_cluster.bootstrap_servers, socket_dir, tcp_port=None)
    limit = 200_000
    daemon = RunningDaemon(config).start()
    datagrams = Hammer(
        socket.SOCK_DGRAM,
        config.datagram_path,
        (encode_any_partition(topic, b"d%d" % i) for i in range(limit + 1)),
        limit,
    )
    stream = Hammer(
        socket.SOCK_STREAM,
        config.stream_path,
        (encode_any_partition(topic, b"s%d" % i) for i in range(limit + 1)),
        limit,
    )
    try:
        for hammer in (datagrams, stream):
            hammer.start()
        for hammer in (datagrams, stream):
            assert hammer.warmed_up.wait(60)
    finally:
        daemon.stop()
    for hammer in (datagrams, stream):
        hammer.join(60)
        assert not hammer.is_alive()
    snapshot = daemon.server.snapshot()
    framer_messages, remainder = split_frames(bytes(stream.accepted_bytes))
    assert snapshot["received"]["unix_dgram"] == len(datagrams.accepted)
    assert snapshot["received"]["unix_stream"] == framer_messages
    unclean = snapshot["discards"].get("unclean_disconnect", 0)
    assert unclean == (1 if remainder else 0)
    books = snapshot["topics"][topic]
    assert books["accepted"] == len(datagrams.accepted) + framer_messages
    assert books["in_flight"] == 0
    assert_balanced(snapshot)


def split_frames(data: bytes) -> tuple[int, bytes]:
    """How many whole Dory messages ``data`` holds, and the bytes left after them."""
    count, offset = 0, 0
    while len(data) - offset >= 4:
        size = int.from_bytes(data[offset : offset + 4], "big")
        if len(data) - offset < size:
            break
        offset += size
        count += 1
    return count, data[offset:]
