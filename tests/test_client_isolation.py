"""One client holding half-sent frames cannot cost another client its messages (issue 33,
point 1), on a real ``pydory serve`` (librdkafka's mock cluster behind it).

The probe: a hostile client (uid ``nobody``, a forked process of its own) opens many TCP
connections, each sending a large frame minus its last byte and then nothing; a normal
client (this process's uid) sends ordinary messages over the UNIX stream socket. Before
issue 33 the hostile frames filled the pool (86 % of the normal sender's messages met
``no_memory``); now the hostile uid holds at most its share of the pool (half of it,
being the one client holding any), the normal sender loses nothing, the daemon's RSS stays
within ``maxBuffer`` plus ``RSS_CONSTANT`` of what it was before the probe, and the pool is
whole again when the hostile connections close.

Two uids need root (the tests run as root here and in CI). Without root the hostile
process runs as this process's uid: the test then still shows that one client's partial
frames leave the pool room for messages (what the share guarantees whoever sends them),
not that the two uids are told apart.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import select
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from daemon_process import DaemonProcess
from helpers import wait_until
from hotpaths import module_fixture
from pydory.wire import encode_any_partition
from pydory_tools.testing.daemon_config import DaemonConfig
from pydory_tools.testing.mock_cluster import MockCluster

# Every test here runs on the compiled hot path and on the pure-Python one (issue 25).
implementation = module_fixture()

pytestmark = pytest.mark.slow

MAX_BUFFER = 8 * 1024 * 1024
HOSTILE_CONNECTIONS = 128
HOSTILE_FRAME_BYTES = 512 * 1024  # each connection sends all of it but the last byte
NORMAL_MESSAGES = 5000
#: What the daemon's RSS may grow by beyond maxBuffer under the probe: the hostile
#: connections' objects, the normal sender's bursts in flight, the allocator's slack.
RSS_CONSTANT = 24 * 1024 * 1024


#: The hostile child's safety net: it gives up sending after this long if the test never
#: says its share is held (the test then fails on its own wait).
HOSTILE_SAFETY_NET_S = 300  # not a deadline: a far-off safety net


def hostile_client(port: int, partial: bytes, held: int, hold: int) -> None:
    """The hostile client, in a forked child (as nobody when it may switch: no exec, so no
    file it must be allowed to read): connects, and sends what the kernel takes of its
    partial frame on each connection without blocking, until the test says (a byte on
    ``held``) that the daemon's books show it at its share; then holds them all until
    ``hold`` is closed."""
    user = hostile_user()
    if user is not None:
        os.setgroups([])
        os.setresgid(user, user, user)
        os.setresuid(user, user, user)
    socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(HOSTILE_CONNECTIONS)]
    sent = [0] * len(socks)
    for sock in socks:
        sock.setblocking(False)
    give_up = time.monotonic() + HOSTILE_SAFETY_NET_S
    while time.monotonic() < give_up:
        for i, sock in enumerate(socks):
            with contextlib.suppress(BlockingIOError):
                sent[i] += sock.send(partial[sent[i] :])
        # The daemon reads a paused connection again as room comes: keep offering bytes
        # until the test has seen the share held (an event, not a count of tries).
        if select.select([held], [], [], 0.01)[0]:
            break
    os.read(hold, 1)  # b"" when the test closes its end


def hostile_user() -> int | None:
    """The uid the hostile client runs as: nobody's when this process may switch."""
    return pwd.getpwnam("nobody").pw_uid if os.geteuid() == 0 else None


