"""Dory's XML config file as typed, immutable, validated settings.

``load_config(path)`` reads and validates a file and returns a ``Config``, or raises
``ConfigError`` / ``ConfigErrors`` naming every problem (element path, line, column).
"""

from __future__ import annotations

from pydory.config.librdkafka import OWNED_LIBRDKAFKA_PROPERTIES
from pydory.config.loader import load_config, parse_config
from pydory.config.model import (
    NO_BATCHING,
    UNLIMITED_RATE,
    BatchingAction,
    BatchingConfig,
    BatchingThresholds,
    Broker,
    ClientRate,
    CompressionCodec,
    CompressionConfig,
    CompressionType,
    Config,
    DiscardLoggingConfig,
    HttpInterfaceConfig,
    InputConfig,
    InputSourcesConfig,
    KafkaConfig,
    ListenerQuotas,
    LoggingConfig,
    LogLevel,
    MsgDebugConfig,
    MsgDeliveryConfig,
    QuotasConfig,
    RateLimit,
    RateLimitingConfig,
    TcpInput,
    TopicBatching,
    UnixSocketInput,
)
from pydory.errors import ConfigError, ConfigErrors

__all__ = [
    "NO_BATCHING",
    "OWNED_LIBRDKAFKA_PROPERTIES",
    "UNLIMITED_RATE",
    "BatchingAction",
    "BatchingConfig",
    "BatchingThresholds",
    "Broker",
    "ClientRate",
    "CompressionCodec",
    "CompressionConfig",
    "CompressionType",
    "Config",
    "ConfigError",
    "ConfigErrors",
    "DiscardLoggingConfig",
    "HttpInterfaceConfig",
    "InputConfig",
    "InputSourcesConfig",
    "KafkaConfig",
    "ListenerQuotas",
    "LogLevel",
    "LoggingConfig",
    "MsgDebugConfig",
    "MsgDeliveryConfig",
    "QuotasConfig",
    "RateLimit",
    "RateLimitingConfig",
    "TcpInput",
    "TopicBatching",
    "UnixSocketInput",
    "load_config",
    "parse_config",
]
