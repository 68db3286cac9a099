"""The status pages of a real daemon (mock cluster), checked against Dory 3.2.6's outputs.

Dory's samples (tests/data/dory_http_samples, copied from shared/compat) fix the field
names and the plain-text layout; values differ run to run, so plain pages are compared
after replacing numbers and times by placeholders.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import struct
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from pydory import __version__
from pydory.client import DatagramSender
from pydory.errors import ConfigError
from pydory.status.server import PORT_CONFIG_PATH, RequestPacer, listen_hosts, paced, reused_briefly
from pydory.wire import encode_any_partition
from pydory_tools.testing.daemon import DaemonConfig, RunningDaemon, running_daemon
from pydory_tools.testing.mock_cluster import MockCluster

SAMPLES = Path(__file__).parent / "data" / "dory_http_samples"
PLAIN = "text/plain; charset=utf-8"
JSON = "application/json"
PAGES = ("server_info", "counters", "discards", "queues", "metadata_fetch_time")

# Direct connections only: a proxy from the environment must not see loopback requests.
_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass(frozen=True)
class Reply:
    status: int
    content_type: str
    body: str

    def json(self) -> Any:
        return json.loads(self.body)


def fetch(port: int, path: str, method: str = "GET") -> Reply:
    data = b"" if method == "POST" else None
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data, method=method)
    try:
        with _opener.open(request, timeout=60) as response:
            return Reply(
                response.status, response.headers["Content-Type"], response.read().decode()
            )
    except urllib.error.HTTPError as error:
        return Reply(error.code, error.headers["Content-Type"], error.read().decode())


def sample(name: str) -> str:
    return (SAMPLES / name).read_text()


def wait_until(condition: Callable[[], bool], timeout_s: float = 60.0, what: str = "") -> None:
    """Wait for an outcome the daemon reaches asynchronously (delivery reports, refresh)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or condition}")
        time.sleep(0.02)


def assert_keeps_dory_keys(ours: Any, dory: Any, where: str = "$") -> None:
    """Dory's keys, in Dory's order, at every level; pydory may only append new keys."""
    if isinstance(dory, dict):
        assert isinstance(ours, dict), where
        assert list(ours)[: len(dory)] == list(dory), where
        for key, value in dory.items():
            assert_keeps_dory_keys(ours[key], value, f"{where}.{key}")
    elif isinstance(dory, list):
        assert isinstance(ours, list), where
        if dory and ours:  # compare element shapes where both have one
            assert_keeps_dory_keys(ours[0], dory[0], f"{where}[0]")
    else:
        assert type(ours) is type(dory), f"{where}: {ours!r} vs {dory!r}"


_CTIME = re.compile(r"\w{3} \w{3} [ \d]\d \d\d:\d\d:\d\d \d{4}")


def layout(text: str) -> str:
    """A plain page with its values replaced: what must match Dory's sample."""
    text = re.sub(r"^version: .*$", "version: <version>", text, flags=re.MULTILINE)
    text = _CTIME.sub("<ctime>", text)
    return re.sub(r"\d+", "<n>", text)


@pytest.fixture
def socket_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    # UNIX socket paths are limited to ~108 bytes: keep them short.
    return str(tmp_path_factory.mktemp("s", numbered=True))


@pytest.fixture
def topic(mock_cluster: MockCluster, unique_topic: Callable[[str], str]) -> str:
    name = unique_topic("status")
    mock_cluster.create_topic(name, 2)
    return name


@pytest.fixture
def daemon(mock_cluster: MockCluster, socket_dir: str, topic: str) -> Iterator[RunningDaemon]:
    # Depends on ``topic`` so that the daemon's first metadata already has it.
    config = DaemonConfig(mock_cluster.bootstrap_servers, socket_dir, message_max_bytes=2000)
    with running_daemon(config) as running:
        yield running


def port_of(daemon: RunningDaemon) -> int:
    status = daemon.server.status
    assert status is not None
    return status.port


