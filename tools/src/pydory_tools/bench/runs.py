"""One run of each kind: the raw-socket baseline, pydory, and the direct baseline.

Every run starts its own processes in its own directory and ends them (by PID) before
returning, whatever happens. The clock is ``time.monotonic()``, which Linux shares across
processes, so the generators' first send and the harness's "last acknowledgement" are on
one time line.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydory_tools.bench import procfs
from pydory_tools.bench.child import BenchError, ChildProcess, stop_process
from pydory_tools.bench.daemon import BenchDaemon
from pydory_tools.bench.latency import ProbeConsumer
from pydory_tools.bench.report import DirectRun, PydoryRun, RawRun
from pydory_tools.bench.settings import BROKERS, PARTITIONS, PROBE_TOPIC, TOPIC, BenchSettings
from pydory_tools.bench.workload import split_messages
from pydory_tools.testing.daemon_config import DaemonConfig
from pydory_tools.testing.mock_cluster import MockCluster
from pydory_tools.testing.ports import free_loopback_port

#: Time for a child or the daemon to start and say it is ready.
STARTUP_TIMEOUT_S = 60.0
#: After the last load message settles, how long to wait for the last latency probes.
PROBE_GRACE_S = 10.0
#: The daemon's graceful shutdown at the end of a run (everything is settled by then).
SHUTDOWN_MAX_DELAY_MS = 2000


# --- the generators, shared by the raw and pydory runs -------------------------------------


def start_generators(
    settings: BenchSettings,
    address: str | int,
    workdir: Path,
    stack: contextlib.ExitStack,
    *,
    probes: bool,
) -> list[ChildProcess]:
    """Start one generator per share of the messages, writing to ``address``; return them
    once all are connected and ready (each is stopped when ``stack`` closes)."""
    shares = split_messages(settings.messages, settings.processes, settings.probe_every)
    generators = []
    for share in shares:
        job = {
            "transport": settings.transport,
            "address": address,
            "messages": share.messages,
            "value_bytes": settings.value_bytes,
            "batch": settings.batch,
            "topic": TOPIC,
            "probe_topic": PROBE_TOPIC,
            "probe_every": settings.probe_every if probes else 0,
            "seed": share.index,
            "deadline_s": settings.timeout_s,
            # its part of the offered rate, so that all generators end together
            "rate": (settings.rate or 0) * share.messages / settings.messages,
        }
        child = ChildProcess(
            "pydory_tools.bench.generator", job, workdir, f"generator-{share.index}"
        )
        stack.callback(child.stop)
        generators.append(child)
    for child in generators:
        child.wait_ready(STARTUP_TIMEOUT_S)
    return generators


def _results(children: Sequence[ChildProcess], timeout_s: float) -> list[Mapping[str, Any]]:
    deadline = time.monotonic() + timeout_s
    return [child.wait_result(max(0.0, deadline - time.monotonic())) for child in children]


def _send_window(results: Sequence[Mapping[str, Any]]) -> tuple[float, float]:
    """(first send of any generator, last send of any generator)."""
    return min(r["first_send"] for r in results), max(r["last_send"] for r in results)


def _rate(count: int, start: float, end: float) -> float:
    return count / max(end - start, 1e-9)


# --- raw socket baseline ---------------------------------------------------------------


def run_raw(settings: BenchSettings, workdir: Path) -> RawRun:
    """The generators into a receiver that only reads: the ceiling of the socket path."""
    with contextlib.ExitStack() as stack:
        sink = ChildProcess(
            "pydory_tools.bench.sink", _sink_job(settings, workdir), workdir, "sink"
        )
        stack.callback(sink.stop)
        address = sink.wait_ready(STARTUP_TIMEOUT_S)["address"]
        generators = start_generators(settings, address, workdir, stack, probes=False)
        sink.go()
        for generator in generators:
            generator.go()
        results = _results(generators, settings.timeout_s)
        last_receive = sink.wait_result(settings.timeout_s)["last_receive"]
    first, last = _send_window(results)
    return RawRun(
        msgs_per_s=_rate(settings.messages, first, last_receive),
        generator_msgs_per_s=_rate(settings.messages, first, last),
    )


def _sink_job(settings: BenchSettings, workdir: Path) -> dict[str, Any]:
    job: dict[str, Any] = {
        "transport": settings.transport,
        "deadline_s": settings.timeout_s,
        "expect_messages": settings.messages,
        "expect_bytes": settings.messages * settings.message_size,
    }
    if settings.transport == "tcp":
        job["address"] = 0  # any free port; the sink says which in its ready line
    else:
        job["address"] = str(workdir / f"sink-{settings.transport}.sock")
    return job


# --- pydory ----------------------------------------------------------------------------


def _mock_cluster() -> MockCluster:
    cluster = MockCluster(BROKERS)
    cluster.create_topic(TOPIC, PARTITIONS)
    cluster.create_topic(PROBE_TOPIC, 1)
    return cluster


def daemon_config(
    settings: BenchSettings, bootstrap_servers: str, workdir: Path, spool: str = "off"
) -> DaemonConfig:
    """The daemon's config for a run: only the input under test, the run's batching and
    compression, a maxBuffer like Dory's anchor (128m), and the spool variant (``off``, or
    its fsync policy, the spool in the run's directory)."""
    transport = settings.transport
    return DaemonConfig(
        bootstrap_servers=bootstrap_servers,
        socket_dir=str(workdir),
        tcp_port=free_loopback_port() if transport == "tcp" else None,
        unix_stream=transport == "stream",
        unix_datagram=transport == "dgram",
        max_buffer=settings.max_buffer,
        batching_time_ms=settings.linger_ms,
        compression=settings.compression,
        shutdown_max_delay_ms=SHUTDOWN_MAX_DELAY_MS,
        spool_path=None if spool == "off" else str(workdir / "spool"),
        spool_fsync="none" if spool == "off" else spool,
        spool_segment_size=settings.spool_segment_size,
        identity_headers=settings.identity_headers,
        log_level="WARNING",
        log_to_stdout=True,
    )


