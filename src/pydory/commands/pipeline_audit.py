"""`pydory pipeline audit`: the command line of :mod:`pydory.pipeline.audits.audit`.

Kept apart from the job so that building the CLI parser does not import PySpark.
Exit status: 0 the lake reconciles with the books, 1 it does not, 2 the audit could not
run (no lake at that path, books unreadable or not given, a lake file unreadable, Kafka
not answering, Spark not starting: one line naming the cause).
"""

from __future__ import annotations

import argparse
import sys

from pydory.commands import Subparsers, add_subcommand
from pydory.commands.pipeline_options import (
    add_audited_lake_option,
    add_bootstrap_option,
    add_json_report_option,
    add_master_option,
    add_topics_filter_option,
)


def register(subparsers: Subparsers) -> None:
    """Add ``audit`` to the ``pydory pipeline`` subcommands."""
    parser = add_subcommand(
        subparsers,
        "audit",
        help="reconcile the lake with the daemon's books",
        description=(
            "Read the lake the landing job wrote (through the file sink's commit log) and "
            "the daemon's books, and print per topic: accepted, delivered, discarded by "
            "reason, possibly delivered and left for the next start when any, landed, "
            "duplicate rows and missing offsets. Exits 0 when every topic landed what the "
            "daemon delivered, once, and at most what it possibly delivered besides (or left "
            "for its next start); 1 when not; 2 when the audit cannot run."
        ),
        handler=run,
    )
    add_audited_lake_option(parser)
    parser.add_argument(
        "--status",
        action="append",
        default=[],
        metavar="URL",
        help="a daemon's status server, e.g. http://127.0.0.1:9090 (reads URL/books/json); "
        "repeat it for every daemon (host) that feeds the topics",
    )
    parser.add_argument(
        "--books",
        action="append",
        default=[],
        metavar="FILE",
        help="a saved copy of a daemon's /books/json (for a daemon that has exited, or an "
        "earlier run of one that restarted); repeatable, and combinable with --status",
    )
    add_master_option(parser)
    add_topics_filter_option(parser, "every topic in the books or the lake")
    add_bootstrap_option(
        parser,
        "Kafka's bootstrap servers, to tell apart what a gap in a partition's offsets is: "
        "a second copy the landing job dropped (its identity is in the lake) or a record "
        "that never landed (default: the servers the landing job recorded in the lake; "
        "without either, every gap counts as missing)",
        required=False,
    )
    parser.add_argument(
        "--from-offset-zero",
        action="store_true",
        help="the lake should hold every partition from offset 0 (fresh topics, nothing "
        "aged out): count offsets below a partition's first landed one as missing",
    )
    add_json_report_option(parser)


def run(args: argparse.Namespace) -> int:
    """Run the audit and print the report; see the module docstring for the exit status."""
    from pydory.pipeline.audits.audit import BooksUnavailable, NotALake, audit, load_books
    from pydory.pipeline.audits.reconcile import BooksFormatError, DaemonBooks
    from pydory.pipeline.faults import EXIT_COULD_NOT_RUN, CouldNotRun, could_not_run
    from pydory.pipeline.spark import job_session

    if not args.status and not args.books:
        print(
            "pydory pipeline audit: give the daemon's books: --status URL or --books FILE",
            file=sys.stderr,
        )
        return EXIT_COULD_NOT_RUN
    sources = [f"{url.rstrip('/')}/books/json" for url in args.status] + args.books
    try:
        books = DaemonBooks.combined(
            [load_books(status_url=url) for url in args.status]
            + [load_books(books_file=path) for path in args.books]
        )
        with (
            could_not_run("pipeline audit"),
            job_session(master=args.master, app_name="pydory-audit") as spark,
        ):
            report = audit(
                spark,
                args.lake,
                books,
                topics=args.topics,
                from_offset_zero=args.from_offset_zero,
                books_source=", ".join(sources),
                bootstrap_servers=args.bootstrap_servers,
            )
    except (NotALake, BooksUnavailable, BooksFormatError) as error:
        print(f"pydory pipeline audit: {error}", file=sys.stderr)
        return EXIT_COULD_NOT_RUN
    except CouldNotRun as error:
        print(error, file=sys.stderr)
        return EXIT_COULD_NOT_RUN
    sys.stdout.write(report.to_json() if args.json else report.render())
    return 0 if report.balanced else 1