def request_metadata_update(port: int) -> Reply:
    """POST /metadata_update, then wait for the refresh it asks for.

    Waiting matters beyond the check: on Python 3.11, ``asyncio.wait_for`` swallows a
    cancellation that arrives as its awaitable completes, so stopping the daemon while
    the metadata task is waking up for this request can leave shutdown waiting on it.
    """
    before = fetch(port, "/metadata_fetch_time/json").json()["last_updated"]
    reply = fetch(port, "/metadata_update", "POST")
    wait_until(
        lambda: fetch(port, "/metadata_fetch_time/json").json()["last_updated"] > before,
        what="the requested metadata refresh",
    )
    return reply


def send_good_and_bad(daemon: RunningDaemon, topic: str) -> None:
    """5 good datagrams, 3 distinct malformed ones and 1 too long for Kafka (9 in all)."""
    path = daemon.daemon_config.datagram_path
    with DatagramSender(path) as sender:
        for i in range(5):
            sender.send(topic, b"good-%d" % i)
        sender.send(topic, b"y" * 5000)  # above messageMaxBytes (2000)
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as raw:
        for i in range(3):
            good = encode_any_partition(topic, b"bad-%d" % i)
            raw.sendto(struct.pack(">i", len(good) + 1) + good[4:], path)  # Size lies


# --- every URL ---------------------------------------------------------------------------


def test_every_url_answers_with_its_content_type(daemon: RunningDaemon) -> None:
    port = port_of(daemon)
    for page in (*PAGES, "books"):
        reply = fetch(port, f"/{page}/json")
        assert (reply.status, reply.content_type) == (200, JSON), page
        assert reply.json()["pid"] == os.getpid()
    for page in PAGES:
        reply = fetch(port, f"/{page}/plain")
        assert (reply.status, reply.content_type) == (200, PLAIN), page
        assert reply.body.startswith(f"pid: {os.getpid()}\nversion: {__version__}\n")
    reply = request_metadata_update(port)
    assert (reply.status, reply.content_type) == (200, PLAIN)
    assert reply.body.startswith("Metadata update initiated at ")


def test_unknown_url_is_a_404_naming_the_known_urls(daemon: RunningDaemon) -> None:
    reply = fetch(port_of(daemon), "/no/such/page")
    assert (reply.status, reply.content_type) == (404, PLAIN)
    assert "/no/such/page" in reply.body
    for url in ("GET /discards/json", "GET /books/json", "POST /metadata_update"):
        assert url in reply.body


# --- Dory's shapes -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("page", "sample_file"),
    [
        ("server_info", "mock_nc_server_info_json.txt"),
        ("metadata_fetch_time", "mock_nc_metadata_fetch_time_json.txt"),
        ("counters", "mock_counters_json_excerpt.txt"),
    ],
)
def test_json_pages_have_exactly_dorys_fields(
    daemon: RunningDaemon, topic: str, page: str, sample_file: str
) -> None:
    send_good_and_bad(daemon, topic)  # so that there are counters to list
    wait_until(lambda: fetch(port_of(daemon), "/counters/json").json()["counters"])
    ours = fetch(port_of(daemon), f"/{page}/json").json()
    dory = json.loads(sample(sample_file))
    assert list(ours) == list(dory)
    assert_keeps_dory_keys(ours, dory)
    assert ours["version"] == __version__
    assert ours["since"] == int(daemon.server.started_at)


def test_counters_json_lists_the_daemons_counters(daemon: RunningDaemon, topic: str) -> None:
    send_good_and_bad(daemon, topic)
    wait_until(lambda: daemon.call(lambda: daemon.server.counters.get("discarded_malformed")) == 3)
    counters = fetch(port_of(daemon), "/counters/json").json()["counters"]
    by_name = {c["name"]: c for c in counters}
    assert by_name["discarded_malformed"] == {
        "location": "[, 1]",  # Dory's location of a counter without one
        "name": "discarded_malformed",
        "value": 3,
    }
    assert by_name["received_unix_dgram"]["value"] == 9
    plain = fetch(port_of(daemon), "/counters/plain").body
    assert "\n[, 1].discarded_malformed=3\n" in plain.split("\n\n", 1)[1]


