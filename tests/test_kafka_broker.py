"""The Apache Kafka launcher: start-up, listeners, faults, teardown, the command line."""

from __future__ import annotations

import base64
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import KafkaException

from pydory_tools.testing import kafka_broker
from pydory_tools.testing.kafka_broker import (
    KafkaBrokerError,
    KafkaCluster,
    find_kafka_jars,
    kafka_version,
    new_cluster_id,
)
from pydory_tools.testing.kafka_util import DeliveryFailed, consume_all, produce_all, unique_topic
from pydory_tools.testing.ports import LOOPBACK, free_loopback_port, free_loopback_ports

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

SASL_PLAIN = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN"}
# Fail fast where a test expects a refusal: librdkafka would otherwise retry for minutes.
REFUSAL_TIMEOUTS = {"message.timeout.ms": 5000, "socket.timeout.ms": 5000}


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def java_processes_under(directory: Path) -> list[int]:
    """PIDs of processes whose command line names ``directory`` (our brokers' configs)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if str(directory).encode() in cmdline:
            found.append(int(entry.name))
    return found


def test_a_cluster_id_never_starts_with_a_dash(monkeypatch: pytest.MonkeyPatch) -> None:
    """One random id in 64 would (``kafka-storage format`` then reads it as an option): the
    id is drawn again, as Kafka's own Uuid.randomUuid() does."""
    dash_first = uuid.UUID(bytes=b"\xf8" + bytes(15))  # base64 "-A..."
    fresh = uuid.UUID(int=1)
    draws = iter([dash_first, fresh])
    monkeypatch.setattr(uuid, "uuid4", lambda: next(draws))
    assert base64.urlsafe_b64encode(dash_first.bytes).startswith(b"-")
    cluster_id = new_cluster_id()
    assert cluster_id == base64.urlsafe_b64encode(fresh.bytes).decode().rstrip("=")
    assert len(cluster_id) == 22


def test_the_jars_are_apache_kafka_4() -> None:
    version = kafka_version(find_kafka_jars())
    assert version.split(".")[0] == "4", version


def test_missing_jars_are_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYDORY_KAFKA_JARS", str(tmp_path))
    with pytest.raises(KafkaBrokerError, match=r"no Apache Kafka jars in .*\./dev setup"):
        KafkaCluster(1)


def test_a_broker_stores_and_serves_records(kafka_broker: KafkaCluster) -> None:
    topic = unique_topic("launcher")
    kafka_broker.create_topic(topic, 2)
    sent = [(f"k{i}".encode(), f"v{i}".encode()) for i in range(50)]
    reports = produce_all(kafka_broker.bootstrap_servers, topic, sent)
    assert {r.partition for r in reports} <= {0, 1}
    records = consume_all(kafka_broker.bootstrap_servers, topic, expected=50)
    assert sorted((r.key, r.value) for r in records) == sorted(sent)
    assert kafka_broker.describe().startswith(
        f"Apache Kafka {kafka_broker.version} (KRaft), 1 broker at 127.0.0.1:"
    )


def test_topic_settings_reach_the_broker(kafka_broker: KafkaCluster) -> None:
    topic = unique_topic("launcher-limit")
    kafka_broker.create_topic(topic, 1, config={"max.message.bytes": "1000"})
    produce_all(kafka_broker.bootstrap_servers, topic, [(None, b"x" * 100)])
    with pytest.raises(DeliveryFailed, match="MSG_SIZE_TOO_LARGE"):
        produce_all(
            kafka_broker.bootstrap_servers,
            topic,
            [(None, b"x" * 5000)],
            {"compression.type": "none", **REFUSAL_TIMEOUTS},
        )


def test_sasl_plain_authenticates_known_users_only(kafka_broker: KafkaCluster) -> None:
    topic = unique_topic("launcher-sasl")
    kafka_broker.create_topic(topic, 1)
    alice = {**SASL_PLAIN, "sasl.username": "alice", "sasl.password": "alice-secret"}
    produce_all(kafka_broker.sasl_bootstrap_servers, topic, [(None, b"from alice")], alice)
    impostor = {**SASL_PLAIN, "sasl.username": "alice", "sasl.password": "wrong"}
    with pytest.raises(DeliveryFailed):
        produce_all(
            kafka_broker.sasl_bootstrap_servers,
            topic,
            [(None, b"not stored")],
            {**impostor, **REFUSAL_TIMEOUTS},
            timeout_s=60,
        )
    values = [r.value for r in consume_all(kafka_broker.bootstrap_servers, topic, expected=1)]
    assert values == [b"from alice"]


def test_tls_listener_is_verified_with_the_test_ca(kafka_broker: KafkaCluster) -> None:
    topic = unique_topic("launcher-tls")
    kafka_broker.create_topic(topic, 1)
    assert kafka_broker.ca_path is not None
    tls = {"security.protocol": "SSL", "ssl.ca.location": str(kafka_broker.ca_path)}
    produce_all(kafka_broker.ssl_bootstrap_servers, topic, [(None, b"over tls")], tls)
    # Without the test CA, librdkafka refuses the broker's certificate.
    with pytest.raises(DeliveryFailed):
        produce_all(
            kafka_broker.ssl_bootstrap_servers,
            topic,
            [(None, b"not stored")],
            {"security.protocol": "SSL", **REFUSAL_TIMEOUTS},
            timeout_s=60,
        )
    values = [r.value for r in consume_all(kafka_broker.bootstrap_servers, topic, expected=1)]
    assert values == [b"over tls"]


