"""Config reload, the pure parts: what a reload applies and what waits for a restart
(pydory.daemon.reload), the rate limiter's and the log handlers' reconfiguration."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pydory.config import Broker, Config, RateLimit, parse_config
from pydory.config.model import LoggingConfig, LogLevel
from pydory.daemon.admission.ratelimit import TopicRateLimiter
from pydory.daemon.logsetup import LogFiles
from pydory.daemon.reload import ReloadHistory, ReloadOutcome, plan_reload
from pydory_tools.testing.daemon_config import DaemonConfig


def config(**knobs: object) -> Config:
    knobs.setdefault("tcp_port", 7000)
    knobs.setdefault("http_port", 7001)
    rendered = DaemonConfig("127.0.0.1:9092", "/run/pydory", **knobs).render()  # type: ignore[arg-type]
    return parse_config(rendered, source="<test>")


def test_the_same_file_changes_nothing() -> None:
    plan = plan_reload(config(), config())
    assert plan.changed == ()
    assert plan.restart_needed == ()
    assert plan.effective == config()


def test_a_file_that_only_adds_what_dory_ignores_changes_nothing_and_brings_its_warnings() -> None:
    running = config()
    rendered = DaemonConfig("127.0.0.1:9092", "/run/pydory", tcp_port=7000, http_port=7001)
    text = rendered.render().replace(
        '<broker host="127.0.0.1"', '<broker rack="r1" host="127.0.0.1"'
    )
    loaded = parse_config(text, source="<test>")
    assert loaded.warnings
    plan = plan_reload(running, loaded)
    assert (plan.changed, plan.restart_needed) == ((), ())
    assert plan.effective.warnings == loaded.warnings


def test_reloadable_sections_take_the_new_values() -> None:
    new = config(
        compression="zstd",
        batching_time_ms=5,
        rate_limits={"noisy": (1000, 10)},
        tcp_port=7002,
        unix_stream=False,
        log_level="DEBUG",
        discard_log_path="/var/log/pydory/discards.log",
    )
    plan = plan_reload(config(), new)
    assert set(plan.changed) == {
        "compression",
        "batching",
        "topicRateLimiting",
        "inputSources",
        "logging",
        "discardLogging",
    }
    assert plan.restart_needed == ()
    assert plan.effective == new
    for field in ("compression", "batching", "rate_limiting", "inputs", "logging"):
        assert plan.changes(field)
    assert not plan.changes("http")


def test_restart_only_sections_keep_the_running_values_and_are_named() -> None:
    running = config()
    new = config(max_buffer="128m", http_port=7999, compression="lz4")
    plan = plan_reload(running, new)
    assert set(plan.changed) == {"compression", "inputConfig"}
    assert plan.restart_needed == ("httpInterface",)
    assert plan.effective.http == running.http
    assert plan.effective.input_config == new.input_config
    assert plan.effective.compression == new.compression


def test_msg_delivery_is_reloaded_whole() -> None:
    running = config()
    new_delivery = dataclasses.replace(
        running.delivery,
        max_failed_delivery_attempts=9,
        shutdown_max_delay_ms=1234,
        metadata_refresh_interval_min=1,
    )
    plan = plan_reload(running, dataclasses.replace(running, delivery=new_delivery))
    assert plan.changed == ("msgDelivery",)
    assert plan.restart_needed == ()
    assert plan.effective.delivery == new_delivery
    assert plan.changes("delivery")


def test_brokers_and_librdkafka_properties_are_reloaded() -> None:
    running = config()
    new = dataclasses.replace(
        running,
        librdkafka={"security.protocol": "SSL"},
        initial_brokers=(Broker("kafka-2", 9093),),
    )
    plan = plan_reload(running, new)
    assert set(plan.changed) == {"librdkafka", "initialBrokers"}
    assert plan.restart_needed == ()
    assert plan.effective == new


def test_spool_and_msg_debug_wait_for_a_restart() -> None:
    running = config()
    new = config(spool_path="/var/lib/pydory/spool", msg_debug_path="/var/log/pydory")
    plan = plan_reload(running, new)
    assert plan.changed == ()
    assert set(plan.restart_needed) == {"spool", "msgDebug"}
    assert plan.effective == running


def test_history_counts_and_keeps_the_last_outcome() -> None:
    history = ReloadHistory("/etc/pydory/pydory.xml", loaded_at=100.0)
    assert history.as_json()["last_reload"] is None
    history.record(ReloadOutcome(history.next_attempt(), False, 200.0, errors=("bad",)))
    history.record(ReloadOutcome(history.next_attempt(), True, 300.0, changed=("batching",)))
    page = history.as_json()
    assert page["reloads"] == {"attempted": 2, "succeeded": 1, "failed": 1}
    assert page["loaded_at"] == 300.0  # a failed reload does not move it
    assert page["last_reload"] == {
        "attempt": 2,
        "ok": True,
        "at": 300.0,
        "errors": [],
        "changed": ["batching"],
        "restart_needed": [],
    }


# -- the rate limiter ------------------------------------------------------------------------


def limit(interval_ms: int, max_count: int | None) -> RateLimit:
    return RateLimit("l", interval_ms, max_count)


def test_rate_limiter_reconfigure_keeps_unchanged_windows_and_resets_changed_ones() -> None:
    limits = {"same": limit(1000, 2), "changed": limit(1000, 2), "freed": limit(1000, 2)}
    limiter = TopicRateLimiter(lambda topic: limits[topic], clock=lambda: 0.0)
    for topic in limits:
        assert [limiter.admit(topic, now=0.0) for _ in range(3)] == [True, True, False]
    limits = {"same": limit(1000, 2), "changed": limit(1000, 3), "freed": limit(1, None)}
    limiter.reconfigure(lambda topic: limits[topic])
    # Unchanged: the window goes on (no fresh allowance for a flooding topic).
    assert not limiter.admit("same", now=0.1)
    # Changed: a new window under the new limit.
    assert [limiter.admit("changed", now=0.1) for _ in range(4)] == [True, True, True, False]
    # Now unlimited.
    assert all(limiter.admit("freed", now=0.1) for _ in range(100))
    assert limiter.is_unlimited("freed")


def test_rate_limiter_reconfigure_limits_a_topic_that_was_unlimited() -> None:
    limits = {"t": limit(1, None)}
    limiter = TopicRateLimiter(lambda topic: limits[topic], clock=lambda: 0.0)
    assert all(limiter.admit("t", now=0.0) for _ in range(10))
    limits = {"t": limit(1000, 1)}
    limiter.reconfigure(lambda topic: limits[topic])
    assert [limiter.admit("t", now=0.0) for _ in range(2)] == [True, False]


# -- log handlers ------------------------------------------------------------------------------


@pytest.fixture
def restore_root_level() -> object:
    root = logging.getLogger()
    level = root.level
    yield None
    root.setLevel(level)


def test_log_files_apply_moves_the_log_file_and_level(
    tmp_path: Path, restore_root_level: object
) -> None:
    first, second = tmp_path / "a.log", tmp_path / "b.log"
    files = LogFiles()
    log = logging.getLogger("pydory.test_reload")
    try:
        files.apply(LoggingConfig(level=LogLevel.NOTICE, syslog=False, file_path=str(first)))
        log.warning("one")
        log.info("hidden at NOTICE")
        files.apply(LoggingConfig(level=LogLevel.INFO, syslog=False, file_path=str(second)))
        log.info("two")
    finally:
        files.remove()
    assert "one" in first.read_text()
    assert "two" not in first.read_text()
    assert "hidden" not in first.read_text()
    assert "two" in second.read_text()
    assert logging.getLogger().level == logging.INFO


def test_log_files_apply_keeps_the_old_handlers_when_the_new_file_cannot_open(
    tmp_path: Path, restore_root_level: object
) -> None:
    first = tmp_path / "a.log"
    files = LogFiles()
    log = logging.getLogger("pydory.test_reload")
    try:
        files.apply(LoggingConfig(level=LogLevel.NOTICE, syslog=False, file_path=str(first)))
        with pytest.raises(FileNotFoundError):
            files.apply(
                LoggingConfig(
                    level=LogLevel.DEBUG, syslog=False, file_path=str(tmp_path / "no/such/b.log")
                )
            )
        log.warning("still here")
        assert logging.getLogger().level == 25  # NOTICE, unchanged
    finally:
        files.remove()
    assert "still here" in first.read_text()


# -- a property: every section lands in exactly one place ----------------------------------

VARIANTS: dict[str, dict[str, object]] = {
    "compression": {"compression": "zstd"},
    "batching": {"batching_time_ms": 77},
    "topicRateLimiting": {"rate_limits": {"t": (1000, 5)}},
    "inputSources": {"tcp_port": 7555},
    "inputConfig": {"max_buffer": "32m"},
    "msgDelivery": {"max_failed_delivery_attempts": 2},
    "httpInterface": {"http_port": 7556},
    "discardLogging": {"discard_log_path": "/var/log/pydory/d.log"},
    "msgDebug": {"msg_debug_path": "/var/log/pydory"},
    "spool": {"spool_path": "/var/lib/pydory/spool"},
    "logging": {"log_level": "DEBUG"},
    "librdkafka": {"librdkafka": {"client.rack": "r1"}},
    "initialBrokers": {"bootstrap_servers": "127.0.0.2:9092"},
}


@given(st.sets(st.sampled_from(sorted(VARIANTS))))
def test_each_changed_section_is_applied_or_named_for_a_restart(sections: set[str]) -> None:
    knobs: dict[str, object] = {}
    for section in sections:
        knobs.update(VARIANTS[section])
    bootstrap = str(knobs.pop("bootstrap_servers", "127.0.0.1:9092"))
    rendered = DaemonConfig(
        bootstrap,
        "/run/pydory",
        **{"tcp_port": 7000, "http_port": 7001, **knobs},  # type: ignore[arg-type]
    ).render()
    running, new = config(), parse_config(rendered, source="<test>")
    plan = plan_reload(running, new)
    assert set(plan.changed) | set(plan.restart_needed) == sections
    assert not set(plan.changed) & set(plan.restart_needed)
    assert set(plan.restart_needed) <= {"httpInterface", "msgDebug", "spool"}
    # What runs: the new file where the reload applies it, the running config elsewhere.
    again = plan_reload(plan.effective, new)
    assert again.changed == ()
    assert set(again.restart_needed) == set(plan.restart_needed)
    assert plan_reload(running, plan.effective).restart_needed == ()
