"""`pydory wait`: block until the daemon's commit point passes a moment (by default, now).

The commit point is the time before which every message the daemon received is in Kafka
or reported as discarded (docs/commit-point.md). A script sends its messages, runs
``pydory wait``, and on exit status 0 knows they are settled.

Exit status: 0 the commit point passed; 1 it did not within --timeout (or the daemon began
shutting down first); 2 the daemon could not be asked (unreachable, not a pydory, bad
config file).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass
from typing import Any

from pydory.commands import Subparsers, add_command
from pydory.commands.daemon_url import (
    DaemonLocation,
    add_daemon_location,
    config_failure,
    locate_daemon,
)
from pydory.errors import ConfigError
from pydory.status_client import (
    DaemonUnreachable,
    NotAStatusPage,
    PageNotFound,
    StatusHttp,
    StatusUrlError,
)
from pydory.wording import counted

#: The status server's longest long-poll (pydory.status.commit_point.LONG_POLL_MAX_S, which
#: it clamps a longer one to; tests/test_cli_startup.py checks they agree). Not imported:
#: that module pulls in aiohttp, which would triple the start-up time of `pydory wait`.
LONG_POLL_MAX_S = 300.0

DEFAULT_TIMEOUT_S = 60.0
#: How much longer than its long-poll an HTTP request may take before the daemon counts
#: as unreachable.
HTTP_SLACK_S = 10.0

EXIT_PASSED = 0
EXIT_NOT_PASSED = 1
EXIT_UNREACHABLE = 2


class _Unreachable(Exception):
    """The daemon could not be asked; the message says why."""


@dataclass(frozen=True, slots=True)
class _Answer:
    """The daemon's answer to one long-poll."""

    passed: bool
    after: float
    commit_point: float
    lag_s: float
    open_messages: int
    shutting_down: bool


def register(subparsers: Subparsers) -> None:
    """Add the `wait` subcommand."""
    parser = add_command(
        subparsers,
        "wait",
        "Block until the running daemon's commit point passes the moment this command "
        "started: then every message the daemon had received by that moment has been "
        "acknowledged by Kafka or reported as discarded. Exit status: 0 passed, "
        "1 timed out (or the daemon is shutting down), 2 the daemon could not be asked.",
        run,
    )
    target = parser.add_mutually_exclusive_group()
    target.add_argument(
        "--until-now",
        action="store_true",
        help="wait for the moment of this call (the default)",
    )
    target.add_argument(
        "--until",
        type=_epoch_seconds,
        metavar="EPOCH_S",
        help="wait for this moment instead, in seconds since the epoch (e.g. the output "
        "of `date +%%s.%%N` taken before sending)",
    )
    parser.add_argument(
        "--timeout",
        type=_seconds,
        default=DEFAULT_TIMEOUT_S,
        metavar="S",
        help=f"give up after S seconds (exit 1); 0 asks once; default {DEFAULT_TIMEOUT_S:g}",
    )
    add_daemon_location(parser)
    parser.add_argument("--quiet", "-q", action="store_true", help="print nothing on success")


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, not {text!r}")
    return value


def _epoch_seconds(text: str) -> float:
    value = _seconds(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be a moment after the epoch")
    return value


def run(args: argparse.Namespace) -> int:
    """Long-poll the daemon until the commit point passes, the timeout, or an error."""
    started = time.monotonic()
    deadline = started + args.timeout
    try:
        location = _location(args)
        after = "now" if args.until is None else repr(args.until)
        while True:
            poll_s = min(max(0.0, deadline - time.monotonic()), LONG_POLL_MAX_S)
            answer = _ask(location, after, poll_s)
            if answer.passed:
                if not args.quiet:
                    print(_passed_message(answer, time.monotonic() - started))
                return EXIT_PASSED
            if answer.shutting_down or time.monotonic() >= deadline:
                print(_not_passed_message(answer, args.timeout), file=sys.stderr)
                return EXIT_NOT_PASSED
            # The daemon's moment for "now", echoed back: ask again for the same one.
            after = repr(answer.after)
    except _Unreachable as error:
        print(f"pydory wait: {error}", file=sys.stderr)
        return EXIT_UNREACHABLE


def _location(args: argparse.Namespace) -> DaemonLocation:
    try:
        return locate_daemon(args.url, args.config_path)
    except (ConfigError, OSError) as error:
        raise _Unreachable(config_failure(error, args.config_path)) from None
    except StatusUrlError as error:
        raise _Unreachable(str(error)) from None


def _ask(location: DaemonLocation, after: str, timeout_s: float) -> _Answer:
    """One long-poll of ``/commit_point/json``."""
    base_url = location.url
    status = StatusHttp(base_url)
    query = {"after": after, "timeout": f"{timeout_s:.3f}"}
    try:
        page = status.get_json("/commit_point/json", query, timeout_s=timeout_s + HTTP_SLACK_S)
    except PageNotFound:
        raise _Unreachable(f"{base_url} serves no commit point (not a pydory daemon?)") from None
    except DaemonUnreachable as error:
        raise _Unreachable(location.unreachable(error)) from None
    except NotAStatusPage as error:
        raise _Unreachable(str(error)) from None
    return _answer_of(page, status.url_of("/commit_point/json", query))


def _answer_of(page: Any, url: str) -> _Answer:
    try:
        return _Answer(
            passed=bool(page["passed"]),
            after=float(page["after"]),
            commit_point=float(page["commit_point"]),
            lag_s=float(page["lag_s"]),
            open_messages=int(page["open_messages"]),
            shutting_down=bool(page.get("shutting_down", False)),
        )
    except (KeyError, TypeError, ValueError) as error:
        raise _Unreachable(f"{url} answered an unexpected document ({error!r})") from None


def _clock_time(epoch_s: float) -> str:
    """Local time to the millisecond: 2026-05-09 07:35:25.127."""
    whole = math.floor(epoch_s)
    millis = min(999, round((epoch_s - whole) * 1000))
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(whole)) + f".{millis:03d}"


def _passed_message(answer: _Answer, waited_s: float) -> str:
    return (
        f"commit point {_clock_time(answer.commit_point)} is past "
        f"{_clock_time(answer.after)}: every message received before then is in Kafka "
        f"or reported as discarded (waited {waited_s:.3f} s)"
    )


def _not_passed_message(answer: _Answer, timeout_s: float) -> str:
    why = (
        "the daemon is shutting down"
        if answer.shutting_down
        else f"timed out after {timeout_s:g} s"
    )
    return (
        f"pydory wait: {why}: the commit point is at {_clock_time(answer.commit_point)}, "
        f"{answer.lag_s:.3f} s behind, with {counted(answer.open_messages, 'message')} neither in "
        f"Kafka nor discarded yet"
    )
