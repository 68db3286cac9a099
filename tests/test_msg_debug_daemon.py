"""Message debugging on a running daemon: Dory's six URLs on the status port, the limits,
the dashboard's feed (mock cluster), and a message traced through all three files on Apache
Kafka itself."""

from __future__ import annotations

import base64
import json
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers import settled, wait_until
from pydory.client import DatagramSender, UnixStreamSender
from pydory.commands.status import DaemonUnreachable, StatusClient
from pydory_tools.testing.daemon import DaemonConfig, RunningDaemon, running_daemon
from pydory_tools.testing.kafka_broker import KafkaCluster
from pydory_tools.testing.kafka_util import consume_all
from pydory_tools.testing.mock_cluster import MockCluster

FILES = ("msg_receive", "msg_send", "msg_got_ack")
LINE = re.compile(
    r"ts: (?P<ts>-?\d+) topic: \d+\[(?P<topic>[^]]*)\] key: \d+\[(?P<key>[^]]*)\]"
    r" value: \d+\[(?P<value>[^]]*)\](?:( partition: (?P<partition>\d+))? now: \d+)?"
)
#: Dory's line exactly (debug_logger.cc), the default.
DORY_LINE = re.compile(r"ts: -?\d+ topic: \d+\[[^]]*\] key: \d+\[[^]]*\] value: \d+\[[^]]*\]")

_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass(frozen=True)
class Reply:
    status: int
    content_type: str
    body: str


def get(daemon: RunningDaemon, path: str) -> Reply:
    status = daemon.server.status
    assert status is not None
    request = urllib.request.Request(f"http://127.0.0.1:{status.port}{path}")
    try:
        with _opener.open(request, timeout=60) as response:
            return Reply(
                response.status, response.headers["Content-Type"], response.read().decode()
            )
    except urllib.error.HTTPError as error:
        return Reply(error.code, error.headers["Content-Type"], error.read().decode())


def answer(daemon: RunningDaemon, path: str) -> str:
    reply = get(daemon, path)
    assert reply.status == 200, reply
    assert reply.content_type == "text/plain; charset=utf-8"
    return reply.body


@dataclass(frozen=True)
class Traced:
    topic: str
    key: bytes
    value: bytes
    timestamp_ms: int
    partition: int | None


def read_lines(directory: Path, name: str) -> list[Traced]:
    path = directory / name
    if not path.exists():
        return []
    lines = []
    for text in path.read_text("ascii").splitlines():
        match = LINE.fullmatch(text)
        assert match is not None, text
        lines.append(
            Traced(
                match["topic"],
                base64.b64decode(match["key"]),
                base64.b64decode(match["value"]),
                int(match["ts"]),
                None if match["partition"] is None else int(match["partition"]),
            )
        )
    return lines


def lines_of(directory: Path) -> Callable[[], dict[str, list[Traced]]]:
    return lambda: {name: read_lines(directory, name) for name in FILES}


@pytest.fixture
def socket_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    # UNIX socket paths are limited to ~108 bytes: keep them short.
    return str(tmp_path_factory.mktemp("s", numbered=True))


# --- the URLs (mock cluster) -------------------------------------------------------------


@pytest.fixture
def mock_topics(mock_cluster: MockCluster, unique_topic: Callable[[str], str]) -> list[str]:
    names = [unique_topic("md-a"), unique_topic("md-b")]
    for name in names:
        mock_cluster.create_topic(name, 2)
    return names


@pytest.fixture
def debug_dir(tmp_path: Path) -> Path:
    return tmp_path / "msg-debug"


@pytest.fixture
def daemon(
    mock_cluster: MockCluster, socket_dir: str, mock_topics: list[str], debug_dir: Path
) -> Iterator[RunningDaemon]:
    config = DaemonConfig(mock_cluster.bootstrap_servers, socket_dir, msg_debug_path=str(debug_dir))
    with running_daemon(config) as running:
        yield running


