"""`pydory config check`'s listing: the effective settings under the XML's own names.

Each setting is one line, ``path = value``: the path is the element's under its section,
as the file spells it (``shutdownMaxDelay``, ``namedConfigs/config[low_latency]/time``),
an attribute as ``@name`` (``topicAutocreate/@enable``); sections come in the order the
file has them, those it leaves out after, in Dory's order (defaults filled in). A value is
the effective one: sizes in bytes, Dory's words for "off" (``disable``, ``unlimited``),
modes in octal.

Rule: `listing` never shows a Python field name; every element it names is one the
loader reads (the leaf sections through the loader's own tables).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from pydory.config import Config
from pydory.config.loader import (
    DISCARD_LOGGING,
    DOCUMENT,
    HTTP_INTERFACE,
    INPUT_CONFIG,
    KAFKA_CONFIG,
    LOGGING_LEAVES,
    MESSAGE_IDENTITY,
    MSG_DEBUG,
    MSG_DELIVERY,
    SPOOL,
    Leaf,
)
from pydory.config.model import (
    BatchingAction,
    BatchingThresholds,
    ClientRate,
    CompressionCodec,
    ListenerQuotas,
    RateLimit,
    TopicBatching,
    UnixSocketInput,
)
from pydory.config.xmltree import parse_xml

Line = tuple[str, Any]

#: Leaves whose value is an ``enable`` attribute, not ``value``.
ENABLE_LEAVES = frozenset({"topicAutocreate", "stdoutStderr", "syslog", "logDiscards", "headers"})
#: What None means, per element or attribute, in Dory's words.
NONE_MEANS = {
    "maxMsgPrefixSize": "unlimited",
    "maxCount": "unlimited",
    "maxConnections": "unlimited",
    "bytesPerSec": "unlimited",
    "msgsPerSec": "unlimited",
    "messages": "disable",
    "bytes": "disable",
    "time": "disable",
    "fsync": "none",
    "level": "default",
    "hostId": "(/etc/machine-id, else one kept in the spool directory)",
    "booksTopic": "(none: not published)",
    "path": "(none)",
    "port": "(none)",
    "mode": "unspecified",
}


def listing(config: Config, file_order: Iterable[str] = ()) -> str:
    """Every section's lines under a ``[tag]`` header, in the file's order of sections."""
    tags = [section.tag for section in DOCUMENT]
    in_file = [tag for tag in dict.fromkeys(file_order) if tag in tags]
    blocks = []
    for tag in in_file + [tag for tag in tags if tag not in in_file]:
        lines = SECTIONS[tag](config)
        body = [f"{path} = {_shown(path, value)}" for path, value in lines] or ["(none)"]
        blocks.append("\n".join([f"[{tag}]", *body]))
    return "\n\n".join(blocks)


def _shown(path: str, value: Any) -> str:
    name = path.rsplit("/", 1)[-1].lstrip("@")
    name = name.split("[", 1)[0]
    if value is None:
        return NONE_MEANS.get(name, "off")
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, enum.Enum):
        return str(value.value)
    if name == "mode" and isinstance(value, int):
        return f"0{value:03o}"
    return str(value)


def _leaves(section: Any, table: Iterable[Leaf]) -> list[Line]:
    return [
        (
            f"{leaf.tag}/@enable" if leaf.tag in ENABLE_LEAVES else leaf.tag,
            getattr(section, leaf.field),
        )
        for leaf in table
    ]


def _thresholds(prefix: str, thresholds: BatchingThresholds) -> list[Line]:
    return [
        (f"{prefix}/time", thresholds.time_ms),
        (f"{prefix}/messages", thresholds.messages),
        (f"{prefix}/bytes", thresholds.bytes),
    ]


def _topic_batching(prefix: str, topic: TopicBatching) -> list[Line]:
    lines: list[Line] = [(f"{prefix}/@action", topic.action)]
    if topic.action is BatchingAction.PER_TOPIC:  # combinedTopics takes <combinedTopics>'s
        lines.append((f"{prefix}/@config", topic.config_name))
    return lines


def _batching(config: Config) -> list[Line]:
    batching = config.batching
    lines: list[Line] = []
    for name, thresholds in batching.named_configs.items():
        lines += _thresholds(f"namedConfigs/config[{name}]", thresholds)
    lines += [
        ("produceRequestDataLimit", batching.produce_request_data_limit),
        ("messageMaxBytes", batching.message_max_bytes),
        ("combinedTopics/@enable", batching.combined_topics_enabled),
        ("combinedTopics/@config", batching.combined_topics_config),
    ]
    lines += _topic_batching("defaultTopic", batching.default_topic)
    for topic, setting in batching.topic_configs.items():
        lines += _topic_batching(f"topicConfigs/topic[{topic}]", setting)
    return lines


def _codec(prefix: str, codec: CompressionCodec) -> list[Line]:
    return [
        (f"{prefix}/@type", codec.type),
        (f"{prefix}/@minSize", codec.min_size),
        (f"{prefix}/@level", codec.level),
    ]


def _compression(config: Config) -> list[Line]:
    compression = config.compression
    lines: list[Line] = []
    for name, codec in compression.named_configs.items():
        lines += _codec(f"namedConfigs/config[{name}]", codec)
    lines += [
        ("sizeThresholdPercent", compression.size_threshold_percent),
        ("defaultTopic/@config", compression.default_topic.name),
    ]
    for topic, codec in compression.topic_configs.items():
        lines.append((f"topicConfigs/topic[{topic}]/@config", codec.name))
    return lines


def _rate(prefix: str, rate: RateLimit) -> list[Line]:
    return [(f"{prefix}/@interval", rate.interval_ms), (f"{prefix}/@maxCount", rate.max_count)]


def _rate_limiting(config: Config) -> list[Line]:
    limits = config.rate_limiting
    lines: list[Line] = []
    for name, rate in limits.named_configs.items():
        lines += _rate(f"namedConfigs/config[{name}]", rate)
    lines.append(("defaultTopic/@config", limits.default_topic.name))
    for topic, rate in limits.topic_configs.items():
        lines.append((f"topicConfigs/topic[{topic}]/@config", rate.name))
    return lines


def _socket(tag: str, socket_input: UnixSocketInput) -> list[Line]:
    return [
        (f"{tag}/@enable", socket_input.enabled),
        (f"{tag}/path", socket_input.path),
        (f"{tag}/mode", socket_input.mode),
    ]


def _input_sources(config: Config) -> list[Line]:
    inputs = config.inputs
    return [
        *_socket("unixDatagram", inputs.unix_datagram),
        *_socket("unixStream", inputs.unix_stream),
        ("tcp/@enable", inputs.tcp.enabled),
        ("tcp/port", inputs.tcp.port),
    ]


def _path_section(section: Any, table: Iterable[Leaf]) -> list[Line]:
    return [("@enable", section.path is not None), ("path", section.path), *_leaves(section, table)]


def _msg_debug(config: Config) -> list[Line]:
    lines = _path_section(config.msg_debug, MSG_DEBUG)
    return [*lines[:1], ("@extraFields", config.msg_debug.extra_fields), *lines[1:]]


def _logging(config: Config) -> list[Line]:
    logging = config.logging
    leaves = dict(_leaves(logging, LOGGING_LEAVES))
    return [
        ("level", leaves["level"]),
        ("stdoutStderr/@enable", leaves["stdoutStderr/@enable"]),
        ("syslog/@enable", leaves["syslog/@enable"]),
        ("file/@enable", logging.file_path is not None),
        ("file/path", logging.file_path),
        ("file/mode", logging.file_mode),
        ("logDiscards/@enable", leaves["logDiscards/@enable"]),
    ]


def _client_rate(prefix: str, rate: ClientRate) -> list[Line]:
    return [
        (f"{prefix}/@bytesPerSec", rate.bytes_per_sec),
        (f"{prefix}/@msgsPerSec", rate.msgs_per_sec),
        (f"{prefix}/@window", rate.window_ms),
    ]


def _listener(tag: str, quotas: ListenerQuotas) -> list[Line]:
    return [
        (f"{tag}/maxConnections", quotas.max_connections),
        *_client_rate(f"{tag}/clientRate", quotas.client_rate),
    ]


def _quotas(config: Config) -> list[Line]:
    quotas = config.quotas
    return [
        *_listener("unixStream", quotas.unix_stream),
        *_listener("tcp", quotas.tcp),
        *_client_rate("unixDatagram/clientRate", quotas.unix_datagram),
    ]


def _brokers(config: Config) -> list[Line]:
    return [("broker", f"{broker.host}:{broker.port}") for broker in config.initial_brokers]


def _librdkafka(config: Config) -> list[Line]:
    return [(f"property[{name}]/@value", value) for name, value in config.librdkafka.items()]


def file_sections(text: bytes) -> list[str]:
    """The top-level elements of a config file, in its order."""
    return [child.tag for child in parse_xml(text).children]


def _leaf_section(field: str, table: Iterable[Leaf]) -> Callable[[Config], list[Line]]:
    return lambda config: _leaves(getattr(config, field), table)


def _path_leaf_section(field: str, table: Iterable[Leaf]) -> Callable[[Config], list[Line]]:
    return lambda config: _path_section(getattr(config, field), table)


#: Each section's lines, by its tag (``DOCUMENT`` names every tag there is).
SECTIONS: Mapping[str, Callable[[Config], list[Line]]] = {
    "batching": _batching,
    "compression": _compression,
    "initialBrokers": _brokers,
    "topicRateLimiting": _rate_limiting,
    "inputSources": _input_sources,
    "inputConfig": _leaf_section("input_config", INPUT_CONFIG),
    "msgDelivery": _leaf_section("delivery", MSG_DELIVERY),
    "httpInterface": _leaf_section("http", HTTP_INTERFACE),
    "discardLogging": _path_leaf_section("discard_logging", DISCARD_LOGGING),
    "kafkaConfig": _leaf_section("kafka", KAFKA_CONFIG),
    "msgDebug": _msg_debug,
    "logging": _logging,
    "librdkafka": _librdkafka,
    "spool": _path_leaf_section("spool", SPOOL),
    "quotas": _quotas,
    "messageIdentity": _leaf_section("message_identity", MESSAGE_IDENTITY),
}
