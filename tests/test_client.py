"""The client library against real sockets: a test receiver stands in for the daemon.

Each receiver reads what a sender wrote and decodes it with pydory.wire, so these tests
check the bytes on the wire, not the senders' internals.
"""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers import SchedulingDelay
from pydory.client import (
    DatagramSender,
    JsonLogFormatter,
    PydoryLogHandler,
    TcpSender,
    UnixStreamSender,
    encode_message,
)
from pydory.client.messages import check_wire_limits, now_ms
from pydory.errors import BadTopic, DaemonUnavailable, MessageTooLarge
from pydory.wire import Message, decode
from receivers import MAX_DATAGRAM, RECEIVE_TIMEOUT_S, read_stream, receive_datagram


@dataclass
class StreamEndpoint:
    """A listening socket standing in for the daemon, and a way to make a sender for it."""

    listener: socket.socket
    make_sender: Callable[[], UnixStreamSender | TcpSender]
    executor: ThreadPoolExecutor

    def read_next_connection(self) -> Future[list[Message]]:
        """Read the next connection in the background, so big writes cannot block the test."""
        return self.executor.submit(read_stream, self.listener)


def unix_listener(path: str) -> socket.socket:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen()
    listener.settimeout(RECEIVE_TIMEOUT_S)
    return listener


@pytest.fixture
def executor() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(max_workers=1) as pool:
        yield pool


@pytest.fixture(params=["unix-stream", "tcp"])
def stream_endpoint(
    request: pytest.FixtureRequest, tmp_path: Path, executor: ThreadPoolExecutor
) -> Iterator[StreamEndpoint]:
    if request.param == "unix-stream":
        path = str(tmp_path / "stream.sock")
        listener = unix_listener(path)
        endpoint = StreamEndpoint(listener, lambda: UnixStreamSender(path), executor)
    else:
        listener = socket.create_server(("127.0.0.1", 0))
        listener.settimeout(RECEIVE_TIMEOUT_S)
        port = listener.getsockname()[1]
        endpoint = StreamEndpoint(listener, lambda: TcpSender(port), executor)
    yield endpoint
    listener.close()


# --- encoding --------------------------------------------------------------------------------


def test_encode_message_without_partition_key_is_any_partition() -> None:
    encoded = encode_message("events", b"v", b"k", timestamp_ms=42)
    assert decode(encoded) == Message("events", b"v", b"k", 42, None)


def test_encode_message_with_partition_key_is_partition_key() -> None:
    encoded = encode_message("events", b"v", partition_key=2**32 - 1, timestamp_ms=42)
    assert decode(encoded).partition_key == 2**32 - 1


def test_encode_message_stamps_now_by_default() -> None:
    before = now_ms()
    timestamp = decode(encode_message("events", b"v")).timestamp_ms
    assert before <= timestamp <= now_ms()


def test_encode_message_refuses_a_topic_kafka_would_refuse() -> None:
    with pytest.raises(BadTopic):
        encode_message("no spaces allowed", b"v")


@pytest.mark.parametrize(("key_size", "value_size"), [(2**31, 0), (0, 2**31), (2**30, 2**30)])
def test_sizes_beyond_the_int32_size_field_are_too_large(key_size: int, value_size: int) -> None:
    with pytest.raises(MessageTooLarge, match="at most 2147483647"):
        check_wire_limits(6, key_size, value_size, partition_key=False)


def test_sizes_within_the_size_field_pass() -> None:
    check_wire_limits(6, 0, 2**31 - 1 - 28 - 6, partition_key=False)


# --- DatagramSender --------------------------------------------------------------------------


def test_datagram_sender_delivers_any_partition_message(
    datagram_path: str, datagram_receiver: socket.socket
) -> None:
    with DatagramSender(datagram_path) as sender:
        sender.send("events", b"value \x00\xff", key=b"key", timestamp_ms=1_700_000_000_123)

    assert receive_datagram(datagram_receiver) == Message(
        "events", b"value \x00\xff", b"key", 1_700_000_000_123, None
    )


def test_datagram_sender_delivers_partition_key_message(
    datagram_path: str, datagram_receiver: socket.socket
) -> None:
    with DatagramSender(datagram_path) as sender:
        sender.send("events", b"v", partition_key=7, timestamp_ms=5)

    assert receive_datagram(datagram_receiver) == Message("events", b"v", b"", 5, 7)


def test_datagram_sender_stamps_the_current_time(
    datagram_path: str, datagram_receiver: socket.socket
) -> None:
    before = now_ms()
    with DatagramSender(datagram_path) as sender:
        sender.send("events", b"v")
    after = now_ms()

    assert before <= receive_datagram(datagram_receiver).timestamp_ms <= after


