"""Per-topic rate limiting with Dory's fixed windows on a monotonic clock."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from pydory.daemon.admission.ratelimit import RateLimit, TopicRateLimiter


@dataclass(frozen=True)
class Limit:
    interval_ms: int
    max_count: int | None


UNLIMITED = Limit(interval_ms=1000, max_count=None)


def limiter_with(limits: dict[str, Limit], default: Limit = UNLIMITED) -> TopicRateLimiter:
    def config_for(topic: str) -> RateLimit:
        return limits.get(topic, default)

    return TopicRateLimiter(config_for, clock=lambda: 0.0)


def admitted(limiter: TopicRateLimiter, topic: str, times: list[float]) -> list[bool]:
    return [limiter.admit(topic, now=t) for t in times]


def test_unlimited_topic_admits_everything_and_asks_config_once() -> None:
    asked: list[str] = []

    def config_for(topic: str) -> RateLimit:
        asked.append(topic)
        return UNLIMITED

    limiter = TopicRateLimiter(config_for, clock=lambda: 0.0)
    assert all(limiter.admit("t", now=i / 1000) for i in range(5000))
    assert asked == ["t"]


def test_zero_max_count_discards_everything() -> None:
    limiter = limiter_with({"t": Limit(1000, 0)})
    assert admitted(limiter, "t", [0.0, 0.5, 1.0, 2.5, 100.0]) == [False] * 5


def test_exactly_max_count_pass_then_refused_until_the_next_window() -> None:
    limiter = limiter_with({"t": Limit(1000, 3)})
    # Window [10.000, 11.000): three pass, the rest refused up to the last millisecond.
    assert admitted(limiter, "t", [10.0, 10.1, 10.2, 10.3, 10.999]) == [
        True,
        True,
        True,
        False,
        False,
    ]
    # The next window starts exactly at 11.000.
    assert admitted(limiter, "t", [11.0, 11.5, 11.9, 11.95]) == [True, True, True, False]


def test_windows_stay_on_the_grid_of_the_first_message_as_in_dory() -> None:
    limiter = limiter_with({"t": Limit(1000, 2)})
    assert admitted(limiter, "t", [0.0]) == [True]
    # Silence, then traffic at 3.5: the window is [3.0, 4.0), not [3.5, 4.5).
    assert admitted(limiter, "t", [3.5, 3.6, 3.7]) == [True, True, False]
    assert admitted(limiter, "t", [4.0, 4.1, 4.2]) == [True, True, False]


def test_a_time_before_the_window_start_stays_in_the_window() -> None:
    limiter = limiter_with({"t": Limit(1000, 2)})
    assert admitted(limiter, "t", [5.0, 5.1, 5.2]) == [True, True, False]
    # A monotonic clock cannot go back; an explicit earlier `now` must not reset the count.
    assert admitted(limiter, "t", [4.0, 0.0]) == [False, False]
    assert admitted(limiter, "t", [6.0]) == [True]


def test_topics_are_limited_independently() -> None:
    limiter = limiter_with({"a": Limit(1000, 1), "b": Limit(1000, 2)}, default=Limit(1000, 0))
    assert admitted(limiter, "a", [0.0, 0.1]) == [True, False]
    assert admitted(limiter, "b", [0.1, 0.2, 0.3]) == [True, True, False]
    assert admitted(limiter, "c", [0.1]) == [False]
    assert admitted(limiter, "a", [1.0]) == [True]


def test_uses_the_injected_clock_when_no_time_is_given() -> None:
    now = [100.0]
    limiter = TopicRateLimiter(lambda topic: Limit(1000, 1), clock=lambda: now[0])
    assert limiter.admit("t")
    assert not limiter.admit("t")
    now[0] = 101.0
    assert limiter.admit("t")


def test_a_limit_without_a_positive_interval_is_rejected() -> None:
    limiter = limiter_with({"t": Limit(0, 5)})
    with pytest.raises(ValueError, match="interval_ms=0"):
        limiter.admit("t", now=0.0)


def test_a_topic_is_known_unlimited_only_once_its_first_message_looked_its_limit_up() -> None:
    limiter = limiter_with({"limited": Limit(interval_ms=1000, max_count=5)})
    assert not limiter.is_unlimited("free")  # not seen yet: admit() must look it up
    assert not limiter.is_unlimited("limited")
    limiter.admit("free")
    limiter.admit("limited")
    assert limiter.is_unlimited("free")
    assert not limiter.is_unlimited("limited")


# --- names Kafka does not have (issue 21): their windows are bounded ---------------------

ONE_PER_SECOND = Limit(interval_ms=1000, max_count=1)


def test_a_name_kafka_does_not_have_keeps_its_window_among_the_most_recent_few() -> None:
    limiter = TopicRateLimiter(lambda topic: ONE_PER_SECOND, unknown_topic_limit=2)
    assert limiter.admit("a", now=0.0, known=False)
    assert not limiter.admit("a", now=0.1, known=False)
    limiter.admit("b", now=0.2, known=False)
    assert not limiter.admit("a", now=0.3, known=False)  # still among the 2 most recent
    limiter.admit("c", now=0.4, known=False)
    limiter.admit("d", now=0.5, known=False)
    # Evicted by the names after it: its window starts afresh.
    assert limiter.admit("a", now=0.6, known=False)


def test_a_flood_of_unknown_names_never_evicts_a_topic_kafka_has() -> None:
    limiter = TopicRateLimiter(lambda topic: ONE_PER_SECOND, unknown_topic_limit=2)
    assert limiter.admit("orders", now=0.0)
    for i in range(1000):
        limiter.admit(f"junk.{i}", now=0.1, known=False)
    assert not limiter.admit("orders", now=0.2)


def test_a_window_opened_before_kafka_had_the_topic_carries_over() -> None:
    limiter = TopicRateLimiter(lambda topic: ONE_PER_SECOND, unknown_topic_limit=2)
    assert limiter.admit("new", now=0.0, known=False)  # e.g. held for its auto-creation
    assert not limiter.admit("new", now=0.5, known=True)
    for i in range(10):
        limiter.admit(f"junk.{i}", now=0.6, known=False)
    assert not limiter.admit("new", now=0.7, known=True)
    assert limiter.admit("new", now=1.0, known=True)


def test_a_reload_reconsiders_the_windows_of_unknown_names_too() -> None:
    limits = {"t": ONE_PER_SECOND}
    limiter = TopicRateLimiter(lambda topic: limits.get(topic, UNLIMITED))
    assert limiter.admit("t", now=0.0, known=False)
    assert not limiter.admit("t", now=0.1, known=False)
    limits["t"] = Limit(interval_ms=1000, max_count=5)
    limiter.reconfigure(lambda topic: limits.get(topic, UNLIMITED))
    assert limiter.admit("t", now=0.2, known=False)
