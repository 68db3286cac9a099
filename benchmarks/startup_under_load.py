"""Time from exec to the input sockets accepting, on a host whose CPUs are saturated
(issue 33, point 5).

Target: the sockets accept within 1 s of exec with eight CPU hogs per core (a 1-minute
load of ~16 on a 2-core machine). Before the change, with the load at 36-45 on 2 cores,
they took 4-16 s: `pydory serve` imported the daemon (uvloop, aiohttp, confluent_kafka,
prometheus_client, the config loader) before it bound them, and clients got "No such
file or directory" meanwhile.

Not a test. Run (no Kafka needed: the config points at a closed port, and the daemon
opens its sockets without waiting for Kafka):

    .venv/bin/python benchmarks/startup_under_load.py [--runs 7] [--baseline-src DIR/src]

Bytecode: each daemon keeps its compiled modules in a temporary cache (filled by one
unmeasured start of each tree), as an install from a wheel has them; ``--no-bytecode``
compiles every module at every start instead (what a tree run with
PYTHONDONTWRITEBYTECODE=1 and no ``__pycache__`` does, as this project's shared machine
is set up: exec to ready then costs ~0.8 s of CPU, not ~0.4 s).

It starts ``--hogs-per-cpu`` (8) busy loops per CPU, each under ``timeout`` (bounded in
time) and stopped by its PID at the end, waits ``--warmup`` seconds for the load to
build, then runs ``pydory serve`` ``--runs`` times (alternating with the baseline tree's
when given: ``git archive REV src | tar -x -C DIR``), each until the UNIX datagram, UNIX
stream and TCP sockets all accept, then until its "ready" line (inputs and status pages
open), then SIGTERM. Each run prints both times and the 1-minute load average; the
median of each comes last.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

#: The far-off bound on one run (a start that never opens fails the run, loudly).
RUN_TIMEOUT_S = 120.0
CONFIG = """<?xml version="1.0" encoding="US-ASCII"?>
<doryConfig>
    <inputSources>
        <unixDatagram enable="true">
            <path value="{dir}/dgram.sock" /><mode value="0666" />
        </unixDatagram>
        <unixStream enable="true">
            <path value="{dir}/stream.sock" /><mode value="0666" />
        </unixStream>
        <tcp enable="true"><port value="{tcp_port}" /></tcp>
    </inputSources>
    <httpInterface><port value="{http_port}" /><loopbackOnly value="true" /></httpInterface>
    <initialBrokers><broker host="127.0.0.1" port="{kafka_port}" /></initialBrokers>
</doryConfig>
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def start_hogs(count: int, bound_s: float) -> list[subprocess.Popen[bytes]]:
    """``count`` busy loops, each ended by ``timeout`` after ``bound_s`` at the latest."""
    return [
        subprocess.Popen(["timeout", str(int(bound_s)), "sh", "-c", "while :; do :; done"])
        for _ in range(count)
    ]


def stop_hogs(hogs: list[subprocess.Popen[bytes]]) -> None:
    for hog in hogs:
        if hog.poll() is None:
            os.kill(hog.pid, signal.SIGTERM)  # timeout passes it on to its busy loop
    for hog in hogs:
        hog.wait()


def accepts(directory: str, tcp_port: int) -> bool:
    """Whether all three input sockets take a client now."""
    probes = [
        (socket.AF_UNIX, socket.SOCK_DGRAM, f"{directory}/dgram.sock"),
        (socket.AF_UNIX, socket.SOCK_STREAM, f"{directory}/stream.sock"),
        (socket.AF_INET, socket.SOCK_STREAM, ("127.0.0.1", tcp_port)),
    ]
    for family, kind, address in probes:
        with socket.socket(family, kind) as probe:
            try:
                probe.connect(address)
            except OSError:
                return False
    return True


