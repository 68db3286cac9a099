"""The rounds: raw baseline, pydory and direct baseline, interleaved so noise hits all alike.

Round r runs the three kinds in an order rotated by r (raw, pydory, direct; then pydory,
direct, raw; ...), so none always runs first on a cold machine or last on a warm one.
With spool variants (``--spool off,none,1000``), each is a pydory kind of its own
(``pydory``, ``pydory+spool:none``, ...), rotated with the others. With ``--contend N``,
N CPU-bound processes per core run from before the first run to after the last
(pydory_tools.bench.contention), so every run meets the same busy host.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from pydory_tools.bench.contention import cpu_hogs
from pydory_tools.bench.report import BenchReport, Environment
from pydory_tools.bench.runs import run_direct, run_pydory, run_raw
from pydory_tools.bench.settings import BenchSettings

KINDS = ("raw", "pydory", "direct")


def pydory_kind(spool: str) -> str:
    """The kind of a pydory run with spool variant ``spool``."""
    return "pydory" if spool == "off" else f"pydory+spool:{spool}"


def round_order(round_index: int, baselines: bool, spool: tuple[str, ...] = ("off",)) -> list[str]:
    """The kinds of run in round ``round_index``, rotated so each takes every position."""
    daemons = [pydory_kind(variant) for variant in spool]
    kinds = ["raw", *daemons, "direct"] if baselines else daemons
    shift = round_index % len(kinds)
    return kinds[shift:] + kinds[:shift]


def run_bench(
    settings: BenchSettings, progress: Callable[[str], None] | None = None
) -> BenchReport:
    """Run every round of ``settings`` and return their figures.

    ``progress`` receives one line per finished run. With ``settings.profile_path``, one
    extra pydory run (not counted in the figures) is sampled with py-spy into that file.
    Raises ``BenchError`` when a run fails or times out; its processes are ended first.
    """
    say = progress or (lambda line: None)
    report = BenchReport(settings, Environment.capture())
    with (
        tempfile.TemporaryDirectory(prefix="pydory-bench-") as tmp,
        cpu_hogs(settings.contend) as hogs,
    ):
        report.contend_processes = len(hogs)
        if hogs:
            say(f"{len(hogs)} CPU-bound processes running beside the runs (--contend)")
        for round_index in range(settings.rounds):
            for kind in round_order(round_index, settings.baselines, settings.spool):
                workdir = Path(tmp) / f"r{round_index}-{kind.replace(':', '-')}"
                workdir.mkdir()
                _run_one(kind, settings, workdir, report)
                say(f"round {round_index + 1}/{settings.rounds}: {kind} done")
        if settings.profile_path is not None:
            workdir = Path(tmp) / "profile"
            workdir.mkdir()
            run_pydory(settings, workdir, profile=settings.profile_path, spool=settings.spool[0])
            say(f"profile of a separate pydory run written to {settings.profile_path}")
        report.load_average_at_end = os.getloadavg()  # the hogs still running
    return report


def _run_one(kind: str, settings: BenchSettings, workdir: Path, report: BenchReport) -> None:
    if kind == "raw":
        report.raw.append(run_raw(settings, workdir))
    elif kind == "pydory":
        report.pydory.append(run_pydory(settings, workdir))
    elif kind.startswith("pydory+spool:"):
        variant = kind.removeprefix("pydory+spool:")
        report.spooled.setdefault(variant, []).append(run_pydory(settings, workdir, spool=variant))
    else:
        report.direct.append(run_direct(settings, workdir))
