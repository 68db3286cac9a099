"""What issue 21's items 5 and 6 cost on the input path: accepting stream connections in
Python (daemon/inputs/acceptor.py) instead of in libuv, and reading datagrams with their
sender's credentials (recvmsg + SCM_CREDENTIALS, only with a datagram quota) instead of
recv_into.

Not a test. Two parts, each run in a process of its own, interleaved over rounds:

- ``accept``: a TCP StreamInput on uvloop; one client connects, the daemon side's
  connection_made runs, the client closes, connection_lost runs; 1,000 times a round.
  Give ``--old-src DIR`` (``git archive <commit> src | tar -x -C DIR``) to compare with
  the tree before (its StreamInput accepts in libuv), e.g. 87b9e61's or b5cd780's.
- ``dgram``: a UNIX datagram socket filled to its queue limit and drained, 100-byte
  datagrams: microseconds per datagram read with ``recv_into`` and with ``recvmsg_into``
  asking for SCM_CREDENTIALS (the socket has SO_PASSCRED for both).

    .venv/bin/python benchmarks/accept_and_credentials.py --old-src /tmp/old/src
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

ACCEPT = """
import asyncio, socket, time, uvloop
from pydory.daemon.books.events import Transport
from pydory.daemon.inputs.stream import StreamInput

class Intake:
    def __getattr__(self, name):
        return lambda *args, **kwargs: None

async def main():
    loop = asyncio.get_running_loop()
    stream_input = StreamInput(Transport.TCP, 1 << 20, Intake(), port=0)
    await stream_input.start(loop)
    n = 1000
    began = time.perf_counter()
    for _ in range(n):
        client = socket.socket()
        client.setblocking(False)
        await loop.sock_connect(client, ("127.0.0.1", stream_input.port))
        while stream_input.connection_count == 0:
            await asyncio.sleep(0)
        client.close()
        while stream_input.connection_count:
            await asyncio.sleep(0)
    print(n / (time.perf_counter() - began))
    await stream_input.close()

uvloop.run(main())
"""

DGRAM = """
import os, socket, sys, time
path = sys.argv[1] + "/d"
receiver = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
receiver.bind(path)
receiver.setblocking(False)
receiver.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
sender.setblocking(False)
buffer = bytearray(2048)
space = socket.CMSG_SPACE(12)
reads = {
    "recv_into": lambda: receiver.recv_into(buffer, 2048, socket.MSG_TRUNC),
    "recvmsg_into": lambda: receiver.recvmsg_into([buffer], space, socket.MSG_TRUNC),
}
read = reads[sys.argv[2]]
total, spent = 0, 0.0
for _ in range(2000):
    while True:
        try:
            sender.sendto(b"y" * 100, path)
        except BlockingIOError:
            break
    began = time.perf_counter()
    while True:
        try:
            read()
        except BlockingIOError:
            break
        total += 1
    spent += time.perf_counter() - began
print(spent / total * 1e6)
"""


def run(code: str, src: str | None, *args: str) -> float:
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = src
    out = subprocess.run(
        [sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, check=True
    )
    return float(out.stdout.strip())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old-src", help="the src/ directory of the tree to compare with")
    parser.add_argument("--rounds", type=int, default=5)
    options = parser.parse_args()
    accept: dict[str, list[float]] = {"python accept (this tree)": []}
    if options.old_src:
        accept["libuv accept (--old-src)"] = []
    dgram: dict[str, list[float]] = {"recv_into": [], "recvmsg_into": []}
    for _ in range(options.rounds):
        for name in accept:
            src = options.old_src if "old" in name else None
            accept[name].append(run(ACCEPT, src))
        for name in dgram:
            with tempfile.TemporaryDirectory() as directory:
                dgram[name].append(run(DGRAM, None, directory, name))
    print("| accept path | connections/s, median (min-max) |\n|---|---|")
    for name, rates in accept.items():
        print(f"| {name} | {statistics.median(rates):,.0f} ({min(rates):,.0f}-{max(rates):,.0f}) |")
    print("\n| datagram read | µs per datagram, median (min-max) |\n|---|---|")
    for name, costs in dgram.items():
        print(f"| {name} | {statistics.median(costs):.2f} ({min(costs):.2f}-{max(costs):.2f}) |")


if __name__ == "__main__":
    main()
