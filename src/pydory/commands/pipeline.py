"""`pydory pipeline`: the Spark jobs downstream of the daemon (`land`, `audit`).

Each pipeline job registers itself as a sub-subcommand through a function in
``SUBCOMMANDS`` taking the group's subparsers. The jobs import PySpark only when they
run, so that ``pydory --help`` stays fast.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from pydory import wire
from pydory.commands import (
    Subparsers,
    add_command_group,
    add_subcommand,
    pipeline_audit,
    pipeline_fleet_audit,
)
from pydory.commands.arguments import positive_float, positive_int
from pydory.commands.pipeline_options import (
    add_bootstrap_option,
    add_connector_option,
    add_master_option,
    topic_list,
)
from pydory.errors import BadTopic

#: pydory.pipeline.landing.dedup.DEFAULT_WINDOW_S, spelt here so that --help needs no PySpark.
DEFAULT_DEDUP_WINDOW_S = 600.0
#: land.DEFAULT_EXECUTOR_WAIT_S, likewise.
DEFAULT_EXECUTOR_WAIT_S = 300.0

PipelineSubcommand = Callable[[Subparsers], None]


def register(subparsers: Subparsers) -> None:
    """Add the `pipeline` command group and its subcommands."""
    commands = add_command_group(
        subparsers,
        "pipeline",
        "Spark jobs downstream of the daemon (see docs/pipeline.md).",
        title="pipeline commands",
        metavar="COMMAND",
    )
    for register_subcommand in SUBCOMMANDS:
        register_subcommand(commands)


# --- pydory pipeline land ------------------------------------------------------------------


def register_land(subparsers: Subparsers) -> None:
    """Add `land`: Kafka topics into a Parquet lake, exactly once."""
    parser = add_subcommand(
        subparsers,
        "land",
        help="land Kafka topics in a Parquet lake, exactly once (Spark Structured Streaming)",
        description=(
            "Read the topics with a Spark streaming query and write every record to a "
            "Parquet lake partitioned by topic and date, through Spark's file sink and its "
            "commit log: exactly once across restarts. Progress goes to standard output. "
            "Exit status: 0 when the query finished (--available-now) or was stopped by "
            "SIGINT/SIGTERM (--trigger-interval), 1 when it failed or was refused (a lake "
            "and checkpoint that do not belong together), 2 when it could not run (a fault of "
            "its surroundings: Kafka, the lake, Spark; one line names it), 3 when "
            "--fail-on-data-loss false skipped records no longer in Kafka (listed per "
            "partition)."
        ),
        handler=run_land,
    )
    add_bootstrap_option(parser, "Kafka bootstrap servers", required=True)
    parser.add_argument(
        "--topics", required=True, type=_valid_topic_list, metavar="A,B", help="topics to land"
    )
    parser.add_argument("--lake", required=True, metavar="DIR", help="the lake (file sink path)")
    parser.add_argument(
        "--checkpoint",
        required=True,
        metavar="DIR",
        help="the query's checkpoint directory (keep it with the lake: together they make "
        "restarts exactly once)",
    )
    trigger = parser.add_mutually_exclusive_group()
    trigger.add_argument(
        "--available-now",
        action="store_true",
        help="land what the topics hold now, in as many batches as needed, then exit",
    )
    trigger.add_argument(
        "--trigger-interval",
        type=positive_float,
        metavar="S",
        help="run until stopped, starting a batch every S seconds (default: 5)",
    )
    add_master_option(parser)
    add_connector_option(
        parser,
        "native (default): Spark's own kafka source, faster; its jars come from "
        "./dev jars (.jars/spark-kafka, or $PYDORY_SPARK_KAFKA_JARS). python: pydory's "
        "Kafka source (librdkafka), for hosts without those jars. Both land the same lake",
    )
    parser.add_argument(
        "--max-offsets-per-trigger",
        type=positive_int,
        metavar="N",
        help="read at most N offsets per batch, spread over the partitions (default: no cap)",
    )
    parser.add_argument(
        "--fail-on-data-loss",
        choices=("true", "false"),
        default="true",
        help="true: stop when offsets to land are no longer in Kafka (aged out, or the topic "
        "was recreated); false: land what is still there, list what was skipped per "
        "partition and exit 3 (default: true)",
    )
    parser.add_argument(
        "--starting-offsets",
        type=_starting_offsets,
        metavar="earliest|latest|JSON",
        help="where a new checkpoint starts (default: earliest). Required for a new "
        "checkpoint on a lake that already holds batches: records the lake already holds "
        "are skipped. Ignored when the checkpoint resumes",
    )
    parser.add_argument(
        "--dedup-window",
        type=positive_float,
        default=DEFAULT_DEDUP_WINDOW_S,
        metavar="S",
        help="drop a second copy of a message (same pydory-id header, as a daemon's replay "
        "after a crash sends it) that lands within S seconds of its first; must cover a "
        "daemon's restart and replay. The state costs memory per message landed in the "
        f"window (default: {DEFAULT_DEDUP_WINDOW_S:g})",
    )
    parser.add_argument(
        "--executor-wait",
        type=positive_float,
        default=DEFAULT_EXECUTOR_WAIT_S,
        metavar="S",
        help="on a cluster, stop with exit status 2 when the job has had no executor for S "
        "seconds (its workers are gone); Spark itself would wait forever "
        f"(default: {DEFAULT_EXECUTOR_WAIT_S:g})",
    )
    parser.add_argument(
        "--conf",
        action="append",
        default=[],
        type=_spark_conf,
        metavar="KEY=VALUE",
        help="extra Spark configuration (repeatable)",
    )


def run_land(args: argparse.Namespace) -> int:
    """Run the landing job; see the parser's description for the exit status."""
    from pydory.pipeline.landing.land import LandSettings, run_landing  # imports PySpark

    settings = LandSettings(
        bootstrap_servers=args.bootstrap_servers,
        topics=tuple(args.topics),
        lake=args.lake,
        checkpoint=args.checkpoint,
        available_now=args.available_now,
        trigger_interval_s=args.trigger_interval,
        master=args.master,
        connector=args.connector,
        max_offsets_per_trigger=args.max_offsets_per_trigger,
        fail_on_data_loss=args.fail_on_data_loss == "true",
        starting_offsets=args.starting_offsets,
        spark_conf=dict(args.conf),
        dedup_window_s=args.dedup_window,
        executor_wait_s=args.executor_wait,
    )
    return run_landing(settings)


def _valid_topic_list(text: str) -> list[str]:
    """The topics to land: a topic list of names Kafka accepts."""
    topics = topic_list(text)
    for topic in topics:
        try:
            wire.validate_topic(topic.encode("utf-8"))
        except BadTopic as error:
            raise argparse.ArgumentTypeError(f"{topic!r}: {error.detail}") from None
    return topics


def _starting_offsets(text: str) -> str:
    from pydory.pipeline.errors import SourceOptionError
    from pydory.pipeline.source.offsets import EARLIEST, parse_offset_spec

    try:
        parse_offset_spec(text, "--starting-offsets", unlisted=EARLIEST)
    except SourceOptionError as error:
        raise argparse.ArgumentTypeError(error.reason) from None
    return text


def _spark_conf(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), value


# The group's subcommands, in the order `pydory pipeline --help` lists them.
SUBCOMMANDS: list[PipelineSubcommand] = []
SUBCOMMANDS.append(register_land)
SUBCOMMANDS.append(pipeline_audit.register)
SUBCOMMANDS.append(pipeline_fleet_audit.register)
