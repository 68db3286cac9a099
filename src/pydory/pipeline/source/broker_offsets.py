"""Ask the brokers which partitions the topics have and which offsets each holds.

The source's planning side (Spark's driver) uses this between micro-batches; it never
reads records.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from pydory.pipeline.errors import KafkaReadError
from pydory.pipeline.source.offsets import PartitionId, Watermarks

__all__ = ["BrokerOffsets"]


class BrokerOffsets:
    """A metadata-only consumer: partitions and watermarks, each call a fresh answer.

    ``config`` is a librdkafka consumer configuration; ``timeout_s`` bounds every request.
    Close it with :meth:`close`.
    """

    def __init__(self, config: Mapping[str, object], timeout_s: float) -> None:
        self._consumer = Consumer(dict(config))
        self._timeout_s = timeout_s

    def available(self, topics: Iterable[str]) -> dict[PartitionId, Watermarks]:
        """Every partition of ``topics`` with its watermarks; a missing topic has none."""
        return self.watermarks(self.partitions(topics))

    def partitions(self, topics: Iterable[str]) -> list[PartitionId]:
        """The partitions of ``topics``. Topics that do not exist (yet) contribute none."""
        found: list[PartitionId] = []
        for topic in topics:
            metadata = self._ask(f"metadata of topic {topic!r}", self._consumer.list_topics, topic)
            topic_metadata = metadata.topics.get(topic)
            if topic_metadata is None:
                continue
            error = topic_metadata.error
            if error is not None and error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                continue
            if error is not None:
                raise KafkaReadError(f"cannot list the partitions of topic {topic!r}: {error}")
            found.extend(PartitionId(topic, number) for number in topic_metadata.partitions)
        return sorted(found)

    def watermarks(self, partitions: Iterable[PartitionId]) -> dict[PartitionId, Watermarks]:
        """The earliest and latest offsets of each of ``partitions``."""
        marks: dict[PartitionId, Watermarks] = {}
        for partition_id in partitions:
            earliest, latest = self._ask(
                f"watermarks of {partition_id}",
                self._consumer.get_watermark_offsets,
                TopicPartition(partition_id.topic, partition_id.partition),
                cached=False,
            )
            marks[partition_id] = Watermarks(earliest, latest)
        return marks

    def close(self) -> None:
        """Leave the brokers. The object is unusable afterwards."""
        self._consumer.close()

    def _ask(self, what: str, request: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return request(*args, timeout=self._timeout_s, **kwargs)
        except KafkaException as error:
            raise KafkaReadError(
                f"the brokers did not answer for the {what} within {self._timeout_s:g} s: {error}"
            ) from error