def test_each_url_answers_as_dory_does(daemon: RunningDaemon, mock_topics: list[str]) -> None:
    a, b = mock_topics
    none = "No message debug topics are currently enabled\n"
    assert answer(daemon, "/msg_debug/get_topics") == none
    assert answer(daemon, f"/msg_debug/add_topic/{a}") == f"Enabled debug topic [{a}]\n"
    assert answer(daemon, f"/msg_debug/add_topic/{a}") == f"Failed to enable debug topic [{a}]\n"
    assert answer(daemon, f"/msg_debug/add_topic/{b}") == f"Enabled debug topic [{b}]\n"
    assert answer(daemon, "/msg_debug/get_topics") == "".join(
        f"topic: [{t}]\n" for t in sorted((a, b))
    )
    assert answer(daemon, f"/msg_debug/del_topic/{b}") == f"Disabled debug topic [{b}]\n"
    assert answer(daemon, f"/msg_debug/del_topic/{b}") == f"Failed to disable debug topic [{b}]\n"
    assert answer(daemon, "/msg_debug/get_topics") == f"topic: [{a}]\n"
    assert answer(daemon, "/msg_debug/add_all_topics") == "All message debug topics enabled\n"
    assert answer(daemon, "/msg_debug/get_topics") == (
        "All message debug topics are currently enabled\n"
    )
    # Dory refuses single-topic changes while "all topics" is on.
    assert answer(daemon, f"/msg_debug/del_topic/{a}") == f"Failed to disable debug topic [{a}]\n"
    assert answer(daemon, "/msg_debug/del_all_topics") == "All message debug topics disabled\n"
    assert answer(daemon, "/msg_debug/get_topics") == none
    assert answer(daemon, "/msg_debug/truncate_files") == "Message debug files truncated\n"


def test_selected_topics_fill_the_files_and_others_leave_no_line(
    daemon: RunningDaemon, mock_topics: list[str], debug_dir: Path
) -> None:
    a, b = mock_topics
    answer(daemon, f"/msg_debug/add_topic/{a}")
    with DatagramSender(daemon.daemon_config.datagram_path) as sender:
        for i in range(5):
            sender.send(a, b"traced-%d" % i, key=b"k%d" % i, timestamp_ms=1_000 + i)
            sender.send(b, b"untraced-%d" % i, timestamp_ms=2_000 + i)
    wait_until(settled(daemon, a, 5), what="a's deliveries")
    wait_until(settled(daemon, b, 5), what="b's deliveries")
    read = lines_of(debug_dir)
    wait_until(lambda: all(len(lines) == 5 for lines in read().values()), what="15 lines")
    for name, lines in read().items():
        assert {line.topic for line in lines} == {a}, name
        assert sorted(line.value for line in lines) == [b"traced-%d" % i for i in range(5)]
    assert answer(daemon, "/msg_debug/truncate_files") == "Message debug files truncated\n"
    wait_until(lambda: all(lines == [] for lines in read().values()), what="empty files")
    # Still tracing after truncate_files (as Dory's code does); off after del_topic.
    with DatagramSender(daemon.daemon_config.datagram_path) as sender:
        sender.send(a, b"after truncate")
    wait_until(lambda: len(read()["msg_got_ack"]) == 1, what="a line after truncation")
    answer(daemon, f"/msg_debug/del_topic/{a}")
    with DatagramSender(daemon.daemon_config.datagram_path) as sender:
        sender.send(a, b"after del_topic")
    wait_until(settled(daemon, a, 7), what="a's last delivery")
    time.sleep(0.3)
    assert all(len(lines) == 1 for lines in read().values()), read()


def test_the_dashboard_feed_shows_the_traced_topics(
    daemon: RunningDaemon, mock_topics: list[str], debug_dir: Path
) -> None:
    a, _ = mock_topics

    def feed() -> dict[str, object]:
        body = json.loads(answer_json(daemon))
        section = body["msg_debug"]
        assert isinstance(section, dict)
        return section

    assert feed()["topics"] == []
    assert feed()["all_topics"] is False
    answer(daemon, f"/msg_debug/add_topic/{a}")
    # The feed is a page like the others, reused for 100 ms.
    wait_until(lambda: feed()["topics"] == [a], 60, "the feed to show the topic")
    section = feed()
    assert section["directory"] == str(debug_dir)
    assert section["stopped"] is None
    assert isinstance(section["seconds_left"], float)


def test_add_topic_refuses_names_kafka_refuses(daemon: RunningDaemon) -> None:
    # NUL, '/', 5,000 characters, a space: each used to be selected (and kept) as a topic.
    for path, echoed in (
        ("%00", "\\x00"),
        ("a/b", "a/b"),
        ("a%20b", "a b"),
        ("x" * 5000, "x" * 249 + "..."),
    ):
        refused = f"Failed to enable debug topic [{echoed}]\n"
        assert answer(daemon, f"/msg_debug/add_topic/{path}") == refused
    assert answer(daemon, "/msg_debug/get_topics") == (
        "No message debug topics are currently enabled\n"
    )
    assert answer(daemon, "/msg_debug/add_topic/a.legal_name-1") == (
        "Enabled debug topic [a.legal_name-1]\n"
    )


