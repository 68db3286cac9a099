"""The status port under hostile clients: timeouts, the connection cap, quiet error logs.

Every test talks to a real daemon's status port over loopback sockets, with the limits of
``pydory.status.limits`` shrunk (DEFAULT_LIMITS, read when the daemon makes its status
server) so that each test takes a second or two.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import logging
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import uvloop
from aiohttp.http_exceptions import BadHttpMessage

from helpers import wait_until
from pydory.daemon.books import counters as counter_names
from pydory.status import server as status_server
from pydory.status.limits import QuietRequestErrors, SlotShares, StatusLimits, status_peer
from pydory_tools.testing.daemon import DaemonConfig, RunningDaemon, running_daemon
from pydory_tools.testing.mock_cluster import MockCluster

#: Long enough for a test's client to do what it must before a limit acts on it.
SHORT_S = 1.0
#: Long enough that the limit under test acts first.
LONG_S = 60.0
#: A client gives up waiting for the daemon's close after this long (the old code never
#: closed: it kept such connections for aiohttp's default 3,630 s). A far-off net: the
#: limits under test act after SHORT_S or 5 s, so only a daemon that never closes reaches it.
CLIENT_PATIENCE_S = 60.0
CAP = 8


@contextmanager
def daemon_with(
    monkeypatch: pytest.MonkeyPatch,
    mock_cluster: MockCluster,
    socket_dir: str,
    limits: StatusLimits,
) -> Iterator[RunningDaemon]:
    monkeypatch.setattr(status_server, "DEFAULT_LIMITS", limits)
    config = DaemonConfig(mock_cluster.bootstrap_servers, socket_dir)
    with running_daemon(config) as running:
        yield running


@pytest.fixture
def socket_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    # UNIX socket paths are limited to ~108 bytes: keep them short.
    return str(tmp_path_factory.mktemp("s", numbered=True))


def port_of(daemon: RunningDaemon) -> int:
    status = daemon.server.status
    assert status is not None
    return status.port


def counters(port: int) -> dict[str, int]:
    got = counters_unless_refused(port)
    assert got is not None, "the status port refused the connection"
    return got


def counters_unless_refused(port: int) -> dict[str, int] | None:
    """/counters/json by name, or None if the connection was refused (above the cap)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=CLIENT_PATIENCE_S)
    try:
        connection.request("GET", "/counters/json")
        response = connection.getresponse()
        if response.status == 503:
            return None
        assert response.status == 200
        return {c["name"]: c["value"] for c in json.loads(response.read())["counters"]}
    finally:
        connection.close()


def closed_by_daemon(sock: socket.socket) -> bool:
    """Reads until the daemon closes ``sock`` (True), or CLIENT_PATIENCE_S passes."""
    sock.settimeout(CLIENT_PATIENCE_S)
    try:
        while sock.recv(4096):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        pass
    return True


def test_a_half_sent_request_is_closed_after_the_header_timeout(
    monkeypatch: pytest.MonkeyPatch, mock_cluster: MockCluster, socket_dir: str
) -> None:
    limits = StatusLimits(header_timeout_s=SHORT_S, idle_timeout_s=LONG_S, max_connections=CAP)
    with daemon_with(monkeypatch, mock_cluster, socket_dir, limits) as daemon:
        port = port_of(daemon)
        with socket.create_connection(("127.0.0.1", port)) as slow:
            opened = time.monotonic()
            slow.sendall(b"GET /counters/json HTTP/1.1\r\nHost: pydory\r\n")  # no blank line
            assert closed_by_daemon(slow)
            assert time.monotonic() - opened >= SHORT_S * 0.9
        wait_until(lambda: counters(port)[counter_names.STATUS_HEADER_TIMEOUTS] == 1)