def start_hostile(port: int, partial: bytes, at_share: Callable[[], bool]) -> tuple[int, int]:
    """Fork the hostile client, let it send until ``at_share`` (the daemon's books show it
    holding its share), then tell it to hold; its pid and the descriptor whose closing
    ends it."""
    held_r, held_w = os.pipe()
    hold_r, hold_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        code = 1
        try:
            os.close(held_w)
            os.close(hold_w)
            hostile_client(port, partial, held_r, hold_r)
            code = 0
        finally:
            os._exit(code)
    os.close(held_r)
    os.close(hold_r)
    try:
        wait_until(at_share, timeout_s=HOSTILE_SAFETY_NET_S, what="the hostile share held")
        os.write(held_w, b"h")
    except BaseException:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(hold_w)
        raise
    finally:
        os.close(held_w)
    return pid, hold_w


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def topic_books(daemon: DaemonProcess, topic: str) -> dict[str, Any]:
    return next((t for t in daemon.books()["topics"] if t["topic"] == topic), {})


def pool_used(daemon: DaemonProcess) -> int:
    used: int = daemon.books()["pool"]["used"]
    return used


def shares(daemon: DaemonProcess) -> dict[str, int]:
    """The clients' shares of the pool, as /books/json shows them."""
    found: dict[str, int] = daemon.books()["pool"]["shares"]
    return found


def delivered(daemon: DaemonProcess, topic: str, count: int) -> Callable[[], bool]:
    return lambda: topic_books(daemon, topic).get("delivered") == count


