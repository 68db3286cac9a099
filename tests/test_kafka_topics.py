"""`python -m pydory_tools.testing.kafka_broker topics` on a running Apache Kafka: operations.md's
books-topic step as written, and what it says when the topic exists."""

from __future__ import annotations

import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

from pydory_tools.testing.kafka_broker import KafkaCluster

ROOT = Path(__file__).parents[1]
OPERATIONS_MD = ROOT / "docs" / "operations.md"
STEP = re.compile(r"<!-- books-topic step [^>]*-->\n```sh\n(.*?)\n```", re.DOTALL)

pytestmark = pytest.mark.kafka


def topics(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pydory_tools.testing.kafka_broker", "topics", *args],
        capture_output=True,
        text=True,
        timeout=300,  # a safety net: the command asks Kafka once
        check=False,
    )


def documented_step(bootstrap: str, topic: str) -> list[str]:
    """operations.md's books-topic command, for this broker and a topic of this test's."""
    (block,) = STEP.findall(OPERATIONS_MD.read_text(encoding="utf-8"))
    command = re.sub(r"\\\n\s*", "", block).split()
    assert command[:3] == [".venv/bin/python", "-m", "pydory_tools.testing.kafka_broker"]
    replaced = {"127.0.0.1:PORT": bootstrap, "pydory.books": topic}
    return [replaced.get(word, word) for word in command[3:]]


def cleanup_policy(bootstrap: str, topic: str) -> str:
    resource = ConfigResource(ResourceType.TOPIC, topic)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    described = admin.describe_configs([resource])[resource].result(timeout=60)
    return str(described["cleanup.policy"].value)


def test_operations_md_books_topic_step_makes_a_compacted_topic(
    kafka_broker: KafkaCluster,
) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    topic = f"pydory.books.{uuid.uuid4().hex[:8]}"

    made = topics(*documented_step(bootstrap, topic)[1:])

    assert made.returncode == 0, made.stderr
    assert made.stdout.strip() == (
        f"created topic {topic}: 1 partition, replication factor 1, cleanup.policy=compact"
    )
    assert kafka_broker.leaders(topic) == {0: kafka_broker.broker_ids[0]}
    assert cleanup_policy(bootstrap, topic) == "compact"
    listed = topics("--bootstrap-server", bootstrap, "--list")
    assert topic in listed.stdout.split()


def test_a_topic_that_exists_is_an_error_unless_if_not_exists(
    kafka_broker: KafkaCluster,
) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    topic = f"exists-{uuid.uuid4().hex[:8]}"
    kafka_broker.create_topic(topic, 2)
    create = ("--bootstrap-server", bootstrap, "--create", "--topic", topic)

    again = topics(*create, "--config", "cleanup.policy=compact")
    tolerated = topics(*create, "--if-not-exists", "--config", "cleanup.policy=compact")

    assert again.returncode == 1
    assert again.stderr.startswith("kafka_broker topics: ")
    assert "already exists" in again.stderr
    assert tolerated.returncode == 0, tolerated.stderr
    assert tolerated.stdout.strip() == f"topic {topic} exists already: left as it is"
    assert cleanup_policy(bootstrap, topic) == "delete"  # left as it was


def test_usage_errors_are_status_2() -> None:
    assert topics("--bootstrap-server", "127.0.0.1:1", "--create").returncode == 2
    assert topics("--create", "--topic", "x").returncode == 2
    assert topics("--bootstrap-server", "x", "--list", "--config", "novalue").returncode == 2
