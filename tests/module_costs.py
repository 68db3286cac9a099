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

# fmt: off
#: Seconds per test module, from a whole run (see the module's docstring).
COSTS: dict[str, float] = {
    "test_demo_fleet.py": 220.0,
    "test_fleet_exactly_once.py": 145.0,
    "test_spool_daemon.py": 120.0,
    "test_pipeline_faults.py": 90.0,
    "test_distributed.py": 75.0,
    "test_pipeline_connectors.py": 70.0,
    "test_demo_sigkill.py": 65.0,
    "test_pipeline_land.py": 60.0,
    "test_demo.py": 45.0,
    "test_pipeline_fleet_audit.py": 40.0,
    "test_install_steps.py": 25.0,
    "test_pipeline_second_copies.py": 25.0,
}
# fmt: on

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
