"""Count the daemon's instructions per message under callgrind: a figure the machine's other
load does not move, for comparing daemon trees on a shared host. Not a test.

    .venv/bin/python benchmarks/instructions.py --tree base=/tmp/pydory-base/src \
        --tree head=src --cell stream-1 --spool off -n 20000,100000 --output FILE.jsonl

One `pydory bench` pydory run (the harness's own `run_pydory`: mock cluster, C load
generator, probes) per tree, cell and N, with ``pydory serve`` under
``valgrind --tool=callgrind --separate-threads=yes``. Start-up, imports and shutdown cost
the same at every N, so the figure is the slope: (instructions at the larger N - at the
smaller) / (the difference of N), for the whole process and for the loop's thread alone
(librdkafka's threads are the rest). Under callgrind the daemon runs ~50x slower than the
generator, so its reads find full socket queues: bursts are larger than on a native run,
and per-burst costs weigh less per message than they do there; and messages may take
other paths than natively (a full librdkafka queue, say): compare the compiled
functions per call (``callgrind_annotate --inclusive=yes`` of the kept files, --keep)
rather than whole-process totals, which time-driven work (timers, statistics) inflates.
One N (``-n 10000``): each figure / N, for --keep's function-level counts.

``--syscalls``: instead, one native run (no callgrind) of the last N with ``perf stat``
attached to the daemon for the load: the loop thread's read(2)/recvmmsg(2) calls per
message, i.e. how many messages a read carries natively (a count, not a time); with
``--rate N``, at that offered load (paced) instead of as fast as possible.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pydory_tools.bench import daemon, procfs, runs
from pydory_tools.bench.settings import BenchSettings
from pydory_tools.testing import daemon_process

#: The cells of benchmarks/trees_interleaved.py: name -> (transport, messages per write).
CELLS = {"dgram": ("dgram", 1), "stream-1": ("stream", 1), "stream-64": ("stream", 64),
         "tcp-1": ("tcp", 1)}  # fmt: skip
#: Under callgrind, start-up (imports, the first metadata) takes minutes, not seconds.
SLOW_START_S = 900.0


#: Where callgrind writes the run's files (set per run; the patch below reads it).
OUT_DIR = Path(".")


def under_callgrind(instr_later: bool = False) -> None:
    """Make the harness start ``pydory serve`` under callgrind (one file per thread, in
    OUT_DIR), and zero its counts when the harness reads the daemon's CPU time before the
    load starts: start-up and imports are left out (the slope removes shutdown).
    ``instr_later``: callgrind's instrumentation is off until then instead (start-up runs
    under valgrind's plain translation, several times faster than counted; the counts are
    the same, but a function already running when it starts, the loop's ``run``, has no
    inclusive figure)."""
    plain_command, plain_cpu = daemon_process.serve_command, procfs.cpu_seconds
    later = ["--instr-atstart=no"] if instr_later else []

    def serve_command(*args: Any, **kwargs: Any) -> list[str]:
        return [
            "valgrind", "--tool=callgrind", "--separate-threads=yes", *later,
            f"--callgrind-out-file={OUT_DIR}/callgrind.out.%p", *plain_command(*args, **kwargs),
        ]  # fmt: skip

    def cpu_seconds(pid: int) -> float:
        if not list(OUT_DIR.glob("zeroed")):  # the first look: the load starts next
            command = ["--instr=on"] if instr_later else ["--zero"]
            subprocess.run(["callgrind_control", *command, str(pid)], check=True,
                           capture_output=True)  # fmt: skip
            (OUT_DIR / "zeroed").touch()
        return plain_cpu(pid)

    daemon_process.serve_command = serve_command  # type: ignore[assignment]
    procfs.cpu_seconds = cpu_seconds  # type: ignore[assignment]
    runs.STARTUP_TIMEOUT_S = SLOW_START_S
    daemon.STOP_GRACE_S = SLOW_START_S  # type: ignore[misc]  # callgrind writes at exit
    # A look at /books/json under callgrind, on a loaded machine, can take over 5 s.
    daemon.HTTP_TIMEOUT_S = 120.0  # type: ignore[misc]


def thread_totals(out_dir: Path) -> dict[int, int]:
    """Thread number -> instructions (``totals:`` or ``summary:`` of each file)."""
    totals = {}
    for path in out_dir.glob("callgrind.out.*"):
        match = re.search(r"-(\d+)$", path.name)
        thread = int(match.group(1)) if match else 1
        for line in path.read_text(errors="replace").splitlines():
            if line.startswith(("totals:", "summary:")):
                totals[thread] = int(line.split()[1])
    return totals


def measure(
    tree: str, cell: str, spool: str, messages: int, keep: Path | None, rate: float | None = None
) -> dict[str, Any]:
    transport, batch = CELLS[cell]
    settings = BenchSettings(
        transport=transport, batch=batch, messages=messages, rounds=1, baselines=False,
        daemon_source=Path(tree).resolve(), spool=(spool,), timeout_s=3600.0, rate=rate,
    )  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="pydory-instructions-") as tmp:
        global OUT_DIR
        OUT_DIR = keep or Path(tmp) / "callgrind"
        OUT_DIR.mkdir(parents=True, exist_ok=True)
        run = runs.run_pydory(settings, Path(tmp), spool=spool)
        totals = thread_totals(OUT_DIR)
    return {
        "messages": messages,
        "delivered": run.delivered,
        "discarded": run.discarded,
        "instructions": sum(totals.values()),
        "loop_instructions": totals.get(1, 0),
    }


#: The loop thread's system calls counted in a native run (--syscalls): its reads and turns.
SYSCALLS = ("read", "recvfrom", "recvmsg", "recvmmsg", "epoll_wait", "epoll_ctl", "write",
            "pwrite64", "setsockopt", "futex")  # fmt: skip


def count_syscalls(
    tree: str, cell: str, spool: str, messages: int, rate: float | None = None
) -> dict[str, Any]:
    """One native run (no callgrind) with ``perf stat`` attached to the daemon from the
    load's start to its settling: the loop thread's reads and epoll_waits per message,
    which say how large its bursts are outside callgrind (a count, not a time). ``rate``:
    the load offered, paced (`pydory bench --rate`); None: as fast as possible."""
    transport, batch = CELLS[cell]
    settings = BenchSettings(
        transport=transport, batch=batch, messages=messages, rounds=1, baselines=False,
        daemon_source=Path(tree).resolve(), spool=(spool,), rate=rate,
    )  # fmt: skip
    plain_cpu = procfs.cpu_seconds
    with tempfile.TemporaryDirectory(prefix="pydory-syscalls-") as tmp:
        output = Path(tmp) / "perf.txt"
        perf: list[subprocess.Popen[bytes]] = []
        daemon_pid: list[int] = []

        def cpu_seconds(pid: int) -> float:
            if not perf:  # before the load: attach
                daemon_pid.append(pid)
                events = ",".join(f"syscalls:sys_enter_{name}" for name in SYSCALLS)
                perf.append(subprocess.Popen(
                    ["perf", "stat", "--per-thread", "-x", ",", "-e", events, "-p", str(pid),
                     "-o", str(output)]))  # fmt: skip
                time.sleep(1.0)  # not a measurement: perf attaches before the load
            else:  # settled: detach (perf writes its counts on SIGINT)
                perf[0].send_signal(signal.SIGINT)
                perf[0].wait(60)
            return plain_cpu(pid)

        procfs.cpu_seconds = cpu_seconds  # type: ignore[assignment]
        try:
            run = runs.run_pydory(settings, Path(tmp), spool=spool)
        finally:
            procfs.cpu_seconds = plain_cpu  # type: ignore[assignment]
            if perf and perf[0].poll() is None:
                perf[0].kill()
        counts: dict[str, int] = {}
        every: dict[str, int] = {}  # every thread's (librdkafka's, the disk worker's too)
        for line in output.read_text().splitlines():
            fields = line.split(",")
            if len(fields) <= 3 or not fields[1].isdigit():
                continue
            name = fields[3].removeprefix("syscalls:sys_enter_")
            every[name] = every.get(name, 0) + int(fields[1])
            # "comm-tid,count,,event,...": the loop's thread is the one whose tid is the pid
            if fields[0].endswith(f"-{daemon_pid[0]}"):
                counts[name] = counts.get(name, 0) + int(fields[1])
    return {
        "messages": messages,
        "delivered": run.delivered,
        "cpu_us_per_msg": run.cpu_us_per_msg,
        "system_us_per_msg": run.system_us_per_msg,
        **{f"{name}_per_msg": count / messages for name, count in counts.items()},
        **{f"all_{name}_per_msg": count / messages for name, count in every.items()},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n\n")[0])
    parser.add_argument("--tree", action="append", required=True, metavar="NAME=DIR")
    parser.add_argument("--cell", action="append", choices=sorted(CELLS), required=True)
    parser.add_argument("--spool", default="off", help="off, or an fsync interval in ms")
    parser.add_argument("-n", default="20000,100000", help="the two Ns (default 20000,100000)")
    parser.add_argument("--output", type=Path, help="append one JSON line per tree and cell")
    parser.add_argument("--keep", type=Path, help="keep the callgrind files under this dir")
    parser.add_argument("--instr-later", action="store_true",
                        help="callgrind's instrumentation off until the load starts (a faster "
                        "start-up; the same counts)")  # fmt: skip
    parser.add_argument("--syscalls", action="store_true",
                        help="instead: count the loop's system calls per message in a native "
                        "run of the larger N (perf stat)")  # fmt: skip
    parser.add_argument("--rate", type=float, metavar="N",
                        help="N messages/s offered, paced (pydory bench --rate); default: as "
                        "fast as possible. Under callgrind the daemon runs ~50x slower: a "
                        "rate it keeps up with there (a few thousand) gives small bursts, "
                        "as a moderate load does natively")  # fmt: skip
    args = parser.parse_args()
    counts = [int(n) for n in args.n.split(",")]
    small, large = counts[0], counts[-1]  # one N: no slope, each figure / N (for --keep)
    if args.syscalls:
        for cell in args.cell:
            for tree_text in args.tree:
                name, _, directory = tree_text.partition("=")
                row = count_syscalls(directory, cell, args.spool, large, args.rate)
                print(json.dumps({"tree": name, "cell": cell, "spool": args.spool, **row}))
        return 0
    under_callgrind(args.instr_later)
    for cell in args.cell:
        for tree_text in args.tree:
            name, _, directory = tree_text.partition("=")
            keep = args.keep / f"{name}-{cell}-{args.spool}" if args.keep else None
            high = measure(
                directory, cell, args.spool, large, keep and keep / str(large), args.rate
            )
            low = (
                measure(directory, cell, args.spool, small, keep and keep / str(small), args.rate)
                if small != large
                else {"instructions": 0, "loop_instructions": 0}
            )
            row = {
                "tree": name, "cell": cell, "spool": args.spool, "runs": [low, high],
                "offered_msgs_per_s": args.rate,
                "instructions_per_msg": (high["instructions"] - low["instructions"])
                / (large - small or large),
                "loop_instructions_per_msg": (high["loop_instructions"] - low["loop_instructions"])
                / (large - small or large),
            }  # fmt: skip
            print(json.dumps(row), flush=True)
            if args.output:
                with args.output.open("a") as output:
                    output.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
