"""pydory bench: the workload, the settings, the figures' arithmetic, and one tiny real run.

No test here asserts a speed: the harness's figures are for BENCHMARKS.md, not for CI.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import sys
import threading
import time
from pathlib import Path

import pytest

from pydory import wire
from pydory.config import parse_config
from pydory_tools.bench import workload
from pydory_tools.bench.child import BenchError, ChildProcess
from pydory_tools.bench.cli import main as bench_main
from pydory_tools.bench.contention import HOG_CODE, cpu_hogs, hog_count
from pydory_tools.bench.daemon import BenchDaemon
from pydory_tools.bench.harness import round_order
from pydory_tools.bench.latency import percentile, summarize
from pydory_tools.bench.report import PydoryRun, Spread
from pydory_tools.bench.runs import daemon_config, generator_address
from pydory_tools.bench.settings import TOPIC, BenchSettings

# --- workload ------------------------------------------------------------------------------


@pytest.mark.parametrize("value_bytes", [8, 100, 1000, 10_000])
def test_values_have_exactly_the_requested_size(value_bytes: int) -> None:
    values = workload.make_values(value_bytes, 50, seed=1)
    assert {len(v) for v in values} == {value_bytes}
    assert len(set(values)) == 50


def test_encoded_messages_decode_to_the_bench_topic_with_the_settings_size() -> None:
    settings = BenchSettings(value_bytes=100)
    messages = workload.encoded_messages(TOPIC, 100, seed=0, count=20)
    for data in messages:
        assert len(data) == settings.message_size
        message = wire.decode(data)
        assert message.topic == TOPIC
        assert len(message.value) == 100
        assert message.partition_key is None


def test_stream_writes_hold_whole_batches_of_the_pool() -> None:
    messages = [bytes([i]) * 3 for i in range(10)]
    writes = workload.stream_writes(messages, 4)
    assert len(writes) == 3
    assert all(len(w) == 12 for w in writes)
    assert writes[2] == messages[8] + messages[9] + messages[0] + messages[1]


def test_a_probe_carries_its_send_time_and_the_value_size() -> None:
    data = workload.encode_probe("bench.probe", 100, send_time_ns=1_700_000_000_123_456_789)
    message = wire.decode(data)
    assert len(message.value) == 100
    assert workload.probe_send_time_ns(message.value) == 1_700_000_000_123_456_789
    assert message.timestamp_ms == 1_700_000_000_123


def test_split_gives_every_message_to_one_process_and_counts_probes() -> None:
    shares = workload.split_messages(1003, 4, probe_every=100)
    assert [s.messages for s in shares] == [251, 251, 251, 250]
    assert [s.probes for s in shares] == [2, 2, 2, 2]
    assert workload.split_messages(50, 1, probe_every=0)[0].probes == 0


# --- settings and config -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "complaint"),
    [
        ({"transport": "carrier-pigeon"}, "transport must be one of"),
        ({"compression": "brotli"}, "compression must be one of"),
        ({"messages": 0}, "messages must be at least 1"),
        ({"value_bytes": 4}, "value_bytes must be at least 8"),
        ({"transport": "dgram", "batch": 8}, "batch must be 1"),
        ({"transport": "dgram", "value_bytes": 70_000}, "use a stream transport"),
        ({"processes": 5, "messages": 4}, "more generator processes than messages"),
        ({"daemon_source": Path("/nonexistent")}, "holds no pydory package"),
        ({"contend": -1}, "contend must be >= 0"),
        ({"rate": 0.0}, "rate must be > 0"),
    ],
)
def test_inconsistent_settings_are_refused(kwargs: dict[str, object], complaint: str) -> None:
    with pytest.raises(ValueError, match=complaint):
        BenchSettings(**kwargs)  # type: ignore[arg-type]


def test_probes_stay_under_one_percent_of_the_load() -> None:
    assert BenchSettings(messages=2_000_000).probe_every == 2000
    assert BenchSettings(messages=1000).probe_every == 100


@pytest.mark.parametrize("transport", ["dgram", "stream", "tcp"])
def test_the_daemon_config_is_valid_and_enables_only_the_transport(
    transport: str, tmp_path: Path
) -> None:
    settings = BenchSettings(transport=transport, compression="lz4")
    config = daemon_config(settings, "127.0.0.1:9092,127.0.0.1:9093", tmp_path)
    parsed = parse_config(config.render(), source="<bench>")
    sources = parsed.inputs
    assert (sources.unix_datagram.path is not None) == (transport == "dgram")
    assert (sources.unix_stream.path is not None) == (transport == "stream")
    assert (sources.tcp.port is not None) == (transport == "tcp")
    assert parsed.compression_for(TOPIC).type == "lz4"
    address = generator_address(config, transport)
    expected = {"dgram": config.datagram_path, "stream": config.stream_path}
    assert address == expected.get(transport, config.tcp_port)


# --- arithmetic ----------------------------------------------------------------------------


def test_nearest_rank_percentiles() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.50) == 50.0
    assert percentile(values, 0.99) == 99.0
    assert percentile([7.0], 0.99) == 7.0
    summary = summarize([3.0, 1.0, 2.0])
    assert (summary.samples, summary.p50_ms, summary.max_ms) == (3, 2.0, 3.0)
    assert summarize([]).p50_ms is None


def test_spread_ignores_rounds_without_the_figure() -> None:
    assert Spread.of([3.0, None, 1.0, 2.0]) == Spread(1.0, 2.0, 3.0)
    assert Spread.of([None]) == Spread(None, None, None)


def test_every_kind_takes_every_position_across_rounds() -> None:
    orders = [round_order(r, baselines=True) for r in range(3)]
    for position in range(3):
        assert {order[position] for order in orders} == {"raw", "pydory", "direct"}
    assert round_order(1, baselines=False) == ["pydory"]


# --- processes -----------------------------------------------------------------------------


def test_a_child_that_fails_is_reported_with_its_reason(tmp_path: Path) -> None:
    job = {
        "transport": "dgram",
        "address": str(tmp_path / "nobody-listens.sock"),
        "messages": 10,
        "value_bytes": 100,
        "batch": 1,
        "topic": TOPIC,
        "probe_topic": "bench.probe",
        "probe_every": 0,
        "seed": 0,
        "deadline_s": 10,
    }
    child = ChildProcess("pydory_tools.bench.generator", job, tmp_path, "generator-0")
    try:
        with pytest.raises(BenchError, match="generator-0: FileNotFoundError"):
            child.wait_ready(30)
    finally:
        child.stop()


@pytest.mark.slow
def test_a_tiny_run_delivers_everything_and_reports_issue_6_keys(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status = bench_main(["--transport", "dgram", "-n", "2000", "--rounds", "1", "--json"])
    assert status == 0
    report = json.loads(capsys.readouterr().out)
    required = {
        "transport",
        "messages",
        "value_bytes",
        "rounds",
        "pydory_msgs_per_s",
        "generator_msgs_per_s",
        "raw_msgs_per_s",
        "direct_msgs_per_s",
        "pydory_cpu_us_per_msg",
        "pydory_rss_mb_peak",
        "p50_ms",
        "p99_ms",
        "delivered",
        "discarded",
    }
    assert required <= report.keys()
    assert (report["transport"], report["messages"], report["rounds"]) == ("dgram", 2000, 1)
    assert report["delivered"] == 2000
    assert report["discarded"] == 0
    for figure in ("pydory_msgs_per_s", "raw_msgs_per_s", "direct_msgs_per_s"):
        assert report[figure] > 0
    assert report["p50_ms"] <= report["p99_ms"]
    assert report["environment"]["max_dgram_qlen"] is not None


# --- the spool variants --------------------------------------------------------------------


def test_spool_variants_are_checked() -> None:
    assert BenchSettings(spool=("off", "none", "1000", "always")).spool[2] == "1000"
    for bad in [(), ("off", "off"), ("sometimes",), ("0",), ("-5",)]:
        with pytest.raises(ValueError, match="spool"):
            BenchSettings(spool=bad)


def test_each_spool_variant_is_a_kind_that_takes_every_position() -> None:
    variants = ("off", "none", "1000")
    kinds = ["raw", "pydory", "pydory+spool:none", "pydory+spool:1000", "direct"]
    orders = [round_order(r, baselines=True, spool=variants) for r in range(len(kinds))]
    for position in range(len(kinds)):
        assert {order[position] for order in orders} == set(kinds)
    assert round_order(0, baselines=False, spool=variants) == kinds[1:4]


@pytest.mark.parametrize(("variant", "fsync_ms"), [("none", None), ("always", 0), ("1000", 1000)])
def test_the_daemon_config_of_a_spool_variant(
    variant: str, fsync_ms: int | None, tmp_path: Path
) -> None:
    settings = BenchSettings(spool=("off", variant))
    off = parse_config(daemon_config(settings, "127.0.0.1:9092", tmp_path).render(), "<b>")
    assert off.spool.path is None
    config = daemon_config(settings, "127.0.0.1:9092", tmp_path, spool=variant)
    spool = parse_config(config.render(), source="<bench>").spool
    assert spool.path == str(tmp_path / "spool")
    assert spool.fsync_interval_ms == fsync_ms


def test_the_spool_segment_size_reaches_the_daemon_config(tmp_path: Path) -> None:
    settings = BenchSettings(spool=("1000",), spool_segment_size="64m")
    config = daemon_config(settings, "127.0.0.1:9092", tmp_path, spool="1000")
    assert parse_config(config.render(), source="<bench>").spool.segment_bytes == 64 << 20
    default = daemon_config(BenchSettings(spool=("1000",)), "127.0.0.1:9092", tmp_path, "1000")
    assert parse_config(default.render(), source="<bench>").spool.segment_bytes == 4 << 20
    for bad in ["", "0", "64x", "-4m"]:
        with pytest.raises(ValueError, match="segment size"):
            BenchSettings(spool_segment_size=bad)


def test_daemon_cpus_are_a_cpu_list_and_pin_the_daemon(tmp_path: Path) -> None:
    assert BenchSettings(daemon_cpus="0,1").daemon_cpus == "0,1"
    for bad in ["", "a", "0;1", "-1"]:
        with pytest.raises(ValueError, match="daemon cpus"):
            BenchSettings(daemon_cpus=bad)
    config = daemon_config(BenchSettings(), "127.0.0.1:9092", tmp_path)
    assert BenchDaemon(config, tmp_path, cpus="0").command[:3] == ["taskset", "-c", "0"]
    assert BenchDaemon(config, tmp_path).command[0] == sys.executable


def test_identity_headers_can_be_turned_off_for_a_run(tmp_path: Path) -> None:
    for headers in (True, False):
        settings = BenchSettings(identity_headers=headers)
        config = parse_config(daemon_config(settings, "127.0.0.1:9092", tmp_path).render(), "<b>")
        assert config.message_identity.headers is headers


@pytest.mark.slow
def test_a_tiny_run_with_the_daemon_on_one_cpu(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--transport", "stream", "-n", "2000", "--rounds", "1", "--no-baselines"]
    assert bench_main([*argv, "--daemon-cpus", "0", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["daemon_cpus"], report["delivered"], report["discarded"]) == ("0", 2000, 0)
    # the kernel's part of the daemon's CPU is reported apart, and is a part of it
    assert 0 <= report["pydory_system_us_per_msg"] <= report["pydory_cpu_us_per_msg"]


def test_an_offered_rate_paces_the_generators(capsys: pytest.CaptureFixture[str]) -> None:
    """With --rate, the run takes at least messages / rate seconds (less one tick of 1 ms,
    which is sent at once): the generators sent no faster than offered. No upper bound on
    the time (a loaded machine may fall behind), so none on the rate achieved."""
    messages, rate = 3000, 3000.0
    argv = ["--transport", "stream", "-n", str(messages), "--rounds", "1", "--no-baselines"]
    assert bench_main([*argv, "--batch", "4", "--rate", str(rate), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["offered_msgs_per_s"] == rate
    assert (report["delivered"], report["discarded"]) == (messages, 0)
    sending_s = messages / report["generator_msgs_per_s"]
    assert sending_s >= (messages - 4) / rate - 0.01
    assert report["pydory_msgs_per_s"] <= report["generator_msgs_per_s"]


def test_the_pacer_sends_whole_writes_of_one_tick_each() -> None:
    from pydory_tools.bench.generator import Pacer

    assert Pacer(100_000, 1, 0.0).step == 100  # 1 ms of messages
    assert Pacer(100_000, 64, 0.0).step == 128  # whole writes of 64
    assert Pacer(10, 64, 0.0).step == 64  # at least one write


@pytest.mark.slow
def test_a_tiny_run_measures_every_spool_variant_side_by_side(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["--transport", "stream", "-n", "2000", "--rounds", "1", "--no-baselines"]
    status = bench_main([*argv, "--spool", "off,none,1000", "--json"])
    assert status == 0
    report = json.loads(capsys.readouterr().out)
    assert report["spool"] == ["off", "none", "1000"]
    assert report["delivered"] == 2000
    for label in ("none", "1000ms"):
        assert report[f"pydory_spool_{label}_delivered"] == 2000
        assert report[f"pydory_spool_{label}_discarded"] == 0
        assert report[f"pydory_spool_{label}_msgs_per_s"] > 0
        assert report[f"pydory_spool_{label}_generator_msgs_per_s"] > 0
        # Clock ticks (10 ms): 2000 messages may take less than one on the compiled path.
        assert report[f"pydory_spool_{label}_cpu_us_per_msg"] >= 0


def received_through(kind: int, batch: int, count: int, compiled: bool) -> list[bytes]:
    """What a Writer sends of ``count`` messages over a socket pair, read as it comes (by
    a thread): the bytes of a stream, or each datagram."""
    from pydory_tools.bench import workload
    from pydory_tools.bench.generator import Writer

    messages = workload.encoded_messages("t", 20, seed=7)[:50]
    stream = kind == socket.SOCK_STREAM
    sender, receiver = socket.socketpair(socket.AF_UNIX, kind)
    got: list[bytes] = []

    def read() -> None:
        if stream:
            got.append(b"".join(iter(lambda: receiver.recv(65536), b"")))
        else:
            got.extend(receiver.recv(65536) for _ in range(count))

    reader = threading.Thread(target=read)
    with receiver:
        reader.start()
        with sender:
            sender.settimeout(60)
            writer = Writer(sender, messages, batch, stream, time.monotonic() + 60, compiled)
            assert writer.compiled is compiled
            writer.send_messages(count // 3)
            writer.send_messages(count - count // 3)  # the index carries on
        reader.join(timeout=60)
    return got


@pytest.mark.skipif(
    importlib.util.find_spec("pydory_tools._cloadgen") is None, reason="_cloadgen is not built here"
)
@pytest.mark.parametrize(
    ("kind", "batch"), [(socket.SOCK_STREAM, 1), (socket.SOCK_STREAM, 7), (socket.SOCK_DGRAM, 1)]
)
def test_the_compiled_generator_writes_exactly_what_the_python_one_writes(
    kind: int, batch: int
) -> None:
    count = 120 * batch + (batch - 1)  # wraps around the pool, and a partial last write
    assert received_through(kind, batch, count, True) == received_through(kind, batch, count, False)


# --- contention (--contend) ----------------------------------------------------------------


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie is not: it has exited)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def test_contend_makes_n_hogs_per_core() -> None:
    assert hog_count(4, cpus=2) == 8
    assert hog_count(0, cpus=2) == 0
    assert hog_count(1) >= 1  # this host's cores


def test_the_hogs_run_during_the_block_and_are_gone_after_it() -> None:
    with cpu_hogs(2, cpus=1) as hogs:
        pids = [hog.pid for hog in hogs]
        assert len(pids) == 2
        assert all(hog.poll() is None for hog in hogs)
        assert all(_running(pid) for pid in pids)
    assert all(hog.returncode is not None for hog in hogs)  # reaped by their Popens
    assert not any(_running(pid) for pid in pids)


def test_the_hogs_are_stopped_when_the_block_is_interrupted() -> None:
    started: list[int] = []

    def interrupted_block() -> None:
        with cpu_hogs(1, cpus=2) as hogs:
            started.extend(hog.pid for hog in hogs)
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        interrupted_block()
    assert len(started) == 2
    assert not any(_running(pid) for pid in started)


def _hogs_of_this_process() -> list[int]:
    """The live hog processes this test process started (by their parent and command)."""
    return [
        pid
        for pid in (int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit())
        if _parent(pid) == os.getpid() and HOG_CODE in _cmdline(pid) and _running(pid)
    ]


@pytest.mark.parametrize("interrupted", [False, True])
def test_a_bench_with_contend_runs_its_runs_beside_the_hogs_and_stops_them(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], interrupted: bool
) -> None:
    """The hogs run while the runs do, the JSON says how many and the 1-minute load, and
    they are gone when the bench ends, also when a run is interrupted (the runs are
    stand-ins here: the hogs' lifecycle is what is tested)."""
    from pydory_tools.bench import harness

    seen: list[list[int]] = []

    def stand_in(settings: BenchSettings, workdir: Path, **_: object) -> PydoryRun:
        seen.append(_hogs_of_this_process())
        if interrupted:
            raise KeyboardInterrupt
        return PydoryRun(1.0, 1.0, 1.0, 50.0, 60.0, None, None, 0, settings.messages, 0)

    monkeypatch.setattr(harness, "run_pydory", stand_in)
    argv = ["-n", "1000", "-r", "1", "--no-baselines", "--contend", "1", "--json"]
    if interrupted:
        with pytest.raises(KeyboardInterrupt):
            bench_main(argv)
    else:
        assert bench_main(argv) == 0
        report = json.loads(capsys.readouterr().out)
        assert (report["contend"], report["contend_processes"]) == (1, hog_count(1))
        assert report["load_1min_at_end"] >= 0
        assert report["load_1min_at_start"] >= 0
    assert [len(hogs) for hogs in seen] == [hog_count(1)]
    assert not any(_running(pid) for pid in seen[0])
    assert _hogs_of_this_process() == []


def _parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])
    except (FileNotFoundError, IndexError, ValueError):
        return -1


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except FileNotFoundError:
        return ""
