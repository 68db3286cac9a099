"""The ``pydory-kafka`` source's options, validated once into one object.

The option names and meanings are spark-sql-kafka's, so a query switches between this
source and Spark's JVM ``kafka`` source by changing only the format name:

- ``kafka.bootstrap.servers`` (required), ``subscribe`` (required, comma-separated topics)
- ``startingOffsets``: ``earliest``, ``latest`` or JSON ``{"t": {"0": 23, "1": -2}}``
  (-2 earliest, -1 latest); default ``latest`` for streams, ``earliest`` for batches
- ``endingOffsets`` (batch reads only): ``latest`` or JSON; default ``latest``
- ``maxOffsetsPerTrigger``: cap on the offsets one micro-batch reads
- ``failOnDataLoss``: ``true`` (default) or ``false``
- ``kafkaConsumer.pollTimeoutMs``: how long a read may wait for the broker (default 120 s)
- ``includeHeaders``: ``true`` adds spark-sql-kafka's ``headers`` column (default ``false``)
- any other ``kafka.<property>``: passed to librdkafka as ``<property>``
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from pydory.pipeline.errors import SourceOptionError
from pydory.pipeline.source.offsets import EARLIEST, LATEST, OffsetSpec, parse_offset_spec

__all__ = ["SourceOptions"]

_KAFKA_PREFIX = "kafka."
_BOOTSTRAP = "kafka.bootstrap.servers"
_DEFAULT_POLL_TIMEOUT_MS = 120_000

# Consumer settings the source must own: reading exact offset ranges depends on them.
_RESERVED_KAFKA = {
    "enable.auto.commit": "the source never commits offsets; Spark's checkpoint holds them",
    "auto.offset.reset": "set the source option startingOffsets instead",
    "enable.partition.eof": "the source needs end-of-partition events to finish a range",
    "key.deserializer": "keys are always read as bytes",
    "value.deserializer": "values are always read as bytes",
}

# spark-sql-kafka's options this source does not implement, spelt as Spark spells them
# (names are compared case-insensitively): refused by name rather than ignored, since a
# query moved from Spark's source would otherwise run with a different meaning.
_NOT_IMPLEMENTED = "spark-sql-kafka has it, pydory-kafka does not"
_UNSUPPORTED = {
    name.lower(): (name, reason)
    for name, reason in {
        "assign": f"{_NOT_IMPLEMENTED}: list the topics in subscribe",
        "subscribePattern": f"{_NOT_IMPLEMENTED}: list the topics in subscribe",
        "startingOffsetsByTimestamp": _NOT_IMPLEMENTED,
        "startingOffsetsByTimestampStrategy": _NOT_IMPLEMENTED,
        "startingTimestamp": _NOT_IMPLEMENTED,
        "endingOffsetsByTimestamp": _NOT_IMPLEMENTED,
        "endingTimestamp": _NOT_IMPLEMENTED,
        "minOffsetsPerTrigger": f"{_NOT_IMPLEMENTED}: every trigger reads what Kafka holds "
        "(up to maxOffsetsPerTrigger); choose the trigger interval instead",
        "maxTriggerDelay": f"{_NOT_IMPLEMENTED} (it goes with minOffsetsPerTrigger)",
        "minPartitions": f"{_NOT_IMPLEMENTED}: one Spark task reads each topic-partition",
        "maxRecordsPerPartition": f"{_NOT_IMPLEMENTED}: one Spark task reads each topic-partition",
        "groupIdPrefix": f"{_NOT_IMPLEMENTED}: the source joins no consumer group",
        "fetchOffset.numRetries": f"{_NOT_IMPLEMENTED}: librdkafka retries within "
        "kafkaConsumer.pollTimeoutMs",
        "fetchOffset.retryIntervalMs": f"{_NOT_IMPLEMENTED}: librdkafka retries within "
        "kafkaConsumer.pollTimeoutMs",
    }.items()
}

_KNOWN = {
    "subscribe",
    "startingoffsets",
    "endingoffsets",
    "maxoffsetspertrigger",
    "failondataloss",
    "kafkaconsumer.polltimeoutms",
    "includeheaders",
}

_FETCH_WAIT_MAX_MS = "50"

# The group id librdkafka requires of a consumer; nothing is ever committed under it.
_READER_GROUP = "pydory-pipeline"


@dataclass(frozen=True)
class SourceOptions:
    """The source's options, parsed and checked. Build it with :meth:`parse`."""

    bootstrap_servers: str
    topics: tuple[str, ...]
    starting_offsets: OffsetSpec
    ending_offsets: OffsetSpec
    max_offsets_per_trigger: int | None
    fail_on_data_loss: bool
    poll_timeout_s: float
    kafka_properties: Mapping[str, str] = field(default_factory=dict)
    #: Rows carry the record's headers (spark-sql-kafka's ``headers`` column).
    include_headers: bool = False

    @classmethod
    def parse(cls, options: Mapping[str, str], streaming: bool | None) -> SourceOptions:
        """Check ``options`` (names case-insensitive) for a stream or a batch read.

        ``streaming`` None checks what applies to both (Spark builds the source before
        it knows which one the query is); the rules of one kind are checked with it.
        Raises :class:`SourceOptionError` naming the first bad option.
        """
        _reject_unknown(options)
        lowered = {name.lower(): value for name, value in options.items()}
        bootstrap = _required(lowered, _BOOTSTRAP)
        topics = tuple(
            topic.strip() for topic in _required(lowered, "subscribe").split(",") if topic.strip()
        )
        if not topics:
            raise SourceOptionError("subscribe", "name at least one topic")
        return cls(
            bootstrap_servers=bootstrap,
            topics=topics,
            starting_offsets=_starting_offsets(lowered, streaming, topics),
            ending_offsets=_ending_offsets(lowered, streaming, topics),
            max_offsets_per_trigger=_optional_positive_int(lowered, "maxOffsetsPerTrigger"),
            fail_on_data_loss=_boolean(lowered, "failOnDataLoss", default=True),
            poll_timeout_s=(
                _optional_positive_int(lowered, "kafkaConsumer.pollTimeoutMs")
                or _DEFAULT_POLL_TIMEOUT_MS
            )
            / 1000,
            kafka_properties=_kafka_properties(lowered),
            include_headers=_boolean(lowered, "includeHeaders", default=False),
        )

    def consumer_config(self) -> dict[str, str | bool]:
        """librdkafka settings for a consumer that reads exact offset ranges by ``assign()``."""
        return {
            "group.id": _READER_GROUP,
            # A fetch at the end of a partition waits this long for new records before
            # the broker answers "end of partition"; a range read needs that answer soon.
            "fetch.wait.max.ms": _FETCH_WAIT_MAX_MS,
            **self.kafka_properties,
            "bootstrap.servers": self.bootstrap_servers,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            # An offset that is no longer on the broker must surface as an error, never
            # as a silent jump: the source decides (failOnDataLoss).
            "auto.offset.reset": "error",
        }


