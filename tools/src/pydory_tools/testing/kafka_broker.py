"""Apache Kafka itself, in KRaft mode, on loopback: the broker the tests and the demo run on.

The jars come from Maven Central at set-up (``./dev`` copies what ``jvm/kafka/pom.xml``
pins into ``.jars/kafka/``); nothing downloads here. Each node runs in combined mode
(``process.roles=broker,controller``) and every node is a voter of the controller
quorum, so a 3-node cluster keeps its quorum and its data with one node down. Every
node gets free loopback ports and a private directory; :meth:`KafkaCluster.stop` ends
every process it started, by PID.

Listeners per node: ``PLAINTEXT`` (clients and inter-broker traffic), ``CONTROLLER``,
and on request ``SASL_PLAINTEXT`` (SASL/PLAIN users, with Kafka's ``StandardAuthorizer``
so ACLs apply there) and ``SSL`` (a CA and a server certificate for 127.0.0.1 made at
start-up with ``cryptography``, a test dependency). On the PLAINTEXT listener the client
is ``User:ANONYMOUS``, a super user: only SASL users meet ACLs.

Run it as a process for demos and manual testing::

    python -m pydory_tools.testing.kafka_broker --brokers 3 --topic events:4:3

The first line of output is the bootstrap string; the process serves until SIGTERM or
SIGINT, then stops the brokers and exits 0.
"""

from __future__ import annotations

import argparse
import base64
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from pydory.errors import PydoryError
from pydory_tools.testing import kafka_tls
from pydory_tools.testing.kafka_util import admin_create_topic
from pydory_tools.testing.lifecycle import (
    LOG_TAIL_BYTES,
    SHORT_LIVED_JVM_FLAGS,
    StopsOnExit,
    die_with_parent,
    find_java,
    log_tail,
    serve_until_signalled,
    terminate_then_kill,
)
from pydory_tools.testing.ports import LOOPBACK, accepts_connections, free_loopback_ports

__all__ = [
    "KafkaBrokerError",
    "KafkaCluster",
    "SaslUser",
    "find_kafka_jars",
    "kafka_version",
    "main",
]

_JARS_ENV = "PYDORY_KAFKA_JARS"
_POLL_INTERVAL_S = 0.05
# A broker on this 2-core machine serves the tests well in a small heap.
_JVM_OPTIONS = (
    "-Xms64m",
    "-Xmx512m",
    *SHORT_LIVED_JVM_FLAGS,
    "-Djava.awt.headless=true",
)
#: Starts of the whole cluster when a node could not bind a port it was given: another
#: process (a test suite beside this one) took it between its pick and the bind, which
#: ``ports.py`` asks its callers to treat as retryable (seen with five suites on a machine).
_BIND_ATTEMPTS = 3
_ADDRESS_IN_USE = "Address already in use"
# Settings for a small test cluster: no waiting for consumer groups, internal topics
# that fit the cluster, quick controlled shutdown.
_BASE_SETTINGS = {
    "group.initial.rebalance.delay.ms": "0",
    "num.partitions": "1",
    "auto.create.topics.enable": "true",
    "log.flush.interval.messages": str(2**63 - 1),
    "controlled.shutdown.enable": "true",
    "socket.request.max.bytes": str(100 * 1024 * 1024),
    "log.segment.bytes": str(64 * 1024 * 1024),
    "num.network.threads": "2",
    "num.io.threads": "2",
    "num.recovery.threads.per.data.dir": "1",
    "background.threads": "2",
    # Idle brokers (a test session keeps two clusters and runs others): measured over 40 s
    # of a 3-node cluster holding a 4-partition topic of RF 3 (JVM ticks at 100 Hz, per
    # minute), 729 before these four (heartbeats were every 500 ms), 340 with them; a
    # SASL+TLS node 142 and 92.
    # Notice a killed broker within ~3 s (default 9 s), so fault tests move on quickly;
    # a heartbeat a second (default 2 s, was 500 ms here) still misses two before that.
    "broker.session.timeout.ms": "3000",
    "broker.heartbeat.interval.ms": "1000",
    # No no-op record from the controller every 500 ms (an idle metadata log stays idle):
    # raft's I/O thread took 60 of 486 ticks, 16 without. Brokers are still fenced by
    # their heartbeats, the quorum's voters still fetch from its leader.
    "metadata.max.idle.interval.ms": "0",
    # A follower's fetch waits up to 5 s at an idle leader (default 0.5 s); new records end
    # it at once, so acks=all and catching up are not slowed: 590 -> 356 ticks a minute.
    "replica.fetch.wait.max.ms": "5000",
    # __consumer_offsets in 1 partition, not 50 (read-backs with a group.id make it): its
    # creation cost a 3-node cluster 2.5 CPU-s, now 0.8, and its replicas idle fetches.
    "offsets.topic.num.partitions": "1",
}
_SUPER_USER = "admin"
# What ``kafka-storage format`` writes into a node's metadata log directory.
_META_PROPERTIES = "meta.properties"
_BOOTSTRAP_CHECKPOINT = "bootstrap.checkpoint"


