"""The datagram input's reads, the loop's reader against the drain thread (issue 34, lever
1): counts, not times. Not a test.

One receiver (a ``DatagramInput`` on uvloop handing its bursts to an intake that only counts
them) and one sender (``pydory bench``'s C write loop, ``_cloadgen``: a non-blocking socket,
``poll`` for room when the queue is full), as two processes, so the receiver can run under
``perf stat`` or callgrind alone::

    P=/tmp/dd.sock
    perf stat -e syscalls:sys_enter_recvmmsg,context-switches -- \\
        .venv/bin/python benchmarks/datagram_drain.py receive --path $P -n 200000 --mode drain &
    .venv/bin/python benchmarks/datagram_drain.py send --path $P -n 200000; wait

``--work-us W --burst-work-us B``: the intake spins W µs per datagram and B per burst, on
the CPU, as the daemon's loop thread works (its intake, producer and spool: ~2-3 µs per
datagram at aa48e33). ``--stall-ms M --stall-every K``: the intake sleeps M ms every K
bursts, the loop thread off the CPU as on a busy host (the drain thread reads on
meanwhile; the loop's reader cannot).
The receiver prints JSON: bursts handed to the intake, datagrams per burst, the drain's
counters; the sender prints how often it found the queue full and slept (its voluntary
context switches, ``getrusage``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import socket
import statistics
import time
from collections.abc import Sequence

import uvloop

from pydory.daemon.books.events import Transport
from pydory.daemon.inputs import datagram_drain
from pydory.daemon.inputs.datagram import DatagramInput
from pydory.hotpath import DatagramDrain


class CountingIntake:
    def __init__(
        self, stall_ms: float, stall_every: int, work_us: float, burst_work_us: float
    ) -> None:
        self._work_s, self._burst_work_s = work_us / 1e6, burst_work_us / 1e6
        self.bursts: list[int] = []
        self.count = 0
        self.done = asyncio.Event()
        self.expected = 0
        self._stall_s, self._stall_every = stall_ms / 1000, stall_every

    def datagrams(self, burst: Sequence[bytes], client: object = None) -> None:
        self.bursts.append(len(burst))
        self.count += len(burst)
        # The daemon's own work on the loop thread (the intake, the producer), on the CPU.
        until = time.perf_counter() + self._burst_work_s + self._work_s * len(burst)
        while time.perf_counter() < until:
            pass
        if self._stall_every and len(self.bursts) % self._stall_every == 0:
            time.sleep(self._stall_s)  # the loop thread off the CPU
        if self.count >= self.expected:
            self.done.set()

    def datagram_too_large(self, size: int, prefix: bytes) -> None:
        raise AssertionError("none is too large here")

    def frames(self, burst: Sequence[bytes], transport: Transport) -> None:
        raise AssertionError

    def broken_stream(self, error: object, transport: Transport) -> None:
        raise AssertionError

    def unclean_disconnect(self, prefix: bytes, transport: Transport) -> None:
        raise AssertionError

    def connection_opened(self, transport: Transport) -> None:
        raise AssertionError

    def connection_closed(self, transport: Transport, error: BaseException | None = None) -> None:
        raise AssertionError


async def receive(args: argparse.Namespace) -> None:
    datagram_drain.use(DatagramDrain if args.mode == "drain" else None)
    intake = CountingIntake(args.stall_ms, args.stall_every, args.work_us, args.burst_work_us)
    intake.expected = args.messages
    source = DatagramInput(args.path, None, 65536, False, intake)
    source.start(asyncio.get_running_loop())
    drain = source._drain
    await intake.done.wait()
    stats = drain.stats() if drain is not None else {}
    source.close()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    bursts = intake.bursts
    print(
        json.dumps(
            {
                "mode": args.mode,
                "datagrams": intake.count,
                "bursts": len(bursts),
                "per_burst_mean": round(intake.count / len(bursts), 1),
                "per_burst_median": statistics.median(bursts),
                "per_burst_max": max(bursts),
                "drain": stats,
                "receiver_voluntary_switches": usage.ru_nvcsw,
                "receiver_involuntary_switches": usage.ru_nivcsw,
            }
        )
    )


def send(args: argparse.Namespace) -> None:
    from pydory_tools import _cloadgen  # type: ignore[attr-defined]

    while not os.path.exists(args.path):
        time.sleep(0.01)  # not a deadline: the receiver binds
    payloads = [b"%06d" % i + b"x" * (args.value_bytes - 6) for i in range(4096)]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.connect(args.path)
        sock.setblocking(False)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw
        _cloadgen.send_writes(
            sock.fileno(), payloads, 0, args.messages, False, time.monotonic() + 600
        )
        slept = resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw - before
    print(json.dumps({"sent": args.messages, "sender_slept_on_full_queue": slept}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("role", choices=["receive", "send"])
    parser.add_argument("--path", required=True)
    parser.add_argument("-n", "--messages", type=int, default=200_000)
    parser.add_argument("-v", "--value-bytes", type=int, default=100)
    parser.add_argument("--mode", choices=["loop", "drain"], default="loop")
    parser.add_argument("--stall-ms", type=float, default=0.0)
    parser.add_argument("--stall-every", type=int, default=0)
    parser.add_argument("--work-us", type=float, default=0.0, help="loop CPU per datagram")
    parser.add_argument("--burst-work-us", type=float, default=0.0, help="loop CPU per burst")
    args = parser.parse_args()
    if args.role == "receive":
        uvloop.run(receive(args))
    else:
        send(args)


if __name__ == "__main__":
    main()
