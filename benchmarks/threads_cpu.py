"""Which of the daemon's threads spends the CPU: one `pydory bench` run per tree and
round (tree order reversed every other round), the daemon's threads' utime + stime read
from ``/proc/<pid>/task/*/stat`` when the load starts and when it has settled. Not a test.

    .venv/bin/python benchmarks/threads_cpu.py --cell dgram --spool 1000 --rate 100000 \
        -n 600000 --rounds 4 --tree base=/tmp/pydory-base/src --tree head=src \
        --output FILE.jsonl

A row per run: the tree, the cell, CPU µs per message (the harness's figure) and, per
thread name, [user, system] clock ticks (librdkafka's broker threads summed as
``rdk:broker``). The table printed at the end: medians per tree. Answers what a whole
process's CPU figure cannot: whether a difference between trees is the event loop's
thread, librdkafka's threads or a reader thread (``pydory-drain``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from pydory_tools.bench import procfs, runs
from pydory_tools.bench.settings import BenchSettings

sys.path.insert(0, str(Path(__file__).parent))
from instructions import CELLS  # a sibling script, not a package

#: Shown in the table, in this order (others are kept in the JSON).
THREADS = ("python", "rdk:broker", "pydory-drain", "pydory-sdrain")


Reading = tuple[str, int, int, int, int]  # name, utime, stime, voluntary, involuntary


def thread_ticks(pid: int) -> dict[str, Reading]:
    """tid -> (name, utime, stime, voluntary and involuntary context switches) of every
    thread of ``pid`` now."""
    found: dict[str, Reading] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            raw = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
            status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
        except OSError:
            continue  # the thread ended meanwhile
        name = raw[raw.index("(") + 1 : raw.rindex(")")]
        fields = raw[raw.rindex(")") + 2 :].split()
        switches = dict(
            line.split(":", 1) for line in status.splitlines() if "ctxt_switches" in line
        )
        found[tid] = (
            name,
            int(fields[11]),
            int(fields[12]),
            int(switches["voluntary_ctxt_switches"]),
            int(switches["nonvoluntary_ctxt_switches"]),
        )
    return found


def read_write_calls(pid: int) -> tuple[int, int]:
    """The process's read and write system calls so far (``/proc/PID/io``'s ``syscr``
    and ``syscw``: ``read``, ``readv``, ``write``, ``writev`` and the like, not
    ``recvmmsg`` nor ``sendmsg``)."""
    text = Path(f"/proc/{pid}/io").read_text()
    fields = dict(line.split(": ") for line in text.splitlines())
    return int(fields["syscr"]), int(fields["syscw"])


def per_name(before: dict[str, Reading], after: dict[str, Reading]) -> dict[str, list[int]]:
    """Spent between the two readings, per thread name: [user ticks, system ticks,
    voluntary switches, involuntary switches]."""
    spent: dict[str, list[int]] = {}
    for tid, (name, *now) in after.items():
        _, *then = before.get(tid, (name, 0, 0, 0, 0))
        key = "rdk:broker" if name.startswith("rdk:broker") else name
        total = spent.setdefault(key, [0, 0, 0, 0])
        for i, (a, b) in enumerate(zip(now, then, strict=True)):
            total[i] += a - b
    return {name: ticks for name, ticks in spent.items() if sum(ticks[:2]) > 0}


def one_run(
    tree: str, cell: str, spool: str, messages: int, rate: float | None, cpus: str | None
) -> dict[str, Any]:
    transport, batch = CELLS[cell]
    settings = BenchSettings(
        transport=transport,
        batch=batch,
        messages=messages,
        rounds=1,
        baselines=False,
        daemon_source=Path(tree).resolve(),
        spool=(spool,),
        rate=rate,
        daemon_cpus=cpus,
    )
    plain_cpu_seconds = procfs.cpu_seconds
    readings: list[dict[str, Reading]] = []
    calls: list[tuple[int, int]] = []

    def cpu_seconds(pid: int) -> float:  # the harness reads it at the load's start and end
        readings.append(thread_ticks(pid))
        calls.append(read_write_calls(pid))
        return plain_cpu_seconds(pid)

    procfs.cpu_seconds = cpu_seconds  # type: ignore[assignment]
    try:
        with tempfile.TemporaryDirectory(prefix="pydory-threads-") as tmp:
            run = runs.run_pydory(settings, Path(tmp), spool=spool)
    finally:
        procfs.cpu_seconds = plain_cpu_seconds  # type: ignore[assignment]
    return {
        "tree": tree,
        "cell": cell,
        "spool": spool,
        "messages": messages,
        "offered_msgs_per_s": rate,
        "daemon_cpus": cpus,
        "stream_drain": os.environ.get("PYDORY_STREAM_DRAIN", ""),
        "delivered": run.delivered,
        "msgs_per_s": run.msgs_per_s,
        "cpu_us_per_msg": run.cpu_us_per_msg,
        "system_us_per_msg": run.system_us_per_msg,
        "load": os.getloadavg()[0],
        "thread_ticks": per_name(readings[0], readings[-1]),
        "read_calls": calls[-1][0] - calls[0][0],
        "write_calls": calls[-1][1] - calls[0][1],
    }


def table(rows: list[dict[str, Any]]) -> str:
    names = " | ".join(f"{t} ticks" for t in THREADS)
    lines = [f"| tree | runs | msgs/s | CPU µs/msg | {names} |"]
    lines.append("|---" * (4 + len(THREADS)) + "|")
    for tree in dict.fromkeys(row["tree"] for row in rows):
        mine = [row for row in rows if row["tree"] == tree]
        cpu = statistics.median(row["cpu_us_per_msg"] for row in mine)
        rate = statistics.median(row["msgs_per_s"] for row in mine)
        ticks = [
            statistics.median(sum(row["thread_ticks"].get(name, (0, 0))[:2]) for row in mine)
            for name in THREADS
        ]
        cells = " | ".join(f"{t:g}" for t in ticks)
        lines.append(f"| {tree} | {len(mine)} | {rate:,.0f} | {cpu:.2f} | {cells} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n\n")[0])
    parser.add_argument("--tree", action="append", required=True, metavar="NAME=DIR")
    parser.add_argument("--cell", choices=sorted(CELLS), required=True)
    parser.add_argument("--spool", default="off", help="off, or an fsync interval in ms")
    parser.add_argument("--rate", type=float, help="messages/s offered, paced (default: max)")
    parser.add_argument("--messages", "-n", type=int, default=600_000)
    parser.add_argument("--rounds", "-r", type=int, default=4)
    parser.add_argument("--daemon-cpus", help="`pydory bench --daemon-cpus`: e.g. 1")
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args()
    trees = [spec.partition("=")[2] for spec in args.tree]
    names = {spec.partition("=")[2]: spec.partition("=")[0] for spec in args.tree}
    rows = []
    for round_number in range(args.rounds):
        for tree in trees if round_number % 2 == 0 else trees[::-1]:
            row = one_run(tree, args.cell, args.spool, args.messages, args.rate, args.daemon_cpus)
            row["tree"] = names[tree]
            rows.append(row)
            with args.output.open("a") as out:
                out.write(json.dumps(row) + "\n")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
