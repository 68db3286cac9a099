"""A paced sender's rate, alone and beside flooders of other clients, on every transport.

Issue 21, item 4 (stream flooders against a datagram sender), extended to every pairing by
issue 33, point 2. A real daemon (``pydory serve`` in its own process, run from a source
tree given on the command line, so that two commits can be compared) on librdkafka's
mock cluster (in this process), with its UNIX datagram, UNIX stream and TCP inputs. Per
cell:

- F flooders (0, 1, 4, ...), each a process of its own writing 100-byte values
  (119-byte messages) as fast as the daemon reads them: on a stream transport (UNIX
  stream or loopback TCP) its own connection, blocking ``sendall`` of 64 KiB of whole
  messages; on the datagram socket, one blocking ``send`` per message.
  ``--flood-transport`` names theirs (``mixed``: the flooders alternate between the UNIX
  stream socket and TCP). When this process may switch uid (root), each flooder runs as
  a uid of its own (``FLOODER_UID_BASE`` + i, no passwd entry needed; the socket files
  are 0666 in a directory opened to all), so each is a client of its own, other than the
  paced sender's (a client is a uid on every transport); else they run as this uid. They
  start 0.5 s before the paced sender;
- the paced (polite) sender, a process sending 100-byte messages paced at ``--rate``
  (15,000/s by default) for ``--seconds`` or until ``--count`` are sent, on
  ``--polite-transport``: datagrams with blocking ``send``, or blocking ``sendall`` on a
  stream connection (the kernel's default buffers, as any client has). Its figure is the
  polite messages the daemon read (its books: accepted or discarded) from the moment
  the sender started to the moment it ended, over the seconds it took: the rate the
  daemon served it, whatever the kernel still held for it then. (A datagram queue holds
  only ``net.unix.max_dgram_qlen``, 10 here, so a datagram sender is also slowed to the
  daemon's reading; a stream sender would not be until its socket buffers fill, which is
  why the figure is read off the books.) The rate it sent at is printed beside it.

Between cells the flood is stopped and the daemon left to settle (its books show every
message delivered or discarded). Trees are interleaved round by round (old, new, new,
old, ...) and within a round the cells are rotated, so that drift hits every variant.
Bounded: every child has a deadline, is killed by PID at the end of its cell, and a
round gives up after ``ROUND_TIMEOUT_S``.

Not a test. Run (BENCHMARKS.md, "Fair service between clients"):
  .venv/bin/python benchmarks/fair_share.py --tree new=src --rounds 3 \\
      --polite-transport dgram --flood-transport tcp
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

#: The first uid the flooders run as when this process may switch uid (root): flooder i
#: runs as FLOODER_UID_BASE + i, a client of its own.
FLOODER_UID_BASE = 61000
#: The children's interpreter when they switch uid: the system's (they need the standard
#: library only, and another uid may not read this one's virtual environment).
SYSTEM_PYTHON = "/usr/bin/python3"

#: argv: transport (dgram, unix, tcp), path or TCP port, deadline (monotonic), message hex.
FLOODER = """
import socket, sys, time
transport, address, deadline = sys.argv[1], sys.argv[2], float(sys.argv[3])
message = bytes.fromhex(sys.argv[4])
if transport == "dgram":
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.connect(address)
        s.settimeout(1.0)
        while time.monotonic() < deadline:
            try:
                s.send(message)
            except TimeoutError:
                pass  # the queue is full: check the deadline
    sys.exit(0)
