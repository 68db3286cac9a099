"""The `pydory` command line: one subcommand per module in pydory.commands.

Each command module exposes ``register(subparsers)``, which adds its parser and sets
``handler`` (a function taking the parsed namespace and returning an exit status).
This is the only place that turns errors into exit statuses.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from pydory import __version__
from pydory.commands import COMMAND_MODULES


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pydory",
        description="A per-host producer daemon for Apache Kafka, compatible with Dory.",
    )
    parser.add_argument("--version", action="version", version=f"pydory {__version__}")
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND")
    for module in COMMAND_MODULES:
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        status: int = handler(args)
        sys.stdout.flush()  # here, where a closed pipe can still be answered quietly
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`pydory ... | head`): stop quietly, as Unix tools do. The
        # interpreter flushes stdout again at exit: point it at /dev/null first.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return status