def test_a_port_taken_before_the_broker_binds_it_starts_the_cluster_on_new_ports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process took a picked port before the broker bound it (two suites side by
    side): the launcher starts the cluster again on new ports instead of failing."""
    plans: list[list[int]] = []

    def first_plan_takes_a_port_in_use(count: int) -> list[int]:
        ports = free_loopback_ports(count)
        if not plans:
            ports[0] = taken_port  # the PLAINTEXT listener's
        plans.append(ports)
        return ports

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken_port = free_loopback_port()
        taken.bind((LOOPBACK, taken_port))
        taken.listen()
        monkeypatch.setattr(kafka_broker, "free_loopback_ports", first_plan_takes_a_port_in_use)
        with KafkaCluster(1, base_dir=tmp_path) as cluster:
            topic = unique_topic("rebound")
            cluster.create_topic(topic, 1)
            produce_all(cluster.bootstrap_servers, topic, [(None, b"after a bind failure")])
            assert cluster.bootstrap_servers == f"{LOOPBACK}:{plans[1][0]}"
            records = consume_all(cluster.bootstrap_servers, topic, expected=1)

    assert len(plans) == 2  # the second plan, after the bind failure, took new ports
    assert taken_port not in plans[1]
    assert [record.value for record in records] == [b"after a bind failure"]


def test_a_listener_that_was_not_asked_for_is_an_error(tmp_path: Path) -> None:
    with KafkaCluster(1, base_dir=tmp_path) as plain:
        with pytest.raises(KafkaBrokerError, match="without sasl_users"):
            _ = plain.sasl_bootstrap_servers
        with pytest.raises(KafkaBrokerError, match="without tls"):
            _ = plain.ssl_bootstrap_servers
        pid = plain.pid(1)
        assert pid is not None
        assert alive(pid)
    # Leaving the block ends the broker: no process is left behind.
    assert not alive(pid)
    assert java_processes_under(tmp_path) == []


def test_a_killed_leader_is_replaced_and_rejoins(kafka_cluster: KafkaCluster) -> None:
    topic = unique_topic("launcher-kill")
    kafka_cluster.create_topic(topic, 1, replication_factor=3, config={"min.insync.replicas": "2"})
    leader = kafka_cluster.leaders(topic)[0]
    old_pid = kafka_cluster.pid(leader)
    assert old_pid is not None

    kafka_cluster.kill_broker(leader)
    assert kafka_cluster.pid(leader) is None
    assert not alive(old_pid)
    new_leader = wait_for(lambda: _leader_other_than(kafka_cluster, topic, leader), 60)
    # Two replicas are still in sync: acks=all writes succeed while one node is down.
    produce_all(kafka_cluster.bootstrap_servers, topic, [(None, b"while down")], {"acks": "all"})

    kafka_cluster.start_broker(leader)
    kafka_cluster.wait_until_fully_replicated(topic)
    assert leader in kafka_cluster.in_sync_replicas(topic)[0]
    assert new_leader != leader


def test_a_controlled_shutdown_moves_leadership_first(kafka_cluster: KafkaCluster) -> None:
    topic = unique_topic("launcher-stop")
    kafka_cluster.create_topic(topic, 3, replication_factor=3)
    leaders = kafka_cluster.leaders(topic)
    stopped = leaders[0]
    kafka_cluster.stop_broker(stopped)
    # A clean shutdown hands leadership over before the process exits.
    after = kafka_cluster.leaders(topic)
    assert stopped not in after.values(), after
    assert all(leader >= 0 for leader in after.values())


def _leader_other_than(cluster: KafkaCluster, topic: str, old: int) -> int | None:
    try:
        leader = cluster.leaders(topic)[0]
    except KafkaException:
        return None
    return leader if leader not in (old, -1) else None


def wait_for(probe: object, timeout_s: float) -> int:
    assert callable(probe)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = probe()
        if value is not None:
            return int(value)
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s} s")


@pytest.fixture
def broker_process(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pydory_tools.testing.kafka_broker",
            "--topic",
            "cli:2",
            "--dir",
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_command_line_prints_the_bootstrap_string_first_and_stops_on_sigterm(
    broker_process: subprocess.Popen[str], tmp_path: Path
) -> None:
    assert broker_process.stdout is not None
    bootstrap = broker_process.stdout.readline().strip()
    assert bootstrap.startswith("127.0.0.1:"), launcher_failure(broker_process)
    produce_all(bootstrap, "cli", [(None, b"hello")])
    assert [r.value for r in consume_all(bootstrap, "cli", expected=1)] == [b"hello"]
    assert java_processes_under(tmp_path) != []

    broker_process.send_signal(signal.SIGTERM)
    assert broker_process.wait(timeout=60) == 0
    assert broker_process.stderr is not None
    assert "Apache Kafka" in broker_process.stderr.read()
    assert java_processes_under(tmp_path) == []


def launcher_failure(process: subprocess.Popen[str]) -> str:
    """What a launcher that printed no bootstrap string said instead (for the report)."""
    try:
        _, stderr = process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        return "the launcher printed nothing and is still running"
    return f"the launcher exited with {process.returncode}: {stderr}"


def test_brokers_die_with_a_killed_launcher(
    broker_process: subprocess.Popen[str], tmp_path: Path
) -> None:
    assert broker_process.stdout is not None
    first_line = broker_process.stdout.readline()
    assert first_line.startswith("127.0.0.1:"), launcher_failure(broker_process)
    assert java_processes_under(tmp_path) != []

    broker_process.kill()  # no chance to clean up: the OOM killer, a crashed test run
    broker_process.wait()
    deadline = time.monotonic() + 60
    while java_processes_under(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert java_processes_under(tmp_path) == []
