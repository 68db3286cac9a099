"""The spool end to end: a daemon SIGKILLed with messages it accepted loses none of them.

The daemon runs as its own process (``pydory serve``), so that it can be killed the way
the OOM killer or a careless deploy kills it; Kafka is Apache Kafka (``kafka_broker``).

**The kill loop** (:func:`run_kill_loop`) keeps three clients sending (UNIX datagram, UNIX
stream, TCP; raw sockets, so the test knows exactly which bytes the kernel took) while
the daemon is SIGKILLed at random moments (seeded, the seed printed; some of them during
start-up, before it answers: in its metadata fetch, its replay, or as its inputs open)
and restarted with the same config (spool on, ``fsync none``: a process crash keeps the
page cache; the discard log on, in one file across runs). Each client sends up to 15,000
messages a second: the load the daemon keeps up with on a loaded 2-core machine (flooded
from its first instant, it opened its TCP input 10 s after the others, and its status
page not within a minute).
Each message ``n`` of a transport has a unique value
(``b"dgram-%09d" % n``) *and* a unique timestamp (``t0 + n``): a ``DUP`` line of the
discard log names a message by topic and timestamp only (Dory's format).

What each client did is kept as *streaks*: runs of consecutive messages the kernel took
on one connection (streams), or between two failed sends (datagrams), each with the
daemon run it went to. A send that fails (the daemon is down: ECONNREFUSED, ENOENT,
EPIPE...) burns its numbers: those messages were never sent, and a stream write cut
part-way leaves at most one message half-written, which the daemon can never have
read whole.

The daemon cannot tell the test what it had read when it died, and Dory's protocol has
no acknowledgements, so the oracle takes "accepted" from three sources the daemon cannot
fake:

1. **The write-ahead itself.** Right after each SIGKILL, before the restart, the test
   decodes the spool's segment files (read-only: no lock, no recovery) and notes every
   message in them: the dead daemon had accepted those and not settled them.
2. **What the daemon said it had read.** Just before a kill the test reads
   ``received`` from ``/books/json``: the daemon counts a burst there in the same loop
   callback that writes it ahead, before the page can show it, and a stale page only
   shows less. A client's messages reach the daemon in order, so the first ``R``
   messages of that run on that transport were read, written ahead, and must all come
   out.
3. **Quiesced kills.** For some kills (about a third, seeded) the clients pause first
   and the test waits until ``received`` equals what they sent in that run: then every
   message of the run was accepted, and not one may be missing.

After the last restart drains and stops cleanly (SIGTERM, exit 0, spool empty), the
topics are read back and checked message by message:

(a) every message found in a post-kill spool is in Kafka or named by a ``DISC`` line;
(b) every value in Kafka was sent (the kernel took it whole): no phantom;
(c) a message stored ``c`` times in Kafka has at least ``c - 1`` ``DUP`` lines;
(d) the messages sent but neither in Kafka nor in a ``DISC`` line (*unknowable losses*:
    bytes that sat in a kernel socket buffer, or in the one read the daemon had not yet
    written ahead, when it died) are, per streak: a tail (nothing after them came out);
    none of the first ``R`` the daemon said it had read (so zero for quiesced kills);
    and no more than that transport's buffers hold: datagrams
    ``net.unix.max_dgram_qlen + 1`` queued, plus one read burst (``DATAGRAM_BURST``), plus,
    when a drain thread reads the socket (``/books/json``'s ``datagram_input`` says which
    reader ran), its ring (``datagram_input.ring``: the C's ``DRAIN_BURSTS`` bursts of
    ``DRAIN_BURST_DATAGRAMS``, read from the kernel and never received, so never said to
    be read: the first-``R`` part holds for them as for the kernel's queue);
    UNIX stream the client's ``SO_SNDBUF`` (the kernel charges queued bytes to the
    sender) plus one read (uvloop's 256000-byte buffer) plus a message, plus, when a drain
    thread reads the connections (``/books/json``'s ``stream_input``), what it may hold of
    one connection (``stream_input.connection_held_bytes``: the C's
    ``SDRAIN_CONNECTION_BYTES``); TCP the same
    plus the receiver's largest window (``net.ipv4.tcp_rmem``, which makes that bound
    loose: the first-``R`` rule is the sharp one).

Without the spool the same loop fails rule (d)'s first-``R`` part at once: what a daemon
has read sits in librdkafka's batches (100 ms linger here, 2 s there) when it dies
(``test_kill_loop_catches_losses_without_the_spool`` keeps the oracle honest).
"""

from __future__ import annotations

import binascii
import errno
import importlib
import json
import os
import random
import re
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from daemon_process import DaemonProcess
from pydory import wire
from pydory.client import UnixStreamSender
from pydory.daemon.inputs.datagram import DATAGRAM_BURST
from pydory.daemon.inputs.datagram_drain import DRAIN_BURST_DATAGRAMS
from pydory.daemon.spool.records import HEADER_BYTES, decode_records
from pydory.daemon.spool.segments import Spool
from pydory.wire import encode_any_partition
from pydory_tools.testing.daemon_config import DaemonConfig
from pydory_tools.testing.kafka_broker import KafkaCluster
from pydory_tools.testing.kafka_util import consume_all

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

#: uvloop reads a stream connection into a buffer of this size (UV_STREAM_RECV_BUF_SIZE).
STREAM_READ_BYTES = 256_000
_SEND_FLAGS = getattr(socket, "MSG_NOSIGNAL", 0)
#: A client whose send failed (the daemon is down) tries again this much later.
RETRY_S = 0.02


# --- the daemon as a process ------------------------------------------------------------------


@pytest.fixture
def daemon_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # UNIX socket paths are limited to ~108 bytes: keep the directory short.
    return tmp_path_factory.mktemp("sp", numbered=True)


