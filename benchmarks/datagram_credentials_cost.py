"""What reading each datagram's sender's credentials costs the datagram read (issue 33,
point 1: naming every datagram sender as a client of the pool's shares without a datagram
quota), in instructions per datagram, not time: the machine is shared.

Not a test. One process sends bursts of 256 100-byte messages on a UNIX datagram
socketpair and reads each burst with VARIANT; INTAKE is ``null`` (the read path alone) or
``real`` (tests/test_client_charges.py's intake, every message accepted and delivered).
Run it under callgrind with two round counts; the difference over 40 x 256 datagrams is
the cost per datagram (start-up cancels)::

    for v in send pure pure_creds compiled compiled_creds drain drain_creds \
             large large_pure large_creds large_named; do
      for r in 10 50; do
        valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.$v.$r \
          .venv/bin/python benchmarks/datagram_credentials_cost.py $v null $r
        grep ^summary: /tmp/cg.$v.$r
      done
    done

VARIANT: ``send`` (the sends only), ``pure`` (recv_into, the senders one client: the
pure path before it named them), ``pure_creds`` (the daemon's pure read now:
recvmsg_into with SCM_CREDENTIALS, runs of one uid cut as it reads), ``compiled``
(recvmmsg on the loop, no credentials: the senders one client, as before issue 33's
datagram shares), ``compiled_creds`` (the same with SO_PASSCRED, each datagram's
credentials read and the runs of one uid cut in C: the daemon's loop reader now),
``drain`` (the C drain thread, no credentials), ``drain_creds`` (the thread reading
credentials, the runs cut in C at ``take``: the daemon's default now); at a
``maxDatagramMsgSize`` of 256 KiB, read one datagram at a time, each size peeked:
``large`` (the compiled reader's ``read``, in C, no credentials), ``large_pure`` (the
pure path's read there, no credentials) and ``large_creds`` (the read a datagram quota
makes there, on both paths, with a quota no sender reaches: the peek's ``recvmsg_into``
takes the credentials; what naming the senders there in Python would cost), and
``large_named`` (the compiled reader's ``read_runs`` there: each sender named by its
peek, in C, the runs cut in C: the daemon's compiled read at that size now).
"""

from __future__ import annotations

import select
import socket
import sys
import time

sys.path.insert(0, "tests")

from pydory import hotpath
from pydory.daemon.inputs import datagram as dg
from pydory.wire import encode_any_partition

K = 256
variant, intake_kind, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])


class Null:
    def datagrams(self, burst, client=None):
        pass

    def datagram_too_large(self, size, prefix):
        pass

    def over_quota(self, burst):
        pass


if intake_kind == "real":
    import test_client_charges as tcc

    d = tcc.daemon()
    intake = d.intake

    def settle():
        tcc.deliver_all(d)
else:
    intake = Null()

    def settle():
        pass


message = encode_any_partition("known", b"v" * 100)
creds = "creds" in variant or variant == "large_named"


def pair():
    receiver, sender = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    sender.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 << 20)
    receiver.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    receiver.setblocking(False)
    receiver.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, creds)
    return receiver, sender


receiver, sender = pair()
fd = receiver.fileno()
inp = dg.DatagramInput.__new__(dg.DatagramInput)
# The fields _read and _hand_on use.
inp._intake = intake
inp.datagrams_read = 0
inp._times_drained = 0
inp._drain = None
inp._sock = None
large = variant.startswith("large")
max_size = dg.LARGE_DATAGRAM_BYTES if large else 1000
if variant.startswith(("pure", "large_")):
    dg.DatagramReader = None  # the daemon's reads in Python
inp._set_max(max_size)
inp.quota = None
inp._clock = time.monotonic
nobody_reaches = dg.DatagramQuota(dg.ClientRate(msgs_per_sec=10**9, window_ms=1000))
reader = None
if variant.startswith("compiled") or variant in ("large", "large_named"):
    assert hotpath.DatagramReader is not None
    reader = hotpath.DatagramReader(fd, max_size, creds)


def pure_unnamed(sock: socket.socket, limit: int) -> None:
    """The pure path's read before it named the senders: recv_into, one client."""
    recv_into = sock.recv_into
    buffer, view, max_size = inp._buffer, inp._view, inp._max
    capacity = len(buffer)
    burst: list[bytes] = []
    keep = burst.append
    read = 0
    while read < limit:
        try:
            size = recv_into(buffer, capacity, socket.MSG_TRUNC)
        except BlockingIOError:
            break
        read += 1
        if size <= max_size:
            keep(bytes(view[:size]))
    if burst:
        intake.datagrams(burst, dg.DATAGRAM_CLIENT)


drain = None
if variant.startswith("drain"):
    drain = hotpath.DatagramDrain(fd, 1000, 512, creds)
    drain.start()

for _ in range(rounds):
    if variant == "send":
        receiver.close()
        sender.close()
        receiver, sender = pair()
    for _ in range(K):
        sender.send(message)
    if variant == "send":
        continue
    if variant == "pure":
        pure_unnamed(receiver, K + 1)
    elif variant in ("compiled", "large"):  # as the loop read before: the senders unnamed
        items, oversized, _ = reader.read(K + 1)
        inp._hand_on(items, oversized, None)
    elif variant in ("compiled_creds", "large_named"):  # the loop's read now
        items, oversized, _, runs = reader.read_runs(K + 1)
        inp._hand_on(items, oversized, runs)
    elif variant in ("pure_creds", "large_pure"):  # the daemon's pure read now
        inp._read(receiver, K + 1)
    elif variant == "large_creds":
        inp._read_metered(receiver, K + 1, nobody_reaches)
    else:
        got = 0
        while got < K:
            select.select([drain.wake_fd], [], [])
            items, oversized, _, runs = drain.take()
            got += len(items)
            if items:
                inp._hand_on_drained(items, oversized, runs)
    settle()
if drain is not None:
    drain.stop()
if intake_kind == "real" and variant != "send":
    assert d.books.per_topic()["known"].delivered == rounds * K, d.books.per_topic()["known"]
