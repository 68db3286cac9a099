"""The `pydory` command line: one subcommand per module in pydory.commands.

Only the module of the command being run is imported (``pydory.commands.COMMANDS`` lists
them with the line `pydory --help` shows), so a quick command starts quickly. A command
that needs the ``spark`` extra, or the tools' distribution (``pydory-tools``: `demo`,
`bench`), says so in one line on a host without it.
This is the only place that turns errors into exit statuses.
"""

from __future__ import annotations

import os
import sys

# The rest is imported in the functions: `pydory serve` binds its sockets before it
# parses its command line (pydory.daemon.inputs.handover.open_first), and argparse and
# the commands' table cost as much start-up time as the binding itself.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from collections.abc import Sequence

    from pydory.commands import Command


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser, with every command's options when ``command`` is None, else with the
    options of ``command`` alone (the others only named, with their summaries)."""
    import argparse
    import importlib

    from pydory.commands import COMMANDS, add_version_option

    parser = argparse.ArgumentParser(
        prog="pydory",
        description="A per-host producer daemon for Apache Kafka, compatible with Dory.",
    )
    add_version_option(parser)
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND")
    for each in COMMANDS:
        if command is None or each.name == command:
            importlib.import_module(each.module).register(subparsers)
        else:
            subparsers.add_parser(each.name, help=each.summary)
    return parser


def chosen_command(argv: Sequence[str]) -> str | None:
    """The command ``argv`` names: its first word that is not an option (`pydory` itself
    takes no option with a value)."""
    return next((word for word in argv if not word.startswith("-")), None)


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    name = chosen_command(argv)
    if name != "serve":
        return _main(argv, name)
    # Its sockets first, before anything else is loaded; closed if serve never takes them.
    from pydory.daemon.inputs.handover import close_first, open_first

    open_first(argv)
    try:
        return _main(argv, name)
    finally:
        close_first()


def _main(argv: list[str], name: str | None) -> int:
    from pydory.commands import COMMANDS, SPARK_MODULES, TOOLS_INSTALL_HINT, TOOLS_PACKAGE

    command = next((each for each in COMMANDS if each.name == name), None)
    if command is not None and command.needs_tools and not tools_installed():
        # Before the parser: the command's own module is in the missing package.
        print(
            f"pydory {command.name}: this needs `{TOOLS_INSTALL_HINT}` "
            f"(no module named {TOOLS_PACKAGE!r} here)",
            file=sys.stderr,
        )
        return 1
    # Nothing registered when no known command is named: argparse then lists them all.
    parser = build_parser(command.name if command else "")
    args = parser.parse_args(argv)
    handler = getattr(args, "handler", None)
    if handler is None or command is None:
        parser.print_help(sys.stderr)
        return 2
    if command.needs_spark and (missing := missing_spark_modules()):
        print(_needs_spark(command, missing[0]), file=sys.stderr)
        return 1
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
    except ModuleNotFoundError as error:
        missing_module = (error.name or "").partition(".")[0]
        if missing_module not in SPARK_MODULES:
            raise
        print(_needs_spark(command, missing_module), file=sys.stderr)
        return 1
    return status


def tools_installed() -> bool:
    """Whether the tools' package (``pydory-tools``: the demo, the benchmark) is here."""
    import importlib.util

    from pydory.commands import TOOLS_PACKAGE

    return importlib.util.find_spec(TOOLS_PACKAGE) is not None


def missing_spark_modules() -> list[str]:
    """The modules of the ``spark`` extra this Python cannot import (none: it is installed)."""
    import importlib.util

    from pydory.commands import SPARK_MODULES

    return [name for name in SPARK_MODULES if importlib.util.find_spec(name) is None]


def _needs_spark(command: Command, missing_module: str) -> str:
    from pydory.commands import SPARK_INSTALL_HINT

    return (
        f"pydory {command.name}: this needs `{SPARK_INSTALL_HINT}` "
        f"(no module named {missing_module!r} here)"
    )
