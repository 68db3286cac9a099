"""What each test module costs, and so the order the suite's two workers get the modules in.

``./dev test`` runs ``pytest -n 2 --dist loadfile``: pytest-xdist hands out whole modules, in
the order the tests were collected (``--no-loadscope-reorder`` in ``pyproject.toml``: by
default xdist reorders them by their number of tests, which says nothing of their time).
``tests/conftest.py`` orders the collected tests by their module's cost here, the costliest
module first (:func:`by_cost`): the long poles (a demo of a fleet, a kill loop) start at once
on both workers and the run ends on short modules on both, where alphabetical order left one
worker on a late long module while the other idled.

``COSTS`` is a module's seconds in a whole run (setup, call and teardown of its tests
summed, ``--durations=0``); only their ranking matters. A module not listed counts
as ``UNLISTED_S``, among the middling ones. After a change that moves a module far (a long
test added, split off or made short), refresh the table from a whole run::

    .venv/bin/pytest -n 2 --dist loadfile --durations=0 -q > /tmp/durations.log
    .venv/bin/python tests/module_costs.py /tmp/durations.log   # prints the new COSTS
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

#: Seconds a module not in ``COSTS`` counts as (a new module is rarely a long pole).
UNLISTED_S = 5.0

#: Seconds per test module in a quiet whole run. This first table is an estimate: the 15
#: slowest tests of a quiet fresh-clone run (1,025 s), each module's other tests guessed from
#: their kind (Kafka, Spark, a build); a whole run's ``--durations=0`` replaces it.
COSTS: dict[str, float] = {
    "test_demo_fleet.py": 220.0,
    "test_fleet_exactly_once.py": 142.0,
    "test_spool_daemon.py": 130.0,
    "test_pipeline_faults.py": 100.0,
    "test_pipeline_land.py": 90.0,
    "test_pipeline_connectors.py": 80.0,
    "test_distributed.py": 70.0,
    "test_demo_sigkill.py": 63.0,
    "test_pipeline_source.py": 50.0,
    "test_demo.py": 45.0,
    "test_pipeline_dedup.py": 45.0,
    "test_daemon_kafka.py": 45.0,
    "test_pipeline_fleet_audit.py": 40.0,
    "test_daemon_kafka_faults.py": 40.0,
    "test_kafka_broker.py": 35.0,
    "test_pipeline_audit.py": 35.0,
    "test_wheel.py": 30.0,
    "test_reload_daemon.py": 30.0,
    "test_pipeline_second_copies.py": 25.0,
    "test_install_steps.py": 25.0,
    "test_daemon_faults.py": 25.0,
    "test_bench.py": 20.0,
    "test_build.py": 20.0,
    "test_cwire.py": 20.0,
    "test_quotas_daemon.py": 15.0,
    "test_daemon_tansu.py": 15.0,
    "test_overload.py": 15.0,
    "test_msg_debug_daemon.py": 12.0,
    "test_daemon_kafka_start.py": 12.0,
}

#: A line of ``--durations=0``: seconds, phase, node id.
_DURATION = re.compile(r"^\s*(?P<s>\d+(?:\.\d+)?)s (?:setup|call|teardown)\s+(?P<id>\S+)")


def by_cost(modules: Sequence[str], costs: Mapping[str, float] = COSTS) -> list[int]:
    """The positions of ``modules`` (each collected test's module file name, in collection
    order) in the order to run them: the costliest module first, equal costs in collection
    order, each module's tests together and in their order."""
    first_seen: dict[str, int] = {}
    for name in modules:
        first_seen.setdefault(name, len(first_seen))
    return sorted(
        range(len(modules)),
        key=lambda i: (-costs.get(modules[i], UNLISTED_S), first_seen[modules[i]]),
    )


def costs_from_durations(lines: Sequence[str]) -> Counter[str]:
    """Seconds per module file name, summed from ``--durations=0`` output lines."""
    costs: Counter[str] = Counter()
    for line in lines:
        found = _DURATION.match(line)
        if found is not None:
            costs[Path(found["id"].split("::", 1)[0]).name] += float(found["s"])
    return costs


def render(costs: Mapping[str, float]) -> str:
    """``COSTS`` as Python source, the costliest first."""
    ranked = sorted(costs.items(), key=lambda item: (-item[1], item[0]))
    rows = "".join(f'    "{name}": {s:.1f},\n' for name, s in ranked)
    return "COSTS: dict[str, float] = {\n" + rows + "}"


if __name__ == "__main__":
    print(render(costs_from_durations(Path(sys.argv[1]).read_text().splitlines())))
