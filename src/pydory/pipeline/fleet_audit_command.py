"""`pydory pipeline fleet-audit`: the command line of :mod:`pydory.pipeline.fleet_audit`.

Kept apart from the job so that building the CLI parser does not import PySpark.
Exit status: 0 every host's books balance with the lake, 1 they do not, 2 the audit
could not run (no lake at that path, books topic unreadable, a state of another lake).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

# The same defaults as pydory.pipeline.fleet_audit and pydory.pipeline.spark, spelt here
# without importing PySpark.
DEFAULT_BOOKS_TOPIC = "pydory.books"
DEFAULT_MASTER = "local[*]"


def register(subparsers: Any) -> None:
    """Add ``fleet-audit`` to the ``pydory pipeline`` subcommands."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "fleet-audit",
        help="prove every daemon's books (from the books topic) against the lake",
        description=(
            "Read every daemon run's books from the books topic and every message "
            "identity (pydory-id) from the lake the landing job wrote, and prove per host "
            "and topic: accepted = landed once + discarded by reason + possibly delivered "
            "and not landed + outstanding in a spool, with no identity landed twice. Asks "
            "no daemon anything. With --state, later runs read only what is new. Exits 0 "
            "when every host balances, 1 when not, 2 when the audit cannot run."
        ),
    )
    parser.add_argument(
        "--lake", required=True, metavar="DIR", help="the landing job's --lake directory"
    )
    parser.add_argument(
        "--bootstrap-servers",
        required=True,
        metavar="HOST:PORT",
        help="Kafka's bootstrap servers (where the daemons publish their books)",
    )
    parser.add_argument(
        "--books-topic",
        default=DEFAULT_BOOKS_TOPIC,
        metavar="TOPIC",
        help=f"the daemons' <messageIdentity><booksTopic> (default: {DEFAULT_BOOKS_TOPIC})",
    )
    parser.add_argument(
        "--state",
        metavar="DIR",
        help="keep what this run read in DIR, and read only what is new next time",
    )
    parser.add_argument(
        "--connector",
        choices=("native", "python"),
        default="native",
        help="how Spark reads the books topic: native (default), Spark's own kafka "
        "source; python, pydory's (as for `pydory pipeline land`)",
    )
    parser.add_argument(
        "--master", default=DEFAULT_MASTER, help=f"Spark master URL (default: {DEFAULT_MASTER})"
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Run the fleet audit and print the report; see the module docstring."""
    from pydory.pipeline.audit import NotALake
    from pydory.pipeline.fleet_audit import (
        BooksTopicUnavailable,
        StateMismatch,
        fleet_audit,
        require_lake,
    )
    from pydory.pipeline.spark import spark_session

    try:
        require_lake(args.lake)  # before Spark starts: a wrong path is told at once
        spark = spark_session(master=args.master, app_name="pydory-fleet-audit")
        report = fleet_audit(
            spark,
            args.lake,
            bootstrap_servers=args.bootstrap_servers,
            books_topic=args.books_topic,
            state_dir=args.state,
            connector=args.connector,
        )
    except (NotALake, BooksTopicUnavailable, StateMismatch) as error:
        print(f"pydory pipeline fleet-audit: {error}", file=sys.stderr)
        return 2
    sys.stdout.write(report.to_json() if args.json else report.render())
    return 0 if report.balanced else 1
