"""The package's build hook: compiles pydory's C extensions (the compiled hot path of
issue 25) with the system C compiler and this Python's headers:

- ``src/pydory/_cwire.c``: framing, parsing and batched datagram reads;
- ``src/pydory/_cproducer.c``: a librdkafka producer driven from C. It also needs
  librdkafka's header (Debian's librdkafka-dev) but links no librdkafka: at run time it
  takes the functions from the copy confluent-kafka loaded;
- ``src/pydory/_cloadgen.c``: ``pydory bench``'s load generator's write loop.

Hatchling runs it for every wheel, the editable install ``uv sync`` makes included:

- a wheel: the extensions are built in a scratch directory and put into the wheel as
  ``pydory/<name><EXT_SUFFIX>``; the wheel is then tagged for this interpreter and platform;
- an editable install: they are built next to their source in ``src/pydory/`` (ignored
  by git), where the editable install imports the package from.

Each extension is optional. Without a C compiler, Python.h or rdkafka.h (or with
``PYDORY_BUILD_PURE=1``) the hook says so on stderr and the build goes on without it:
``pydory.hotpath`` then runs the pure-Python reference, the same rules, slower.
``PYDORY_BUILD_REQUIRE_COMPILED=1`` makes a failed compile fail the build instead (CI, and
tests/test_wheel.py's builds).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

#: Each extension: its module name and its source.
EXTENSIONS = {
    "_cwire": Path("src/pydory/_cwire.c"),
    "_cproducer": Path("src/pydory/_cproducer.c"),
    "_cloadgen": Path("src/pydory/_cloadgen.c"),  # pydory bench's generator, not the daemon
}
#: What an extension needs besides Python.h, and where Debian has it.
NEEDS = {"_cproducer": ("librdkafka/rdkafka.h", "librdkafka-dev")}
SOURCE = EXTENSIONS["_cwire"]
MODULE = "_cwire"
#: Not -Werror here: a newer Python's headers may warn where ours do not, and a user's
#: build must not fail for that; tests/test_cwire.py compiles with -Werror instead.
CFLAGS = ["-O2", "-g0", "-fPIC", "-Wall", "-Wextra", "-fno-strict-aliasing"]


class CompileError(Exception):
    """The extension could not be compiled here (no compiler, no headers, an error)."""


def extension_filename(module: str = MODULE) -> str:
    return module + (sysconfig.get_config_var("EXT_SUFFIX") or ".so")


def compile_extension(
    root: Path, out_dir: Path, extra_flags: list[str] | None = None, module: str = MODULE
) -> Path:
    """Compile extension ``module`` into ``out_dir``; the path of the shared object made."""
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
        *compiler.split(),
        *CFLAGS,
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
        root = Path(self.root)
        if version != "editable":
            self._scratch = tempfile.TemporaryDirectory(prefix="pydory-build-")
        for module, source in EXTENSIONS.items():
            out_dir = root / source.parent if version == "editable" else Path(self._scratch.name)
            try:
                built = compile_extension(root, out_dir, module=module)
            except CompileError as error:
                if os.environ.get("PYDORY_BUILD_REQUIRE_COMPILED") == "1":
                    raise
                self._say(f"building without {module}: it did not compile ({error})")
                continue
            if version != "editable":
                build_data["force_include"][str(built)] = f"pydory/{built.name}"
                build_data["pure_python"] = False
                build_data["infer_tag"] = True

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        scratch = getattr(self, "_scratch", None)
        if scratch is not None:
            scratch.cleanup()

    @staticmethod
    def _say(line: str) -> None:
        print(f"pydory build: {line}", file=sys.stderr)
