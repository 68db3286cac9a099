"""The status interface: Dory's status URLs, pydory's books, ``/metrics`` and the dashboard.

It reads the running daemon only through :class:`~pydory.status.view.DaemonView`, a narrow
read-only view the daemon's server hands in; nothing here imports the server.

- :mod:`.view` — what the interface may read of the daemon;
- :mod:`.pages` — Dory's pages and ``/books/json``, rendered (no I/O);
- :mod:`.discards` — Dory's discard report (``/discards``), rendered from the books' report;
- :mod:`.commit_point` — ``/commit_point/{json,plain}`` and its long-poll;
- :mod:`.health` — ``/health`` (liveness) and ``/ready`` (readiness);
- :mod:`.dory_counters` — Dory's counters under Dory's names (``/counters``);
- :mod:`.msg_debug` — Dory's ``/msg_debug/...`` URLs;
- :mod:`.metrics` — the Prometheus collector;
- :mod:`.dashboard` — the live dashboard's feed and its static files (``static/``);
- :mod:`.rendering` — JSON pages and ``/metrics`` encoded in slices of loop time;
- :mod:`.limits` — the status port's connection limits, on the transport;
- :mod:`.server` — aiohttp on the daemon's loop: routes, pacing, listening.
"""

from pydory.status.server import StatusServer
from pydory.status.view import DaemonView

__all__ = ["DaemonView", "StatusServer"]