def test_discards_json_keeps_dorys_fields(daemon: RunningDaemon, topic: str) -> None:
    send_good_and_bad(daemon, topic)  # the too-long message fills "discard_topic"
    wait_until(
        lambda: fetch(port_of(daemon), "/discards/json").json()["unfinished_report"][
            "discard_topic"
        ]
    )
    ours = fetch(port_of(daemon), "/discards/json").json()
    dory = json.loads(sample("mock_discards_json.txt"))
    assert_keeps_dory_keys(ours, dory)
    assert ours["interval"] == 600
    assert ours["unfinished_report"]["discard_topic"][0]["topic"] == topic


@pytest.mark.parametrize(
    ("page", "sample_file"),
    [
        ("server_info", "mock_nc_server_info_plain.txt"),
        ("metadata_fetch_time", "mock_nc_metadata_fetch_time_plain.txt"),
    ],
)
def test_plain_pages_have_dorys_layout(daemon: RunningDaemon, page: str, sample_file: str) -> None:
    ours = fetch(port_of(daemon), f"/{page}/plain").body
    assert layout(ours) == layout(sample(sample_file))


def test_discards_plain_has_dorys_layout(daemon: RunningDaemon) -> None:
    # With no discards, Dory's page is its sample without the "discard topic" section.
    ours = fetch(port_of(daemon), "/discards/plain").body
    dory = sample("mock_discards_plain.txt").split("\n\n    discard topic:")[0] + "\n"
    assert layout(ours) == layout(dory)


def wait_for_queue_stats(daemon: RunningDaemon, topic: str) -> dict[str, Any]:
    """/queues/json once librdkafka's statistics list ``topic`` (every second) with a
    message held (Dory lists only such topics: make the brokers slow first)."""
    port = port_of(daemon)
    wait_until(
        lambda: any(q["topic"] == topic for q in fetch(port, "/queues/json").json()["sending"]),
        what=f"librdkafka's statistics listing {topic}",
    )
    return fetch(port, "/queues/json").json()  # type: ignore[no-any-return]


def slow_brokers(mock_cluster: MockCluster, rtt_ms: int = 3000) -> None:
    """Every broker answers ``rtt_ms`` late: delivered messages wait for their ACK."""
    for broker_id in mock_cluster.broker_ids:
        mock_cluster.set_rtt(broker_id, rtt_ms)


def test_queues_json_has_exactly_dorys_fields(
    daemon: RunningDaemon, mock_cluster: MockCluster, topic: str
) -> None:
    slow_brokers(mock_cluster)
    send_good_and_bad(daemon, topic)
    ours = wait_for_queue_stats(daemon, topic)
    dory = json.loads(sample("tansu_queues_json.txt"))
    assert list(ours) == list(dory)
    assert_keeps_dory_keys(ours, dory)
    (entry,) = [q for q in ours["sending"] if q["topic"] == topic]
    assert list(entry) == ["topic", "batch", "send_wait", "ack_wait"]
    assert ours["new"] == 0


def test_queues_plain_has_dorys_layout(
    daemon: RunningDaemon, mock_cluster: MockCluster, topic: str
) -> None:
    slow_brokers(mock_cluster)
    send_good_and_bad(daemon, topic)
    wait_for_queue_stats(daemon, topic)
    ours = fetch(port_of(daemon), "/queues/plain").body
    topic_lines = [line for line in ours.splitlines() if line.startswith("batch:")]
    assert len(topic_lines) == 1  # the test's only topic: as many lines as Dory's sample
    assert f"topic: [{topic}]" in topic_lines[0]

    # Numbers are right-aligned in 10 columns: compare with the padding taken out too.
    def padded_layout(text: str) -> str:
        return re.sub(r" *<n>", "<n>", layout(text))

    dory = sample("tansu_queues_plain.txt")
    assert padded_layout(ours.replace(topic, "dory_test")) == padded_layout(dory)