class KafkaBrokerError(PydoryError):
    """A Kafka broker could not be set up, started or stopped. Carries the log tail."""


@dataclass(frozen=True)
class SaslUser:
    """A SASL/PLAIN user of the ``SASL_PLAINTEXT`` listener."""

    name: str
    password: str


def find_kafka_jars() -> Path:
    """The directory of Kafka's jars: ``$PYDORY_KAFKA_JARS`` or the project's ``.jars/kafka``."""
    configured = os.environ.get(_JARS_ENV)
    directory = Path(configured) if configured else _project_root() / ".jars" / "kafka"
    if not any(directory.glob("kafka_2.13-*.jar")):
        raise KafkaBrokerError(
            f"no Apache Kafka jars in {directory}: run ./dev setup (it fetches them from "
            f"Maven Central), or set {_JARS_ENV} to a directory holding kafka_2.13 and its "
            "dependencies"
        )
    return directory


def kafka_version(jars: Path | None = None) -> str:
    """The Kafka release of the jars, from ``kafka_2.13-VERSION.jar``, e.g. ``4.3.1``."""
    for jar in sorted((jars or find_kafka_jars()).glob("kafka_2.13-*.jar")):
        match = re.fullmatch(r"kafka_2\.13-(.+)\.jar", jar.name)
        if match:
            return match.group(1)
    raise KafkaBrokerError("no kafka_2.13 jar found")


def _project_root() -> Path:
    # tools/src/pydory_tools/testing/kafka_broker.py -> the checkout (installed editable).
    return Path(__file__).resolve().parents[4]


@dataclass
class _Node:
    """One broker+controller process: its id, ports and directory survive restarts."""

    node_id: int
    directory: Path
    port: int
    controller_port: int
    sasl_port: int | None
    ssl_port: int | None
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def log_path(self) -> Path:
        return self.directory / "broker.log"

    @property
    def config_path(self) -> Path:
        return self.directory / "server.properties"

    @property
    def data_path(self) -> Path:
        """``log.dirs``, also the metadata log's directory (the first of ``log.dirs``)."""
        return self.directory / "data"


def _bind_failed(node: _Node) -> bool:
    """Whether the node's log says it could not bind one of its ports."""
    try:
        return _ADDRESS_IN_USE in node.log_path.read_text(errors="replace")
    except OSError:
        return False


