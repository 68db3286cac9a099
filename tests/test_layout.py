"""The package's layering, checked on the source: the rules ARCHITECTURE.md states.

- the status interface reads the daemon through ``DaemonView``: nothing under
  ``pydory/status/`` imports the server (``pydory/server.py``, the composition root);
- nothing under ``pydory/daemon/`` imports the status interface or the server: the arrows
  run down only, from the server to ``daemon/`` and ``status/``;
- ``daemon/`` is in packages named for a message's stages, each with its rule at its top;
- every ``Rule:`` line in the package names, in backticks, what it is about: a name its
  module defines at top level (a class, a function, a constant; ``Class.method`` counts
  by its class), or for a package's ``__init__.py`` one of the package's modules
  (``segments``), so that a rule cannot drift away from the code it rules;
- every package's docstring names each of its modules (issue 30, point 4), so that the
  list a reader starts from is whole;
- no ``# fmt: skip`` in the package: a module is as long as its job needs, never packed to
  meet a number (the largest modules are printed, for the reader, not judged);
- no import circle anywhere in the package, counting every import statement (also those
  inside functions and under ``TYPE_CHECKING``): a reader can take the modules in order.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pydory

PACKAGE_DIR = Path(pydory.__file__).parent
#: How many of the largest modules the report prints.
LARGEST_SHOWN = 15
#: A name in backticks in a docstring: ``name``, `name`, :role:`name` or :role:`~a.b.name`.
BACKTICKED = re.compile(r"(?::\w+:)?`{1,2}~?([A-Za-z_][\w.]*)(?:\(\))?`{1,2}")


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


def test_the_largest_modules_are_reported() -> None:
    """Not a limit: the modules a reader meets first, largest first (``pytest -s``)."""
    sizes = sorted(
        ((len(p.read_text().splitlines()), str(p.relative_to(PACKAGE_DIR))) for p in sources()),
        reverse=True,
    )
    print("\nthe largest modules of pydory (lines):")
    for lines, name in sizes[:LARGEST_SHOWN]:
        print(f"  {lines:5d}  {name}")
    assert sizes, "no module found"


def sources() -> list[Path]:
    return sorted(PACKAGE_DIR.rglob("*.py"))


def rule_of(docstring: str) -> str | None:
    """The ``Rule:`` paragraph of a docstring (from ``Rule:`` to the next blank line)."""
    start = docstring.find("Rule:")
    if start < 0:
        return None
    return docstring[start:].split("\n\n", 1)[0]


def defined_names(tree: ast.Module) -> set[str]:
    """The names a module defines at top level (imports are not definitions)."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                elements = target.elts if isinstance(target, ast.Tuple) else [target]
                names.update(e.id for e in elements if isinstance(e, ast.Name))
    return names


def rule_names_nothing_defined(path: Path) -> str | None:
    """The rule of ``path`` if it names nothing its module defines (see the module's
    docstring), else None."""
    tree = ast.parse(path.read_text())
    rule = rule_of(ast.get_docstring(tree) or "")
    if rule is None:
        return None
    if path.name == "__init__.py":
        defined = {p.stem for p in path.parent.iterdir() if p.suffix == ".py" or p.is_dir()}
    else:
        defined = defined_names(tree)
    named = {name.split(".")[0] for name in BACKTICKED.findall(rule)}
    named |= {name.rsplit(".", 1)[-1] for name in BACKTICKED.findall(rule)}
    return None if named & defined else rule


def test_every_rule_names_what_its_module_defines() -> None:
    vague = {
        str(path.relative_to(PACKAGE_DIR)): rule
        for path in sources()
        if (rule := rule_names_nothing_defined(path)) is not None
    }
    assert vague == {}


def test_a_rule_that_names_nothing_of_its_module_is_found(tmp_path: Path) -> None:
    module = tmp_path / "room.py"
    module.write_text('"""A room.\n\nRule: ``Door`` opens here alone.\n"""\n\nclass Door: ...\n')
    assert rule_names_nothing_defined(module) is None
    module.write_text('"""A room.\n\nRule: the door opens here alone.\n"""\n\nclass Door: ...\n')
    assert rule_names_nothing_defined(module) == "Rule: the door opens here alone."
    module.write_text('"""A room.\n\nRule: ``Window`` opens here.\n"""\n\nclass Door: ...\n')
    assert rule_names_nothing_defined(module) is not None


#: A module named in a docstring: ``name``, `name`, :mod:`.name`, ``pkg.name``, ``name/``.
NAMED_MODULE = re.compile(r"`{1,2}~?\.?([A-Za-z_][\w.]*)/?`{1,2}")
#: The packages whose docstrings list their modules. Not the top-level package (its
#: modules are ARCHITECTURE.md's table) nor ``pipeline/``, whose sub-packages' modules its
#: own docstring lists (the pipeline wing's to keep).
LISTING_PACKAGES = [
    "daemon/admission",
    "daemon/books",
    "daemon/delivery",
    "daemon/inputs",
    "daemon/spool",
    "status",
    "config",
    "client",
    "commands",
]


def modules_left_unnamed(package: Path) -> list[str]:
    """The modules of ``package`` that its ``__init__.py`` docstring does not name."""
    docstring = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    named = {name.rsplit(".", 1)[-1] for name in NAMED_MODULE.findall(docstring)}
    modules = {p.stem for p in package.glob("*.py") if p.name != "__init__.py"}
    return sorted(modules - named)


def test_every_package_docstring_names_its_modules() -> None:
    unnamed = {
        package: missing
        for package in LISTING_PACKAGES
        if (missing := modules_left_unnamed(PACKAGE_DIR / package))
    }
    assert unnamed == {}


def test_a_module_a_package_docstring_leaves_out_is_found(tmp_path: Path) -> None:
    (tmp_path / "__init__.py").write_text('"""Rooms: ``door`` and :mod:`.window`."""\n')
    for name in ("door", "window", "roof"):
        (tmp_path / f"{name}.py").write_text("")
    assert modules_left_unnamed(tmp_path) == ["roof"]


def test_no_formatting_is_skipped_in_the_package() -> None:
    skipping = {
        str(path.relative_to(PACKAGE_DIR))
        for path in sources()
        if "# fmt: skip" in path.read_text()
    }
    assert skipping == set()


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
    assert shared == ["__init__", "errors", "faults", "lake_files", "spark", "worker_python"]
    for job in jobs:
        init = pipeline / job / "__init__.py"
        assert "Rule:" in (ast.get_docstring(ast.parse(init.read_text())) or ""), job
    assert not list(pipeline.rglob("*command*.py")), "a command line belongs in commands/"
    # The identity's header is spelt once, in the neutral module, and both sides use it.
    assert "pydory.message_identity" in graph["pydory.pipeline.landing.dedup"]
    assert "pydory.message_identity" in graph["pydory.daemon.spool.identity"]
