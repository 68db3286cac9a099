"""What the log says when Kafka cannot be reached (issue 23 item 9): the metadata warning
names each broker and what failed, and librdkafka's own repeated lines are held back."""

from __future__ import annotations

import asyncio
import logging
import socket

import pytest

from pydory.daemon import logsetup
from pydory.daemon.delivery import metadata
from pydory.daemon.delivery.metadata import MetadataService
from pydory.daemon.delivery.router import Router


def closed_loopback_port() -> int:
    """A loopback port nothing listens on: a connection to it is refused at once."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_the_metadata_failure_line_names_the_broker_and_the_refusal(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(metadata, "FETCH_TIMEOUT_S", 1.0)  # the refusal is known at once
    port = closed_loopback_port()

    async def first_failure() -> None:
        service = MetadataService(
            {"bootstrap.servers": f"127.0.0.1:{port}"},
            Router(),
            refresh_interval_s=600,
            pause_initial_s=600.0,  # one attempt: the pause after it is never waited out
        )
        stop = asyncio.Event()
        attempts = asyncio.ensure_future(service.initial(stop))
        try:
            while service.fetch_failures == 0:
                await asyncio.sleep(0.05)
        finally:
            stop.set()
            await attempts
            service.close()

    with caplog.at_level(logging.WARNING, logger=metadata.__name__):
        asyncio.run(asyncio.wait_for(first_failure(), 60))

    [line] = [r.getMessage() for r in caplog.records if "metadata fetch failed" in r.message]
    assert f"127.0.0.1:{port}" in line
    assert "Connection refused" in line
    assert "KafkaError{" not in line  # words, not the exception's repr


def librdkafka_record(message: str) -> logging.LogRecord:
    return logging.LogRecord(
        logsetup.LIBRDKAFKA_LOGGER, logging.ERROR, __file__, 1, message, None, None
    )


def test_a_repeated_librdkafka_line_is_let_through_once_a_minute_with_a_count() -> None:
    now = [0.0]
    repeats = logsetup.RepeatedLines(interval_s=60, clock=lambda: now[0])
    refused = "FAIL [p#producer-1] [thrd:b/bootstrap]: b/bootstrap: Connect to b failed: "
    passed = []
    for n in range(300):  # three a second for 100 s, as librdkafka logs a down broker
        now[0] = n / 3
        record = librdkafka_record(
            f"{refused}Connection refused (after {n % 5}ms in state CONNECT)"
        )
        if repeats.filter(record):
            passed.append(record.getMessage())

    assert len(passed) == 2
    assert passed[0].endswith("Connection refused (after 0ms in state CONNECT)")
    assert passed[1].endswith("(179 more like it in the last 60 s)")


def test_a_different_librdkafka_line_is_not_held_back() -> None:
    repeats = logsetup.RepeatedLines(interval_s=60, clock=lambda: 0.0)

    assert repeats.filter(librdkafka_record("b1/bootstrap: Connect to b1 failed: refused"))
    assert repeats.filter(librdkafka_record("b2/bootstrap: Connect to b2 failed: refused"))
    assert not repeats.filter(librdkafka_record("b1/bootstrap: Connect to b1 failed: refused"))


def test_the_daemons_logging_holds_back_librdkafkas_repeats() -> None:
    from pydory.config.model import LoggingConfig

    installed = logsetup.configure_logging(LoggingConfig(syslog=False))
    try:
        filters = logging.getLogger(logsetup.LIBRDKAFKA_LOGGER).filters
        assert any(isinstance(f, logsetup.RepeatedLines) for f in filters)
    finally:
        installed.remove()
