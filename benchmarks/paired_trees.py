"""Paired ratios of two trees from benchmarks/trees_interleaved.py's JSON lines: per cell,
the k-th run of one tree against the k-th run of the other (runs of one round sit side by
side, so a change of load on the machine falls on both). Not a test.

    .venv/bin/python benchmarks/paired_trees.py FILE.jsonl [...] [--head head --base base]

Per cell: the median (min-max) of the head/base ratios of CPU µs/msg and of msgs/s, in how
many pairs head was cheaper (faster), the system part of the CPU (medians), the rate the
generators sent at (``generator_msgs_per_s``: with ``--rate``, the offered load achieved),
and the 1-minute load at the runs' start. Markdown on stdout.

With ``--rate`` rows (``offered_msgs_per_s``), a pair in which either run sent below
``--min-achieved`` (default 0.95) of the offered rate is left out of the ratios (that run's
CPU was measured at another load) and counted in the column "left out".
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

ORDER = ("dgram", "stream-1", "stream-64", "tcp-1")


Pair = tuple[dict[str, Any], dict[str, Any]]


def pairs_by_cell(rows: list[dict[str, Any]], head: str, base: str) -> dict[str, list[Pair]]:
    """cell -> [(head's k-th run, base's k-th run), ...] in the file's order."""
    runs: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        runs[(row["cell"], row["tree"])].append(row)
    known = [cell for cell in ORDER if any(row["cell"] == cell for row in rows)]
    cells = known + sorted({row["cell"] for row in rows} - set(known))
    return {cell: list(zip(runs[(cell, head)], runs[(cell, base)], strict=False)) for cell in cells}


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def at_offered_load(pair: Pair, min_achieved: float) -> bool:
    """Whether both runs sent at least ``min_achieved`` of their offered rate (if any)."""
    for run in pair:
        offered, sent = run.get("offered_msgs_per_s"), run.get("generator_msgs_per_s")
        if offered and (sent is None or sent < min_achieved * offered):
            return False
    return True


def table(rows: list[dict[str, Any]], head: str, base: str, min_achieved: float) -> str:
    lines = [
        f"| cell | pairs | CPU µs/msg {head}/{base}: median (min-max) | {head} cheaper "
        f"| CPU µs/msg medians {head} / {base} | system µs/msg {head} / {base} "
        f"| msgs/s {head}/{base} | {head} faster | sent msgs/s (min-max) | load (min-max) "
        "| left out |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for cell, all_pairs in pairs_by_cell(rows, head, base).items():
        pairs = [pair for pair in all_pairs if at_offered_load(pair, min_achieved)]
        if not pairs:
            continue
        cpu = [h["pydory_cpu_us_per_msg"] / b["pydory_cpu_us_per_msg"] for h, b in pairs]
        rate = [h["pydory_msgs_per_s"] / b["pydory_msgs_per_s"] for h, b in pairs]
        sent = [r["generator_msgs_per_s"] for pair in pairs for r in pair]
        sent = [rate for rate in sent if rate is not None]  # older spooled rows lack it
        loads = [r["load_1min_at_start"] for pair in pairs for r in pair]

        def median_of(tree: int, figure: str, pairs: list[Any] = pairs) -> float:
            return statistics.median(pair[tree][figure] for pair in pairs)

        lines.append(
            f"| {cell} | {len(pairs)} | {spread(cpu)} | {sum(x < 1 for x in cpu)}/{len(cpu)} "
            f"| {median_of(0, 'pydory_cpu_us_per_msg'):.2f} / "
            f"{median_of(1, 'pydory_cpu_us_per_msg'):.2f} "
            f"| {median_of(0, 'pydory_system_us_per_msg'):.2f} / "
            f"{median_of(1, 'pydory_system_us_per_msg'):.2f} "
            f"| {spread(rate)} | {sum(x > 1 for x in rate)}/{len(rate)} "
            f"| {f'{min(sent):,.0f}-{max(sent):,.0f}' if sent else '-'} "
            f"| {min(loads):.1f}-{max(loads):.1f} | {len(all_pairs) - len(pairs)} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", type=Path, nargs="+")
    parser.add_argument("--head", default="head")
    parser.add_argument("--base", default="base")
    parser.add_argument("--min-achieved", type=float, default=0.95)
    args = parser.parse_args()
    for path in args.files:
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        print(f"{path}\n\n{table(rows, args.head, args.base, args.min_achieved)}\n")


if __name__ == "__main__":
    main()
