"""A client is a uid on every transport (issue 21 item 5): what the kernel says about the
other end of a socket (pydory.daemon.inputs.peers), its parsers held to "parse or raise
PeerLookupError" on any input, and the quotas keyed on it with real sockets: eight TCP
connections of one uid are one client, a connection of another uid is another, and a
datagram sender over its quota has its datagrams handed on as over quota (discarded by
the intake), another sender untouched.

The tests that need a second uid run a client process as ``nobody`` (65534) and are
skipped unless the test runs as root.
"""

from __future__ import annotations

import asyncio
import os
import socket
import struct
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import pytest
import uvloop
from hypothesis import given, settings
from hypothesis import strategies as st

from hotpaths import datagram_fixture
from pydory.config.model import ClientRate, ListenerQuotas, QuotasConfig
from pydory.daemon.books.events import Transport
from pydory.daemon.inputs import peers
from pydory.daemon.inputs.datagram import DatagramInput
from pydory.daemon.inputs.peers import (
    PeerLookupError,
    TcpSocketEntry,
    diag_reply_uid,
    diag_request,
    loopback_tcp_owner,
    parse_proc_net_tcp,
)
from pydory.daemon.inputs.quotas import DatagramQuota, RateWindow
from pydory.daemon.inputs.stream import StreamInput
from pydory.errors import ClientProtocolError
from pydory.wire import encode_any_partition

NOBODY = 65534
datagram_implementation = datagram_fixture()
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="a second uid needs root")

# --- the parsers: parse or raise PeerLookupError, never anything else -----------------------


@given(st.binary(max_size=200))
@settings(max_examples=500, deadline=None)
def test_a_diag_reply_parses_or_raises_our_error(reply: bytes) -> None:
    try:
        uid = diag_reply_uid(reply)
    except PeerLookupError:
        return
    assert 0 <= uid <= 0xFFFFFFFF


@given(st.lists(st.text(max_size=160), max_size=8))
@settings(max_examples=500, deadline=None)
def test_proc_net_tcp_parses_or_raises_our_error(lines: list[str]) -> None:
    try:
        entries = list(parse_proc_net_tcp("\n".join(lines)))
    except PeerLookupError:
        return
    assert all(0 <= entry.uid <= 0xFFFFFFFF for entry in entries)


def proc_line(n: int, entry: TcpSocketEntry) -> str:
    """One line as the kernel prints it (net/ipv4/tcp_ipv4.c, net/ipv6/tcp_ipv6.c)."""

    def address(host: str, port: int) -> str:
        packed = socket.inet_pton(socket.AF_INET6 if ":" in host else socket.AF_INET, host)
        words = struct.unpack(f"={len(packed) // 4}I", packed)
        return "".join(f"{word:08X}" for word in words) + f":{port:04X}"

    local, remote = address(*entry.local), address(*entry.remote)
    return (
        f"{n:4d}: {local} {remote} 01 00000000:00000000 00:00000000 00000000 "
        f"{entry.uid:5d}        0 {1000 + n} 1 0000000000000000 20 4 30 10 -1"
    )


hosts = st.one_of(st.ip_addresses(v=4).map(str), st.ip_addresses(v=6).map(str))
entries = st.builds(
    TcpSocketEntry,
    st.tuples(hosts, st.integers(0, 65535)),
    st.tuples(hosts, st.integers(0, 65535)),
    st.integers(0, 0xFFFFFFFF),
)


def comparable(entry: TcpSocketEntry) -> tuple[bytes, int, bytes, int, int]:
    (host, port), (remote_host, remote_port) = entry.local, entry.remote
    return (packed(host), port, packed(remote_host), remote_port, entry.uid)


def packed(host: str) -> bytes:
    return socket.inet_pton(socket.AF_INET6 if ":" in host else socket.AF_INET, host)


@given(st.lists(entries, max_size=10))
@settings(max_examples=200, deadline=None)
def test_proc_net_tcp_lines_the_kernel_prints_read_back(table: list[TcpSocketEntry]) -> None:
    header = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt"
    text = "\n".join([header, *(proc_line(n, e) for n, e in enumerate(table))]) + "\n"
    assert [comparable(e) for e in parse_proc_net_tcp(text)] == [comparable(e) for e in table]


def test_a_diag_error_reply_is_our_error() -> None:
    error = struct.pack("=IHHII", 36, peers.NLMSG_ERROR, 0, 1, 0) + struct.pack("=i", -2)
    error += b"\0" * 16
    with pytest.raises(PeerLookupError, match="ENOENT"):
        diag_reply_uid(error)
    request = diag_request(socket.AF_INET, ("127.0.0.1", 5000), ("127.0.0.1", 6000))
    assert len(request) == 16 + 56
    assert struct.unpack_from("=I", request)[0] == len(request)


