"""A Dory XML config for a test, demo or benchmark daemon, rendered from a few knobs.

Pure: it imports nothing of the daemon, so the benchmark harness can render the config of
a daemon it runs from another checkout (``pydory bench --daemon-src``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from xml.sax.saxutils import quoteattr

from pydory_tools.testing.ports import free_loopback_port


@dataclass
class DaemonConfig:
    """The knobs tests turn; everything else is a sensible default."""

    bootstrap_servers: str
    socket_dir: str
    tcp_port: int | None = field(default_factory=free_loopback_port)  # None = TCP input off
    unix_stream: bool = True
    unix_datagram: bool = True
    max_buffer: str = "64m"
    max_stream_msg_size: str = "1m"
    max_datagram_msg_size: str = "64k"
    message_max_bytes: int = 1_000_000
    batching_time_ms: int = 20
    compression: str = "none"
    topic_autocreate: bool = False
    max_failed_delivery_attempts: int = 5
    replication_timeout_ms: int = 10_000  # <kafkaConfig><replicationTimeout>
    kafka_socket_timeout_s: int = 60  # <msgDelivery><kafkaSocketTimeout>
    shutdown_max_delay_ms: int = 10_000
    discard_report_interval_s: int = 600
    http_port: int = field(default_factory=free_loopback_port)
    rate_limits: Mapping[str, tuple[int, int]] = field(default_factory=dict)  # topic -> (ms, n)
    librdkafka: Mapping[str, str] = field(default_factory=dict)
    discard_log_path: str | None = None  # <discardLogging> on, with small limits
    discard_log_max_file_size: str = "1m"
    discard_log_max_archive_size: str = "4m"
    msg_debug_path: str | None = None  # <msgDebug> on: the directory of its three files
    msg_debug_time_limit_s: int = 3600
    msg_debug_byte_limit: int = 2 * 1024 * 1024
    msg_debug_extra_fields: bool = False  # pydory's partition and now on each line
    spool_path: str | None = None  # <spool> on: the directory of its segments
    spool_fsync: str = "none"  # none | always | an interval in ms
    spool_max_size: str = "1g"
    spool_segment_size: str = "4m"
    overload_policy: str = "discard"  # discard | backpressure (needs spool_path)
    host_id: str | None = None  # <messageIdentity><hostId>; None: the machine's
    identity_headers: bool = True  # <messageIdentity><headers enable>
    books_topic: str | None = None  # <messageIdentity><booksTopic>; None: the default
    log_level: str = "INFO"
    log_to_stdout: bool = False
    datagram_file: str = "dgram.sock"  # the socket files' names in socket_dir
    stream_file: str = "stream.sock"

    @property
    def datagram_path(self) -> str:
        return os.path.join(self.socket_dir, self.datagram_file)

    @property
    def stream_path(self) -> str:
        return os.path.join(self.socket_dir, self.stream_file)

    def render(self) -> str:
        """The config as Dory XML."""
        brokers = "\n".join(
            f'        <broker host="{host}" port="{port}" />'
            for host, port in (b.rsplit(":", 1) for b in self.bootstrap_servers.split(","))
        )
        rate_configs = "\n".join(
            f'            <config name="rl_{i}" interval="{ms}" maxCount="{n}" />'
            for i, (ms, n) in enumerate(self.rate_limits.values())
        )
        rate_topics = "\n".join(
            f'            <topic name="{topic}" config="rl_{i}" />'
            for i, topic in enumerate(self.rate_limits)
        )
        properties = "\n".join(
            f"        <property name={quoteattr(k)} value={quoteattr(v)} />"
            for k, v in self.librdkafka.items()
        )
        tcp_port = "" if self.tcp_port is None else str(self.tcp_port)
        return f"""<?xml version="1.0" encoding="US-ASCII"?>
<doryConfig>
    <batching>
        <namedConfigs>
            <config name="fast">
                <time value="{self.batching_time_ms}" />
                <messages value="disable" />
                <bytes value="256k" />
            </config>
        </namedConfigs>
        <produceRequestDataLimit value="1024k" />
        <messageMaxBytes value="{self.message_max_bytes}" />
        <combinedTopics enable="true" config="fast" />
        <defaultTopic action="combinedTopics" config="" />
        <topicConfigs />
    </batching>
    <compression>
        <namedConfigs>
            <config name="chosen" type="{self.compression}" minSize="0" />
        </namedConfigs>
        <sizeThresholdPercent value="75" />
        <defaultTopic config="chosen" />
        <topicConfigs />
    </compression>
    <topicRateLimiting>
        <namedConfigs>
            <config name="infinity" interval="1" maxCount="unlimited" />
{rate_configs}
        </namedConfigs>
        <defaultTopic config="infinity" />
        <topicConfigs>
{rate_topics}
        </topicConfigs>
    </topicRateLimiting>
    <inputSources>
        <unixDatagram enable="{str(self.unix_datagram).lower()}">
            <path value="{self.datagram_path}" />
            <mode value="0666" />
        </unixDatagram>
        <unixStream enable="{str(self.unix_stream).lower()}">
            <path value="{self.stream_path}" />
            <mode value="0666" />
        </unixStream>
        <tcp enable="{str(self.tcp_port is not None).lower()}">
            <port value="{tcp_port}" />
        </tcp>
    </inputSources>
{self._leaf_sections()}    <librdkafka>
{properties}
    </librdkafka>
    <initialBrokers>
{brokers}
    </initialBrokers>
