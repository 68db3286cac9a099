"""Config reload on a running daemon, on Apache Kafka: nothing lost, nothing twice.

Clients on all three transports send without pause while the daemon reloads its config
(batching, compression, rate limits, inputs moved, added and removed, the discard log);
every message is then read back from Kafka exactly once, the books balance exactly, and
the messages sent after a reload were stored with the new config's codec.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka.admin import AclOperation

from helpers import assert_balanced, settled, wait_until
from pydory.client import DatagramSender, TcpSender, UnixStreamSender
from pydory.client.messages import encode_message
from pydory_tools.testing.daemon import DaemonConfig, RunningDaemon, running_daemon
from pydory_tools.testing.kafka_broker import KafkaCluster
from pydory_tools.testing.kafka_util import consume_all
from pydory_tools.testing.ports import free_loopback_port
from test_daemon_kafka import CODEC_IDS, stored_codecs

pytestmark = [pytest.mark.kafka, pytest.mark.slow, pytest.mark.timeout(180)]

PER_TRANSPORT = 6000
BURST = 20
TRANSPORTS = ("unix_dgram", "unix_stream", "tcp")


@pytest.fixture
def socket_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("s", numbered=True))  # UNIX paths: keep them short


@pytest.fixture
def topic(kafka_broker: KafkaCluster, unique_topic: Callable[[str], str]) -> str:
    name = unique_topic("reload")
    kafka_broker.create_topic(name, 4)
    return name


class Flood:
    """One client per transport, each sending PER_TRANSPORT numbered messages in bursts
    without pause, on its own thread."""

    def __init__(self, config: DaemonConfig, tcp_port: int, topic: str) -> None:
        self._senders = {
            "unix_dgram": DatagramSender(config.datagram_path),
            "unix_stream": UnixStreamSender(config.stream_path),
            "tcp": TcpSender(tcp_port),
        }
        self._topic = topic
        self.sent = Counter[str]()
        self.errors: list[BaseException] = []
        self._threads = [
            threading.Thread(target=self._send, args=(transport,), daemon=True)
            for transport in TRANSPORTS
        ]

    def _send(self, transport: str) -> None:
        sender = self._senders[transport]
        try:
            with sender:
                for start in range(0, PER_TRANSPORT, BURST):
                    sender.send_many(
                        encode_message(self._topic, b"%s-%d" % (transport.encode(), i))
                        for i in range(start, start + BURST)
                    )
                    self.sent[transport] += BURST
                    time.sleep(0.001)  # ~3 s in all: long enough to reload twice meanwhile
        except BaseException as error:  # noqa: BLE001 -- reported by the test thread
            self.errors.append(error)

    def __enter__(self) -> Flood:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        for thread in self._threads:
            thread.join(60)

    def reached(self, fraction: float) -> Callable[[], bool]:
        return lambda: min(self.sent[t] for t in TRANSPORTS) >= fraction * PER_TRANSPORT


def all_delivered(daemon: RunningDaemon, topic: str, expected: int) -> dict[str, object]:
    wait_until(settled(daemon, topic, expected), timeout_s=90, what=f"{expected} to {topic}")
    snapshot = daemon.snapshot()
    books = snapshot["topics"][topic]
    assert books["accepted"] == books["delivered"] == expected, books
    assert books["discarded"] == {}, books
    assert snapshot["pool_used"] == 0
    assert_balanced(snapshot)
    return snapshot


@pytest.mark.parametrize("spool", [False, True], ids=["memory", "spool"])
def test_reloads_under_load_on_every_transport_lose_and_repeat_nothing(
    kafka_broker: KafkaCluster, topic: str, socket_dir: str, tmp_path: Path, spool: bool
) -> None:
    first = DaemonConfig(
        kafka_broker.bootstrap_servers,
        socket_dir,
        compression="none",
        spool_path=str(tmp_path / "spool") if spool else None,
    )
    second = dataclasses.replace(first, compression="zstd", batching_time_ms=5)
    third = dataclasses.replace(second, compression="lz4", batching_time_ms=50)
    with running_daemon(first) as daemon:
        with Flood(first, daemon.tcp_port, topic) as flood:
            wait_until(flood.reached(0.3), what="a third of the messages sent")
            outcome = daemon.reload(second)
            assert outcome.ok, outcome
            assert set(outcome.changed) == {"batching", "compression"}
            wait_until(flood.reached(0.6), what="two thirds of the messages sent")
            assert daemon.reload(third).ok
        assert not flood.errors, flood.errors
        snapshot = all_delivered(daemon, topic, 3 * PER_TRANSPORT)
        assert snapshot["received"] == dict.fromkeys(TRANSPORTS, PER_TRANSPORT)
        counters = daemon.server.counters
        assert counters.get("config_reloads") == 2
        assert counters.get("producers_retired") >= 2  # the none and zstd producers
        assert daemon.call(daemon.server.dispatcher.in_librdkafka) == 0
        spooled = daemon.server.spool
        if spooled is not None:  # every message settled: its spool segment with it
            wait_until(lambda: daemon.call(lambda: spooled.outstanding) == 0)

    records = consume_all(kafka_broker.bootstrap_servers, topic, 3 * PER_TRANSPORT)
    values = Counter(record.value for record in records)
    assert len(values) == 3 * PER_TRANSPORT
    assert set(values.values()) == {1}
    expected = {b"%s-%d" % (t.encode(), i) for t in TRANSPORTS for i in range(PER_TRANSPORT)}
    assert set(values) == expected
    # Batches of each config are in the log: uncompressed, zstd, then lz4.
    codecs = stored_codecs(kafka_broker, topic)
    assert {0, CODEC_IDS["zstd"], CODEC_IDS["lz4"]} <= set(codecs), codecs


def test_a_rate_limit_added_and_removed_by_reload_applies_from_the_next_message(
    kafka_broker: KafkaCluster, topic: str, socket_dir: str
) -> None:
    config = DaemonConfig(kafka_broker.bootstrap_servers, socket_dir)
    limited = dataclasses.replace(config, rate_limits={topic: (60_000, 5)})
    with running_daemon(config) as daemon, UnixStreamSender(config.stream_path) as client:
        client.send_many(encode_message(topic, b"free-%d" % i) for i in range(20))
        wait_until(settled(daemon, topic, 20))
        assert daemon.reload(limited).ok
        client.send_many(encode_message(topic, b"limited-%d" % i) for i in range(20))
        wait_until(lambda: daemon.snapshot()["discards"].get("rate_limit") == 15)
        assert daemon.reload(config).ok
        client.send_many(encode_message(topic, b"free-again-%d" % i) for i in range(20))
        wait_until(settled(daemon, topic, 45))
        books = daemon.snapshot()["topics"][topic]
        assert books["delivered"] == 45
    values = {r.value for r in consume_all(kafka_broker.bootstrap_servers, topic, 45)}
    assert {b"limited-%d" % i for i in range(5)} <= values
    assert b"limited-5" not in values
    assert b"free-again-19" in values


def test_inputs_moved_removed_and_added_by_reload(
    kafka_broker: KafkaCluster, topic: str, socket_dir: str
) -> None:
    config = DaemonConfig(kafka_broker.bootstrap_servers, socket_dir)
    moved = dataclasses.replace(
        config,
        datagram_file="dgram2.sock",
        stream_file="stream2.sock",
        tcp_port=free_loopback_port(),
    )
    with running_daemon(config) as daemon:
        old_tcp_port = daemon.tcp_port
        # Clients connected across the reload: their listeners move, their connections
        # stay open and served until they close them.
        kept = [UnixStreamSender(config.stream_path), TcpSender(old_tcp_port)]
        for n, client in enumerate(kept):
            client.send_many(encode_message(topic, b"kept-%d-%d" % (n, i)) for i in range(100))
        send_on_each_transport(config, old_tcp_port, topic, b"before")

        outcome = daemon.reload(moved)
        assert outcome.ok, outcome
        assert outcome.changed == ("inputSources",)
        assert not os.path.exists(config.datagram_path)
        assert not os.path.exists(config.stream_path)
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", old_tcp_port), timeout=60).close()
        assert daemon.tcp_port == moved.tcp_port
        send_on_each_transport(moved, daemon.tcp_port, topic, b"after")
        for n, client in enumerate(kept):
            client.send_many(encode_message(topic, b"kept-%d-%d" % (n, i)) for i in range(100, 200))
            client.close()
        # Their last clients gone, the retired listeners are let go.
        wait_until(lambda: daemon.call(lambda: daemon.server.inputs.retired_streams == []))

        # Removed, then added back.
        no_stream = dataclasses.replace(moved, unix_stream=False, tcp_port=None)
        assert daemon.reload(no_stream).ok
        assert not os.path.exists(moved.stream_path)
        assert daemon.server.inputs.streams == []
        assert daemon.server.inputs.retired_streams == []  # nobody was connected
        assert daemon.reload(moved).ok
        send_on_each_transport(moved, daemon.tcp_port, topic, b"again")

        all_delivered(daemon, topic, 400 + 3 * 3 * 10)
    values = {r.value for r in consume_all(kafka_broker.bootstrap_servers, topic, 490)}
    assert len(values) == 490
    assert {b"kept-%d-%d" % (n, i) for n in range(2) for i in range(200)} <= values


def send_on_each_transport(config: DaemonConfig, tcp_port: int, topic: str, tag: bytes) -> None:
    senders = (
        DatagramSender(config.datagram_path),
        UnixStreamSender(config.stream_path),
        TcpSender(tcp_port),
    )
    for n, sender in enumerate(senders):
        with sender:
            sender.send_many(encode_message(topic, b"%s-%d-%d" % (tag, n, i)) for i in range(10))


def test_a_discard_log_switched_on_by_reload_gets_the_discards_after_it(
    kafka_broker: KafkaCluster, topic: str, socket_dir: str, tmp_path: Path
) -> None:
    config = DaemonConfig(kafka_broker.bootstrap_servers, socket_dir)
    log_path = tmp_path / "discards.log"
    logged = dataclasses.replace(config, discard_log_path=str(log_path))
    with running_daemon(config) as daemon, DatagramSender(config.datagram_path) as client:
        client.send("no-such-topic-before", b"x")
        wait_until(lambda: daemon.snapshot()["discards"].get("bad_topic") == 1)
        outcome = daemon.reload(logged)
        assert outcome.ok, outcome
        assert outcome.changed == ("discardLogging",)
        client.send("no-such-topic-after", b"x")
        wait_until(lambda: daemon.snapshot()["discards"].get("bad_topic") == 2)
        wait_until(lambda: log_path.exists() and "no-such-topic-after" in log_path.read_text())
    assert "no-such-topic-before" not in log_path.read_text()


def test_a_reload_that_cannot_open_its_new_input_changes_nothing(
    kafka_broker: KafkaCluster, topic: str, socket_dir: str
) -> None:
    config = DaemonConfig(kafka_broker.bootstrap_servers, socket_dir)
    with socket.create_server(("127.0.0.1", 0)) as squatter:
        # The new stream socket opens; the new TCP port is taken: the reload fails
        # after opening the first, which must be closed again.
        taken_port = squatter.getsockname()[1]
        broken = dataclasses.replace(
            config, stream_file="stream2.sock", compression="gzip", tcp_port=taken_port
        )
        with running_daemon(config) as daemon:
            producers_before = set(daemon.server.dispatcher.producers)
            outcome = daemon.reload(broken)
            assert not outcome.ok
            assert "address already in use" in outcome.errors[0].lower(), outcome
            assert "/doryConfig/inputSources/tcp/port" in outcome.errors[0]
            # Nothing changed: the old inputs serve, the new stream socket is gone again,
            # the producers and the config are the old ones.
            assert not os.path.exists(broken.stream_path)
            assert os.path.exists(config.stream_path)
            assert daemon.server.dispatcher.producers.keys() == producers_before
            assert daemon.server.config.compression.default_topic.type == "none"
            assert daemon.server.counters.get("config_reload_failures") == 1
            assert daemon.server.reloads.as_json()["reloads"] == {
                "attempted": 1,
                "succeeded": 0,
                "failed": 1,
            }
            send_on_each_transport(config, daemon.tcp_port, topic, b"still")
            all_delivered(daemon, topic, 30)


def test_a_connection_quota_added_by_reload_applies_to_new_connections_only(
    kafka_broker: KafkaCluster, topic: str, socket_dir: str
) -> None:
    from test_quotas_daemon import QuotaDaemonConfig

    config = QuotaDaemonConfig(kafka_broker.bootstrap_servers, socket_dir, tcp_port=None)
    quota = dataclasses.replace(
        config,
        quotas_xml="""    <quotas>
        <unixStream>
            <maxConnections value="1" />
        </unixStream>
    </quotas>
