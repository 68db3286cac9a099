"""The discard log file (Dory's <discardLogging>) and logDiscards (rate-limited log lines)."""

from __future__ import annotations

import base64
import logging
import os
import re
import signal
import socket
import stat
import struct
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers import wait_until
from pydory.client import UnixStreamSender
from pydory.commands.status import DaemonUnreachable, StatusClient
from pydory.config import parse_config
from pydory.config.model import LoggingConfig
from pydory.daemon.books.accounting import Books
from pydory.daemon.books.counters import (
    DISCARD_LOG_DROPPED,
    DISCARD_LOG_LOST,
    DISCARD_LOG_WRITTEN,
    Counters,
)
from pydory.daemon.books.discard_log import (
    DiscardLog,
    DiscardLogFile,
    DiscardLogLines,
    PossibleDuplicate,
    describe_discard,
    dory_info,
    format_line,
)
from pydory.daemon.books.discard_log import DiscardLogRotatingFile as RotatingFile
from pydory.daemon.books.events import DiscardEvent, DiscardReason, OpenOutcome, Transport
from pydory.daemon.logsetup import configure_logging
from pydory_tools.testing.daemon import DaemonConfig, running_daemon
from pydory_tools.testing.mock_cluster import MockCluster

NOW_MS = 1795246679301
TS_MS = 1795246679208

# Dory's line: now, ts, event, info, then length-prefixed topic, base64 key and message.
LINE = re.compile(
    rb"now: (\d+) ts: (\d+) event: (\S+) info: (\S+) "
    rb"topic: (\d+)\[(.*)\] key: (\d+)\[(.*)\] msg: (\d+)\[(.*)\]\n"
)


@dataclass(frozen=True)
class Line:
    now_ms: int
    timestamp_ms: int
    event: str
    info: str
    topic: str
    key: bytes
    message: bytes


def parse(line: bytes) -> Line:
    """One discard log line, checking every length prefix against its field."""
    match = LINE.fullmatch(line)
    assert match is not None, line
    now, ts, event, info, topic_len, topic, key_len, key, msg_len, msg = match.groups()
    assert (int(topic_len), int(key_len), int(msg_len)) == (len(topic), len(key), len(msg))
    return Line(
        int(now),
        int(ts),
        event.decode(),
        info.decode(),
        topic.decode(),
        base64.b64decode(key),
        base64.b64decode(msg),
    )


def read_lines(path: Path) -> list[Line]:
    return [parse(line) for line in path.read_bytes().splitlines(keepends=True)]


def event(
    reason: DiscardReason,
    topic: str | None = "events",
    timestamp_ms: int | None = TS_MS,
    *,
    key: bytes = b"",
    message: bytes = b"",
    detail: str = "",
    transport: Transport | None = None,
    api_version: int | None = None,
) -> DiscardEvent:
    return DiscardEvent(reason, topic, timestamp_ms, key, message, detail, transport, api_version)


# --- the line format -----------------------------------------------------------------------


def test_a_discard_line_has_dorys_fields_with_binary_safe_key_and_message() -> None:
    value = bytes(range(256))
    line = format_line(NOW_MS, event(DiscardReason.RATE_LIMIT, key=b"k\n", message=value), None)
    assert line.startswith(
        b"now: 1795246679301 ts: 1795246679208 event: DISC info: RATE_LIMIT topic: 6[events] "
        b"key: 4[awo=] msg: "
    )
    assert line.count(b"\n") == 1
    assert parse(line) == Line(NOW_MS, TS_MS, "DISC", "RATE_LIMIT", "events", b"k\n", value)


def test_the_message_and_key_are_cut_to_the_prefix_size() -> None:
    line = format_line(
        NOW_MS, event(DiscardReason.TOO_LONG, key=b"abcdef", message=b"0123456789"), 4
    )
    parsed = parse(line)
    assert (parsed.key, parsed.message) == (b"abcd", b"0123")


def test_a_discard_without_client_timestamp_or_topic_uses_now_and_an_empty_topic() -> None:
    line = format_line(NOW_MS, event(DiscardReason.MALFORMED, None, None, message=b"\0\1"), 256)
    parsed = parse(line)
    assert (parsed.timestamp_ms, parsed.topic, parsed.message) == (NOW_MS, "", b"\0\1")