def test_datagram_send_many_sends_one_datagram_per_message(
    datagram_path: str, datagram_receiver: socket.socket
) -> None:
    encoded = [encode_message("events", f"v{i}".encode(), timestamp_ms=i) for i in range(3)]
    with DatagramSender(datagram_path) as sender:
        sender.send_many(encoded)

    received = [receive_datagram(datagram_receiver) for _ in range(3)]
    assert [(m.value, m.timestamp_ms) for m in received] == [(b"v0", 0), (b"v1", 1), (b"v2", 2)]


def test_datagram_over_the_kernel_limit_raises_message_too_large(
    datagram_path: str, datagram_receiver: socket.socket
) -> None:
    with DatagramSender(datagram_path) as sender, pytest.raises(MessageTooLarge) as raised:
        sender.send("events", bytes(1 << 20))

    message = str(raised.value)
    assert str((1 << 20) + 28 + len("events")) in message
    assert "SO_SNDBUF" in message
    assert "stream" in message


def wmem_max() -> int:
    return int(Path("/proc/sys/net/core/wmem_max").read_text())


@pytest.mark.skipif(wmem_max() < 1 << 20, reason="net.core.wmem_max is below 1 MiB")
def test_a_larger_sndbuf_lets_a_larger_datagram_through(
    datagram_path: str, datagram_receiver: socket.socket
) -> None:
    value = bytes(300_000)  # over the default limit of about 212 KB
    with DatagramSender(datagram_path, sndbuf=1 << 20) as sender:
        sender.send("events", value)

    assert receive_datagram(datagram_receiver).value == value


def test_datagram_to_a_missing_socket_raises_daemon_unavailable(datagram_path: str) -> None:
    with DatagramSender(datagram_path) as sender, pytest.raises(DaemonUnavailable) as raised:
        sender.send("events", b"v")

    message = str(raised.value)
    assert datagram_path in message
    assert "does not exist" in message
    assert "is pydory running?" in message
    assert "inputSources/unixDatagram" in message


def test_datagram_to_a_plain_file_raises_daemon_unavailable(datagram_path: str) -> None:
    Path(datagram_path).write_text("not a socket")

    with DatagramSender(datagram_path) as sender, pytest.raises(DaemonUnavailable) as raised:
        sender.send("events", b"v")

    assert f"{datagram_path} is not a socket" in str(raised.value)


def test_datagram_to_a_stream_socket_names_the_type_mismatch(tmp_path: Path) -> None:
    path = str(tmp_path / "stream.sock")
    with (
        unix_listener(path),
        DatagramSender(path) as sender,
        pytest.raises(DaemonUnavailable) as raised,
    ):
        sender.send("events", b"v")

    assert "other type (datagram vs stream)" in str(raised.value)


def test_datagram_sender_reaches_a_restarted_daemon(datagram_path: str) -> None:
    with DatagramSender(datagram_path) as sender:
        with pytest.raises(DaemonUnavailable):
            sender.send("events", b"before")
        receiver = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        with receiver:
            receiver.bind(datagram_path)
            sender.send("events", b"after")
            assert receive_datagram(receiver).value == b"after"


def test_unix_socket_path_too_long_is_refused_up_front(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="longer than"):
        DatagramSender(str(tmp_path / ("x" * 120)))


# --- stream senders (UNIX stream and TCP) ----------------------------------------------------


def test_stream_sender_delivers_each_kind_of_message(stream_endpoint: StreamEndpoint) -> None:
    received = stream_endpoint.read_next_connection()
    with stream_endpoint.make_sender() as sender:
        sender.send("events", b"v1", key=b"k1", timestamp_ms=11)
        sender.send("other.topic", b"v2", partition_key=3, timestamp_ms=22)

    assert received.result(RECEIVE_TIMEOUT_S) == [
        Message("events", b"v1", b"k1", 11, None),
        Message("other.topic", b"v2", b"", 22, 3),
    ]


def test_stream_send_many_writes_all_messages_in_order(stream_endpoint: StreamEndpoint) -> None:
    encoded = [
        encode_message("events", bytes([i % 256]) * 1000, timestamp_ms=i) for i in range(500)
    ]
    received = stream_endpoint.read_next_connection()
    with stream_endpoint.make_sender() as sender:
        sender.send_many(encoded)

    messages = received.result(RECEIVE_TIMEOUT_S)
    assert [m.timestamp_ms for m in messages] == list(range(500))
    assert all(m.value == bytes([i % 256]) * 1000 for i, m in enumerate(messages))


