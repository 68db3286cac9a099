"""The build hook of both distributions: compiles their C extensions with the system C
compiler, this Python's headers and the platform's own compiler flags.

Rule: every C extension of the checkout is compiled here, with one set of flags.

Each distribution names its extensions in its ``pyproject.toml`` (the hook's
``extensions`` option), from :data:`EXTENSIONS`:

- ``pydory`` (this directory): ``src/pydory/_cwire.c`` (framing, parsing and batched
  datagram reads) and ``src/pydory/_cproducer.c`` (a librdkafka producer driven from C; it
  also needs librdkafka's header, Debian's librdkafka-dev, but links no librdkafka: at run
  time it takes the functions from the copy confluent-kafka loaded);
- ``pydory-tools`` (``tools/``, its hook is this file): ``tools/src/pydory_tools/_cloadgen.c``,
  ``pydory bench``'s load generator's write loop.

The flags are those Python's own extension builds use (``sysconfig``'s ``CFLAGS``,
``CPPFLAGS`` and ``LDFLAGS``, then the environment's), so a platform's hardening stays; to
them the hook adds position-independent code, its warnings, ``-fstack-protector-strong``
and ``-D_FORTIFY_SOURCE=2`` (with optimisation only, as glibc requires), each only where the
platform's flags do not already choose one (a stronger choice is never weakened).

Hatchling runs it for every wheel, the editable install ``uv sync`` makes included:

- a wheel: the extensions are built in a scratch directory and put into the wheel beside
  their package (``pydory/<name><EXT_SUFFIX>``); the wheel is then tagged for this
  interpreter and platform;
- an editable install: they are built next to their source (ignored by git), where the
  editable install imports the package from.

Each extension is optional. Without a C compiler, Python.h or rdkafka.h (or with
``PYDORY_BUILD_PURE=1``) the hook says so on stderr and the build goes on without it:
``pydory.hotpath`` then runs the pure-Python reference, the same rules, slower.
``PYDORY_BUILD_REQUIRE_COMPILED=1`` makes a failed compile fail the build instead (CI, and
tests/test_wheel.py's builds).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

#: The checkout this file is in: each extension's source is relative to it.
CHECKOUT = Path(__file__).resolve().parent
#: Each extension: its module name and its source (relative to the checkout).
EXTENSIONS = {
    "_cwire": Path("src/pydory/_cwire.c"),
    "_cproducer": Path("src/pydory/_cproducer.c"),
    "_cloadgen": Path("tools/src/pydory_tools/_cloadgen.c"),  # pydory bench's, not the daemon's
}
#: What an extension needs besides Python.h, and where Debian has it.
NEEDS = {"_cproducer": ("librdkafka/rdkafka.h", "librdkafka-dev")}
MODULE = "_cwire"
#: Ours, after the platform's. Not -Werror here: a newer Python's headers may warn where
#: ours do not, and a user's build must not fail for that; tests/test_build.py compiles
#: every extension with -Werror instead.
WARNINGS = ["-Wall", "-Wextra", "-fno-strict-aliasing"]


class CompileError(Exception):
    """The extension could not be compiled here (no compiler, no headers, an error)."""


def extension_filename(module: str = MODULE) -> str:
    return module + (sysconfig.get_config_var("EXT_SUFFIX") or ".so")


def platform_flags() -> list[str]:
    """The flags Python's own extension builds use here: ``sysconfig``'s ``CFLAGS``,
    ``CCSHARED``, ``CPPFLAGS`` and ``LDFLAGS``, then the environment's (a distribution's
    build sets its hardening there)."""
    words: list[str] = []
    for name in ("CFLAGS", "CCSHARED", "CPPFLAGS", "LDFLAGS"):
        words += shlex.split(sysconfig.get_config_var(name) or "")
    for name in ("CFLAGS", "CPPFLAGS", "LDFLAGS"):
        words += shlex.split(os.environ.get(name, ""))
    return words


def compile_flags(base: list[str] | None = None) -> list[str]:
    """``base`` (default: :func:`platform_flags`) with ours added: the warnings, -fPIC,
    -O2 if no optimisation level is chosen, the stack protector and _FORTIFY_SOURCE unless
    ``base`` already chooses them (the platform's choice stands, stronger or not)."""
    flags = [*(platform_flags() if base is None else base), *WARNINGS]
    if not any(flag in ("-fPIC", "-fpic") for flag in flags):  # CCSHARED's, usually
        flags.append("-fPIC")
    levels = [flag for flag in flags if flag.startswith("-O")]
    if not levels:
        flags.append("-O2")
    if not any(flag.startswith(("-fstack-protector", "-fno-stack-protector")) for flag in flags):
        flags.append("-fstack-protector-strong")
    optimised = (levels[-1] if levels else "-O2") != "-O0"
    if optimised and not any("_FORTIFY_SOURCE" in flag for flag in flags):
        # -U first: a compiler that defines it by default (Ubuntu's gcc) would warn.
        flags += ["-U_FORTIFY_SOURCE", "-D_FORTIFY_SOURCE=2"]
    return flags


def compile_extension(
    root: Path, out_dir: Path, extra_flags: list[str] | None = None, module: str = MODULE
) -> Path:
    """Compile extension ``module`` (its source under the checkout ``root``) into
    ``out_dir``; the path of the shared object made."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise CompileError("no C compiler (cc or gcc) on PATH")
    include = sysconfig.get_paths()["include"]
    if not (Path(include) / "Python.h").is_file():
        raise CompileError(f"no Python.h in {include} (Debian: apt-get install python3-dev)")
    needed = NEEDS.get(module)
    if needed is not None and not any(
        (Path(d) / needed[0]).is_file() for d in ("/usr/include", "/usr/local/include")
    ):
        raise CompileError(f"no {needed[0]} (Debian: apt-get install {needed[1]})")
    target = out_dir / extension_filename(module)
    partial = target.with_name(target.name + ".partial")
    command = [
        *shlex.split(compiler),
        *compile_flags(),
        *(extra_flags or []),
        "-shared",
        f"-I{include}",
        str(root / EXTENSIONS[module]),
        "-o",
        str(partial),
    ]
    try:
        result = subprocess.run(command, capture_output=True, text=True, check=False)
    except OSError as error:  # CC names nothing runnable
        raise CompileError(f"{compiler} does not run: {error}") from error
    if result.returncode != 0:
        raise CompileError(f"{' '.join(command)} failed:\n{result.stderr.strip()}")
    partial.replace(target)  # a half-written .so is never importable
    return target


class CompiledCoreHook(BuildHookInterface):  # type: ignore[type-arg]
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if os.environ.get("PYDORY_BUILD_PURE") == "1":
            self._say("PYDORY_BUILD_PURE=1: building pure Python (no compiled hot path)")
            return
        if version != "editable":
            self._scratch = tempfile.TemporaryDirectory(prefix="pydory-build-")
        for module in self.config.get("extensions", []):
            source = EXTENSIONS[module]
            editable = version == "editable"
            out_dir = CHECKOUT / source.parent if editable else Path(self._scratch.name)
            try:
                built = compile_extension(CHECKOUT, out_dir, module=module)
            except CompileError as error:
                if os.environ.get("PYDORY_BUILD_REQUIRE_COMPILED") == "1":
                    raise
                self._say(f"building without {module}: it did not compile ({error})")
                continue
            if not editable:
                # Beside its package in the wheel: pydory/ or pydory_tools/.
                build_data["force_include"][str(built)] = f"{source.parent.name}/{built.name}"
                build_data["pure_python"] = False
                build_data["infer_tag"] = True

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        scratch = getattr(self, "_scratch", None)
        if scratch is not None:
            scratch.cleanup()

    @staticmethod
    def _say(line: str) -> None:
        print(f"pydory build: {line}", file=sys.stderr)
