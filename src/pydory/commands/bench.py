"""`pydory bench`: the end-to-end benchmark with its raw-socket and direct baselines."""

from __future__ import annotations

import argparse
from typing import Any

from pydory.bench.cli import DESCRIPTION, add_arguments, run
from pydory.commands import summary


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "bench",
        help=summary("bench"),
        description=DESCRIPTION,
    )
    add_arguments(parser)
    parser.set_defaults(handler=run)