def test_queues_count_what_librdkafka_holds(
    daemon: RunningDaemon, mock_cluster: MockCluster, topic: str
) -> None:
    # Every broker answers 1.5 s late: delivered messages wait for their ACK meanwhile.
    for broker_id in mock_cluster.broker_ids:
        mock_cluster.set_rtt(broker_id, 1500)
    with DatagramSender(daemon.daemon_config.datagram_path) as sender:
        for i in range(50):
            sender.send(topic, b"slow-%d" % i)

    def held() -> int:
        queues = fetch(port_of(daemon), "/queues/json").json()
        return sum(q["batch"] + q["send_wait"] + q["ack_wait"] for q in queues["sending"])

    wait_until(lambda: held() > 0, what="messages in librdkafka's queues")
    assert held() <= 50
    for broker_id in mock_cluster.broker_ids:
        mock_cluster.set_rtt(broker_id, 0)
    wait_until(lambda: held() == 0, what="the queues to drain")
    plain = fetch(port_of(daemon), "/queues/plain").body
    assert plain.endswith("         0 total (all states: new + batch + send_wait + ack_wait)\n")
    # As Dory (TMsgStateTracker::GetStats): a topic with nothing held is not listed.
    assert "topic: [" not in plain
    assert fetch(port_of(daemon), "/queues/json").json()["sending"] == []


# --- what the pages report ---------------------------------------------------------------


def test_malformed_messages_show_in_discards_and_the_books_balance(
    daemon: RunningDaemon, topic: str
) -> None:
    send_good_and_bad(daemon, topic)

    def topic_settled() -> bool:
        books = fetch(port_of(daemon), "/books/json").json()
        totals = {t["topic"]: t for t in books["topics"]}.get(topic)
        return totals is not None and totals["delivered"] == 5 and totals["in_flight"] == 0

    wait_until(topic_settled, what="5 deliveries")
    current = fetch(port_of(daemon), "/discards/json").json()["unfinished_report"]
    assert current["malformed_msg_count"] == 3
    assert len(current["recent_malformed"]) == 3
    assert "malformed msg count: 3\n" in fetch(port_of(daemon), "/discards/plain").body

    books = fetch(port_of(daemon), "/books/json").json()
    (totals,) = [t for t in books["topics"] if t["topic"] == topic]
    assert totals == {
        "topic": topic,
        "accepted": 5,
        "delivered": 5,
        "discarded": {"too_long": 1},
        "discarded_after_acceptance": 0,
        "in_flight": 0,
        "possibly_delivered": 0,
        "left_for_next_start": 0,
    }
    assert books["received"] == {"unix_dgram": 9, "unix_stream": 0, "tcp": 0}
    assert books["pool"]["budget"] == 64 * 1024 * 1024
    assert books["pool"]["used"] == 0
    assert books["pool"]["available"] == books["pool"]["budget"]
    assert books["pool"]["percent_time_depleted"] == 0.0


def test_metadata_update_refreshes_the_metadata(daemon: RunningDaemon) -> None:
    port = port_of(daemon)
    times = fetch(port, "/metadata_fetch_time/json").json()
    before = times["last_updated"]
    assert before == daemon.call(lambda: daemon.server.metadata.last_updated_ms)
    assert times["now"] >= before  # this page's "now" is in milliseconds too
    assert request_metadata_update(port).status == 200
    last_updated = daemon.call(lambda: daemon.server.metadata.last_updated_ms)
    assert last_updated > before
    assert fetch(port, "/metadata_fetch_time/json").json()["last_updated"] == last_updated


# --- listening ---------------------------------------------------------------------------


def test_loopback_only_listens_on_loopback_addresses(daemon: RunningDaemon) -> None:
    status = daemon.server.status
    assert status is not None
    addresses = daemon.call(lambda: status.addresses)
    assert ("127.0.0.1", daemon.daemon_config.http_port) in addresses
    assert {host for host, _ in addresses} <= {"127.0.0.1", "::1"}
    assert {port for _, port in addresses} == {status.port}


def _listening_addresses(port: int) -> set[str]:
    """What the kernel says listens on TCP ``port``: hex local addresses from /proc/net."""
    listening = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as rows:
            next(rows)  # the header
            for row in rows:
                local, state = row.split()[1], row.split()[3]
                address, hex_port = local.split(":")
                if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                    listening.add(address)
    return listening


