"""The typed, immutable settings that Dory's XML config file describes.

Every class here is a frozen dataclass: the loader builds a ``Config`` once, validates
all of it, and the daemon only reads it. Field names carry their unit (``_ms``, ``_s``,
``_min``); sizes are bytes. ``None`` stands for Dory's "disable", "unlimited",
"unspecified" and for an empty (= off) path.

Defaults are Dory's own defaults (Dory 3.x ``src/dory/conf/*.h``), so a section or
element left out of the file means exactly what it means to Dory.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

#: What ``pydory.config`` offers of the model (it re-exports these).
__all__ = [
    "DEFAULT_SOCKET_MODE",
    "NO_BATCHING",
    "NO_QUOTAS",
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
    "DiscardLoggingConfig",
    "HttpInterfaceConfig",
    "InputConfig",
    "InputSourcesConfig",
    "KafkaConfig",
    "ListenerQuotas",
    "LogLevel",
    "LoggingConfig",
    "MessageIdentityConfig",
    "MsgDebugConfig",
    "MsgDeliveryConfig",
    "OverloadPolicy",
    "QuotasConfig",
    "RateLimit",
    "RateLimitingConfig",
    "SpoolConfig",
    "TcpInput",
    "TopicBatching",
    "UnixSocketInput",
]

# --- batching ---------------------------------------------------------------------------------


class BatchingAction(enum.StrEnum):
    """How a topic's messages are batched (Dory's ``action`` attribute)."""

    PER_TOPIC = "perTopic"
    COMBINED = "combinedTopics"
    DISABLE = "disable"


@dataclass(frozen=True, slots=True)
class BatchingThresholds:
    """A named batching config: a batch is complete when any enabled limit is exceeded.

    ``None`` means that limit is disabled; at least one is always set. ``bytes`` counts
    key + value bytes, an empty message counting as 1 byte.
    """

    time_ms: int | None
    messages: int | None
    bytes: int | None


@dataclass(frozen=True, slots=True)
class TopicBatching:
    """The resolved batching of one topic.

    ``thresholds`` is None exactly when ``action`` is DISABLE (no batching).
    ``config_name`` names the named config the thresholds came from.
    """

    action: BatchingAction
    thresholds: BatchingThresholds | None = None
    config_name: str | None = None


NO_BATCHING = TopicBatching(BatchingAction.DISABLE)


@dataclass(frozen=True, slots=True)
class BatchingConfig:
    """The ``<batching>`` section, with every reference to a named config resolved."""

    produce_request_data_limit: int
    message_max_bytes: int
    combined_topics_enabled: bool
    combined_topics_config: str | None
    combined_topics: BatchingThresholds | None
    default_topic: TopicBatching
    named_configs: Mapping[str, BatchingThresholds] = field(
        default_factory=lambda: MappingProxyType({})
    )
    topic_configs: Mapping[str, TopicBatching] = field(default_factory=lambda: MappingProxyType({}))

    def for_topic(self, topic: str) -> TopicBatching:
        """The batching of ``topic``: its override if it has one, else the default."""
        return self.topic_configs.get(topic, self.default_topic)


# --- compression ------------------------------------------------------------------------------


class CompressionType(enum.StrEnum):
    """Compression codecs. Dory knows none, snappy, gzip (and lz4); pydory adds zstd."""

    NONE = "none"
    SNAPPY = "snappy"
    GZIP = "gzip"
    LZ4 = "lz4"
    ZSTD = "zstd"


@dataclass(frozen=True, slots=True)
class CompressionCodec:
    """A named compression config.

    Message sets smaller than ``min_size`` bytes are sent uncompressed. ``level`` is the
    codec's level, None for the codec's default (always None for none and snappy).
    """

    name: str
    type: CompressionType
    min_size: int = 0
    level: int | None = None


@dataclass(frozen=True, slots=True)
class CompressionConfig:
    """The ``<compression>`` section, resolved."""

    default_topic: CompressionCodec
    size_threshold_percent: int = 100
    named_configs: Mapping[str, CompressionCodec] = field(
        default_factory=lambda: MappingProxyType({})
    )
    topic_configs: Mapping[str, CompressionCodec] = field(
        default_factory=lambda: MappingProxyType({})
    )

    def for_topic(self, topic: str) -> CompressionCodec:
        """The codec of ``topic``: its override if it has one, else the default."""
        return self.topic_configs.get(topic, self.default_topic)


# --- topic rate limiting ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RateLimit:
    """At most ``max_count`` messages per topic every ``interval_ms``; None = unlimited.

    ``interval_ms`` is meaningless when ``max_count`` is None.
    """

    name: str
    interval_ms: int
    max_count: int | None

    @property
    def unlimited(self) -> bool:
        """True when this limit never discards anything."""
        return self.max_count is None


UNLIMITED_RATE = RateLimit(name="unlimited", interval_ms=1, max_count=None)


@dataclass(frozen=True, slots=True)
class RateLimitingConfig:
    """The ``<topicRateLimiting>`` section. Omitted = no limit on any topic (as Dory)."""

    default_topic: RateLimit = UNLIMITED_RATE
    named_configs: Mapping[str, RateLimit] = field(
        default_factory=lambda: MappingProxyType({UNLIMITED_RATE.name: UNLIMITED_RATE})
    )
    topic_configs: Mapping[str, RateLimit] = field(default_factory=lambda: MappingProxyType({}))

    def for_topic(self, topic: str) -> RateLimit:
        """The rate limit of ``topic``: its override if it has one, else the default."""
        return self.topic_configs.get(topic, self.default_topic)


# --- inputs -----------------------------------------------------------------------------------


DEFAULT_SOCKET_MODE = 0o222


@dataclass(frozen=True, slots=True)
class UnixSocketInput:
    """A UNIX socket input. ``path`` None = this input is off; ``mode`` None = umask."""

    path: str | None = None
    mode: int | None = DEFAULT_SOCKET_MODE

    @property
    def enabled(self) -> bool:
        """True when the daemon listens on this socket."""
        return self.path is not None


@dataclass(frozen=True, slots=True)
class TcpInput:
    """The loopback TCP input. ``port`` None = off; 0 = an ephemeral port (pydory)."""

    port: int | None = None

    @property
    def enabled(self) -> bool:
        """True when the daemon listens on the loopback TCP port."""
        return self.port is not None


@dataclass(frozen=True, slots=True)
class InputSourcesConfig:
    """The ``<inputSources>`` section. Omitted = no input at all (as Dory)."""

    unix_datagram: UnixSocketInput = UnixSocketInput()
    unix_stream: UnixSocketInput = UnixSocketInput()
    tcp: TcpInput = TcpInput()


@dataclass(frozen=True, slots=True)
class InputConfig:
    """The ``<inputConfig>`` section: memory pool size and input size limits (bytes)."""

    max_buffer: int = 16 * 1024 * 1024
    max_datagram_msg_size: int = 64 * 1024
    allow_large_unix_datagrams: bool = False
    max_stream_msg_size: int = 2 * 1024 * 1024


# --- delivery, HTTP, discard log, Kafka, debugging --------------------------------------------


@dataclass(frozen=True, slots=True)
class MsgDeliveryConfig:
    """The ``<msgDelivery>`` section."""

    topic_autocreate: bool = False
    max_failed_delivery_attempts: int = 5
    shutdown_max_delay_ms: int = 30000
    dispatcher_restart_max_delay_ms: int = 5000
    metadata_refresh_interval_min: int = 15
    compare_metadata_on_refresh: bool = True
    kafka_socket_timeout_s: int = 60
    pause_rate_limit_initial_ms: int = 5000
    pause_rate_limit_max_double: int = 4
    min_pause_delay_ms: int = 5000


@dataclass(frozen=True, slots=True)
class HttpInterfaceConfig:
    """The ``<httpInterface>`` section (status pages and metrics)."""

    port: int = 9090
    loopback_only: bool = False
    discard_report_interval_s: int = 600
    bad_msg_prefix_size: int = 256
    #: pydory: topic names Kafka does not have that get records of their own (books,
    #: discard report, rate-limit windows, autocreations under way); the rest are counted
    #: under "(other)". Topics Kafka has always get their own.
    max_unknown_topics: int = 1000


@dataclass(frozen=True, slots=True)
class DiscardLoggingConfig:
    """The ``<discardLogging>`` section. ``path`` None = off (the default).

    ``max_msg_prefix_size`` None = unlimited.
    """

    path: str | None = None
    max_file_size: int = 1024 * 1024
    max_archive_size: int = 8 * 1024 * 1024
    max_msg_prefix_size: int | None = 256

    @property
    def enabled(self) -> bool:
        """True when discards are written to a log file."""
        return self.path is not None


@dataclass(frozen=True, slots=True)
class KafkaConfig:
    """The ``<kafkaConfig>`` section."""

    client_id: str = "dory"
    replication_timeout_ms: int = 10000


@dataclass(frozen=True, slots=True)
class MsgDebugConfig:
    """The ``<msgDebug>`` section. ``path`` (a directory) None = off (the default).

    ``extra_fields`` (pydory's ``extraFields`` attribute): each line ends with the
    partition and the time of the stage, after Dory's fields.
    """

    path: str | None = None
    time_limit_s: int = 3600
    byte_limit: int = 2 * 1024 * 1024
    extra_fields: bool = False

    @property
    def enabled(self) -> bool:
        """True when per-topic message tracing may be switched on."""
        return self.path is not None


# --- the durable spool (pydory extension) -----------------------------------------------------


class OverloadPolicy(enum.StrEnum):
    """What the daemon does with a message it cannot take in right now."""

    DISCARD = "discard"
    """Discard it with its reason, as Dory does (the default)."""
    BACKPRESSURE = "backpressure"
    """Stop reading the client sockets until there is room again."""
    SPOOL = "spool"
    """Keep accepting into the on-disk spool while memory is short."""


@dataclass(frozen=True, slots=True)
class SpoolConfig:
    """The ``<spool>`` section (pydory extension). ``path`` (a directory) None = off (the
    default): accepted messages are then kept in memory only, as in Dory.

    ``fsync_interval_ms``: None = never fsync (survives a crash of the daemon, not of the
    machine), 0 = after every write, N = at most every N ms.
    """

    path: str | None = None
    max_bytes: int = 1024 * 1024 * 1024
    segment_bytes: int = 64 * 1024 * 1024
    fsync_interval_ms: int | None = 1000
    overload_policy: OverloadPolicy = OverloadPolicy.DISCARD

    @property
    def enabled(self) -> bool:
        """True when accepted messages are written ahead to the spool directory."""
        return self.path is not None


# --- message identity (pydory extension) -----------------------------------------------------


@dataclass(frozen=True, slots=True)
class MessageIdentityConfig:
    """The ``<messageIdentity>`` section (pydory extension): every message read is named
    ``(host, incarnation, stream, sequence)`` and, with ``headers``, carries its name to
    Kafka as the record header ``pydory-id``. ``host_id`` None: ``/etc/machine-id``, else
    one generated and kept in the spool directory. ``books_topic``: where each run's
    durable books are published (compacted, keyed ``<host>/<incarnation>``); None: not
    published (still kept in the spool directory)."""

    host_id: str | None = None
    headers: bool = True
    books_topic: str | None = "pydory.books"


# --- quotas on the stream listeners (pydory extension) ----------------------------------------


@dataclass(frozen=True, slots=True)
class ClientRate:
    """A ``<clientRate>``: the most one client may send per second, measured over
    ``window_ms`` (None = that quantity is not limited). Above it the client is slowed
    (its reads paused), never refused."""

    bytes_per_sec: int | None = None
    msgs_per_sec: int | None = None
    window_ms: int = 1000

    @property
    def limited(self) -> bool:
        """True when a byte or a message rate is set."""
        return self.bytes_per_sec is not None or self.msgs_per_sec is not None


@dataclass(frozen=True, slots=True)
class ListenerQuotas:
    """The quotas of one stream listener. ``max_connections`` None = no limit."""

    max_connections: int | None = None
    client_rate: ClientRate = ClientRate()

    @property
    def enabled(self) -> bool:
        """True when this listener limits connections or client rates."""
        return self.max_connections is not None or self.client_rate.limited


@dataclass(frozen=True, slots=True)
class QuotasConfig:
    """The ``<quotas>`` section (pydory extension): per listener, a connection quota and
    a per-client rate quota enforced by delay; on the datagram socket a per-client rate
    quota enforced by discarding. Omitted = no quota (as Dory)."""

    unix_stream: ListenerQuotas = ListenerQuotas()
    tcp: ListenerQuotas = ListenerQuotas()
    unix_datagram: ClientRate = ClientRate()

    @property
    def enabled(self) -> bool:
        """True when any input has a quota."""
        return self.unix_stream.enabled or self.tcp.enabled or self.unix_datagram.limited


NO_QUOTAS = QuotasConfig()


# --- logging ----------------------------------------------------------------------------------


class LogLevel(enum.StrEnum):
    """Dory's (syslog's) log levels, most severe first."""

    EMERG = "EMERG"
    ALERT = "ALERT"
    CRIT = "CRIT"
    ERR = "ERR"
    WARNING = "WARNING"
    NOTICE = "NOTICE"
    INFO = "INFO"
    DEBUG = "DEBUG"


@dataclass(frozen=True, slots=True)
class LoggingConfig:
    """The ``<logging>`` section. Omitted = syslog only, at NOTICE (as Dory).

    ``file_path`` None = no log file; ``file_mode`` None = let the umask decide.
    """

    level: LogLevel = LogLevel.NOTICE
    stdout_stderr: bool = False
    syslog: bool = True
    file_path: str | None = None
    file_mode: int | None = None
    log_discards: bool = True


# --- the whole file ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Broker:
    """One bootstrap broker from ``<initialBrokers>``."""

    host: str
    port: int = 9092

    def __str__(self) -> str:
        # IPv6 literals need brackets in librdkafka's host:port lists.
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


@dataclass(frozen=True, slots=True)
class Config:
    """Everything in one config file, validated. Build it with ``load_config``."""

    batching: BatchingConfig
    compression: CompressionConfig
    initial_brokers: tuple[Broker, ...]
    rate_limiting: RateLimitingConfig = RateLimitingConfig()
    inputs: InputSourcesConfig = InputSourcesConfig()
    input_config: InputConfig = InputConfig()
    delivery: MsgDeliveryConfig = MsgDeliveryConfig()
    http: HttpInterfaceConfig = HttpInterfaceConfig()
    discard_logging: DiscardLoggingConfig = DiscardLoggingConfig()
    kafka: KafkaConfig = KafkaConfig()
    msg_debug: MsgDebugConfig = MsgDebugConfig()
    logging: LoggingConfig = LoggingConfig()
    spool: SpoolConfig = SpoolConfig()
    """The durable spool (pydory's ``<spool>`` extension); off by default."""
    message_identity: MessageIdentityConfig = MessageIdentityConfig()
    """Message identity and its record header (pydory's ``<messageIdentity>``); on."""
    quotas: QuotasConfig = QuotasConfig()
    """Connection and client rate quotas (pydory's ``<quotas>`` extension); off by default."""
    librdkafka: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """Extra librdkafka producer properties (pydory's ``<librdkafka>`` extension)."""
    warnings: tuple[str, ...] = field(default=(), compare=False)
    """What the file says that Dory accepts and pydory ignores (an unknown attribute, a
    gzip level zlib has not), one rendered line each: the daemon logs them at start."""

    def batching_for(self, topic: str) -> TopicBatching:
        """How ``topic`` is batched."""
        return self.batching.for_topic(topic)

    def compression_for(self, topic: str) -> CompressionCodec:
        """How ``topic`` is compressed."""
        return self.compression.for_topic(topic)

    def rate_limit_for(self, topic: str) -> RateLimit:
        """The rate limit that applies to ``topic``."""
        return self.rate_limiting.for_topic(topic)

    @property
    def bootstrap_servers(self) -> str:
        """The initial brokers as librdkafka's ``bootstrap.servers`` ("host:port,...")."""
        return ",".join(str(broker) for broker in self.initial_brokers)
