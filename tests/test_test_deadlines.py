"""No test deadline a busy machine can hit: fixed waits in the tests are far-off safety nets.

The floor is ``FLOOR_S`` = 60 seconds. Why: the suite must pass on a shared 2-core runner at
a 1-minute load of 50, where a step gets about 2/50 of a core, a 25-fold slowdown; no
single step a test waits for (a status page, a delivery, a thread's end, a process's exit)
takes 2.4 s on a quiet machine, so 60 s is a wait that only a hang reaches. Longer runs
(the demo, a Spark job, the kill loop) need their own larger nets; the floor is the least.

What counts as a fixed deadline, read from the source (an AST scan of ``tests/`` and
``tools/src/pydory_tools/testing/``):

- a keyword ``timeout=``, ``timeout_s=`` or ``timeout_ms=`` given a number (``timeout_ms``
  in milliseconds), except in calls to ``consume``/``poll``, whose timeout is one poll of
  a loop that goes on, not a deadline;
- a number as the deadline argument of ``wait_for(x, N)``, ``wait_until(x, N)``,
  ``x.wait(N)`` (an Event, Condition or process wait), ``x.join(N)`` and ``timeout(N)``
  (``asyncio.timeout``, and pytest-timeout's ``pytest.mark.timeout``: a whole test's net);
- a parameter named ``timeout``, ``timeout_s``, ``deadline_s`` or ``budget_s`` whose default
  is a number;
- ``time.monotonic() + N``, a deadline computed in place;
- a name ending in ``TIMEOUT_S`` or ``TIMEOUT_MS`` assigned a number (a module's constant);
- a module's constant, whatever its name (``CLIENT_PATIENCE_S = 10``), given where a number
  counts above: a timeout keyword, a deadline argument, a parameter's default or
  ``time.monotonic() + NAME`` (reported at each use; a marker on the constant's own line
  lets every use through).

A wait that is meant to end at its timeout (the test checks that something does *not*
happen meanwhile, or a timeout is the thing under test) says so on its line with
``# not a deadline`` (the why beside it or on the line above); the scan lets those through.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCANNED = [ROOT / "tests", ROOT / "tools" / "src" / "pydory_tools" / "testing"]
FLOOR_S = 60.0
MARKER = "# not a deadline"
TIMEOUT_KEYWORDS = {"timeout": 1.0, "timeout_s": 1.0, "timeout_ms": 0.001}
POLLS = {"consume", "poll"}
POSITIONAL_DEADLINE = {
    "wait_for": 1,
    "wait_until": 1,
    "wait": 0,
    "join": 0,
    "settimeout": 0,
    "timeout": 0,
}
DEFAULT_NAMES = {"timeout", "timeout_s", "deadline_s", "budget_s"}
CONSTANT_SUFFIXES = {"TIMEOUT_S": 1.0, "TIMEOUT_MS": 0.001}


def _literal(node: ast.AST) -> float | None:
    is_number = isinstance(node, ast.Constant) and isinstance(node.value, int | float)
    if is_number and not isinstance(node.value, bool):
        return float(node.value)
    return None


def _module_constants(tree: ast.Module, lines: list[str]) -> dict[str, float]:
    """The module's top-level names assigned a number: a deadline may hide behind one.

    A constant marked ``# not a deadline`` where it is assigned is let through at every use.
    """
    constants: dict[str, float] = {}
    for statement in tree.body:
        if not isinstance(statement, ast.Assign | ast.AnnAssign):
            continue
        if statement.value is not None and MARKER not in lines[statement.lineno - 1]:
            value = _literal(statement.value)
            targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
            for target in targets:
                if isinstance(target, ast.Name) and value is not None:
                    constants[target.id] = value
    return constants


def _name(call: ast.Call) -> str:
    if isinstance(call.func, ast.Attribute):
        return call.func.attr
    if isinstance(call.func, ast.Name):
        return call.func.id
    return ""


def fixed_deadlines(source: str) -> Iterator[tuple[int, float]]:
    """(line, seconds) of every fixed deadline in ``source`` below the floor."""
    lines = source.splitlines()
    tree = ast.parse(source)
    constants = _module_constants(tree, lines)

    def number(node: ast.AST) -> float | None:
        if isinstance(node, ast.Name):
            return constants.get(node.id)
        return _literal(node)

    for node in ast.walk(tree):
        for line, seconds in _deadlines_of(node, number):
            if seconds < FLOOR_S and MARKER not in lines[line - 1]:
                yield line, seconds


def _deadlines_of(
    node: ast.AST, _number: Callable[[ast.AST], float | None]
) -> Iterator[tuple[int, float]]:
    if isinstance(node, ast.Call):
        name = _name(node)
        for keyword in node.keywords:
            scale = TIMEOUT_KEYWORDS.get(keyword.arg or "")
            value = _number(keyword.value)
            if scale is not None and value is not None and name not in POLLS:
                yield keyword.value.lineno, value * scale
        index = POSITIONAL_DEADLINE.get(name)
        if index is not None and len(node.args) > index:
            value = _number(node.args[index])
            if value is not None:
                yield node.args[index].lineno, value
    elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        arguments = node.args.posonlyargs + node.args.args
        defaulted = arguments[len(arguments) - len(node.args.defaults) :]
        pairs = list(zip(defaulted, node.args.defaults, strict=True))
        pairs += [
            (a, d) for a, d in zip(node.args.kwonlyargs, node.args.kw_defaults, strict=True) if d
        ]
        for argument, default in pairs:
            value = _number(default)
            if argument.arg in DEFAULT_NAMES and value is not None:
                yield default.lineno, value
    elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        now = isinstance(node.left, ast.Call) and _name(node.left) == "monotonic"
        value = _number(node.right)
        if now and value is not None:
            yield node.right.lineno, value
    elif isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
        value = _literal(node.value)
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for target in targets:
            for suffix, scale in CONSTANT_SUFFIXES.items():
                if (
                    isinstance(target, ast.Name)
                    and target.id.endswith(suffix)
                    and value is not None
                ):
                    yield node.value.lineno, value * scale


def test_no_fixed_deadline_in_the_tests_is_below_the_floor() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{line}: {seconds:g} s"
        for folder in SCANNED
        for path in sorted(folder.rglob("*.py"))
        for line, seconds in fixed_deadlines(path.read_text(encoding="utf-8"))
    ]

    assert not found, (
        f"fixed deadlines under {FLOOR_S:g} s (a machine at load 50 reaches them; wait for "
        f"the condition with a far-off net, or mark a wait meant to time out with "
        f"'{MARKER}: <why>'):\n" + "\n".join(found)
    )


def test_the_scan_finds_each_kind_of_fixed_deadline() -> None:
    source = "\n".join(
        [
            "subprocess.run(cmd, timeout=20)",
            "urlopen(url, timeout=10)",
            "wait_until(check, 5)",
            "await asyncio.wait_for(task, 5)",
            "ready.wait(30)",
            "thread.join(10)",
            "client.join(timeout=5)",
            "def wait(timeout_s: float = 30.0): ...",
            "consumer.consume(100, timeout=1)",
            "producer.flush(timeout_ms=500)",
            "event.wait(0.2)  # not a deadline: nothing may arrive",
            "subprocess.run(cmd, timeout=600)",
            "PAGE_TIMEOUT_MS = 20_000",
            "RECEIVE_TIMEOUT_S: float = 10",
            "START_TIMEOUT_S = 60.0",
            "deadline = time.monotonic() + 30",
            "def loop(budget_s: float = 20.0): ...",
            "start = time.monotonic() + 0.05  # not a deadline: the first send's moment",
            "scope = asyncio.timeout(10)",
            "pytestmark = pytest.mark.timeout(30)",
            "pytestmark = pytest.mark.timeout(120)",
            "CLIENT_PATIENCE_S = 10.0",
            "sock.settimeout(CLIENT_PATIENCE_S)",
            "QUIET_S = 4.0  # not a deadline: nothing may arrive",
            "listener.settimeout(QUIET_S)",
            "wait_until(check, timeout_s=CLIENT_PATIENCE_S)",
            "NET_S = 120.0",
            "sock.settimeout(NET_S)",
        ]
    )

    found = sorted(fixed_deadlines(source))

    lines = [1, 2, 3, 4, 5, 6, 7, 8, 10, 13, 14, 16, 17, 19, 20, 23, 26]
    assert [line for line, _ in found] == lines
    assert found[-8:-2] == [(13, 20.0), (14, 10.0), (16, 30.0), (17, 20.0), (19, 10.0), (20, 30.0)]
    # A constant's number is the deadline at each use, whatever the constant is named.
    assert found[-2:] == [(23, 10.0), (26, 10.0)]