def _reject_unknown(options: Mapping[str, str]) -> None:
    for name in sorted(options, key=str.lower):
        if name.lower() in _UNSUPPORTED:
            spelling, reason = _UNSUPPORTED[name.lower()]
            raise SourceOptionError(spelling, reason)
        if name.lower() not in _KNOWN and not name.lower().startswith(_KAFKA_PREFIX):
            raise SourceOptionError(
                name,
                "unknown option; the source takes kafka.bootstrap.servers, subscribe, "
                "startingOffsets, endingOffsets, maxOffsetsPerTrigger, failOnDataLoss, "
                "kafkaConsumer.pollTimeoutMs, includeHeaders and kafka.<librdkafka property>",
            )


def _required(options: Mapping[str, str], name: str) -> str:
    value = options.get(name.lower(), "").strip()
    if not value:
        raise SourceOptionError(name, "required")
    return value


def _starting_offsets(
    options: Mapping[str, str], streaming: bool | None, topics: tuple[str, ...]
) -> OffsetSpec:
    text = options.get("startingoffsets", "earliest" if streaming is False else "latest")
    spec = parse_offset_spec(text, "startingOffsets", unlisted=EARLIEST)
    if streaming is False and spec.default == LATEST:
        raise SourceOptionError("startingOffsets", "a batch read cannot start at latest")
    _check_topics(spec, "startingOffsets", topics)
    return spec


def _ending_offsets(
    options: Mapping[str, str], streaming: bool | None, topics: tuple[str, ...]
) -> OffsetSpec:
    text = options.get("endingoffsets")
    if text is None:
        return OffsetSpec(LATEST)
    if streaming:
        raise SourceOptionError("endingOffsets", "applies to batch reads only")
    spec = parse_offset_spec(text, "endingOffsets", unlisted=LATEST)
    if spec.default == EARLIEST or EARLIEST in spec.specific.values():
        raise SourceOptionError("endingOffsets", "a batch read cannot end at earliest")
    _check_topics(spec, "endingOffsets", topics)
    return spec


def _check_topics(spec: OffsetSpec, option: str, topics: tuple[str, ...]) -> None:
    strangers = sorted({partition.topic for partition in spec.specific} - set(topics))
    if strangers:
        raise SourceOptionError(option, f"names topics not in subscribe: {', '.join(strangers)}")


def _optional_positive_int(options: Mapping[str, str], name: str) -> int | None:
    text = options.get(name.lower())
    if text is None:
        return None
    try:
        number = int(text)
    except ValueError:
        raise SourceOptionError(name, f"{text!r} is not an integer") from None
    if number < 1:
        raise SourceOptionError(name, f"must be at least 1, not {number}")
    return number


def _boolean(options: Mapping[str, str], name: str, default: bool) -> bool:
    text = options.get(name.lower())
    if text is None:
        return default
    if text.strip().lower() not in ("true", "false"):
        raise SourceOptionError(name, f"expected true or false, got {text!r}")
    return text.strip().lower() == "true"


def _kafka_properties(options: Mapping[str, str]) -> dict[str, str]:
    properties: dict[str, str] = {}
    for name, value in options.items():
        if not name.startswith(_KAFKA_PREFIX) or name == _BOOTSTRAP:
            continue
        property_name = name.removeprefix(_KAFKA_PREFIX)
        if property_name in _RESERVED_KAFKA:
            raise SourceOptionError(name, f"not allowed: {_RESERVED_KAFKA[property_name]}")
        properties[property_name] = value
    return properties
