"""Every ``maxDatagramMsgSize`` the config check accepts runs (issue 33, point 4).

At each boundary (64 KiB, 4 MiB, 64 MiB, the largest the check accepts: 2^31 - 1) a
datagram input starts, reads the largest datagrams a client can send it (the kernel sends
a UNIX datagram of about 4 MiB at most, whatever SO_SNDBUF: its buffer is one
allocation), and holds no memory for them once they are handed on: the reader's buffers
are of normal size, a large datagram's memory taken when it arrives and going with it.
Run on both hot paths (tests/hotpaths.py).
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, replace

import pytest
import uvloop

from helpers import DatagramIntake, wait_until
from hotpaths import DATAGRAM_IMPLEMENTATIONS, module_fixture
from pydory.client import DatagramSender
from pydory.daemon.inputs import datagram
from pydory.daemon.inputs.datagram import DatagramInput
from pydory.errors import ConfigError
from pydory_tools.testing.daemon import DaemonConfig, RunningDaemon
from pydory_tools.testing.mock_cluster import MockCluster

implementation = module_fixture(DATAGRAM_IMPLEMENTATIONS)

KIB, MIB = 1024, 1024 * 1024
#: The config's largest maxDatagramMsgSize (config/loader.py's MSG_SIZE: INT32_MAX).
LARGEST_ACCEPTED = 2**31 - 1
#: The largest UNIX datagram sent here (the kernel's limit is a little above it).
LARGEST_SENT = 4 * MIB
#: Datagrams queued at once (the host's net.unix.max_dgram_qlen is at least 10).
QUEUED = 8
#: What the input may still hold once the datagrams are gone, measured after the
#: allocator gave back what is free (resident_when_settled): its buffers of normal size
#: (at most 64 of 256 KiB, and only the pages a read wrote are resident; about 1 MiB is
#: seen) and the loop's own state. Less than three of the datagrams: an input that kept
#: even a few large buffers fails it, as did the old reader with 64 of 4 MiB (RSS 61 ->
#: 668 MB).
IDLE_GROWTH_BOUND = 12 * MIB
SO_SNDBUFFORCE = 32


def resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


_MALLOC_TRIM = getattr(ctypes.CDLL(None), "malloc_trim", None)  # glibc's


def resident_when_settled() -> int:
    """The resident size once freed memory is given back: what is still held, not what the
    allocator keeps. Why: glibc serves 4 MiB blocks from its heap once one mmapped block
    was freed (its mmap threshold rises), and keeps freed heap memory resident; when the
    loop is late and the datagrams of a burst are alive at once, up to QUEUED of them
    stay resident after they went (seen beside a CPU hog per core: 30 MiB).
    ``malloc_trim`` gives every free page back; memory still referenced stays."""
    gc.collect()
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)
    return resident_bytes()


def large_sender() -> socket.socket:
    """A datagram client whose send buffer holds QUEUED of the largest datagrams."""
    client = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        client.setsockopt(socket.SOL_SOCKET, SO_SNDBUFFORCE, 16 * QUEUED * LARGEST_SENT)
    except PermissionError:
        client.close()
        pytest.skip("queueing several 4 MiB datagrams needs CAP_NET_ADMIN (SO_SNDBUFFORCE)")
    return client


@pytest.mark.parametrize("limit", [64 * KIB, 4 * MIB, 64 * MIB, LARGEST_ACCEPTED])
def test_every_accepted_datagram_size_runs_reads_its_datagrams_and_holds_no_memory_idle(
    tmp_path_factory: pytest.TempPathFactory, limit: int
) -> None:
    path = os.path.join(str(tmp_path_factory.mktemp("s", numbered=True)), "d")
    size = min(limit, LARGEST_SENT)
    intake = DatagramIntake(keep_bytes=False)

    async def scenario() -> int:
        before = resident_when_settled()
        datagram_input = DatagramInput(path, None, limit, True, intake)
        datagram_input.start(asyncio.get_running_loop())
        try:
            with large_sender() as client:
                client.connect(path)
                # Sent without yielding: all queued at once, read in one burst.
                for n in range(QUEUED):
                    client.send(bytes([n]) * size)
                if limit < LARGEST_SENT:
                    client.send(b"x" * (limit + 1))
                await intake.until(QUEUED + (limit < LARGEST_SENT))
            return resident_when_settled() - before
        finally:
            datagram_input.close()

    growth = uvloop.run(scenario())

    assert intake.sizes == [size] * QUEUED
    if limit < LARGEST_SENT:
        assert intake.too_large == [(limit + 1, b"x" * 64)]
    else:
        assert intake.too_large == []
    assert growth < IDLE_GROWTH_BOUND, f"{growth / MIB:.0f} MiB held after the datagrams"


def test_a_datagram_too_large_for_a_large_limit_is_reported_with_its_size(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """From LARGE_DATAGRAM_BYTES on the reader peeks each size: one above the limit is
    handed on as too large (its size, its prefix), the ones around it whole, in order."""
    path = os.path.join(str(tmp_path_factory.mktemp("s", numbered=True)), "d")
    limit = datagram.LARGE_DATAGRAM_BYTES + 10
    intake = DatagramIntake(keep_bytes=False)

    async def scenario() -> None:
        datagram_input = DatagramInput(path, None, limit, True, intake)
        datagram_input.start(asyncio.get_running_loop())
        try:
            with large_sender() as client:
                client.connect(path)
                for data in (b"a" * 5, b"b" * limit, b"c" * (limit + 1), b"", b"d" * 70_000):
                    client.send(data)
                await intake.until(5)
        finally:
            datagram_input.close()

    uvloop.run(scenario())

    assert intake.sizes == [5, limit, 0, 70_000]
    assert intake.too_large == [(limit + 1, b"c" * 64)]


def test_a_size_the_reader_cannot_take_is_refused_naming_the_element() -> None:
    if datagram.DatagramReader is None:
        pytest.skip("the pure path has no reader to build")
    with pytest.raises(ConfigError) as refused:
        DatagramInput.check_limits(2**31, True)  # above what the config check accepts
    assert "maxDatagramMsgSize" in str(refused.value)
    assert refused.value.path == datagram.MAX_SIZE_ELEMENT


@dataclass
class LargeDatagramsConfig(DaemonConfig):
    """DaemonConfig with ``allowLargeUnixDatagrams`` on (its render writes it off)."""

    def render(self) -> str:
        rendered = super().render()
        assert rendered.count('<allowLargeUnixDatagrams value="false"') == 1
        return rendered.replace(
            '<allowLargeUnixDatagrams value="false"', '<allowLargeUnixDatagrams value="true"'
        )


def test_a_daemon_runs_at_64_mib_and_reloaded_to_the_largest_size(
    mock_cluster: MockCluster,
    unique_topic: Callable[[str], str],
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Before: the compiled reader raised at every loop turn from 64 MiB + 1 on (no
    datagram read, SIGTERM exiting 1); now the daemon reads and delivers, and stops."""
    topic = unique_topic("large")
    mock_cluster.create_topic(topic, 1)
    config = LargeDatagramsConfig(
        mock_cluster.bootstrap_servers,
        str(tmp_path_factory.mktemp("s")),
        max_datagram_msg_size="64m",
    )
    daemon = RunningDaemon(config).start()
    try:
        with DatagramSender(config.datagram_path) as sender:
            sender.send(topic, b"at 64 MiB")
            wait_until(lambda: delivered(daemon, topic) == 1, what="the first delivered")
            largest = replace(config, max_datagram_msg_size=str(LARGEST_ACCEPTED))
            outcome = daemon.reload(largest)
            assert outcome.ok, outcome.errors
            sender.send(topic, b"at 2^31 - 1")
            wait_until(lambda: delivered(daemon, topic) == 2, what="the second delivered")
    finally:
        daemon.stop()
    assert daemon.server.snapshot()["received"]["unix_dgram"] == 2


def delivered(daemon: RunningDaemon, topic: str) -> int:
    return int(daemon.snapshot()["topics"].get(topic, {}).get("delivered", 0))