def test_an_unprintable_bad_topic_stays_on_one_line() -> None:
    line = format_line(NOW_MS, event(DiscardReason.BAD_TOPIC, "a\nb]\u00e9"), 256)
    assert parse(line).topic == "a\\nb]\\xe9"


def test_a_possible_duplicate_is_a_dup_line() -> None:
    line = format_line(NOW_MS, PossibleDuplicate("events", TS_MS), 256)
    assert parse(line) == Line(NOW_MS, TS_MS, "DUP", "NONE", "events", b"", b"")


def test_a_possibly_delivered_message_is_a_maybe_line_with_the_clients_bytes() -> None:
    maybe = DiscardEvent(
        OpenOutcome.POSSIBLY_DELIVERED, "events", TS_MS, b"k", b"v", "_MSG_TIMED_OUT", None, None
    )
    line = parse(format_line(NOW_MS, maybe, 256))
    assert line == Line(
        NOW_MS, TS_MS, "MAYBE", "POSSIBLY_DELIVERED(_MSG_TIMED_OUT)", "events", b"k", b"v"
    )
    assert describe_discard(maybe).startswith("possibly delivered a message (possibly_delivered")


@pytest.mark.parametrize(
    ("discard", "info"),
    [
        (event(DiscardReason.MALFORMED), "MALFORMED"),
        (event(DiscardReason.BAD_TOPIC), "BAD_TOPIC"),
        (event(DiscardReason.TOO_LONG), "LONG_MSG"),
        (event(DiscardReason.NO_MEMORY), "NO_MEM"),
        (event(DiscardReason.RATE_LIMIT), "RATE_LIMIT"),
        (event(DiscardReason.FAILED_DELIVERY_ATTEMPTS), "DELIVERY_ATTEMPT_LIMIT"),
        (event(DiscardReason.SHUTDOWN_DELAY), "SERVER_SHUTDOWN"),
        (event(DiscardReason.SPOOL_CORRUPT, None, None, message=b"\xfe\0"), "SPOOL_CORRUPT"),
        (
            event(DiscardReason.UNSUPPORTED_API_KEY, message=struct.pack(">ihh", 8, 300, 0)),
            "API_KEY(300)",
        ),
        (event(DiscardReason.UNSUPPORTED_API_KEY, message=b"\0\0"), "API_KEY"),
        (event(DiscardReason.UNSUPPORTED_VERSION, api_version=7), "VERSION(7)"),
        (
            event(DiscardReason.KAFKA_ERROR, detail="MSG_SIZE_TOO_LARGE"),
            "KAFKA_ERROR_ACK(MSG_SIZE_TOO_LARGE)",
        ),
        (
            event(DiscardReason.KAFKA_ERROR, detail="producer unavailable"),
            "KAFKA_ERROR_ACK(producer_unavailable)",
        ),
        (event(DiscardReason.UNCLEAN_DISCONNECT, transport=Transport.TCP), "UNCLEAN_T"),
        (event(DiscardReason.UNCLEAN_DISCONNECT, transport=Transport.UNIX_STREAM), "UNCLEAN_U"),
    ],
)  # fmt: skip
def test_info_names_the_reason_in_dorys_words(discard: DiscardEvent, info: str) -> None:
    assert dory_info(discard) == info


def test_every_reason_has_an_info() -> None:
    for reason in DiscardReason:
        assert " " not in dory_info(event(reason, transport=Transport.TCP))


# --- rotation and the archive cap ----------------------------------------------------------


class FakeClock:
    """Wall and monotonic time that tests move by hand."""

    def __init__(self, now_s: float = NOW_MS / 1000) -> None:
        self.now_s = now_s

    def __call__(self) -> float:
        return self.now_s


def entry(n: int, size: int = 100) -> bytes:
    """A stand-in line of exactly ``size`` bytes."""
    return (b"%d " % n).ljust(size - 1, b"x") + b"\n"


def archives(directory: Path, name: str = "discard.log") -> list[Path]:
    """The rotated files, oldest first."""
    found = [p for p in directory.iterdir() if re.fullmatch(re.escape(name) + r"\.\d+", p.name)]
    return sorted(found, key=lambda p: int(p.suffix[1:]))


