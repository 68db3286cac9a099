"""``/health`` and ``/ready``: is the daemon alive, and can it deliver what it is sent?

``GET /health`` (liveness) is answered by the daemon's event loop itself, so any answer
means the loop turns: 200, always, with the pid and the uptime. It checks nothing else on
purpose: a daemon waiting for Kafka is alive and keeps what it reads, and a supervisor
that restarted it for Kafka's outage would gain nothing.

``GET /ready`` (readiness) is 200 when the daemon takes messages *and* can deliver them:
its inputs are open (no shutdown begun), Kafka has answered a metadata request since it
started, and librdkafka's latest statistics do not show every broker unreachable.
Otherwise 503, with the first failing check as ``reason``. Both are JSON, rendered on
every request (no page reuse: a probe wants now, and the checks cost microseconds).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiohttp import web

from pydory import __version__

if TYPE_CHECKING:
    from pydory.status.view import DaemonView

__all__ = ["Readiness", "health_routes", "readiness"]


@dataclass(frozen=True, slots=True)
class Readiness:
    """What ``/ready`` answers: ready or not, why not, and each check's finding."""

    reason: str | None  # None: ready
    inputs_open: bool
    metadata_known: bool
    brokers_known: int  # brokers in librdkafka's latest statistics
    brokers_unreachable: int
    inputs_paused_for_memory: bool  # backpressure: open, reading again when memory frees

    @property
    def ready(self) -> bool:
        return self.reason is None

    def as_json(self) -> dict[str, Any]:
        return {
            "ready": self.ready,
            "reason": self.reason,
            "checks": {
                "inputs_open": self.inputs_open,
                "metadata_known": self.metadata_known,
                "brokers_known": self.brokers_known,
                "brokers_unreachable": self.brokers_unreachable,
                "inputs_paused_for_memory": self.inputs_paused_for_memory,
            },
        }


def readiness(view: DaemonView) -> Readiness:
    """The daemon's readiness now, read from ``view`` (on the loop)."""
    stopping = view.commit_point.shutting_down or (view.stopping is not None and view.stopping())
    metadata_known = view.metadata.last_updated_ms is not None
    brokers = [broker for broker in view.kafka_stats.latest().brokers if broker.node_id >= 0]
    unreachable = [broker.name for broker in brokers if broker.unreachable]
    reason = None
    if stopping:
        reason = "shutting down: the inputs are closing"
    elif not metadata_known:
        reason = (
            f"no metadata from Kafka yet ({view.metadata.fetch_failures} fetches failed since "
            "start): messages sent now wait in memory until a broker answers"
        )
    elif brokers and len(unreachable) == len(brokers):
        reason = f"every broker is unreachable (librdkafka): {', '.join(sorted(unreachable))}"
    return Readiness(
        reason=reason,
        inputs_open=not stopping,
        metadata_known=metadata_known,
        brokers_known=len(brokers),
        brokers_unreachable=len(unreachable),
        inputs_paused_for_memory=view.overload is not None and view.overload.paused,
    )


def health_routes(view: DaemonView) -> list[web.RouteDef]:
    """``GET /health`` and ``GET /ready`` (HEAD too, as aiohttp adds it to every GET)."""

    async def health(request: web.Request) -> web.StreamResponse:
        return web.json_response(
            {
                "alive": True,
                "pid": os.getpid(),
                "version": __version__,
                "uptime_s": round(time.time() - view.started_at, 3),
            }
        )

    async def ready(request: web.Request) -> web.StreamResponse:
        found = readiness(view)
        return web.json_response(found.as_json(), status=200 if found.ready else 503)

    return [web.get("/health", health), web.get("/ready", ready)]