IPV4_LOOPBACK = "0100007F"  # 127.0.0.1, little-endian hex as /proc/net/tcp writes it
IPV6_LOOPBACK = "00000000000000000000000001000000"  # ::1


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux /proc/net")
def test_the_kernel_sees_only_loopback_listeners(daemon: RunningDaemon) -> None:
    listening = _listening_addresses(port_of(daemon))
    assert IPV4_LOOPBACK in listening
    assert listening <= {IPV4_LOOPBACK, IPV6_LOOPBACK}


def test_listen_hosts_are_loopback_or_every_interface() -> None:
    assert listen_hosts(loopback_only=True) == ("127.0.0.1", "::1")
    assert listen_hosts(loopback_only=False) == ("0.0.0.0", "::")


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.parametrize(
    ("family", "host"),
    [
        pytest.param(socket.AF_INET, "127.0.0.1", id="ipv4"),
        pytest.param(
            socket.AF_INET6,
            "::1",
            id="ipv6",
            marks=pytest.mark.skipif(not _has_ipv6_loopback(), reason="no IPv6 loopback"),
        ),
    ],
)
def test_a_busy_status_port_refuses_to_start(
    mock_cluster: MockCluster, socket_dir: str, family: socket.AddressFamily, host: str
) -> None:
    with socket.socket(family, socket.SOCK_STREAM) as squatter:
        squatter.bind((host, 0))
        squatter.listen()
        busy_port = squatter.getsockname()[1]
        config = DaemonConfig(mock_cluster.bootstrap_servers, socket_dir, http_port=busy_port)
        with pytest.raises(RuntimeError) as failure:
            RunningDaemon(config).start()
    error = failure.value.__cause__
    assert isinstance(error, ConfigError)
    assert error.path == PORT_CONFIG_PATH
    assert f"{host} port {busy_port}" in str(error)


# --- a flood of requests -----------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_pacer_lets_a_burst_through_then_spaces_requests() -> None:
    clock = FakeClock()
    pacer = RequestPacer(rate_per_s=10, burst=3, clock=clock)

    def waits(n: int) -> list[float]:
        return [round(pacer.reserve(), 9) for _ in range(n)]

    assert waits(5) == [0.0, 0.0, 0.0, 0.1, 0.2]
    clock.now += 0.3  # three slots have drained: one request may go at once again
    assert waits(2) == [0.0, 0.1]
    clock.now += 10  # idle: a whole burst again
    assert waits(4) == [0.0, 0.0, 0.0, 0.1]
    with pytest.raises(ValueError, match="positive rate"):
        RequestPacer(rate_per_s=0, burst=1)


def test_a_rendered_page_is_reused_briefly() -> None:
    clock = FakeClock()
    renders = iter(b"%d" % i for i in range(10))
    page = reused_briefly(lambda: next(renders), clock=clock)
    assert page() == b"0"
    clock.now += 0.05
    assert page() == b"0"
    clock.now += 0.06
    assert page() == b"1"
    assert page() == b"1"


def test_beyond_the_waiting_limit_requests_are_refused_with_503() -> None:
    from aiohttp import ClientSession
    from aiohttp.test_utils import TestServer

    async def hello(request: web.Request) -> web.StreamResponse:
        return web.Response(text="hi")

    async def flood() -> list[tuple[int, str | None]]:
        # A clock that stands still: one request goes, the next waits 1 s, the next 2 s;
        # with 2 requests waiting, the other 3 are refused at once.
        pacer = RequestPacer(rate_per_s=1, burst=1, clock=lambda: 0.0)
        app = web.Application(middlewares=[paced(pacer, max_waiting=2)])
        app.add_routes([web.get("/", hello)])
        async with TestServer(app, host="127.0.0.1") as server, ClientSession() as session:

            async def get() -> tuple[int, str | None]:
                async with session.get(server.make_url("/")) as response:
                    return response.status, response.headers.get("Retry-After")

            return await asyncio.gather(*(get() for _ in range(6)))

    replies = asyncio.run(flood())
    assert sorted(replies, key=str) == [(200, None)] * 3 + [(503, "1")] * 3
