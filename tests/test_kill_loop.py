"""The kill loop's own behaviour (``pydory_tools.testing.kill_loop``): a threshold the
clients can no longer reach is not waited for once they are done."""

from __future__ import annotations

import tempfile
from pathlib import Path

from pydory_tools.testing.daemon_config import DaemonConfig
from pydory_tools.testing.kill_loop import KilledDaemon
from pydory_tools.testing.mock_cluster import MockCluster


def test_a_kill_whose_threshold_the_done_senders_cannot_reach_comes_at_once(
    mock_cluster: MockCluster,
) -> None:
    # A short directory: UNIX socket paths are limited to 108 bytes.
    with tempfile.TemporaryDirectory(prefix="kl-") as directory:
        workdir = Path(directory)
        config = DaemonConfig(mock_cluster.bootstrap_servers, str(workdir))
        daemon = KilledDaemon(config, workdir)
        first = daemon.process.process.pid
        try:
            # No client sends: without senders_done this would wait out its timeout.
            daemon.kill_after(10**9, senders_done=lambda: True)

            assert daemon.kills == 1
            assert daemon.process.process.pid != first
            assert daemon.accepted_since_start() == 0  # the new run answers
        finally:
            daemon.stop()
