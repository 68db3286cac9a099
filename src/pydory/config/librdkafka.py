"""The librdkafka properties a config's <librdkafka> section may not set, and why.

The config loader refuses them at start-up (and on reload); the daemon's settings
(``pydory.daemon.delivery.librdkafka_settings``) refuse them again when they build a
producer's properties. Both ask :func:`librdkafka_property_problem`, so the two lines of
defence cannot disagree. docs/librdkafka-mapping.md lists the same properties.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import MappingProxyType

LIBRDKAFKA_PROPERTY_NAME = re.compile(r"[a-z0-9._]+", re.ASCII)

OWNED_LIBRDKAFKA_PROPERTIES: Mapping[str, str] = MappingProxyType(
    {
        "bootstrap.servers": "it is set from <initialBrokers>",
        "metadata.broker.list": "it is set from <initialBrokers>",
        "enable.idempotence": "pydory sets it to guarantee ordered, unduplicated delivery",
        "acks": "pydory sets it to guarantee delivery",
        "request.required.acks": "pydory sets it to guarantee delivery",
        "client.id": "it is set from <kafkaConfig><clientId>",
        "compression.codec": "it is set from <compression>",
        "compression.type": "it is set from <compression>",
        "compression.level": "it is set from <compression>",
        "message.max.bytes": "it is derived from <batching>",
        "linger.ms": "it is set from <batching>",
        "queue.buffering.max.ms": "it is set from <batching>",
        "batch.num.messages": "it is set from <batching>",
        "batch.size": "it is set from <batching>",
        "request.timeout.ms": "it is set from <kafkaConfig><replicationTimeout>",
        "socket.timeout.ms": "it is set from <msgDelivery><kafkaSocketTimeout>",
        "retries": "it is set from <msgDelivery><maxFailedDeliveryAttempts>",
        "message.send.max.retries": "it is set from <msgDelivery><maxFailedDeliveryAttempts>",
        "queue.buffering.max.messages": "<inputConfig><maxBuffer> limits buffering",
        "queue.buffering.max.kbytes": "<inputConfig><maxBuffer> limits buffering",
    }
)
"""librdkafka properties a user may not set in <librdkafka>, and why."""

DEFAULTED_LIBRDKAFKA_PROPERTIES: Mapping[str, str] = MappingProxyType(
    {
        "message.timeout.ms": (
            "pydory sets linger.ms + 30000 per producer; <librdkafka> may change it "
            "(it must stay above every producer's linger.ms)"
        ),
        "statistics.interval.ms": (
            "pydory sets 1000 (the source of /queues and of broker liveness); "
            "<librdkafka> may change it"
        ),
    }
)
"""librdkafka properties pydory sets that <librdkafka> may set instead (its value wins)."""

_CALLBACK_PROPERTIES = frozenset({"on_delivery", "logger", "opaque"})


def librdkafka_property_problem(name: str) -> str | None:
    """Why ``name`` may not be set in <librdkafka>, or None if it may."""
    if not LIBRDKAFKA_PROPERTY_NAME.fullmatch(name):
        return f"Invalid librdkafka property name [{name}]: expected a-z 0-9 . _ only"
    if name in OWNED_LIBRDKAFKA_PROPERTIES:
        return (
            f"librdkafka property [{name}] cannot be set here: {OWNED_LIBRDKAFKA_PROPERTIES[name]}"
        )
    if name.endswith("_cb") or name in _CALLBACK_PROPERTIES:
        return f"librdkafka property [{name}] cannot be set here: pydory installs its own callbacks"
    return None