def test_an_idle_keep_alive_connection_is_closed(
    monkeypatch: pytest.MonkeyPatch, mock_cluster: MockCluster, socket_dir: str
) -> None:
    limits = StatusLimits(header_timeout_s=LONG_S, idle_timeout_s=SHORT_S, max_connections=CAP)
    with daemon_with(monkeypatch, mock_cluster, socket_dir, limits) as daemon:
        connection = http.client.HTTPConnection("127.0.0.1", port_of(daemon), timeout=60)
        try:
            connection.request("GET", "/server_info/json")
            response = connection.getresponse()
            assert response.status == 200
            assert response.getheader("Connection", "keep-alive").lower() == "keep-alive"
            response.read()
            assert connection.sock is not None
            assert closed_by_daemon(connection.sock)
        finally:
            connection.close()


def test_connections_above_the_cap_are_refused_and_counted(
    monkeypatch: pytest.MonkeyPatch, mock_cluster: MockCluster, socket_dir: str
) -> None:
    # The hogs send nothing; the header timeout frees their slots after a few seconds.
    limits = StatusLimits(header_timeout_s=5.0, idle_timeout_s=LONG_S, max_connections=CAP)
    with daemon_with(monkeypatch, mock_cluster, socket_dir, limits) as daemon:
        port = port_of(daemon)
        hogs = [socket.create_connection(("127.0.0.1", port)) for _ in range(CAP)]
        try:
            # The loop accepts in the kernel's order, so these come after every hog.
            for _ in range(5):
                with socket.create_connection(("127.0.0.1", port)) as extra:
                    extra.settimeout(CLIENT_PATIENCE_S)
                    answer = b""
                    while chunk := extra.recv(4096):
                        answer += chunk
                    assert answer.startswith(b"HTTP/1.1 503 ")
                    assert b"too many open status connections" in answer
            # Once the hogs' time is up, the page answers and shows every refusal: the
            # 5 above and those of the polls made while the hogs were still there.
            refused = 5

            def free_again_with_every_refusal_counted() -> bool:
                nonlocal refused
                got = counters_unless_refused(port)
                if got is None:
                    refused += 1
                    return False
                return got[counter_names.STATUS_CONNECTIONS_REFUSED] == refused

            wait_until(free_again_with_every_refusal_counted, timeout_s=CLIENT_PATIENCE_S)
            assert all(closed_by_daemon(hog) for hog in hogs)
            # Waited for, not read once: a page read a moment after the last close could
            # be one rendered before it (PAGE_REUSE_S); seen at load 20 as 1 of 8.
            wait_until(
                lambda: counters(port)[counter_names.STATUS_HEADER_TIMEOUTS] == CAP,
                what=f"{CAP} header timeouts counted",
            )
        finally:
            for hog in hogs:
                hog.close()