</doryConfig>
"""

    def _leaf_sections(self) -> str:
        """The sections made of leaves only; an optional one only when its knob is set."""
        return "".join(
            [
                self._limits(),
                self._path_sections(),
                self._identity(),
                self._kafka_and_logging(),
            ]
        )

    def _limits(self) -> str:
        """The inputs' sizes, the delivery's timings, the status port."""
        input_config = {
            "maxBuffer": self.max_buffer,
            "maxDatagramMsgSize": self.max_datagram_msg_size,
            "allowLargeUnixDatagrams": "false",
            "maxStreamMsgSize": self.max_stream_msg_size,
        }
        msg_delivery = {
            "topicAutocreate": self.topic_autocreate,
            "maxFailedDeliveryAttempts": self.max_failed_delivery_attempts,
            "shutdownMaxDelay": self.shutdown_max_delay_ms,
            "dispatcherRestartMaxDelay": 5000,
            "metadataRefreshInterval": 15,
            "compareMetadataOnRefresh": "true",
            "kafkaSocketTimeout": self.kafka_socket_timeout_s,
            "pauseRateLimitInitial": 500,
            "pauseRateLimitMaxDouble": 4,
            "minPauseDelay": 200,
        }
        http_interface = {
            "port": self.http_port,
            "loopbackOnly": "true",
            "discardReportInterval": self.discard_report_interval_s,
            "badMsgPrefixSize": 256,
        }
        return (
            _section("inputConfig", input_config)
            + _section("msgDelivery", msg_delivery)
            + _section("httpInterface", http_interface)
        )

    def _path_sections(self) -> str:
        """The sections that write to a path: each is on when its path is set."""
        discard_logging = {
            "maxFileSize": self.discard_log_max_file_size,
            "maxArchiveSize": self.discard_log_max_archive_size,
            "maxMsgPrefixSize": 64,
        }
        msg_debug = {
            "timeLimit": self.msg_debug_time_limit_s,
            "byteLimit": self.msg_debug_byte_limit,
        }
        extra = ' extraFields="true"' if self.msg_debug_extra_fields else ""
        spool = {
            "maxSize": self.spool_max_size,
            "segmentSize": self.spool_segment_size,
            "fsync": self.spool_fsync,
            "overloadPolicy": self.overload_policy,
        }
        return (
            _path_section("discardLogging", self.discard_log_path, discard_logging)
            + _path_section("msgDebug", self.msg_debug_path, msg_debug, extra)
            + _path_section("spool", self.spool_path, spool)
        )

    def _identity(self) -> str:
        if self.host_id is None and self.identity_headers and self.books_topic is None:
            return ""  # all Dory's defaults: the section is left out
        leaves = {
            "hostId": self.host_id,
            "headers": self.identity_headers,
            "booksTopic": self.books_topic,
        }
        return _section("messageIdentity", leaves)

    def _kafka_and_logging(self) -> str:
        kafka = {"clientId": "pydory-test", "replicationTimeout": self.replication_timeout_ms}
        logging = {"level": self.log_level, "stdoutStderr": self.log_to_stdout, "syslog": False}
        return _section("kafkaConfig", kafka) + _section("logging", logging)


def _path_section(
    tag: str, path: str | None, leaves: Mapping[str, object], attributes: str = ""
) -> str:
    """A section like ``<spool enable="true">`` with its ``<path>`` first, or "" (left out:
    off) when ``path`` is None."""
    if path is None:
        return ""
    return _section(tag, {"path": path, **leaves}, f' enable="true"{attributes}')


def _section(tag: str, leaves: Mapping[str, object], attributes: str = "") -> str:
    """``<tag attributes>`` with one leaf element per item of ``leaves``, in order: a bool
    is the leaf's ``enable`` attribute (``<syslog enable="false" />``), None leaves it out,
    and anything else is its ``value``."""
    lines = [f"    <{tag}{attributes}>"]
    for leaf, value in leaves.items():
        if isinstance(value, bool):
            lines.append(f'        <{leaf} enable="{str(value).lower()}" />')
        elif value is not None:
            lines.append(f"        <{leaf} value={quoteattr(str(value))} />")
    lines.append(f"    </{tag}>\n")
    return "\n".join(lines)
