"""Datagrams charged to their sender's uid's share of the pool (issue 33, point 1).

Where the sender's uid is read (always on the compiled ``recvmmsg`` reads, the loop's and
the drain thread's, their runs of one uid cut in C; on the pure path only with a datagram
quota, the loop's ``recvmsg``), each datagram goes to the intake with its uid's key, the
key a stream connection of that uid has (``peers.uid_client``): consecutive datagrams of
one uid as one burst, the bursts in the order read. Real sockets, two real uids (a forked
sender drops to ``nobody`` after connecting: the kernel names the sender at each send);
then, on the real intake, a datagram flooder at its share meets ``no_memory`` while
another uid's datagrams are all accepted, and the flooder's stream messages share its one
share.
"""

from __future__ import annotations

import asyncio
import os
import pwd
import socket

import pytest
import uvloop

from helpers import DatagramIntake as Recording
from hotpaths import datagram_fixture
from pydory.config.model import ClientRate
from pydory.daemon.books import counters as counter_names
from pydory.daemon.books.events import DiscardReason, Transport
from pydory.daemon.books.pool import message_cost
from pydory.daemon.inputs.datagram import (
    DATAGRAM_CLIENT,
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


def two_senders_interleaved(path: str, quota: ClientRate) -> list[tuple[list[bytes], object]]:
    """Our uid and ``nobody`` send, interleaved, to a datagram input on ``path`` (with
    ``quota``), a datagram too large among them: the bursts the intake got, runs of one
    client merged (the drain thread may have read the first six in more than one burst:
    runs of one uid may be split at a burst's end, never merged across uids nor
    reordered)."""
    nobody = pwd.getpwnam("nobody").pw_uid
    intake = Recording()

    async def scenario() -> None:
        datagram_input = DatagramInput(path, None, 100, False, intake, quota)
        datagram_input.start(asyncio.get_running_loop())
        pid, to_child, from_child = other_sender(path, nobody)
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as mine:
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
                mine.send(b"x" * 101)  # too large: after the ones before it
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


@pytest.mark.skipif(os.geteuid() != 0, reason="a second uid needs root")
def test_datagrams_go_to_their_senders_uid_share_in_runs_in_the_order_read(
    datagram_implementation: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """With a datagram quota, on every reader: each sender's uid, in runs, in order."""
    path = os.path.join(str(tmp_path_factory.mktemp("s")), "s")
    assert two_senders_interleaved(path, GENEROUS) == uid_runs()


@pytest.mark.skipif(os.geteuid() != 0, reason="a second uid needs root")
def test_without_a_quota_the_compiled_reads_name_each_sender_the_pure_one_does_not(
    datagram_implementation: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """No quota: the compiled reads (the loop's recvmmsg, the drain thread) still charge
    each datagram to its sender's uid, in runs cut in C; the pure reference reads no
    credentials (its cost: docs/operations.md) and charges the senders as one client."""
    path = os.path.join(str(tmp_path_factory.mktemp("s")), "s")
    runs = two_senders_interleaved(path, NO_CLIENT_RATE)
    if datagram_implementation == "pure":
        assert runs == [
            ([b"a0", b"a1", b"b0", b"b1", b"b2", b"a2", b"b3"], DATAGRAM_CLIENT),
            ([b"x" * 64], "too large"),
            ([b"a3"], DATAGRAM_CLIENT),
        ]
    else:
        assert runs == uid_runs()


@pytest.mark.parametrize("max_size", [100, LARGE_DATAGRAM_BYTES])
def test_without_a_quota_one_sender_is_its_uid_on_the_compiled_reads(
    datagram_implementation: str, tmp_path_factory: pytest.TempPathFactory, max_size: int
) -> None:
    """No quota, one sender: its uid's share on the compiled recvmmsg reads; the senders
    as one client (DATAGRAM_CLIENT) on the pure path and from LARGE_DATAGRAM_BYTES on
    (read one at a time, no credentials)."""
    path = os.path.join(str(tmp_path_factory.mktemp("s")), "s")

    async def scenario() -> Recording:
        intake = Recording()
        datagram_input = DatagramInput(path, None, max_size, True, intake)
        datagram_input.start(asyncio.get_running_loop())
        named = datagram_input.names_senders
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as mine:
                mine.connect(path)
                for n in range(5):
                    mine.send(b"m%d" % n)
                await intake.until(5)
        finally:
            datagram_input.close()
        assert named == (datagram_implementation != "pure" and max_size < LARGE_DATAGRAM_BYTES)
        return intake

    intake = uvloop.run(scenario())
    named = datagram_implementation != "pure" and max_size < LARGE_DATAGRAM_BYTES
    expected = uid_client(os.geteuid()) if named else DATAGRAM_CLIENT
    assert {client for _, client in intake.bursts} == {expected}
    assert [d for burst, _ in intake.bursts for d in burst] == [b"m%d" % n for n in range(5)]


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
