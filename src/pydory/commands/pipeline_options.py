"""The options that the pipeline's commands (`land`, `audit`, `fleet-audit`) share, spelt
once, so that a flag means the same in each.

Building the parsers imports no PySpark (``pydory --help`` stays fast): this module is
stdlib only, and the defaults that the jobs also hold are spelt again here for that reason.
"""

from __future__ import annotations

import argparse

#: pydory.pipeline.spark.DEFAULT_MASTER, without importing PySpark.
DEFAULT_MASTER = "local[*]"
#: How Spark reads Kafka: "native" is Spark's own kafka source, "python" pydory's.
CONNECTORS = ("native", "python")


def add_master_option(parser: argparse.ArgumentParser) -> None:
    """``--master URL``: where the job's Spark runs."""
    parser.add_argument(
        "--master", default=DEFAULT_MASTER, help=f"Spark master URL (default: {DEFAULT_MASTER})"
    )


def add_connector_option(parser: argparse.ArgumentParser, help_text: str) -> None:
    """``--connector native|python`` (default native); ``help_text`` says what it reads."""
    parser.add_argument("--connector", choices=CONNECTORS, default="native", help=help_text)


def add_bootstrap_option(
    parser: argparse.ArgumentParser, help_text: str, *, required: bool
) -> None:
    """``--bootstrap-servers HOST:PORT,...`` (``--bootstrap``, its first spelling, kept as an
    alias), spelt alike by every pipeline command; in ``args.bootstrap_servers``."""
    parser.add_argument(
        "--bootstrap-servers",
        "--bootstrap",
        dest="bootstrap_servers",
        required=required,
        metavar="HOST:PORT,...",
        help=help_text,
    )


def add_topics_filter_option(parser: argparse.ArgumentParser, default_help: str) -> None:
    """An audit's ``--topics A,B``: audit only these topics."""
    parser.add_argument(
        "--topics",
        type=topic_list,
        metavar="A,B",
        help=f"audit only these topics (default: {default_help})",
    )


def add_audited_lake_option(parser: argparse.ArgumentParser) -> None:
    """An audit's ``--lake DIR``: the lake that the landing job wrote."""
    parser.add_argument(
        "--lake", required=True, metavar="DIR", help="the landing job's --lake directory"
    )


def add_json_report_option(parser: argparse.ArgumentParser) -> None:
    """An audit's ``--json``: its report as JSON rather than for a person."""
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def topic_list(text: str) -> list[str]:
    """argparse type of ``A,B``: the topic names, blanks dropped, at least one."""
    topics = [name.strip() for name in text.split(",") if name.strip()]
    if not topics:
        raise argparse.ArgumentTypeError("expected a comma-separated list of topics")
    return topics