def test_stream_sender_uses_one_connection_for_many_sends(
    stream_endpoint: StreamEndpoint,
) -> None:
    received = stream_endpoint.read_next_connection()
    with stream_endpoint.make_sender() as sender:
        for i in range(10):
            sender.send("events", b"v", timestamp_ms=i)

    assert len(received.result(RECEIVE_TIMEOUT_S)) == 10
    stream_endpoint.listener.setblocking(False)
    with pytest.raises(BlockingIOError):
        stream_endpoint.listener.accept()


def test_send_on_a_closed_stream_sender_is_an_error(stream_endpoint: StreamEndpoint) -> None:
    sender = stream_endpoint.make_sender()
    sender.close()
    with pytest.raises(ValueError, match="closed"):
        sender.send("events", b"v")


def test_send_on_a_closed_datagram_sender_is_an_error(datagram_path: str) -> None:
    sender = DatagramSender(datagram_path)
    sender.close()
    with pytest.raises(ValueError, match="closed"):
        sender.send("events", b"v")


def test_unix_stream_sender_to_a_missing_socket_raises_daemon_unavailable(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "missing.sock")
    with UnixStreamSender(path) as sender, pytest.raises(DaemonUnavailable) as raised:
        sender.send("events", b"v")

    message = str(raised.value)
    assert f"UNIX stream socket {path} does not exist" in message
    assert "inputSources/unixStream" in message


def test_unix_stream_sender_to_a_plain_file_raises_daemon_unavailable(tmp_path: Path) -> None:
    path = tmp_path / "plain-file"
    path.write_text("not a socket")

    with UnixStreamSender(str(path)) as sender, pytest.raises(DaemonUnavailable) as raised:
        sender.send("events", b"v")

    assert f"{path} is not a socket" in str(raised.value)


def test_tcp_sender_to_a_closed_port_raises_daemon_unavailable() -> None:
    # A bound socket that does not listen holds the port, and refuses connections.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as not_listening:
        not_listening.bind(("127.0.0.1", 0))
        port = not_listening.getsockname()[1]
        with TcpSender(port) as sender, pytest.raises(DaemonUnavailable) as raised:
            sender.send("events", b"v")

    message = str(raised.value)
    assert f"TCP port 127.0.0.1:{port} refused the connection" in message
    assert "inputSources/tcp" in message


def test_unix_stream_sender_reconnects_once_after_a_daemon_restart(
    tmp_path: Path, executor: ThreadPoolExecutor
) -> None:
    path = str(tmp_path / "stream.sock")
    with unix_listener(path) as listener, UnixStreamSender(path) as sender:
        sender.send("events", b"first", timestamp_ms=1)
        first_connection, _ = listener.accept()
        first_connection.close()  # the daemon drops the connection, e.g. on a restart

        received = executor.submit(read_stream, listener)
        sender.send("events", b"second", timestamp_ms=2)
        sender.close()

        assert [m.value for m in received.result(RECEIVE_TIMEOUT_S)] == [b"second"]


def test_unix_stream_sender_raises_when_the_daemon_went_away(tmp_path: Path) -> None:
    path = str(tmp_path / "stream.sock")
    listener = unix_listener(path)
    with UnixStreamSender(path) as sender:
        sender.send("events", b"first")
        connection, _ = listener.accept()
        connection.close()
        listener.close()  # the daemon stopped: its socket file remains, nobody listens

        with pytest.raises(DaemonUnavailable) as raised:
            sender.send("events", b"second")

    # The broken pipe is retried once on a fresh connection, which nobody accepts.
    assert f"UNIX stream socket {path} refused the connection" in str(raised.value)


def test_a_write_cut_off_midway_is_reported_not_resent(tmp_path: Path) -> None:
    """The daemon may hold part of a cut-off write: resending could duplicate messages."""
    path = str(tmp_path / "stream.sock")
    listener = unix_listener(path)
    # 8 MiB cannot fit in the socket buffers, so the sender is still writing when the
    # peer closes after reading the first 100 kB of it: the write fails part-way.
    big_write = [encode_message("events", bytes(1 << 20))] * 8

    def read_some_then_close() -> None:
        connection, _ = listener.accept()
        with connection:
            received = 0
            while received < 100_000 and (chunk := connection.recv(1 << 16)):
                received += len(chunk)
        listener.close()

    peer = threading.Thread(target=read_some_then_close)
    peer.start()
    try:
        with UnixStreamSender(path) as sender:
            sender.send("events", b"first")  # the connection is now a kept one
            with pytest.raises(DaemonUnavailable) as raised:
                sender.send_many(big_write)
    finally:
        peer.join()

    assert f"UNIX stream socket {path} was closed by the daemon" in str(raised.value)


