"""`pydory send` end to end: the command line writes to a real socket, a test receiver decodes."""

from __future__ import annotations

import contextlib
import io
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from pydory.cli import main
from pydory.wire import Message, decode
from pydory_tools.testing.daemon_config import DaemonConfig
from receivers import MAX_DATAGRAM, RECEIVE_TIMEOUT_S, read_stream, receive_datagram

StreamReceiver = tuple[list[str], Callable[[], Future[list[Message]]], socket.socket]


@pytest.fixture
def executor() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(max_workers=1) as pool:
        yield pool


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


# --- --lines, --config-path, $PYDORY_SOCKET_PATH (issue 23 item 6) ----------------------------


def pydory_send(
    options: list[str], stdin: bytes = b"", env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`pydory send` as a shell runs it: its own process, stdin a real pipe."""
    pydory = Path(sys.executable).parent / "pydory"
    base_env = {k: v for k, v in os.environ.items() if k != "PYDORY_SOCKET_PATH"}
    return subprocess.run(
        [str(pydory), "send", *options],
        input=stdin.decode("latin-1"),
        encoding="latin-1",
        capture_output=True,
        env={**base_env, **(env or {})},
        timeout=60,
        check=False,
    )


def received_datagrams(receiver: socket.socket) -> list[Message]:
    """Every datagram queued at ``receiver`` now (the sender has exited)."""
    receiver.setblocking(False)
    messages = []
    with contextlib.suppress(BlockingIOError):
        while True:
            messages.append(decode(receiver.recv(MAX_DATAGRAM)))
    return messages


def test_send_lines_sends_each_line_as_a_message_over_a_datagram_socket(
    datagram_path: str, datagram_receiver: socket.socket
) -> None:
    # An empty line is an empty message; "\r\n" ends a line as "\n" does; the last line
    # needs no line ending (kafka-console-producer's readLine does the same).
    stdin = b"first\n\nthird\r\nlast without newline"
    options = ["--socket-path", datagram_path, "--topic", "events", "--key", "k", "--lines"]

    result = pydory_send(options, stdin)

    assert result.returncode == 0, result.stderr
    messages = received_datagrams(datagram_receiver)
    assert [m.value for m in messages] == [b"first", b"", b"third", b"last without newline"]
    assert {(m.topic, m.key) for m in messages} == {("events", b"k")}


def test_send_lines_over_a_stream_uses_one_connection(stream_receiver: StreamReceiver) -> None:
    options, read_connection, _ = stream_receiver
    received = read_connection()
    lines = [f"line {n}".encode() for n in range(20_000)]

    result = pydory_send([*options, "--topic", "events", "--lines"], b"\n".join(lines) + b"\n")

    assert result.returncode == 0, result.stderr
    assert [m.value for m in received.result(RECEIVE_TIMEOUT_S)] == lines


def test_send_lines_skips_a_line_over_the_limit_names_it_and_exits_1(
    datagram_path: str, datagram_receiver: socket.socket
) -> None:
    stdin = b"short\n" + b"x" * 101 + b"\n" + b"x" * 100 + b"\nafter\n"
    options = ["--socket-path", datagram_path, "--topic", "events", "--lines"]

    result = pydory_send([*options, "--max-line-bytes", "100"], stdin)

    assert result.returncode == 1
    assert result.stderr == ("pydory send: line 2 not sent: 101 bytes, over --max-line-bytes\n")
    values = [m.value for m in received_datagrams(datagram_receiver)]
    assert values == [b"short", b"x" * 100, b"after"]


def test_send_lines_skips_a_line_too_large_for_a_datagram(
    datagram_path: str, datagram_receiver: socket.socket
) -> None:
    stdin = b"before\n" + b"y" * 500_000 + b"\nafter\n"
    options = ["--socket-path", datagram_path, "--topic", "events", "--lines"]

    result = pydory_send(options, stdin)

    assert result.returncode == 1
    assert result.stderr.startswith("pydory send: line 2 not sent: ")
    assert "does not fit in one datagram" in result.stderr
    assert result.stderr.count("\n") == 1
    assert [m.value for m in received_datagrams(datagram_receiver)] == [b"before", b"after"]


def test_send_lines_refuses_count(datagram_path: str) -> None:
    options = ["--socket-path", datagram_path, "--topic", "events", "--lines", "--count", "2"]

    result = pydory_send(options)

    assert result.returncode == 2
    assert "--count does not apply to --lines" in result.stderr


def daemon_config(tmp_path: Path, config: DaemonConfig) -> Path:
    path = tmp_path / "pydory.xml"
    path.write_text(config.render())
    return path


@pytest.mark.parametrize("enabled", ["datagram", "stream", "tcp"])
def test_send_finds_the_input_in_the_daemons_config(
    tmp_path: Path, enabled: str, executor: ThreadPoolExecutor
) -> None:
    """--config-path: the datagram socket if the config enables it, else the stream socket,
    else the TCP port."""
    config = DaemonConfig(
        "127.0.0.1:9092",
        str(tmp_path),
        unix_datagram=enabled == "datagram",
        unix_stream=enabled in ("datagram", "stream"),
    )
    with contextlib.ExitStack() as stack:
        if enabled == "datagram":
            receiver = stack.enter_context(socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM))
            receiver.bind(config.datagram_path)
        elif enabled == "stream":
            receiver = stack.enter_context(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
            receiver.bind(config.stream_path)
            receiver.listen()
        else:
            receiver = stack.enter_context(socket.create_server(("127.0.0.1", config.tcp_port)))
        receiver.settimeout(RECEIVE_TIMEOUT_S)
        if enabled != "datagram":
            received = executor.submit(read_stream, receiver)
        options = ["--config-path", str(daemon_config(tmp_path, config)), "--topic", "events"]

        result = pydory_send([*options, "--value", enabled])

        assert result.returncode == 0, result.stderr
        if enabled == "datagram":
            [message] = received_datagrams(receiver)
        else:
            [message] = received.result(RECEIVE_TIMEOUT_S)
        assert message.value == enabled.encode()


def test_send_with_a_config_without_a_usable_input_says_so(tmp_path: Path) -> None:
    # Only a TCP port the daemon's kernel chooses (0): nothing a client can find.
    config = DaemonConfig(
        "127.0.0.1:9092", str(tmp_path), unix_datagram=False, unix_stream=False, tcp_port=0
    )

    result = pydory_send(["--config-path", str(daemon_config(tmp_path, config)), "--topic", "t"])

    assert result.returncode == 1
    assert result.stderr.count("\n") == 1
    assert "enables no input" in result.stderr


def test_send_with_an_invalid_config_names_the_problem(tmp_path: Path) -> None:
    result = pydory_send(["--config-path", str(tmp_path / "missing.xml"), "--topic", "events"])

    assert result.returncode == 1
    assert result.stderr.startswith("pydory send: error: ")
    assert "missing.xml" in result.stderr
    assert result.stderr.count("\n") == 1
    assert "Traceback" not in result.stderr


def test_send_uses_the_socket_in_the_environment(
    datagram_path: str, datagram_receiver: socket.socket
) -> None:
    result = pydory_send(
        ["--topic", "events", "--value", "from env"], env={"PYDORY_SOCKET_PATH": datagram_path}
    )

    assert result.returncode == 0, result.stderr
    assert receive_datagram(datagram_receiver).value == b"from env"


def test_a_transport_option_wins_over_the_environment(
    datagram_path: str, datagram_receiver: socket.socket, tmp_path: Path
) -> None:
    elsewhere = str(tmp_path / "not-this.sock")
    result = pydory_send(
        ["--socket-path", datagram_path, "--topic", "events", "--value", "option"],
        env={"PYDORY_SOCKET_PATH": elsewhere},
    )

    assert result.returncode == 0, result.stderr
    assert receive_datagram(datagram_receiver).value == b"option"