def test_malformed_requests_log_a_line_per_kind_not_a_traceback_each(
    monkeypatch: pytest.MonkeyPatch,
    mock_cluster: MockCluster,
    socket_dir: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    limits = StatusLimits(header_timeout_s=LONG_S, idle_timeout_s=LONG_S, max_connections=CAP)
    with daemon_with(monkeypatch, mock_cluster, socket_dir, limits) as daemon:
        port = port_of(daemon)
        caplog.clear()
        for i in range(200):
            with socket.create_connection(("127.0.0.1", port)) as client:
                client.sendall(b"GET / HTTP/1.1\r\nHost: pydory\r\nno colon %d\r\n\r\n" % i)
                client.settimeout(CLIENT_PATIENCE_S)
                answer = b""
                while chunk := client.recv(4096):
                    answer += chunk
                assert answer.split(b" ", 2)[1] == b"400"
        # The status page still answers, and the log holds one short line for all 200.
        assert counters(port)[counter_names.STATUS_CONNECTIONS_REFUSED] == 0
        errors = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(errors) <= 3, [r.getMessage() for r in errors]
        assert all(r.exc_info is None for r in errors)
        assert sum(len(r.getMessage()) for r in errors) < 1000


def test_the_count_of_left_out_errors_is_logged_at_the_intervals_end(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def flood_then_wait_for_the_count() -> None:
        quiet = QuietRequestErrors(interval_s=0.2)
        for i in range(50):
            bad = BadHttpMessage(f"bad header {i}")
            quiet.exception("Error handling request from %s", "127.0.0.1", exc_info=bad)
        deadline = time.monotonic() + CLIENT_PATIENCE_S
        while not any("49 more" in record.getMessage() for record in caplog.records):
            assert time.monotonic() < deadline, "no line with the count"
            await asyncio.sleep(0.01)

    asyncio.run(flood_then_wait_for_the_count())
    lines = [r.getMessage() for r in caplog.records if r.name == "pydory.status.requests"]
    assert lines == [
        "Error handling request from 127.0.0.1: BadHttpMessage: 400, message: bad header 0;"
        " at most one line per 0.2 s for more of this kind",
        "49 more BadHttpMessage from status clients in the last 0.2 s",
    ]
    assert all(record.exc_info is None for record in caplog.records)


def test_the_slots_go_to_the_peers_holding_the_fewest() -> None:
    shares = SlotShares(4)

    assert [shares.claim("greedy") for _ in range(4)] == [(True, None)] * 4
    assert shares.claim("greedy") == (False, None)  # full, and it holds them all
    assert shares.claim("polite") == (True, "greedy")  # the greedy one gives one up
    assert shares.claim("polite") == (True, "greedy")
    assert (shares.held("greedy"), shares.held("polite")) == (2, 2)
    assert shares.claim("polite") == (False, None)  # an even share: nobody gives one up
    assert shares.claim("third") == (True, "greedy")  # 2 is more than 0 + 1
    assert (shares.held("greedy"), shares.held("polite"), shares.held("third")) == (1, 2, 1)
    assert shares.claim("polite") == (False, None)  # no peer holds more than 3
    shares.release("polite")
    assert shares.claim("fourth") == (True, None)
    assert shares.open == 4


def by_source_address(transport: asyncio.BaseTransport) -> object:
    """Peers told apart by their source address (the test's clients share one uid)."""
    return transport.get_extra_info("peername")[0]


def test_a_client_holding_every_status_slot_cannot_starve_another(
    monkeypatch: pytest.MonkeyPatch, mock_cluster: MockCluster, socket_dir: str
) -> None:
    """One client (127.0.0.2) holds every slot with connections that send nothing; the
    header timeout is far off. Before: every other client's request got 503. Now each of
    the polite client's requests is answered, a greedy connection reset for it."""
    limits = StatusLimits(
        header_timeout_s=LONG_S,
        idle_timeout_s=LONG_S,
        max_connections=CAP,
        peer_of=by_source_address,
    )
    with daemon_with(monkeypatch, mock_cluster, socket_dir, limits) as daemon:
        port = port_of(daemon)
        hogs = [
            socket.create_connection(("127.0.0.1", port), source_address=("127.0.0.2", 0))
            for _ in range(CAP)
        ]
        try:
            # The loop accepts in the kernel's order: the polite requests come after
            # every hog. Each is answered.
            answers = [counters_unless_refused(port) for _ in range(5)]
            assert None not in answers
            # The greedy client is the one refused: its oldest connections reset, each
            # counted as refused.
            reset = [hog for hog in hogs if closed_by_daemon_now(hog)]
            assert len(reset) >= 1
            assert reset == hogs[: len(reset)]
            last = answers[-1]
            assert last is not None
            assert last[counter_names.STATUS_CONNECTIONS_REFUSED] == len(reset)
        finally:
            for hog in hogs:
                hog.close()


def closed_by_daemon_now(sock: socket.socket) -> bool:
    """Whether the daemon has closed ``sock`` already (a read would not block)."""
    sock.setblocking(False)
    try:
        return sock.recv(4096) == b""
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True


def test_a_loopback_status_client_is_known_by_its_uid() -> None:
    """As the inputs' quotas know a client (daemon/inputs/peers.py), on the daemon's loop."""

    async def scenario() -> object:
        peers: list[object] = []
        made = asyncio.Event()

        class Recorder(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                peers.append(status_peer(transport))
                made.set()

        server = await asyncio.get_running_loop().create_server(Recorder, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            async with asyncio.timeout(CLIENT_PATIENCE_S):
                await made.wait()
            writer.close()
        return peers[0]

    assert uvloop.run(scenario()) == ("uid", os.getuid())