def send_repeatedly(sender: TcpSender, times: int) -> None:
    for _ in range(times):
        sender.send("events", b"more")


def test_tcp_sender_raises_once_the_daemon_reset_the_connection() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    with TcpSender(port) as sender:
        sender.send("events", b"first")
        connection, _ = listener.accept()
        connection.close()
        listener.close()
        # TCP learns of the close only from the reset that answers a later write, so the
        # first write after the close may still be taken by the kernel.
        with pytest.raises(DaemonUnavailable):
            send_repeatedly(sender, 100)


def test_a_vanished_peer_does_not_kill_a_process_that_restored_sigpipe(tmp_path: Path) -> None:
    """Writes use MSG_NOSIGNAL: an application with SIGPIPE's default action survives."""
    path = str(tmp_path / "stream.sock")
    program = f"""
import signal, socket
from pydory.client import UnixStreamSender
from pydory.errors import DaemonUnavailable
signal.signal(signal.SIGPIPE, signal.SIG_DFL)
listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
listener.bind({path!r}); listener.listen()
sender = UnixStreamSender({path!r})
sender.send("events", b"first")
listener.accept()[0].close(); listener.close()
try:
    sender.send("events", b"second")
except DaemonUnavailable:
    print("raised DaemonUnavailable")
"""
    result = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "raised DaemonUnavailable"


# --- PydoryLogHandler ------------------------------------------------------------------------


@pytest.fixture
def make_logger() -> Iterator[Callable[[logging.Handler], logging.Logger]]:
    """Loggers of their own, so that records reach only the handler under test."""
    created: list[tuple[logging.Logger, logging.Handler]] = []

    def make(handler: logging.Handler) -> logging.Logger:
        logger = logging.getLogger(f"pydory-test.{uuid.uuid4().hex}")
        logger.propagate = False
        logger.setLevel(logging.DEBUG)
        logger.addHandler(handler)
        created.append((logger, handler))
        return logger

    yield make
    for logger, handler in created:
        logger.removeHandler(handler)
        handler.close()


def test_log_records_arrive_as_messages_on_the_topic(
    datagram_path: str,
    datagram_receiver: socket.socket,
    make_logger: Callable[[logging.Handler], logging.Logger],
) -> None:
    handler = PydoryLogHandler(datagram_path, "app.logs")
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    logger = make_logger(handler)

    before = now_ms()
    logger.warning("disk %s is %d%% full", "/var", 93)
    after = now_ms()

    message = receive_datagram(datagram_receiver)
    assert message.topic == "app.logs"
    assert message.value == b"WARNING disk /var is 93% full"
    assert message.partition_key is None
    assert before - 1 <= message.timestamp_ms <= after  # the record's own creation time
    assert handler.dropped == 0


def test_log_handler_sends_utf8(
    datagram_path: str,
    datagram_receiver: socket.socket,
    make_logger: Callable[[logging.Handler], logging.Logger],
) -> None:
    make_logger(PydoryLogHandler(datagram_path, "app.logs")).info("café ☕")

    assert receive_datagram(datagram_receiver).value == "café ☕".encode()


def test_json_log_formatter_writes_one_json_object(
    datagram_path: str,
    datagram_receiver: socket.socket,
    make_logger: Callable[[logging.Handler], logging.Logger],
) -> None:
    handler = PydoryLogHandler(datagram_path, "app.logs", key=b"host-1")
    handler.setFormatter(JsonLogFormatter())
    logger = make_logger(handler)

    error = RuntimeError("boom")
    logger.error("request %s failed", "r-17", exc_info=(RuntimeError, error, None))

    message = receive_datagram(datagram_receiver)
    fields = json.loads(message.value)
    assert message.key == b"host-1"
    assert fields["level"] == "ERROR"
    assert fields["logger"] == logger.name
    assert fields["message"] == "request r-17 failed"
    assert "RuntimeError: boom" in fields["exception"]
    assert fields["time"].endswith("+00:00")


def test_log_handler_without_a_daemon_drops_silently(
    datagram_path: str,
    make_logger: Callable[[logging.Handler], logging.Logger],
    capsys: pytest.CaptureFixture[str],
) -> None:
    handler = PydoryLogHandler(datagram_path, "app.logs")
    logger = make_logger(handler)

    logger.info("one")
    logger.info("two")

    assert handler.dropped == 2
    assert capsys.readouterr().err == ""


