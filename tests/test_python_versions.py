"""Every CPython that pyproject.toml admits is one the locked dependencies support (issue 23
item 2): each compiled dependency in uv.lock has a wheel for each admitted minor version, so
``pip install pydory`` on any of them needs no compiler; ./dev and the classifiers agree."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
LOCK = tomllib.loads((ROOT / "uv.lock").read_text())


def admitted_minors() -> list[int]:
    """The minor versions of ``requires-python = ">=3.A,<3.B"``."""
    spec = PYPROJECT["project"]["requires-python"]
    match = re.fullmatch(r">=3\.(\d+),<3\.(\d+)", spec.replace(" ", ""))
    assert match, f"requires-python {spec!r} must name a closed range of 3.x"
    low, high = map(int, match.groups())
    return list(range(low, high))


def runtime_packages() -> set[str]:
    """The names of the daemon's and the spark extra's dependencies, with theirs."""
    by_name = {package["name"]: package for package in LOCK["package"]}
    wanted = ["pydory"]
    seen: set[str] = set()
    while wanted:
        name = wanted.pop()
        if name in seen:
            continue
        seen.add(name)
        package = by_name[name]
        edges = list(package.get("dependencies", []))
        for extra in package.get("optional-dependencies", {}).values():
            edges += extra
        wanted += [edge["name"] for edge in edges]
    return seen - {"pydory"}


def wheel_tags(package: dict[str, object]) -> set[tuple[str, str]]:
    """The (python, abi) tag pairs of a package's wheels, e.g. ("cp311", "cp311")."""
    wheels = package.get("wheels", [])
    assert isinstance(wheels, list)
    names = [str(wheel["url"]).rsplit("/", 1)[-1] for wheel in wheels]
    pattern = r"-(cp3\d+|py3|py2\.py3)-(cp3\d+|abi3|none)-"
    return {tag for name in names for tag in re.findall(pattern, name)}


#: Pure-Python packages that PyPI has as a source distribution only (no compiler needed;
#: uv refuses the lock if their own requires-python excludes an admitted version).
SDIST_ONLY_PURE_PYTHON = {"pyspark"}


def supports(tags: set[tuple[str, str]], minor: int) -> bool:
    """A wheel installs on CPython 3.minor: pure Python, built for it, or abi3 from below."""
    for python, abi in tags:
        if python in ("py3", "py2.py3"):
            return True
        built_for = int(python[3:])
        if built_for == minor or (abi == "abi3" and built_for <= minor):
            return True
    return False


def test_every_runtime_dependency_has_a_wheel_for_each_admitted_python() -> None:
    by_name = {package["name"]: package for package in LOCK["package"]}
    missing = {
        name: minor
        for name in sorted(runtime_packages())
        for minor in admitted_minors()
        if name not in SDIST_ONLY_PURE_PYTHON and not supports(wheel_tags(by_name[name]), minor)
    }
    assert missing == {}, f"no wheel for these (package: CPython 3.minor): {missing}"


def test_the_range_is_as_wide_as_the_dependencies_allow() -> None:
    """One more minor version would be refused by some dependency: the range is not narrower
    than it must be (issue 23: 3.12 and 3.13 were refused for no reason)."""
    by_name = {package["name"]: package for package in LOCK["package"]}
    next_minor = admitted_minors()[-1] + 1
    assert any(
        not supports(wheel_tags(by_name[name]), next_minor) for name in runtime_packages()
    ), f"every runtime dependency has a wheel for 3.{next_minor}: widen requires-python"


def test_the_lock_resolves_for_the_same_range() -> None:
    lock_range = LOCK["requires-python"].replace(" ", "")
    assert lock_range == PYPROJECT["project"]["requires-python"].replace(" ", "")


def test_classifiers_and_dev_name_every_admitted_python() -> None:
    minors = admitted_minors()
    classifiers = {
        c.rsplit(" ", 1)[-1] for c in PYPROJECT["project"]["classifiers"] if ":: Python :: 3." in c
    }
    assert classifiers == {f"3.{m}" for m in minors}
    dev = (ROOT / "dev").read_text()
    (line,) = re.findall(r'^SUPPORTED_PYTHONS="([^"]+)"', dev, re.MULTILINE)
    assert line.split() == [f"python3.{m}" for m in reversed(minors)], "newest first"
