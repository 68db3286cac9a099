"""Where the commands that talk to a running daemon (`status`, `wait`, `reload`) find its
status server, how long they wait for it, and what they say when the config file that
names it cannot be used."""

from __future__ import annotations

import argparse

from pydory.errors import ConfigError
from pydory.status_client import DEFAULT_PORT, StatusUrlError, status_base_url

#: Dory's default httpInterface port, on loopback.
DEFAULT_URL = f"http://127.0.0.1:{DEFAULT_PORT}"


def daemon_url(url: str | None, config_path: str | None) -> str:
    """The status server's base URL: ``url`` (any form ``pydory.status_client`` takes:
    ``host:port``, ``http://host:port/``...), else the httpInterface port of the config at
    ``config_path`` on 127.0.0.1, else DEFAULT_URL.

    Raises ConfigError for an invalid config file and OSError for an unreadable one.
    """
    if url is not None:
        return status_base_url(url)
    if config_path is not None:
        from pydory.config import load_config  # the XML parser: only when a file is named

        return f"http://127.0.0.1:{load_config(config_path).http.port}"
    return DEFAULT_URL


def config_failure(error: ConfigError | OSError, config_path: str) -> str:
    """What a command prints when the config file at ``config_path`` cannot be used: the
    config error itself (it names the element), or why the file cannot be read."""
    if isinstance(error, ConfigError):
        return str(error)
    return f"cannot read config file {config_path}: {error.strerror}"


def add_daemon_location(
    parser: argparse.ArgumentParser,
    config_help: str = "the daemon's config file: use its httpInterface port on 127.0.0.1",
) -> None:
    """``--url URL`` or ``--config-path FILE``: where a command finds the daemon."""
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--url",
        type=status_url,
        help=f"the daemon's status server: HOST:PORT or http://HOST:PORT "
        f"(default {DEFAULT_URL}, Dory's default port)",
    )
    where.add_argument("--config-path", metavar="FILE", help=config_help)


def add_timeout_option(parser: argparse.ArgumentParser, default_s: float, waits: str) -> None:
    """``--timeout S``: how many seconds the command waits (``waits``: what for)."""
    parser.add_argument(
        "--timeout",
        type=float,
        default=default_s,
        metavar="S",
        help=f"seconds to wait {waits} (default {default_s:g})",
    )


def status_url(text: str) -> str:
    """argparse type of a status URL: the normalised base URL, or a usage error naming
    what is wrong with the text."""
    try:
        return status_base_url(text)
    except StatusUrlError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
