"""`PydoryLogHandler` at its defaults against a real daemon: a burst of records all arrive
(issue 23 item 10: 309 of 500 were dropped, the daemon's receive queue being 10 long)."""

from __future__ import annotations

import logging
import tempfile
import uuid
from collections.abc import Iterator

import pytest

from helpers import settled, wait_until
from pydory.client import PydoryLogHandler
from pydory_tools.testing.daemon import DaemonConfig, running_daemon
from pydory_tools.testing.mock_cluster import MockCluster

BURST = 500


@pytest.fixture
def socket_dir() -> Iterator[str]:
    # UNIX socket paths are limited to ~108 bytes: keep them short.
    with tempfile.TemporaryDirectory(prefix="pydory-lh-") as path:
        yield path


def test_a_burst_of_records_all_reach_the_daemon(
    mock_cluster: MockCluster, socket_dir: str
) -> None:
    topic = f"app.logs.{uuid.uuid4().hex[:8]}"
    mock_cluster.create_topic(topic, 2)
    config = DaemonConfig(mock_cluster.bootstrap_servers, socket_dir)
    logger = logging.getLogger(f"pydory-test.{uuid.uuid4().hex}")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    handler = PydoryLogHandler(config.datagram_path, topic)  # its defaults
    logger.addHandler(handler)
    try:
        with running_daemon(config) as daemon:
            for n in range(BURST):
                logger.info("record %d of the burst", n)

            assert handler.dropped == 0
            wait_until(settled(daemon, topic, BURST), what=f"{BURST} records accepted")
            assert daemon.snapshot()["topics"][topic]["accepted"] == BURST
    finally:
        logger.removeHandler(handler)
        handler.close()