def new_cluster_id() -> str:
    """A KRaft cluster id as Kafka's ``Uuid.randomUuid()`` makes one: 16 random bytes,
    URL-safe base64 without padding, never starting with ``-`` (one in 64 would, and
    ``kafka-storage format --cluster-id -...`` then takes it for an option). A log
    directory's id (``directory.id``) is drawn the same way."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


class KafkaCluster(StopsOnExit):
    """Apache Kafka brokers on 127.0.0.1, started by the constructor, ended by :meth:`stop`.

    ``brokers`` nodes (1 or more), each broker and controller. ``sasl_users`` adds a
    ``SASL_PLAINTEXT`` listener with those PLAIN users and turns on ACLs there (the
    user ``admin`` is added as a super user); ``tls`` adds an ``SSL`` listener whose CA
    certificate is :attr:`ca_path`. ``settings`` adds or overrides broker properties.
    Directories live under ``base_dir`` if given (kept afterwards), else in a
    temporary directory removed by :meth:`stop`.
    """

    def __init__(
        self,
        brokers: int = 1,
        *,
        sasl_users: Sequence[SaslUser] = (),
        tls: bool = False,
        settings: Mapping[str, str] | None = None,
        base_dir: Path | None = None,
        startup_timeout_s: float = 90.0,
    ) -> None:
        if brokers < 1:
            raise ValueError("a cluster needs at least one broker")
        self._jars = find_kafka_jars()
        self.version = kafka_version(self._jars)
        self._java = find_java(KafkaBrokerError, "Kafka")
        self._owns_base_dir = base_dir is None
        self.base_dir = (
            Path(tempfile.mkdtemp(prefix="pydory-kafka-")) if base_dir is None else base_dir
        )
        self._sasl_users = (
            (SaslUser(_SUPER_USER, f"{_SUPER_USER}-secret"), *sasl_users) if sasl_users else ()
        )
        self._settings = dict(settings or {})
        self._cluster_id = new_cluster_id()
        self._lock = threading.Lock()
        self._nodes = [self._plan_node(node_id, tls) for node_id in range(1, brokers + 1)]
        self.ca_path: Path | None = None
        try:
            if tls:
                self.ca_path = kafka_tls.write_certificates(self.base_dir / "tls")
            self._start(startup_timeout_s, tls)
        except BaseException:
            self.stop()
            raise

    def _start(self, startup_timeout_s: float, tls: bool) -> None:
        """Format and start every node; when one could not bind a port it was given (taken
        since it was picked), all of them again on new ports, ``_BIND_ATTEMPTS`` at most."""
        for attempt in range(1, _BIND_ATTEMPTS + 1):
            for node in self._nodes:
                self._write_config(node)
            first, *others = self._nodes
            self._format(first)
            for node in others:
                self._format_like(first, node)
            started = time.monotonic()
            for node in self._nodes:
                self._spawn(node)
            try:
                self.wait_until_ready(startup_timeout_s)
            except KafkaBrokerError:
                if attempt == _BIND_ATTEMPTS or not any(map(_bind_failed, self._nodes)):
                    raise
                self._plan_again(tls)
                continue
            self.startup_s = time.monotonic() - started
            return

    # --- addresses ---------------------------------------------------------------------

    @property
    def broker_ids(self) -> list[int]:
        return [node.node_id for node in self._nodes]

    @property
    def bootstrap_servers(self) -> str:
        """``bootstrap.servers`` for the PLAINTEXT listener of every node."""
        return ",".join(f"{LOOPBACK}:{node.port}" for node in self._nodes)

    @property
    def sasl_bootstrap_servers(self) -> str:
        """``bootstrap.servers`` for the SASL_PLAINTEXT listener (needs ``sasl_users``)."""
        return self._listener_bootstrap("sasl_port", "sasl_users")

    @property
    def ssl_bootstrap_servers(self) -> str:
        """``bootstrap.servers`` for the SSL listener (needs ``tls=True``)."""
        return self._listener_bootstrap("ssl_port", "tls=True")

    @property
    def admin_user(self) -> SaslUser:
        """The SASL super user, for creating ACLs over the SASL listener."""
        if not self._sasl_users:
            raise KafkaBrokerError("this cluster was started without sasl_users")
        return self._sasl_users[0]

    def describe(self) -> str:
        """One line for people: ``Apache Kafka 4.3.1 (KRaft), 1 broker at 127.0.0.1:PORT``."""
        count = len(self._nodes)
        noun = "broker" if count == 1 else "brokers"
        return f"Apache Kafka {self.version} (KRaft), {count} {noun} at {self.bootstrap_servers}"

    def pid(self, node_id: int) -> int | None:
        """The process id of node ``node_id``, or None while it is down."""
        process = self._node(node_id).process
        return None if process is None else process.pid

    def log_path(self, node_id: int) -> Path:
        return self._node(node_id).log_path

    # --- topics ------------------------------------------------------------------------

    def create_topic(
        self,
        name: str,
        partitions: int,
        replication_factor: int = 1,
        config: Mapping[str, str] | None = None,
        timeout_s: float = 60.0,
    ) -> None:
        """Create ``name`` and wait until every partition has a leader known to the client."""
        admin_create_topic(
            self.bootstrap_servers,
            name,
            partitions,
            replication_factor=replication_factor,
            config=config,
            timeout_s=timeout_s,
        )
        self.wait_for_leaders(name, partitions, timeout_s)

    def leaders(self, topic: str, timeout_s: float = 60.0) -> dict[int, int]:
        """``{partition: leader node id}`` as the cluster's metadata says now (-1: none)."""
        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers})
        metadata = admin.list_topics(topic, timeout=timeout_s)
        topic_metadata = metadata.topics[topic]
        if topic_metadata.error is not None:
            raise KafkaException(topic_metadata.error)
        return {p: info.leader for p, info in topic_metadata.partitions.items()}

    def in_sync_replicas(self, topic: str, timeout_s: float = 60.0) -> dict[int, list[int]]:
        """``{partition: in-sync replica ids}`` from the cluster's metadata."""
        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers})
        metadata = admin.list_topics(topic, timeout=timeout_s)
        return {p: sorted(info.isrs) for p, info in metadata.topics[topic].partitions.items()}

    def wait_for_leaders(self, topic: str, partitions: int, timeout_s: float = 60.0) -> None:
        """Wait until all ``partitions`` of ``topic`` have a leader."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                leaders = self.leaders(topic, timeout_s=max(deadline - time.monotonic(), 1.0))
            except KafkaException:
                leaders = {}
            if len(leaders) == partitions and all(leader >= 0 for leader in leaders.values()):
                return
            if time.monotonic() >= deadline:
                raise KafkaBrokerError(f"topic {topic}: partitions without leader: {leaders}")
            time.sleep(0.1)

    def wait_until_fully_replicated(self, topic: str, timeout_s: float = 60.0) -> None:
        """Wait until every partition of ``topic`` has all running brokers in sync."""
        deadline = time.monotonic() + timeout_s
        running = {node.node_id for node in self._nodes if node.process is not None}
        while True:
            isrs = self.in_sync_replicas(topic)
            if all(running <= set(isr) for isr in isrs.values()):
                return
            if time.monotonic() >= deadline:
                raise KafkaBrokerError(f"topic {topic}: in-sync replicas {isrs}, running {running}")
            time.sleep(0.2)

    # --- faults ------------------------------------------------------------------------

    def kill_broker(self, node_id: int) -> None:
        """SIGKILL node ``node_id`` and wait for it to be gone: a crash, no shutdown work."""
        node = self._node(node_id)
        process, node.process = node.process, None
        if process is not None:
            process.kill()
            process.wait()

    def pause_broker(self, node_id: int) -> None:
        """SIGSTOP node ``node_id``: a hung broker (its sockets stay open, nothing answers)
        until :meth:`resume_broker`."""
        process = self._node(node_id).process
        if process is not None:
            process.send_signal(signal.SIGSTOP)

    def resume_broker(self, node_id: int) -> None:
        """SIGCONT node ``node_id`` after :meth:`pause_broker`."""
        process = self._node(node_id).process
        if process is not None:
            process.send_signal(signal.SIGCONT)

    def stop_broker(self, node_id: int, timeout_s: float = 60.0) -> None:
        """SIGTERM node ``node_id``: a controlled shutdown that moves its leaders away first."""
        node = self._node(node_id)
        process, node.process = node.process, None
        if process is not None and not terminate_then_kill(process, timeout_s):
            raise KafkaBrokerError(f"broker {node_id} did not stop within {timeout_s} s; killed")

    def start_broker(self, node_id: int, timeout_s: float = 60.0) -> None:
        """Start node ``node_id`` again (after a stop or a kill), on its ports and data."""
        node = self._node(node_id)
        if node.process is not None:
            return
        self._spawn(node)
        self.wait_until_ready(timeout_s)

    def restart_stopped_brokers(self, timeout_s: float = 60.0) -> None:
        """Start every node that is down; return once all are back in the cluster."""
        for node in self._nodes:
            if node.process is None:
                self._spawn(node)
        self.wait_until_ready(timeout_s)

    # --- lifecycle ---------------------------------------------------------------------

    def wait_until_ready(self, timeout_s: float) -> None:
        """Wait until every running node listens and the cluster lists all of them."""
        deadline = time.monotonic() + timeout_s
        running = [node for node in self._nodes if node.process is not None]
        for node in running:
            self._wait_for_port(node, deadline)
        wanted = {node.node_id for node in running}
        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers})
        while True:
            self._check_alive(running)
            try:
                metadata = admin.list_topics(
                    timeout=max(min(deadline - time.monotonic(), 5.0), 0.5)
                )
                if wanted <= set(metadata.brokers):
                    return
            except KafkaException:
                pass
            if time.monotonic() >= deadline:
                raise KafkaBrokerError(
                    self._failure(running[0], f"cluster did not list brokers {sorted(wanted)}")
                )
            time.sleep(_POLL_INTERVAL_S)

    def stop(self, grace_s: float = 20.0) -> None:
        """End every broker; remove a temporary base_dir.

        Brokers whose data is kept (``base_dir`` given) get SIGTERM, a clean shutdown,
        and SIGKILL after ``grace_s``; brokers whose data is about to be deleted are
        killed at once: a clean shutdown would only cost seconds.
        """
        with self._lock:
            processes = [node.process for node in self._nodes if node.process is not None]
            for node in self._nodes:
                node.process = None
        # All at once: a lone survivor would wait for a quorum that is gone.
        for process in processes:
            if self._owns_base_dir:
                process.kill()
            else:
                process.terminate()
        deadline = time.monotonic() + grace_s
        for process in processes:
            try:
                process.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._owns_base_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def log_tail(self, node_id: int) -> str:
        """The last few kilobytes node ``node_id`` logged, for error messages."""
        return log_tail(self._node(node_id).log_path)

    # --- set-up ------------------------------------------------------------------------

    def _plan_node(self, node_id: int, tls: bool) -> _Node:
        directory = self.base_dir / f"node-{node_id}"
        directory.mkdir(parents=True, exist_ok=True)
        port, controller_port, sasl_port, ssl_port = free_loopback_ports(4)
        return _Node(
            node_id=node_id,
            directory=directory,
            port=port,
            controller_port=controller_port,
            sasl_port=sasl_port if self._sasl_users else None,
            ssl_port=ssl_port if tls else None,
        )

    def _plan_again(self, tls: bool) -> None:
        """After a failed start: every node killed, its directory removed, planned anew
        (new ports, a new cluster id)."""
        for node in self._nodes:
            self.kill_broker(node.node_id)
            shutil.rmtree(node.directory, ignore_errors=True)
        self._cluster_id = new_cluster_id()
        self._nodes = [self._plan_node(node.node_id, tls) for node in self._nodes]

    def _write_config(self, node: _Node) -> None:
        voters = ",".join(f"{n.node_id}@{LOOPBACK}:{n.controller_port}" for n in self._nodes)
        replication = str(min(len(self._nodes), 3))
        listeners = {"PLAINTEXT": node.port, "CONTROLLER": node.controller_port}
        if node.sasl_port is not None:
            listeners["SASL_PLAINTEXT"] = node.sasl_port
        if node.ssl_port is not None:
            listeners["SSL"] = node.ssl_port
        settings = {
            **_BASE_SETTINGS,
            "process.roles": "broker,controller",
            "node.id": str(node.node_id),
            "controller.quorum.voters": voters,
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listeners": ",".join(
                f"{name}://{LOOPBACK}:{port}" for name, port in listeners.items()
            ),
            "advertised.listeners": ",".join(
                f"{name}://{LOOPBACK}:{port}"
                for name, port in listeners.items()
                if name != "CONTROLLER"
            ),
            "listener.security.protocol.map": ",".join(
                f"{name}:{name}" for name in listeners
            ).replace("CONTROLLER:CONTROLLER", "CONTROLLER:PLAINTEXT"),
            "log.dirs": str(node.data_path),
            "offsets.topic.replication.factor": replication,
            "transaction.state.log.replication.factor": replication,
            "transaction.state.log.min.isr": "1",
            "share.coordinator.state.topic.replication.factor": replication,
            "share.coordinator.state.topic.min.isr": "1",
            **self._sasl_settings(),
            **self._ssl_settings(),
            **self._settings,
        }
        node.config_path.write_text("".join(f"{key}={value}\n" for key, value in settings.items()))
        (node.directory / "log4j2.properties").write_text(_log4j_config(node.log_path))

    def _sasl_settings(self) -> dict[str, str]:
        if not self._sasl_users:
            return {}
        users = " ".join(f'user_{u.name}="{u.password}"' for u in self._sasl_users)
        admin = self._sasl_users[0]
        return {
            "sasl.enabled.mechanisms": "PLAIN",
            "listener.name.sasl_plaintext.plain.sasl.jaas.config": (
                "org.apache.kafka.common.security.plain.PlainLoginModule required "
                f'username="{admin.name}" password="{admin.password}" {users};'
            ),
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            # PLAINTEXT and the controller listener carry User:ANONYMOUS (tests, brokers).
            "super.users": f"User:ANONYMOUS;User:{admin.name}",
            "allow.everyone.if.no.acl.found": "true",
        }

    def _ssl_settings(self) -> dict[str, str]:
        if self.ca_path is None:
            return {}
        return {
            "listener.name.ssl.ssl.keystore.type": "PEM",
            "listener.name.ssl.ssl.keystore.location": str(self.ca_path.parent / "server.pem"),
        }

    def _format(self, node: _Node) -> None:
        """Write the node's meta.properties and bootstrap metadata (``kafka-storage format``)."""
        command = [
            *self._java_command(node),
            "kafka.tools.StorageTool",
            "format",
            "--cluster-id",
            self._cluster_id,
            "--config",
            str(node.config_path),
            "--ignore-formatted",
        ]
        result = subprocess.run(command, capture_output=True, check=False, timeout=120)
        if result.returncode != 0:
            output = (result.stdout + result.stderr).decode(errors="replace")[-LOG_TAIL_BYTES:]
            raise KafkaBrokerError(f"formatting node {node.node_id} failed:\n{output}")

    def _format_like(self, formatted: _Node, node: _Node) -> None:
        """Give ``node`` the storage ``kafka-storage format`` gave ``formatted``, without a
        JVM of its own (one costs 1.3-1.8 CPU-s): the bootstrap metadata, the same for
        every node of the cluster (feature levels, no id of a node), and ``meta.properties``
        with the node's own id and a new directory id. A directory already formatted is
        left as it is, as ``--ignore-formatted`` does."""
        source, target = formatted.data_path, node.data_path
        if (target / _META_PROPERTIES).exists():
            return
        target.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source / _BOOTSTRAP_CHECKPOINT, target / _BOOTSTRAP_CHECKPOINT)
        properties = {
            "version": "1",
            "cluster.id": self._cluster_id,
            "node.id": str(node.node_id),
            "directory.id": new_cluster_id(),
        }
        (target / _META_PROPERTIES).write_text(
            "".join(f"{key}={value}\n" for key, value in properties.items())
        )

    def _java_command(self, node: _Node) -> list[str]:
        return [
            self._java,
            *_JVM_OPTIONS,
            f"-Dlog4j2.configurationFile={node.directory / 'log4j2.properties'}",
            "-cp",
            f"{self._jars}/*",
        ]

    def _spawn(self, node: _Node) -> None:
        command = [*self._java_command(node), "kafka.Kafka", str(node.config_path)]
        with (node.directory / "stdout.log").open("ab") as output:
            # Its own session, so a Ctrl-C aimed at the test run does not race our stop();
            # and killed with us, so a crashed or SIGKILLed test run leaves no broker.
            node.process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )

    def _wait_for_port(self, node: _Node, deadline: float) -> None:
        while not accepts_connections(LOOPBACK, node.port):
            self._check_alive([node])
            if time.monotonic() >= deadline:
                raise KafkaBrokerError(self._failure(node, "did not listen in time"))
            time.sleep(_POLL_INTERVAL_S)

    def _check_alive(self, nodes: Sequence[_Node]) -> None:
        for node in nodes:
            process = node.process
            if process is not None and process.poll() is not None:
                raise KafkaBrokerError(
                    self._failure(node, f"exited with status {process.returncode}")
                )

    def _failure(self, node: _Node, what: str) -> str:
        stdout = log_tail(node.directory / "stdout.log")
        return (
            f"Kafka node {node.node_id} ({LOOPBACK}:{node.port}) {what}; log {node.log_path}:\n"
            f"{log_tail(node.log_path)}\nstdout:\n{stdout}"
        )

    def _node(self, node_id: int) -> _Node:
        for node in self._nodes:
            if node.node_id == node_id:
                return node
        raise KeyError(f"no broker {node_id} (brokers: {self.broker_ids})")

    def _listener_bootstrap(self, attribute: str, needs: str) -> str:
        ports = [getattr(node, attribute) for node in self._nodes]
        if any(port is None for port in ports):
            raise KafkaBrokerError(f"this cluster was started without {needs}")
        return ",".join(f"{LOOPBACK}:{port}" for port in ports)


