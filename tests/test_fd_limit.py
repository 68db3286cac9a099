"""At the file descriptor limit (issue 21 item 6): a real ``pydory serve`` whose
RLIMIT_NOFILE the test lowers (prlimit) to a few dozen above what it holds, then more
UNIX stream clients than that. The daemon says so once (one WARNING line when the episode
starts), counts it (``accept_fd_limit_episodes``, ``accept_fd_limit_refused``), keeps its
status port answering (the reserve of descriptors it lets go at the limit: this test
reads every figure through ``/counters/json``), and loses no client: those it could not
accept wait in the listen backlog and are read once descriptors are free again, when the
episode ends with a second line counting the accepts refused.

Old code (uvloop's accept in libuv): at the limit libuv accepted and closed the waiting
connections itself, unseen; nothing logged, nothing counted, and the status port's
connection was reset.

Then the episode's logic alone (pydory.daemon.inputs.acceptor.FdLimit), on listeners whose
accept the test makes fail: one episode however many refusals and listeners, a listener
opened meanwhile waits with the others, the end once every listener has emptied its
backlog.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import re
import resource
import socket
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import uvloop

from daemon_process import DaemonProcess
from helpers import wait_until
from pydory.daemon.books import counters as counter_names
from pydory.daemon.books.counters import Counters
from pydory.daemon.inputs import acceptor as acceptor_module
from pydory.daemon.inputs.acceptor import RESERVE_FDS, Acceptor, FdLimit
from pydory.wire import encode_any_partition
from pydory_tools.testing.daemon_config import DaemonConfig
from pydory_tools.testing.mock_cluster import MockCluster

#: Descriptors the daemon may open beyond those it holds when the limit is lowered: the
#: reserve and a few dozen connections.
HEADROOM = RESERVE_FDS + 24
#: Clients: well beyond the headroom, well within the listen backlog (1024).
CLIENTS = 120

STARTED = re.compile(r"stream inputs at the file descriptor limit \(EMFILE")
ENDED = re.compile(r"stream inputs accepting again: [\d.]+ s at the file descriptor limit, (\d+)")


@pytest.fixture
def daemon(
    mock_cluster: MockCluster, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[DaemonProcess]:
    socket_dir = str(tmp_path_factory.mktemp("fd", numbered=True))  # UNIX paths are short
    config = DaemonConfig(
        mock_cluster.bootstrap_servers,
        socket_dir,
        tcp_port=None,
        unix_datagram=False,
        log_to_stdout=True,
    )
    process = DaemonProcess(config, tmp_path / "pydory.xml", tmp_path / "pydory.log")
    process.stream_path = config.stream_path  # type: ignore[attr-defined]
    try:
        yield process
    finally:
        process.stop()


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def counter(daemon: DaemonProcess, name: str) -> int:
    return daemon.counters().get(name, 0)


@pytest.mark.slow
def test_at_the_fd_limit_the_daemon_says_so_counts_answers_and_loses_no_client(
    daemon: DaemonProcess, mock_cluster: MockCluster, unique_topic: Callable[[str], str]
) -> None:
    topic = unique_topic("fd")
    mock_cluster.create_topic(topic, 1)
    pid = daemon.process.pid
    limit = open_fds(pid) + HEADROOM
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (limit, limit))
    clients = []
    try:
        for n in range(CLIENTS):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(daemon.stream_path)  # type: ignore[attr-defined]
            sock.sendall(encode_any_partition(topic, b"client %d" % n))
            clients.append(sock)
        # The status port answers at the limit: every figure here comes through it.
        wait_until(
            lambda: counter(daemon, counter_names.ACCEPT_FD_LIMIT_EPISODES) == 1,
            60,
            what="an episode at the fd limit",
        )
        refused = counter(daemon, counter_names.ACCEPT_FD_LIMIT_REFUSED)
        assert refused >= 1
        served = counter(daemon, counter_names.CONNECTION_OPENED["unix_stream"])
        assert served < CLIENTS  # the rest wait in the backlog
        log = daemon.log_path.read_text()
        assert len(STARTED.findall(log)) == 1, log[-3000:]
        assert not ENDED.search(log)
    finally:
        for sock in clients:
            sock.close()
    # Descriptors free again: every client is read (those that waited included), and the
    # episode ends with one line counting the accepts refused.
    received = counter_names.RECEIVED["unix_stream"]
    wait_until(lambda: counter(daemon, received) == CLIENTS, 60, what="every client's message")
    wait_until(lambda: ENDED.search(daemon.log_path.read_text()) is not None, 60, what="the end")
    log = daemon.log_path.read_text()
    ended = ENDED.findall(log)
    assert len(ended) == 1
    assert int(ended[0]) == counter(daemon, counter_names.ACCEPT_FD_LIMIT_REFUSED) >= refused
    assert len(STARTED.findall(log)) == 1
    assert counter(daemon, counter_names.ACCEPT_FD_LIMIT_EPISODES) == 1
    assert "Traceback" not in log


# --- the episode's logic ----------------------------------------------------------------------


class ListeningStub:
    """A listening socket whose accept the test scripts: EMFILE while ``full``, else an
    empty backlog. Its descriptor is a pipe's read end: never readable, so only the test
    and the episode's retry call accept."""

    def __init__(self) -> None:
        self._read_end, self._write_end = os.pipe()
        self.full = True

    def setblocking(self, flag: bool) -> None:
        pass

    def fileno(self) -> int:
        return self._read_end

    def accept(self) -> tuple[socket.socket, object]:
        if self.full:
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        raise BlockingIOError

    def close(self) -> None:
        os.close(self._read_end)
        os.close(self._write_end)