""",
    )
    with running_daemon(config) as daemon, UnixStreamSender(config.stream_path) as first:
        first.send_many(encode_message(topic, b"first-%d" % i) for i in range(10))
        wait_until(settled(daemon, topic, 10))
        outcome = daemon.reload(quota)
        assert outcome.ok, outcome
        assert outcome.changed == ("quotas",)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as second:
            second.connect(config.stream_path)  # the kernel accepts; the daemon closes it
            second.settimeout(60)
            with contextlib.suppress(ConnectionResetError):  # as good as an EOF
                assert second.recv(1) == b""
        # The connection open before the reload is served on.
        first.send_many(encode_message(topic, b"first-again-%d" % i) for i in range(10))
        all_delivered(daemon, topic, 20)
        assert daemon.server.counters.get("quota_connections_refused_unix_stream") == 1


def test_brokers_and_credentials_change_by_reload_under_load(
    kafka_broker: KafkaCluster, topic: str, socket_dir: str
) -> None:
    """Rotating credentials, or moving to another listener, without a restart: the same
    broker over PLAINTEXT, then SASL/PLAIN as alice, then TLS, while clients send."""
    from pydory_tools.testing.pytest_plugin import KAFKA_SASL_USERS
    from test_daemon_kafka import grant, sasl_login

    alice = KAFKA_SASL_USERS[0]
    grant(kafka_broker, topic, alice, [AclOperation.WRITE, AclOperation.DESCRIBE])
    assert kafka_broker.ca_path is not None
    plain = DaemonConfig(kafka_broker.bootstrap_servers, socket_dir)
    sasl = dataclasses.replace(
        plain,
        bootstrap_servers=kafka_broker.sasl_bootstrap_servers,
        librdkafka=sasl_login(alice),
    )
    tls = dataclasses.replace(
        plain,
        bootstrap_servers=kafka_broker.ssl_bootstrap_servers,
        librdkafka={"security.protocol": "SSL", "ssl.ca.location": str(kafka_broker.ca_path)},
    )
    with running_daemon(plain) as daemon:
        metadata = daemon.server.metadata
        with Flood(plain, daemon.tcp_port, topic) as flood:
            wait_until(flood.reached(0.3), what="a third of the messages sent")
            fetched = metadata.fetch_successes
            outcome = daemon.reload(sasl)
            assert outcome.ok, outcome
            assert set(outcome.changed) == {"initialBrokers", "librdkafka"}
            # Metadata is fetched at once through the new client (SASL, as alice).
            wait_until(lambda: metadata.fetch_successes > fetched, what="a metadata fetch")
            wait_until(flood.reached(0.6), what="two thirds of the messages sent")
            assert daemon.reload(tls).ok
        assert not flood.errors, flood.errors
        all_delivered(daemon, topic, 3 * PER_TRANSPORT)
        # A property librdkafka refuses: the reload is refused, TLS goes on.
        refused = daemon.reload(
            dataclasses.replace(tls, librdkafka={**tls.librdkafka, "no.such.property": "1"})
        )
        assert not refused.ok
        assert "/doryConfig/librdkafka" in refused.errors[0], refused
        assert "no.such.property" in refused.errors[0], refused
        assert daemon.server.config.librdkafka == tls.librdkafka
        send_on_each_transport(tls, daemon.tcp_port, topic, b"still")
        all_delivered(daemon, topic, 3 * PER_TRANSPORT + 30)
    records = consume_all(kafka_broker.bootstrap_servers, topic, 3 * PER_TRANSPORT + 30)
    assert len({r.value for r in records}) == len(records) == 3 * PER_TRANSPORT + 30


def test_input_limits_and_the_memory_pool_change_by_reload(
    kafka_broker: KafkaCluster, topic: str, socket_dir: str
) -> None:
    config = DaemonConfig(kafka_broker.bootstrap_servers, socket_dir, max_buffer="64m")
    smaller = dataclasses.replace(
        config, max_buffer="8m", max_stream_msg_size="4k", max_datagram_msg_size="2k"
    )
    with running_daemon(config) as daemon:
        big = b"x" * 3000
        with UnixStreamSender(config.stream_path) as kept:
            kept.send(topic, big)  # a connection made before the reload keeps its limit
            outcome = daemon.reload(smaller)
            assert outcome.ok, outcome
            assert outcome.changed == ("inputConfig",)
            assert daemon.server.pool.budget == 8 * 1024 * 1024
            kept.send(topic, big)
        with DatagramSender(config.datagram_path) as client:
            client.send(topic, big)  # above the new 2k: discarded as malformed
            client.send(topic, b"small")
        with UnixStreamSender(config.stream_path) as fresh:
            fresh.send(topic, b"x" * 5000)  # above the new 4k: the connection is closed
        counters = daemon.server.counters
        wait_until(lambda: counters.get("datagram_over_max_size") == 1)
        wait_until(lambda: counters.get("stream_oversized_frame_unix_stream") == 1)
        all_delivered(daemon, topic, 3)
        # Too large for the kernel's datagram limit without allowLargeUnixDatagrams:
        # refused, nothing changed.
        refused = daemon.reload(dataclasses.replace(smaller, max_datagram_msg_size="1m"))
        assert not refused.ok
        assert "maxDatagramMsgSize" in refused.errors[0], refused
        assert daemon.server.config.input_config.max_datagram_msg_size == 2048
