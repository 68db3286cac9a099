"""Where the commands that talk to a running daemon (`status`, `wait`, `reload`) find its
status server, and what they say when the config file that names it cannot be used."""

from __future__ import annotations

import argparse

from pydory.config import load_config
from pydory.errors import ConfigError

#: Dory's default httpInterface port, on loopback.
DEFAULT_URL = "http://127.0.0.1:9090"


def daemon_url(url: str | None, config_path: str | None) -> str:
    """The status server's base URL: ``url`` (a bare ``host:port`` means HTTP), else the
    httpInterface port of the config at ``config_path`` on 127.0.0.1, else DEFAULT_URL.

    Raises ConfigError for an invalid config file and OSError for an unreadable one.
    """
    if url is not None:
        url = url.rstrip("/")
        return url if "://" in url else f"http://{url}"
    if config_path is not None:
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
        "--url", help=f"the daemon's status server (default {DEFAULT_URL}, Dory's default port)"
    )
    where.add_argument("--config-path", metavar="FILE", help=config_help)
