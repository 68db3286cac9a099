"""A Dory XML config for a test, demo or benchmark daemon, rendered from a few knobs.

Pure: it imports nothing of the daemon, so the benchmark harness can render the config of
a daemon it runs from another checkout (``pydory bench --daemon-src``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from xml.sax.saxutils import quoteattr

from pydory.testing.ports import free_loopback_port


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
    <inputConfig>
        <maxBuffer value="{self.max_buffer}" />
        <maxDatagramMsgSize value="{self.max_datagram_msg_size}" />
        <allowLargeUnixDatagrams value="false" />
        <maxStreamMsgSize value="{self.max_stream_msg_size}" />
    </inputConfig>
    <msgDelivery>
        <topicAutocreate enable="{str(self.topic_autocreate).lower()}" />
        <maxFailedDeliveryAttempts value="{self.max_failed_delivery_attempts}" />
        <shutdownMaxDelay value="{self.shutdown_max_delay_ms}" />
        <dispatcherRestartMaxDelay value="5000" />
        <metadataRefreshInterval value="15" />
        <compareMetadataOnRefresh value="true" />
        <kafkaSocketTimeout value="60" />
        <pauseRateLimitInitial value="500" />
        <pauseRateLimitMaxDouble value="4" />
        <minPauseDelay value="200" />
    </msgDelivery>
    <httpInterface>
        <port value="{self.http_port}" />
        <loopbackOnly value="true" />
        <discardReportInterval value="{self.discard_report_interval_s}" />
        <badMsgPrefixSize value="256" />
    </httpInterface>
{self._discard_logging()}{self._msg_debug()}{self._spool()}{self._identity()}    <kafkaConfig>
        <clientId value="pydory-test" />
        <replicationTimeout value="10000" />
    </kafkaConfig>
    <logging>
        <level value="{self.log_level}" />
        <stdoutStderr enable="{str(self.log_to_stdout).lower()}" />
        <syslog enable="false" />
    </logging>
    <librdkafka>
{properties}
    </librdkafka>
    <initialBrokers>
{brokers}
    </initialBrokers>
</doryConfig>
"""

    def _msg_debug(self) -> str:
        if self.msg_debug_path is None:
            return ""
        extra = ' extraFields="true"' if self.msg_debug_extra_fields else ""
        return f"""    <msgDebug enable="true"{extra}>
        <path value="{self.msg_debug_path}" />
        <timeLimit value="{self.msg_debug_time_limit_s}" />
        <byteLimit value="{self.msg_debug_byte_limit}" />
    </msgDebug>
"""

    def _discard_logging(self) -> str:
        if self.discard_log_path is None:
            return ""
        return f"""    <discardLogging enable="true">
        <path value="{self.discard_log_path}" />
        <maxFileSize value="{self.discard_log_max_file_size}" />
        <maxArchiveSize value="{self.discard_log_max_archive_size}" />
        <maxMsgPrefixSize value="64" />
    </discardLogging>
"""

    def _identity(self) -> str:
        if self.host_id is None and self.identity_headers and self.books_topic is None:
            return ""
        host = "" if self.host_id is None else f'        <hostId value="{self.host_id}" />\n'
        headers = "true" if self.identity_headers else "false"
        books = (
            ""
            if self.books_topic is None
            else f'        <booksTopic value="{self.books_topic}" />\n'
        )
        return f"""    <messageIdentity>
{host}        <headers enable="{headers}" />
{books}    </messageIdentity>
"""

    def _spool(self) -> str:
        if self.spool_path is None:
            return ""
        return f"""    <spool enable="true">
        <path value="{self.spool_path}" />
        <maxSize value="{self.spool_max_size}" />
        <segmentSize value="{self.spool_segment_size}" />
        <fsync value="{self.spool_fsync}" />
        <overloadPolicy value="{self.overload_policy}" />
    </spool>
"""
