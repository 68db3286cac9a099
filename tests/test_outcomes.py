"""Every error -> outcome decision of delivery (docs/librdkafka-mapping.md, "Error handling"),
one error class at a time, on the pure functions of pydory.daemon.delivery.outcomes."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException

from pydory.daemon.books.events import DiscardReason
from pydory.daemon.delivery.outcomes import (
    Discard,
    EnqueueRefused,
    Reroute,
    failure_outcome,
    no_producer_refusal,
    produce_refusal,
    resend_refused,
)

#: Kafka's verdicts that no resend changes.
PERMANENT = [
    KafkaError.MSG_SIZE_TOO_LARGE,
    KafkaError.INVALID_MSG_SIZE,
    KafkaError.RECORD_LIST_TOO_LARGE,
    KafkaError.TOPIC_AUTHORIZATION_FAILED,
    KafkaError.CLUSTER_AUTHORIZATION_FAILED,
    KafkaError.TOPIC_EXCEPTION,
    KafkaError.INVALID_RECORD,
    KafkaError.UNSUPPORTED_FOR_MESSAGE_FORMAT,
    KafkaError.INVALID_REQUIRED_ACKS,
    KafkaError.POLICY_VIOLATION,
]
#: The message may already be in the log.
POSSIBLY_PERSISTED = [KafkaError._MSG_TIMED_OUT, KafkaError.REQUEST_TIMED_OUT]
#: Purged at shutdown.
PURGED = [KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT]
#: Retriable, and not written: rerouted without a possible duplicate.
RETRIABLE = [
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.NOT_ENOUGH_REPLICAS,
    KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError._TRANSPORT,
]


def outcome(
    code: int,
    *,
    error_is_fatal: bool = False,
    producer_fatal_error: str | None = None,
    topic_known: bool = True,
    attempt: int = 1,
    max_attempts: int = 5,
    shutting_down: bool = False,
) -> Discard | Reroute:
    return failure_outcome(
        code,
        f"E{code}",
        error_is_fatal=error_is_fatal,
        producer_fatal_error=producer_fatal_error,
        topic_known=topic_known,
        attempt=attempt,
        max_attempts=max_attempts,
        shutting_down=shutting_down,
    )


@pytest.mark.parametrize("code", PERMANENT + POSSIBLY_PERSISTED + PURGED + RETRIABLE)
def test_a_failed_producer_discards_everything_it_held_with_its_fatal_error(code: int) -> None:
    found = outcome(code, producer_fatal_error="_FENCED", shutting_down=True)
    assert found == Discard(DiscardReason.KAFKA_ERROR, "_FENCED")


@pytest.mark.parametrize("code", PURGED)
def test_a_purged_message_is_a_shutdown_delay(code: int) -> None:
    assert outcome(code) == Discard(DiscardReason.SHUTDOWN_DELAY, f"E{code}")


@pytest.mark.parametrize("code", POSSIBLY_PERSISTED + RETRIABLE)
def test_at_shutdown_a_retriable_error_is_a_shutdown_delay(code: int) -> None:
    assert outcome(code, shutting_down=True) == Discard(DiscardReason.SHUTDOWN_DELAY, f"E{code}")


@pytest.mark.parametrize("shutting_down", [False, True])
@pytest.mark.parametrize("code", PERMANENT)
def test_a_permanent_error_is_a_kafka_error_even_at_shutdown(
    code: int, shutting_down: bool
) -> None:
    found = outcome(code, shutting_down=shutting_down, attempt=1)
    assert found == Discard(DiscardReason.KAFKA_ERROR, f"E{code}")


@pytest.mark.parametrize("code", POSSIBLY_PERSISTED + RETRIABLE)
def test_a_fatal_error_or_a_topic_gone_is_a_kafka_error(code: int) -> None:
    assert outcome(code, error_is_fatal=True) == Discard(DiscardReason.KAFKA_ERROR, f"E{code}")
    assert outcome(code, topic_known=False) == Discard(DiscardReason.KAFKA_ERROR, f"E{code}")


@pytest.mark.parametrize("code", POSSIBLY_PERSISTED + RETRIABLE)
def test_the_last_attempt_is_a_failed_delivery_attempts_discard(code: int) -> None:
    found = outcome(code, attempt=5, max_attempts=5)
    assert found == Discard(DiscardReason.FAILED_DELIVERY_ATTEMPTS, f"E{code}")


@pytest.mark.parametrize("code", POSSIBLY_PERSISTED)
def test_an_error_after_which_it_may_be_written_reroutes_as_a_possible_duplicate(
    code: int,
) -> None:
    assert outcome(code, attempt=4, max_attempts=5) == Reroute(possible_duplicate=True)


@pytest.mark.parametrize("code", RETRIABLE)
def test_any_other_error_reroutes(code: int) -> None:
    assert outcome(code, attempt=4, max_attempts=5) == Reroute(possible_duplicate=False)


def test_librdkafka_queue_full_at_produce_is_no_memory() -> None:
    refusal = produce_refusal(BufferError("Local: Queue full"))
    assert (refusal.reason, refusal.detail) == (DiscardReason.NO_MEMORY, "librdkafka queue full")


def test_a_message_too_large_at_produce_is_too_long() -> None:
    refusal = produce_refusal(KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE)))
    assert (refusal.reason, refusal.detail) == (DiscardReason.TOO_LONG, "MSG_SIZE_TOO_LARGE")


def test_any_other_refusal_at_produce_is_a_kafka_error() -> None:
    refusal = produce_refusal(KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)))
    assert (refusal.reason, refusal.detail) == (
        DiscardReason.KAFKA_ERROR,
        "TOPIC_AUTHORIZATION_FAILED",
    )
    missing = no_producer_refusal()
    assert (missing.reason, missing.detail) == (DiscardReason.KAFKA_ERROR, "producer unavailable")


def test_a_reroute_refused_at_produce_was_the_last_attempt() -> None:
    refusal = EnqueueRefused(DiscardReason.NO_MEMORY, "librdkafka queue full")
    assert resend_refused(refusal) == Discard(
        DiscardReason.FAILED_DELIVERY_ATTEMPTS, "librdkafka queue full"
    )
