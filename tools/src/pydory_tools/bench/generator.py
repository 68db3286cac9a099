"""The load generator: one child process writing pre-encoded messages as fast as it can,
or at an offered rate.

``python -m pydory_tools.bench.generator JOB`` (see pydory_tools.bench.child for the
protocol). The job: transport (dgram | stream | tcp), address (socket path or TCP port),
messages, value_bytes, batch (messages per stream write), topic, probe_topic, probe_every
(0: no probes), seed, deadline_s, rate (messages per second; 0: as fast as it can). Writes
block when the receiver is slower (a full datagram queue, a full stream buffer): that is
the backpressure being measured, not an error.

Paced (rate > 0), it sends one tick's worth of whole writes (:data:`PACE_TICK_S`), then
sleeps until the next message is due (as benchmarks/fair_share.py's paced sender does, per
message): the receiver then meets bursts set by the pacing, not by the scheduler. Behind
schedule it does not sleep, so it catches up at full speed.

Result: first_send and last_send (time.monotonic(), comparable across processes on
Linux), messages, probes, the generator's CPU seconds, and which write loop ran
(``writer``): the compiled one (``pydory_tools._cloadgen``: the same writes, one system call
each, without the GIL; a Python loop was the benchmark's wall where the daemon keeps up)
where it is built, else the Python one, the reference (``PYDORY_PURE_PYTHON=1`` forces it).
"""

from __future__ import annotations

import math
import os
import socket
import sys
import time
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

from pydory.hotpath import PURE_PYTHON_VARIABLE
from pydory_tools.bench import workload
from pydory_tools.bench.child import WaitForGo, child_main, time_left

_cloadgen: ModuleType | None
try:
    from pydory_tools import _cloadgen
except ImportError:  # not built here: the Python loop
    _cloadgen = None

#: Messages sent between two deadline checks when there are no probes.
CHUNK_WITHOUT_PROBES = 10_000
#: A paced generator sends this many seconds' worth of messages (whole writes) at a time.
PACE_TICK_S = 0.001


def connect(transport: str, address: str | int, deadline: float) -> socket.socket:
    """A blocking socket to the receiver, with the remaining time as its timeout."""
    if transport == "dgram":
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.connect(str(address))
    elif transport == "stream":
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(str(address))
    elif transport == "tcp":
        sock = socket.create_connection(("127.0.0.1", int(address)))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    else:
        raise ValueError(f"unknown transport {transport!r}")
    sock.settimeout(time_left(deadline))  # a stuck receiver fails the send, not the clock
    return sock


class Writer:
    """Sends messages from the pool in writes of ``batch`` messages (1 for datagrams)."""

    def __init__(
        self,
        sock: socket.socket,
        messages: list[bytes],
        batch: int,
        stream: bool,
        deadline: float = math.inf,
        compiled: bool | None = None,
    ):
        """``compiled``: the C write loop (None: where it is built, unless
        PYDORY_PURE_PYTHON is set); ``deadline`` (time.monotonic()): its waits' end."""
        self._send: Callable[[bytes], Any] = sock.sendall if stream else sock.send
        if compiled is None:
            pure = os.environ.get(PURE_PYTHON_VARIABLE, "") not in ("", "0")
            compiled = _cloadgen is not None and not pure
        self.compiled = compiled
        self._fd, self._stream, self._deadline = sock.fileno(), stream, deadline
        self._messages = messages
        self._batch = batch
        self._writes = workload.stream_writes(messages, batch) if batch > 1 else messages
        self._next = 0  # index of the next full write in self._writes

    def send_messages(self, count: int) -> None:
        send, writes, batch = self._send, self._writes, self._batch
        full, rest = divmod(count, batch)
        index, total = self._next, len(writes)
        if self.compiled and full:
            assert _cloadgen is not None
            index = _cloadgen.send_writes(
                self._fd, writes, index, full, self._stream, self._deadline
            )
        else:
            for _ in range(full):
                send(writes[index])
                index += 1
                if index == total:
                    index = 0
        self._next = index
        if rest:
            send(b"".join(self._messages[:rest]))

    def send(self, data: bytes) -> None:
        self._send(data)


class Pacer:
    """Sends at ``rate`` messages per second from its start: message k is due at
    start + k / rate; ``step`` is how many it sends per tick (whole writes of ``batch``)."""

    def __init__(self, rate: float, batch: int, start: float) -> None:
        self._rate, self._start = rate, start
        self.step = max(1, round(rate * PACE_TICK_S / batch)) * batch

    def wait_until_due(self, sent: int, deadline: float) -> None:
        """Sleep until message number ``sent`` is due (not past ``deadline``)."""
        ahead = self._start + sent / self._rate - time.monotonic()
        if ahead > 0:
            time.sleep(min(ahead, time_left(deadline)))


def send_chunk(writer: Writer, count: int, sent: int, pacer: Pacer | None, deadline: float) -> None:
    """Send ``count`` messages, the first being message number ``sent`` of the run: at
    once, or in the pacer's steps, each when it is due."""
    if pacer is None:
        writer.send_messages(count)
        return
    done = 0
    while done < count:
        step = min(pacer.step, count - done)
        pacer.wait_until_due(sent + done, deadline)
        writer.send_messages(step)
        done += step


def generate(job: Mapping[str, Any], wait_for_go: WaitForGo) -> Mapping[str, Any]:
    deadline = time.monotonic() + float(job["deadline_s"])
    transport: str = job["transport"]
    messages = workload.encoded_messages(job["topic"], int(job["value_bytes"]), int(job["seed"]))
    sock = connect(transport, job["address"], deadline)
    writer = Writer(sock, messages, int(job["batch"]), transport != "dgram", deadline)
    total, probe_every = int(job["messages"]), int(job["probe_every"])
    chunk = probe_every if probe_every > 0 else CHUNK_WITHOUT_PROBES
    probe_topic, value_bytes = job["probe_topic"], int(job["value_bytes"])
    rate = float(job.get("rate", 0))
    wait_for_go({})
    cpu_start = time.process_time()
    first_send = time.monotonic()
    pacer = Pacer(rate, int(job["batch"]), first_send) if rate > 0 else None
    sent = probes = 0
    try:
        while sent < total:
            count = min(chunk, total - sent)
            send_chunk(writer, count, sent, pacer, deadline)
            sent += count
            if probe_every > 0 and count == probe_every:
                writer.send(workload.encode_probe(probe_topic, value_bytes, time.time_ns()))
                probes += 1
            time_left(deadline)
        last_send = time.monotonic()
    finally:
        sock.close()
    return {
        "first_send": first_send,
        "last_send": last_send,
        "messages": sent,
        "probes": probes,
        "cpu_s": time.process_time() - cpu_start,
        "writer": "compiled" if writer.compiled else "python",
    }


if __name__ == "__main__":
    sys.exit(child_main(generate))
