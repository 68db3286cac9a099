"""Run `pydory bench` over the matrix of BENCHMARKS.md and print its tables in Markdown.

Not a test. Each cell is one `python -m pydory_tools.bench --json` invocation (3 rounds,
interleaved baselines); the JSON lines are appended to --output so a long run can be
inspected or re-rendered (--render-only).

    .venv/bin/python benchmarks/bench_matrix.py anchors   # Dory's anchors: 100 B, none
    .venv/bin/python benchmarks/bench_matrix.py matrix    # transports x V x compression

Both take under 10 minutes on the 2-core machine; --daemon-src measures another tree.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Messages per cell, by value size: large enough for seconds of load, small enough for
#: the whole matrix to finish in about 10 minutes.
MESSAGES = {100: 100_000, 1000: 50_000, 10_000: 10_000}


@dataclass(frozen=True)
class Cell:
    transport: str
    batch: int
    value_bytes: int
    compression: str
    messages: int

    def arguments(self) -> list[str]:
        return [
            f"--transport={self.transport}",
            f"--batch={self.batch}",
            f"--value-bytes={self.value_bytes}",
            f"--compression={self.compression}",
            f"--messages={self.messages}",
        ]


def anchors() -> list[Cell]:
    """The inputs of issue 6's anchor table (100-byte values, no compression)."""
    return [
        Cell("dgram", 1, 100, "none", 200_000),
        Cell("stream", 1, 100, "none", 200_000),
        Cell("stream", 64, 100, "none", 200_000),
        Cell("tcp", 1, 100, "none", 200_000),
    ]


def matrix() -> list[Cell]:
    """Every transport x V in {100, 1000, 10000} x {none, lz4}, and snappy at 1000 B."""
    cells = []
    for transport, batch in (("dgram", 1), ("stream", 64), ("tcp", 1)):
        for value_bytes, messages in MESSAGES.items():
            for compression in ("none", "lz4"):
                cells.append(Cell(transport, batch, value_bytes, compression, messages))
        cells.append(Cell(transport, batch, 1000, "snappy", MESSAGES[1000]))
    return cells


def run_cell(cell: Cell, rounds: int, daemon_src: str | None) -> dict[str, Any]:
    command = [sys.executable, "-m", "pydory_tools.bench", *cell.arguments(), "--json"]
    command.append(f"--rounds={rounds}")
    if daemon_src:
        command.append(f"--daemon-src={daemon_src}")
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, check=False)
    if done.returncode != 0:
        return {"cell": cell.arguments(), "error": done.stderr.strip()[-2000:]}
    report: dict[str, Any] = json.loads(done.stdout)
    report["command"] = "pydory bench " + " ".join(cell.arguments())
    return report


def _k(value: float | None) -> str:
    return "-" if value is None else f"{value / 1000:,.0f}k"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def render(reports: list[dict[str, Any]]) -> str:
    """One Markdown table: medians, with pydory's min-max in brackets."""
    lines = [
        "| input | V | comp. | N | pydory msgs/s (min-max) | generator | raw socket | direct "
        "| CPU µs/msg pydory / direct | RSS idle / peak MB | p50 / p99 ms | direct p50 / p99 ms "
        "| delivered / discarded |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in reports:
        if "error" in r:
            lines.append(f"| {' '.join(r['cell'])} | failed: {r['error'][-200:]} |")
            continue
        spread = r["spread"]["pydory_msgs_per_s"]
        name = {"dgram": "UNIX dgram", "stream": "UNIX stream", "tcp": "TCP"}[r["transport"]]
        if r["transport"] != "dgram":
            name += f", {r['batch']}/write"
        lines.append(
            f"| {name} | {r['value_bytes']} | {r['compression']} | {r['messages']:,} "
            f"| {_k(r['pydory_msgs_per_s'])} ({_k(spread['min'])}-{_k(spread['max'])}) "
            f"| {_k(r['generator_msgs_per_s'])} | {_k(r['raw_msgs_per_s'])} "
            f"| {_k(r['direct_msgs_per_s'])} "
            f"| {r['pydory_cpu_us_per_msg']:.1f} / {r['direct_cpu_us_per_msg']:.1f} "
            f"| {r['pydory_rss_mb_idle']:.0f} / {r['pydory_rss_mb_peak']:.0f} "
            f"| {_ms(r['p50_ms'])} / {_ms(r['p99_ms'])} "
            f"| {_ms(r['direct_p50_ms'])} / {_ms(r['direct_p99_ms'])} "
            f"| {r['delivered']:,} / {r['discarded']:,} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("which", choices=("anchors", "matrix"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--daemon-src", help="passed to pydory bench --daemon-src")
    parser.add_argument("--output", type=Path, help="append each cell's JSON line here")
    parser.add_argument("--render-only", action="store_true", help="render --output, run nothing")
    args = parser.parse_args()
    if args.render_only:
        reports = [json.loads(line) for line in args.output.read_text().splitlines()]
        print(render(reports))
        return 0
    cells = anchors() if args.which == "anchors" else matrix()
    reports = []
    started = time.monotonic()
    for number, cell in enumerate(cells, 1):
        report = run_cell(cell, args.rounds, args.daemon_src)
        reports.append(report)
        if args.output is not None:
            with args.output.open("a") as output:
                output.write(json.dumps(report) + "\n")
        elapsed = time.monotonic() - started
        print(f"[{number}/{len(cells)} {elapsed:.0f} s] {' '.join(cell.arguments())}", flush=True)
    print(render(reports))
    return 0


if __name__ == "__main__":
    sys.exit(main())
