"""`pydory serve`: run the daemon (Dory's `dory` command; the `dory` entry point runs it too).

``--daemon`` means what it means to Dory (``server/daemonize.cc``): once the config is
read and valid, fork; the parent prints the child's pid on stdout and exits 0 (Dory's init
script waits for that), the child starts a new session, points stdin, stdout and stderr
at /dev/null, moves to ``/`` and runs the daemon. When the parent is PID 1 (init, or a
container's first process: Dory's ``Docker/start.sh`` runs ``dory --daemon`` there) Dory
does not fork: it is "already a daemon" and stays in the foreground, printing nothing, and
so does pydory (a fork there would end the container). Under systemd (``NOTIFY_SOCKET``
set) it refuses instead: systemd supervises the process itself and waits for its readiness.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
import threading
from typing import TYPE_CHECKING, Any

from pydory.commands import Subparsers, add_command, add_version_option

if TYPE_CHECKING:
    from pydory.daemon.inputs.handover import Handover

log = logging.getLogger(__name__)


def register(subparsers: Subparsers) -> None:
    """Add the `serve` subcommand."""
    parser = add_command(
        subparsers,
        "serve",
        "Run pydory: accept Dory messages on the configured sockets and deliver them "
        "to Kafka. Runs in the foreground; stop it with SIGTERM or SIGINT; SIGHUP "
        "(or `pydory reload`) reloads the config file without losing a message.",
        run,
    )
    parser.add_argument("--config-path", required=True, help="Dory XML config file")
    parser.add_argument(
        "--daemon",
        action="store_true",
        help="fork into the background once the config is valid, print the daemon's pid "
        "and exit 0, as Dory does (refused under systemd: there, run in the foreground)",
    )
    parser.add_argument(
        "--log-stderr",
        action="store_true",
        help="also log to stdout/stderr, whatever the config's <logging> says",
    )
    add_version_option(parser)


def run(args: argparse.Namespace) -> int:
    return serve(args.config_path, daemon=args.daemon, log_stderr=args.log_stderr)


def serve(config_path: str, *, daemon: bool = False, log_stderr: bool = False) -> int:
    """Bind the input sockets, read the config, fork if ``daemon`` (the parent returns 0
    at once), run the daemon until it stops; the exit status.

    The sockets come first, before anything heavy is imported (the standard library
    only: daemon/inputs/handover.py says why): from exec to bound takes a few
    milliseconds of CPU, where importing the daemon takes a hundred or more, seconds on a
    host whose CPUs are saturated; the kernel queues what clients send meanwhile.
    """
    from pydory.daemon.inputs.handover import open_early
    from pydory.errors import ConfigError

    try:
        handover = open_early(config_path)
    except ConfigError as error:  # systemd passed a descriptor that is no input
        print(error, file=sys.stderr)
        return 1
    try:
        return _serve(config_path, handover, daemon=daemon, log_stderr=log_stderr)
    finally:
        handover.close_rest()


def _serve(config_path: str, handover: Handover, *, daemon: bool, log_stderr: bool) -> int:
    # Imported here, not at the top: `pydory --help` and the other commands need none of it.
    import uvloop

    from pydory import hotpath
    from pydory.commands.daemon_url import config_failure
    from pydory.config import load_config
    from pydory.daemon.delivery import backends
    from pydory.daemon.logsetup import configure_logging, destinations
    from pydory.errors import ConfigError
    from pydory.server import Server

    try:
        config = load_config(config_path)
    except (ConfigError, OSError) as error:
        print(config_failure(error, config_path), file=sys.stderr)
        return 1
    try:
        handover.check(config.inputs)  # systemd's sockets are this config's inputs
    except ConfigError as error:
        print(config_failure(error, config_path), file=sys.stderr)
        return 1
    if daemon:
        if os.environ.get("NOTIFY_SOCKET"):
            print(SYSTEMD_REFUSAL, file=sys.stderr)
            return 1
        # A reload reads the file again, after the move to "/".
        config_path = os.path.abspath(config_path)
        child = daemonize()  # the sockets bound so far go with the child
        if child:
            handover.forget()  # the child serves them: their files stay
            print(child, flush=True)  # Dory's parent prints the daemon's pid
            return 0
        # Dory logs to stdout/stderr only in the foreground.
        config = dataclasses.replace(
            config, logging=dataclasses.replace(config.logging, stdout_stderr=False)
        )
    log_files = configure_logging(config.logging, force_stderr=log_stderr and not daemon)
    for warning in config.warnings:  # what Dory accepts and pydory ignores
        log.warning("%s", warning)
    # Which codec reads the clients' bytes: the compiled one is faster, the same rules.
    log.info("hot path: %s (%s)", hotpath.IMPLEMENTATION, hotpath.WHY)
    log.info("producer: %s (%s)", backends.BACKEND.name, backends.WHY)
    server = Server(config, log_files, config_path=config_path, handover=handover)
    if not daemon:
        # A first run in a terminal must not look hung: say where the log goes, and when
        # the daemon is ready (also useful in the journal, where systemd keeps stderr).
        where = destinations(config.logging, force_stderr=log_stderr)
        _say(f"starting (pid {os.getpid()}, config {config_path}); logging to {where}")
        announce_when_ready(server)
    tune_garbage_collector()
    try:
        uvloop.run(server.serve())
    except ConfigError as error:  # a setting only checkable at start-up (e.g. a socket path)
        print(error, file=sys.stderr)
        return 1
    finally:
        log_files.remove()
    return 0


#: Allocations between two of the cyclic collector's youngest-generation passes (CPython's
#: default is 700, or 2000 on 3.13+ where the meaning changed).
GC_YOUNG_THRESHOLD = 50_000


def tune_garbage_collector() -> None:
    """Freeze what start-up loaded (it lives as long as the process) out of every
    collection, and let the youngest generation grow larger between passes.

    Why: the hot path allocates a few short-lived objects per message, nearly all freed at
    once by reference counting, yet they trigger the cyclic collector every few hundred
    allocations; its passes were ~28 % of the daemon's samples on UNIX streams (BENCHMARKS.md,
    "Issue 25, step 2"). The young generation holds at most this many objects, so memory
    stays bounded; the cycles the daemon makes (none per message) are collected later.
    """
    import gc

    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, older, oldest)


def _say(line: str) -> None:
    print(f"pydory serve: {line}", file=sys.stderr, flush=True)


def announce_when_ready(server: Any) -> None:
    """Print the ready line, with the addresses clients and readers use, once ``server``
    has opened its inputs and status pages (a thread that waits for its ``ready``)."""

    def wait_then_say() -> None:
        server.ready.wait()
        _say(f"ready: {ready_summary(server)}")

    threading.Thread(target=wait_then_say, name="pydory-ready-line", daemon=True).start()


def ready_summary(server: Any) -> str:
    """The inputs and the status pages of a started ``server``, as a client finds them."""
    inputs = server.config.inputs
    parts = []
    if inputs.unix_datagram.path is not None:
        parts.append(f"UNIX datagram socket {inputs.unix_datagram.path}")
    if inputs.unix_stream.path is not None:
        parts.append(f"UNIX stream socket {inputs.unix_stream.path}")
    tcp_port = server.inputs.tcp_port()
    if tcp_port is not None:
        parts.append(f"TCP port 127.0.0.1:{tcp_port}")
    parts.append(f"status pages http://127.0.0.1:{server.status.port}/")
    return ", ".join(parts)


#: Why ``--daemon`` is refused under systemd, and what to do instead.
SYSTEMD_REFUSAL = (
    "--daemon: refused under systemd (NOTIFY_SOCKET is set): systemd supervises the daemon "
    "and waits for it to say it is ready, so run it in the foreground: drop --daemon "
    "(ExecStart=pydory serve --config-path PATH, Type=notify; see docs/systemd/)"
)


def daemonize() -> int:
    """Dory's Daemonize(): fork; in the parent return the child's pid, in the child (a new
    session, stdin/stdout/stderr on /dev/null, working directory "/") return 0. With PID 1
    as the parent, return 0 without forking, as Dory does (``getppid() == 1``: "already a
    daemon"). Call it before any thread or event loop exists: a fork keeps only the
    calling thread."""
    if os.getppid() == 1:
        return 0
    sys.stdout.flush()
    sys.stderr.flush()
    child = os.fork()
    if child:
        return child
    os.setsid()
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    if null > 2:
        os.close(null)
    os.chdir("/")
    return 0
