"""hatch_build.py, the one build of the checkout's three C extensions: each compiles without
a warning, and with the platform's flags and its hardening kept (issue 30)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).parents[1]


@pytest.fixture(scope="module")
def hatch_build() -> ModuleType:
    sys.path.insert(0, str(ROOT))
    try:
        import hatch_build
    finally:
        sys.path.remove(str(ROOT))
    return hatch_build


def compiled(hatch_build: ModuleType, module: str, out_dir: Path, flags: list[str]) -> Path:
    try:
        built: Path = hatch_build.compile_extension(ROOT, out_dir, flags, module=module)
    except hatch_build.CompileError as error:
        if any(missing in str(error) for missing in ("no C compiler", "no Python.h", "no lib")):
            pytest.skip(str(error))
        raise
    return built


def undefined_symbols(shared_object: Path) -> set[str]:
    if shutil.which("nm") is None:
        pytest.skip("no nm (binutils) here to read the shared object's symbols")
    listing = subprocess.run(
        ["nm", "-D", "--undefined-only", str(shared_object)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return {line.split()[-1].partition("@")[0] for line in listing.splitlines() if line.strip()}


EXTENSIONS = ["_cwire", "_cproducer", "_cloadgen"]


@pytest.fixture(scope="module")
def built(hatch_build: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each extension compiled as the build compiles it, with -Werror added (not in a
    user's build: a newer Python's headers may warn where ours do not)."""
    out_dir = tmp_path_factory.mktemp("extensions")
    return {module: compiled(hatch_build, module, out_dir, ["-Werror"]) for module in EXTENSIONS}


@pytest.mark.parametrize("module", EXTENSIONS)
def test_every_extension_compiles_without_a_warning_and_stack_protected(
    hatch_build: ModuleType, built: dict[str, Path], module: str
) -> None:
    """The object calls the stack protector's check, which the flags before issue 30 (the
    build's own list, replacing the platform's) left out on Debian's gcc."""
    assert built[module].name == hatch_build.extension_filename(module)
    assert "__stack_chk_fail" in undefined_symbols(built[module])


def test_fortify_source_reaches_the_compiled_code(built: dict[str, Path]) -> None:
    """With _FORTIFY_SOURCE, glibc's checked functions (``__memcpy_chk``...) replace the
    copies whose destination size the compiler knows: none without it."""
    checked = {
        symbol
        for shared_object in built.values()
        for symbol in undefined_symbols(shared_object)
        if symbol.endswith("_chk") and symbol != "__stack_chk_fail"
    }
    assert checked


def test_the_platforms_flags_come_first_and_stay(hatch_build: ModuleType) -> None:
    flags = hatch_build.compile_flags()
    platform = hatch_build.platform_flags()

    assert flags[: len(platform)] == platform
    for word in (sysconfig.get_config_var("CFLAGS") or "").split():
        assert word in platform
    # Ours or the platform's own (Debian's Python has both in its CPPFLAGS and CFLAGS).
    assert [flag for flag in flags if flag.startswith("-fstack-protector")]
    assert [flag for flag in flags if flag.startswith("-D_FORTIFY_SOURCE=")]


@pytest.mark.parametrize(
    ("platform", "added", "not_added"),
    [
        # A stronger or explicit platform choice is never weakened.
        (
            ["-O2", "-fstack-protector-all", "-D_FORTIFY_SOURCE=3"],
            [],
            ["-fstack-protector-strong", "-D_FORTIFY_SOURCE=2", "-U_FORTIFY_SOURCE"],
        ),
        # glibc's _FORTIFY_SOURCE needs optimisation: not at -O0.
        (["-O0", "-g"], ["-fstack-protector-strong"], ["-D_FORTIFY_SOURCE=2", "-O2"]),
        # No level chosen: -O2, then fortified.
        ([], ["-O2", "-fPIC", "-fstack-protector-strong", "-D_FORTIFY_SOURCE=2"], []),
        # CCSHARED's -fPIC is not repeated.
        (["-O3", "-fPIC"], ["-D_FORTIFY_SOURCE=2"], ["-O2"]),
    ],
)
def test_ours_are_added_only_where_the_platform_chose_nothing(
    hatch_build: ModuleType, platform: list[str], added: list[str], not_added: list[str]
) -> None:
    flags = hatch_build.compile_flags(platform)

    assert flags[: len(platform)] == platform
    extra = flags[len(platform) :]
    assert all(flag in extra for flag in added), extra
    assert not [flag for flag in not_added if flag in extra], extra
    assert extra.count("-fPIC") == (0 if "-fPIC" in platform else 1)


def test_each_distribution_builds_only_its_own_extensions() -> None:
    """The daemon's wheel holds no benchmark code; the tools' build compiles _cloadgen."""
    import tomllib

    def hook(pyproject: Path) -> dict[str, object]:
        config = tomllib.loads(pyproject.read_text())
        hooks: dict[str, dict[str, object]] = config["tool"]["hatch"]["build"]["targets"]["wheel"][
            "hooks"
        ]
        return hooks["custom"]

    assert hook(ROOT / "pyproject.toml")["extensions"] == ["_cwire", "_cproducer"]
    tools = hook(ROOT / "tools" / "pyproject.toml")
    assert tools["extensions"] == ["_cloadgen"]
    assert (ROOT / "tools" / str(tools["path"])).resolve() == ROOT / "hatch_build.py"
