"""The raw-socket baseline's receiver: reads what the generators send and does nothing else.

``python -m pydory_tools.bench.sink JOB`` (protocol: pydory_tools.bench.child). The job: transport,
address (socket path, or 0 for a free TCP port), expect_messages (datagrams) or
expect_bytes (streams), connections (streams: how many generators will connect),
deadline_s. The ready line carries the bound address (``port`` for TCP).

It is the ceiling for any receiver written in Python on this machine: the same reads
the daemon does, without decoding, admission or Kafka. Result: last_receive
(time.monotonic()), messages or bytes received.
"""

from __future__ import annotations

import selectors
import socket
import sys
import time
from collections.abc import Mapping
from typing import Any

from pydory_tools.bench.child import WaitForGo, child_main, time_left

#: Read size: the daemon's own datagram buffer is maxDatagramMsgSize; streams read in bulk.
READ_SIZE = 256 * 1024


def receive(job: Mapping[str, Any], ready: WaitForGo) -> Mapping[str, Any]:
    deadline = time.monotonic() + float(job["deadline_s"])
    if job["transport"] == "dgram":
        return _receive_datagrams(job, ready, deadline)
    return _receive_streams(job, ready, deadline)


def _receive_datagrams(
    job: Mapping[str, Any], ready: WaitForGo, deadline: float
) -> Mapping[str, Any]:
    expected = int(job["expect_messages"])
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(job["address"]))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)  # as the daemon does
    buffer = bytearray(READ_SIZE)
    recv_into = sock.recv_into
    ready({"address": job["address"]})
    sock.settimeout(time_left(deadline))
    received = 0
    with sock:
        while received < expected:
            recv_into(buffer)
            received += 1
    return {"last_receive": time.monotonic(), "messages": received}


def _receive_streams(
    job: Mapping[str, Any], ready: WaitForGo, deadline: float
) -> Mapping[str, Any]:
    expected = int(job["expect_bytes"])
    listener = _listen(job)
    selector = selectors.DefaultSelector()
    listener.setblocking(False)
    selector.register(listener, selectors.EVENT_READ)
    buffer = bytearray(READ_SIZE)
    received = 0
    # The generators need the TCP port before they connect: it travels in the ready line.
    ready(
        {"address": job["address"] if job["transport"] == "stream" else listener.getsockname()[1]}
    )
    with listener:
        while received < expected:
            for key, _ in selector.select(time_left(deadline)):
                sock: socket.socket = key.fileobj  # type: ignore[assignment]
                if sock is listener:
                    connection, _ = listener.accept()
                    connection.setblocking(False)
                    selector.register(connection, selectors.EVENT_READ)
                    continue
                count = sock.recv_into(buffer)
                if count == 0:
                    selector.unregister(sock)
                    sock.close()
                received += count
    return {"last_receive": time.monotonic(), "bytes": received}


def _listen(job: Mapping[str, Any]) -> socket.socket:
    if job["transport"] == "stream":
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(job["address"]))
    else:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind(("127.0.0.1", int(job["address"])))
    listener.listen(1024)
    return listener


if __name__ == "__main__":
    sys.exit(child_main(receive))
