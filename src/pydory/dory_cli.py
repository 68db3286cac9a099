"""The `dory` command: Dory's command line, word for word, running what `pydory serve` runs.

A site that replaces Dory keeps its init script (``dory --daemon --config-path P``) and
its habits, so this entry point takes Dory 3.2.6's options with their meanings and parses
them by the rules of the library Dory uses (TCLAP 1.2, ``src/dory/cmd_line_args.cc``):

- ``--config-path PATH`` (required) and ``--daemon``; ``--version``, ``-h``/``--help``
  and ``--`` (``--ignore_rest``), which TCLAP adds;
- arguments are taken in order; ``--help`` and ``--version`` print and exit 0 when they
  are reached; an option given twice, an argument TCLAP does not know (``--config-path=P``
  among them: Dory's TCLAP separates a value by a space only) or a missing value is a
  parse error, and so is a missing ``--config-path`` once all are read;
- a parse error prints TCLAP's ``PARSE ERROR`` block on stderr and exits 1.

What follows the command line is ``pydory serve``'s (:func:`pydory.commands.serve.serve`):
the config is read and checked in the foreground (an error: exit 1), then ``--daemon``
forks as Dory does. ``pydory serve`` keeps argparse's rules (``--config-path=P`` works).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass

import pydory

__all__ = ["main", "parse", "usage"]

PROGRAM = "dory"
DESCRIPTION = "Producer daemon for Apache Kafka"


@dataclass(frozen=True, slots=True)
class _Option:
    """One of TCLAP's arguments, in the order TCLAP lists them (the last added first)."""

    name: str  # the long name, without "--"
    flag: str  # the one-letter flag, without "-"; "" if none
    description: str
    value: str = ""  # the value's name for an option that takes one
    required: bool = False

    @property
    def short_id(self) -> str:
        text = f"-{self.flag}" if self.flag else f"--{self.name}"
        if self.value:
            text += f" <{self.value}>"
        return text if self.required else f"[{text}]"

    @property
    def long_id(self) -> str:
        value = f" <{self.value}>" if self.value else ""
        text = f"-{self.flag}{value},  " if self.flag else ""
        return f"{text}--{self.name}{value}"

    @property
    def long_description(self) -> str:
        return f"(required)  {self.description}" if self.required else self.description

    def matches(self, word: str) -> bool:
        return word == f"--{self.name}" or (bool(self.flag) and word == f"-{self.flag}")

    @property
    def label(self) -> str:
        """How TCLAP names it in an error (``Arg::toString``)."""
        return (f"-{self.flag} " if self.flag else "") + f"(--{self.name})"


# TCLAP's list: help, version and ignore_rest are added first, Dory's two after; each
# addition goes to the front.
OPTIONS = (
    _Option("daemon", "", "Run as daemon."),
    _Option("config-path", "", "Pathname of config file.", value="PATH", required=True),
    _Option("ignore_rest", "-", "Ignores the rest of the labeled arguments following this flag."),
    _Option("version", "", "Displays version information and exits."),
    _Option("help", "h", "Displays usage information and exits."),
)


@dataclass(frozen=True, slots=True)
class DoryArgs:
    """What Dory's command line said."""

    config_path: str
    daemon: bool


class _Exit(Exception):  # an exit, as TCLAP's ExitException
    """Stop with this status after printing ``text`` to stdout or stderr."""

    def __init__(self, status: int, text: str, to_stderr: bool) -> None:
        super().__init__(text)
        self.status = status
        self.text = text
        self.to_stderr = to_stderr


def short_usage() -> str:
    """TCLAP's one-line usage, indented by 3 (it fits Dory's 75 columns)."""
    return "   " + " ".join([f"{PROGRAM} ", *(option.short_id for option in OPTIONS)]) + "\n"


def usage() -> str:
    """What ``dory --help`` prints (TCLAP's ``StdOutput::usage``)."""
    text = "\nUSAGE: \n\n" + short_usage() + "\n\nWhere: \n\n"
    for option in OPTIONS:
        text += f"   {option.long_id}\n     {option.long_description}\n\n"
    return text + f"\n   {DESCRIPTION}\n\n"


def version() -> str:
    """What ``dory --version`` prints: TCLAP's shape, pydory's version."""
    # Read when asked for: the package metadata costs ~0.1 s of CPU, before the sockets.
    return f"\n{PROGRAM}  version: {pydory.__version__}\n\n"


def _parse_error(message: str, argument: str | None) -> _Exit:
    """TCLAP's ``StdOutput::failure``: the error, the brief usage, exit 1."""
    where = "Argument: " + argument if argument is not None else " "
    text = (
        f"PARSE ERROR: {where}\n             {message}\n\n"
        f"Brief USAGE: \n{short_usage()}\n"
        f"For complete USAGE and HELP type: \n   {PROGRAM} --help\n\n"
    )
    return _Exit(1, text, to_stderr=True)


def parse(argv: Sequence[str]) -> DoryArgs:
    """Dory's command line (without the program name), by TCLAP's rules; raises _Exit
    for ``--help``, ``--version`` and parse errors."""
    config_path: str | None = None
    seen: set[str] = set()
    index = 0
    while index < len(argv):
        word = argv[index]
        if "ignore_rest" in seen:
            break  # TCLAP ignores every labeled argument after "--"
        option = next((o for o in OPTIONS if o.matches(word)), None)
        if option is None:
            raise _parse_error("Couldn't find match for argument", word)
        if option.name in seen:
            raise _parse_error("Argument already set!", option.label)
        seen.add(option.name)
        if option.name == "help":
            raise _Exit(0, usage(), to_stderr=False)
        if option.name == "version":
            raise _Exit(0, version(), to_stderr=False)
        if option.value:
            index += 1
            if index == len(argv):
                raise _parse_error("Missing a value for this argument!", option.label)
            config_path = argv[index]
        index += 1
    if config_path is None:
        raise _parse_error("Required argument missing: config-path", None)
    return DoryArgs(config_path, "daemon" in seen)


def main(argv: Sequence[str] | None = None) -> int:
    """The ``dory`` console script."""
    try:
        args = parse(sys.argv[1:] if argv is None else argv)
    except _Exit as exit_:
        (sys.stderr if exit_.to_stderr else sys.stdout).write(exit_.text)
        return exit_.status
    # The sockets first, before the command's module is loaded (handover.open_first).
    from pydory.daemon.inputs.handover import close_first, open_first

    open_first(["--config-path", args.config_path])
    # Imported here: --help and a usage error answer without loading the daemon.
    from pydory.commands.serve import serve

    try:
        return serve(args.config_path, daemon=args.daemon)
    except KeyboardInterrupt:
        return 130
    finally:
        close_first()