def _log4j_config(log_path: Path) -> str:
    return "\n".join(
        [
            "rootLogger.level = INFO",
            "rootLogger.appenderRef.file.ref = FILE",
            "logger.kafka.name = kafka",
            "logger.kafka.level = INFO",
            "logger.state.name = state.change.logger",
            "logger.state.level = WARN",
            "appender.file.type = File",
            "appender.file.name = FILE",
            f"appender.file.fileName = {log_path}",
            "appender.file.layout.type = PatternLayout",
            "appender.file.layout.pattern = [%d] %p %m (%c)%n",
            "",
        ]
    )


# --- python -m pydory_tools.testing.kafka_broker ---------------------------------------------


def _topic_spec(text: str) -> tuple[str, int, int]:
    """``NAME[:PARTITIONS[:REPLICATION]]``."""
    name, _, rest = text.partition(":")
    partitions, _, replication = rest.partition(":")
    try:
        return name, int(partitions or 1), int(replication or 1)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not NAME[:PARTITIONS[:REPLICATION]]: {text!r}") from None


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m pydory_tools.testing.kafka_broker",
        description="Run Apache Kafka (KRaft) on loopback; print the bootstrap string first. "
        "'python -m pydory_tools.testing.kafka_broker topics --help': make topics on a running "
        "one.",
    )
    parser.add_argument("--brokers", type=int, default=1, help="number of nodes (default 1)")
    parser.add_argument(
        "--topic",
        type=_topic_spec,
        action="append",
        default=[],
        metavar="NAME[:PARTITIONS[:RF]]",
        help="create a topic (repeatable)",
    )
    parser.add_argument("--dir", type=Path, help="keep the brokers' directories here")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["topics"]:  # on a running Kafka: pydory_tools.testing.kafka_topics
        from pydory_tools.testing import kafka_topics

        return kafka_topics.main(argv[1:])
    args = _parse_args(argv)

    def create_topics(cluster: KafkaCluster) -> None:
        for name, partitions, replication in args.topic:
            cluster.create_topic(name, partitions, replication)

    return serve_until_signalled(
        "kafka_broker",
        lambda: KafkaCluster(args.brokers, base_dir=args.dir),
        KafkaBrokerError,
        lambda cluster: cluster.bootstrap_servers,
        ready=create_topics,
    )


if __name__ == "__main__":
    sys.exit(main())