def test_one_episode_however_many_refusals_and_its_end_once_every_listener_drained(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(acceptor_module, "ACCEPT_RETRY_S", 0.01)
    caplog.set_level(logging.WARNING, logger=acceptor_module.__name__)

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        counters = Counters()
        fd_limit = FdLimit(counters, reserve=4)
        stubs = [ListeningStub(), ListeningStub()]
        first, second = (
            Acceptor(loop, stub, asyncio.Protocol, fd_limit)  # type: ignore[arg-type]
            for stub in stubs
        )
        first.accept_waiting()
        second.accept_waiting()  # stopped with the first: not even tried
        assert fd_limit.at_limit
        assert counters.get(counter_names.ACCEPT_FD_LIMIT_EPISODES) == 1
        assert counters.get(counter_names.ACCEPT_FD_LIMIT_REFUSED) == 1
        third_stub = ListeningStub()
        third = Acceptor(loop, third_stub, asyncio.Protocol, fd_limit)  # type: ignore[arg-type]
        stubs.append(third_stub)
        # Still full at the retries: more refusals, the same episode.
        while counters.get(counter_names.ACCEPT_FD_LIMIT_REFUSED) < 3:
            await asyncio.sleep(0.005)
        assert counters.get(counter_names.ACCEPT_FD_LIMIT_EPISODES) == 1
        # Room again, but one listener still meets the limit: the episode goes on.
        stubs[0].full = stubs[2].full = False
        refused = counters.get(counter_names.ACCEPT_FD_LIMIT_REFUSED)
        while counters.get(counter_names.ACCEPT_FD_LIMIT_REFUSED) < refused + 2:
            await asyncio.sleep(0.005)
        assert fd_limit.at_limit
        assert counters.get(counter_names.ACCEPT_FD_LIMIT_EPISODES) == 1
        stubs[1].full = False
        while fd_limit.at_limit:
            await asyncio.sleep(0.005)
        refused = counters.get(counter_names.ACCEPT_FD_LIMIT_REFUSED)
        for listener in (first, second, third):
            listener.close()  # closes its stub
        lines = [r.getMessage() for r in caplog.records]
        assert len(lines) == 2, lines
        assert STARTED.search(lines[0])
        ended = ENDED.search(lines[1])
        assert ended is not None
        assert int(ended[1]) == refused

    uvloop.run(scenario())
