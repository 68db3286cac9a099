"""`pydory demo`: clients -> daemon -> Kafka -> Spark lake, then the audit (pydory.demo)."""

from __future__ import annotations

import argparse
from typing import Any

DEFAULT_MASTER = "local[2]"


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "demo",
        help="run the demo: clients, the daemon, Kafka, the Spark lake and its audit",
        description=(
            "Start Apache Kafka on loopback (or the mock cluster, Tansu, or your cluster) and "
            "a pydory "
            "daemon on a generated config; run client processes over UNIX datagram, UNIX "
            "stream and TCP (some sending messages the daemon must discard); land the topics "
            "in a Parquet lake with Spark; audit the lake against the daemon's books. "
            "Exits 0 only when the audit balances."
        ),
    )
    parser.add_argument(
        "--kafka",
        default="kafka",
        help="'kafka' (Apache Kafka in KRaft mode, from the jars ./dev fetched), 'mock' "
        "(librdkafka's mock cluster), 'tansu' (the Tansu broker), or HOST:PORT[,HOST:PORT...] "
        "of your own cluster (default: kafka)",
    )
    parser.add_argument(
        "--brokers",
        type=int,
        help="brokers to start for 'kafka' (default 1) or 'mock' (default 3)",
    )
    parser.add_argument(
        "--count", type=int, default=2000, help="messages per well-behaved client (default: 2000)"
    )
    parser.add_argument(
        "--workdir",
        metavar="DIR",
        help="where to write the config, logs, books, lake and reports (new or empty; "
        "default: a fresh temporary directory, kept and printed)",
    )
    parser.add_argument(
        "--master",
        default=DEFAULT_MASTER,
        help=f"Spark master for the landing job and the audit (default: {DEFAULT_MASTER})",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from pydory.demo import run_demo  # the demo pulls in Spark and the test brokers

    return run_demo(
        kafka=args.kafka,
        brokers=args.brokers,
        count=args.count,
        workdir=args.workdir,
        master=args.master,
    )