def wait_for(condition: Callable[[], Any], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def topic_books(books: dict[str, Any], topic: str) -> dict[str, Any]:
    return next((t for t in books["topics"] if t["topic"] == topic), {})


# --- what the daemon leaves on disk ---------------------------------------------------------


def spool_messages(spool_dir: Path) -> list[wire.Message]:
    """The client messages a spool directory holds, read without touching it (no lock,
    no recovery: a torn tail is just where decoding stops), decoded."""
    messages = []
    for path in sorted(spool_dir.glob("segment-*.spool")):
        data = path.read_bytes()
        records, _, _ = decode_records(data[HEADER_BYTES:])
        messages += [wire.decode(r.value) for r in records if r.is_payload]
    return messages


_DISCARD_LINE = re.compile(
    r"now: \d+ ts: (-?\d+) event: (\w+) info: (\S+) topic: \d+\[([^\]]*)\] "
    r"key: \d+\[[^\]]*\] msg: \d+\[([^\]]*)\]"
)


@dataclass(frozen=True)
class DiscardLine:
    event: str  # DISC | DUP
    info: str
    topic: str
    timestamp_ms: int
    msg: bytes  # the value (a prefix of it), empty for DUP


def discard_lines(discard_log: Path) -> Iterator[DiscardLine]:
    """Every line of the discard log and its rotated files."""
    for path in sorted(discard_log.parent.glob(discard_log.name + "*")):
        for line in path.read_text().splitlines():
            match = _DISCARD_LINE.fullmatch(line)
            assert match is not None, f"unparsable discard log line: {line!r}"
            ts, event, info, topic, msg = match.groups()
            yield DiscardLine(event, info, topic, int(ts), binascii.a2b_base64(msg))


def duplicate_lines(discard_log: Path, topic: str) -> int:
    """``DUP`` lines of ``topic`` in the discard log and its rotated files."""
    return sum(1 for e in discard_lines(discard_log) if e.event == "DUP" and e.topic == topic)


def daemon_log_problems(log_path: Path) -> list[str]:
    """Lines of the daemon's log that say something went wrong inside it."""
    return [
        line
        for line in log_path.read_text(errors="replace").splitlines()
        if "Traceback" in line or " CRITICAL " in line
    ]


# --- numbered messages and the clients that send them -----------------------------------------


@dataclass(frozen=True)
class Numbering:
    """Message ``n`` of one transport: value ``label-%09d``, timestamp ``t0 + n``."""

    label: str
    topic: str
    t0: int

    def value(self, n: int) -> bytes:
        return b"%s-%09d" % (self.label.encode(), n)

    def number(self, value: bytes) -> int | None:
        label, _, digits = value.partition(b"-")
        if label != self.label.encode() or len(digits) != 9 or not digits.isdigit():
            return None
        return int(digits)

    def encoder(self) -> tuple[Callable[[int], bytes], int]:
        """A fast ``n -> Dory message`` (every message has the same length) and that length."""
        marker = 0x0102030405060708
        sample = encode_any_partition(self.topic, self.value(0), b"", marker)
        at = sample.index(struct.pack(">q", marker))
        head, middle = sample[:at], sample[at + 8 : len(sample) - len(self.value(0))]
        pack, t0, value = struct.Struct(">q").pack, self.t0, self.value

        def encode(n: int) -> bytes:
            return head + pack(t0 + n) + middle + value(n)

        assert encode(7) == encode_any_partition(self.topic, value(7), b"", t0 + 7)
        return encode, len(sample)


@dataclass
class Streak:
    """Messages ``start`` to ``end - 1`` were taken by the kernel, in order, on one
    connection (streams) or between two failed sends (datagrams), for daemon run
    ``epoch``. ``sndbuf``: the largest SO_SNDBUF its socket had."""

    epoch: int
    start: int
    end: int
    sndbuf: int = 0


class Client(threading.Thread):
    """Sends numbered messages as fast as the daemon takes them, through failures."""

    def __init__(
        self,
        transport: str,
        numbering: Numbering,
        config: DaemonConfig,
        epoch: Callable[[], int],
        rate: float,
        batch: int = 256,
    ) -> None:
        """``rate``: messages per second at most (the daemon must keep up, or its start-up
        under a flood takes longer than the test's budget)."""
        super().__init__(name=f"client-{transport}", daemon=True)
        self.transport = transport
        self.numbering = numbering
        self._config = config
        self._epoch = epoch
        self._batch = batch
        self._batch_s = batch / rate
        self._due = 0.0  # when the next batch may go (monotonic)
        self._encode, self.message_bytes = numbering.encoder()
        self.next = 0  # the next message number
        self.streaks: list[Streak] = []
        self.unsent = 0  # refused by the kernel: never sent
        self.cut = 0  # half-written when a stream write failed: never sent whole
        self._stop_requested = threading.Event()
        self._pause_requested = threading.Event()
        self._paused = threading.Event()
        self.error: BaseException | None = None

    # -- control, from the test's thread ---------------------------------------------------

    def pause(self) -> None:
        self._pause_requested.set()
        if not self._paused.wait(60):
            raise AssertionError(f"{self.name} did not pause")

    def resume(self) -> None:
        self._paused.clear()
        self._pause_requested.clear()

    def finish(self) -> None:
        self._stop_requested.set()
        self._pause_requested.clear()
        self.join(60)
        assert not self.is_alive(), f"{self.name} did not stop"
        if self.error is not None:
            raise self.error

    def sent(self) -> int:
        return sum(s.end - s.start for s in self.streaks)

    def sent_in(self, epoch: int) -> int:
        return sum(s.end - s.start for s in self.streaks if s.epoch == epoch)

    # -- the sending thread ------------------------------------------------------------------

    def run(self) -> None:
        try:
            send = self._datagrams if self.transport == "unix_dgram" else self._stream
            send()
        except BaseException as error:  # noqa: BLE001 -- re-raised in the test's thread
            self.error = error

    def _hold(self) -> bool:
        """Wait for the next batch's turn, and pause here while asked to; False once
        asked to stop."""
        now = time.monotonic()
        if self._due > now:
            time.sleep(self._due - now)
        self._due = max(self._due, now - 0.05) + self._batch_s  # no catching up after a stall
        while self._pause_requested.is_set() and not self._stop_requested.is_set():
            self._paused.set()
            time.sleep(0.005)
        return not self._stop_requested.is_set()

    def _datagrams(self) -> None:
        # Connected: a send blocks in the kernel until the daemon's queue has room (an
        # unconnected socket with a timeout would poll "writable" and spin instead).
        encode, path = self._encode, self._config.datagram_path
        sock: socket.socket | None = None
        streak: Streak | None = None
        try:
            while self._hold():
                for _ in range(self._batch):
                    n, epoch = self.next, self._epoch()
                    self.next += 1
                    try:
                        if sock is None:
                            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                            sock.settimeout(5)  # not a deadline: a blocked send is counted unsent
                            sock.connect(path)
                        sock.send(encode(n))
                    except OSError:
                        self.unsent += 1
                        if sock is not None:
                            sock.close()
                        sock, streak = None, None
                        time.sleep(RETRY_S)
                        break
                    if streak is None or streak.epoch != epoch:
                        sndbuf = sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
                        streak = Streak(epoch, n, n + 1, sndbuf)
                        self.streaks.append(streak)
                    else:
                        streak.end = n + 1
        finally:
            if sock is not None:
                sock.close()

    def _connect(self) -> socket.socket:
        if self.transport == "tcp":
            sock = socket.create_connection(("127.0.0.1", self._config.tcp_port or 0), timeout=60)
        else:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.settimeout(5)  # not a deadline: a blocked send is counted unsent
                sock.connect(self._config.stream_path)
            except BaseException:
                sock.close()
                raise
        return sock

    def _stream(self) -> None:
        encode, size = self._encode, self.message_bytes
        sock: socket.socket | None = None
        streak: Streak | None = None
        try:
            while self._hold():
                first, count = self.next, self._batch
                self.next += count
                if sock is None:
                    epoch = self._epoch()
                    try:
                        sock = self._connect()
                    except OSError:
                        self.unsent += count
                        time.sleep(RETRY_S)
                        continue
                    streak = Streak(epoch, first, first)
                    self.streaks.append(streak)
                assert streak is not None
                data = memoryview(b"".join([encode(n) for n in range(first, first + count)]))
                streak.sndbuf = max(
                    streak.sndbuf, sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
                )
                written = 0
                try:
                    while written < len(data):
                        written += sock.send(data[written:], _SEND_FLAGS)
                except OSError:
                    whole = written // size
                    streak.end = first + whole
                    self.cut += 1 if written % size else 0
                    self.unsent += count - whole - (1 if written % size else 0)
                    sock.close()
                    sock, streak = None, None
                    time.sleep(RETRY_S)
                    continue
                streak.end = first + count
        finally:
            if sock is not None:
                sock.close()


# --- reading back --------------------------------------------------------------------------------


@dataclass
class KafkaCopies:
    """How many times each message number of one topic is in Kafka."""

    copies: bytearray
    foreign: list[bytes] = field(default_factory=list)  # values no client sent this way
    wrong_timestamps: int = 0


def kafka_copies(bootstrap: str, numbering: Numbering, size: int) -> KafkaCopies:
    """Read ``numbering.topic`` to the end of every partition, counting copies per number."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "pydory-test-spool-kill",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    result = KafkaCopies(bytearray(size))
    copies = result.copies
    try:
        partitions = sorted(
            consumer.list_topics(numbering.topic, timeout=60).topics[numbering.topic].partitions
        )
        consumer.assign([TopicPartition(numbering.topic, p, OFFSET_BEGINNING) for p in partitions])
        at_end: set[int] = set()
        deadline = time.monotonic() + 120
        while at_end != set(partitions) and time.monotonic() < deadline:
            for message in consumer.consume(10_000, timeout=1):
                error = message.error()
                if error is not None:
                    assert error.code() == KafkaError._PARTITION_EOF, error
                    at_end.add(message.partition() or 0)
                    continue
                at_end.discard(message.partition() or 0)
                value = message.value() or b""
                n = numbering.number(value)
                if n is None or n >= size:
                    result.foreign.append(value)
                    continue
                copies[n] = min(copies[n] + 1, 255)
                if message.timestamp()[1] != numbering.t0 + n:
                    result.wrong_timestamps += 1
        assert at_end == set(partitions), f"{numbering.topic}: not read to the end in time"
    finally:
        consumer.close()
    return result


# --- the kill loop -------------------------------------------------------------------------------

TRANSPORTS = ("unix_dgram", "unix_stream", "tcp")
LABELS = {"unix_dgram": "dgram", "unix_stream": "stream", "tcp": "tcp"}


@dataclass
class Kill:
    """One SIGKILL: of daemon run ``epoch``; ``received`` per transport as last read from
    the daemon before it (None: killed before it answered); ``quiesced``: every client
    paused and the daemon had read everything they sent in that run."""

    epoch: int
    received: dict[str, int] | None
    quiesced: bool


@dataclass
class KillLoop:
    """What a kill loop did and what the oracle found."""

    seed: int
    kills: list[Kill]
    clients: dict[str, Client]
    in_spool: dict[str, set[int]]  # message numbers found in a post-kill spool
    copies: dict[str, KafkaCopies] = field(default_factory=dict)
    discarded: dict[str, set[int]] = field(default_factory=dict)  # named by a DISC line
    dup_lines: dict[str, Counter[int]] = field(default_factory=dict)  # DUP lines per number
    violations: dict[str, list[str]] = field(default_factory=dict)  # (a)..(d), per rule
    lost: dict[str, int] = field(default_factory=dict)  # unknowable losses per transport
    lost_bound: dict[str, int] = field(default_factory=dict)  # what buffers could hold
    #: per transport, the streak that lost the most: (lost, its bound)
    worst: dict[str, tuple[int, int]] = field(default_factory=dict)
    #: /books/json's datagram_input (its reader, kernel queue, ring), alike in every run
    datagram_input: dict[str, Any] | None = None
    #: /books/json's stream_input (its reader, the bytes a drain thread holds), the same
    stream_input: dict[str, Any] | None = None
    seconds: float = 0.0

    def note_datagram_input(self, books: dict[str, Any]) -> None:
        """Keep how this run's daemon reads datagrams: every run reads them alike."""
        seen = books["datagram_input"]
        assert seen is not None, "the kill loop's daemons have a datagram input"
        if self.datagram_input is None:
            self.datagram_input = seen
        assert seen == self.datagram_input, f"{seen} in one run, {self.datagram_input} before"
        streams = books["stream_input"]
        assert streams is not None, "the kill loop's daemons have a UNIX stream input"
        if self.stream_input is None:
            self.stream_input = streams
        assert streams == self.stream_input, f"{streams} in one run, {self.stream_input} before"

    def violate(self, rule: str, detail: str) -> None:
        found = self.violations.setdefault(rule, [])
        if len(found) < 20:
            found.append(detail)
        else:
            found[-1] = f"... and more ({detail})"


def _buffer_bound(
    client: Client, streak: Streak, qlen: int, tcp_rmem_max: int, ring: int, stream_held: int
) -> int:
    """How many of ``streak``'s messages could sit outside the daemon's write-ahead when
    it died: in kernel buffers, in a datagram drain thread's ``ring``, in a stream drain
    thread's chunks for the streak's connection (``stream_held`` bytes), or in the one
    read not yet written ahead."""
    if client.transport == "unix_dgram":
        return qlen + 1 + DATAGRAM_BURST + ring
    window = tcp_rmem_max if client.transport == "tcp" else 0
    held = stream_held if client.transport == "unix_stream" else 0
    return (streak.sndbuf + window + held + STREAM_READ_BYTES) // client.message_bytes + 1


def run_kill_loop(
    kafka: KafkaCluster,
    base_dir: Path,
    topic_prefix: Callable[[str], str],
    *,
    kills: int,
    min_messages: int,
    seed: int,
    spool: bool = True,
    quiesce_share: float = 0.35,
    early_share: float = 0.15,
    rate: float = 15_000,
    linger_ms: int = 100,
    budget_s: float = 1800.0,  # a safety net: the loop ends when enough was sent
) -> KillLoop:
    """SIGKILL a loaded daemon ``kills`` times, then drain it and check every message."""
    started = time.monotonic()
    rng = random.Random(seed)
    t0 = int(time.time() * 1000) - 3_600_000  # unique timestamps, in the past hour
    numberings = {
        t: Numbering(LABELS[t], topic_prefix(f"spool-kill-{LABELS[t]}"), t0) for t in TRANSPORTS
    }
    for numbering in numberings.values():
        kafka.create_topic(numbering.topic, 4)
    spool_dir, discard_log = base_dir / "spool", base_dir / "discards.log"
    config = DaemonConfig(
        kafka.bootstrap_servers,
        str(base_dir),
        batching_time_ms=linger_ms,  # a kill finds messages in librdkafka's batches
        spool_path=str(spool_dir) if spool else None,
        spool_fsync="none",  # a process crash keeps the page cache
        spool_segment_size="256k",  # rotations and deletions under load
        discard_log_path=str(discard_log),
        discard_log_max_file_size="64m",
        discard_log_max_archive_size="1024m",
        log_to_stdout=True,  # into daemon.log
    )
    config_path, log_path = base_dir / "pydory.xml", base_dir / "daemon.log"
    run = [0]  # the daemon run clients are sending to (bumped right after each kill)
    clients = {t: Client(t, numberings[t], config, lambda: run[0], rate) for t in TRANSPORTS}
    loop = KillLoop(seed, [], clients, {t: set() for t in TRANSPORTS})
    by_topic = {numberings[t].topic: t for t in TRANSPORTS}
    quiesce_at = set(rng.sample(range(kills), max(2, round(kills * quiesce_share))))
    for client in clients.values():
        client.start()
    daemon: DaemonProcess | None = None
    try:
        for k in range(kills):
            early = k not in quiesce_at and rng.random() < early_share
            daemon = DaemonProcess(config, config_path, log_path, wait_ready=not early)
            received: dict[str, int] | None = None
            if not early:
                loop.note_datagram_input(daemon.books())
            if early:  # somewhere in start-up: metadata, replay, inputs opening, or later
                time.sleep(rng.uniform(0.05, 1.5))
            else:
                time.sleep(rng.uniform(0.2, 2.0))
                if k in quiesce_at:
                    received = _quiesce(daemon, clients, run[0])
                else:
                    received = daemon.books()["received"]
            daemon.kill()
            daemon = None
            loop.kills.append(Kill(run[0], received, k in quiesce_at))
            run[0] += 1
            for client in clients.values():
                client.resume()
            for message in spool_messages(spool_dir):
                transport = by_topic[message.topic]
                n = numberings[transport].number(message.value)
                assert n is not None, message
                loop.in_spool[transport].add(n)
        # The last run: until enough was sent, then the clients stop and it drains.
        daemon = DaemonProcess(config, config_path, log_path)
        loop.note_datagram_input(daemon.books())
        deadline = started + budget_s
        while sum(c.sent() for c in clients.values()) < min_messages:
            assert time.monotonic() < deadline, "too slow: raise the budget or lower the load"
            time.sleep(0.1)
        _quiesce(daemon, clients, run[0])
        for client in clients.values():
            client.finish()
        final = daemon
        wait_for(
            lambda: all(t["in_flight"] == 0 for t in final.books()["topics"]),
            60,
            "the last run to settle everything",
        )
        status = daemon.stop()
        daemon = None
        assert status == 0, f"the last daemon exited {status}"
    finally:
        if daemon is not None:
            daemon.kill()
        for client in clients.values():
            if client.is_alive():
                client.finish()
    assert spool_messages(spool_dir) == [], "a clean stop left messages in the spool"
    assert daemon_log_problems(log_path) == []
    _check(loop, config, numberings, discard_log)
    loop.seconds = time.monotonic() - started
    return loop


def _quiesce(daemon: DaemonProcess, clients: dict[str, Client], run: int) -> dict[str, int]:
    """Pause every client and wait until the daemon has read all they sent in ``run``."""
    for client in clients.values():
        client.pause()
    expected = {t: c.sent_in(run) for t, c in clients.items()}
    seen: dict[str, int] = {}

    def read_all() -> bool:
        seen.update(daemon.books()["received"])
        return all(seen.get(t, 0) == n for t, n in expected.items())

    try:
        wait_for(read_all, 60, "the daemon to read all the clients sent")
    except AssertionError:
        raise AssertionError(f"sent {expected}, the daemon read {seen}") from None
    return {t: seen.get(t, 0) for t in TRANSPORTS}


def _check(
    loop: KillLoop, config: DaemonConfig, numberings: dict[str, Numbering], discard_log: Path
) -> None:
    """The oracle: rules (a) to (d) of the module docstring, message by message."""
    by_topic = {numberings[t].topic: t for t in TRANSPORTS}
    discarded: dict[str, set[int]] = {t: set() for t in TRANSPORTS}
    dup_lines: dict[str, Counter[int]] = {t: Counter() for t in TRANSPORTS}
    for line in discard_lines(discard_log):
        transport = by_topic.get(line.topic)
        if transport is None:
            loop.violate("discard log", f"a line of another topic: {line}")
            continue
        if line.event == "DUP":
            dup_lines[transport][line.timestamp_ms - numberings[transport].t0] += 1
        else:
            n = numberings[transport].number(line.msg)
            if n is None:
                loop.violate("discard log", f"a DISC line naming no message: {line}")
            else:
                discarded[transport].add(n)
    loop.discarded, loop.dup_lines = discarded, dup_lines
    qlen = int(Path("/proc/sys/net/unix/max_dgram_qlen").read_text())
    tcp_rmem_max = int(Path("/proc/sys/net/ipv4/tcp_rmem").read_text().split()[2])
    ring = _drain_ring(loop, qlen)
    stream_held = _stream_drain_held(loop)
    received_in = {k.epoch: k for k in loop.kills}
    for transport, client in loop.clients.items():
        numbering = numberings[transport]
        copies = kafka_copies(config.bootstrap_servers, numbering, client.next)
        loop.copies[transport] = copies
        sent = bytearray(client.next)
        for streak in client.streaks:
            sent[streak.start : streak.end] = b"\x01" * (streak.end - streak.start)
        gone = discarded[transport]

        def found(n: int, copies: bytearray = copies.copies, gone: set[int] = gone) -> bool:
            return copies[n] > 0 or n in gone

        for value in copies.foreign[:5]:
            loop.violate("b", f"{transport}: in Kafka, never sent: {value!r}")
        if copies.wrong_timestamps:
            loop.violate("b", f"{transport}: {copies.wrong_timestamps} wrong timestamps")
        for n in sorted(loop.in_spool[transport]):  # (a)
            if not found(n):
                loop.violate("a", f"{transport} #{n}: in a post-kill spool, never delivered")
        for n, count in enumerate(copies.copies):
            if count and not sent[n]:  # (b)
                loop.violate("b", f"{transport} #{n}: in Kafka, never sent whole")
            if count > 1 + dup_lines[transport][n]:  # (c)
                loop.violate(
                    "c", f"{transport} #{n}: {count} copies, {dup_lines[transport][n]} DUP"
                )
        # (d), streak by streak, in the order they reached their daemon run.
        lost_total = bound_total = 0
        read_left: dict[int, int] = {}
        for streak in client.streaks:
            kill = received_in.get(streak.epoch)
            if streak.epoch not in read_left:
                read = 0 if kill is None or kill.received is None else kill.received[transport]
                read_left[streak.epoch] = read if kill is not None else streak.end
            said_read = min(read_left[streak.epoch], streak.end - streak.start)
            read_left[streak.epoch] -= said_read
            lost = [n for n in range(streak.start, streak.end) if not found(n)]
            if not lost:
                continue
            where = f"{transport} run {streak.epoch} #{streak.start}-{streak.end - 1}"
            if kill is None:
                loop.violate("d", f"{where}: {len(lost)} lost in the drained last run")
                continue
            if lost[0] < streak.start + said_read:
                loop.violate(
                    "d",
                    f"{where}: #{lost[0]} lost, yet the daemon had read the first "
                    f"{said_read}{' (quiesced)' if kill.quiesced else ''}; "
                    f"{len(lost)} lost in all",
                )
            last_found = max((n for n in range(streak.start, streak.end) if found(n)), default=-1)
            if last_found > lost[0]:
                loop.violate("d", f"{where}: #{lost[0]} lost but #{last_found} came out")
            bound = _buffer_bound(client, streak, qlen, tcp_rmem_max, ring, stream_held)
            if len(lost) > bound:
                loop.violate("d", f"{where}: {len(lost)} lost, buffers hold at most {bound}")
            lost_total += len(lost)
            bound_total += bound
            if len(lost) > loop.worst.get(transport, (-1, 0))[0]:
                loop.worst[transport] = (len(lost), bound)
        loop.lost[transport] = lost_total
        loop.lost_bound[transport] = bound_total


def _stream_drain_held(loop: KillLoop) -> int:
    """The bytes of one UNIX stream connection the daemons' drain thread held at most (0:
    the connections' transports read them), as the daemon reported it, held to the C's
    own constant."""
    reading = loop.stream_input
    assert reading is not None, "no run's daemon answered"
    expected = 0
    if reading["reader"] == "drain_thread":  # the daemon runs the test's own build
        expected = importlib.import_module("pydory._cwire").SDRAIN_CONNECTION_BYTES
    assert reading["connection_held_bytes"] == expected, f"{reading}: {expected} expected"
    held: int = reading["connection_held_bytes"]
    return held


def _drain_ring(loop: KillLoop, qlen: int) -> int:
    """The datagrams the daemons' drain thread held at most (0: the loop read the socket),
    as the daemon reported it, held to the C's own constant: never a copied number."""
    reading = loop.datagram_input
    assert reading is not None, "no run's daemon answered"
    assert reading["kernel_queue"] == qlen + 1, reading
    expected = 0
    if reading["reader"] == "drain_thread":  # the daemon runs the test's own build
        expected = importlib.import_module("pydory._cwire").DRAIN_BURSTS * DRAIN_BURST_DATAGRAMS
    assert reading["ring"] == expected, f"{reading}: a ring of {expected} datagrams expected"
    ring: int = reading["ring"]
    return ring


def _summary(loop: KillLoop) -> str:
    lines = [f"kill loop: seed {loop.seed}, {loop.seconds:.1f} s"]
    reading = loop.datagram_input or {}
    lines.append(
        f"  datagrams read by the daemon's {reading.get('reader')}: kernel queue "
        f"{reading.get('kernel_queue')} + ring {reading.get('ring')}"
    )
    quiesced = sum(k.quiesced for k in loop.kills)
    early = sum(k.received is None for k in loop.kills)
    lines.append(
        f"  {len(loop.kills)} SIGKILLs: {quiesced} quiesced, {early} before the daemon "
        f"answered, {len(loop.kills) - quiesced - early} at random moments under load"
    )
    for transport, client in loop.clients.items():
        copies = loop.copies.get(transport)
        stored = sum(copies.copies) if copies else 0
        distinct = sum(1 for c in copies.copies if c) if copies else 0
        lines.append(
            f"  {transport}: sent {client.sent()}, refused {client.unsent}, cut {client.cut}; "
            f"in post-kill spools {len(loop.in_spool[transport])}; in Kafka {distinct} "
            f"({stored - distinct} extra copies), DUP lines "
            f"{sum(loop.dup_lines.get(transport, Counter()).values())}, DISC "
            f"{len(loop.discarded.get(transport, ()))}; unknowable losses "
            f"{loop.lost.get(transport, 0)} "
            f"(buffers could hold {loop.lost_bound.get(transport, 0)}); at most "
            f"{loop.worst.get(transport, (0, 0))[0]} in one streak "
            f"(its bound {loop.worst.get(transport, (0, 0))[1]})"
        )
    for rule, details in sorted(loop.violations.items()):
        lines += [f"  VIOLATION ({rule}): {detail}" for detail in details]
    return "\n".join(lines)


def _seed() -> int:
    text = os.environ.get("PYDORY_KILL_SEED")
    return int(text) if text else random.SystemRandom().randrange(2**32)


# --- the tests -----------------------------------------------------------------------------------


def test_kill_loop_loses_no_accepted_message(
    kafka_broker: KafkaCluster, unique_topic: Any, daemon_dir: Path
) -> None:
    """≥ 20 SIGKILLs under load on all three transports, ≥ 1,000,000 messages: nothing
    the daemon accepted is lost, every duplicate is counted (see the module docstring;
    ``PYDORY_KILL_SEED`` replays a run's kill schedule)."""
    seed = _seed()
    print(f"kill loop seed: {seed} (PYDORY_KILL_SEED={seed} to replay)")
    loop = run_kill_loop(
        kafka_broker, daemon_dir, unique_topic, kills=20, min_messages=1_000_000, seed=seed
    )
    print(_summary(loop))
    assert loop.violations == {}, _summary(loop)
    assert len(loop.kills) >= 20
    assert sum(c.sent() for c in loop.clients.values()) >= 1_000_000
    assert sum(k.quiesced for k in loop.kills) >= 2
    assert all(loop.in_spool[t] for t in TRANSPORTS), "no kill found anything in the spool"


def test_kill_loop_catches_losses_without_the_spool(
    kafka_broker: KafkaCluster, unique_topic: Any, daemon_dir: Path
) -> None:
    """The oracle has teeth: without the spool, messages the daemon had read when it was
    killed (still in librdkafka's batches) are lost, and rule (d) says so."""
    seed = _seed()
    loop = run_kill_loop(
        kafka_broker,
        daemon_dir,
        unique_topic,
        kills=2,
        min_messages=20_000,
        seed=seed,
        spool=False,
        quiesce_share=1.0,
        linger_ms=2000,  # whatever the machine's pace, a quiesced kill finds some there
    )
    print(_summary(loop))
    assert set(loop.violations) == {"d"}, _summary(loop)
    assert any("had read the first" in v for v in loop.violations["d"])


def test_messages_waiting_in_librdkafka_survive_a_sigkill(
    kafka_broker: KafkaCluster, unique_topic: Any, daemon_dir: Path
) -> None:
    """The operator's bad day: every message accepted, all of them still in librdkafka's
    batches (a 10 s linger), and the daemon SIGKILLed. The restarted daemon replays them
    from the spool and counts each as a possible duplicate; without the spool all are lost.
    """
    topic = unique_topic("spool-kill")
    kafka_broker.create_topic(topic, 4)
    count = 20_000
    config = DaemonConfig(
        kafka_broker.bootstrap_servers,
        str(daemon_dir),
        batching_time_ms=10_000,  # they wait in librdkafka's batches when the kill comes
        spool_path=str(daemon_dir / "spool"),
        discard_log_path=str(daemon_dir / "discards.log"),
    )
    daemon = DaemonProcess(config, daemon_dir / "pydory.xml", daemon_dir / "daemon.log")
    try:
        with UnixStreamSender(config.stream_path) as stream:
            stream.send_many(encode_any_partition(topic, b"m%06d" % i) for i in range(count))
        wait_for(
            lambda: daemon.books()["received"]["unix_stream"] == count, 60, "the daemon to read"
        )
        assert topic_books(daemon.books(), topic)["delivered"] == 0  # all still in batches
    finally:
        daemon.kill()
    assert list((daemon_dir / "spool").glob("segment-*.spool")), "nothing left in the spool"

    config.batching_time_ms = 2_000  # the replayed messages wait a moment in batches too
    restarted = DaemonProcess(config, daemon_dir / "pydory.xml", daemon_dir / "daemon.log")
    try:
        # The commit point keeps its meaning across the restart: the replayed messages
        # hold it back until they settle, and a wait for "now" passes once they have.
        point = commit_point(restarted, "")
        assert 0 < point["open_messages"] <= count
        waited = commit_point(restarted, "?after=now&timeout=60")
        assert waited["passed"] is True
        assert waited["open_messages"] == 0
        # /books/json may serve a page rendered up to 0.1 s before (PAGE_REUSE_S).
        wait_for(
            lambda: topic_books(restarted.books(), topic).get("delivered") == count,
            60,
            "a books page rendered after the commit point passed",
        )
        books = topic_books(restarted.books(), topic)
    finally:
        assert restarted.stop() == 0
    assert books["accepted"] == count
    assert books["discarded"] == {}
    values = Counter(record.value for record in consume_all(config.bootstrap_servers, topic, count))
    assert set(values) == {b"m%06d" % i for i in range(count)}
    assert all(n == 1 for n in values.values())
    # Each replayed message may have reached Kafka before the kill: counted, not silent.
    assert duplicate_lines(daemon_dir / "discards.log", topic) == count
    # Settled and shut down cleanly: nothing left to replay.
    assert spool_messages(daemon_dir / "spool") == []


def commit_point(daemon: DaemonProcess, query: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{daemon.url}/commit_point/json{query}", timeout=90) as reply:
        page: dict[str, Any] = json.load(reply)
    return page


@pytest.fixture(params=["size_cap", "tmpfs"])
def full_spool(request: pytest.FixtureRequest, daemon_dir: Path) -> Iterator[tuple[str, Path]]:
    """How the spool runs out of room: its size cap (64 KiB, 16 KiB segments), or a real
    full disk (a 1 MiB tmpfs, skipped where mounting is not permitted)."""
    spool_dir = daemon_dir / "spool"
    if request.param == "size_cap":
        yield request.param, spool_dir
        return
    spool_dir.mkdir()
    try:
        mount = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(spool_dir)],
            capture_output=True,
            text=True,
            check=False,
        )
    except OSError as error:  # no mount command
        pytest.skip(f"cannot mount a tmpfs here: {error}")
    if mount.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mount.stderr.strip()}")
    try:
        yield request.param, spool_dir
    finally:
        subprocess.run(["umount", "--lazy", str(spool_dir)], check=True)


