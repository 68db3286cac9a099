"""Per function, per message: callgrind's counts of two daemon runs at two Ns (kept by
``benchmarks/instructions.py --keep``), as slopes, tree against tree. Not a test.

    .venv/bin/python benchmarks/instructions_functions.py /tmp/cg stream-1-off \
        --trees base,head -n 20000,60000 [--thread 01|all] [--top 40]

For each tree, ``KEEP/<tree>-<cell>/<N>/callgrind.out.*-<thread>`` (the loop thread is 01;
``all``: every thread's file summed) is read by ``callgrind_annotate`` (self and
inclusive), and each function's figure is (count at the larger N - at the smaller) / the
difference of N. Printed: the functions whose inclusive or self slope differs most between
the first tree and each other one. Inclusive figures of a function that recurses, or of one
already running when the counts started, are as callgrind_annotate gives them.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

LINE = re.compile(r"^\s*([\d,]+)\s+(?:\([\d.]+%\)\s+)?(\S.*?)(?:\s+\[[^\]]*\])?\s*$")


def annotate(path: Path, inclusive: bool) -> dict[str, int]:
    """Function name -> instructions (callgrind_annotate's list, every function)."""
    out = subprocess.run(
        ["callgrind_annotate", "--threshold=100", "--show-percs=no", "--auto=no",
         f"--inclusive={'yes' if inclusive else 'no'}", str(path)],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    counts: dict[str, int] = {}
    started = False
    for line in out.splitlines():
        if line.startswith("Ir") or "file:function" in line:
            started = True
            continue
        if not started or "PROGRAM TOTALS" in line:
            continue
        match = LINE.match(line)
        if match:
            name = match.group(2).split(":", 1)[-1] if ":" in match.group(2) else match.group(2)
            counts[name] = counts.get(name, 0) + int(match.group(1).replace(",", ""))
    return counts


def files(run_dir: Path, thread: str) -> list[Path]:
    every = sorted(run_dir.glob("callgrind.out.*"))
    if thread == "all":
        return every
    return [p for p in every if p.name.endswith(f"-{thread}")]


def slopes(keep: Path, tree: str, cell: str, small: int, large: int, thread: str,
           inclusive: bool) -> dict[str, float]:  # fmt: skip
    figures: list[dict[str, int]] = []
    for n in (small, large):
        total: dict[str, int] = {}
        for path in files(keep / f"{tree}-{cell}" / str(n), thread):
            for name, count in annotate(path, inclusive).items():
                total[name] = total.get(name, 0) + count
        figures.append(total)
    low, high = figures
    return {
        name: (high.get(name, 0) - low.get(name, 0)) / (large - small)
        for name in set(low) | set(high)
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n\n")[0])
    parser.add_argument("keep", type=Path)
    parser.add_argument("cell", help="<cell>-<spool>, e.g. stream-1-off")
    parser.add_argument("--trees", required=True, help="the first is the reference")
    parser.add_argument("-n", default="20000,60000")
    parser.add_argument("--thread", default="01")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--show", default="", help="comma-separated functions always shown")
    args = parser.parse_args()
    small, large = (int(n) for n in args.n.split(","))
    trees = args.trees.split(",")
    for inclusive in (True, False):
        table = {t: slopes(args.keep, t, args.cell, small, large, args.thread, inclusive)
                 for t in trees}  # fmt: skip
        reference = table[trees[0]]
        names = set().union(*table.values())
        for other in trees[1:]:
            diff = {n: table[other].get(n, 0.0) - reference.get(n, 0.0) for n in names}
            shown = sorted(names, key=lambda n: -abs(diff[n]))[: args.top]
            shown += [n for n in args.show.split(",") if n and n not in shown]
            kind = "inclusive" if inclusive else "self"
            print(f"\n## {args.cell}, thread {args.thread}, {kind}, per message: "
                  f"{trees[0]} / {other} / difference")  # fmt: skip
            for name in shown:
                print(f"{reference.get(name, 0.0):10.1f} {table[other].get(name, 0.0):10.1f} "
                      f"{diff[name]:+10.1f}  {name}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
