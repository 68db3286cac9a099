"""`python -m pydory_tools.testing.kafka_broker topics`: make or list topics on a running Kafka.

The project's Kafka is Kafka's jars, without Kafka's shell scripts (``kafka-topics.sh``):
this is the small stand-in operations.md's steps use, on the Admin API through
confluent-kafka, with ``kafka-topics.sh``'s spelling of the options it shares
(``--bootstrap-server``, ``--create``, ``--topic``, ``--partitions``,
``--replication-factor``, ``--config``, ``--if-not-exists``, ``--list``), so a step reads
the same either way.

Rule: a topic is made only as asked (`create`): an existing one is left as it is (an error unless
``--if-not-exists``), never altered.

Exit status: 0; 1 when Kafka refused or did not answer (one line each on stderr); 2 for a
usage error.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from pydory_tools.testing.kafka_util import admin_create_topic

TIMEOUT_S = 60.0  # a safety net: Kafka answers a create in well under a second


def _config_pair(text: str) -> tuple[str, str]:
    key, equals, value = text.partition("=")
    if not key or not equals:
        raise argparse.ArgumentTypeError(f"not KEY=VALUE: {text!r}")
    return key, value


def _parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m pydory_tools.testing.kafka_broker topics",
        description="Create or list topics on a running Kafka (kafka-topics.sh's options).",
    )
    parser.add_argument("--bootstrap-server", required=True, metavar="HOST:PORT[,...]")
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--create", action="store_true", help="create --topic")
    action.add_argument("--list", action="store_true", help="print every topic's name")
    parser.add_argument("--topic", help="the topic to create")
    parser.add_argument("--partitions", type=int, default=1, help="(default 1)")
    parser.add_argument("--replication-factor", type=int, default=1, help="(default 1)")
    parser.add_argument(
        "--config",
        type=_config_pair,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a topic property, e.g. cleanup.policy=compact (repeatable)",
    )
    parser.add_argument(
        "--if-not-exists", action="store_true", help="a topic that exists is not an error"
    )
    args = parser.parse_args(argv)
    if args.create and not args.topic:
        parser.error("--create needs --topic NAME")
    return args


def create(
    bootstrap: str,
    name: str,
    partitions: int,
    replication_factor: int,
    config: Mapping[str, str],
    if_not_exists: bool,
) -> str:
    """Create the topic; the line to print. Raises KafkaException when Kafka refuses."""
    try:
        admin_create_topic(bootstrap, name, partitions, replication_factor, TIMEOUT_S, config)
    except KafkaException as error:
        (kafka_error,) = error.args
        if if_not_exists and kafka_error.code() == KafkaError.TOPIC_ALREADY_EXISTS:
            return f"topic {name} exists already: left as it is"
        raise
    settings = "".join(f", {key}={value}" for key, value in config.items())
    return (
        f"created topic {name}: {partitions} partition{'s' * (partitions != 1)}, "
        f"replication factor {replication_factor}{settings}"
    )


def topic_names(bootstrap: str) -> list[str]:
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 4})
    metadata = admin.list_topics(timeout=TIMEOUT_S)
    return sorted(name for name in metadata.topics if not name.startswith("__"))


def main(argv: Sequence[str]) -> int:
    args = _parse_args(argv)
    try:
        if args.list:
            print("\n".join(topic_names(args.bootstrap_server)))
        else:
            print(
                create(
                    args.bootstrap_server,
                    args.topic,
                    args.partitions,
                    args.replication_factor,
                    dict(args.config),
                    args.if_not_exists,
                )
            )
    except KafkaException as error:
        (kafka_error,) = error.args
        reason = kafka_error.str() if isinstance(kafka_error, KafkaError) else str(kafka_error)
        print(f"kafka_broker topics: {reason}", file=sys.stderr)
        return 1
    except TimeoutError:
        print(
            f"kafka_broker topics: no answer from {args.bootstrap_server} within {TIMEOUT_S:g} s",
            file=sys.stderr,
        )
        return 1
    return 0
