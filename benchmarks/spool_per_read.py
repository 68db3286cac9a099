"""What the spool costs a datagram, per thread, in instructions and system calls: one native
`pydory bench` pydory run (the harness's own ``run_pydory``: mock cluster, C load
generator) per spool variant and N, with ``perf stat --per-thread`` attached to
``pydory serve`` from the load's start to its settling. Counts, not times: a shared
machine moves them less than it moves the clock (though the drain's bursts still follow
the timing: the loop's ``read`` of the drain's eventfd, one per burst taken, is counted
too, so each row says how large its bursts were). Not a test.

    .venv/bin/python benchmarks/spool_per_read.py --tree head=src --spool off,1000 \
        -n 200000,600000 --output FILE.jsonl

Per message is the slope between the two Ns (start-up and shutdown are outside the
window; time-driven work inside it is not removed by the slope, only diluted). Threads:
``loop`` (the thread whose tid is the pid), ``drain`` (``pydory-drain``, the datagram
drain's C thread), ``rdk`` (librdkafka's ``rdk:*``), ``other`` (the rest: the spool's
disk worker, the metadata and log threads). ``instructions:u`` and ``:k`` (user, kernel)
where the machine has hardware counters (a VM may not: then callgrind counts,
benchmarks/instructions.py and benchmarks/instructions_spool.py), ``task-clock`` (ms, for
the reader; the machine's load moves it), and the system calls in :data:`SYSCALLS`.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from pydory_tools.bench import procfs, runs
from pydory_tools.bench.settings import BenchSettings

SYSCALLS = ("read", "write", "writev", "recvmmsg", "fdatasync", "fsync", "epoll_wait",
            "ftruncate", "unlink", "pwrite64")  # fmt: skip
EVENTS = ("instructions:u", "instructions:k", "task-clock",
          *(f"syscalls:sys_enter_{name}" for name in SYSCALLS))  # fmt: skip


def group_of(comm: str, tid: int, pid: int) -> str:
    if tid == pid:
        return "loop"
    if comm.startswith("pydory-drain"):
        return "drain"
    if comm.startswith("rdk:"):
        return "rdk"
    return "other"


def one_run(tree: str, spool: str, messages: int, env_drain: str | None) -> dict[str, Any]:
    settings = BenchSettings(
        transport="dgram", messages=messages, rounds=1, baselines=False,
        daemon_source=Path(tree).resolve(), spool=(spool,),
    )  # fmt: skip
    plain_cpu = procfs.cpu_seconds
    with tempfile.TemporaryDirectory(prefix="pydory-spool-per-read-") as tmp:
        output = Path(tmp) / "perf.txt"
        perf: list[subprocess.Popen[bytes]] = []
        daemon_pid: list[int] = []

        def cpu_seconds(pid: int) -> float:
            if not perf:  # before the load: attach
                daemon_pid.append(pid)
                perf.append(subprocess.Popen(
                    ["perf", "stat", "--per-thread", "-x", ",", "-e", ",".join(EVENTS),
                     "-p", str(pid), "-o", str(output)]))  # fmt: skip
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
        counts: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        for line in output.read_text().splitlines():
            fields = line.split(",")
            if len(fields) < 4 or "-" not in fields[0]:
                continue
            comm, _, tid_text = fields[0].rpartition("-")
            try:
                value = float(fields[1])
            except ValueError:  # <not counted>
                continue
            group = group_of(comm, int(tid_text), daemon_pid[0])
            event = fields[3].removeprefix("syscalls:sys_enter_")
            counts[group][event] += value
            counts["process"][event] += value
    return {"messages": messages, "delivered": run.delivered, "msgs_per_s": run.msgs_per_s,
            "cpu_us_per_msg": run.cpu_us_per_msg,
            "counts": {group: dict(events) for group, events in counts.items()}}  # fmt: skip


def slope(low: dict[str, Any], high: dict[str, Any]) -> dict[str, dict[str, float]]:
    span = high["messages"] - low["messages"]
    result: dict[str, dict[str, float]] = {}
    for group, events in high["counts"].items():
        before = low["counts"].get(group, {})
        result[group] = {
            event: round((value - before.get(event, 0.0)) / span, 6)
            for event, value in events.items()
        }
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n\n")[0])
    parser.add_argument("--tree", action="append", required=True, metavar="NAME=DIR")
    parser.add_argument("--spool", default="off,1000", help="variants (default off,1000)")
    parser.add_argument("-n", default="200000,600000", help="the two Ns")
    parser.add_argument("--rounds", type=int, default=1, help="rounds, interleaved")
    parser.add_argument("--output", type=Path, help="append one JSON line per row")
    args = parser.parse_args()
    small, large = (int(n) for n in args.n.split(","))
    for round_index in range(args.rounds):
        for tree_text in args.tree:
            name, _, directory = tree_text.partition("=")
            for spool in args.spool.split(","):
                low = one_run(directory, spool, small, None)
                high = one_run(directory, spool, large, None)
                per_message = slope(low, high)
                row = {"tree": name, "spool": spool, "round": round_index,
                       "per_msg": per_message, "runs": [low, high]}  # fmt: skip
                loop, process = per_message.get("loop", {}), per_message.get("process", {})
                print(json.dumps({
                    "tree": name, "spool": spool, "round": round_index,
                    "loop_ins_u": loop.get("instructions:u"),
                    "process_ins_u": process.get("instructions:u"),
                    "process_ins_k": process.get("instructions:k"),
                    "datagrams_per_take": (
                        round(1 / loop["read"], 1) if loop.get("read") else None),
                    "loop_writes": loop.get("write"),
                    "fdatasyncs": process.get("fdatasync"),
                    "rates": [low["msgs_per_s"], high["msgs_per_s"]],
                }), flush=True)  # fmt: skip
                if args.output:
                    with args.output.open("a") as out:
                        out.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
