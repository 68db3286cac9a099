"""Restarts lose nothing (issue 33, point 5).

- ``pydory serve`` binds its input sockets before it imports the daemon: a structural
  test (what is imported when the first input socket is bound), not a timed one; the
  time under load is measured in BENCHMARKS.md ("Start-up under load").
- Socket activation: the test plays systemd (tests/socket_activation.py): it holds the
  datagram, stream and TCP sockets, starts ``pydory serve`` on them, SIGKILLs it,
  SIGTERMs the next one, while clients send on every transport; the sockets never go
  missing and no message is lost (Apache Kafka, the spool on).
- A socket systemd passes that is not the config's input refuses the start, naming the
  element.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pydory.daemon.inputs.sockets import datagram_queue_limit
from pydory.status_client import StatusHttp
from pydory.wire import encode_any_partition
from pydory_tools.testing.daemon_config import DaemonConfig
from pydory_tools.testing.kafka_broker import KafkaCluster
from pydory_tools.testing.kafka_util import consume_all
from pydory_tools.testing.mock_cluster import MockCluster
from pydory_tools.testing.ports import free_loopback_port
from socket_activation import ActivatedDaemon, UnitSockets

#: Modules that cost the start-up its time (BENCHMARKS.md): none may be imported when the
#: first input socket is bound.
HEAVY_MODULES = (
    "asyncio",
    "uvloop",
    "aiohttp",
    "confluent_kafka",
    "prometheus_client",
    "defusedxml",
    "importlib.metadata",
    "argparse",
    "logging",
    "pydory.config.loader",
    "pydory.server",
    "pydory._cwire",
    "pydory._cproducer",
)

#: Run as ``pydory serve``, with an audit hook noting what is imported at each bind of an
#: input address; the process ends at the last of them (nothing after matters here).
BIND_PROBE = """
import json, os, sys
out, heavy, addresses = sys.argv[1], sys.argv[2].split(","), json.loads(sys.argv[3])
wanted = {a if isinstance(a, str) else tuple(a) for a in addresses}
seen = []
def hook(event, args):
    if event != "socket.bind" or args[1] not in wanted:
        return
    seen.append({"address": args[1], "imported": [m for m in heavy if m in sys.modules]})
    if len(seen) == len(wanted):
        with open(out, "w") as f:
            json.dump(seen, f)
        os._exit(0)
