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


def hostile_client(port: int, partial: bytes, ready: int, hold: int) -> None:
    """The hostile client, in a forked child (as nobody when it may switch: no exec, so no
    file it must be allowed to read): connects, sends what the kernel takes of its
    partial frame on each connection without blocking, says it is ready, and holds them
    all until ``hold`` is closed."""
    user = hostile_user()
    if user is not None:
        os.setgroups([])
        os.setresgid(user, user, user)
        os.setresuid(user, user, user)
    socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(HOSTILE_CONNECTIONS)]
    sent = [0] * len(socks)
    for sock in socks:
        sock.setblocking(False)
    for _ in range(100):  # bounded: what the kernel takes in ~1 s is plenty
        for i, sock in enumerate(socks):
            with contextlib.suppress(BlockingIOError):
                sent[i] += sock.send(partial[sent[i] :])
        if all(n == len(partial) for n in sent):
            break
        time.sleep(0.01)
    os.write(ready, b"r")
    os.read(hold, 1)  # b"" when the test closes its end


def hostile_user() -> int | None:
    """The uid the hostile client runs as: nobody's when this process may switch."""
    return pwd.getpwnam("nobody").pw_uid if os.geteuid() == 0 else None


def start_hostile(port: int, partial: bytes) -> tuple[int, int]:
    """Fork the hostile client; its pid and the descriptor whose closing ends it, once it
    holds its connections."""
    ready_r, ready_w = os.pipe()
    hold_r, hold_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        code = 1
        try:
            os.close(ready_r)
            os.close(hold_w)
            hostile_client(port, partial, ready_w, hold_r)
            code = 0
        finally:
            os._exit(code)
    os.close(ready_w)
    os.close(hold_r)
    try:
        assert os.read(ready_r, 1) == b"r", "the hostile client failed"
    finally:
        os.close(ready_r)
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
        hostile = start_hostile(config.tcp_port, frame[:-1])
        # The hostile uid reaches its share (half the pool) and holds it.
        wait_until(lambda: pool_used(daemon) >= MAX_BUFFER // 2, what="the hostile share held")

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