def one_run(
    src: str | None, config_path: str, directory: str, tcp_port: int, pycache: str | None
) -> tuple[float, float]:
    """Seconds from exec to the sockets accepting, and to the "ready" line."""
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = src
    if pycache is not None:  # bytecode kept, as an install from a wheel has it
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = pycache
    ready = threading.Event()
    start = time.monotonic()
    daemon = subprocess.Popen(
        [sys.executable, "-m", "pydory", "serve", "--config-path", config_path],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
    )
    ready_at: list[float] = []

    def watch() -> None:
        assert daemon.stderr is not None
        for line in daemon.stderr:
            if b"pydory serve: ready" in line and not ready_at:
                ready_at.append(time.monotonic())
                ready.set()

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        while not accepts(directory, tcp_port):
            if daemon.poll() is not None or time.monotonic() - start > RUN_TIMEOUT_S:
                raise SystemExit(f"pydory serve did not open its sockets (exit {daemon.poll()})")
            time.sleep(0.005)  # the probe must not take the CPU the daemon needs
        sockets_s = time.monotonic() - start
        if not ready.wait(RUN_TIMEOUT_S):
            raise SystemExit("pydory serve never said it was ready")
        return sockets_s, ready_at[0] - start
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=RUN_TIMEOUT_S)
        watcher.join(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--hogs-per-cpu", type=int, default=8)
    parser.add_argument("--warmup", type=float, default=60.0, help="seconds for the load to build")
    parser.add_argument("--baseline-src", help="another tree's src/ to alternate with")
    parser.add_argument(
        "--no-bytecode",
        action="store_true",
        help="compile every module at every start (PYTHONDONTWRITEBYTECODE as set); by "
        "default the daemons keep their bytecode in a temporary cache, filled by an "
        "unmeasured first start of each tree before the hogs, as a wheel install has it",
    )
    args = parser.parse_args()
    cpus = os.cpu_count() or 1
    trees: dict[str, str | None] = {"this tree": None}
    if args.baseline_src:
        trees["baseline"] = str(Path(args.baseline_src).resolve())
    bound_s = args.warmup + args.runs * len(trees) * (RUN_TIMEOUT_S / 4) + 60
    with tempfile.TemporaryDirectory(prefix="pydory-start-") as directory:
        tcp_port = free_port()
        config_path = f"{directory}/pydory.xml"
        Path(config_path).write_text(
            CONFIG.format(
                dir=directory, tcp_port=tcp_port, http_port=free_port(), kafka_port=free_port()
            )
        )
        pycache = None if args.no_bytecode else f"{directory}/pycache"
        if pycache is not None:
            for src in trees.values():  # fills the cache (each tree its own paths)
                one_run(src, config_path, directory, tcp_port, pycache)
        hogs = start_hogs(cpus * args.hogs_per_cpu, bound_s)
        try:
            print(f"{len(hogs)} hogs on {cpus} CPUs; load builds for {args.warmup:.0f} s")
            time.sleep(args.warmup)
            results: dict[str, list[tuple[float, float, float]]] = {t: [] for t in trees}
            for run in range(args.runs):
                for name, src in trees.items():
                    sockets_s, ready_s = one_run(src, config_path, directory, tcp_port, pycache)
                    load = os.getloadavg()[0]
                    results[name].append((sockets_s, ready_s, load))
                    print(
                        f"run {run + 1} {name}: sockets accept at {sockets_s:.3f} s, "
                        f"ready at {ready_s:.3f} s (1-minute load {load:.1f})",
                        flush=True,
                    )
        finally:
            stop_hogs(hogs)
    for name, rows in results.items():
        sockets = statistics.median(r[0] for r in rows)
        ready = statistics.median(r[1] for r in rows)
        loads = [r[2] for r in rows]
        print(
            f"{name}: median sockets {sockets:.3f} s (min {min(r[0] for r in rows):.3f}, "
            f"max {max(r[0] for r in rows):.3f}), median ready {ready:.3f} s; "
            f"load {min(loads):.1f}-{max(loads):.1f}"
        )


if __name__ == "__main__":
    main()
