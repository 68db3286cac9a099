"""The benchmark's command line, shared by ``pydory bench`` and ``python -m pydory_tools.bench``.

``python -m pydory_tools.bench`` imports nothing of the daemon, so it runs even while the
daemon's modules in this tree are being changed (and with --daemon-src, measures another
checkout's daemon).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

from pydory_tools.bench.child import BenchError
from pydory_tools.bench.harness import run_bench
from pydory_tools.bench.settings import COMPRESSIONS, TRANSPORTS, BenchSettings

DESCRIPTION = (
    "Start a librdkafka mock cluster (3 brokers, 1 topic of 8 partitions), pydory serve, "
    "and load generator processes; measure msgs/s, the daemon's CPU per message and "
    "memory, and latency, next to a raw-socket receiver and a direct confluent-kafka "
    "producer. Each figure: min / median / max over the rounds. See BENCHMARKS.md."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``pydory bench``."""
    parser.add_argument("--transport", choices=TRANSPORTS, default="dgram")
    parser.add_argument("--messages", "-n", type=int, default=200_000, help="N (default 200000)")
    parser.add_argument(
        "--value-bytes", "-v", type=int, default=100, help="bytes per value (default 100)"
    )
    parser.add_argument(
        "--processes", "-p", type=int, default=1, help="generator processes (default 1)"
    )
    parser.add_argument(
        "--batch", "-b", type=int, default=1, help="messages per write on streams (default 1)"
    )
    parser.add_argument("--rounds", "-r", type=int, default=3, help="rounds (default 3)")
    parser.add_argument("--compression", choices=COMPRESSIONS, default="none")
    parser.add_argument(
        "--linger-ms", type=int, default=5, help="batching time, pydory and direct (default 5)"
    )
    parser.add_argument(
        "--max-buffer", default="128m", help="pydory's maxBuffer (default 128m, as Dory's anchor)"
    )
    parser.add_argument(
        "--timeout", type=float, default=300.0, help="seconds allowed per run (default 300)"
    )
    parser.add_argument(
        "--no-baselines", action="store_true", help="measure pydory only (no raw, no direct)"
    )
    parser.add_argument(
        "--profile",
        type=Path,
        metavar="FILE",
        help="also sample one extra pydory run with py-spy, collapsed stacks into FILE",
    )
    parser.add_argument(
        "--daemon-src",
        type=Path,
        metavar="DIR",
        help="run pydory serve from DIR/pydory (e.g. another checkout's src) instead of "
        "the installed package",
    )
    parser.add_argument(
        "--spool",
        default="off",
        metavar="VARIANTS",
        help="the daemon's <spool> in each pydory run, comma-separated variants measured "
        "side by side in every round: off (no spool), none, always, or an fsync interval in "
        "ms; e.g. off,none,1000 (default off)",
    )
    parser.add_argument(
        "--spool-segment-size",
        default="4m",
        metavar="SIZE",
        help="the spool's segmentSize in those runs (default 4m; the daemon's own is 64m)",
    )
    parser.add_argument(
        "--daemon-cpus",
        metavar="LIST",
        help="run pydory serve on these CPUs only (taskset -c LIST, e.g. 0); default: any",
    )
    parser.add_argument(
        "--no-identity-headers",
        action="store_true",
        help="pydory sends no pydory-id header (<messageIdentity><headers enable=false>)",
    )
    parser.add_argument(
        "--contend",
        type=int,
        default=0,
        metavar="N",
        help="run N CPU-bound processes per core beside every run, at the daemon's "
        "priority, stopped when the bench ends (a busy host; default 0)",
    )
    parser.add_argument(
        "--rate",
        type=float,
        metavar="N",
        help="the generators offer N messages per second in total, paced, so that the "
        "daemon's CPU per message is measured at a fixed load, not saturated (default: as "
        "fast as they can)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    try:
        settings = BenchSettings(
            transport=args.transport,
            messages=args.messages,
            value_bytes=args.value_bytes,
            processes=args.processes,
            batch=args.batch,
            rounds=args.rounds,
            compression=args.compression,
            linger_ms=args.linger_ms,
            max_buffer=args.max_buffer,
            timeout_s=args.timeout,
            baselines=not args.no_baselines,
            profile_path=args.profile,
            daemon_source=args.daemon_src,
            spool=tuple(v.strip() for v in args.spool.split(",") if v.strip()),
            spool_segment_size=args.spool_segment_size,
            daemon_cpus=args.daemon_cpus,
            identity_headers=not args.no_identity_headers,
            contend=args.contend,
            rate=args.rate,
        )
    except ValueError as error:
        print(f"pydory bench: {error}", file=sys.stderr)
        return 2
    try:
        with _unwind_on_sigterm():
            report = run_bench(settings, progress=lambda line: print(line, file=sys.stderr))
    except BenchError as error:
        print(f"pydory bench: {error}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        print(report.to_text())
    return 0


@contextlib.contextmanager
def _unwind_on_sigterm() -> Iterator[None]:
    """SIGTERM (e.g. from ``timeout``) exits through the runs' cleanup, which ends the
    daemon and the children, instead of killing the harness and orphaning them."""

    def exit_cleanly(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may install handlers
        return
    previous = signal.signal(signal.SIGTERM, exit_cleanly)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m pydory_tools.bench``: the same options as ``pydory bench``."""
    parser = argparse.ArgumentParser(prog="python -m pydory_tools.bench", description=DESCRIPTION)
    add_arguments(parser)
    return run(parser.parse_args(argv))
