"""`pydory pipeline fleet-audit`: the command line of :mod:`pydory.pipeline.audits.fleet_audit`.

Kept apart from the job so that building the CLI parser does not import PySpark.
Exit status: 0 every host's books balance with the lake, 1 they do not, 2 the audit
could not run (no lake at that path, books topic unreadable, a state of another lake).
A run with ``--state`` that finds nothing new since the last run starts no Spark
(:func:`~pydory.pipeline.audits.fleet_audit.audit_from_state`).
"""

from __future__ import annotations

import argparse
import sys

from pydory.commands import Subparsers, add_subcommand
from pydory.commands.pipeline_options import (
    add_audited_lake_option,
    add_bootstrap_option,
    add_connector_option,
    add_json_report_option,
    add_master_option,
    add_topics_filter_option,
)

#: The same default as pydory.pipeline.audits.fleet_audit's, spelt here without importing PySpark.
DEFAULT_BOOKS_TOPIC = "pydory.books"


def register(subparsers: Subparsers) -> None:
    """Add ``fleet-audit`` to the ``pydory pipeline`` subcommands."""
    parser = add_subcommand(
        subparsers,
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
        handler=run,
    )
    add_audited_lake_option(parser)
    add_bootstrap_option(
        parser, "Kafka's bootstrap servers (where the daemons publish their books)", required=True
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
    add_connector_option(
        parser,
        "how Spark reads the books topic: native (default), Spark's own kafka "
        "source; python, pydory's (as for `pydory pipeline land`)",
    )
    add_master_option(parser)
    add_topics_filter_option(
        parser,
        "every topic in the books or the lake; give the topics the lake lands when the "
        "daemons also send others",
    )
    add_json_report_option(parser)


def run(args: argparse.Namespace) -> int:
    """Run the fleet audit and print the report; see the module docstring."""
    from pydory.pipeline.audits.audit import NotALake
    from pydory.pipeline.audits.fleet_audit import (
        BooksTopicUnavailable,
        StateMismatch,
        audit_from_state,
        fleet_audit,
        require_lake,
    )
    from pydory.pipeline.faults import EXIT_COULD_NOT_RUN, CouldNotRun, could_not_run
    from pydory.pipeline.lake_files import is_local
    from pydory.pipeline.spark import job_session

    try:
        if is_local(args.lake):
            require_lake(args.lake)  # before Spark starts: a wrong path is told at once
        # An incremental run with nothing new since its state: its report, without Spark.
        with could_not_run("pipeline fleet-audit"):
            report = audit_from_state(
                args.lake,
                bootstrap_servers=args.bootstrap_servers,
                books_topic=args.books_topic,
                state_dir=args.state,
                topics=args.topics,
            )
        if report is None:
            with (
                could_not_run("pipeline fleet-audit"),
                job_session(master=args.master, app_name="pydory-fleet-audit") as spark,
            ):
                report = fleet_audit(
                    spark,
                    args.lake,
                    bootstrap_servers=args.bootstrap_servers,
                    books_topic=args.books_topic,
                    state_dir=args.state,
                    connector=args.connector,
                    topics=args.topics,
                )
    except (NotALake, BooksTopicUnavailable, StateMismatch) as error:
        print(f"pydory pipeline fleet-audit: {error}", file=sys.stderr)
        return EXIT_COULD_NOT_RUN
    except CouldNotRun as error:
        print(error, file=sys.stderr)
        return EXIT_COULD_NOT_RUN
    sys.stdout.write(report.to_json() if args.json else report.render())
    return 0 if report.balanced else 1