def test_a_full_spool_leaves_messages_unprotected_not_lost(
    kafka_broker: KafkaCluster, unique_topic: Any, daemon_dir: Path, full_spool: tuple[str, Path]
) -> None:
    """When the write-ahead cannot take a burst (SpoolFull at the size cap, ENOSPC on a
    full disk), its messages are still delivered, only unprotected, and counted; the
    daemon keeps serving, and writes ahead again once settling has made room."""
    how, spool_dir = full_spool
    topic = unique_topic(f"spool-full-{how}")
    kafka_broker.create_topic(topic, 4)
    config = DaemonConfig(
        kafka_broker.bootstrap_servers,
        str(daemon_dir),
        batching_time_ms=500,  # messages stay unsettled, holding the spool, for a while
        spool_path=str(spool_dir),
        spool_max_size="64k" if how == "size_cap" else "1024m",
        spool_segment_size="16k" if how == "size_cap" else "256k",
        log_to_stdout=True,
    )
    count, more = 20_000, 100  # about 2 MB of spool frames; then a burst that fits
    daemon = DaemonProcess(config, daemon_dir / "pydory.xml", daemon_dir / "daemon.log")
    try:
        with UnixStreamSender(config.stream_path) as stream:
            for start in range(0, count, 500):
                stream.send_many(
                    encode_any_partition(topic, b"f%06d" % i) for i in range(start, start + 500)
                )
                if start == 0:  # read alone: a first burst that fits under the 64 KiB cap
                    wait_for(
                        lambda: daemon.books()["received"]["unix_stream"] == 500,
                        60,
                        "the daemon to read the first 500",
                    )
        wait_for(
            lambda: daemon.books()["received"]["unix_stream"] == count, 60, "the daemon to read"
        )
        wait_for(
            lambda: topic_books(daemon.books(), topic).get("delivered") == count,
            60,
            "delivery",
        )
        unprotected = daemon.counters()["spool_unprotected"]
        assert 0 < unprotected < count  # the first bursts were written ahead
        with UnixStreamSender(config.stream_path) as stream:
            stream.send_many(
                encode_any_partition(topic, b"f%06d" % i) for i in range(count, count + more)
            )
        wait_for(
            lambda: topic_books(daemon.books(), topic).get("delivered") == count + more,
            60,
            "delivery after the spool had room again",
        )
        counters = daemon.counters()
        books = topic_books(daemon.books(), topic)
    finally:
        status = daemon.stop()
    assert status == 0
    assert counters["spool_unprotected"] == unprotected  # written ahead again
    assert books["accepted"] == count + more
    assert books["discarded"] == {}
    values = Counter(r.value for r in consume_all(config.bootstrap_servers, topic, count + more))
    assert set(values) == {b"f%06d" % i for i in range(count + more)}
    assert all(n == 1 for n in values.values())
    log = (daemon_dir / "daemon.log").read_text()
    assert "cannot write ahead" in log
    assert "is full" in log if how == "size_cap" else "No space left on device" in log
    assert "writing ahead again" in log
    assert daemon_log_problems(daemon_dir / "daemon.log") == []