def test_a_client_holding_partial_frames_costs_another_nothing(
    mock_cluster: MockCluster,
    unique_topic: Callable[[str], str],
    tmp_path_factory: pytest.TempPathFactory,
    tmp_path: Path,
) -> None:
    topic = unique_topic("isolation")
    mock_cluster.create_topic(topic, 2)
    config = DaemonConfig(
        mock_cluster.bootstrap_servers,
        str(tmp_path_factory.mktemp("iso", numbered=True)),
        unix_datagram=False,
        max_buffer=str(MAX_BUFFER),
        max_stream_msg_size="1m",
    )
    daemon = DaemonProcess(config, tmp_path / "pydory.xml", tmp_path / "pydory.log")
    hostile: tuple[int, int] | None = None
    try:
        baseline = rss_bytes(daemon.process.pid)
        frame = encode_any_partition(topic, b"h" * (HOSTILE_FRAME_BYTES - 64))
        assert config.tcp_port is not None
        # The hostile uid reaches its share (half the pool) and holds it.
        hostile = start_hostile(
            config.tcp_port, frame[:-1], lambda: pool_used(daemon) >= MAX_BUFFER // 2
        )
        assert shares(daemon)["largest_held"] >= MAX_BUFFER // 2

        # The normal sender, another uid on another transport: loses nothing.
        message = encode_any_partition(topic, b"n" * 100)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as normal:
            normal.connect(config.stream_path)
            for _ in range(NORMAL_MESSAGES // 100):
                normal.sendall(message * 100)
        wait_until(delivered(daemon, topic, NORMAL_MESSAGES), what="the normal sender's messages")
        books = topic_books(daemon, topic)
        assert books["accepted"] == NORMAL_MESSAGES
        assert books["discarded"] == {}, books
        # The hostile frames are held within the share (a byte per connection over).
        assert pool_used(daemon) <= MAX_BUFFER // 2 + HOSTILE_CONNECTIONS
        assert rss_bytes(daemon.process.pid) <= baseline + MAX_BUFFER + RSS_CONSTANT

        # Closed: every byte held for them is returned to the pool.
        pid, hold = hostile
        hostile = None
        os.close(hold)
        assert os.waitpid(pid, 0)[1] == 0
        # Within PARTIAL_FRAME_WAIT_S: a connection paused at its client's share reads
        # nothing (its close is unseen) until its time is up.
        wait_until(lambda: pool_used(daemon) == 0, what="the hostile frames released")
    finally:
        if hostile is not None:
            os.kill(hostile[0], signal.SIGKILL)
            os.waitpid(hostile[0], 0)
            os.close(hostile[1])
        daemon.stop()


def send_as(uid: int, port: int, data: bytes, times: int) -> int:
    """Send ``data`` ``times`` times on a TCP connection to the daemon's ``port``, from a
    forked child running as ``uid`` before it connects (a client of its own: the daemon
    names a connection by the uid that made its socket); its exit status (0: all sent)."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            with socket.create_connection(("127.0.0.1", port)) as connection:
                for _ in range(times):
                    connection.sendall(data)
            code = 0
        finally:
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def test_a_client_whose_messages_queue_stops_at_its_share_and_costs_another_nothing(
    mock_cluster: MockCluster,
    unique_topic: Callable[[str], str],
    tmp_path_factory: pytest.TempPathFactory,
    tmp_path: Path,
) -> None:
    """Messages accepted and queued count in their client's share as partial frames do
    (issue 33, point 1, ``books/charges.py``): a client whose messages wait for a broker
    that is down holds its share and no more (its next messages are ``no_memory``
    discards, counted apart), while another client's are all accepted and delivered; and
    every share is given back when the broker returns and everything settles."""
    held_topic, topic = unique_topic("held"), unique_topic("served")
    mock_cluster.create_topic(held_topic, 1)
    mock_cluster.set_partition_leader(held_topic, 0, 3)
    mock_cluster.create_topic(topic, 2)
    for partition, broker in enumerate((1, 2)):
        mock_cluster.set_partition_leader(topic, partition, broker)
    config = DaemonConfig(
        mock_cluster.bootstrap_servers,
        str(tmp_path_factory.mktemp("iso", numbered=True)),
        max_buffer=str(MAX_BUFFER),
        # The held messages wait for broker 3 far longer than the test takes.
        librdkafka={"message.timeout.ms": "600000"},
    )
    other_uid = hostile_user()
    if other_uid is None:
        pytest.skip("the second client needs a uid of its own: switching needs root")
    daemon = DaemonProcess(config, tmp_path / "pydory.xml", tmp_path / "pydory.log")
    held_message = encode_any_partition(held_topic, b"q" * 4000)
    down = False
    try:
        mock_cluster.broker_down(3)
        down = True
        # The held client (the datagram socket's senders, one client of the shares)
        # sends until the books show it at its share and its messages refused for it.
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as dgram:
            dgram.connect(config.datagram_path)

            def at_share() -> bool:
                for _ in range(100):
                    dgram.send(held_message)
                discards = topic_books(daemon, held_topic).get("discarded", {})
                return bool(discards.get("no_memory"))

            wait_until(at_share, timeout_s=300, what="the held client at its share")
        share = shares(daemon)
        assert share["clients"] == 1
        assert MAX_BUFFER // 2 <= share["largest_held"] <= MAX_BUFFER // 2 + 100 * 4100
        assert daemon.counters()["no_memory_client_share"] > 0

        # Another client (another uid, over TCP: the datagram senders are charged to their
        # uid on the compiled readers, and ours is the held one): every message accepted
        # and delivered, though the pool holds the first client's share meanwhile.
        message = encode_any_partition(topic, b"n" * 100)
        assert config.tcp_port is not None
        status = send_as(other_uid, config.tcp_port, message * 100, NORMAL_MESSAGES // 100)
        assert status == 0, "the other client's connection failed"
        wait_until(delivered(daemon, topic, NORMAL_MESSAGES), what="the other client's messages")
        books = topic_books(daemon, topic)
        assert books["accepted"] == NORMAL_MESSAGES
        assert books["discarded"] == {}, books

        # The broker returns: the held messages are delivered, every share given back.
        mock_cluster.broker_up(3)
        down = False

        def held_delivered() -> bool:
            held = topic_books(daemon, held_topic)
            return held["in_flight"] == 0 and held["delivered"] == held["accepted"] > 0

        wait_until(held_delivered, timeout_s=300, what="the held messages delivered")
        wait_until(lambda: shares(daemon)["clients"] == 0, what="every share given back")
        assert pool_used(daemon) == 0
        assert shares(daemon)["largest_held"] == 0
    finally:
        if down:
            mock_cluster.broker_up(3)
        daemon.stop()
