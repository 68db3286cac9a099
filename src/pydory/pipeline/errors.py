"""Errors the pipeline raises: who is at fault and what the caller should do."""

from __future__ import annotations

from pydory.errors import PydoryError


class PipelineError(PydoryError):
    """Base of the pipeline's errors."""


class SourceOptionError(PipelineError):
    """An option given to the ``pydory-kafka`` source is missing or invalid.

    The user's query is at fault: fix the option named in the message.
    """

    def __init__(self, option: str, reason: str) -> None:
        super().__init__(f"pydory-kafka source option {option!r}: {reason}")
        self.option = option
        self.reason = reason


class DataLossError(PipelineError):
    """Offsets the query must read are no longer in Kafka (retention removed them).

    Raised only with ``failOnDataLoss`` true. The records are gone: either accept the
    loss (``failOnDataLoss`` false continues from the earliest offset still available)
    or fix the retention and the query's speed so it keeps up.
    """


class KafkaReadError(PipelineError):
    """Kafka refused a read or did not answer in time; the Spark task fails and may retry.

    Nothing was skipped: the batch's offset range is read again from its start.
    """


class ConnectorUnavailable(PipelineError):
    """The requested Spark connector is not on the classpath (e.g. spark-sql-kafka's jar)."""