def test_a_damaged_spool_is_repaired_and_replayed(
    kafka_broker: KafkaCluster, unique_topic: Any, daemon_dir: Path
) -> None:
    """Segments written by the spool itself, then damaged the ways a crash or a bad disk
    damages them: a torn tail, a flipped byte (bad CRC), an empty segment file. The daemon
    starts, replays every good message (those after the bad frame too), cuts the torn
    tail, counts the damaged message as ``spool_corrupt``, and says so."""
    topic = unique_topic("spool-damaged")
    kafka_broker.create_topic(topic, 4)
    spool_dir = daemon_dir / "spool"
    per_segment = 100
    bursts = [
        [encode_any_partition(topic, b"s%d-%04d" % (s, i)) for i in range(per_segment)]
        for s in range(4)
    ]
    spool = Spool(str(spool_dir), segment_bytes=1, max_bytes=1 << 30, fsync_interval_ms=None)
    with spool:
        for burst in bursts:
            spool.append_payloads(burst)  # one segment each (segment_bytes=1); never settled
    segments = sorted(spool_dir.glob("segment-*.spool"))
    assert len(segments) == 4
    frame = (segments[0].stat().st_size - HEADER_BYTES) // per_segment  # all the same size
    # Segment 2: torn inside its last frame. Segment 3: a flipped byte in frame 49's body.
    torn = segments[1].stat().st_size - 10
    os.truncate(segments[1], torn)
    with segments[2].open("r+b") as damaged:
        damaged.seek(HEADER_BYTES + 49 * frame + 30)
        byte = damaged.read(1)
        damaged.seek(-1, os.SEEK_CUR)
        damaged.write(bytes([byte[0] ^ 0xFF]))
    (spool_dir / "segment-00000000000000000005.spool").touch()  # empty
    good = bursts[0] + bursts[1][:-1] + bursts[2][:49] + bursts[2][50:] + bursts[3]
    expected = {wire.decode(m).value for m in good}
    cut = frame - 10

    config = DaemonConfig(
        kafka_broker.bootstrap_servers,
        str(daemon_dir),
        spool_path=str(spool_dir),
        discard_log_path=str(daemon_dir / "discards.log"),
        log_to_stdout=True,
    )
    daemon = DaemonProcess(config, daemon_dir / "pydory.xml", daemon_dir / "daemon.log")
    try:
        wait_for(
            lambda: topic_books(daemon.books(), topic).get("delivered") == len(good),
            60,
            "the good messages to be delivered",
        )
        counters = daemon.counters()
    finally:
        status = daemon.stop()
    assert status == 0
    assert counters["spool_replayed"] == len(good)
    assert counters["spool_repaired_segments"] == 1
    assert counters["spool_truncated_bytes"] == cut
    assert counters["discarded_spool_corrupt"] == 1
    values = Counter(r.value for r in consume_all(config.bootstrap_servers, topic, len(good)))
    assert set(values) == expected
    assert all(n == 1 for n in values.values())
    assert duplicate_lines(daemon_dir / "discards.log", topic) == len(good)
    log = (daemon_dir / "daemon.log").read_text()
    assert (
        f"spool: replayed {len(good)} messages from 4 segments (1 repaired, {cut} bytes cut); "
        "1 message lost to damage (spool_corrupt)"
    ) in log
    assert "segment-00000000000000000002.spool: torn frame" in log
    assert "segment-00000000000000000003.spool: bad CRC" in log
    assert "1 message(s) lost in bytes" in log
    assert "segment-00000000000000000005.spool: empty file: removed" in log
    assert daemon_log_problems(daemon_dir / "daemon.log") == []
    assert spool_messages(spool_dir) == []


