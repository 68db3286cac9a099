"""The daemon on the compiled hot path, on the pure-Python one (PYDORY_PURE_PYTHON=1) and
on the compiled one with its datagram socket drained by a thread (the default, issue 34;
PYDORY_DATAGRAM_DRAIN=0 leaves it to the loop) and its delivery reports served by a thread
(opt-in, PYDORY_REPORT_THREAD=1), fed the same mixed traffic on every
transport, every discard reason the inputs and the intake can give, keeps identical books
(issue 25's differential rule)."""

from __future__ import annotations

import contextlib
import os
import socket
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from daemon_process import DaemonProcess
from helpers import wait_until
from hotpaths import compiled_module
from pydory.daemon.books import counters as counter_names
from pydory.daemon.books.events import Transport
from pydory.daemon.inputs.datagram_drain import DRAIN_BURST_DATAGRAMS
from pydory.wire import encode_any_partition, encode_partition_key
from pydory_tools.testing.daemon_config import DaemonConfig
from pydory_tools.testing.mock_cluster import MockCluster

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(compiled_module() is None, reason="pydory._cwire is not built here"),
]

MESSAGE_MAX_BYTES = 4000
MAX_DATAGRAM_BYTES = 8192
RATE_LIMITED = 5  # messages a rate-limited topic takes per (long) window


def header(size: int, api_key: int = 256, version: int = 0) -> bytes:
    return struct.pack(">ihh", size, api_key, version)


def mixed_traffic(topic: str, limited: str, unknown: str) -> list[bytes]:
    """Whole messages, one each of every kind the intake judges, many good ones between."""
    good = [encode_any_partition(topic, b"v%d" % i, b"k" if i % 2 else b"", i) for i in range(60)]
    keyed = [encode_partition_key(topic, b"p%d" % i, i) for i in range(10)]
    valid = encode_any_partition(topic, b"x")
    bad = [
        header(len(valid), 300) + valid[8:],  # unsupported_api_key
        header(len(valid), 256, 1) + valid[8:],  # unsupported_version
        valid[:8] + b"\x00\x01" + valid[10:],  # malformed: Flags
        valid[:-1] + b"\x00",  # still whole, wrong bytes at the end: accepted as a value
        valid[:-2] + struct.pack(">i", 9)[2:],  # malformed: ValueSize past Size
        encode_any_partition("t", b"x").replace(b"\x01t", b"\x01!"),  # bad_topic: a '!'
        encode_any_partition(unknown, b"u"),  # bad_topic: Kafka does not have it
        encode_any_partition(topic, b"L" * MESSAGE_MAX_BYTES),  # too_long
        *(encode_any_partition(limited, b"r") for _ in range(RATE_LIMITED * 2)),  # rate_limit
        header(8),  # malformed: the header alone, shorter than the fixed part
    ]
    return good[:30] + bad[:5] + keyed + bad[5:] + good[30:]


def send_stream(connect: Callable[[], socket.socket], traffic: list[bytes]) -> None:
    """The traffic in 3-message writes on one connection, then a connection per fatal
    framing error and one that ends mid-frame."""
    with connect() as client:
        for i in range(0, len(traffic), 3):
            client.sendall(b"".join(traffic[i : i + 3]))
    for ending in (header(2**20 * 8)[:4], struct.pack(">i", 3), traffic[0][:10]):
        with connect() as client, contextlib.suppress(BrokenPipeError, ConnectionResetError):
            client.sendall(traffic[1] + ending)  # a good one, then the bad end


def send_datagrams(path: str, traffic: list[bytes]) -> None:
    """The traffic, and a datagram over maxDatagramMsgSize amid it."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as client:
        for i, data in enumerate(traffic):
            client.sendto(data, path)
            if i == len(traffic) // 2:
                client.sendto(traffic[0] + b"o" * MAX_DATAGRAM_BYTES, path)


def received(counters: dict[str, int]) -> int:
    return sum(counters.get(counter_names.RECEIVED[t], 0) for t in Transport)


def comparable(page: dict[str, Any]) -> Any:
    """The books' per-topic figures, without times."""
    keep = ("accepted", "delivered", "discarded", "in_flight", "possibly_delivered")
    return sorted((t["topic"], {k: t.get(k) for k in keep}) for t in page["topics"])


@contextlib.contextmanager
def daemon_on(implementation: str, config: DaemonConfig, where: Path) -> Iterator[DaemonProcess]:
    with pytest.MonkeyPatch.context() as patch:
        if implementation == "pure":
            patch.setenv("PYDORY_PURE_PYTHON", "1")
        else:
            patch.delenv("PYDORY_PURE_PYTHON", raising=False)
        # "compiled" is the loop's reader and the loop's report polls (the report polls
        # by default, unnamed, so the default is tested); "drain" the drain thread (the
        # default, unnamed) and the report thread (opt-in: PYDORY_REPORT_THREAD=1).
        if implementation == "drain":
            patch.delenv("PYDORY_DATAGRAM_DRAIN", raising=False)
            patch.setenv("PYDORY_REPORT_THREAD", "1")
        else:
            patch.setenv("PYDORY_DATAGRAM_DRAIN", "0")
            patch.delenv("PYDORY_REPORT_THREAD", raising=False)
        daemon = DaemonProcess(config, where / "pydory.xml", where / "pydory.log")
    try:
        yield daemon
    finally:
        daemon.stop()


