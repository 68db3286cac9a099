"""Every error -> outcome decision of delivery (docs/librdkafka-mapping.md, "Error handling"),
one error class at a time, on the pure functions of pydory.daemon.delivery.outcomes."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError
from hypothesis import given, settings
from hypothesis import strategies as st

from pydory.daemon.books.events import DiscardReason
from pydory.daemon.delivery.outcomes import (
    Discard,
    EnqueueRefused,
    FinalOutcome,
    LeftForNextStart,
    PossiblyDelivered,
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
#: The message may already be in the log: the request may have left before the error.
POSSIBLY_PERSISTED = [
    KafkaError._MSG_TIMED_OUT,
    KafkaError._TIMED_OUT,
    KafkaError.REQUEST_TIMED_OUT,
    KafkaError._TRANSPORT,
    KafkaError.NETWORK_EXCEPTION,
    KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
]
#: Purged at shutdown: from librdkafka's queue (never sent), or in flight (may be written).
PURGED_QUEUED = [KafkaError._PURGE_QUEUE]
PURGED_IN_FLIGHT = [KafkaError._PURGE_INFLIGHT]
PURGED = PURGED_QUEUED + PURGED_IN_FLIGHT
#: Retriable, and not written: rerouted without a possible duplicate.
RETRIABLE = [
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.NOT_ENOUGH_REPLICAS,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
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
    maybe_in_kafka_before: bool = False,
    in_spool: bool = False,
    possibly_persisted: bool = False,
) -> FinalOutcome | Reroute:
    return failure_outcome(
        code,
        f"E{code}",
        error_is_fatal=error_is_fatal,
        producer_fatal_error=producer_fatal_error,
        topic_known=topic_known,
        attempt=attempt,
        max_attempts=max_attempts,
        shutting_down=shutting_down,
        maybe_in_kafka_before=maybe_in_kafka_before,
        in_spool=in_spool,
        possibly_persisted=possibly_persisted,
    )


@pytest.mark.parametrize("code", PERMANENT + PURGED_QUEUED + RETRIABLE)
def test_a_failed_producer_discards_everything_it_held_with_its_fatal_error(code: int) -> None:
    found = outcome(code, producer_fatal_error="_FENCED", shutting_down=True)
    assert found == Discard(DiscardReason.KAFKA_ERROR, "_FENCED")


@pytest.mark.parametrize("code", POSSIBLY_PERSISTED + PURGED_IN_FLIGHT)
def test_what_a_failed_producer_may_have_written_is_possibly_delivered(code: int) -> None:
    found = outcome(code, producer_fatal_error="_FENCED", shutting_down=True)
    assert found == PossiblyDelivered("_FENCED")


@pytest.mark.parametrize("code", PURGED_QUEUED)
def test_a_message_purged_from_the_queue_is_a_shutdown_delay(code: int) -> None:
    assert outcome(code) == Discard(DiscardReason.SHUTDOWN_DELAY, f"E{code}")


@pytest.mark.parametrize("code", PURGED_IN_FLIGHT)
def test_a_message_purged_in_flight_is_possibly_delivered(code: int) -> None:
    assert outcome(code) == PossiblyDelivered(f"E{code}")


@pytest.mark.parametrize("code", RETRIABLE)
def test_at_shutdown_a_retriable_error_is_a_shutdown_delay(code: int) -> None:
    assert outcome(code, shutting_down=True) == Discard(DiscardReason.SHUTDOWN_DELAY, f"E{code}")


@pytest.mark.parametrize("code", POSSIBLY_PERSISTED)
def test_at_shutdown_an_error_after_which_it_may_be_written_is_possibly_delivered(
    code: int,
) -> None:
    assert outcome(code, shutting_down=True) == PossiblyDelivered(f"E{code}")


@pytest.mark.parametrize("code", POSSIBLY_PERSISTED + PURGED + RETRIABLE)
def test_at_shutdown_a_message_in_the_spool_is_left_for_the_next_start(code: int) -> None:
    found = outcome(code, shutting_down=True, in_spool=True)
    assert found == LeftForNextStart(f"E{code}")


@pytest.mark.parametrize("shutting_down", [False, True])
@pytest.mark.parametrize("code", PERMANENT)
def test_a_permanent_error_is_a_kafka_error_even_at_shutdown(
    code: int, shutting_down: bool
) -> None:
    found = outcome(code, shutting_down=shutting_down, attempt=1, in_spool=True)
    assert found == Discard(DiscardReason.KAFKA_ERROR, f"E{code}")


@pytest.mark.parametrize("code", PERMANENT + RETRIABLE)
def test_a_final_failure_after_an_attempt_that_may_have_written_is_possibly_delivered(
    code: int,
) -> None:
    found = outcome(code, attempt=5, max_attempts=5, maybe_in_kafka_before=True)
    assert isinstance(found, PossiblyDelivered)


@pytest.mark.parametrize("code", RETRIABLE)
def test_a_fatal_error_or_a_topic_gone_is_a_kafka_error(code: int) -> None:
    assert outcome(code, error_is_fatal=True) == Discard(DiscardReason.KAFKA_ERROR, f"E{code}")
    assert outcome(code, topic_known=False) == Discard(DiscardReason.KAFKA_ERROR, f"E{code}")


@pytest.mark.parametrize("code", RETRIABLE)
def test_the_last_attempt_is_a_failed_delivery_attempts_discard(code: int) -> None:
    found = outcome(code, attempt=5, max_attempts=5)
    assert found == Discard(DiscardReason.FAILED_DELIVERY_ATTEMPTS, f"E{code}")


@pytest.mark.parametrize("code", POSSIBLY_PERSISTED)
def test_the_last_attempt_after_which_it_may_be_written_is_possibly_delivered(
    code: int,
) -> None:
    """The probe's false discards: maxFailedDeliveryAttempts 1, a leader stopped, and the
    timed-out messages were in Kafka while the books said failed_delivery_attempts."""
    assert outcome(code, attempt=1, max_attempts=1) == PossiblyDelivered(f"E{code}")


@pytest.mark.parametrize("code", POSSIBLY_PERSISTED)
def test_an_error_after_which_it_may_be_written_reroutes_as_a_possible_duplicate(
    code: int,
) -> None:
    assert outcome(code, attempt=4, max_attempts=5) == Reroute(possible_duplicate=True)


@pytest.mark.parametrize("code", RETRIABLE)
def test_any_other_error_reroutes(code: int) -> None:
    assert outcome(code, attempt=4, max_attempts=5) == Reroute(possible_duplicate=False)


@settings(max_examples=400, deadline=None)
@given(
    code=st.sampled_from(PERMANENT + POSSIBLY_PERSISTED + PURGED + RETRIABLE + [-1, 1]),
    fatal_error=st.sampled_from([None, "_FENCED"]),
    error_is_fatal=st.booleans(),
    topic_known=st.booleans(),
    attempt=st.integers(1, 6),
    max_attempts=st.integers(1, 5),
    shutting_down=st.booleans(),
    maybe_in_kafka_before=st.booleans(),
    in_spool=st.booleans(),
)
def test_a_message_that_may_be_in_kafka_is_never_a_plain_discard(
    code: int,
    fatal_error: str | None,
    error_is_fatal: bool,
    topic_known: bool,
    attempt: int,
    max_attempts: int,
    shutting_down: bool,
    maybe_in_kafka_before: bool,
    in_spool: bool,
) -> None:
    found = outcome(
        code,
        producer_fatal_error=fatal_error,
        error_is_fatal=error_is_fatal,
        topic_known=topic_known,
        attempt=attempt,
        max_attempts=max_attempts,
        shutting_down=shutting_down,
        maybe_in_kafka_before=maybe_in_kafka_before,
        in_spool=in_spool,
    )
    maybe_in_kafka = maybe_in_kafka_before or code in POSSIBLY_PERSISTED + PURGED_IN_FLIGHT
    if maybe_in_kafka:
        assert not isinstance(found, Discard)
    if isinstance(found, LeftForNextStart):
        assert in_spool
        assert shutting_down or code in PURGED
    if isinstance(found, Reroute):
        assert found.possible_duplicate == (code in POSSIBLY_PERSISTED)


def test_librdkafka_queue_full_at_produce_is_no_memory() -> None:
    refusal = produce_refusal(KafkaError._QUEUE_FULL)
    assert (refusal.reason, refusal.detail) == (DiscardReason.NO_MEMORY, "librdkafka queue full")


def test_a_message_too_large_at_produce_is_too_long() -> None:
    refusal = produce_refusal(KafkaError.MSG_SIZE_TOO_LARGE)
    assert (refusal.reason, refusal.detail) == (DiscardReason.TOO_LONG, "MSG_SIZE_TOO_LARGE")


def test_any_other_refusal_at_produce_is_a_kafka_error() -> None:
    refusal = produce_refusal(KafkaError.TOPIC_AUTHORIZATION_FAILED)
    assert (refusal.reason, refusal.detail) == (
        DiscardReason.KAFKA_ERROR,
        "TOPIC_AUTHORIZATION_FAILED",
    )
    missing = no_producer_refusal()
    assert (missing.reason, missing.detail) == (DiscardReason.KAFKA_ERROR, "producer unavailable")


def test_a_reroute_refused_at_produce_was_the_last_attempt() -> None:
    refusal = EnqueueRefused(DiscardReason.NO_MEMORY, "librdkafka queue full")
    assert resend_refused(refusal, maybe_in_kafka=False) == Discard(
        DiscardReason.FAILED_DELIVERY_ATTEMPTS, "librdkafka queue full"
    )
    assert resend_refused(refusal, maybe_in_kafka=True) == PossiblyDelivered(
        "librdkafka queue full"
    )


@pytest.mark.parametrize("code", PERMANENT)
def test_a_permanent_error_after_a_possibly_written_attempt_is_possibly_delivered(
    code: int,
) -> None:
    """Issue 30: librdkafka sent a request holding the message, the request timed out,
    and the retry got a permanent error: the first copy may be in the log
    (rd_kafka_message_status POSSIBLY_PERSISTED). Not a discard."""
    assert outcome(code, possibly_persisted=True) == PossiblyDelivered(f"E{code}")
    assert outcome(code) == Discard(DiscardReason.KAFKA_ERROR, f"E{code}")


@pytest.mark.parametrize("code", RETRIABLE)
def test_a_reroute_of_a_possibly_written_attempt_is_a_possible_duplicate(code: int) -> None:
    assert outcome(code, possibly_persisted=True) == Reroute(possible_duplicate=True)
    assert outcome(code) == Reroute(possible_duplicate=False)


@pytest.mark.parametrize("code", PERMANENT + RETRIABLE)
def test_a_failed_producers_verdict_goes_by_the_error_code_not_its_status(code: int) -> None:
    """After a fatal error librdkafka marks every message it fails possibly persisted:
    the fatal error stays the verdict, as the error code says."""
    found = outcome(code, producer_fatal_error="_FENCED", possibly_persisted=True)
    assert found == Discard(DiscardReason.KAFKA_ERROR, "_FENCED")