def test_a_flipped_byte_a_third_into_a_segment_loses_only_its_message_and_counts_it(
    kafka_broker: KafkaCluster, unique_topic: Any, daemon_dir: Path
) -> None:
    """Issue 20, item 2: a byte flipped a third of the way into a 20,000-message segment
    cost 13,334 messages, visible only as bytes cut. Now the 19,999 others replay, and the
    damaged one is a ``spool_corrupt`` discard in the books, the discard report, the
    counters, ``/metrics`` and the discard log, its bytes kept in ``corrupt/``."""
    topic = unique_topic("spool-flip")
    kafka_broker.create_topic(topic, 4)
    spool_dir = daemon_dir / "spool"
    count = 20_000
    messages = [encode_any_partition(topic, b"v%06d" % i) for i in range(count)]
    spool = Spool(str(spool_dir), segment_bytes=1 << 30, max_bytes=1 << 30, fsync_interval_ms=None)
    with spool:
        for start in range(0, count, 500):  # as a daemon writes them: a burst at a time
            spool.append_payloads(messages[start : start + 500])
    (segment,) = spool_dir.glob("segment-*.spool")
    data = bytearray(segment.read_bytes())
    flipped = len(data) // 3
    data[flipped] ^= 0x20
    segment.write_bytes(data)

    config = DaemonConfig(
        kafka_broker.bootstrap_servers,
        str(daemon_dir),
        spool_path=str(spool_dir),
        discard_log_path=str(daemon_dir / "discards.log"),
        log_to_stdout=True,
    )
    daemon = DaemonProcess(config, daemon_dir / "pydory.xml", daemon_dir / "daemon.log")
    try:
        wait_for(
            lambda: topic_books(daemon.books(), topic).get("delivered") == count - 1,
            120,
            "the 19,999 undamaged messages to be delivered",
        )
        counters = daemon.counters()
        report = daemon.page("discards/json")["unfinished_report"]
        with urllib.request.urlopen(f"{daemon.url}/metrics", timeout=60) as reply:
            metrics = reply.read().decode()
    finally:
        status = daemon.stop()
    assert status == 0
    assert counters["spool_replayed"] == count - 1
    assert counters["discarded_spool_corrupt"] == 1
    assert counters["spool_truncated_bytes"] == 0
    assert report["discards_by_reason"]["spool_corrupt"] == 1
    assert 'pydory_discarded_messages_total{reason="spool_corrupt",topic=""} 1.0' in metrics
    values = Counter(r.value for r in consume_all(config.bootstrap_servers, topic, count - 1))
    assert all(n == 1 for n in values.values())
    (lost,) = {b"v%06d" % i for i in range(count)} - set(values)
    # The lost message is the one whose frame held the flipped byte, and its bytes (as
    # damaged) are in corrupt/, named by segment and byte range.
    (copy,) = (spool_dir / "corrupt").iterdir()
    name, start, end = re.fullmatch(r"(.+\.spool)\.(\d+)-(\d+)\.corrupt", copy.name).groups()
    assert name == segment.name
    assert int(start) <= flipped < int(end)
    assert copy.read_bytes() == bytes(data[int(start) : int(end)])
    assert lost in copy.read_bytes()
    (line,) = [e for e in discard_lines(daemon_dir / "discards.log") if e.event == "DISC"]
    assert (line.info, line.topic) == ("SPOOL_CORRUPT", "")
    assert copy.read_bytes().startswith(line.msg)
    log = (daemon_dir / "daemon.log").read_text()
    assert f"{segment.name}: bad CRC at offset {start}: 1 message(s) lost in bytes" in log
    assert f"saved as corrupt/{copy.name}" in log
    assert daemon_log_problems(daemon_dir / "daemon.log") == []
    assert spool_messages(spool_dir) == []


