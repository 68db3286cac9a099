"""Where a one-shot landing of a backlog spends its CPU: with and without deduplication.

Not a test. For BENCHMARKS.md ("Landing a backlog: where the CPU goes"). In one process
(one Spark JVM, started before the clock runs), land the whole of TOPIC twice into fresh
lakes and checkpoints with ``--available-now`` in one batch: once as the landing job does
(second copies dropped), once with the deduplicating step left out (as for a checkpoint
that predates it). For each: the CPU seconds of this process and its JVM during the run
(from /proc), the batch's phases as Spark reports them (``durationMs``), and the state
operator's own times.

    python benchmarks/land_cost.py BOOTSTRAP TOPIC WORKDIR [reverse]

``reverse`` runs the landing without deduplication first (the second run of a JVM has
its code compiled already: run both orders).

Fill TOPIC first: ``python benchmarks/land_state.py fill BOOTSTRAP TOPIC N``.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from land_state import _tree

from pydory.pipeline.landing import land
from pydory.pipeline.landing.dedup import SESSION_CONF, prepare_session
from pydory.pipeline.spark import spark_session


def _cpu() -> float:
    return sum(cpu for cpu, _hwm in _tree(os.getpid()).values())


def main() -> int:
    bootstrap, topic, workdir = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    spark = spark_session("local[*]", "pydory-land-cost", {**SESSION_CONF, **land.SINK_CONF})
    deduplicating = land.drops_second_copies
    runs = [("with deduplication", True), ("without deduplication", False)]
    if sys.argv[4:] == ["reverse"]:
        runs.reverse()
    for name, dedup in runs:
        root = workdir / name.replace(" ", "-")
        settings = land.LandSettings(
            bootstrap_servers=bootstrap,
            topics=(topic,),
            lake=str(root / "lake"),
            checkpoint=str(root / "ckpt"),
            available_now=True,
        )
        land.drops_second_copies = deduplicating if dedup else (lambda *_args: False)  # type: ignore[assignment]
        prepare_session(spark, {})  # as the landing job does (harmless without the state)
        load = os.getloadavg()[0]
        began, cpu = time.monotonic(), _cpu()
        query = land.start_landing(spark, settings)
        query.awaitTermination()
        used, wall = _cpu() - cpu, time.monotonic() - began
        batches = [p for p in query.recentProgress if p.numInputRows > 0]
        rows = sum(p.numInputRows for p in batches)
        print(
            f"{name}: {rows:,} records in {len(batches)} batch(es), wall {wall:.1f} s, CPU "
            f"{used:.1f} s (this process and its JVM), 1-minute load {load:.1f} before"
        )
        for progress in batches:
            print(f"  durationMs {dict(sorted(progress.durationMs.items()))}")
            for state in progress.stateOperators:
                custom = {k: v for k, v in state.customMetrics.items() if v}
                print(
                    f"  state: {state.numRowsTotal:,} rows, updates {state.allUpdatesTimeMs} ms, "
                    f"removals {state.allRemovalsTimeMs} ms, commit {state.commitTimeMs} ms; "
                    f"{custom}"
                )
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
