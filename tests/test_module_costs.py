"""The order the suite's workers get the test modules in: the costliest first
(``tests/module_costs.py``), and pytest-xdist told to keep that order."""

from __future__ import annotations

import tomllib
from pathlib import Path

from module_costs import COSTS, UNLISTED_S, by_cost, costs_from_durations, render

TESTS = Path(__file__).resolve().parent


def test_the_costliest_module_runs_first_each_module_whole_and_in_its_order() -> None:
    modules = ["test_a.py", "test_a.py", "test_b.py", "test_c.py", "test_c.py", "test_new.py"]
    costs = {"test_a.py": 1.0, "test_b.py": 3.0, "test_c.py": 200.0}

    order = by_cost(modules, costs)

    # test_c first, then test_new (unlisted: UNLISTED_S), test_b, test_a.
    assert [modules[i] for i in order] == [
        "test_c.py", "test_c.py", "test_new.py", "test_b.py", "test_a.py", "test_a.py",
    ]  # fmt: skip
    assert order == [3, 4, 5, 2, 0, 1]  # within a module, collection order
    assert 3.0 < UNLISTED_S < 200.0


def test_modules_of_equal_cost_keep_their_collection_order() -> None:
    modules = ["test_z.py", "test_y.py", "test_z.py", "test_x.py"]

    order = by_cost(modules, dict.fromkeys(["test_x.py", "test_y.py", "test_z.py"], 7.0))

    assert [modules[i] for i in order] == ["test_z.py", "test_z.py", "test_y.py", "test_x.py"]


def test_costs_are_read_from_durations_and_rendered_as_the_table() -> None:
    lines = [
        "============================= slowest durations ==============================",
        "218.20s call     tests/test_demo_fleet.py::test_the_fleet_demo[x]",
        "41.12s setup    tests/test_demo.py::test_the_demo_balances_and_says_so",
        "2.50s call     tests/test_demo.py::test_partition_keys_choose_the_partition",
        "0.30s teardown tests/test_demo.py::test_partition_keys_choose_the_partition",
        "(1433 durations < 0.005s hidden.  Use -vv to show these durations.)",
    ]

    costs = costs_from_durations(lines)

    assert costs == {"test_demo_fleet.py": 218.2, "test_demo.py": 41.12 + 2.5 + 0.3}
    assert render(costs) == (
        "COSTS: dict[str, float] = {\n"
        '    "test_demo_fleet.py": 218.2,\n'
        '    "test_demo.py": 43.9,\n'
        "}"
    )


def test_the_table_names_only_modules_that_exist() -> None:
    modules = {path.name for path in TESTS.glob("test_*.py")}

    assert sorted(set(COSTS) - modules) == []
    assert len(COSTS) >= 10  # a table, not a stub


def test_xdist_is_told_to_keep_the_collection_order() -> None:
    """Without ``--no-loadscope-reorder`` xdist hands out the modules with the most tests
    first, whatever their cost, and this order is lost."""
    pyproject = tomllib.loads((TESTS.parent / "pyproject.toml").read_text())

    assert "--no-loadscope-reorder" in pyproject["tool"]["pytest"]["ini_options"]["addopts"]
