"""A slow disk delays the spool's syncs and deletions, not the reading: the interval's
fsyncs run on the spool's disk worker (``pydory-spool-disk``), so a daemon whose every
fsync hangs keeps reading, writing ahead and delivering, and settles everything once the
disk answers (the acknowledgement marks' syncs, on the same worker: test_spool.py). The
daemon runs in this process, so the test can hold ``os.fdatasync``."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from helpers import settled, wait_until
from pydory.client import UnixStreamSender
from pydory.wire import encode_any_partition
from pydory_tools.testing.daemon import running_daemon
from pydory_tools.testing.daemon_config import DaemonConfig
from pydory_tools.testing.mock_cluster import MockCluster

DISK_WORKER = "pydory-spool-disk"


@pytest.fixture
def socket_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("s", numbered=True))  # UNIX paths: keep them short


def test_a_hung_fsync_delays_no_message(
    mock_cluster: MockCluster,
    unique_topic: Callable[[str], str],
    socket_dir: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    topic = unique_topic("slow-disk")
    mock_cluster.create_topic(topic, 2)
    disk_answers, worker_waits = threading.Event(), threading.Event()
    real_fdatasync = os.fdatasync
    syncing_threads: set[str] = set()

    def hung(fd: int) -> None:  # on whichever thread calls it: the loop would hang too
        syncing_threads.add(threading.current_thread().name)
        if threading.current_thread().name == DISK_WORKER:
            worker_waits.set()
        disk_answers.wait(120)
        real_fdatasync(fd)

    monkeypatch.setattr(os, "fdatasync", hung)
    config = DaemonConfig(
        mock_cluster.bootstrap_servers,
        socket_dir,
        spool_path=str(tmp_path / "spool"),
        spool_fsync="100",
        spool_segment_size="64k",  # rotations, and marks in segments still written
    )
    with running_daemon(config) as daemon, UnixStreamSender(config.stream_path) as sender:
        try:
            sender.send_many(encode_any_partition(topic, b"a%05d" % n) for n in range(200))
            wait_until(worker_waits.is_set, what="the disk worker's first fsync")
            # The worker is stuck in fdatasync: the daemon reads, writes ahead, delivers.
            sender.send_many(encode_any_partition(topic, b"b%05d" % n) for n in range(2000))
            wait_until(settled(daemon, topic, 2200), what="delivery while the fsync hangs")
            books = daemon.snapshot()["topics"][topic]
            assert (books["accepted"], books["delivered"]) == (2200, 2200)
            spool = daemon.server.spool
            assert spool is not None
            assert daemon.call(lambda: spool.outstanding) == 0
            assert syncing_threads == {DISK_WORKER}
        finally:
            disk_answers.set()
    spool_files = sorted(p.name for p in (tmp_path / "spool").glob("segment-*"))
    assert spool_files == []  # the stop waited for the worker's deletions
