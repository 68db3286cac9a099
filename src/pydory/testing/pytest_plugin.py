"""pytest fixtures for Kafka brokers, registered as the ``pydory`` pytest11 plugin.

- ``mock_cluster``: a fresh 3-broker librdkafka mock cluster per test.
- ``mock_cluster_factory``: ``make(brokers=3) -> MockCluster``, all stopped after the test.
- ``tansu_broker``: one Tansu broker per session; isolate tests by unique topic names.
- ``unique_topic``: ``make(prefix="test") -> str``, a topic name no other test uses.

The helpers behind them live in plain modules (``pydory.testing.kafka_util`` and
friends) so the demo can use them without pytest.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from pydory.testing import kafka_util
from pydory.testing.mock_cluster import MockCluster
from pydory.testing.tansu import TansuBroker


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


@pytest.fixture(scope="session")
def tansu_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TansuBroker]:
    """One Tansu broker for the whole session; its log is kept in pytest's tmp dir."""
    with TansuBroker(log_dir=tmp_path_factory.mktemp("tansu")) as broker:
        yield broker


@pytest.fixture
def unique_topic() -> Callable[[str], str]:
    """``unique_topic(prefix)`` returns a fresh topic name, so tests can share a broker."""
    return kafka_util.unique_topic
