"""Datagrams charged to their sender's uid's share of the pool (issue 33, point 1).

On every reader (the pure reference's ``recvmsg_into``, the compiled loop's ``recvmmsg``
and the drain thread's, and from ``LARGE_DATAGRAM_BYTES`` on the one-at-a-time reads of
both paths), with or without a datagram quota, each datagram goes to the intake with its
sender's uid's key, the key a stream connection of that uid has (``peers.uid_client``):
consecutive datagrams of one uid as one burst, the bursts in the order read. Real sockets,
two real uids (a forked sender drops to another uid after connecting: the kernel names the
sender at each send); then, through each reader into the real intake, a datagram flooder
uid at its share meets ``no_memory`` while another uid's datagrams are all accepted; and,
on the intake, the flooder's stream messages share its one share.
"""

from __future__ import annotations

import asyncio
import os
import pwd
import socket
from collections.abc import Sequence

import pytest
import uvloop

from helpers import DatagramIntake as Recording
from hotpaths import datagram_fixture
from pydory.config.model import ClientRate
from pydory.daemon.books import counters as counter_names
from pydory.daemon.books.events import DiscardReason, Transport
from pydory.daemon.books.pool import message_cost
from pydory.daemon.inputs.datagram import (
    LARGE_DATAGRAM_BYTES,
    NO_CLIENT_RATE,
    DatagramInput,
    sender_client,
)
from pydory.daemon.inputs.peers import uid_client
from pydory.wire import encode_any_partition
from test_client_charges import BUDGET, daemon, deliver_all

datagram_implementation = datagram_fixture()

#: Far above what the test sends: every datagram within its sender's quota.
GENEROUS = ClientRate(msgs_per_sec=1_000_000, window_ms=1000)


def other_sender(path: str, uid: int) -> tuple[int, int, int]:
    """A forked sender connected to ``path`` as root, then running as ``uid``: sends one
    datagram per line it reads from its pipe, and answers each line once sent. Returns
    (its pid, the pipe to it, the pipe from it)."""
    from_parent, to_child = os.pipe()
    from_child, to_parent = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            os.close(to_child)
            os.close(from_child)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            sock.connect(path)
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            with os.fdopen(from_parent, "rb") as lines:
                for line in lines:
                    sock.send(line.rstrip(b"\n"))
                    os.write(to_parent, b".")
            code = 0
        finally:
            os._exit(code)
    os.close(from_parent)
    os.close(to_parent)
    return pid, to_child, from_child


def two_senders_interleaved(
    path: str, quota: ClientRate, max_size: int = 100
) -> list[tuple[list[bytes], object]]:
    """Our uid and ``nobody`` send, interleaved, to a datagram input on ``path`` (with
    ``quota``, at ``max_size``), a datagram too large among them: the bursts the intake
    got, runs of one client merged (the drain thread may have read the first six in more
    than one burst: runs of one uid may be split at a burst's end, never merged across
    uids nor reordered)."""
    nobody = pwd.getpwnam("nobody").pw_uid
    intake = Recording()

    async def scenario() -> None:
        datagram_input = DatagramInput(path, None, max_size, True, intake, quota)
        datagram_input.start(asyncio.get_running_loop())
        pid, to_child, from_child = other_sender(path, nobody)
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as mine:
                # Room for a datagram too large for LARGE_DATAGRAM_BYTES (wmem_max doubled).
                mine.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
                mine.connect(path)

                def theirs(*datagrams: bytes) -> None:
                    for data in datagrams:  # one at a time: answered once sent
                        os.write(to_child, data + b"\n")
                        assert os.read(from_child, 1) == b"."

                # Sent before the loop reads any (its queue holds 10): runs of one uid.
                mine.send(b"a0")
                mine.send(b"a1")
                theirs(b"b0", b"b1", b"b2")
                mine.send(b"a2")
                await intake.until(6)
                theirs(b"b3")
                await intake.until(7)
                mine.send(b"x" * (max_size + 1))  # too large: after the ones before it
                mine.send(b"a3")
                await intake.until(9)
        finally:
            os.close(to_child)
            os.close(from_child)
            assert os.waitpid(pid, 0)[1] == 0
            datagram_input.close()

    uvloop.run(scenario())
    runs: list[tuple[list[bytes], object]] = []
    for burst, client in intake.bursts:
        if runs and runs[-1][1] == client:
            runs[-1][0].extend(burst)
        else:
            runs.append((list(burst), client))
    return runs


