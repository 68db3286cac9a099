"""pytest fixtures for Kafka brokers: a plugin loaded on request (``tests/conftest.py``
names it in ``pytest_plugins``; elsewhere ``pytest -p pydory_tools.testing.pytest_plugin``).

- ``mock_cluster``: a fresh 3-broker librdkafka mock cluster per test.
- ``mock_cluster_factory``: ``make(brokers=3) -> MockCluster``, all stopped after the test.
- ``kafka_broker``: one Apache Kafka broker (KRaft) per session, with PLAINTEXT,
  SASL_PLAINTEXT (users ``alice`` and ``mallory``, ACLs on) and SSL listeners.
- ``kafka_cluster``: three Apache Kafka nodes per session, for replication and broker
  faults; brokers a test stopped or killed are started again after it.
- ``tansu_broker``: one Tansu broker per session; isolate tests by unique topic names.
- ``unique_topic``: ``make(prefix="test") -> str``, a topic name no other test uses.
- ``hdfs_cluster``: HDFS (Hadoop's MiniDFSCluster, one datanode) per session.
- ``spark_cluster``: a Spark standalone master and two workers per session.

Loading it also starts every Spark driver of the run (a test's session, a ``pipeline``
command it runs) with the short-lived JVM flags (``lifecycle.short_lived_spark_drivers``).

The helpers behind them live in plain modules (``pydory_tools.testing.kafka_util`` and
friends) so the demo can use them without pytest.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from pydory_tools.testing import kafka_util
from pydory_tools.testing.hdfs_cluster import HdfsCluster
from pydory_tools.testing.kafka_broker import KafkaCluster, SaslUser
from pydory_tools.testing.lifecycle import short_lived_spark_drivers
from pydory_tools.testing.mock_cluster import MockCluster
from pydory_tools.testing.spark_cluster import SparkCluster
from pydory_tools.testing.tansu import TansuBroker


def pytest_configure(config: pytest.Config) -> None:
    """Before any test: Spark drivers the tests start skip the JIT's optimising compiler."""
    short_lived_spark_drivers()


@pytest.fixture
def mock_cluster() -> Iterator[MockCluster]:
    """A running 3-broker mock cluster, stopped after the test."""
    with MockCluster(brokers=3) as cluster:
        yield cluster


@pytest.fixture
def mock_cluster_factory() -> Iterator[Callable[..., MockCluster]]:
    """A function that starts mock clusters; every one is stopped after the test."""
    started: list[MockCluster] = []

    def make(brokers: int = 3) -> MockCluster:
        cluster = MockCluster(brokers)
        started.append(cluster)
        return cluster

    yield make
    for cluster in started:
        cluster.stop()


# SASL users of the session broker: alice is granted what a test grants her, mallory nothing.
KAFKA_SASL_USERS = (SaslUser("alice", "alice-secret"), SaslUser("mallory", "mallory-secret"))


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    """One Apache Kafka broker for the whole session; its logs stay in pytest's tmp dir."""
    with KafkaCluster(
        1, sasl_users=KAFKA_SASL_USERS, tls=True, base_dir=tmp_path_factory.mktemp("kafka")
    ) as broker:
        yield broker


@pytest.fixture(scope="session")
def _kafka_cluster_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    with KafkaCluster(3, base_dir=tmp_path_factory.mktemp("kafka-cluster")) as cluster:
        yield cluster


@pytest.fixture
def kafka_cluster(_kafka_cluster_session: KafkaCluster) -> Iterator[KafkaCluster]:
    """Three Apache Kafka nodes shared by the session, all running when a test starts."""
    _kafka_cluster_session.restart_stopped_brokers()
    yield _kafka_cluster_session
    _kafka_cluster_session.restart_stopped_brokers()


@pytest.fixture(scope="session")
def tansu_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TansuBroker]:
    """One Tansu broker for the whole session; its log is kept in pytest's tmp dir."""
    with TansuBroker(log_dir=tmp_path_factory.mktemp("tansu")) as broker:
        yield broker


@pytest.fixture
def unique_topic() -> Callable[[str], str]:
    """``unique_topic(prefix)`` returns a fresh topic name, so tests can share a broker."""
    return kafka_util.unique_topic


@pytest.fixture(scope="session")
def hdfs_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HdfsCluster]:
    """HDFS for the whole session (tests use paths of their own under its URI); its data
    and log stay in pytest's tmp dir."""
    with HdfsCluster(1, base_dir=tmp_path_factory.mktemp("hdfs")) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    """A Spark standalone master and two workers (1 core, 1 GiB each) for the session;
    their logs stay in pytest's tmp dir."""
    with SparkCluster(2, base_dir=tmp_path_factory.mktemp("spark-cluster")) as cluster:
        yield cluster
