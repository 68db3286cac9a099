"""Run a real pydory daemon for tests and demos: a generated config, a thread, a clean stop.

``DaemonConfig`` renders a complete Dory XML config (the same format users write) for
given brokers, socket directory and limits; ``RunningDaemon`` runs ``Server`` on its own
uvloop loop in a background thread and stops it gracefully.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar
from xml.sax.saxutils import quoteattr

import uvloop

from pydory.config import parse_config
from pydory.server import Server
from pydory.testing.ports import free_loopback_port

T = TypeVar("T")


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

    @property
    def datagram_path(self) -> str:
        return os.path.join(self.socket_dir, "dgram.sock")

    @property
    def stream_path(self) -> str:
        return os.path.join(self.socket_dir, "stream.sock")

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
    <kafkaConfig>
        <clientId value="pydory-test" />
        <replicationTimeout value="10000" />
    </kafkaConfig>
    <logging>
        <level value="INFO" />
        <stdoutStderr enable="false" />
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


class RunningDaemon:
    """A ``Server`` on its own event loop thread."""

    def __init__(self, config: DaemonConfig) -> None:
        self.daemon_config = config
        self.server = Server(parse_config(config.render(), source="<test config>"))
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="pydory-daemon", daemon=True)

    def _run(self) -> None:
        try:
            uvloop.run(self.server.serve())
        except BaseException as exc:  # noqa: BLE001 -- re-raised in the test thread by start()/stop()
            self._error = exc
            self.server.ready.set()

    def start(self, timeout: float = 30.0) -> RunningDaemon:
        self._thread.start()
        if not self.server.ready.wait(timeout):
            raise TimeoutError("pydory did not become ready (no metadata from the brokers?)")
        self._raise_if_failed()
        return self

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise RuntimeError("the pydory server failed") from self._error

    @property
    def tcp_port(self) -> int:
        for stream_input in self.server.stream_inputs:
            if stream_input.port is not None:
                return stream_input.port
        raise LookupError("TCP input is not enabled")

    def call(self, fn: Any, timeout: float = 10.0) -> Any:
        """Run ``fn()`` on the daemon's loop (read the books consistently)."""
        return self.server.call_soon(fn, timeout)

    def snapshot(self) -> dict[str, Any]:
        return self.call(self.server.snapshot)  # type: ignore[no-any-return]

    def stop(self, timeout: float = 60.0) -> None:
        self.server.request_shutdown()
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError("pydory did not shut down in time")
        self._raise_if_failed()


@contextmanager
def running_daemon(config: DaemonConfig) -> Iterator[RunningDaemon]:
    daemon = RunningDaemon(config).start()
    try:
        yield daemon
    finally:
        daemon.stop()
