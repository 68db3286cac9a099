"""Figures per run, their min / median / max over the rounds, and the two output forms
(a text table for people, one JSON object for scripts).

The JSON object holds at least the keys issue 6 asks for, as medians over the rounds:
transport, messages, value_bytes, rounds, pydory_msgs_per_s, generator_msgs_per_s,
raw_msgs_per_s, direct_msgs_per_s, pydory_cpu_us_per_msg, pydory_rss_mb_peak, p50_ms,
p99_ms, delivered, discarded. ``spread`` holds min / median / max of every figure and
``environment`` what the figures depend on (CPUs, load, max_dgram_qlen, versions).
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

import confluent_kafka

from pydory import __version__
from pydory_tools.bench import procfs
from pydory_tools.bench.settings import BROKERS, PARTITIONS, BenchSettings, spool_label

R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class Spread:
    """min / median / max of one figure over the rounds (None where no round measured it)."""

    min: float | None
    median: float | None
    max: float | None

    @classmethod
    def of(cls, values: Sequence[float | None]) -> Spread:
        present = [v for v in values if v is not None]
        if not present:
            return cls(None, None, None)
        return cls(min(present), statistics.median(present), max(present))


@dataclass(frozen=True, slots=True)
class PydoryRun:
    """One round's figures for the daemon."""

    msgs_per_s: float
    generator_msgs_per_s: float  # the generators' own send rate while feeding the daemon
    cpu_us_per_msg: float  # daemon process, every thread, first send -> last outcome
    rss_mb_idle: float  # VmRSS after start-up, before any traffic
    rss_mb_peak: float  # VmHWM at the end of the run
    p50_ms: float | None
    p99_ms: float | None
    latency_samples: int
    delivered: int
    discarded: int
    discarded_by_reason: dict[str, int] = field(default_factory=dict)
    #: The kernel's part of cpu_us_per_msg (stime: the sockets, the spool's writes).
    system_us_per_msg: float | None = None


@dataclass(frozen=True, slots=True)
class RawRun:
    """One round of the raw-socket baseline: the generators into a receiver that only reads."""

    msgs_per_s: float
    generator_msgs_per_s: float


@dataclass(frozen=True, slots=True)
class DirectRun:
    """One round of the direct baseline: one process producing with confluent-kafka."""

    msgs_per_s: float
    cpu_us_per_msg: float
    rss_mb_peak: float
    p50_ms: float | None
    p99_ms: float | None
    delivered: int
    errors: int


@dataclass(frozen=True, slots=True)
class Environment:
    """What the figures depend on besides the code."""

    cpus: int
    load_average_at_start: tuple[float, float, float]
    max_dgram_qlen: int | None
    python: str
    pydory: str
    confluent_kafka: str
    librdkafka: str
    started_at: str

    @classmethod
    def capture(cls) -> Environment:
        return cls(
            cpus=os.cpu_count() or 1,
            load_average_at_start=os.getloadavg(),
            max_dgram_qlen=procfs.max_dgram_qlen(),
            python=platform.python_version(),
            pydory=__version__,
            confluent_kafka=confluent_kafka.version()[0],
            librdkafka=confluent_kafka.libversion()[0],
            started_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        )


