"""Race daemon trees against each other in one sitting: `pydory bench` per cell, per tree,
rounds interleaved (round 1: every tree on every cell, then round 2, ...), so that a
change of load on the machine falls on every tree alike. Not a test.

    git archive 87b9e61 src | (mkdir -p /tmp/pydory-base && tar -x -C /tmp/pydory-base)
    .venv/bin/python benchmarks/trees_interleaved.py -n 1000000 --rounds 3 \
        --tree base=/tmp/pydory-base/src --tree head=src \
        --output benchmarks/results/FILE.jsonl

Each run is one `python -m pydory_tools.bench -r 1 --no-baselines --json --daemon-src TREE`;
its JSON goes to --output as one line (with the tree's and the cell's names), and the
table of medians (min-max) is printed in Markdown at the end (--render-only: from FILE).
A tree may be run with extra environment (``--tree pure=src:PYDORY_PURE_PYTHON=1``), and
on chosen CPUs (``--tree one-cpu=src:cpus=0``: `pydory bench --daemon-cpus 0`; a range,
not a comma list: ``cpus=0-1``). The trees run in the order given in odd rounds and in
reverse in even ones. ``--contend N`` runs every bench beside N CPU-bound
processes per core (`pydory bench --contend N`; each row then says ``contend`` and the
1-minute load at its start and end). ``--rate N`` offers every run N messages per second,
paced (`pydory bench --rate N`): the daemon's CPU per message at a fixed load instead of
at its maximum throughput (each row then says ``offered_msgs_per_s``). ``--calibrate``
times a fixed interpreter loop on the daemon's CPUs before and after each run
(``calibration_s``): how fast the machine ran the run's neighbourhood (see CALIBRATION).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

#: name -> `pydory bench` arguments: the issue-25 cells (100-byte values, no compression).
CELLS: dict[str, list[str]] = {
    "dgram": ["--transport", "dgram"],
    "stream-1": ["--transport", "stream", "--batch", "1"],
    "stream-64": ["--transport", "stream", "--batch", "64"],
    "tcp-1": ["--transport", "tcp", "--batch", "1"],
}


def parse_tree(text: str) -> tuple[str, str, dict[str, str]]:
    """``name=DIR[:VAR=VALUE,...]`` -> (name, DIR, extra environment)."""
    name, _, rest = text.partition("=")
    directory, _, env_text = rest.partition(":")
    env = dict(item.split("=", 1) for item in env_text.split(",") if item)
    return name, directory, env


#: A fixed amount of interpreter work (~0.3 s on an idle core here): how fast the daemon's
#: CPU runs right now. This machine's two vCPUs slow each other down (the same loop takes
#: 0.25-0.30 s alone, 0.37-0.55 s beside another on the other vCPU), so a run's CPU per
#: message moves with its neighbours' load; the probe beside each run shows by how much.
CALIBRATION = (
    "import resource\n"
    "x = 0\n"
    "for i in range(3_000_000): x += i * i % 7\n"
    "d = {i: str(i) for i in range(300_000)}\n"
    "print(resource.getrusage(resource.RUSAGE_SELF).ru_utime)"
)


def calibration_s(cpus: str | None) -> float:
    """CPU seconds the calibration loop took just now, on the daemon's CPUs."""
    command = [sys.executable, "-c", CALIBRATION]
    if cpus is not None:
        command = ["taskset", "-c", cpus, *command]
    out = subprocess.run(command, check=True, capture_output=True, text=True)
    return float(out.stdout)


