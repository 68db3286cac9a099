"""The instructions ``books/charges.py`` adds per accepted message (issue 33's client
charges) against the commit point's tokens alone (549f3cf's path), N rounds each: run
under callgrind at N = 0 and N = 200000; (difference) / N. Not a test.

    for n in 0 200000; do valgrind --tool=callgrind --callgrind-out-file=/tmp/c-$n \\
        .venv/bin/python benchmarks/instructions_charges.py src $n message; done

A round is what the intake and the ledger do with one token:

- ``message``: the reference path's one message (``admits``, ``open(1, cost)``), settled
  (``released``, ``close``), through ``ClientTokens``;
- ``burst``: one topic of a burst on the burst path (``room``, ``open(n, cost)``), and its
  acknowledgements' one token (``released``, ``close``), through ``ClientTokens``;
- ``inner``: the commit point's ``open`` and ``close`` alone (no client charged).

The client holds other messages all along (its slot stays taken), as under load.
"""

import sys

source, count, variant = sys.argv[1], int(sys.argv[2]), sys.argv[3]
sys.path.insert(0, source)

from pydory.daemon.books.charges import ClientTokens  # noqa: E402
from pydory.daemon.books.commit_point import CommitPoint  # noqa: E402
from pydory.daemon.books.pool import MemoryPool  # noqa: E402

pool = MemoryPool(128 << 20)
commit_point = CommitPoint(schedule=lambda delay, callback: True)  # a sweep is due already
tokens = ClientTokens(commit_point, pool.shares)
CLIENT, COST, BURST = ("uid", 0), 150, 180
tokens.client = CLIENT
tokens.open(1, COST)  # held all along
HAS_ROOM = hasattr(tokens, "has_room")  # the burst path's question since issue 30's trim


def message() -> None:
    if not tokens.admits():
        raise AssertionError("the client has room")
    token = tokens.open(1, COST)
    tokens.released(token, COST)
    tokens.close(token)


def burst() -> None:
    if not (tokens.has_room(BURST * COST) if HAS_ROOM else tokens.room() > BURST * COST):
        raise AssertionError("the client has room")
    token = tokens.open(BURST, BURST * COST)
    tokens.released(token, BURST * COST)
    tokens.close(token, BURST)


def inner() -> None:
    commit_point.close(commit_point.open(1))


call = {"message": message, "burst": burst, "inner": inner}[variant]
for _ in range(count):
    call()
