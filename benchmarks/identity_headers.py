"""The ``pydory-id`` headers of a burst, pure Python against the compiled
``identity_headers`` (issue 25, step 2): ``MessageIds.spooled`` per message, bursts of 1
and 64, best of 7. Not a test. (In the daemon the same call also pays for the cyclic
garbage collector, which a collection that its allocations set off is charged to:
BENCHMARKS.md, "Issue 25, step 2".)

    .venv/bin/python benchmarks/identity_headers.py
"""

from __future__ import annotations

import timeit
from collections.abc import Callable

from pydory import _cwire, hotpath
from pydory.daemon.spool import identity

Build = Callable[[str, bytes, int, int], hotpath.HeaderLists]
BUILDS: dict[str, Build] = {
    "pure": hotpath._pure_identity_headers,
    "compiled": _cwire.identity_headers,
}


def per_message_ns(build: Build, count: int, messages: int = 200_000) -> float:
    identity.identity_headers = build  # what MessageIds.spooled calls
    ids = identity.MessageIds("3f0c9a7e2b1d4c5f8e6a0b9c7d2e1f3a", 0x9B2D4C0E7A1F3355)
    first = [10_000_000]

    def burst() -> None:
        ids.spooled(4, first[0], count)
        first[0] += count

    bursts = messages // count
    return min(timeit.repeat(burst, number=bursts, repeat=7)) / (bursts * count) * 1e9


def main() -> None:
    for name, build in BUILDS.items():
        for count in (1, 64):
            print(f"{name:9} burst of {count:2}: {per_message_ns(build, count):4.0f} ns/msg")


if __name__ == "__main__":
    main()
