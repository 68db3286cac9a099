"""How much memory do half-sent stream frames cost? Issue 21, item 2's probe, old and new.

A real daemon (``pydory serve`` from the source tree given, in its own process) on
librdkafka's mock cluster, ``maxBuffer`` 16m (Dory's default). ``--connections``
clients (300) each connect to the UNIX stream socket and write all but the last byte of
a (1 MiB - 1)-byte message, with non-blocking writes for up to ``--seconds`` (a daemon
that stops reading a connection leaves the rest in the kernel). Then, reported: the
daemon's resident memory (VmRSS, and its peak VmHWM), the pool's ``used``, and how many
connections the daemon closed (``stream_partial_frame_no_room_unix_stream``), at once
and again after ``--wait`` seconds (the daemon closes a connection whose partial frame
found no room within 10 s).

Not a test. Run (BENCHMARKS.md, "Half-sent stream frames"):
  .venv/bin/python benchmarks/partial_frames.py --tree old=/tmp/pydory-base-h2/src \\
      --tree new=/tmp/pydory-new-h2/src
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pydory.wire import encode_any_partition
from pydory_tools.testing.daemon_config import DaemonConfig
from pydory_tools.testing.mock_cluster import MockCluster

TOPIC = "partial.frames"
FRAME_BYTES = 1024 * 1024 - 1
NO_ROOM = "stream_partial_frame_no_room_unix_stream"


def rss_mb(pid: int) -> tuple[float, float]:
    """VmRSS and VmHWM of ``pid``, in MB."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        fields[name] = value
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def get_json(url: str) -> dict[str, object]:
    import json
    import urllib.request

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=30) as response:
        return json.loads(response.read())  # type: ignore[no-any-return]


def report(name: str, pid: int, base: str, when: str) -> None:
    rss, hwm = rss_mb(pid)
    pool = get_json(base + "/books/json")["pool"]
    counters = {
        c["name"]: c["value"]
        for c in get_json(base + "/counters/json")["counters"]  # type: ignore[attr-defined]
    }
    print(
        f"{name:>5} {when:>14}: RSS {rss:6.1f} MB (peak {hwm:6.1f}), pool used "
        f"{pool['used'] / 1e6:6.1f} MB of {pool['budget'] / 1e6:.1f}, "  # type: ignore[index]
        f"closed for no room {counters.get(NO_ROOM, 'n/a')}",
        flush=True,
    )


def run(name: str, src: str, bootstrap: str, args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="partial") as work:
        config = DaemonConfig(bootstrap, work, tcp_port=None, unix_datagram=False, max_buffer="16m")
        config_path = Path(work, "pydory.xml")
        config_path.write_text(config.render())
        env = {**os.environ, "PYTHONPATH": os.path.abspath(src)}
        base = f"http://127.0.0.1:{config.http_port}"
        with Path(work, "pydory.log").open("w") as log:
            daemon = subprocess.Popen(
                [sys.executable, "-m", "pydory", "serve", "--config-path", str(config_path)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            )
            clients: list[socket.socket] = []
            try:
                deadline = time.monotonic() + 60
                while True:
                    try:
                        get_json(base + "/books/json")
                        break
                    except OSError:
                        if time.monotonic() > deadline or daemon.poll() is not None:
                            raise
                        time.sleep(0.1)
                report(name, daemon.pid, base, "idle")
                overhead = len(encode_any_partition(TOPIC, b""))
                frame = encode_any_partition(TOPIC, b"v" * (FRAME_BYTES - overhead))
                data = memoryview(frame[:-1])
                sent = []
                for _ in range(args.connections):
                    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                    client.connect(config.stream_path)
                    client.setblocking(False)
                    clients.append(client)
                    sent.append(0)
                stop = time.monotonic() + args.seconds
                while time.monotonic() < stop and min(sent) < len(data):
                    for i, client in enumerate(clients):
                        with contextlib.suppress(BlockingIOError, BrokenPipeError, OSError):
                            sent[i] += client.send(data[sent[i] :])
                    time.sleep(0.01)
                whole = sum(n == len(data) for n in sent)
                print(f"{name:>5}: {whole} of {len(clients)} clients wrote their partial frame")
                report(name, daemon.pid, base, "after writing")
                time.sleep(args.wait)
                report(name, daemon.pid, base, f"{args.wait:.0f} s later")
            finally:
                for client in clients:
                    client.close()
                daemon.terminate()
                try:
                    daemon.wait(60)
                except subprocess.TimeoutExpired:
                    daemon.kill()
                    daemon.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tree", action="append", required=True, metavar="NAME=SRC")
    parser.add_argument("--connections", type=int, default=300)
    parser.add_argument("--seconds", type=float, default=5.0, help="time to write, at most")
    parser.add_argument("--wait", type=float, default=12.0, help="then, before reporting")
    args = parser.parse_args()
    with MockCluster(brokers=1) as cluster:
        cluster.create_topic(TOPIC, 1)
        for tree in args.tree:
            name, src = tree.split("=", 1)
            run(name, src, cluster.bootstrap_servers, args)


if __name__ == "__main__":
    main()