def run_one(
    cell: str, tree: tuple[str, str, dict[str, str]], args: argparse.Namespace
) -> dict[str, Any]:
    name, directory, extra_env = tree
    command = [
        sys.executable, "-m", "pydory_tools.bench", *CELLS[cell], "-n", str(args.messages),
        "-r", "1", "--no-baselines", "--json", "--spool", args.spool,
        "--contend", str(args.contend),
        "--daemon-src", str(Path(directory).resolve()),
    ]  # fmt: skip
    if args.rate is not None:
        command += ["--rate", str(args.rate)]
    env = {**os.environ, **extra_env}
    if "cpus" in extra_env:  # not environment: where the daemon runs
        command += ["--daemon-cpus", env.pop("cpus")]
    cpus = command[command.index("--daemon-cpus") + 1] if "--daemon-cpus" in command else None
    before = calibration_s(cpus) if args.calibrate else None
    out = subprocess.run(command, check=True, capture_output=True, text=True, env=env)
    result: dict[str, Any] = json.loads(out.stdout)
    if args.calibrate:
        result["calibration_s"] = [before, calibration_s(cpus)]
    if args.spool != "off":  # the one spool variant's figures under the usual names
        variant = "pydory_spool_" + (args.spool if args.spool in ("none", "always") else
                                     f"{args.spool}ms")  # fmt: skip
        for figure in ("msgs_per_s", "cpu_us_per_msg", "system_us_per_msg", "rss_mb_peak",
                       "p50_ms", "p99_ms"):  # fmt: skip
            result[f"pydory_{figure}"] = result[f"{variant}_{figure}"]
        for figure in ("delivered", "discarded", "generator_msgs_per_s"):
            result[figure] = result[f"{variant}_{figure}"]
    result["tree"] = name
    result["cell"] = cell
    result["tree_env"] = extra_env
    return result


def render(results: list[dict[str, Any]]) -> str:
    lines = [
        "| cell | tree | runs | msgs/s median (min-max) | CPU µs/msg median (min-max) "
        "| RSS MB idle / peak | delivered / discarded |",
        "|---|---|---|---|---|---|---|",
    ]
    keys: list[tuple[str, str]] = []
    for result in results:
        key = (result["cell"], result["tree"])
        if key not in keys:
            keys.append(key)
    for cell, tree in keys:
        runs = [r for r in results if r["cell"] == cell and r["tree"] == tree]
        rates = [r["pydory_msgs_per_s"] for r in runs]
        cpu = [r["pydory_cpu_us_per_msg"] for r in runs]
        idles = [r["pydory_rss_mb_idle"] for r in runs if r.get("pydory_rss_mb_idle")]
        idle = statistics.median(idles) if idles else float("nan")
        peak = max(r["pydory_rss_mb_peak"] for r in runs)
        delivered = {r["delivered"] for r in runs}
        discarded = {r["discarded"] for r in runs}
        lines.append(
            f"| {cell} | {tree} | {len(runs)} "
            f"| {statistics.median(rates):,.0f} ({min(rates):,.0f}-{max(rates):,.0f}) "
            f"| {statistics.median(cpu):.2f} ({min(cpu):.2f}-{max(cpu):.2f}) "
            f"| {idle:.1f} / {peak:.1f} "
            f"| {'/'.join(map(str, sorted(delivered)))} / "
            f"{'/'.join(map(str, sorted(discarded)))} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", action="append", default=[], help="NAME=DIR[:VAR=VALUE]")
    parser.add_argument("--cells", default=",".join(CELLS), help="comma-separated")
    parser.add_argument("--messages", "-n", type=int, default=200_000)
    parser.add_argument("--rounds", "-r", type=int, default=3)
    parser.add_argument("--spool", default="off", help="one `pydory bench --spool` variant")
    parser.add_argument(
        "--contend", type=int, default=0, metavar="N",
        help="`pydory bench --contend N`: N CPU-bound processes per core beside each run",
    )  # fmt: skip
    parser.add_argument(
        "--rate", type=float, metavar="N",
        help="`pydory bench --rate N`: N messages/s offered, paced (default: unpaced)",
    )  # fmt: skip
    parser.add_argument(
        "--calibrate", action="store_true",
        help="time a fixed interpreter loop on the daemon's CPUs before and after each run",
    )  # fmt: skip
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--render-only", action="store_true")
    args = parser.parse_args()
    if not args.render_only:
        trees = [parse_tree(t) for t in args.tree]
        with args.output.open("a") as out:
            for round_number in range(1, args.rounds + 1):
                # Tree order reversed every other round: a tree that always ran first
                # would always meet the machine as the previous run left it.
                order = trees if round_number % 2 else trees[::-1]
                for cell in args.cells.split(","):
                    for tree in order:
                        result = run_one(cell, tree, args)
                        result["round"] = round_number
                        out.write(json.dumps(result) + "\n")
                        out.flush()
                        print(
                            f"round {round_number} {cell} {tree[0]}: "
                            f"{result['pydory_msgs_per_s']:,.0f} msgs/s "
                            f"{result['pydory_cpu_us_per_msg']} µs/msg",
                            file=sys.stderr,
                            flush=True,
                        )
    results = [json.loads(line) for line in args.output.read_text().splitlines() if line]
    print(render(results))


if __name__ == "__main__":
    main()
