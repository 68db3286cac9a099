"""The live dashboard at ``/``: static assets shipped in the package, and its data feed.

The page (``index.html``, ``app.js``, ``style.css`` in ``static/`` beside this file; no
CDN, no build step) asks ``/dashboard/json`` once a second and draws everything from that
one document: per-topic rates (the browser differentiates successive totals), the memory
pool, discards by reason, librdkafka's brokers and queues, metadata times, the commit
point, and which topics message debugging traces (with a button that stops it).

:func:`dashboard_json` renders the feed from the daemon's view; call it on the daemon's
loop, like every status page.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any

from pydory import __version__
from pydory.daemon.books import counters as counter_names
from pydory.daemon.delivery.kafka_stats import USABLE_STATES

if TYPE_CHECKING:
    from pydory.status.view import DaemonView

__all__ = ["ASSETS", "Asset", "dashboard_json", "load_asset"]


@dataclass(frozen=True, slots=True)
class Asset:
    """One static file of the dashboard, read once at start-up."""

    body: bytes
    content_type: str


#: URL path -> file name in this package, and the content type to serve it with.
ASSETS: Mapping[str, tuple[str, str]] = {
    "/": ("index.html", "text/html"),
    "/dashboard/app.js": ("app.js", "text/javascript"),
    "/dashboard/style.css": ("style.css", "text/css"),
    "/dashboard/favicon.svg": ("favicon.svg", "image/svg+xml"),
}


def load_asset(file_name: str, content_type: str) -> Asset:
    """Read one of the dashboard's files from the installed package."""
    body = resources.files("pydory.status").joinpath("static", file_name).read_bytes()
    return Asset(body, content_type)


def dashboard_json(daemon: DaemonView, clock: Callable[[], float] = time.time) -> dict[str, Any]:
    """Everything the dashboard draws, in one document (one request per refresh)."""
    now = clock()
    return {
        "pid": os.getpid(),
        "version": __version__,
        "since": daemon.started_at,
        "now": now,
        "received": {str(t): n for t, n in daemon.books.received_by_transport().items()},
        "discards": {str(r): n for r, n in daemon.books.lifetime_discards_by_reason().items()},
        "topics": _topics(daemon),
        "pool": {
            "budget": daemon.pool.budget,
            "used": daemon.pool.used,
            "available": daemon.pool.available,
            "over_budget": daemon.pool.over_budget,
            "percent_time_depleted": daemon.pool.percent_time_depleted(),
        },
        "new": daemon.pending_topic_messages(),
        "brokers": _brokers(daemon),
        "stats_taken_at": daemon.kafka_stats.latest().taken_at,
        "metadata": {
            "known": daemon.metadata.last_updated_ms is not None,  # false: no metadata yet
            "last_updated": daemon.metadata.last_updated_ms or 0,
            "last_modified": daemon.metadata.last_modified_ms or 0,
            "fetch_failures": daemon.metadata.fetch_failures,
            "update_requests": daemon.counters.get(counter_names.METADATA_UPDATE_REQUESTED),
        },
        "commit_point": _commit_point(daemon),
        "msg_debug": _msg_debug(daemon),
        "spool": _spool(daemon),
        "overload": _overload(daemon),
    }


def _spool(daemon: DaemonView) -> dict[str, Any] | None:
    """The write-ahead spool's state (None: ``<spool>`` is off)."""
    spool = daemon.spool
    if spool is None:
        return None
    counters = daemon.counters
    return {
        "directory": spool.directory,
        "fsync_interval_ms": spool.fsync_interval_ms,
        "bytes": spool.bytes_on_disk,
        "max_bytes": spool.max_bytes,
        "segments": spool.segments,
        "outstanding": spool.outstanding,
        "appended": spool.appended_total,
        "fsyncs": spool.fsyncs_total,
        "errors": spool.errors_total,
        "full": spool.full_total,
        "replayed": counters.get(counter_names.SPOOL_REPLAYED),
        "unprotected": counters.get(counter_names.SPOOL_UNPROTECTED),
    }


def _overload(daemon: DaemonView) -> dict[str, Any] | None:
    """The overload policy and the time the inputs spent paused for memory."""
    overload = daemon.overload
    if overload is None:
        return None
    return {
        "policy": overload.policy_name,
        "paused": overload.paused,
        "paused_seconds": overload.paused_seconds(),
        "pauses": daemon.counters.get(counter_names.BACKPRESSURE_PAUSES),
    }


def _msg_debug(daemon: DaemonView) -> dict[str, Any] | None:
    """Which topics message debugging traces now (None: ``<msgDebug>`` is off)."""
    control = daemon.msg_debug
    if control is None:
        return None
    selection = control.selection
    return {
        "all_topics": selection.all_topics,
        "topics": sorted(selection.topics),
        "directory": control.directory,
        "bytes_written": control.bytes_written,
        "byte_limit": control.byte_limit,
        "seconds_left": control.seconds_left(),
        "stopped": control.stopped_reason,
    }


def _commit_point(daemon: DaemonView) -> dict[str, Any]:
    view = daemon.commit_point.current()
    return {
        "commit_point": view.commit_point,
        "commit_point_ms": int(view.commit_point * 1000),
        "lag_s": view.lag_s,
        "open_messages": view.open_messages,
    }


def _topics(daemon: DaemonView) -> list[dict[str, Any]]:
    """Per topic: the books, librdkafka's queues, and which broker leads each partition."""
    queues = daemon.kafka_stats.latest().topics
    layouts = daemon.layout().topics
    rows = []
    for topic, totals in sorted(daemon.books.per_topic().items()):
        queued = queues.get(topic)
        layout = layouts.get(topic)
        rows.append(
            {
                "topic": topic,
                "accepted": totals.accepted,
                "delivered": totals.delivered,
                "discarded": sum(totals.discarded_by_reason.values()),
                "in_flight": totals.in_flight,
                "batch": queued.batch if queued else 0,
                "send_wait": queued.send_wait if queued else 0,
                "ack_wait": queued.ack_wait if queued else 0,
                "leaders": {str(p): b for p, b in layout.leaders.items()} if layout else {},
            }
        )
    return rows


def _brokers(daemon: DaemonView) -> list[dict[str, Any]]:
    """Every broker the metadata names, with librdkafka's view of the connection to it."""
    stats = {b.node_id: b for b in daemon.kafka_stats.latest().brokers}
    rows = []
    for node_id, address in sorted(daemon.layout().brokers.items()):
        broker = stats.get(node_id)
        rows.append(
            {
                "node_id": node_id,
                "address": address,
                "state": broker.state if broker else "UNKNOWN",
                "up": broker is not None and broker.state in USABLE_STATES,
                "rtt_avg_ms": broker.rtt_avg_ms if broker else None,
                "rtt_p99_ms": broker.rtt_p99_ms if broker else None,
                "errors": broker.tx_errors + broker.rx_errors if broker else 0,
                "request_timeouts": broker.request_timeouts if broker else 0,
                "leader_partitions": broker.leader_partitions if broker else 0,
            }
        )
    return rows
