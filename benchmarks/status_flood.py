"""Does a flood of status requests slow ingestion? Rounds with and without, interleaved.

A real daemon (``pydory serve`` in its own process) on the librdkafka mock cluster takes
N datagrams per round from this process. In flood rounds a separate process runs 4 client
tasks that fetch ``/metrics`` and ``/books/json`` back to back, as fast as the daemon
answers, for as long as the round lasts. Rounds alternate quiet/flood/flood/quiet/... so
drift (a warming cache, a growing log) hits both sides alike. Reported per round: msgs/s
until every message was received (framed by the daemon) and until every message was
delivered (acknowledged by Kafka), and the status requests the flood got answered.

Not a test. Run: .venv/bin/python benchmarks/status_flood.py [--messages N] [--rounds R]
The daemon and the flood run in their own processes so that neither competes with the
other for this process's GIL; on a small machine they still compete for the CPUs, which is
part of what is measured.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from pydory.client import DatagramSender, encode_message
from pydory_tools.testing.daemon import DaemonConfig
from pydory_tools.testing.mock_cluster import MockCluster

TOPIC = "status_flood"
PARTITIONS = 4
FLOOD_CLIENTS = 4
FLOOD_URLS = ("/metrics", "/books/json")
ROUND_TIMEOUT_S = 120.0
POLL_S = 0.05
VALUE = b"v" * 100

_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def get_json(base: str, path: str) -> dict[str, object]:
    with _opener.open(base + path, timeout=10) as response:
        return json.loads(response.read())  # type: ignore[no-any-return]


@dataclass
class Totals:
    received: int
    delivered: int


def totals(base: str) -> Totals:
    books = get_json(base, "/books/json")
    received = sum(books["received"].values())  # type: ignore[attr-defined]
    delivered = sum(t["delivered"] for t in books["topics"])  # type: ignore[attr-defined]
    return Totals(received, delivered)


# --- the daemon ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Daemon:
    base: str  # the status server's URL
    datagram_path: str
    pid: int

    def cpu_seconds(self) -> float:
        """User + system CPU time the daemon has used (all its threads)."""
        with open(f"/proc/{self.pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextmanager
def running_daemon(bootstrap: str, workdir: str) -> Iterator[Daemon]:
    """``pydory serve`` in a subprocess."""
    config = DaemonConfig(bootstrap, workdir, max_buffer="256m", batching_time_ms=10)
    config_path = Path(workdir, "pydory.xml")
    config_path.write_text(config.render())
    log = Path(workdir, "pydory.log").open("w")  # noqa: SIM115 -- closed below
    daemon = subprocess.Popen(
        [sys.executable, "-m", "pydory", "serve", "--config-path", str(config_path)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{config.http_port}"
    try:
        wait_for_status(base, daemon)
        yield Daemon(base, config.datagram_path, daemon.pid)
    finally:
        daemon.terminate()
        daemon.wait(60)
        log.close()


def wait_for_status(base: str, daemon: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if daemon.poll() is not None:
            raise RuntimeError(f"pydory exited with status {daemon.returncode}")
        try:
            get_json(base, "/server_info/json")
        except OSError:
            time.sleep(0.1)
        else:
            return
    raise TimeoutError("pydory's status server did not come up")


# --- the flood -----------------------------------------------------------------------------


async def flood(base: str, seconds: float) -> int:
    """FLOOD_CLIENTS tasks fetching FLOOD_URLS in turn until SIGTERM or ``seconds`` pass;
    returns the number of answered requests."""
    import aiohttp  # only the flood process needs it

    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    deadline = time.monotonic() + seconds
    answered = 0

    async def client(session: aiohttp.ClientSession, first: int) -> None:
        nonlocal answered
        i = first
        while not stop.is_set() and time.monotonic() < deadline:
            async with session.get(base + FLOOD_URLS[i % len(FLOOD_URLS)]) as response:
                await response.read()
                answered += response.status == 200
            i += 1

    connector = aiohttp.TCPConnector(limit=FLOOD_CLIENTS)
    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*(client(session, i) for i in range(FLOOD_CLIENTS)))
    return answered


@contextmanager
def flooding(base: str) -> Iterator[subprocess.Popen[str]]:
    """The flood in its own process, bounded by ROUND_TIMEOUT_S; stopped on exit."""
    process = subprocess.Popen(
        [sys.executable, __file__, "--flood", base, "--seconds", str(ROUND_TIMEOUT_S)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(0.5)  # let the clients connect and reach full speed first
        yield process
    finally:
        process.terminate()
        process.wait(30)


# --- one round -----------------------------------------------------------------------------


@dataclass
class Round:
    flood: bool
    received_per_s: float
    delivered_per_s: float
    cpu_us_per_msg: float  # the daemon's CPU time over the round, per message


def ingest(daemon: Daemon, messages: list[bytes], *, with_flood: bool) -> Round:
    before = totals(daemon.base)
    cpu_before = daemon.cpu_seconds()
    target = len(messages)
    start = time.perf_counter()
    with DatagramSender(daemon.datagram_path) as sender:
        sender.send_many(messages)
    received_s = delivered_s = None
    deadline = time.monotonic() + ROUND_TIMEOUT_S
    while delivered_s is None:
        if time.monotonic() > deadline:
            raise TimeoutError("the round did not finish in time")
        now = totals(daemon.base)
        elapsed = time.perf_counter() - start
        if received_s is None and now.received - before.received >= target:
            received_s = elapsed
        if now.delivered - before.delivered >= target:
            delivered_s = elapsed
            received_s = received_s or elapsed
        else:
            time.sleep(POLL_S)
    cpu_us = (daemon.cpu_seconds() - cpu_before) * 1e6 / target
    return Round(with_flood, target / received_s, target / delivered_s, cpu_us)


def idle_flood_cost(daemon: Daemon, seconds: float = 5.0) -> None:
    """The flood alone: the daemon's CPU time per answered request, and its share of a CPU
    (beyond what the idle daemon uses anyway, measured over as long just before)."""
    cpu_before = daemon.cpu_seconds()
    time.sleep(seconds)
    idle_cpu = daemon.cpu_seconds() - cpu_before
    cpu_before = daemon.cpu_seconds()
    process = subprocess.Popen(
        [sys.executable, __file__, "--flood", daemon.base, "--seconds", str(seconds)],
        stdout=subprocess.PIPE,
        text=True,
    )
    answered_text, _ = process.communicate(timeout=seconds + 30)
    cpu = daemon.cpu_seconds() - cpu_before - idle_cpu
    answered = int(answered_text)
    print(
        f"flood alone for {seconds:.0f} s: {answered / seconds:,.0f} requests/s answered, "
        f"daemon CPU {cpu * 1e6 / max(answered, 1):,.0f} µs/request, "
        f"{100 * cpu / seconds:.1f}% of one CPU (idle daemon: {100 * idle_cpu / seconds:.1f}%)",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=200_000, help="datagrams per round")
    parser.add_argument("--rounds", type=int, default=6, help="rounds (half with the flood)")
    parser.add_argument("--flood", metavar="URL", help=argparse.SUPPRESS)
    parser.add_argument("--seconds", type=float, default=ROUND_TIMEOUT_S, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.flood:  # the flood process
        answered = asyncio.run(flood(args.flood, args.seconds))
        print(answered)
        return

    messages = [encode_message(TOPIC, VALUE) for _ in range(args.messages)]
    with MockCluster(brokers=3) as cluster, tempfile.TemporaryDirectory(prefix="flood") as work:
        cluster.create_topic(TOPIC, PARTITIONS)
        with running_daemon(cluster.bootstrap_servers, work) as daemon:
            ingest(daemon, messages[: args.messages // 10], with_flood=False)  # warm-up
            idle_flood_cost(daemon)
            rounds = []
            for i in range(args.rounds):
                with_flood = i % 4 in (1, 2)  # quiet, flood, flood, quiet, ...
                if with_flood:
                    with flooding(daemon.base) as flood_process:
                        started = time.perf_counter()
                        result = ingest(daemon, messages, with_flood=True)
                        flood_process.terminate()
                        answered_text, _ = flood_process.communicate(timeout=30)
                        seconds = time.perf_counter() - started
                    answered = int(answered_text or 0)
                    note = f"  ({answered} status requests answered, ~{answered / seconds:,.0f}/s)"
                else:
                    result = ingest(daemon, messages, with_flood=False)
                    note = ""
                rounds.append(result)
                print(
                    f"round {i + 1} {'flood' if with_flood else 'quiet'}: "
                    f"received {result.received_per_s:,.0f} msgs/s, "
                    f"delivered {result.delivered_per_s:,.0f} msgs/s, "
                    f"daemon CPU {result.cpu_us_per_msg:.1f} µs/msg{note}",
                    flush=True,
                )
    report(rounds, args.messages)


def report(rounds: list[Round], messages: int) -> None:
    if not any(r.flood for r in rounds) or all(r.flood for r in rounds):
        return  # nothing to compare

    def median(with_flood: bool, field: str) -> float:
        return statistics.median(getattr(r, field) for r in rounds if r.flood is with_flood)

    print(f"\n{messages:,} datagrams of {len(VALUE)}-byte values per round, {os.cpu_count()} CPUs")
    print("| median of the rounds | quiet | flood | flood / quiet |")
    print("|---|---|---|---|")
    for field, label in (
        ("received_per_s", "received, msgs/s"),
        ("delivered_per_s", "delivered, msgs/s"),
        ("cpu_us_per_msg", "daemon CPU, µs/msg"),
    ):
        quiet, flooded = median(False, field), median(True, field)
        print(f"| {label} | {quiet:,.1f} | {flooded:,.1f} | {flooded / quiet:.2f} |")


if __name__ == "__main__":
    main()
