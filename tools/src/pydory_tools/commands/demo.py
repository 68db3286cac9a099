"""`pydory demo`: clients -> daemon -> Kafka -> Spark lake, then the audit (pydory_tools.demo).

Before it starts anything, the command checks what the demo needs from outside Python
(Java; Apache Kafka's jars for the default ``--kafka kafka``) and says what to do on this
host when something is missing: an installed pydory has no ``./dev`` and no ``.jars/``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path

from pydory.commands import Subparsers, add_command

DEFAULT_MASTER = "local[2]"


def register(subparsers: Subparsers) -> None:
    """Add the `demo` subcommand."""
    parser = add_command(
        subparsers,
        "demo",
        "Start Apache Kafka on loopback (or the mock cluster, Tansu, or your cluster) and "
        "a pydory daemon on a generated config; run client processes over UNIX datagram, "
        "UNIX stream and TCP (some sending messages the daemon must discard); land the "
        "topics in a Parquet lake with Spark; audit the lake against the daemon's books. "
        "Exits 0 only when the audit balances.",
        run,
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
    parser.add_argument(
        "--sigkill",
        type=_kills,
        default=0,
        metavar="N",
        help="SIGKILL the daemon N times at random moments while the clients send, "
        "restarting it on the same spool each time; then land (second copies dropped) and "
        "run the fleet audit on the books topic. Apache Kafka or your cluster only",
    )
    parser.add_argument(
        "--seed",
        type=int,
        help="with --sigkill or --fleet: seed the random moments of the kills (default: a "
        "fresh draw)",
    )
    parser.add_argument(
        "--fleet",
        action="store_true",
        help="a fleet off one machine: a 3-node Apache Kafka, HDFS, a Spark standalone "
        "cluster (a master, 2 workers) and 3 daemons with their own host ids and spools; "
        "each daemon SIGKILLed --sigkill times (default 2) and restarted, but one never "
        "comes back; a Spark worker and the landing job SIGKILLed mid-batch; then the fleet "
        "audit of the lake on HDFS. Starts its own parts: --kafka, --brokers and --master "
        "do not apply",
    )


def _kills(text: str) -> int:
    kills = int(text)
    if kills < 0:
        raise argparse.ArgumentTypeError(f"--sigkill takes a count of 0 or more, not {text}")
    return kills


def run(args: argparse.Namespace) -> int:
    problem = missing_prerequisite(args.kafka)
    if args.sigkill and args.kafka in ("mock", "tansu"):
        problem = (
            f"--sigkill needs Apache Kafka (--kafka kafka, the default) or your cluster, not "
            f"{args.kafka}: it creates the compacted books topic through Kafka's admin API"
        )
    if args.fleet:
        problem = problem or _fleet_problem(args)
    if problem:
        print(f"pydory demo: {problem}", file=sys.stderr)
        return 1
    from pydory_tools.testing.lifecycle import short_lived_spark_drivers

    # The demo's Spark jobs are short: their drivers run without the JIT's C2 (lifecycle.py).
    short_lived_spark_drivers()
    if args.fleet:
        from pydory_tools.demo_fleet import run_fleet_demo  # the clusters, Spark, the kill loop

        return run_fleet_demo(
            kills=args.sigkill or 2, count=args.count, workdir=args.workdir, seed=args.seed
        )
    demo: Callable[..., int]
    if args.sigkill:
        from pydory_tools.demo_kills import run_sigkill_demo  # Spark, the brokers, the kill loop

        demo = partial(run_sigkill_demo, args.sigkill, seed=args.seed)
    else:
        from pydory_tools.demo import run_demo  # the demo pulls in Spark and the test brokers

        demo = run_demo
    # What both demos take; --sigkill's also takes its kills and their seed (above).
    return demo(
        kafka=args.kafka,
        brokers=args.brokers,
        count=args.count,
        workdir=args.workdir,
        master=args.master,
    )


def _fleet_problem(args: argparse.Namespace) -> str | None:
    """Why ``--fleet`` cannot run with these arguments or on this host; None when it can."""
    if args.kafka != "kafka" or args.brokers is not None or args.master != DEFAULT_MASTER:
        return (
            "--fleet starts its own 3-node Apache Kafka, HDFS and Spark cluster: "
            "--kafka, --brokers and --master do not apply"
        )
    from pydory_tools.testing.hdfs_cluster import HdfsError, find_hadoop_jars

    try:
        find_hadoop_jars()
    except HdfsError as error:
        return f"--fleet needs HDFS: {error}"
    return None


def missing_prerequisite(kafka: str) -> str | None:
    """What the demo lacks on this host, and what to do about it; None when nothing."""
    if not (os.environ.get("JAVA_HOME") or shutil.which("java")):
        return (
            "Spark (and Apache Kafka) run on Java, and there is no java on PATH and no "
            "JAVA_HOME: install Java 17 or newer (e.g. apt install openjdk-17-jre-headless)"
        )
    if kafka != "kafka":
        return None
    from pydory_tools.testing.kafka_broker import KafkaBrokerError, find_kafka_jars

    try:
        find_kafka_jars()
    except KafkaBrokerError:
        return _no_kafka_jars()
    return None


def _no_kafka_jars() -> str:
    advice = (
        "Apache Kafka's jars are not on this host, so the demo cannot start a Kafka of "
        "its own. Either run `pydory demo --kafka mock` (librdkafka's mock cluster: nothing "
        "to fetch), or `pydory demo --kafka HOST:PORT` against a Kafka you run, or set "
        "PYDORY_KAFKA_JARS to the libs/ directory of an Apache Kafka 4 download "
        "(https://kafka.apache.org/downloads)"
    )
    checkout = source_checkout()
    if checkout is not None:
        advice += f"; in this source checkout, `./dev setup` fetches them into {checkout}/.jars"
    return advice


def source_checkout() -> Path | None:
    """The source checkout pydory runs from (an editable install), or None when it is
    installed from a wheel (then there is no ./dev script next to it)."""
    root = Path(__file__).resolve().parents[4]  # tools/src/pydory_tools/commands/demo.py
    return root if (root / "dev").is_file() and (root / "pyproject.toml").is_file() else None