def generator_address(config: DaemonConfig, transport: str) -> str | int:
    """Where the generators write: the input's socket path, or its TCP port."""
    if transport == "dgram":
        return config.datagram_path
    if transport == "stream":
        return config.stream_path
    if config.tcp_port is None:
        raise ValueError("the tcp transport needs a tcp_port")
    return config.tcp_port


def run_pydory(
    settings: BenchSettings, workdir: Path, profile: Path | None = None, spool: str = "off"
) -> PydoryRun:
    """The generators into ``pydory serve``, delivering to a fresh mock cluster."""
    with contextlib.ExitStack() as stack:
        cluster = stack.enter_context(_mock_cluster())
        config = daemon_config(settings, cluster.bootstrap_servers, workdir, spool)
        daemon = BenchDaemon(config, workdir, settings.daemon_source, settings.daemon_cpus)
        stack.callback(daemon.stop)
        daemon.start(STARTUP_TIMEOUT_S)
        idle_rss = procfs.memory_mb(daemon.pid, "VmRSS")
        probes = ProbeConsumer(cluster.bootstrap_servers, PROBE_TOPIC)
        probes.start()
        stack.callback(probes.stop)
        address = generator_address(config, settings.transport)
        generators = start_generators(settings, address, workdir, stack, probes=True)
        if profile is not None:
            stack.enter_context(_py_spy(daemon.pid, profile, workdir))
        cpu_before = procfs.cpu_seconds(daemon.pid)
        system_before = procfs.system_cpu_seconds(daemon.pid)
        for generator in generators:
            generator.go()
        results = _results(generators, settings.timeout_s)
        first, last = _send_window(results)
        settled_at, books = daemon.wait_settled(
            TOPIC, settings.messages, first + settings.timeout_s
        )
        cpu = procfs.cpu_seconds(daemon.pid) - cpu_before
        system = procfs.system_cpu_seconds(daemon.pid) - system_before
        peak_rss = procfs.memory_mb(daemon.pid, "VmHWM")
        latency = probes.finish(sum(int(r["probes"]) for r in results), PROBE_GRACE_S)
    return PydoryRun(
        msgs_per_s=_rate(settings.messages, first, settled_at),
        generator_msgs_per_s=_rate(settings.messages, first, last),
        cpu_us_per_msg=cpu / settings.messages * 1e6,
        system_us_per_msg=system / settings.messages * 1e6,
        rss_mb_idle=idle_rss,
        rss_mb_peak=peak_rss,
        p50_ms=latency.p50_ms,
        p99_ms=latency.p99_ms,
        latency_samples=latency.samples,
        delivered=books.delivered,
        discarded=sum(books.discarded.values()),
        discarded_by_reason=books.discarded,
    )


@contextlib.contextmanager
def _py_spy(pid: int, output: Path, workdir: Path) -> Iterator[None]:
    """Sample ``pid`` with py-spy while the block runs; write collapsed stacks to ``output``.

    py-spy pauses the process for each sample, so a profiled run's figures are not
    comparable with unprofiled ones: the harness profiles a separate run.
    """
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    output.parent.mkdir(parents=True, exist_ok=True)
    with open(workdir / "py-spy.stderr", "wb") as stderr:
        recorder = subprocess.Popen(
            [
                py_spy,
                "record",
                "--pid",
                str(pid),
                "--format",
                "raw",
                "--rate",
                "200",
                "--threads",
                "--output",
                str(output),
            ],
            stdout=stderr,
            stderr=stderr,
        )
    time.sleep(1.0)  # py-spy attaches before the load starts
    try:
        yield
    finally:
        recorder.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
        try:
            recorder.wait(30)
        except subprocess.TimeoutExpired:
            stop_process(recorder)
            raise BenchError("py-spy did not finish writing its profile") from None


# --- direct baseline ---------------------------------------------------------------------


def run_direct(settings: BenchSettings, workdir: Path) -> DirectRun:
    """One Python process producing the same N messages straight to a fresh mock cluster."""
    with contextlib.ExitStack() as stack:
        cluster = stack.enter_context(_mock_cluster())
        job = {
            "bootstrap": cluster.bootstrap_servers,
            "topic": TOPIC,
            "messages": settings.messages,
            "value_bytes": settings.value_bytes,
            "linger_ms": settings.linger_ms,
            "compression": settings.compression,
            "seed": 0,
            "probe_topic": PROBE_TOPIC,
            "probe_every": settings.probe_every,
            "deadline_s": settings.timeout_s,
        }
        probes = ProbeConsumer(cluster.bootstrap_servers, PROBE_TOPIC)
        probes.start()
        stack.callback(probes.stop)
        producer = ChildProcess("pydory_tools.bench.direct", job, workdir, "direct")
        stack.callback(producer.stop)
        producer.wait_ready(STARTUP_TIMEOUT_S)
        producer.go()
        result = producer.wait_result(settings.timeout_s)
        latency = probes.finish(int(result["probes"]), PROBE_GRACE_S)
    return DirectRun(
        msgs_per_s=_rate(settings.messages, result["first_produce"], result["last_ack"]),
        cpu_us_per_msg=result["cpu_s"] / settings.messages * 1e6,
        rss_mb_peak=result["rss_mb_peak"],
        p50_ms=latency.p50_ms,
        p99_ms=latency.p99_ms,
        delivered=result["delivered"],
        errors=result["errors"],
    )