@pytest.fixture
def tmpfs_spool(daemon_dir: Path) -> Iterator[Path]:
    """The spool directory on a 1 MiB tmpfs of its own (skipped where mounting is not
    permitted), so that the test can fill its disk."""
    spool_dir = daemon_dir / "spool"
    spool_dir.mkdir()
    try:
        mount = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(spool_dir)],
            capture_output=True,
            text=True,
            check=False,
        )
    except OSError as error:  # no mount command
        pytest.skip(f"cannot mount a tmpfs here: {error}")
    if mount.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mount.stderr.strip()}")
    try:
        yield spool_dir
    finally:
        subprocess.run(["umount", "--lazy", str(spool_dir)], check=True)


def fill_disk(directory: Path) -> int:
    """Write a file in ``directory`` until its filesystem has no byte left; its size."""
    fd = os.open(directory / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for chunk in (b"\0" * 4096, b"\0"):  # pages, then the bytes left
            while _write_or_full(fd, chunk):
                pass
        return os.fstat(fd).st_size
    finally:
        os.close(fd)


def _write_or_full(fd: int, chunk: bytes) -> bool:
    """Write ``chunk``; False once the disk is full."""
    try:
        os.write(fd, chunk)
    except OSError as error:
        if error.errno != errno.ENOSPC:
            raise
        return False
    return True


def test_a_full_disk_does_not_stop_a_start(
    kafka_broker: KafkaCluster, unique_topic: Any, daemon_dir: Path, tmpfs_spool: Path
) -> None:
    """Issue 20, item 3: with the spool's filesystem full, ``pydory serve`` exited "Error
    in config file ... No space left on device" (the pid it writes into LOCK). Now it
    starts, replays the previous run's messages (one of them damaged: its copy cannot be
    written either, and it is counted all the same), runs unprotected with the warning
    and the counter, and writes ahead again once the replayed messages settle and their
    old segments free the disk."""
    topic = unique_topic("spool-disk-full")
    kafka_broker.create_topic(topic, 4)
    spool_dir = tmpfs_spool
    previous = [encode_any_partition(topic, b"old-%05d" % i) for i in range(2_000)]
    spool = Spool(str(spool_dir), segment_bytes=1 << 20, max_bytes=1 << 20, fsync_interval_ms=None)
    with spool:
        spool.append_payloads(previous)
    (segment,) = spool_dir.glob("segment-*.spool")
    data = bytearray(segment.read_bytes())
    data[len(data) // 2] ^= 0x01
    segment.write_bytes(data)
    # No LOCK: as when the directory was restored or moved without it. (With a LOCK that
    # held a pid, the old code's truncate-then-write reused the block it had just freed,
    # on tmpfs; on a disk filesystem a block freed so is not always reusable at once.)
    (spool_dir / "LOCK").unlink()
    assert fill_disk(spool_dir) > 0

    config = DaemonConfig(
        kafka_broker.bootstrap_servers,
        str(daemon_dir),
        spool_path=str(spool_dir),
        log_to_stdout=True,
    )
    daemon = DaemonProcess(config, daemon_dir / "pydory.xml", daemon_dir / "daemon.log")
    try:
        new = 1_000
        with UnixStreamSender(config.stream_path) as stream:
            stream.send_many(encode_any_partition(topic, b"new-%05d" % i) for i in range(new))
        wait_for(
            lambda: topic_books(daemon.books(), topic).get("delivered") == len(previous) - 1 + new,
            120,
            "the replayed and the new messages to be delivered",
        )
        unprotected = daemon.counters()["spool_unprotected"]
        assert unprotected >= len(previous) - 1  # the replay could not be written ahead
        wait_for(
            lambda: not segment.exists(), 60, "the old segment to go once its messages settled"
        )
        more = 500
        with UnixStreamSender(config.stream_path) as stream:
            stream.send_many(encode_any_partition(topic, b"more-%05d" % i) for i in range(more))
        wait_for(
            lambda: (
                topic_books(daemon.books(), topic).get("delivered")
                == len(previous) - 1 + new + more
            ),
            60,
            "the messages sent once the disk had room again",
        )
        counters = daemon.counters()
    finally:
        status = daemon.stop()
    assert status == 0
    assert counters["spool_replayed"] == len(previous) - 1
    assert counters["discarded_spool_corrupt"] == 1
    assert counters["spool_unprotected"] == unprotected  # the last ones were written ahead
    sent = {b"old-%05d" % i for i in range(len(previous))}
    sent |= {b"new-%05d" % i for i in range(new)} | {b"more-%05d" % i for i in range(more)}
    values = Counter(r.value for r in consume_all(config.bootstrap_servers, topic, len(sent) - 1))
    assert all(n == 1 for n in values.values())
    assert len(sent - set(values)) == 1  # the damaged one
    log = (daemon_dir / "daemon.log").read_text()
    assert "cannot write the pid" in log
    assert "not saved (No space left on device)" in log
    assert "cannot write ahead" in log
    assert "No space left on device" in log
    assert "the previous run's segments stay until they settle" in log
    assert "the previous run's segments deleted" in log
    assert "writing ahead again" in log
    assert "Error in config file" not in log
    assert daemon_log_problems(daemon_dir / "daemon.log") == []


def test_a_running_daemons_spool_is_refused(kafka_broker: KafkaCluster, daemon_dir: Path) -> None:
    """A second daemon pointed at a running daemon's spool (its own sockets and ports)
    refuses to start, naming the config element; the first one keeps serving."""
    spool_dir = daemon_dir / "spool"
    first = DaemonConfig(kafka_broker.bootstrap_servers, str(daemon_dir), spool_path=str(spool_dir))
    (daemon_dir / "b").mkdir()
    second = DaemonConfig(
        kafka_broker.bootstrap_servers,
        str(daemon_dir / "b"),
        spool_path=str(spool_dir),
        log_to_stdout=True,
    )
    (daemon_dir / "second.xml").write_text(second.render())
    daemon = DaemonProcess(first, daemon_dir / "pydory.xml", daemon_dir / "daemon.log")
    try:
        refused = subprocess.run(
            [sys.executable, "-m", "pydory", "serve", "--config-path", daemon_dir / "second.xml"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert daemon.books()["received"] is not None  # the first one still answers
    finally:
        status = daemon.stop()
    assert status == 0
    assert refused.returncode != 0
    output = refused.stdout + refused.stderr
    assert "/doryConfig/spool/path" in output, output
    assert str(spool_dir) in output
    assert f"pid {daemon.process.pid}" in output
    assert not Path(second.stream_path).exists()  # it never opened its inputs
