"""The package's layering, checked on the source: the rules ARCHITECTURE.md states.

- the status interface reads the daemon through ``DaemonView``: nothing under
  ``pydory/status/`` imports the server (``pydory/server.py``, the composition root);
- nothing under ``pydory/daemon/`` imports the status interface or the server: the arrows
  run down only, from the server to ``daemon/`` and ``status/``;
- ``daemon/`` is in packages named for a message's stages, each with its rule at its top,
  and no module there is longer than MAX_DAEMON_MODULE_LINES;
- no import circle anywhere in the package, counting every import statement (also those
  inside functions and under ``TYPE_CHECKING``): a reader can take the modules in order.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pydory

PACKAGE_DIR = Path(pydory.__file__).parent
#: A module under ``daemon/`` longer than this is two jobs in one room.
MAX_DAEMON_MODULE_LINES = 600


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, known: set[str]) -> Iterator[str]:
    """Every pydory module ``path`` imports, resolved to a module of the package."""
    package = module_name(path) if path.name == "__init__.py" else module_name(path.parent)
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            names = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            if name in known:
                yield name


def import_graph() -> dict[str, set[str]]:
    paths = {module_name(p): p for p in PACKAGE_DIR.rglob("*.py")}
    known = set(paths)
    return {name: set(imported_modules(path, known)) - {name} for name, path in paths.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle, as the list of modules around it, or None."""
    state: dict[str, str] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        stack.append(node)
        for target in sorted(graph[node]):
            # A package's __init__ importing its own submodules is how packages export.
            if node.startswith(target + "."):
                continue
            if state.get(target) == "open":
                return [*stack[stack.index(target) :], target]
            if target not in state and (cycle := visit(target)):
                return cycle
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_import_graph_is_read_from_the_source() -> None:
    graph = import_graph()
    assert "pydory.server" in graph["pydory.commands.serve"]
    assert "pydory.status.view" in graph["pydory.status.server"]


def test_the_status_interface_never_imports_the_server() -> None:
    graph = import_graph()
    offenders = {
        name: sorted(graph[name] & {"pydory.server"})
        for name in graph
        if name.startswith("pydory.status")
    }
    assert {name: found for name, found in offenders.items() if found} == {}


def test_the_daemon_never_imports_the_status_interface_or_the_server() -> None:
    """``daemon/`` is the data path; ``pydory.server`` composes it with ``status/``."""
    graph = import_graph()
    reaching = {
        name: sorted(t for t in targets if t.startswith(("pydory.status", "pydory.server")))
        for name, targets in graph.items()
        if name.startswith("pydory.daemon")
    }
    assert {name: found for name, found in reaching.items() if found} == {}


def test_no_module_under_daemon_is_longer_than_the_limit() -> None:
    too_long = {
        str(path.relative_to(PACKAGE_DIR)): lines
        for path in (PACKAGE_DIR / "daemon").rglob("*.py")
        if (lines := len(path.read_text().splitlines())) > MAX_DAEMON_MODULE_LINES
    }
    assert too_long == {}


def counter_name_literals(source: str) -> Iterator[int]:
    """Lines of ``counters.inc("name")`` / ``view.counters.get(f"...")``: a counter named by
    a literal rather than through ``pydory.daemon.books.counters``."""
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        owner = node.func.value
        owner_name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
        if (
            node.func.attr in {"inc", "get"}
            and owner_name.endswith("counters")
            and node.args
            and isinstance(node.args[0], ast.Constant | ast.JoinedStr)
        ):
            yield node.lineno


def test_counter_names_are_spelled_in_one_module() -> None:
    """The stage that counts and the page that shows a counter name it the same way."""
    found = [
        f"{path.relative_to(PACKAGE_DIR)}:{line}"
        for path in PACKAGE_DIR.rglob("*.py")
        for line in counter_name_literals(path.read_text())
    ]
    assert found == []


def test_a_counter_named_by_a_literal_is_found() -> None:
    source = 'def f(self, view, t):\n    self._counters.inc("accepted")\n'
    source += '    view.counters.get(f"received_{t}")\n    self._counters.inc(names.ACCEPTED)\n'
    assert list(counter_name_literals(source)) == [2, 3]


def test_every_stage_of_the_daemon_is_a_package_with_its_rule() -> None:
    """Each stage says at its top what it holds, and each module the rule that lives there
    alone (h11's "Rule 1"); the stages are named for a message's stages."""
    stages = sorted(
        p.name for p in (PACKAGE_DIR / "daemon").iterdir() if p.is_dir() and p.name != "__pycache__"
    )
    assert stages == ["admission", "books", "delivery", "inputs", "spool"]
    for stage in stages:
        init = PACKAGE_DIR / "daemon" / stage / "__init__.py"
        assert ast.get_docstring(ast.parse(init.read_text())), f"daemon/{stage} has no docstring"
    without_rule = sorted(
        str(path.relative_to(PACKAGE_DIR))
        for path in (PACKAGE_DIR / "daemon").rglob("*.py")
        if path.name != "__init__.py"
        and "Rule:" not in (ast.get_docstring(ast.parse(path.read_text())) or "")
    )
    assert without_rule == []


def test_there_is_no_import_circle() -> None:
    assert find_cycle(import_graph()) is None


def test_a_circle_is_found_when_there_is_one() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}
    assert find_cycle(graph) == ["a", "b", "c", "a"]


def test_the_pipeline_is_a_wing_of_its_own_grouped_by_job() -> None:
    """Issue 31, item 7: ``pipeline/`` imports nothing of ``daemon/``, the server or
    ``commands/`` (the identity it shares with the daemon is ``pydory.message_identity``);
    its modules sit in a package per job (source, landing, audits), beside the few the
    jobs share; its command lines are under ``commands/``."""
    graph = import_graph()
    forbidden = ("pydory.daemon", "pydory.server", "pydory.commands")
    crossings = sorted(
        f"{module} imports {target}"
        for module, targets in graph.items()
        if module == "pydory.pipeline" or module.startswith("pydory.pipeline.")
        for target in targets
        if any(target == f or target.startswith(f + ".") for f in forbidden)
    )
    assert crossings == []
    pipeline = PACKAGE_DIR / "pipeline"
    jobs = sorted(p.name for p in pipeline.iterdir() if p.is_dir() and p.name != "__pycache__")
    assert jobs == ["audits", "landing", "source"]
    shared = sorted(p.stem for p in pipeline.glob("*.py"))
    assert shared == ["__init__", "errors", "faults", "spark"]
    for job in jobs:
        init = pipeline / job / "__init__.py"
        assert "Rule:" in (ast.get_docstring(ast.parse(init.read_text())) or ""), job
    assert not list(pipeline.rglob("*command*.py")), "a command line belongs in commands/"
    # The identity's header is spelt once, in the neutral module, and both sides use it.
    assert "pydory.message_identity" in graph["pydory.pipeline.landing.dedup"]
    assert "pydory.message_identity" in graph["pydory.daemon.spool.identity"]