def fill_receive_queue(path: str) -> list[socket.socket]:
    """Queue datagrams at ``path`` until the receiver's queue refuses more (EAGAIN).

    Each filler socket also has its own send buffer limit; the queue is full only when
    a fresh socket's very first datagram is refused. Returns the fillers to close later.
    """
    fillers: list[socket.socket] = []
    for _ in range(10_000):
        filler = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        filler.setblocking(False)
        fillers.append(filler)
        sent = 0
        try:
            while sent < 10_000:
                filler.sendto(b"x", path)
                sent += 1
        except BlockingIOError:
            if sent == 0:
                return fillers
    raise AssertionError("the receive queue never filled up")


def drain(receiver: socket.socket) -> None:
    """Read every queued datagram, leaving ``receiver`` as it was."""
    timeout = receiver.gettimeout()
    receiver.setblocking(False)
    try:
        while True:
            receiver.recv(MAX_DATAGRAM)
    except BlockingIOError:
        pass
    finally:
        receiver.settimeout(timeout)


def test_log_handler_with_a_full_queue_waits_its_bound_then_drops(
    datagram_path: str,
    datagram_receiver: socket.socket,
    make_logger: Callable[[logging.Handler], logging.Logger],
    capsys: pytest.CaptureFixture[str],
) -> None:
    handler = PydoryLogHandler(datagram_path, "app.logs", block_s=0.05)
    logger = make_logger(handler)
    fillers = fill_receive_queue(datagram_path)
    try:
        logger.info("into a full queue")  # waits 50 ms for room that never comes
        assert handler.dropped == 1
        assert capsys.readouterr().err == ""

        drain(datagram_receiver)  # the daemon catches up
        logger.info("after the queue drained")
    finally:
        for filler in fillers:
            filler.close()

    assert receive_datagram(datagram_receiver).value == b"after the queue drained"
    assert handler.dropped == 1


def test_a_stuck_daemon_costs_the_application_one_wait_not_one_per_record(
    datagram_path: str,
    datagram_receiver: socket.socket,
    make_logger: Callable[[logging.Handler], logging.Logger],
) -> None:
    block_s = 0.5
    handler = PydoryLogHandler(datagram_path, "app.logs", block_s=block_s)
    logger = make_logger(handler)
    fillers = fill_receive_queue(datagram_path)
    try:
        started = time.monotonic()
        with SchedulingDelay() as lateness:
            for n in range(20):
                logger.info("record %d", n)
        elapsed = time.monotonic() - started

        drain(datagram_receiver)
        logger.info("after the daemon recovered")
    finally:
        for filler in fillers:
            filler.close()

    assert handler.dropped == 20
    # One wait, not twenty (10 s); a busy machine's lateness added to the margin.
    assert block_s <= elapsed < block_s + lateness.margin_s(4 * block_s)
    assert receive_datagram(datagram_receiver).value == b"after the daemon recovered"


def test_log_handler_drops_a_record_too_large_for_a_datagram(
    datagram_path: str,
    datagram_receiver: socket.socket,
    make_logger: Callable[[logging.Handler], logging.Logger],
    capsys: pytest.CaptureFixture[str],
) -> None:
    handler = PydoryLogHandler(datagram_path, "app.logs")
    logger = make_logger(handler)

    logger.info("x" * (1 << 20))
    logger.info("small")

    assert handler.dropped == 1
    assert capsys.readouterr().err == ""
    assert receive_datagram(datagram_receiver).value == b"small"


def test_log_handler_recovers_when_the_daemon_comes_back(
    datagram_path: str, make_logger: Callable[[logging.Handler], logging.Logger]
) -> None:
    handler = PydoryLogHandler(datagram_path, "app.logs")
    logger = make_logger(handler)
    logger.info("while the daemon is down")

    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as receiver:
        receiver.bind(datagram_path)
        receiver.settimeout(RECEIVE_TIMEOUT_S)
        logger.info("after it started")
        assert receive_datagram(receiver).value == b"after it started"
    assert handler.dropped == 1


def test_log_handler_reports_a_formatting_bug_the_standard_way(
    datagram_path: str,
    datagram_receiver: socket.socket,
    make_logger: Callable[[logging.Handler], logging.Logger],
    capsys: pytest.CaptureFixture[str],
) -> None:
    handler = PydoryLogHandler(datagram_path, "app.logs")
    logger = make_logger(handler)

    logger.info("%d items", "not a number")  # an application bug, not a delivery problem

    assert "--- Logging error ---" in capsys.readouterr().err
    assert handler.dropped == 0


def test_log_handler_refuses_a_bad_topic_up_front(datagram_path: str) -> None:
    with pytest.raises(BadTopic):
        PydoryLogHandler(datagram_path, "bad topic")
