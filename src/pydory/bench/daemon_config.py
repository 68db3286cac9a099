"""The Dory XML config the benchmarked daemon runs with.

Rendered here, not with pydory.testing.daemon, so that the harness never imports the
daemon's own modules: ``--daemon-src`` can then point ``pydory serve`` at another
checkout (the committed tree, a branch) while this harness measures it unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class BenchDaemonConfig:
    """Only the input under test is enabled; batching is one combined-topics config."""

    bootstrap_servers: str
    socket_dir: Path
    transport: str  # dgram | stream | tcp
    http_port: int
    tcp_port: int | None = None
    max_buffer: str = "128m"
    linger_ms: int = 5
    batch_bytes: str = "256k"
    compression: str = "none"
    shutdown_max_delay_ms: int = 2000

    @property
    def datagram_path(self) -> Path:
        return self.socket_dir / "dgram.sock"

    @property
    def stream_path(self) -> Path:
        return self.socket_dir / "stream.sock"

    @property
    def address(self) -> str | int:
        """Where the generators write: a socket path, or the TCP port."""
        if self.transport == "dgram":
            return str(self.datagram_path)
        if self.transport == "stream":
            return str(self.stream_path)
        if self.tcp_port is None:
            raise ValueError("the tcp transport needs a tcp_port")
        return self.tcp_port

    def render(self) -> str:
        """The config as Dory XML."""
        brokers = "\n".join(
            f'    <broker host="{host}" port="{port}" />'
            for host, port in (b.rsplit(":", 1) for b in self.bootstrap_servers.split(","))
        )
        tcp_port = "" if self.tcp_port is None else str(self.tcp_port)
        return f"""<?xml version="1.0" encoding="US-ASCII"?>
<doryConfig>
  <batching>
    <namedConfigs>
      <config name="bench">
        <time value="{self.linger_ms}" />
        <messages value="disable" />
        <bytes value="{self.batch_bytes}" />
      </config>
    </namedConfigs>
    <produceRequestDataLimit value="1024k" />
    <messageMaxBytes value="1000000" />
    <combinedTopics enable="true" config="bench" />
    <defaultTopic action="combinedTopics" config="" />
    <topicConfigs />
  </batching>
  <compression>
    <namedConfigs>
      <config name="bench" type="{self.compression}" minSize="0" />
    </namedConfigs>
    <sizeThresholdPercent value="75" />
    <defaultTopic config="bench" />
    <topicConfigs />
  </compression>
  <inputSources>
    <unixDatagram enable="{_flag(self.transport == "dgram")}">
      <path value="{self.datagram_path}" />
    </unixDatagram>
    <unixStream enable="{_flag(self.transport == "stream")}">
      <path value="{self.stream_path}" />
    </unixStream>
    <tcp enable="{_flag(self.transport == "tcp")}">
      <port value="{tcp_port}" />
    </tcp>
  </inputSources>
  <inputConfig>
    <maxBuffer value="{self.max_buffer}" />
    <maxDatagramMsgSize value="64k" />
    <allowLargeUnixDatagrams value="false" />
    <maxStreamMsgSize value="1m" />
  </inputConfig>
  <msgDelivery>
    <shutdownMaxDelay value="{self.shutdown_max_delay_ms}" />
  </msgDelivery>
  <httpInterface>
    <port value="{self.http_port}" />
    <loopbackOnly value="true" />
  </httpInterface>
  <logging>
    <level value="WARNING" />
    <stdoutStderr enable="true" />
  </logging>
  <initialBrokers>
{brokers}
  </initialBrokers>
</doryConfig>
"""


def _flag(enabled: bool) -> str:
    return "true" if enabled else "false"