@dataclass
class BenchReport:
    """Every round's figures of one invocation."""

    settings: BenchSettings
    environment: Environment
    pydory: list[PydoryRun] = field(default_factory=list)
    raw: list[RawRun] = field(default_factory=list)
    direct: list[DirectRun] = field(default_factory=list)
    #: The pydory runs with a spool, by variant (``none``, ``always``, ``1000``); the
    #: runs without one are ``pydory``.
    spooled: dict[str, list[PydoryRun]] = field(default_factory=dict)
    #: The CPU-bound processes that ran beside the runs (``--contend``: N per core).
    contend_processes: int = 0
    #: The load average after the last run (with ``--contend``, the hogs' included).
    load_average_at_end: tuple[float, float, float] | None = None

    def spreads(self) -> dict[str, Spread]:
        """Every figure's min / median / max, under its JSON name."""

        def over(runs: Sequence[R], figure: Callable[[R], float | None]) -> Spread:
            return Spread.of([figure(run) for run in runs])

        p, raw, direct = self.pydory, self.raw, self.direct
        return {
            "pydory_msgs_per_s": over(p, lambda r: r.msgs_per_s),
            "generator_msgs_per_s": over(p, lambda r: r.generator_msgs_per_s),
            "raw_msgs_per_s": over(raw, lambda r: r.msgs_per_s),
            "raw_generator_msgs_per_s": over(raw, lambda r: r.generator_msgs_per_s),
            "direct_msgs_per_s": over(direct, lambda r: r.msgs_per_s),
            "pydory_cpu_us_per_msg": over(p, lambda r: r.cpu_us_per_msg),
            "pydory_system_us_per_msg": over(p, lambda r: r.system_us_per_msg),
            "direct_cpu_us_per_msg": over(direct, lambda r: r.cpu_us_per_msg),
            "pydory_rss_mb_idle": over(p, lambda r: r.rss_mb_idle),
            "pydory_rss_mb_peak": over(p, lambda r: r.rss_mb_peak),
            "direct_rss_mb_peak": over(direct, lambda r: r.rss_mb_peak),
            "p50_ms": over(p, lambda r: r.p50_ms),
            "p99_ms": over(p, lambda r: r.p99_ms),
            "direct_p50_ms": over(direct, lambda r: r.p50_ms),
            "direct_p99_ms": over(direct, lambda r: r.p99_ms),
            "delivered": over(p, lambda r: r.delivered),
            "discarded": over(p, lambda r: r.discarded),
            **self._spooled_spreads(),
        }

    def _spooled_spreads(self) -> dict[str, Spread]:
        """Per spool variant: pydory_spool_<variant>_{msgs_per_s, generator_msgs_per_s,
        cpu_us_per_msg, ...}."""
        spreads: dict[str, Spread] = {}
        for variant in self.settings.spool:
            if variant == "off":
                continue
            runs = self.spooled.get(variant, [])
            prefix = f"pydory_spool_{spool_label(variant)}"
            figures: dict[str, Callable[[PydoryRun], float | None]] = {
                "msgs_per_s": lambda r: r.msgs_per_s,
                "generator_msgs_per_s": lambda r: r.generator_msgs_per_s,
                "cpu_us_per_msg": lambda r: r.cpu_us_per_msg,
                "system_us_per_msg": lambda r: r.system_us_per_msg,
                "rss_mb_peak": lambda r: r.rss_mb_peak,
                "p50_ms": lambda r: r.p50_ms,
                "p99_ms": lambda r: r.p99_ms,
                "delivered": lambda r: r.delivered,
                "discarded": lambda r: r.discarded,
            }
            for name, figure in figures.items():
                spreads[f"{prefix}_{name}"] = Spread.of([figure(run) for run in runs])
        return spreads

    def _all_pydory_runs(self) -> list[PydoryRun]:
        return [*self.pydory, *(run for runs in self.spooled.values() for run in runs)]

    def to_json(self) -> dict[str, Any]:
        """The medians under issue 6's keys, plus spreads, settings and environment."""
        spreads = self.spreads()
        settings = self.settings
        summary: dict[str, Any] = {
            "transport": settings.transport,
            "messages": settings.messages,
            "value_bytes": settings.value_bytes,
            "rounds": settings.rounds,
            "processes": settings.processes,
            "batch": settings.batch,
            "compression": settings.compression,
            "linger_ms": settings.linger_ms,
            "max_buffer": settings.max_buffer,
            "daemon_source": str(settings.daemon_source or "installed"),
            "spool": list(settings.spool),
            "spool_segment_size": settings.spool_segment_size,
            "daemon_cpus": settings.daemon_cpus,
            "identity_headers": settings.identity_headers,
            "contend": settings.contend,
            "contend_processes": self.contend_processes,
            # achieved: generator_msgs_per_s (sent), pydory_msgs_per_s (settled)
            "offered_msgs_per_s": settings.rate,
            "load_1min_at_start": self.environment.load_average_at_start[0],
            "load_1min_at_end": (
                None if self.load_average_at_end is None else self.load_average_at_end[0]
            ),
            "brokers": BROKERS,
            "partitions": PARTITIONS,
        }
        summary.update({name: spread.median for name, spread in spreads.items()})
        counts = [
            n
            for n in spreads
            if n in ("delivered", "discarded") or n.endswith(("_delivered", "_discarded"))
        ]
        for counted in counts:
            if summary[counted] is not None:
                summary[counted] = int(summary[counted])
        summary["discarded_by_reason"] = _merged_reasons(self._all_pydory_runs())
        summary["spread"] = {name: asdict(spread) for name, spread in spreads.items()}
        summary["environment"] = asdict(self.environment)
        summary["latency_method"] = (
            "probe messages stamped by the generator, read back by a consumer during the "
            "load: client send -> consumption (an upper bound on send -> delivery report)"
        )
        return summary

    def to_text(self) -> str:
        settings, env = self.settings, self.environment
        lines = [
            f"pydory bench: {settings.transport}, {settings.messages:,} messages of "
            f"{settings.value_bytes} B, {settings.processes} generator process(es), "
            f"{settings.batch} per write, compression {settings.compression}, "
            f"linger {settings.linger_ms} ms, {settings.rounds} round(s), "
            f"spool {','.join(settings.spool)}"
            + ("" if settings.rate is None else f", offered {settings.rate:,.0f} msgs/s")
            + (
                f", {self.contend_processes} CPU hogs ({settings.contend} per core)"
                if settings.contend
                else ""
            ),
            f"mock cluster: {BROKERS} brokers, 1 topic of {PARTITIONS} partitions; "
            f"{env.cpus} CPUs, 1-minute load at start {env.load_average_at_start[0]:.2f}"
            + (
                ""
                if self.load_average_at_end is None
                else f", at end {self.load_average_at_end[0]:.2f}"
            )
            + ", "
            f"net.unix.max_dgram_qlen = {env.max_dgram_qlen}",
            "",
            f"{'figure':<30}{'min':>14}{'median':>14}{'max':>14}",
        ]
        for name, spread in self.spreads().items():
            lines.append(
                f"{name:<30}{_fmt(spread.min):>14}{_fmt(spread.median):>14}{_fmt(spread.max):>14}"
            )
        reasons = _merged_reasons(self._all_pydory_runs())
        if reasons:
            lines.append(f"discard reasons (all rounds): {reasons}")
        lines.append("latency: client send -> consumption of probe messages (upper bound)")
        return "\n".join(lines)


def _merged_reasons(runs: Sequence[PydoryRun]) -> dict[str, int]:
    merged: dict[str, int] = {}
    for run in runs:
        for reason, count in run.discarded_by_reason.items():
            merged[reason] = merged.get(reason, 0) + count
    return merged


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    if abs(value) >= 1000 or float(value).is_integer():
        return f"{value:,.0f}"
    return f"{value:.2f}"