# --- the kernel's answers on real sockets -----------------------------------------------------


@pytest.fixture
def loopback_pair() -> tuple[socket.socket, socket.socket, socket.socket]:
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    accepted, _ = listener.accept()
    return listener, client, accepted


@pytest.mark.parametrize("way", ["sock_diag", "proc_net_tcp"])
def test_the_owner_of_a_loopback_client_is_the_clients_uid(
    loopback_pair: tuple[socket.socket, ...], way: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _listener, client, accepted = loopback_pair
    if way == "proc_net_tcp":

        def no_netlink(*args: object) -> int:
            raise OSError("no sock_diag here")

        monkeypatch.setattr(peers, "_diag_owner", no_netlink)
    try:
        assert loopback_tcp_owner(accepted) == os.getuid()
        client.close()
        accepted.close()
        assert loopback_tcp_owner(accepted) is None  # gone: the kernel does not say
    finally:
        for sock in loopback_pair:
            sock.close()


def forked(work: Callable[[], None], uid: int | None = None) -> int:
    """Run ``work`` in a child process (as ``uid`` if given: the venv's interpreter may not
    be readable by another user, so no exec); its pid."""
    pid = os.fork()
    if pid == 0:  # the child: no test machinery, straight out
        code = 1
        try:
            if uid is not None:
                os.setuid(uid)
            work()
            code = 0
        finally:
            os._exit(code)
    return pid


def exit_status(pid: int) -> int:
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


@as_root
def test_a_client_of_another_uid_is_told_apart(loopback_pair: tuple[socket.socket, ...]) -> None:
    listener = loopback_pair[0]

    def say_hello() -> None:
        with socket.create_connection(listener.getsockname()) as sock:
            sock.sendall(b"hello")
            sock.recv(1)

    child = forked(say_hello, NOBODY)
    try:
        accepted, _ = listener.accept()
        with accepted:
            assert loopback_tcp_owner(accepted) == NOBODY
            assert loopback_tcp_owner(loopback_pair[2]) == os.getuid()
            accepted.sendall(b"x")
        assert exit_status(child) == 0
    finally:
        for sock in loopback_pair:
            sock.close()


# --- eight TCP connections of one uid are one client ---------------------------------------

MESSAGE = encode_any_partition("t", b"x" * 90)  # 100 bytes on the wire


@dataclass
class CountingIntake:
    """The inputs' Intake: counts what it is handed (whole, over quota)."""

    frames_seen: int = 0
    datagrams_seen: list[bytes] = field(default_factory=list)
    over_quota_seen: list[bytes] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def datagrams(self, burst: Sequence[bytes], client: object = None) -> None:
        self.datagrams_seen += burst
        self.changed.set()

    def over_quota(self, burst: Sequence[bytes]) -> None:
        self.over_quota_seen += burst
        self.changed.set()

    def datagram_too_large(self, size: int, prefix: bytes) -> None:
        raise AssertionError("no datagram too large here")

    def frames(self, burst: Sequence[bytes], transport: Transport, client: object = None) -> None:
        self.frames_seen += len(burst)
        self.changed.set()

    def broken_stream(self, error: ClientProtocolError, transport: Transport) -> None:
        raise AssertionError(f"a broken stream: {error}")

    def unclean_disconnect(self, prefix: bytes, transport: Transport) -> None:
        raise AssertionError("an unclean disconnect")

    def connection_opened(self, transport: Transport) -> None:
        self.changed.set()

    def connection_closed(self, transport: Transport, error: BaseException | None = None) -> None:
        self.changed.set()

    async def until(self, condition: object, timeout_s: float = 60) -> None:
        assert callable(condition)
        async with asyncio.timeout(timeout_s):
            while not condition():
                self.changed.clear()
                await self.changed.wait()


def test_eight_tcp_connections_of_one_uid_are_one_client_held_to_one_quota() -> None:
    """Old code: eight clients, each with its own window, none throttled (each sent
    well within its quota); here one client whose window holds all eight's bytes."""
    connections, per_connection = 8, 10  # 1 kB each: within 2 kB of credit alone
    quota_bps, window_ms = 20_000, 100

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        intake = CountingIntake()
        rate = ListenerQuotas(client_rate=ClientRate(bytes_per_sec=quota_bps, window_ms=window_ms))
        stream_input = StreamInput(
            Transport.TCP, 1 << 20, intake, port=0, quotas=QuotasConfig(tcp=rate)
        )
        await stream_input.start(loop)
        clients = []
        for _ in range(connections):
            sock = socket.socket()
            sock.setblocking(False)
            await loop.sock_connect(sock, ("127.0.0.1", stream_input.port))
            clients.append(sock)
        await intake.until(lambda: stream_input.connection_count == connections)
        assert stream_input.quota.connections_by_client() == {("uid", os.getuid()): connections}
        for sock in clients:
            await loop.sock_sendall(sock, MESSAGE * per_connection)
        total = connections * per_connection
        await intake.until(lambda: intake.frames_seen == total)
        # 8 kB against 2 kB of credit at 20 kB/s: throttled, about 0.3 s in all.
        assert any(c.throttled for c in stream_input.connections())
        assert stream_input.quota.stats.throttles >= 1
        for sock in clients:
            sock.close()
        await intake.until(lambda: stream_input.connection_count == 0)
        assert stream_input.quota.clients == 0
        await stream_input.close()

    uvloop.run(scenario())


# --- datagrams: a sender over its quota is discarded, another untouched ------------------------


def test_a_datagram_quota_admits_a_window_then_refuses_and_forgets_nothing_owed() -> None:
    quota = DatagramQuota(ClientRate(msgs_per_sec=10, window_ms=1000))
    assert [quota.admits(1, 100.0, 50) for _ in range(12)].count(True) == 10
    assert quota.discarded == 2
    assert quota.admits(2, 100.0, 50)  # another uid: its own window
    assert not quota.admits(1, 100.05, 50)
    assert quota.admits(1, 100.1, 50)  # 0.1 s later: one message's worth paid
    both = DatagramQuota(ClientRate(bytes_per_sec=100, msgs_per_sec=10, window_ms=1000))
    assert not both.admits(1, 0.0, 101)  # bytes over: neither window charged
    assert all(both.admits(1, 0.0, 10) for _ in range(10))
    window = RateWindow(10, 1.0)
    assert window.fits(0.0, 10)
    assert not window.fits(0.0, 1)


@pytest.fixture
def shared_dir() -> Iterator[str]:
    """A directory another uid can reach (pytest's own are the test user's alone)."""
    with tempfile.TemporaryDirectory(prefix="pydory-q", dir="/tmp") as path:
        os.chmod(path, 0o777)
        yield path


@pytest.mark.usefixtures("datagram_implementation")
@pytest.mark.parametrize("other_uid", [pytest.param(NOBODY, marks=as_root), None])
def test_a_datagram_sender_over_its_quota_is_discarded_another_is_not(
    shared_dir: str, other_uid: int | None
) -> None:
    """Old code: no datagram quota (DatagramInput takes none). Here: the first sender's
    datagrams beyond its window's worth go to ``over_quota``; a second uid's do not."""
    flood, polite = 300, 20
    credit = 50  # msgsPerSec 5 over a 10 s window: 50 at once, then 5 a second

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        intake = CountingIntake()
        path = os.path.join(shared_dir, "d")
        datagram_input = DatagramInput(
            path, 0o777, 1024, False, intake, quota=ClientRate(msgs_per_sec=5, window_ms=10_000)
        )
        datagram_input.start(loop)

        async def send(count: int, value: bytes, uid: int | None) -> None:
            message = encode_any_partition("t", value)

            def send_all() -> None:
                with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                    for _ in range(count):
                        sock.sendto(message, path)

            child = forked(send_all, uid)
            assert await loop.run_in_executor(None, exit_status, child) == 0

        began = loop.time()
        await send(flood, b"flood", None)
        await intake.until(
            lambda: len(intake.datagrams_seen) + len(intake.over_quota_seen) == flood
        )
        elapsed = loop.time() - began
        admitted = len(intake.datagrams_seen)
        assert credit <= admitted <= credit + 5 * elapsed + 1
        assert len(intake.over_quota_seen) == flood - admitted
        assert datagram_input.quota is not None
        assert datagram_input.quota.discarded == flood - admitted
        if other_uid is not None:
            before = admitted
            await send(polite, b"polite", other_uid)
            await intake.until(lambda: len(intake.datagrams_seen) >= before + polite)
            assert sum(b"polite" in d for d in intake.datagrams_seen) == polite
        # No quota any more (a reload): everything admitted again, credentials not asked.
        datagram_input.set_quota(ClientRate())
        over = len(intake.over_quota_seen)
        await send(100, b"free", None)
        await intake.until(lambda: sum(b"free" in d for d in intake.datagrams_seen) == 100)
        assert len(intake.over_quota_seen) == over
        datagram_input.close()

    uvloop.run(scenario())