def uid_runs() -> list[tuple[list[bytes], object]]:
    """:func:`two_senders_interleaved`'s runs, each charged to its sender's uid."""
    ours, nobody = os.geteuid(), pwd.getpwnam("nobody").pw_uid
    return [
        ([b"a0", b"a1"], uid_client(ours)),
        ([b"b0", b"b1", b"b2"], uid_client(nobody)),
        ([b"a2"], uid_client(ours)),
        ([b"b3"], uid_client(nobody)),
        ([b"x" * 64], "too large"),
        ([b"a3"], uid_client(ours)),
    ]


#: The read paths: recvmmsg (compiled) or one recvmsg_into per datagram (pure) below
#: LARGE_DATAGRAM_BYTES; from it on, one at a time, each datagram's size peeked first.
MAX_SIZES = [100, LARGE_DATAGRAM_BYTES]


@pytest.mark.skipif(os.geteuid() != 0, reason="a second uid needs root")
@pytest.mark.parametrize("max_size", MAX_SIZES)
def test_datagrams_go_to_their_senders_uid_share_in_runs_in_the_order_read(
    datagram_implementation: str, tmp_path_factory: pytest.TempPathFactory, max_size: int
) -> None:
    """With a datagram quota, on every reader: each sender's uid, in runs, in order."""
    path = os.path.join(str(tmp_path_factory.mktemp("s")), "s")
    assert two_senders_interleaved(path, GENEROUS, max_size) == uid_runs()


@pytest.mark.skipif(os.geteuid() != 0, reason="a second uid needs root")
@pytest.mark.parametrize("max_size", MAX_SIZES)
def test_without_a_quota_every_reader_names_each_sender_in_runs_in_the_order_read(
    datagram_implementation: str, tmp_path_factory: pytest.TempPathFactory, max_size: int
) -> None:
    """No quota: every reader still charges each datagram to its sender's uid, in runs
    of one uid in the order sent: the compiled reads (runs cut in C) and the pure
    reference (recvmsg_into, runs cut as it reads); from LARGE_DATAGRAM_BYTES on, read
    one at a time, each sender named by the peek that takes its datagram's size."""
    path = os.path.join(str(tmp_path_factory.mktemp("s")), "s")
    assert two_senders_interleaved(path, NO_CLIENT_RATE, max_size) == uid_runs()


@pytest.mark.parametrize("max_size", MAX_SIZES)
def test_without_a_quota_one_sender_is_its_uid_on_every_reader(
    datagram_implementation: str, tmp_path_factory: pytest.TempPathFactory, max_size: int
) -> None:
    """No quota, one sender: its uid's share on every reader and every read path, never
    the unnamed senders' (DATAGRAM_CLIENT). Its datagrams in order."""
    path = os.path.join(str(tmp_path_factory.mktemp("s")), "s")

    async def scenario() -> Recording:
        intake = Recording()
        datagram_input = DatagramInput(path, None, max_size, True, intake)
        datagram_input.start(asyncio.get_running_loop())
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as mine:
                mine.connect(path)
                for n in range(5):
                    mine.send(b"m%d" % n)
                await intake.until(5)
        finally:
            datagram_input.close()
        return intake

    intake = uvloop.run(scenario())
    assert {client for _, client in intake.bursts} == {uid_client(os.geteuid())}
    assert [d for burst, _ in intake.bursts for d in burst] == [b"m%d" % n for n in range(5)]


