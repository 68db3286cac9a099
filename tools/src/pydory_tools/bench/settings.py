"""The benchmark's one settings object, validated once, before anything starts."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from pydory import wire
from pydory_tools.bench.workload import MIN_VALUE_BYTES

TRANSPORTS: Final = ("dgram", "stream", "tcp")
COMPRESSIONS: Final = ("none", "lz4", "snappy", "gzip", "zstd")
#: The spool variants named by word; any other is an fsync interval in ms.
SPOOL_POLICIES: Final = ("off", "none", "always")
#: The mock cluster the harness starts: issue 6's shape.
BROKERS: Final = 3
PARTITIONS: Final = 8
TOPIC: Final = "bench.load"
PROBE_TOPIC: Final = "bench.probe"
#: pydory's default maxDatagramMsgSize: a datagram message must fit it.
MAX_DATAGRAM_MESSAGE: Final = 64 * 1024
#: At most this many latency probes per run (they add at most 1% to the load).
MAX_PROBES: Final = 1000
MIN_PROBE_EVERY: Final = 100


@dataclass(frozen=True, slots=True)
class BenchSettings:
    """What one ``pydory bench`` invocation measures. ``ValueError`` if inconsistent.

    ``messages`` of ``value_bytes`` each go over ``transport`` from ``processes`` generator
    processes, ``batch`` messages per write on streams; each figure is taken ``rounds``
    times. ``timeout_s`` bounds every single run (raw, pydory, direct) of every round.
    ``daemon_source``: run ``pydory serve`` from this directory's ``pydory`` package.
    """

    transport: str = "dgram"
    messages: int = 200_000
    value_bytes: int = 100
    processes: int = 1
    batch: int = 1
    rounds: int = 3
    compression: str = "none"
    linger_ms: int = 5
    max_buffer: str = "128m"
    timeout_s: float = 300.0
    baselines: bool = True
    profile_path: Path | None = None
    daemon_source: Path | None = None
    #: The daemon's spool in each pydory run of a round, side by side: "off" (no spool),
    #: or the spool's fsync policy: "none", "always", or an interval in ms ("1000").
    spool: tuple[str, ...] = ("off",)
    #: The spool's ``segmentSize`` (4m: more rotations than the product's 64m default).
    spool_segment_size: str = "4m"
    #: The CPUs pydory serve may use (``taskset -c`` list, e.g. "0"); None: any.
    daemon_cpus: str | None = None
    #: Whether pydory sends each message's ``pydory-id`` header (its default: yes).
    identity_headers: bool = True
    #: CPU-bound processes per core running beside every run (``--contend``; 0: none).
    contend: int = 0
    #: The messages per second the generators offer in total (``--rate``; None: as fast
    #: as they can). The direct baseline is not paced.
    rate: float | None = None

    def __post_init__(self) -> None:
        if self.transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {', '.join(TRANSPORTS)}")
        if self.compression not in COMPRESSIONS:
            raise ValueError(f"compression must be one of {', '.join(COMPRESSIONS)}")
        for name in ("messages", "processes", "batch", "rounds"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if self.value_bytes < MIN_VALUE_BYTES:
            raise ValueError(f"value_bytes must be at least {MIN_VALUE_BYTES} (a probe's stamp)")
        if self.transport == "dgram" and self.batch != 1:
            raise ValueError("a datagram carries exactly one message: batch must be 1")
        if self.transport == "dgram" and self.message_size > MAX_DATAGRAM_MESSAGE:
            raise ValueError(
                f"a {self.message_size}-byte message exceeds pydory's default "
                f"maxDatagramMsgSize ({MAX_DATAGRAM_MESSAGE}): use a stream transport"
            )
        if self.processes > self.messages:
            raise ValueError("more generator processes than messages")
        if self.contend < 0:
            raise ValueError("contend must be >= 0 (CPU-bound processes per core)")
        if self.rate is not None and not self.rate > 0:
            raise ValueError("rate must be > 0 messages per second (or unset: unpaced)")
        if self.linger_ms < 0 or self.timeout_s <= 0:
            raise ValueError("linger_ms must be >= 0 and timeout_s > 0")
        if not self.spool or len(set(self.spool)) != len(self.spool):
            raise ValueError("spool: one or more distinct variants (off, none, always, N ms)")
        for variant in self.spool:
            if variant not in SPOOL_POLICIES and not (variant.isdigit() and int(variant) > 0):
                raise ValueError(
                    f"spool variant {variant!r}: off, none, always, or an fsync interval in ms"
                )
        if not re.fullmatch(r"[1-9][0-9]*[kmg]?", self.spool_segment_size):
            raise ValueError(f"spool segment size {self.spool_segment_size!r}: e.g. 4m, 64m")
        cpus = self.daemon_cpus
        if cpus is not None and not re.fullmatch(r"[0-9]+([,-][0-9]+)*", cpus):
            raise ValueError(f"daemon cpus {self.daemon_cpus!r}: a CPU list, e.g. 0 or 0,1")
        if self.daemon_source is not None and not (self.daemon_source / "pydory").is_dir():
            raise ValueError(f"{self.daemon_source} holds no pydory package")

    @property
    def message_size(self) -> int:
        """Bytes of one encoded load message (all have the same size)."""
        return wire.encoded_size(len(TOPIC), 0, self.value_bytes, False)

    @property
    def probe_every(self) -> int:
        """A generator sends one latency probe after every this many of its messages."""
        return max(MIN_PROBE_EVERY, self.messages // MAX_PROBES)


def spool_label(variant: str) -> str:
    """A spool variant as it appears in figure names: off, none, always, 1000ms."""
    return variant if variant in SPOOL_POLICIES else f"{variant}ms"
