"""Does a stream flooder starve the datagram input? A polite sender's rate, alone and beside.

Issue 21, item 4. A real daemon (``pydory serve`` in its own process, run from a source
tree given on the command line, so that two commits can be compared) on librdkafka's
mock cluster (in this process), with its UNIX datagram and UNIX stream inputs. Per cell:

- F flooders (0, 1 or 4), each a process writing 100-byte values (119-byte messages) to
  its own UNIX stream (or, ``--flood-transport tcp``, loopback TCP; ``mixed``: the
  flooders alternate between the two, issue 33) connection as fast as
  the daemon reads them (blocking ``sendall`` of 64 KiB of whole messages), started 0.5 s
  before the polite sender;
- the polite sender, a process sending 100-byte datagrams with blocking ``send`` paced at
  ``--rate`` (15,000/s: what the issue's sender got alone), for ``--seconds`` or until
  ``--count`` are sent. Its figure is datagrams sent / seconds taken: a datagram queue
  holds only ``net.unix.max_dgram_qlen`` (10 here) datagrams, so a send returns only once
  the daemon has read nearly all before it, and the rate it achieves is the rate the
  daemon reads it.

Between cells the flood is stopped and the daemon left to settle (its books show every
message delivered or discarded). Trees are interleaved round by round (old, new, new,
old, ...) and within a round the cells are rotated, so that drift hits every variant.
Bounded: every child has a deadline, is killed by PID at the end of its cell, and a
round gives up after ``ROUND_TIMEOUT_S``.

Not a test. Run (BENCHMARKS.md, "Fair shares of the loop"):
  .venv/bin/python benchmarks/fair_share.py --tree old=/tmp/pydory-base-h2/src \\
      --tree new=src --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
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

from pydory.wire import encode_any_partition
from pydory_tools.testing.daemon_config import DaemonConfig
from pydory_tools.testing.mock_cluster import MockCluster

POLITE_TOPIC = "fair.polite"
FLOOD_TOPIC = "fair.flood"
PARTITIONS = 4
VALUE_BYTES = 100
FLOOD_WARMUP_S = 0.5
SETTLE_TIMEOUT_S = 120.0
ROUND_TIMEOUT_S = 600.0

_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

#: argv: path or TCP port, deadline (monotonic), message hex.
FLOODER = """
import socket, sys, time
address, deadline, message = sys.argv[1], float(sys.argv[2]), bytes.fromhex(sys.argv[3])
chunk = message * (65536 // len(message))
tcp = address.isdigit()
with socket.socket(socket.AF_INET if tcp else socket.AF_UNIX, socket.SOCK_STREAM) as s:
    s.connect(("127.0.0.1", int(address)) if tcp else address)
    s.settimeout(1.0)
    while time.monotonic() < deadline:
        try:
            s.sendall(chunk)
        except TimeoutError:
            pass  # the daemon is not reading this one now; check the deadline
"""

#: argv: path, rate, count, seconds, message hex. Prints "sent elapsed".
POLITE = """
import socket, sys, time
path, rate, count, seconds = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
message = bytes.fromhex(sys.argv[5])
with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
    s.connect(path)
    start = time.monotonic()
    deadline = start + seconds
    sent = 0
    while sent < count:
        now = time.monotonic()
        if now > deadline:
            break
        due = start + sent / rate
        if due - now > 0.001:
            time.sleep(due - now)
        s.send(message)
        sent += 1
    print(sent, time.monotonic() - start)
"""


def get_json(base: str, path: str) -> dict[str, object]:
    with _opener.open(base + path, timeout=30) as response:
        return json.loads(response.read())  # type: ignore[no-any-return]


@dataclass(frozen=True)
class Daemon:
    base: str
    datagram_path: str
    stream_path: str
    tcp_port: int

    def settled(self) -> bool:
        books = get_json(self.base, "/books/json")
        received = sum(books["received"].values())  # type: ignore[attr-defined]
        done = sum(
            t["delivered"] + sum(t["discarded"].values())
            for t in books["topics"]  # type: ignore[attr-defined]
        )
        return bool(done >= received)


@contextmanager
def running_daemon(src: str, bootstrap: str, workdir: str) -> Iterator[Daemon]:
    """``pydory serve`` from the source tree ``src``, in a process of its own."""
    config = DaemonConfig(bootstrap, workdir, max_buffer="256m", batching_time_ms=5)
    config_path = Path(workdir, "pydory.xml")
    config_path.write_text(config.render())
    env = {**os.environ, "PYTHONPATH": os.path.abspath(src)}
    with Path(workdir, "pydory.log").open("w") as log:
        daemon = subprocess.Popen(
            [sys.executable, "-m", "pydory", "serve", "--config-path", str(config_path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        base = f"http://127.0.0.1:{config.http_port}"
        try:
            wait_for_status(base, daemon)
            assert config.tcp_port is not None
            yield Daemon(base, config.datagram_path, config.stream_path, config.tcp_port)
        finally:
            daemon.terminate()
            try:
                daemon.wait(60)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait(30)


def wait_for_status(base: str, daemon: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if daemon.poll() is not None:
            raise RuntimeError(f"pydory exited with status {daemon.returncode}")
        try:
            books = get_json(base, "/books/json")
        except OSError:
            time.sleep(0.1)
            continue
        if books.get("metadata_known", True):
            return
        time.sleep(0.1)
    raise TimeoutError("pydory did not come up")


def polite_rate(daemon: Daemon, flooders: int, args: argparse.Namespace) -> float:
    """One cell: the polite sender's datagrams/s beside ``flooders`` stream flooders."""
    flood_message = encode_any_partition(FLOOD_TOPIC, b"f" * VALUE_BYTES).hex()
    polite_message = encode_any_partition(POLITE_TOPIC, b"p" * VALUE_BYTES).hex()
    deadline = time.monotonic() + FLOOD_WARMUP_S + args.seconds + 5
    tcp, unix = str(daemon.tcp_port), daemon.stream_path
    transports = {"tcp": [tcp], "unix": [unix], "mixed": [unix, tcp]}[args.flood_transport]
    children = [
        subprocess.Popen([sys.executable, "-c", FLOODER, address, str(deadline), flood_message])
        for address in (transports[i % len(transports)] for i in range(flooders))
    ]
    try:
        if flooders:
            time.sleep(FLOOD_WARMUP_S)
        polite = subprocess.run(
            [
                sys.executable,
                "-c",
                POLITE,
                daemon.datagram_path,
                str(args.rate),
                str(args.count),
                str(args.seconds),
                polite_message,
            ],
            capture_output=True,
            text=True,
            timeout=args.seconds + 60,
            check=True,
        )
    finally:
        for child in children:
            child.kill()
            child.wait(30)
    sent, elapsed = polite.stdout.split()
    settle_deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while not daemon.settled():
        if time.monotonic() > settle_deadline:
            raise TimeoutError("the daemon did not settle after the cell")
        time.sleep(0.1)
    return int(sent) / float(elapsed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--tree",
        action="append",
        required=True,
        metavar="NAME=SRC",
        help="a source tree to run the daemon from (its src/ directory); repeat",
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--flooders", default="0,1,4", help="comma-separated cells")
    parser.add_argument("--rate", type=float, default=15_000.0, help="polite datagrams/s")
    parser.add_argument("--count", type=int, default=60_000, help="polite datagrams, at most")
    parser.add_argument("--seconds", type=float, default=4.0, help="polite sending time, at most")
    parser.add_argument(
        "--flood-transport",
        choices=("unix", "tcp", "mixed"),
        default="unix",
        help="mixed: the flooders alternate between the UNIX stream socket and TCP",
    )
    parser.add_argument("--json", metavar="FILE", help="append one JSON line per cell")
    args = parser.parse_args()
    trees = dict(tree.split("=", 1) for tree in args.tree)
    cells = [int(n) for n in args.flooders.split(",")]
    results: dict[tuple[str, int], list[float]] = {}
    with MockCluster(brokers=3) as cluster:
        cluster.create_topic(POLITE_TOPIC, PARTITIONS)
        cluster.create_topic(FLOOD_TOPIC, PARTITIONS)
        names = list(trees)
        for round_number in range(args.rounds):
            order = names if round_number % 2 == 0 else names[::-1]
            for name in order:
                round_deadline = time.monotonic() + ROUND_TIMEOUT_S
                rotated = cells[round_number % len(cells) :] + cells[: round_number % len(cells)]
                with (
                    tempfile.TemporaryDirectory(prefix="fair") as work,
                    running_daemon(trees[name], cluster.bootstrap_servers, work) as daemon,
                ):
                    for flooders in rotated:
                        if time.monotonic() > round_deadline:
                            raise TimeoutError("the round took too long")
                        rate = polite_rate(daemon, flooders, args)
                        results.setdefault((name, flooders), []).append(rate)
                        print(
                            f"round {round_number + 1} {name:>6} flooders={flooders}: "
                            f"polite {rate:,.0f} datagrams/s",
                            flush=True,
                        )
                        if args.json:
                            with open(args.json, "a") as out:
                                line = {"round": round_number + 1, "tree": name}
                                line |= {"flooders": flooders, "polite_per_s": rate}
                                line |= {"flood_transport": args.flood_transport}
                                out.write(json.dumps(line) + "\n")
    print("\nmedians (min-max), polite datagrams/s; share of its rate alone")
    for name in names:
        alone = statistics.median(results.get((name, 0), [float("nan")]))
        for flooders in cells:
            rates = results[(name, flooders)]
            median = statistics.median(rates)
            print(
                f"{name:>6} flooders={flooders}: {median:,.0f} ({min(rates):,.0f}-"
                f"{max(rates):,.0f}); {100 * median / alone:.0f}% of alone",
            )


if __name__ == "__main__":
    main()
