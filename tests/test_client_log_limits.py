"""Nothing a client sends can flood the log (issue 33, point 3): the lines a client's
bytes cause go through ``daemon/log_limits.py``, one line per kind per interval, with the
count of those held back."""

from __future__ import annotations

import logging
import socket
import time

import pytest

from helpers import wait_until
from pydory.daemon.log_limits import ClientLines, Passed, RepeatGate
from pydory_tools.testing.daemon import DaemonConfig, RunningDaemon
from pydory_tools.testing.mock_cluster import MockCluster

#: Connections that each send an unframeable stream (a Size below 4).
FLOODING_CONNECTIONS = 300
INTAKE_LOGGER = "pydory.daemon.admission.intake"


def test_the_gate_lets_one_event_of_a_key_through_per_interval_with_the_count_held() -> None:
    gate = RepeatGate(interval_s=60)

    assert gate.admit("framing", 0.0) is not None
    held = [gate.admit("framing", n / 10) for n in range(1, 600)]  # 10 a second for 60 s
    passed = gate.admit("framing", 60.0)

    assert held == [None] * 599
    assert passed == Passed(held=599, since_s=60.0)
    assert gate.admit("framing", 60.5) is None


def test_the_gate_keeps_keys_apart_and_remembers_a_bounded_number() -> None:
    gate = RepeatGate(interval_s=60, max_keys=3)

    assert [gate.admit(key, 0.0) is not None for key in "abca"] == [True, True, True, False]
    assert gate.admit("d", 1.0) is not None  # the fourth: the memory starts afresh
    assert len(gate._seen) == 1
    assert gate.admit("d", 2.0) is None  # a flood of one kind still keeps its one key


def test_client_lines_say_the_limit_first_then_what_was_held_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    lines = ClientLines(logging.getLogger("pydory.test.client_lines"), 60, lambda: now[0])
    caplog.set_level(logging.WARNING, logger="pydory.test.client_lines")

    for n in range(1000):
        now[0] = n / 10
        lines.log(logging.WARNING, "bad", "client %d sent junk", n)
    lines.log(logging.INFO, "quiet", "below the level: neither logged nor counted")

    assert [r.getMessage() for r in caplog.records] == [
        "client 0 sent junk (at most one line like it per 60 s)",
        "client 600 sent junk (599 more like it in the last 60 s, not logged)",
    ]


def test_a_client_flooding_framing_errors_makes_one_log_line_a_minute(
    mock_cluster: MockCluster,
    tmp_path_factory: pytest.TempPathFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Each connection sends a frame whose Size is below 4 (a framing error: the stream
    is closed). Before: one ERROR line each; now one per interval, and the counters and
    the books keep every one."""
    caplog.set_level(logging.ERROR, logger=INTAKE_LOGGER)
    config = DaemonConfig(mock_cluster.bootstrap_servers, str(tmp_path_factory.mktemp("s")))
    daemon = RunningDaemon(config).start()
    started = time.monotonic()
    try:
        for _ in range(FLOODING_CONNECTIONS):
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
                client.connect(config.stream_path)
                client.sendall(b"\x00\x00\x00\x01junk")
        wait_until(
            lambda: daemon.snapshot()["discards"].get("malformed") == FLOODING_CONNECTIONS,
            what="every framing error booked as malformed",
        )
    finally:
        daemon.stop()
    intervals = 1 + int((time.monotonic() - started) // 60)  # one line per minute at most
    lines = [r.getMessage() for r in caplog.records if r.name == INTAKE_LOGGER]

    assert 1 <= len(lines) <= intervals
    assert "unframeable stream" in lines[0]
    assert "stream_framing_error_unix_stream" in lines[0]
