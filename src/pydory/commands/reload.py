"""`pydory reload [--config-path FILE | --url URL]`: reload a running daemon's config.

What `systemctl reload pydory` does, with an answer: the daemon's status page gives its
pid and how many reloads it has attempted; the command checks the config file first
(when given one: an invalid file is refused here, and the daemon is never signalled),
sends SIGHUP, and waits for the daemon to report that reload's outcome on
``/config/json``: what changed, what waits for a restart, or why it was refused (the
daemon then runs on, unchanged).

Signalling needs the daemon on this host and the right to signal it (same user, or root),
which the status port alone never gives: a remote status reader cannot reload.

Exit status: 0 reloaded; 1 refused (invalid config), or not a pydory daemon; 2 the daemon
cannot be reached or signalled; 3 no outcome within --timeout.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from typing import Any

from pydory.commands import Subparsers, add_command
from pydory.commands.daemon_url import (
    add_daemon_location,
    add_timeout_option,
    config_failure,
    locate_daemon,
)
from pydory.commands.status import StatusClient
from pydory.config import load_config
from pydory.errors import ConfigError
from pydory.status_client import DaemonUnreachable, NotAStatusPage, StatusUrlError

DEFAULT_TIMEOUT_S = 30.0
POLL_INTERVAL_S = 0.2
EXIT_REFUSED = 1
EXIT_UNREACHABLE = 2
EXIT_NO_OUTCOME = 3


def register(subparsers: Subparsers) -> None:
    """Add the `reload` subcommand."""
    parser = add_command(
        subparsers,
        "reload",
        "Check the config file, send the daemon SIGHUP and report what the reload changed, "
        "or why the daemon refused it (it then runs on unchanged).",
        run,
    )
    add_daemon_location(
        parser, "the daemon's config file: checked first; its httpInterface port finds the daemon"
    )
    add_timeout_option(parser, DEFAULT_TIMEOUT_S, "for the outcome")


def run(args: argparse.Namespace) -> int:
    """Handler of `pydory reload`."""
    if args.config_path is not None:
        try:
            load_config(args.config_path)
        except (ConfigError, OSError) as error:
            problem = config_failure(error, args.config_path)
            if isinstance(error, ConfigError):
                problem = f"pydory reload: the config is invalid; not reloading:\n{problem}"
            print(problem, file=sys.stderr)
            return EXIT_REFUSED
    try:
        location = locate_daemon(args.url, args.config_path)
    except StatusUrlError as error:
        print(f"pydory reload: {error}", file=sys.stderr)
        return EXIT_REFUSED
    client = StatusClient(location.url)
    try:
        before = _config_page(client)
        pid = int(before["pid"])
        attempted = int(before["reloads"]["attempted"])
        os.kill(pid, signal.SIGHUP)
        outcome = _wait_for_outcome(client, attempted + 1, args.timeout)
    except DaemonUnreachable as error:
        print(f"pydory reload: {location.unreachable(error)}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except (ProcessLookupError, PermissionError) as error:
        print(f"pydory reload: {_explain(error)}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except NotAStatusPage as error:
        print(f"pydory reload: {error}", file=sys.stderr)
        return EXIT_REFUSED
    if outcome is None:
        print(f"pydory reload: no outcome within {args.timeout:g} s", file=sys.stderr)
        return EXIT_NO_OUTCOME
    print(describe_outcome(outcome))
    return 0 if outcome["ok"] else EXIT_REFUSED


def _config_page(client: StatusClient) -> dict[str, Any]:
    page = client.get("/config/json")
    if "reloads" not in page:
        raise NotAStatusPage(f"{client.base_url}/config/json has no reloads: is this pydory?")
    return page


def _wait_for_outcome(
    client: StatusClient, attempt: int, timeout_s: float
) -> dict[str, Any] | None:
    """The outcome of reload number ``attempt`` (or a later one), once reported."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        last = _config_page(client)["last_reload"]
        if last is not None and last["attempt"] >= attempt:
            return dict(last)
        time.sleep(POLL_INTERVAL_S)
    return None


def describe_outcome(outcome: dict[str, Any]) -> str:
    """The reload's outcome for a person."""
    if not outcome["ok"]:
        errors = "\n".join(f"  {error}" for error in outcome["errors"])
        return f"reload refused; the daemon runs on with its previous config:\n{errors}"
    changed = ", ".join(outcome["changed"]) or "nothing (the file is unchanged)"
    lines = [f"reloaded: {changed}"]
    for element in outcome["restart_needed"]:
        lines.append(f"  <{element}> changed: takes effect at the next restart")
    return "\n".join(lines)


def _explain(error: Exception) -> str:
    if isinstance(error, ProcessLookupError):
        return "the daemon's pid is not on this host (reload it where it runs)"
    if isinstance(error, PermissionError):
        return "not allowed to signal the daemon (run as its user, or root)"
    return str(error)