def rotating_file(
    path: Path, max_file_size: int, max_archive_size: int, counters: Counters, **options: object
) -> RotatingFile:
    return RotatingFile(str(path), max_file_size, max_archive_size, counters, **options)  # type: ignore[arg-type]


def test_the_file_rotates_when_the_next_entry_would_exceed_the_maximum(tmp_path: Path) -> None:
    path = tmp_path / "discard.log"
    clock = FakeClock()
    file = rotating_file(path, 250, 10_000, Counters(), wall_clock=clock)
    file.write([entry(1), entry(2)])
    assert archives(tmp_path) == []
    file.write([entry(3)])  # 300 > 250: entries 1 and 2 move to the archive
    file.write([entry(4), entry(5), entry(6)])  # 4 and 5 fill a file, 6 starts the next
    file.close()
    rotated = archives(tmp_path)
    assert [p.name for p in rotated] == [f"discard.log.{NOW_MS}", f"discard.log.{NOW_MS + 1}"]
    assert rotated[0].read_bytes() == entry(1) + entry(2)
    assert rotated[1].read_bytes() == entry(3) + entry(4)
    assert path.read_bytes() == entry(5) + entry(6)


def test_an_entry_larger_than_the_maximum_gets_a_file_of_its_own(tmp_path: Path) -> None:
    path = tmp_path / "discard.log"
    file = rotating_file(path, 150, 10_000, Counters())
    file.write([entry(1, 400), entry(2, 400)])
    file.close()
    assert [p.read_bytes() for p in archives(tmp_path)] == [entry(1, 400)]
    assert path.read_bytes() == entry(2, 400)


def test_archives_beyond_the_cap_are_deleted_oldest_first(tmp_path: Path) -> None:
    path = tmp_path / "discard.log"
    (tmp_path / "discard.log.1").write_bytes(b"o" * 300)  # left by an earlier run
    (tmp_path / "discard.log.old").write_bytes(b"o" * 5000)  # not an archive: kept
    (tmp_path / "other.log.2").write_bytes(b"o" * 5000)  # another file's: kept
    clock = FakeClock()
    file = rotating_file(path, 200, 450, Counters(), wall_clock=clock)
    for n in range(10):
        clock.now_s += 1
        file.write([entry(n)])
    file.close()
    rotated = archives(tmp_path)
    assert sum(p.stat().st_size for p in rotated) <= 450
    # Two entries per file: the two newest archives (4-5, 6-7) fit in 450 bytes.
    assert [p.read_bytes() for p in rotated] == [entry(4) + entry(5), entry(6) + entry(7)]
    assert path.read_bytes() == entry(8) + entry(9)
    assert (tmp_path / "discard.log.old").exists()
    assert (tmp_path / "other.log.2").exists()


def test_an_existing_file_is_appended_to_and_counts_towards_the_maximum(
    tmp_path: Path,
) -> None:
    path = tmp_path / "discard.log"
    path.write_bytes(entry(0) * 2)
    file = rotating_file(path, 250, 10_000, Counters())
    file.write([entry(1)])
    file.close()
    assert [p.read_bytes() for p in archives(tmp_path)] == [entry(0) * 2]
    assert path.read_bytes() == entry(1)


# --- failures ------------------------------------------------------------------------------


def errors_logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "pydory.daemon.books.files" and r.levelno >= logging.ERROR
    ]