chunk = message * (65536 // len(message))
tcp = transport == "tcp"
with socket.socket(socket.AF_INET if tcp else socket.AF_UNIX, socket.SOCK_STREAM) as s:
    s.connect(("127.0.0.1", int(address)) if tcp else address)
    s.settimeout(1.0)
    while time.monotonic() < deadline:
        try:
            s.sendall(chunk)
        except TimeoutError:
            pass  # the daemon is not reading this one now; check the deadline
"""

#: argv: transport (dgram, unix, tcp), path or TCP port, rate, count, seconds, message
#: hex. Prints "sent elapsed".
POLITE = """
import socket, sys, time
transport, address = sys.argv[1], sys.argv[2]
rate, count, seconds = float(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
message = bytes.fromhex(sys.argv[6])
if transport == "dgram":
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.connect(address)
    send = s.send
else:
    tcp = transport == "tcp"
    s = socket.socket(socket.AF_INET if tcp else socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(("127.0.0.1", int(address)) if tcp else address)
    send = s.sendall
with s:
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
        send(message)
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

    def read(self, topic: str) -> int:
        """Messages of ``topic`` the daemon has read so far (accepted or discarded)."""
        books = get_json(self.base, "/books/json")
        return sum(
            t["accepted"] + sum(t["discarded"].values())
            for t in books["topics"]  # type: ignore[attr-defined]
            if t["topic"] == topic
        )

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


def address_of(daemon: Daemon, transport: str) -> str:
    """Where a client of ``transport`` sends."""
    return {"dgram": daemon.datagram_path, "unix": daemon.stream_path}.get(
        transport, str(daemon.tcp_port)
    )


def flooder_identity(i: int) -> dict[str, object]:
    """``Popen`` arguments running flooder ``i`` as a client of its own (a uid of its
    own) when this process may switch uid; none otherwise."""
    if os.geteuid() != 0:
        return {}
    uid = FLOODER_UID_BASE + i
    return {"user": uid, "group": uid, "extra_groups": []}


def polite_rate(daemon: Daemon, flooders: int, args: argparse.Namespace) -> tuple[float, float]:
    """One cell: the polite sender's messages/s the daemon read beside ``flooders``
    flooders, and the rate it sent at."""
    flood_message = encode_any_partition(FLOOD_TOPIC, b"f" * VALUE_BYTES).hex()
    polite_message = encode_any_partition(POLITE_TOPIC, b"p" * VALUE_BYTES).hex()
    deadline = time.monotonic() + FLOOD_WARMUP_S + args.seconds + 5
    transports = {"mixed": ["unix", "tcp"]}.get(args.flood_transport, [args.flood_transport])
    python = SYSTEM_PYTHON if os.geteuid() == 0 else sys.executable
    flood_before, polite_before = daemon.read(FLOOD_TOPIC), daemon.read(POLITE_TOPIC)
    children = []
    for i in range(flooders):
        transport = transports[i % len(transports)]
        command = [python, "-c", FLOODER, transport, address_of(daemon, transport)]
        command += [str(deadline), flood_message]
        children.append(subprocess.Popen(command, **flooder_identity(i)))  # type: ignore[call-overload]
    try:
        if flooders:
            time.sleep(FLOOD_WARMUP_S)
        polite = subprocess.run(
            [
                sys.executable,
                "-c",
                POLITE,
                args.polite_transport,
                address_of(daemon, args.polite_transport),
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
        # At once, the flooders still at it: what the daemon read of the polite sender.
        polite_read = daemon.read(POLITE_TOPIC) - polite_before
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
    if flooders and daemon.read(FLOOD_TOPIC) == flood_before:
        raise RuntimeError("the flooders sent nothing the daemon read: the cell is void")
    return polite_read / float(elapsed), int(sent) / float(elapsed)


def report(
    args: argparse.Namespace, round_number: int, name: str, flooders: int, rate: float, sent: float
) -> None:
    """One cell's figure, printed and (``--json``) appended with the 1-minute load."""
    load = os.getloadavg()[0]
    print(
        f"round {round_number} {name:>6} {args.polite_transport} beside {flooders} "
        f"{args.flood_transport} flooders: polite {rate:,.0f} messages/s read "
        f"({sent:,.0f}/s sent; load {load:.1f})",
        flush=True,
    )
    if args.json:
        with open(args.json, "a") as out:
            line = {"round": round_number, "tree": name, "flooders": flooders}
            line |= {"polite_per_s": rate, "polite_sent_per_s": sent}
            line |= {"flood_transport": args.flood_transport}
            line |= {"polite_transport": args.polite_transport, "load_1m": load}
            line |= {"flooders_own_uids": os.geteuid() == 0}
            out.write(json.dumps(line) + "\n")


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
    parser.add_argument("--rate", type=float, default=15_000.0, help="polite messages/s")
    parser.add_argument("--count", type=int, default=60_000, help="polite messages, at most")
    parser.add_argument("--seconds", type=float, default=4.0, help="polite sending time, at most")
    parser.add_argument(
        "--flood-transport",
        choices=("unix", "tcp", "dgram", "mixed"),
        default="unix",
        help="mixed: the flooders alternate between the UNIX stream socket and TCP",
    )
    parser.add_argument(
        "--polite-transport",
        choices=("dgram", "unix", "tcp"),
        default="dgram",
        help="the paced sender's transport",
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
                with tempfile.TemporaryDirectory(prefix="fair") as work:
                    os.chmod(work, 0o755)  # the flooders' uids reach the socket files
                    with running_daemon(trees[name], cluster.bootstrap_servers, work) as daemon:
                        for flooders in rotated:
                            if time.monotonic() > round_deadline:
                                raise TimeoutError("the round took too long")
                            rate, sent = polite_rate(daemon, flooders, args)
                            results.setdefault((name, flooders), []).append(rate)
                            report(args, round_number + 1, name, flooders, rate, sent)
    print(
        f"\nmedians (min-max), polite {args.polite_transport} messages/s read beside "
        f"{args.flood_transport} flooders; share of its rate alone; 1-minute load "
        f"{os.getloadavg()[0]:.1f}"
    )
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
