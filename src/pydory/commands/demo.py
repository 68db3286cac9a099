"""`pydory demo`: an embedded Kafka, the daemon, clients on all three transports."""

from __future__ import annotations

import argparse
from typing import Any


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "demo",
        help="run the demo: embedded Kafka, the daemon, clients on every transport",
        description=(
            "Start an embedded Kafka (librdkafka's mock cluster by default), a pydory daemon "
            "on a generated config, and `pydory send` clients over UNIX datagram, UNIX stream "
            "and TCP; then read every message back from Kafka. Exits 0 when all arrived."
        ),
    )
    parser.add_argument(
        "--kafka",
        default="mock",
        help="'mock' (librdkafka's mock cluster), 'tansu' (the Tansu broker), "
        "or HOST:PORT[,HOST:PORT...] of your own cluster (default: mock)",
    )
    parser.add_argument("--brokers", type=int, default=3, help="mock cluster size (default: 3)")
    parser.add_argument(
        "--count", type=int, default=1000, help="messages per client (default: 1000)"
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from pydory.demo import run_demo  # the demo pulls in the test brokers: load on demand

    return run_demo(kafka=args.kafka, brokers=args.brokers, count=args.count)