sys.addaudithook(hook)
import importlib
main = importlib.import_module(sys.argv[4]).main
sys.exit(main(sys.argv[5:]))
"""


@pytest.fixture
def unit_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # UNIX socket paths are limited to ~108 bytes: keep the directory short.
    return tmp_path_factory.mktemp("rs", numbered=True)


@pytest.mark.parametrize(
    ("entry_point", "arguments"),
    [("pydory.cli", ["serve"]), ("pydory.dory_cli", [])],
    ids=["pydory serve", "dory"],
)
def test_serve_binds_every_input_before_it_imports_the_daemon(
    unit_dir: Path, mock_cluster: MockCluster, entry_point: str, arguments: list[str]
) -> None:
    config = DaemonConfig(mock_cluster.bootstrap_servers, str(unit_dir))
    config_path = unit_dir / "pydory.xml"
    config_path.write_text(config.render())
    out = unit_dir / "binds.json"
    addresses = [config.datagram_path, config.stream_path, ["127.0.0.1", config.tcp_port]]
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            BIND_PROBE,
            str(out),
            ",".join(HEAVY_MODULES),
            json.dumps(addresses),
            entry_point,
            *arguments,
            *("--config-path", str(config_path)),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.exists(), f"not every input was bound: {done.stdout}{done.stderr}"
    binds = json.loads(out.read_text())
    assert [b["imported"] for b in binds] == [[], [], []], binds


@pytest.mark.parametrize(
    ("moved", "element"),
    [
        ("stream", "/doryConfig/inputSources/unixStream/path"),
        ("datagram", "/doryConfig/inputSources/unixDatagram/path"),
        ("tcp", "/doryConfig/inputSources/tcp/port"),
    ],
)
def test_a_systemd_socket_that_is_not_the_configs_input_refuses_the_start(
    unit_dir: Path, mock_cluster: MockCluster, moved: str, element: str
) -> None:
    unit = DaemonConfig(mock_cluster.bootstrap_servers, str(unit_dir))
    config = DaemonConfig(mock_cluster.bootstrap_servers, str(unit_dir))
    if moved == "stream":
        config.stream_file = "elsewhere.sock"
    elif moved == "datagram":
        config.datagram_file = "elsewhere.sock"
    else:
        config.tcp_port = free_loopback_port()
    sockets = UnitSockets(unit)
    try:
        daemon = ActivatedDaemon(sockets.sockets, config, unit_dir / "c.xml", unit_dir / "log")
        assert daemon.process.wait(timeout=300) == 1
        log = daemon.log_path.read_text()
    finally:
        sockets.close()
    assert f"Error in config file: {element}: " in log, log
    assert f"systemd's fd {3 + ['datagram', 'stream', 'tcp'].index(moved)} '{moved}'" in log, log


# --- a client through restarts ---------------------------------------------------------------

#: Errors that mean "no socket there": what a restart must never show a client.
MISSING = frozenset({errno.ENOENT, errno.ECONNREFUSED})


class Client:
    """Sends numbered messages on one transport, in batches; knows what it sent, whether
    a socket was ever missing, and how many stream batches it sent again.

    A stream batch counts as sent when the daemon closed the connection cleanly after the
    client's end of it (it had read every byte: a close with bytes unread resets the
    connection); one that broke is sent again on a new connection."""

    def __init__(self, transport: str, config: DaemonConfig, topic: str) -> None:
        self.transport = transport
        self._config = config
        self._topic = topic
        self.sent: list[bytes] = []
        self.missing: list[str] = []
        self.resent = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def value(self, n: int) -> bytes:
        return b"%s-%08d" % (self.transport.encode(), n)

    def send(self, count: int, *, confirm: bool = True) -> None:
        """Send ``count`` more messages (``confirm``: a stream batch waits for the
        daemon's clean close; without, it is left in the listen backlog)."""
        values = [self.value(len(self.sent) + i) for i in range(count)]
        frames = [encode_any_partition(self._topic, v) for v in values]
        if self.transport == "datagram":
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                for frame in frames:
                    self._retry(lambda f=frame: sock.sendto(f, self._config.datagram_path))
        else:
            self._retry(lambda: self._send_stream(b"".join(frames), confirm))
        self.sent += values

    def _retry(self, attempt: Callable[[], object]) -> None:
        while True:
            try:
                attempt()
            except OSError as error:
                if error.errno in MISSING:
                    self.missing.append(f"{self.transport}: {error}")
                self.resent += 1
                time.sleep(0.01)
            else:
                return

    def _connect(self) -> socket.socket:
        if self.transport == "stream":
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            address: Any = self._config.stream_path
        else:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            address = ("127.0.0.1", self._config.tcp_port)
        sock.settimeout(300)  # a far-off safety net: the next daemon reads it
        try:
            sock.connect(address)
        except BaseException:
            sock.close()
            raise
        return sock

    def _send_stream(self, data: bytes, confirm: bool) -> None:
        with self._connect() as sock:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
            if confirm and sock.recv(1) != b"":
                raise AssertionError("the daemon wrote to a client")

    def start(self, batch: int = 20) -> None:
        """Send batches in a thread until :meth:`stop`."""

        def run() -> None:
            while not self._stop.is_set():
                self.send(batch)

        self._thread = threading.Thread(target=run, name=f"client-{self.transport}")
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=300)
            assert not self._thread.is_alive()


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 300) -> None:
    """Until ``condition`` (a far-off safety net, never the test's measure)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


TRANSPORTS = ("datagram", "stream", "tcp")
#: The transports as the books name them.
BOOKS_NAME = {"datagram": "unix_dgram", "stream": "unix_stream", "tcp": "tcp"}


def received(daemon: ActivatedDaemon) -> dict[str, int]:
    """What ``daemon`` has read so far, per transport (this run's)."""
    books = daemon.received()
    return {t: books.get(BOOKS_NAME[t], 0) for t in TRANSPORTS}


@pytest.fixture
def unit(unit_dir: Path, kafka_broker: KafkaCluster) -> Iterator[tuple[DaemonConfig, UnitSockets]]:
    config = DaemonConfig(
        kafka_broker.bootstrap_servers,
        str(unit_dir),
        spool_path=str(unit_dir / "spool"),
        batching_time_ms=5,
    )
    sockets = UnitSockets(config)
    try:
        yield config, sockets
    finally:
        sockets.close()


@pytest.mark.kafka
def test_a_client_sending_through_restarts_on_systemds_sockets_loses_nothing(
    unit: tuple[DaemonConfig, UnitSockets],
    unit_dir: Path,
    kafka_broker: KafkaCluster,
    unique_topic: Callable[[str], str],
) -> None:
    """SIGKILL, then messages sent while no daemon runs, then SIGTERM with clients sending
    throughout: every message of every transport is in Kafka, no socket ever missing."""
    config, sockets = unit
    topic = unique_topic("restarts")
    kafka_broker.create_topic(topic, 2)
    clients = {t: Client(t, config, topic) for t in TRANSPORTS}
    runs = iter(range(1, 100))

    def start() -> ActivatedDaemon:
        run = next(runs)
        daemon = ActivatedDaemon(
            sockets.sockets, config, unit_dir / "pydory.xml", unit_dir / f"daemon-{run}.log"
        )
        daemon.wait_ready()
        return daemon

    # 1. SIGKILL once the daemon has read (and written ahead) all that was sent.
    daemon = start()
    for client in clients.values():
        client.send(300)
    wait_for(lambda: received(daemon) == {t: 300 for t in TRANSPORTS}, "the daemon to read all")
    os.kill(daemon.process.pid, signal.SIGKILL)
    daemon.process.wait(timeout=60)
    assert os.path.exists(config.datagram_path)
    assert os.path.exists(config.stream_path)

    # 2. No daemon: the kernel queues what clients send (connections wait in the backlog;
    #    datagrams in the queue, as many as it holds: a blocking send waits beyond that).
    queue = (datagram_queue_limit() or 2) - 1
    for client in clients.values():
        client.send(queue if client.transport == "datagram" else 100, confirm=False)

    # 3. The next daemon reads all of it (and replays its spool); clients send throughout
    #    its SIGTERM and the start of the one after.
    daemon = start()
    for client in clients.values():
        client.start()
    wait_for(lambda: all(n > 200 for n in received(daemon).values()), "the second daemon to read")
    daemon.process.send_signal(signal.SIGTERM)
    assert daemon.process.wait(timeout=300) == 0, daemon.log_path.read_text()
    assert os.path.exists(config.datagram_path)
    assert os.path.exists(config.stream_path)
    daemon = start()
    wait_for(
        lambda: all(received(daemon).values()), "the third daemon to read from every transport"
    )
    for client in clients.values():
        client.stop()
    daemon.process.send_signal(signal.SIGTERM)  # reads what is queued, delivers it
    assert daemon.process.wait(timeout=300) == 0, daemon.log_path.read_text()

    sent = {v for client in clients.values() for v in client.sent}
    found = {r.value for r in consume_all(kafka_broker.bootstrap_servers, topic, len(sent), 120)}
    missing = {t: sum(v not in found for v in c.sent) for t, c in clients.items()}
    print({t: (len(c.sent), c.resent) for t, c in clients.items()}, "sent, sent again")
    assert missing == {t: 0 for t in TRANSPORTS}
    assert [m for c in clients.values() for m in c.missing] == []


def test_a_reload_on_systemds_sockets_keeps_them_and_moves_what_it_moves(
    unit_dir: Path, mock_cluster: MockCluster
) -> None:
    """SIGHUP with the stream input moved: the datagram socket systemd passed keeps
    serving, the new stream path is pydory's own; systemd's files outlive the daemon,
    pydory's own is removed at its stop."""
    config = DaemonConfig(mock_cluster.bootstrap_servers, str(unit_dir))
    sockets = UnitSockets(config)
    try:
        daemon = ActivatedDaemon(sockets.sockets, config, unit_dir / "c.xml", unit_dir / "log")
        daemon.wait_ready()
        config.stream_file = "moved.sock"
        (unit_dir / "c.xml").write_text(config.render())
        daemon.process.send_signal(signal.SIGHUP)

        def reloaded() -> bool:
            page = StatusHttp(daemon.url, timeout_s=60).get_json("counters/json")
            return any(c["name"] == "config_reloads" and c["value"] == 1 for c in page["counters"])

        wait_for(reloaded, "the reload")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect(config.stream_path)  # the moved input, bound by pydory
            client.sendall(encode_any_partition("t", b"after the reload"))
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as client:
            client.sendto(encode_any_partition("t", b"to systemd's socket"), config.datagram_path)
        wait_for(
            lambda: received(daemon)["datagram"] == 1 and received(daemon)["stream"] == 1,
            "both messages read",
        )
        daemon.process.send_signal(signal.SIGTERM)
        assert daemon.process.wait(timeout=300) == 0, daemon.log_path.read_text()
    finally:
        sockets.close()
    assert os.path.exists(config.datagram_path)  # systemd's (closed by the test only now)
    assert os.path.exists(str(unit_dir / "stream.sock"))
    assert not os.path.exists(config.stream_path)  # pydory's own: removed at its stop