def test_an_unusable_path_is_logged_once_counted_and_retried_on_reopen(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a regular file where the directory should be")
    path = blocker / "discard.log"
    counters = Counters()
    clock = FakeClock(0.0)
    file = rotating_file(path, 1000, 10_000, counters, retry_after_s=30.0, monotonic=clock)
    file.write([entry(1)])
    clock.now_s += 10  # before the retry time: not even tried
    file.write([entry(2), entry(3)])
    assert counters.get(DISCARD_LOG_LOST) == 3
    assert len(errors_logged(caplog)) == 1
    assert str(path) in errors_logged(caplog)[0]

    blocker.unlink()  # the operator fixes it and sends SIGUSR1
    file.reopen()
    file.write([entry(4)])
    file.close()
    assert path.read_bytes() == entry(4)
    assert counters.get(DISCARD_LOG_WRITTEN) == 1
    assert any("writing again; 3 entries were lost" in r.getMessage() for r in caplog.records)


def test_the_file_is_tried_again_after_the_retry_time(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    counters = Counters()
    clock = FakeClock(0.0)
    file = rotating_file(
        blocker / "discard.log", 1000, 10_000, counters, retry_after_s=30.0, monotonic=clock
    )
    file.write([entry(1)])
    blocker.unlink()
    clock.now_s += 31
    file.write([entry(2)])
    file.close()
    assert (counters.get(DISCARD_LOG_LOST), counters.get(DISCARD_LOG_WRITTEN)) == (1, 1)
    assert (blocker / "discard.log").read_bytes() == entry(2)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_full_disk_is_logged_once_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    counters = Counters()
    clock = FakeClock(0.0)
    file = rotating_file(Path("/dev/full"), 100, 100, counters, monotonic=clock)
    file.write([entry(1), entry(2)])  # /dev/full opens fine; every write is ENOSPC
    clock.now_s += 60
    file.write([entry(3)])  # retried, fails again: still one error line
    file.close()
    assert counters.get(DISCARD_LOG_LOST) == 3
    assert counters.get(DISCARD_LOG_WRITTEN) == 0
    [message] = errors_logged(caplog)
    assert "No space left on device" in message


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_a_read_only_directory_is_a_counted_failure(tmp_path: Path) -> None:
    directory = tmp_path / "ro"
    directory.mkdir()
    directory.chmod(0o500)
    counters = Counters()
    try:
        file = rotating_file(directory / "discard.log", 1000, 1000, counters)
        file.write([entry(1)])
        file.close()
    finally:
        directory.chmod(0o700)
    assert counters.get(DISCARD_LOG_LOST) == 1


# --- the writer thread ---------------------------------------------------------------------


class GatedFile:
    """A RotatingFile stand-in whose writes wait until the test opens the gate."""

    path = "<gated>"

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.entering = threading.Event()
        self.lines: list[bytes] = []
        self.reopened = 0
        self.closed = False

    def write(self, entries: Sequence[bytes]) -> None:
        if entries:
            self.entering.set()
            assert self.gate.wait(60), "the test never opened the gate"
        self.lines.extend(entries)

    def reopen(self) -> None:
        self.reopened += 1

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def gated() -> Iterator[GatedFile]:
    file = GatedFile()
    yield file
    file.gate.set()  # never leave a writer thread blocked


def discard_log_file(
    file: GatedFile | RotatingFile, counters: Counters, **options: int
) -> DiscardLogFile:
    return DiscardLogFile(file, 256, counters, wall_clock=lambda: NOW_MS / 1000, **options)  # type: ignore[arg-type]


def test_entries_are_written_in_order_by_the_writer_thread(tmp_path: Path) -> None:
    counters = Counters()
    path = tmp_path / "discard.log"
    log_file = discard_log_file(rotating_file(path, 1 << 20, 1 << 20, counters), counters)
    for n in range(5):
        log_file.discarded(event(DiscardReason.NO_MEMORY, f"t{n}", message=b"v%d" % n))
    log_file.possible_duplicate("t5", TS_MS)
    assert log_file.flush(timeout=60)
    lines = read_lines(path)
    assert [(line.event, line.topic) for line in lines] == [
        *(("DISC", f"t{n}") for n in range(5)),
        ("DUP", "t5"),
    ]
    assert [line.message for line in lines[:5]] == [b"v%d" % n for n in range(5)]
    log_file.close()
    assert counters.get(DISCARD_LOG_WRITTEN) == 6


def test_a_full_queue_drops_and_counts_instead_of_waiting(gated: GatedFile) -> None:
    counters = Counters()
    log_file = discard_log_file(gated, counters, max_backlog_entries=3)
    log_file.discarded(event(DiscardReason.RATE_LIMIT))
    assert gated.entering.wait(60)  # the writer holds entry 1; the queue is empty again
    for _ in range(5):
        log_file.discarded(event(DiscardReason.RATE_LIMIT))
    assert counters.get(DISCARD_LOG_DROPPED) == 2  # 1 in the writer's hands + 3 queued fit
    gated.gate.set()
    assert log_file.flush(timeout=60)
    assert len(gated.lines) == 4
    log_file.close()


def test_the_queue_is_bounded_in_bytes_too(gated: GatedFile) -> None:
    counters = Counters()
    log_file = discard_log_file(gated, counters, max_backlog_bytes=1000)
    log_file.discarded(event(DiscardReason.TOO_LONG, message=b"first"))
    assert gated.entering.wait(60)  # the writer holds the first; the queue is empty
    log_file.discarded(event(DiscardReason.TOO_LONG, message=b"x" * 600))
    log_file.discarded(event(DiscardReason.TOO_LONG, message=b"x" * 600))  # 1200 > 1000
    log_file.discarded(event(DiscardReason.TOO_LONG, message=b"x" * 300))  # 900 fits
    assert counters.get(DISCARD_LOG_DROPPED) == 1
    gated.gate.set()
    log_file.close()
    assert len(gated.lines) == 3


def test_close_writes_what_is_queued_and_later_discards_are_dropped(gated: GatedFile) -> None:
    counters = Counters()
    log_file = discard_log_file(gated, counters)
    log_file.discarded(event(DiscardReason.RATE_LIMIT))
    log_file.reopen()
    gated.gate.set()
    log_file.close()
    log_file.close()  # idempotent
    log_file.discarded(event(DiscardReason.RATE_LIMIT))
    assert (len(gated.lines), gated.reopened, gated.closed) == (1, 1, True)
    assert counters.get(DISCARD_LOG_DROPPED) == 1


# --- logDiscards ---------------------------------------------------------------------------


class ManualSchedule:
    """Stands in for loop.call_later: the test runs the callbacks."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, Callable[[], None]]] = []

    def __call__(self, delay_s: float, callback: Callable[[], None]) -> None:
        self.calls.append((delay_s, callback))


@pytest.fixture
def discard_records(caplog: pytest.LogCaptureFixture) -> Callable[[], list[str]]:
    caplog.set_level(logging.WARNING, logger="pydory.discards")
    return lambda: [r.getMessage() for r in caplog.records if r.name == "pydory.discards"]


def test_log_discards_logs_each_discard_up_to_the_limit_then_a_summary(
    discard_records: Callable[[], list[str]],
) -> None:
    clock, schedule = FakeClock(100.0), ManualSchedule()
    lines = DiscardLogLines(lines_per_window=3, window_s=10.0, monotonic=clock, schedule=schedule)
    for n in range(8):
        lines.discarded(event(DiscardReason.BAD_TOPIC, f"t{n}"))
    assert len(discard_records()) == 3
    assert discard_records()[0] == (
        "discarded a message (bad_topic): topic 't0', client timestamp 1795246679208"
    )
    [(delay_s, summary)] = schedule.calls  # one summary, at the end of the window
    assert delay_s == 10.0
    clock.now_s += 10
    summary()
    assert discard_records()[3].startswith("5 more discards not logged")
    lines.discarded(event(DiscardReason.BAD_TOPIC, "again"))  # a new window
    assert discard_records()[4].endswith("topic 'again', client timestamp 1795246679208")


def test_a_new_window_logs_again_and_close_reports_what_was_left_out(
    discard_records: Callable[[], list[str]],
) -> None:
    clock = FakeClock(100.0)
    lines = DiscardLogLines(
        lines_per_window=1, window_s=10.0, monotonic=clock, schedule=ManualSchedule()
    )
    lines.discarded(event(DiscardReason.KAFKA_ERROR, detail="TOPIC_AUTHORIZATION_FAILED"))
    lines.discarded(event(DiscardReason.RATE_LIMIT))
    clock.now_s += 11
    lines.discarded(event(DiscardReason.RATE_LIMIT))  # ends the window: summary, then log
    lines.discarded(event(DiscardReason.RATE_LIMIT))
    lines.close()
    records = discard_records()
    assert records[0].startswith("discarded a message (kafka_error TOPIC_AUTHORIZATION_FAILED)")
    assert records[1].startswith("1 more discards not logged")
    assert records[2].startswith("discarded a message (rate_limit)")
    assert records[3].startswith("1 more discards not logged")
    assert len(records) == 4


# --- the books' hook and the config --------------------------------------------------------


class RecordingSink:
    def __init__(self) -> None:
        self.events: list[DiscardEvent] = []
        self.duplicates: list[tuple[str, int]] = []

    def discarded(self, event: DiscardEvent) -> None:
        self.events.append(event)

    def possible_duplicate(self, topic: str, client_timestamp_ms: int) -> None:
        self.duplicates.append((topic, client_timestamp_ms))


def test_the_books_hand_every_discard_and_duplicate_to_the_sink() -> None:
    sink = RecordingSink()
    books = Books(600, 256, discard_sink=sink)
    books.accepted("events")
    books.discarded(DiscardReason.TOO_LONG, "events", TS_MS, prefix=b"value", key=b"key")
    books.discarded(DiscardReason.KAFKA_ERROR, "events", TS_MS, detail="MSG_SIZE_TOO_LARGE")
    books.discarded(DiscardReason.UNSUPPORTED_VERSION, None, None, prefix=b"raw", api_version=3)
    books.possible_duplicate("events", TS_MS)
    assert sink.events == [
        event(DiscardReason.TOO_LONG, key=b"key", message=b"value"),
        event(DiscardReason.KAFKA_ERROR, detail="MSG_SIZE_TOO_LARGE"),
        event(DiscardReason.UNSUPPORTED_VERSION, None, None, message=b"raw", api_version=3),
    ]
    assert sink.duplicates == [("events", TS_MS)]


def test_a_discard_the_books_refuse_never_reaches_the_sink() -> None:
    sink = RecordingSink()
    books = Books(600, 256, discard_sink=sink)
    with pytest.raises(ValueError, match="needs the topic"):
        books.discarded(DiscardReason.RATE_LIMIT, None, None)
    assert sink.events == []


CONFIG = """<doryConfig>
    <batching>
        <namedConfigs><config name="b"><time value="10"/><messages value="disable"/>
            <bytes value="disable"/></config></namedConfigs>
        <produceRequestDataLimit value="1024k"/><messageMaxBytes value="1000000"/>
        <combinedTopics enable="true" config="b"/><defaultTopic action="combinedTopics" config=""/>
    </batching>
    <compression><namedConfigs><config name="n" type="none"/></namedConfigs>
        <defaultTopic config="n"/></compression>
    {discard_logging}
    <logging><logDiscards enable="{log_discards}"/></logging>
    <initialBrokers><broker host="127.0.0.1" port="9092"/></initialBrokers>
</doryConfig>"""


def discard_log_for(tmp_path: Path, *, file: bool, log_discards: bool) -> DiscardLog:
    section = (
        f'<discardLogging enable="true"><path value="{tmp_path}/d.log"/></discardLogging>'
        if file
        else ""
    )
    text = CONFIG.format(discard_logging=section, log_discards=str(log_discards).lower())
    return DiscardLog.from_config(parse_config(text, source="<test>"), Counters())


def test_with_both_outputs_off_the_books_get_no_sink(tmp_path: Path) -> None:
    discard_log = discard_log_for(tmp_path, file=False, log_discards=False)
    assert discard_log.sink is None
    discard_log.close()


def test_both_outputs_receive_each_discard(
    tmp_path: Path, discard_records: Callable[[], list[str]]
) -> None:
    discard_log = discard_log_for(tmp_path, file=True, log_discards=True)
    assert discard_log.sink is not None
    discard_log.sink.discarded(event(DiscardReason.NO_MEMORY))
    discard_log.close()
    assert [line.info for line in read_lines(tmp_path / "d.log")] == ["NO_MEM"]
    assert len(discard_records()) == 1


# --- through a running daemon --------------------------------------------------------------


@pytest.fixture
def socket_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    # UNIX socket paths are limited to ~108 bytes: keep them short.
    return str(tmp_path_factory.mktemp("s", numbered=True))


def test_a_daemon_writes_each_discard_to_the_file_and_the_log(
    mock_cluster: MockCluster,
    unique_topic: Callable[[str], str],
    socket_dir: str,
    tmp_path: Path,
    discard_records: Callable[[], list[str]],
) -> None:
    topic = unique_topic("dlog")
    mock_cluster.create_topic(topic, 2)
    path = tmp_path / "logs" / "discard.log"  # the directory is created
    config = DaemonConfig(
        mock_cluster.bootstrap_servers,
        socket_dir,
        message_max_bytes=2000,
        rate_limits={topic: (60_000, 1)},
        discard_log_path=str(path),
    )
    malformed = struct.pack(">ihh", 8, 256, 7)  # AnyPartition, version 7
    with running_daemon(config) as daemon:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.sendto(malformed, config.datagram_path)
            sock.sendto(b"\x00\x00\x00\x05!", config.datagram_path)
        with UnixStreamSender(config.stream_path) as stream:
            stream.send(topic, b"first: delivered", timestamp_ms=TS_MS)
            stream.send(topic, b"second: rate limited", timestamp_ms=TS_MS + 1)
            stream.send("no-such-topic", b"nowhere", timestamp_ms=TS_MS + 2)
            stream.send(topic, b"L" * 5000, timestamp_ms=TS_MS + 3)  # too long for Kafka
        wait_until(lambda: sum(daemon.snapshot()["discards"].values()) == 5, what="5 discards")
    # Stopping the daemon closed the discard log: everything queued is written.
    by_info = {line.info: line for line in read_lines(path)}
    assert sorted(by_info) == ["BAD_TOPIC", "LONG_MSG", "MALFORMED", "RATE_LIMIT", "VERSION(7)"]
    assert by_info["VERSION(7)"].message == malformed
    assert by_info["MALFORMED"].message == b"\x00\x00\x00\x05!"
    assert (by_info["RATE_LIMIT"].topic, by_info["RATE_LIMIT"].timestamp_ms) == (topic, TS_MS + 1)
    assert by_info["RATE_LIMIT"].message == b"second: rate limited"
    assert by_info["BAD_TOPIC"].topic == "no-such-topic"
    assert by_info["BAD_TOPIC"].message == b"nowhere"
    assert by_info["LONG_MSG"].message == b"L" * 64  # maxMsgPrefixSize
    assert all(line.event == "DISC" for line in by_info.values())
    assert any(r.startswith("discarded a message (rate_limit)") for r in discard_records())


# --- SIGUSR1 and the main log file (logsetup) ----------------------------------------------


def test_reopening_the_log_file_recreates_it_with_its_configured_mode(tmp_path: Path) -> None:
    path = tmp_path / "pydory.log"
    config = LoggingConfig(syslog=False, file_path=str(path), file_mode=0o600)
    root_level = logging.getLogger().level
    log_files = configure_logging(config)
    try:
        path.rename(tmp_path / "pydory.log.1")  # logrotate moves it away, then SIGUSR1
        log_files.reopen()
        logging.getLogger("pydory.test").warning("after the rotation")
    finally:
        log_files.remove()
        logging.getLogger().setLevel(root_level)
    assert "after the rotation" in path.read_text()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_sigusr1_makes_a_serving_daemon_reopen_its_discard_log(
    mock_cluster: MockCluster, socket_dir: str, tmp_path: Path
) -> None:
    path = tmp_path / "discard.log"
    config = DaemonConfig(
        mock_cluster.bootstrap_servers, socket_dir, tcp_port=None, discard_log_path=str(path)
    )
    config_path = tmp_path / "dory_conf.xml"
    config_path.write_text(config.render())
    client = StatusClient(f"http://127.0.0.1:{config.http_port}", timeout_s=60)

    def counter(name: str) -> int | None:
        try:
            page = client.get("/counters/json")
        except DaemonUnreachable:
            return None
        return next((c["value"] for c in page["counters"] if c["name"] == name), 0)

    def send_malformed() -> None:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.sendto(b"\x00\x00\x00\x05!", config.datagram_path)

    daemon = subprocess.Popen(
        [sys.executable, "-m", "pydory", "serve", "--config-path", str(config_path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until(lambda: counter(DISCARD_LOG_WRITTEN) is not None, what="the daemon")
        send_malformed()
        wait_until(lambda: counter(DISCARD_LOG_WRITTEN) == 1, what="the first entry")
        path.rename(tmp_path / "discard.log.moved")  # logrotate's move, then its signal
        daemon.send_signal(signal.SIGUSR1)
        wait_until(path.exists, what="the reopened discard log")
        send_malformed()
        wait_until(lambda: counter(DISCARD_LOG_WRITTEN) == 2, what="the second entry")
    finally:
        daemon.terminate()
        assert daemon.wait(timeout=60) == 0
    assert [line.info for line in read_lines(tmp_path / "discard.log.moved")] == ["MALFORMED"]
    assert [line.info for line in read_lines(path)] == ["MALFORMED"]
