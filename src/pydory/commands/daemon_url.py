"""Where the commands that talk to a running daemon (`status`, `wait`, `reload`) find its
status server, how long they wait for it, and what they say when the config file that
names it cannot be used.

Rule: the one search order for a daemon's status server lives here, in `locate_daemon`:
``--url``, then ``--config-path``, then ``PYDORY_STATUS_URL``, then the config at the
documented default path (``/etc/pydory/pydory.xml``, install.md), then Dory's
127.0.0.1:9090; and what a refused connection says about it (which one was tried, what to
pass instead).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass

from pydory.errors import ConfigError
from pydory.status_client import DEFAULT_PORT, StatusUrlError, status_base_url

#: Dory's default httpInterface port, on loopback.
DEFAULT_URL = f"http://127.0.0.1:{DEFAULT_PORT}"
#: The environment variable naming a status URL when no option does.
URL_VARIABLE = "PYDORY_STATUS_URL"
#: Where docs/install.md puts the config of a daemon installed as a service.
DEFAULT_CONFIG_PATH = "/etc/pydory/pydory.xml"
#: What to pass when the daemon is elsewhere: said after every refused connection.
HOW_TO_POINT = (
    f"pass --url HOST:PORT or --config-path FILE (the daemon's config), or set {URL_VARIABLE}"
)


@dataclass(frozen=True)
class DaemonLocation:
    """A status server's base URL and how it was found (for the messages)."""

    url: str
    found_by: str

    def unreachable(self, error: Exception) -> str:
        """The line a command prints when nothing answered at ``url``."""
        return f"{error}; {self.url} is {self.found_by}: {HOW_TO_POINT}"


def locate_daemon(
    url: str | None,
    config_path: str | None,
    environ: Mapping[str, str] | None = None,
    default_config_path: str | None = None,
) -> DaemonLocation:
    """The status server to ask, by the module's search order.

    Raises ConfigError for an invalid config file and OSError for an unreadable one when
    the file was named (``--config-path``); StatusUrlError for a bad ``PYDORY_STATUS_URL``.
    A config at the default path that cannot be used is passed over, and said so.
    """
    env = os.environ if environ is None else environ
    default_path = DEFAULT_CONFIG_PATH if default_config_path is None else default_config_path
    if url is not None:
        return DaemonLocation(status_base_url(url), "the --url given")
    if config_path is not None:
        return DaemonLocation(_config_url(config_path), f"the port of --config-path {config_path}")
    if env.get(URL_VARIABLE):
        return DaemonLocation(status_base_url(env[URL_VARIABLE]), f"${URL_VARIABLE}")
    if os.path.exists(default_path):
        try:
            return DaemonLocation(_config_url(default_path), f"the port of {default_path}")
        except (ConfigError, OSError) as error:
            problem = config_failure(error, default_path).splitlines()[0]
            return DaemonLocation(DEFAULT_URL, f"Dory's default ({default_path}: {problem})")
    return DaemonLocation(
        DEFAULT_URL,
        f"Dory's default (no --url, ${URL_VARIABLE} or {default_path} to say otherwise)",
    )


def _config_url(config_path: str) -> str:
    from pydory.config import load_config  # the XML parser: only when a file is read

    return f"http://127.0.0.1:{load_config(config_path).http.port}"


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
        help=f"the daemon's status server: HOST:PORT or http://HOST:PORT (default: "
        f"${URL_VARIABLE}, else the port of {DEFAULT_CONFIG_PATH}, else {DEFAULT_URL}, "
        f"Dory's default)",
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
