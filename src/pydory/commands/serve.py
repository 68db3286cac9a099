"""`pydory serve`: run the daemon in the foreground (Dory's `dory` command)."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

import uvloop

from pydory import __version__
from pydory.commands.daemon_url import config_failure
from pydory.config import load_config
from pydory.daemon.logsetup import configure_logging
from pydory.errors import ConfigError
from pydory.server import Server

log = logging.getLogger(__name__)


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "serve",
        help="run the daemon (Dory's data path) in the foreground",
        description=(
            "Run pydory: accept Dory messages on the configured sockets and deliver them "
            "to Kafka. Runs in the foreground; stop it with SIGTERM or SIGINT; SIGHUP "
            "(or `pydory reload`) reloads the config file without losing a message."
        ),
    )
    parser.add_argument("--config-path", required=True, help="Dory XML config file")
    parser.add_argument(
        "--daemon",
        action="store_true",
        help="accepted for Dory compatibility; pydory always runs in the foreground "
        "(run it under a supervisor such as systemd)",
    )
    parser.add_argument(
        "--log-stderr",
        action="store_true",
        help="also log to stdout/stderr, whatever the config's <logging> says",
    )
    parser.add_argument("--version", action="version", version=f"pydory {__version__}")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config_path)
    except (ConfigError, OSError) as error:
        print(config_failure(error, args.config_path), file=sys.stderr)
        return 1
    log_files = configure_logging(config.logging, force_stderr=args.log_stderr)
    server = Server(config, log_files, config_path=args.config_path)
    try:
        uvloop.run(server.serve())
    except ConfigError as error:  # a setting only checkable at start-up (e.g. a socket path)
        print(error, file=sys.stderr)
        return 1
    finally:
        log_files.remove()
    return 0