def run_traffic(
    implementation: str, mock_cluster: MockCluster, topics: tuple[str, str, str], where: Path
) -> tuple[Any, dict[str, int], str, dict[str, Any]]:
    """The books and counters once all is settled, the log, and /books/json's
    ``datagram_input`` (how the socket was read)."""
    topic, limited, unknown = topics
    where.mkdir()
    config = DaemonConfig(
        mock_cluster.bootstrap_servers,
        str(where),
        message_max_bytes=MESSAGE_MAX_BYTES,
        max_datagram_msg_size=str(MAX_DATAGRAM_BYTES),
        rate_limits={limited: (3_600_000, RATE_LIMITED)},
        log_to_stdout=True,  # the log names the hot path it runs
    )
    traffic = mixed_traffic(topic, limited, unknown)
    with daemon_on(implementation, config, where) as daemon:
        assert config.tcp_port is not None
        tcp = ("127.0.0.1", config.tcp_port)
        send_stream(lambda: socket.create_connection(tcp), traffic)
        unix = config.stream_path

        def connect_unix() -> socket.socket:
            client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            client.connect(unix)
            return client

        send_stream(connect_unix, traffic)
        send_datagrams(config.datagram_path, traffic)
        # Every whole message of each stream (its 3 short connections: one good each,
        # then what cannot be framed) and every datagram (one too large).
        expected = 3 * len(traffic) + 2 * 3 + 1

        seen: dict[str, Any] = {}

        def settled() -> bool:
            # The status server reuses a page rendered in the last 0.1 s, so the two pages
            # can be of different instants: keep the pair that showed every message settled
            # and agreed with each other. Messages held for metadata are in no topic yet:
            # every topic must be there.
            page, counters = daemon.books(), daemon.counters()
            seen.update(books=page, counters=counters)
            topics = page["topics"]
            return (
                received(counters) == expected
                and page.get("waiting_for_metadata", 0) == 0
                and {topic, limited} <= {t["topic"] for t in topics}
                and all(t["in_flight"] == 0 for t in topics)
                and counters["delivered"] == sum(t["delivered"] for t in topics)
                and counters["accepted"] == sum(t["accepted"] for t in topics)
            )

        try:
            wait_until(settled, timeout_s=60, what=f"{expected} messages received and settled")
        except AssertionError:
            print(seen)
            raise
        books, counters = comparable(seen["books"]), seen["counters"]
    log = (where / "pydory.log").read_text()
    return books, counters, log, seen["books"]["datagram_input"]


def test_the_compiled_the_pure_and_the_drained_daemon_keep_identical_books(
    mock_cluster: MockCluster, unique_topic: Callable[[str], str], tmp_path: Path
) -> None:
    outer_pure = os.environ.get("PYDORY_PURE_PYTHON")  # as the suite was run
    topics = (unique_topic("same"), unique_topic("limited"), unique_topic("unknown"))
    mock_cluster.create_topic(topics[0], 4)
    mock_cluster.create_topic(topics[1], 1)
    results = {
        name: run_traffic(name, mock_cluster, topics, tmp_path / name)
        for name in ("compiled", "pure", "drain")
    }
    assert "hot path: compiled (pydory._cwire)" in results["compiled"][2]
    assert "(drained by a thread)" in results["drain"][2]
    assert "(drained by a thread)" not in results["compiled"][2]
    assert "hot path: pure (PYDORY_PURE_PYTHON is set)" in results["pure"][2]
    assert "reports served by a thread (PYDORY_REPORT_THREAD=1))" in results["drain"][2]
    assert "reports served by the loop)" in results["compiled"][2]
    # /books/json says which reader ran and what it may hold beyond the kernel's queue.
    cwire = compiled_module()
    qlen = int(Path("/proc/sys/net/unix/max_dgram_qlen").read_text())
    loop_reader = {"reader": "event_loop", "kernel_queue": qlen + 1, "ring": 0}
    assert results["compiled"][3] == results["pure"][3] == loop_reader
    ring = cwire.DRAIN_BURSTS * DRAIN_BURST_DATAGRAMS
    assert results["drain"][3] == {"reader": "drain_thread", "kernel_queue": qlen + 1, "ring": ring}
    compiled_books, compiled_counters, _, _ = results["compiled"]
    pure_books, pure_counters, _, _ = results["pure"]
    assert compiled_books == pure_books, (compiled_books, pure_books)
    reasons = {"malformed", "unsupported_api_key", "unsupported_version", "bad_topic",
               "too_long", "rate_limit", "unclean_disconnect"}  # fmt: skip
    assert all(pure_counters[f"discarded_{reason}"] > 0 for reason in reasons), pure_counters
    assert pure_counters[counter_names.DATAGRAM_OVER_MAX_SIZE] == 1
    watched = [
        *(name for name in pure_counters if name.startswith("discarded_")),
        "accepted",
        "delivered",
        *(counter_names.RECEIVED[t] for t in Transport),
        *(counter_names.UNCLEAN_DISCONNECT[t] for t in (Transport.UNIX_STREAM, Transport.TCP)),
        *(counter_names.STREAM_OVERSIZED_FRAME[t] for t in (Transport.UNIX_STREAM, Transport.TCP)),
        *(counter_names.STREAM_FRAMING_ERROR[t] for t in (Transport.UNIX_STREAM, Transport.TCP)),
        counter_names.DATAGRAM_OVER_MAX_SIZE,
    ]
    drain_books, drain_counters, _, _ = results["drain"]
    assert drain_books == pure_books, (drain_books, pure_books)
    assert {n: compiled_counters.get(n) for n in watched} == {
        n: pure_counters.get(n) for n in watched
    }
    assert {n: drain_counters.get(n) for n in watched} == {n: pure_counters.get(n) for n in watched}
    assert os.environ.get("PYDORY_PURE_PYTHON") == outer_pure  # the test left it as it was
