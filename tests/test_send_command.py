"""`pydory send` end to end: the command line writes to a real socket, a test receiver decodes."""

from __future__ import annotations

import io
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from pydory.cli import main
from pydory.wire import Message
from receivers import RECEIVE_TIMEOUT_S, read_stream, receive_datagram

StreamReceiver = tuple[list[str], Callable[[], Future[list[Message]]], socket.socket]


@pytest.fixture(params=["unix-stream", "tcp"])
def stream_receiver(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StreamReceiver]:
    """The transport options for `pydory send`, a way to read one connection, the listener."""
    if request.param == "unix-stream":
        path = str(tmp_path / "stream.sock")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        listener.listen()
        options = ["--stream-socket-path", path]
    else:
        listener = socket.create_server(("127.0.0.1", 0))
        options = ["--port", str(listener.getsockname()[1])]
    listener.settimeout(RECEIVE_TIMEOUT_S)
    with ThreadPoolExecutor(max_workers=1) as pool, listener:
        # Reading in the background lets writes bigger than the socket buffers finish.
        yield options, lambda: pool.submit(read_stream, listener), listener


def test_send_over_a_datagram_socket(datagram_path: str, datagram_receiver: socket.socket) -> None:
    status = main(
        ["send", "--socket-path", datagram_path, "--topic", "events", "--key", "k", "--value", "v"]
    )

    assert status == 0
    message = receive_datagram(datagram_receiver)
    assert (message.topic, message.key, message.value, message.partition_key) == (
        "events",
        b"k",
        b"v",
        None,
    )


def test_send_with_a_partition_key_sends_a_partition_key_message(
    datagram_path: str, datagram_receiver: socket.socket
) -> None:
    status = main(
        ["send", "--socket-path", datagram_path, "--topic", "events", "--partition-key", "7"]
    )

    assert status == 0
    message = receive_datagram(datagram_receiver)
    assert message.partition_key == 7
    assert message.value == b""


def test_send_over_a_stream(stream_receiver: StreamReceiver) -> None:
    options, read_connection, _ = stream_receiver
    received = read_connection()

    status = main(["send", *options, "--topic", "events", "--value", "hello"])

    assert status == 0
    [message] = received.result(RECEIVE_TIMEOUT_S)
    assert (message.topic, message.value) == ("events", b"hello")


def test_send_stdin_reads_all_of_it_as_one_value(
    datagram_path: str, datagram_receiver: socket.socket, monkeypatch: pytest.MonkeyPatch
) -> None:
    value = b"line one\nline two\n\x00\xff binary too\n"
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(value)))

    status = main(["send", "--socket-path", datagram_path, "--topic", "events", "--stdin"])

    assert status == 0
    assert receive_datagram(datagram_receiver).value == value


def test_send_count_sends_that_many_datagrams(
    datagram_path: str, datagram_receiver: socket.socket
) -> None:
    options = ["--topic", "events", "--value", "v", "--count", "5"]
    status = main(["send", "--socket-path", datagram_path, *options])

    assert status == 0
    assert [receive_datagram(datagram_receiver).value for _ in range(5)] == [b"v"] * 5
    datagram_receiver.setblocking(False)
    with pytest.raises(BlockingIOError):
        datagram_receiver.recv(1)


def test_send_count_on_a_stream_uses_one_connection(stream_receiver: StreamReceiver) -> None:
    options, read_connection, listener = stream_receiver
    received = read_connection()

    # 30 copies of 100 kB: several batched writes.
    status = main(
        ["send", *options, "--topic", "events", "--value", "x" * 100_000, "--count", "30"]
    )

    assert status == 0
    messages = received.result(RECEIVE_TIMEOUT_S)
    assert len(messages) == 30
    assert all(m.value == b"x" * 100_000 for m in messages)
    listener.setblocking(False)
    with pytest.raises(BlockingIOError):
        listener.accept()


def test_send_to_a_missing_socket_exits_1_with_a_one_line_error(
    datagram_path: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main(["send", "--socket-path", datagram_path, "--topic", "events", "--value", "v"])

    assert status == 1
    error = capsys.readouterr().err
    assert error.count("\n") == 1
    assert error.startswith("pydory send: error: ")
    assert datagram_path in error
    assert "is pydory running?" in error


def test_send_of_a_datagram_too_large_exits_1(
    datagram_path: str,
    datagram_receiver: socket.socket,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(bytes(1 << 20))))

    status = main(["send", "--socket-path", datagram_path, "--topic", "events", "--stdin"])

    assert status == 1
    assert "does not fit in one datagram" in capsys.readouterr().err


@pytest.mark.parametrize(
    "transport",
    [[], ["--socket-path", "/tmp/a.sock", "--port", "9000"]],
    ids=["none", "two"],
)
def test_send_needs_exactly_one_transport(
    transport: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["send", *transport, "--topic", "events"])

    assert exited.value.code == 2
    assert "--socket-path" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("options", "complaint"),
    [
        (["--topic", "not a topic"], "characters outside"),
        (["--topic", "events", "--partition-key", str(2**32)], "does not fit in 32 bits"),
        (["--topic", "events", "--count", "0"], "must be at least 1"),
        (["--topic", "events", "--value", "v", "--stdin"], "not allowed with"),
    ],
)
def test_send_rejects_bad_options_before_sending(
    datagram_path: str,
    datagram_receiver: socket.socket,
    options: list[str],
    complaint: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["send", "--socket-path", datagram_path, *options])

    assert exited.value.code == 2
    assert complaint in capsys.readouterr().err
    datagram_receiver.setblocking(False)
    with pytest.raises(BlockingIOError):
        datagram_receiver.recv(1)


def test_pydory_send_as_an_installed_command(
    datagram_path: str, datagram_receiver: socket.socket
) -> None:
    pydory = Path(sys.executable).parent / "pydory"

    result = subprocess.run(
        [str(pydory), "send", "--socket-path", datagram_path, "--topic", "events", "--stdin"],
        input=b"from a shell pipe\n",
        capture_output=True,
        check=False,
    )

    assert result.returncode == 0, result.stderr
    assert receive_datagram(datagram_receiver).value == b"from a shell pipe\n"


def test_pydory_send_as_an_installed_command_fails_cleanly(datagram_path: str) -> None:
    pydory = Path(sys.executable).parent / "pydory"

    result = subprocess.run(
        [str(pydory), "send", "--socket-path", datagram_path, "--topic", "events"],
        capture_output=True,
        text=True,
        check=False,
    )

    assert result.returncode == 1
    assert result.stderr.startswith("pydory send: error: ")
    assert "Traceback" not in result.stderr
