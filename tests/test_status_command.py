"""`pydory status`: tables from a real daemon's pages, Dory's JSON, --json, unreachable."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from helpers import settled, wait_until
from pydory.cli import main
from pydory.client import UnixStreamSender
from pydory.commands.status import (
    _received_and_pool,
    byte_size,
    discards_by_reason,
    duration,
    render_config,
    render_discards,
    render_metadata,
    render_queues,
    table,
)
from pydory_tools.testing.daemon import DaemonConfig, RunningDaemon, running_daemon
from pydory_tools.testing.mock_cluster import MockCluster
from pydory_tools.testing.ports import free_loopback_port

SAMPLES = Path(__file__).parent / "data" / "dory_http_samples"


def sample(name: str) -> Any:
    return json.loads((SAMPLES / name).read_text())


def rows_of(output: str) -> dict[str, list[str]]:
    """Table rows by their first cell (lines split on whitespace)."""
    return {fields[0]: fields[1:] for fields in map(str.split, output.splitlines()) if fields}


def test_status_is_a_command_with_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["status", "--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: pydory status")
    for view in ("counters", "discards", "queues", "metadata", "books", "--json", "--url"):
        assert view in out


# --- formatting ----------------------------------------------------------------------------


def test_a_table_aligns_numbers_right_and_text_left() -> None:
    text = table(["TOPIC", "COUNT"], [["a", 5], ["longer-topic", 12345]])
    assert text.splitlines() == [
        "TOPIC         COUNT",
        "a                 5",
        "longer-topic  12345",
    ]


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [(0, "0 s"), (45.9, "45 s"), (185, "3m 05s"), (7380, "2h 03m"), (4 * 86400 + 25200, "4d 07h")],
)  # fmt: skip
def test_durations_read_like_a_person_says_them(seconds: float, shown: str) -> None:
    assert duration(seconds) == shown


def test_sizes_use_binary_units() -> None:
    assert [byte_size(n) for n in (812, 1536, 64 * 1024 * 1024)] == ["812 B", "1.5 KiB", "64.0 MiB"]


def test_discards_by_reason_come_from_the_counters_with_kafka_error_names() -> None:
    page = {
        "counters": [
            {"location": "", "name": "accepted", "value": 9},
            {"location": "", "name": "discarded_rate_limit", "value": 3},
            {"location": "", "name": "discarded_kafka_error", "value": 2},
            {"location": "", "name": "discarded_kafka_error_MSG_SIZE_TOO_LARGE", "value": 2},
            {"location": "", "name": "discarded_bad_topic", "value": 0},
        ]
    }
    assert discards_by_reason(page) == {
        "rate_limit": 3,
        "kafka_error": 2,
        "kafka_error: MSG_SIZE_TOO_LARGE": 2,
    }


# --- Dory's own JSON (the samples from Dory 3.2.6) -----------------------------------------


def test_dorys_queue_page_renders_with_totals() -> None:
    page = sample("tansu_queues_json.txt")
    rows = rows_of(render_queues(page))
    assert rows["dory_test"] == ["0", "0", "24"]
    assert rows["total:"] == ["24"]
    page["sending"].append({"topic": "other", "batch": 1, "send_wait": 2, "ack_wait": 3})
    assert rows_of(render_queues(page))["(all"] == ["topics)", "1", "2", "27"]


def test_dorys_discard_report_renders_its_topics() -> None:
    text = render_discards(sample("mock_discards_json.txt"))
    assert "CURRENT PERIOD (report 0" in text
    assert rows_of(text)["dory_test"][0] == "23"
    duplicates = render_discards(sample("tansu_discards_json.txt"))
    assert "possible duplicates, per topic:" in duplicates
    assert rows_of(duplicates)["dory_test"][0] == "72"


def test_dorys_metadata_page_renders_times_and_ages() -> None:
    text = render_metadata(sample("mock_nc_metadata_fetch_time_json.txt"))
    assert text.splitlines()[0].endswith("(19 s ago)")  # now - last_updated = 19.967 s


def test_before_the_first_metadata_the_status_says_there_is_none_yet() -> None:
    page = {**sample("mock_nc_metadata_fetch_time_json.txt"), "last_updated": 0}
    page["last_modified"] = 0
    assert render_metadata(page).startswith("metadata: no metadata yet")


def test_messages_held_for_metadata_are_counted_in_words() -> None:
    """Issue 32 point 5: "1 message", never "1 messages"."""
    books = {
        "received": {"unix_stream": 2},
        "pool": {"used": 0, "budget": 1024, "percent_time_depleted": 0.0},
        "metadata_known": False,
    }
    for waiting, words in ((1, "1 message"), (2, "2 messages")):
        text = _received_and_pool({**books, "waiting_for_metadata": waiting})
        assert f"no metadata yet: {words} held in memory" in text, text


# --- a real daemon -------------------------------------------------------------------------


@pytest.fixture
def socket_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    # UNIX socket paths are limited to ~108 bytes: keep them short.
    return str(tmp_path_factory.mktemp("s", numbered=True))


@pytest.fixture
def topic(mock_cluster: MockCluster, unique_topic: Callable[[str], str]) -> str:
    name = unique_topic("stcmd")
    mock_cluster.create_topic(name, 2)
    return name


@pytest.fixture
def daemon_config(mock_cluster: MockCluster, socket_dir: str, topic: str) -> DaemonConfig:
    return DaemonConfig(
        mock_cluster.bootstrap_servers, socket_dir, rate_limits={topic: (60_000, 7)}
    )


@pytest.fixture
def busy_daemon(daemon_config: DaemonConfig, topic: str) -> Iterator[RunningDaemon]:
    """A daemon that delivered 7 messages of ``topic``, rate-limited 3 and saw 2 bad topics."""
    with running_daemon(daemon_config) as daemon:
        with UnixStreamSender(daemon_config.stream_path) as stream:
            for n in range(10):
                stream.send(topic, b"m%d" % n)
            stream.send("no-such-topic", b"x")
            stream.send("no-such-topic", b"y")
        wait_until(settled(daemon, topic, 7), what="7 deliveries")
        wait_until(lambda: daemon.snapshot()["discards"]["bad_topic"] == 2, what="bad topics")
        yield daemon


def status(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["status", *args])
    out, err = capsys.readouterr()
    return code, out, err


def url_of(daemon: RunningDaemon) -> str:
    return f"http://127.0.0.1:{daemon.daemon_config.http_port}"


def test_the_summary_shows_topics_discards_queues_and_metadata(
    busy_daemon: RunningDaemon, topic: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = status(capsys, "--url", url_of(busy_daemon))
    assert (code, err) == (0, "")
    rows = rows_of(out)
    #                 accepted delivered discarded in-flight
    assert rows[topic] == ["7", "7", "3", "0"]
    assert "no-such-topic" not in rows  # a bad topic has no books of its own
    assert rows["rate_limit"] == ["3"]
    assert rows["bad_topic"] == ["2"]
    assert out.startswith("pydory ")
    assert "memory pool: 0 B of 64.0 MiB used (0.0 %)" in out
    assert "QUEUES" in out
    assert "metadata last fetched: 20" in out  # a date, not "never"
    assert "config: (given in memory), loaded 20" in out
    assert "reloads: 0 applied, 0 refused" in out


def test_each_view_prints_its_table(
    busy_daemon: RunningDaemon, topic: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url = url_of(busy_daemon)
    code, out, _ = status(capsys, "books", "--url", url)
    assert code == 0
    header = ["TOPIC", "ACCEPTED", "DELIVERED", "IN", "FLIGHT", "RATE_LIMIT"]
    assert out.splitlines()[0].split() == header
    assert rows_of(out)[topic] == ["7", "7", "0", "3"]
    code, out, _ = status(capsys, "counters", "--url", url)
    assert rows_of(out)["accepted"] == ["7"]
    assert rows_of(out)["delivered"] == ["7"]
    code, out, _ = status(capsys, "discards", "--url", url)
    assert "CURRENT PERIOD (report 0" in out
    assert "'no-such-topic'" in out  # recent bad topics
    topic_lines = [line.split() for line in out.splitlines() if topic in line]
    assert [fields[:2] for fields in topic_lines] == [[topic, "3"], [topic, "3"]]
    assert len(topic_lines[0]) == 6  # discarded: count, earliest and latest date and time
    code, out, _ = status(capsys, "metadata", "--url", url)
    assert out.startswith("metadata last fetched: 20")
    code, out, _ = status(capsys, "queues", "--url", url)
    assert code == 0
    assert "total:" in out


def test_json_prints_the_daemons_pages(
    busy_daemon: RunningDaemon, topic: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url = url_of(busy_daemon)
    code, out, _ = status(capsys, "--json", "--url", url)
    assert code == 0
    pages = json.loads(out)
    assert set(pages) == {"server_info", "books", "counters", "queues", "metadata", "config"}
    books = {t["topic"]: t for t in pages["books"]["topics"]}
    assert books[topic]["delivered"] == 7
    code, out, _ = status(capsys, "discards", "--json", "--url", url)
    assert json.loads(out)["unfinished_report"]["bad_topic_msg_count"] == 2


def test_the_url_can_come_from_the_config_file(
    busy_daemon: RunningDaemon,
    daemon_config: DaemonConfig,
    topic: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    config_path = tmp_path / "dory_conf.xml"
    config_path.write_text(daemon_config.render())
    code, out, _ = status(capsys, "books", "--config-path", str(config_path))
    assert code == 0
    assert rows_of(out)[topic][:2] == ["7", "7"]


# --- failures ------------------------------------------------------------------------------


def test_an_unreachable_daemon_is_exit_2_with_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = f"http://127.0.0.1:{free_loopback_port()}"
    code, out, err = status(capsys, "--url", url)
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1
    assert err.startswith(f"pydory status: cannot reach the daemon at {url}/")


def test_a_bad_config_file_is_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = status(capsys, "--config-path", str(tmp_path / "missing.xml"))
    assert code == 1
    assert "missing.xml" in err


class FakeDaemon:
    """A status server with fixed pages, to test what a real daemon cannot show."""

    def __init__(self, pages: Mapping[str, Any]) -> None:
        self.pages = pages

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # http.server's naming
                page = pages.get(self.path)
                if page is None:
                    self.send_error(404)
                    return
                body = page if isinstance(page, bytes) else json.dumps(page).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


@pytest.fixture
def fake_daemon() -> Iterator[Callable[[Mapping[str, Any]], FakeDaemon]]:
    started: list[FakeDaemon] = []

    def start(pages: Mapping[str, Any]) -> FakeDaemon:
        started.append(FakeDaemon(pages))
        return started[-1]

    yield start
    for daemon in started:
        daemon.close()


BOOKS = {
    "pid": 1, "version": "x", "since": 1795246677, "now": 1795246741,
    "topics": [], "received": {"unix_dgram": 0, "unix_stream": 0, "tcp": 0},
    "pool": {"budget": 1024, "used": 0, "available": 1024, "percent_time_depleted": 0.0},
}  # fmt: skip


def test_the_config_view_tells_a_refused_reload_and_what_waits_for_a_restart() -> None:
    page = {
        "pid": 1, "version": "x", "since": 1795246000, "now": 1795246741,
        "path": "/etc/pydory/pydory.xml", "loaded_at": 1795246600.5,
        "reloads": {"attempted": 3, "succeeded": 2, "failed": 1},
        "last_reload": {
            "attempt": 3, "ok": False, "at": 1795246700.0, "changed": [],
            "errors": ["/doryConfig/logging/level: 'LOUD' is not a level (line 3, column 9)"],
            "restart_needed": [],
        },
    }  # fmt: skip
    lines = render_config(page).splitlines()
    assert lines[0].startswith("config: /etc/pydory/pydory.xml, loaded 20")
    assert lines[0].endswith("(2m 20s ago)")
    assert lines[1] == "reloads: 2 applied, 1 refused"
    assert lines[2].startswith("last reload: REFUSED at 20")
    assert lines[2].endswith("(41 s ago); running on the config loaded before:")
    assert lines[3] == "  /doryConfig/logging/level: 'LOUD' is not a level (line 3, column 9)"
    applied = {
        **page,
        "last_reload": {
            **page["last_reload"],  # type: ignore[dict-item]
            "ok": True,
            "errors": [],
            "changed": ["compression"],
            "restart_needed": ["spool"],
        },
    }
    lines = render_config(applied).splitlines()
    assert lines[2].endswith("ago): compression")
    assert lines[3] == "  <spool> changed in the file: takes effect at the next restart"


def test_a_daemon_without_queues_is_summarised_with_a_note(
    fake_daemon: Callable[[Mapping[str, Any]], FakeDaemon], capsys: pytest.CaptureFixture[str]
) -> None:
    daemon = fake_daemon(
        {
            "/server_info/json": sample("mock_nc_server_info_json.txt"),
            "/books/json": BOOKS,
            "/counters/json": sample("mock_counters_json_excerpt.txt"),
            "/metadata_fetch_time/json": sample("mock_nc_metadata_fetch_time_json.txt"),
        }
    )
    code, out, _ = status(capsys, "--url", daemon.url)
    assert code == 0
    assert "QUEUES: not available (this daemon serves no /queues/json)" in out
    assert "TOPICS: none yet" in out
    assert "DISCARDS since start: none" in out


def test_an_answer_that_is_not_a_status_page_is_exit_1(
    fake_daemon: Callable[[Mapping[str, Any]], FakeDaemon], capsys: pytest.CaptureFixture[str]
) -> None:
    daemon = fake_daemon(
        {"/counters/json": b"<html>Dory's index page</html>", "/queues/json": {"pid": 1}}
    )
    code, _, err = status(capsys, "counters", "--url", daemon.url)
    assert code == 1
    assert "did not answer with JSON" in err
    code, _, err = status(capsys, "queues", "--url", daemon.url)
    assert code == 1
    assert "lacks the field 'sending'" in err
    code, _, err = status(capsys, "books", "--url", daemon.url)
    assert code == 1
    assert "/books/json does not exist (404)" in err