def answer_json(daemon: RunningDaemon) -> str:
    reply = get(daemon, "/dashboard/json")
    assert reply.status == 200
    return reply.body


def test_the_byte_and_time_limits_stop_tracing(
    mock_cluster: MockCluster, socket_dir: str, mock_topics: list[str], tmp_path: Path
) -> None:
    a, _ = mock_topics
    config = DaemonConfig(
        mock_cluster.bootstrap_servers,
        socket_dir,
        msg_debug_path=str(tmp_path),
        msg_debug_byte_limit=1000,
        msg_debug_time_limit_s=2,
    )
    with running_daemon(config) as daemon, UnixStreamSender(config.stream_path) as sender:
        answer(daemon, f"/msg_debug/add_topic/{a}")
        for i in range(20):
            sender.send(a, b"v" * 40 + b"%02d" % i)
        wait_until(settled(daemon, a, 20), what="deliveries")
        none = "No message debug topics are currently enabled\n"
        assert answer(daemon, "/msg_debug/get_topics") == none
        feed = json.loads(answer_json(daemon))["msg_debug"]
        assert feed["stopped"] == "byteLimit reached (1000 bytes)"
        time.sleep(0.3)  # let the writer threads catch up
        total = sum((tmp_path / name).stat().st_size for name in FILES)
        assert 0 < total <= 1000
        # Time: on again, then nothing for two seconds.
        answer(daemon, f"/msg_debug/add_topic/{a}")
        wait_until(lambda: answer(daemon, "/msg_debug/get_topics") == none, 60, "the time limit")
        feed = json.loads(answer_json(daemon))["msg_debug"]
        assert feed["stopped"] == "timeLimit reached (2 s)"


def test_msg_debug_urls_say_it_is_off_when_disabled(
    mock_cluster: MockCluster, socket_dir: str, mock_topics: list[str]
) -> None:
    config = DaemonConfig(mock_cluster.bootstrap_servers, socket_dir)
    with running_daemon(config) as daemon:
        for path in (
            "/msg_debug/get_topics",
            "/msg_debug/add_all_topics",
            "/msg_debug/del_all_topics",
            "/msg_debug/truncate_files",
            f"/msg_debug/add_topic/{mock_topics[0]}",
            f"/msg_debug/del_topic/{mock_topics[0]}",
        ):
            reply = get(daemon, path)
            assert reply.status == 404, path
            assert reply.content_type == "text/plain; charset=utf-8"
            assert reply.body.startswith("message debugging is off"), reply.body
            assert "<msgDebug" in reply.body
        assert json.loads(answer_json(daemon))["msg_debug"] is None
        assert not daemon.server.msg_debug.active


