"""Start-up of the quick commands, whole process, this tree against another (issue 23 item 5).

Target: `pydory --help`, `pydory send`, `pydory status` and `pydory wait` each start and
exit in 80 ms of wall time or less. `send` really sends (to a datagram socket this script
reads); `status` and `wait` ask a status port nobody listens on, so they measure start-up,
argument parsing and one refused connection.

Not a test. Run, with a baseline tree made by `git archive REV src | tar -x -C DIR`:

    .venv/bin/python benchmarks/cli_startup.py --baseline-src DIR/src [--runs 20]

Runs alternate between the two trees (A B A B ...), so a machine whose load drifts slows
both alike; each figure is min / median / max of wall and CPU (user + system) seconds.
"""

from __future__ import annotations

import argparse
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

PYDORY = str(Path(sys.executable).parent / "pydory")


def commands(datagram_path: str, closed_port: int) -> dict[str, list[str]]:
    url = f"http://127.0.0.1:{closed_port}"
    return {
        "--help": ["--help"],
        "send": ["send", "--socket-path", datagram_path, "--topic", "t", "--value", "v"],
        "status": ["status", "--url", url],
        "wait": ["wait", "--url", url, "--timeout", "0"],
    }


def run_once(argv: list[str], src: str | None) -> tuple[float, float]:
    """One run: wall seconds and CPU seconds of the child."""
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = src  # before the editable install's path: that tree wins
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run([PYDORY, *argv], env=env, capture_output=True, check=False)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def spread(values: list[float]) -> str:
    ms = [v * 1000 for v in values]
    return f"{min(ms):6.1f} / {statistics.median(ms):6.1f} / {max(ms):6.1f}"


def drain(receiver: socket.socket) -> None:
    while True:
        try:
            receiver.recv(1 << 16)
        except OSError:
            return


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline-src", help="the other tree's src/ (default: none)")
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    trees = {"this tree": None}
    if args.baseline_src:
        trees["baseline"] = args.baseline_src
    with tempfile.TemporaryDirectory(prefix="pydory-cli-") as scratch:
        path = os.path.join(scratch, "dgram.sock")
        receiver = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        receiver.bind(path)
        threading.Thread(target=drain, args=(receiver,), daemon=True).start()
        with socket.socket() as probe:  # a loopback port nothing listens on
            probe.bind(("127.0.0.1", 0))
            closed_port = probe.getsockname()[1]
        print(
            f"{'command':<8} {'tree':<10} {'wall ms min / median / max':>28}"
            f" {'cpu ms min / median / max':>28}"
        )
        for name, argv in commands(path, closed_port).items():
            figures: dict[str, list[tuple[float, float]]] = {tree: [] for tree in trees}
            for src in trees.values():
                run_once(argv, src)  # warm-up: the page cache, not counted
            for _ in range(args.runs):
                for tree, src in trees.items():
                    figures[tree].append(run_once(argv, src))
            for tree, runs in figures.items():
                walls, cpus = [w for w, _ in runs], [c for _, c in runs]
                print(f"{name:<8} {tree:<10} {spread(walls):>28} {spread(cpus):>28}")
        receiver.close()


if __name__ == "__main__":
    main()
