"""`pydory bench`: the end-to-end benchmark with its raw-socket and direct baselines."""

from __future__ import annotations

from pydory.commands import Subparsers, add_command
from pydory_tools.bench.cli import DESCRIPTION, add_arguments, run


def register(subparsers: Subparsers) -> None:
    """Add the `bench` subcommand."""
    add_arguments(add_command(subparsers, "bench", DESCRIPTION, run))
