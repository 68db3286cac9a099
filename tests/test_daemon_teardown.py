"""A stopped daemon lets go of the brokers: no librdkafka client of its own lives on.

Found in CI: a daemon's metadata client, left to the garbage collector (the server holds
reference cycles), went on reconnecting to the brokers of a cluster that was gone, and
a later test's daemon, which had bound one of those ports for its TCP input, received
librdkafka's ApiVersions requests as client messages (malformed, then an oversized
Size). Now the metadata client is destroyed at shutdown, like the producers.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path

from pydory_tools.testing.daemon import DaemonConfig, RunningDaemon
from pydory_tools.testing.mock_cluster import MockCluster

# The wait is meant to end unanswered; librdkafka reconnects within 0.1-1 s at first
# (reconnect.backoff.ms), so a live client would connect well before it ends.
QUIET_FOR_S = 4.0  # not a deadline: nothing may connect meanwhile


def test_no_client_of_a_stopped_daemon_reconnects_to_its_brokers(
    mock_cluster_factory: Callable[..., MockCluster], tmp_path: Path
) -> None:
    cluster = mock_cluster_factory(brokers=1)
    cluster.create_topic("t", partitions=1)
    host, port = cluster.bootstrap_servers.split(",")[0].rsplit(":", 1)
    daemon = RunningDaemon(DaemonConfig(cluster.bootstrap_servers, str(tmp_path))).start()
    daemon.stop()
    cluster.stop()
    # The daemon object stays referenced, as a reference cycle would keep it.
    with socket.create_server((host, int(port)), reuse_port=False) as former_broker:
        former_broker.settimeout(QUIET_FOR_S)
        connected = True
        try:
            former_broker.accept()[0].close()
        except TimeoutError:
            connected = False
    assert daemon.server is not None
    assert not connected, "a client of the stopped daemon reconnected to its broker's port"