def test_sigusr1_makes_a_serving_daemon_reopen_the_files(
    mock_cluster: MockCluster, socket_dir: str, mock_topics: list[str], tmp_path: Path
) -> None:
    a, _ = mock_topics
    debug_dir = tmp_path / "debug"
    config = DaemonConfig(
        mock_cluster.bootstrap_servers, socket_dir, tcp_port=None, msg_debug_path=str(debug_dir)
    )
    config_path = tmp_path / "dory_conf.xml"
    config_path.write_text(config.render())
    client = StatusClient(f"http://127.0.0.1:{config.http_port}", timeout_s=60)

    def written() -> int | None:
        try:
            page = client.get("/counters/json")
        except DaemonUnreachable:
            return None
        return next((c["value"] for c in page["counters"] if c["name"] == "msg_debug_written"), 0)

    def send(value: bytes) -> None:
        with DatagramSender(config.datagram_path) as sender:
            sender.send(a, value)

    daemon = subprocess.Popen(
        [sys.executable, "-m", "pydory", "serve", "--config-path", str(config_path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until(lambda: written() is not None, what="the daemon")
        request = urllib.request.Request(
            f"http://127.0.0.1:{config.http_port}/msg_debug/add_topic/{a}"
        )
        with _opener.open(request, timeout=60) as response:
            assert response.read() == f"Enabled debug topic [{a}]\n".encode()
        send(b"before rotation")
        wait_until(lambda: written() == 3, what="three lines")
        for name in FILES:  # logrotate's move, then its signal
            (debug_dir / name).rename(debug_dir / f"{name}.1")
        daemon.send_signal(signal.SIGUSR1)
        wait_until(lambda: all((debug_dir / name).exists() for name in FILES), what="reopen")
        send(b"after rotation")
        wait_until(lambda: written() == 6, what="three more lines")
    finally:
        daemon.terminate()
        assert daemon.wait(timeout=60) == 0
    for name in FILES:
        assert [line.value for line in read_lines(debug_dir, f"{name}.1")] == [b"before rotation"]
        assert [line.value for line in read_lines(debug_dir, name)] == [b"after rotation"]


# --- a message traced through all three files, on Apache Kafka -----------------------------


@pytest.mark.kafka
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_message_is_traced_through_all_three_files_on_kafka(
    kafka_broker: KafkaCluster, unique_topic: Callable[[str], str], socket_dir: str, tmp_path: Path
) -> None:
    traced_topic, other_topic = unique_topic("md-traced"), unique_topic("md-other")
    kafka_broker.create_topic(traced_topic, 3)
    kafka_broker.create_topic(other_topic, 3)
    config = DaemonConfig(
        kafka_broker.bootstrap_servers,
        socket_dir,
        msg_debug_path=str(tmp_path),
        msg_debug_extra_fields=True,  # the partition, to compare with Kafka's
    )
    sent = [
        (b"key-%d" % i if i % 2 else b"", b"value-\x00\xff-%d" % i, 1_795_000_000_000 + i)
        for i in range(6)
    ]
    with running_daemon(config) as daemon:
        assert answer(daemon, f"/msg_debug/add_topic/{traced_topic}") == (
            f"Enabled debug topic [{traced_topic}]\n"
        )
        with UnixStreamSender(config.stream_path) as sender:
            for i, (key, value, timestamp_ms) in enumerate(sent):
                sender.send(
                    traced_topic,
                    value,
                    key=key,
                    timestamp_ms=timestamp_ms,
                    partition_key=i if i >= 3 else None,  # both placements
                )
                sender.send(other_topic, b"not traced", timestamp_ms=timestamp_ms)
        wait_until(settled(daemon, traced_topic, 6), what="deliveries")
        wait_until(settled(daemon, other_topic, 6), what="deliveries")
        read = lines_of(tmp_path)
        wait_until(lambda: all(len(lines) == 6 for lines in read().values()), what="18 lines")
        lines = read()

    records = {r.value: r for r in consume_all(kafka_broker.bootstrap_servers, traced_topic, 6)}
    for key, value, timestamp_ms in sent:
        record = records[value]
        for name in FILES:
            [line] = [line for line in lines[name] if line.value == value]
            assert line.topic == traced_topic
            assert line.key == key
            assert line.timestamp_ms == timestamp_ms == record.timestamp_ms
            # Not known on receipt; where Kafka stored it, once handed to librdkafka.
            expected_partition = None if name == "msg_receive" else record.partition
            assert line.partition == expected_partition, (name, line)
    assert all(line.topic == traced_topic for name in FILES for line in lines[name])


@pytest.mark.kafka
def test_lines_are_dorys_and_msg_got_ack_has_the_clients_timestamp_on_a_log_append_topic(
    kafka_broker: KafkaCluster, unique_topic: Callable[[str], str], socket_dir: str, tmp_path: Path
) -> None:
    """Dory's lines, exactly, by default; and every file logs the client's timestamp, also
    where Kafka stamps the record with its own append time (pydory logged the broker's in
    msg_got_ack: the delivery report's timestamp is the log's)."""
    topic = unique_topic("md-append")
    kafka_broker.create_topic(topic, 1, config={"message.timestamp.type": "LogAppendTime"})
    config = DaemonConfig(kafka_broker.bootstrap_servers, socket_dir, msg_debug_path=str(tmp_path))
    client_ms = [1_700_000_000_000 + i for i in range(3)]
    with running_daemon(config) as daemon:
        answer(daemon, f"/msg_debug/add_topic/{topic}")
        with UnixStreamSender(config.stream_path) as sender:
            for i, timestamp_ms in enumerate(client_ms):
                sender.send(topic, b"v%d" % i, timestamp_ms=timestamp_ms)
        wait_until(settled(daemon, topic, 3), what="deliveries")
        read = lines_of(tmp_path)
        wait_until(lambda: all(len(lines) == 3 for lines in read().values()), what="9 lines")
        lines = read()

    records = consume_all(kafka_broker.bootstrap_servers, topic, 3)
    assert all(r.timestamp_ms > client_ms[-1] for r in records)  # the broker's append time
    for name in FILES:
        text = (tmp_path / name).read_text("ascii").splitlines()
        assert all(DORY_LINE.fullmatch(line) for line in text), text
        assert sorted(line.timestamp_ms for line in lines[name]) == client_ms, name