def send_as(path: str, uid: int, data: bytes, count: int) -> int:
    """A forked sender connected to ``path`` as root, then running as ``uid``: sends
    ``data`` ``count`` times (blocking while the socket's queue is full) and exits. Returns
    its pid."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            sock.connect(path)
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            for _ in range(count):
                sock.send(data)
            code = 0
        finally:
            os._exit(code)
    return pid


class CountedIntake(Recording):
    """The real intake, behind a recording one that counts what it is handed (to wait
    for) and keeps the client of each burst."""

    def __init__(self, real: object) -> None:
        super().__init__(keep_bytes=False)
        self.real = real
        self.clients: set[object] = set()

    def datagrams(self, burst: Sequence[bytes], client: object = None) -> None:
        self.real.datagrams(burst, client)  # type: ignore[attr-defined]
        self.clients.add(client)
        super().datagrams(burst, client)


#: Two uids other than ours (root) and the kernel's overflow uid (65534).
FLOODER_UID, OTHER_UID = 4201, 4202
#: The flooder's datagrams: more than the whole pool, waiting for a topic's creation.
FLOOD = BUDGET // 1000
OTHER_DATAGRAMS = 512


@pytest.mark.skipif(os.geteuid() != 0, reason="a second uid needs root")
def test_a_datagram_flooder_uid_at_its_share_costs_another_uids_datagrams_nothing_on_every_reader(
    datagram_implementation: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """No quota, on every reader into the real intake: two uids send at once; the
    flooder's datagrams wait (a topic creation never answered) until its share is full,
    then meet ``no_memory``; every one of the other uid's datagrams is accepted and
    delivered. (On the pure reader before it named senders, both were one client and
    the other uid's datagrams met ``no_memory`` too.)"""
    path = os.path.join(str(tmp_path_factory.mktemp("s")), "s")
    d = daemon()
    intake = CountedIntake(d.intake)
    held = encode_any_partition("being-created", b"h" * 1000)
    good = encode_any_partition("known", b"good")

    async def scenario() -> None:
        datagram_input = DatagramInput(path, None, 2048, False, intake)
        datagram_input.start(asyncio.get_running_loop())
        pids = []
        try:
            pids.append(send_as(path, FLOODER_UID, held, FLOOD))
            pids.append(send_as(path, OTHER_UID, good, OTHER_DATAGRAMS))
            await intake.until(FLOOD + OTHER_DATAGRAMS)
        finally:
            datagram_input.close()  # first: a sender still blocked then gets an error
            assert [os.waitpid(pid, 0)[1] for pid in pids] == [0] * len(pids)

    uvloop.run(scenario())
    topics = d.books.per_topic()
    refused = topics["being-created"].discarded_by_reason.get(DiscardReason.NO_MEMORY, 0)
    assert 0 < refused < FLOOD
    assert d.books.lifetime_discards_by_reason()[DiscardReason.NO_MEMORY] == refused
    # Refused for its share, never for a full pool.
    assert d.books.counters.get(counter_names.NO_MEMORY_CLIENT_SHARE) == refused
    assert not d.pool.is_depleted
    assert topics["known"].accepted == OTHER_DATAGRAMS
    assert DiscardReason.NO_MEMORY not in topics["known"].discarded_by_reason
    deliver_all(d)
    assert d.books.per_topic()["known"].delivered == OTHER_DATAGRAMS
    assert d.pool.shares.held(uid_client(OTHER_UID)) == 0
    assert intake.clients == {uid_client(FLOODER_UID), uid_client(OTHER_UID)}


def test_a_datagram_flooder_at_its_share_costs_another_uids_datagrams_nothing() -> None:
    """On the real intake, with the keys the datagram input hands on: the flooder uid's
    datagrams wait (a topic creation never answered) until its share is full, then meet
    ``no_memory``, its stream messages too (one share on every transport); another uid's
    datagrams are all accepted meanwhile."""
    d = daemon()
    flooder, other = sender_client(65534), sender_client(1000)
    assert flooder == uid_client(65534)  # the key its stream connections have
    held = encode_any_partition("being-created", b"h" * 1000)
    for _ in range(BUDGET // 1000 // 64):
        d.intake.datagrams([held] * 64, flooder)
    shares = d.pool.shares
    assert BUDGET // 2 <= shares.held(flooder) < BUDGET // 2 + message_cost("x", 1000) * 64
    refused = d.books.lifetime_discards_by_reason()[DiscardReason.NO_MEMORY]
    assert refused > 0
    assert d.books.counters.get(counter_names.NO_MEMORY_CLIENT_SHARE) == refused
    assert not d.pool.is_depleted
    # Its stream messages: the same share, full.
    d.intake.frames([held] * 8, Transport.UNIX_STREAM, uid_client(65534))
    assert d.books.lifetime_discards_by_reason()[DiscardReason.NO_MEMORY] == refused + 8
    # Another uid's datagrams: every one accepted and delivered.
    good = [encode_any_partition("known", b"g%05d" % i) for i in range(512)]
    for _ in range(20):
        d.intake.datagrams(good, other)
        assert shares.held(other) > 0
        deliver_all(d)
        assert shares.held(other) == 0
    assert d.books.per_topic()["known"].delivered == 20 * 512
    assert d.books.lifetime_discards_by_reason()[DiscardReason.NO_MEMORY] == refused + 8
