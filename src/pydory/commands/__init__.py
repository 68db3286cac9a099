"""Subcommands of the `pydory` CLI, in the order `pydory --help` lists them.

Each command is named here with its one-line summary and the module that implements it.
`pydory.cli` imports only the module of the command being run, so that `pydory send` or
`pydory status` loads no daemon, Spark or benchmark code (the start-up target is in
BENCHMARKS.md; tests/test_cli_startup.py counts the modules `pydory send` imports).
`demo` and `bench` live in the tools' distribution (``pydory-tools``, package
``pydory_tools``, in ``tools/`` of the checkout): named here by their module's name only,
so `pydory --help` lists them and a host without the tools is told what to install, while
nothing in ``pydory`` imports the tools. (Not an entry-point group the tools register:
reading entry points costs every command tens of milliseconds of importlib.metadata, and
the commands would vanish from `pydory --help` instead of saying what they need.)
A module's ``register(subparsers)`` adds its parser with :func:`add_command` (its help line
from here, its description, its ``handler``: a function taking the parsed namespace and
returning an exit status); a command of subcommands (`config`, `pipeline`) with
:func:`add_command_group`.

The modules, one per command: ``serve``, ``send``, ``wait``, ``status``, ``reload``,
``config`` (with ``config_listing``, `config check`'s listing under the XML's names) and
``pipeline`` (`land`; its `audit` and `fleet-audit` in ``pipeline_audit`` and
``pipeline_fleet_audit``, the options all three share in ``pipeline_options``). Beside
them: ``arguments`` (the number types several commands take), ``daemon_url`` (where a
running daemon's status server is, for `status`, `wait` and `reload`) and ``lines``
(``send --lines`` input cut into messages).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

#: What a command that runs Spark says on a host without the extra (a daemon-only install).
SPARK_INSTALL_HINT = "pip install 'pydory[spark]'"
#: The modules of the ``spark`` extra a Spark command imports (py4j comes with PySpark).
SPARK_MODULES = ("pyspark", "py4j", "pyarrow")
#: What a tools command (demo, bench) says on a host without the tools' distribution.
TOOLS_INSTALL_HINT = "pip install pydory-tools"
#: The tools' package, which ``pydory`` itself never imports.
TOOLS_PACKAGE = "pydory_tools"

Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
#: Runs a command: the parsed namespace in, the exit status out.
Handler: TypeAlias = Callable[[argparse.Namespace], int]


@dataclass(frozen=True)
class Command:
    """One subcommand: its name, what `pydory --help` says of it, where it lives."""

    name: str
    summary: str
    module: str
    needs_spark: bool = False
    #: Lives in the tools' distribution (``pydory_tools``), not in ``pydory``.
    needs_tools: bool = False


COMMANDS = (
    Command(
        "serve", "run the daemon (Dory's data path) in the foreground", "pydory.commands.serve"
    ),
    Command(
        "send",
        "send messages to a running pydory daemon (like Dory's to_dory)",
        "pydory.commands.send",
    ),
    Command(
        "wait",
        "wait until every message sent so far is in Kafka or reported as discarded",
        "pydory.commands.wait",
    ),
    Command(
        "status",
        "show a running daemon's counters, discards, queues, metadata and books",
        "pydory.commands.status",
    ),
    Command(
        "reload",
        "reload a running daemon's config file (SIGHUP) and report the outcome",
        "pydory.commands.reload",
    ),
    Command("config", "check a config file", "pydory.commands.config"),
    Command(
        "demo",
        "run the demo: clients, the daemon, Kafka, the Spark lake and its audit "
        f"(needs {TOOLS_INSTALL_HINT} and {SPARK_INSTALL_HINT})",
        "pydory_tools.commands.demo",
        needs_spark=True,
        needs_tools=True,
    ),
    Command(
        "pipeline",
        "the Spark data pipeline: land the topics in a lake, audit it "
        f"(needs {SPARK_INSTALL_HINT})",
        "pydory.commands.pipeline",
        needs_spark=True,
    ),
    Command(
        "bench",
        "measure pydory end to end against a mock cluster, with baselines "
        f"(needs {TOOLS_INSTALL_HINT})",
        "pydory_tools.commands.bench",
        needs_tools=True,
    ),
)


def command_named(name: str) -> Command:
    """The command called ``name``; KeyError if there is none."""
    for command in COMMANDS:
        if command.name == name:
            return command
    raise KeyError(name)


def summary(name: str) -> str:
    """The one line `pydory --help` shows for the command ``name``."""
    return command_named(name).summary


def add_command(
    subparsers: Subparsers, name: str, description: str, handler: Handler
) -> argparse.ArgumentParser:
    """The parser of the command ``name``: `pydory --help` shows its summary from
    ``COMMANDS``, `pydory NAME --help` its ``description``; ``handler`` runs it."""
    return add_subcommand(
        subparsers, name, help=summary(name), description=description, handler=handler
    )


def add_subcommand(
    subparsers: Subparsers, name: str, *, help: str, description: str, handler: Handler
) -> argparse.ArgumentParser:
    """A parser among ``subparsers`` whose namespace carries ``handler``, the function that
    runs it (`pydory.cli` calls it)."""
    parser = subparsers.add_parser(name, help=help, description=description)
    parser.set_defaults(handler=handler)
    return parser


def add_command_group(
    subparsers: Subparsers,
    name: str,
    description: str,
    *,
    title: str = "subcommands",
    metavar: str = "SUBCOMMAND",
) -> Subparsers:
    """The command ``name`` made of subcommands, which the caller adds to the subparsers
    returned (listed under ``title``); the group alone prints its usage and fails (exit
    status 2)."""

    def usage(_args: argparse.Namespace) -> int:
        parser.print_help(sys.stderr)
        return 2

    parser = add_command(subparsers, name, description, usage)
    return parser.add_subparsers(title=title, metavar=metavar)


class _VersionAction(argparse.Action):
    """``--version``, reading the installed version only when asked (importlib.metadata
    alone costs tens of milliseconds, more than the rest of `pydory send`)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        kwargs.setdefault("help", "show program's version number and exit")
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_args: object, **_kwargs: Any) -> None:
        from pydory import __version__

        print(f"pydory {__version__}")  # on stdout, as argparse's own "version" action
        parser.exit()


def add_version_option(parser: argparse.ArgumentParser) -> None:
    """``--version``: print ``pydory VERSION`` and exit 0."""
    parser.add_argument("--version", action=_VersionAction)
