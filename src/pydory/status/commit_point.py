"""``/commit_point/{json,plain}``: the commit point on the status server, with its long-poll.

The commit point itself (what it means, how it moves) is :mod:`pydory.daemon.books.commit_point`;
this module only parses the query, waits through the view, and renders the page.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiohttp import web

from pydory import __version__

if TYPE_CHECKING:
    from pydory.daemon.books.commit_point import CommitPointView
    from pydory.status.view import DaemonView

__all__ = ["LONG_POLL_DEFAULT_S", "LONG_POLL_MAX_S", "commit_point_routes"]

#: ``after=now`` waits at least this long whatever its ``timeout``: the moment echoed is
#: rounded up to the next millisecond, and the commit point moves at its sweeps (every
#: 10 ms epoch), so even an idle daemon passes "now" only a moment later.
NOW_GRACE_S = 0.25
#: ``/commit_point/json?after=T`` without ``timeout`` waits this long at most.
LONG_POLL_DEFAULT_S = 30.0
#: No long-poll request waits longer than this; ``pydory wait`` asks again if it must.
LONG_POLL_MAX_S = 300.0


class _BadQuery(web.HTTPBadRequest):
    def __init__(self, text: str) -> None:
        super().__init__(text=text + "\n", content_type="text/plain")


@dataclass(frozen=True, slots=True)
class _LongPoll:
    after: float | None  # wall-clock seconds, None: the daemon's now
    timeout_s: float


def _long_poll_of(request: web.Request) -> _LongPoll | None:
    """``?after=<epoch seconds | now>&timeout=<seconds>``; None when ``after`` is absent."""
    query = request.query
    if "after" not in query:
        return None
    after_text = query["after"]
    after = None if after_text == "now" else _number(after_text, "after")
    timeout_s = _number(query["timeout"], "timeout") if "timeout" in query else LONG_POLL_DEFAULT_S
    if timeout_s < 0:
        raise _BadQuery("timeout must not be negative")
    return _LongPoll(after, min(timeout_s, LONG_POLL_MAX_S))


def _number(text: str, name: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise _BadQuery(f"{name} must be a number of seconds, not {text!r}") from None
    if not math.isfinite(value):
        raise _BadQuery(f"{name} must be finite")
    return value


def _page(
    daemon: DaemonView, point: CommitPointView, after: float | None, passed: bool | None
) -> dict[str, Any]:
    page: dict[str, Any] = {
        "pid": os.getpid(),
        "version": __version__,
        "since": int(daemon.started_at),
        "now": int(point.now),
        "commit_point": round(point.commit_point, 6),
        "commit_point_ms": int(point.commit_point * 1000),
        "lag_s": round(point.lag_s, 6),
        "open_messages": point.open_messages,
    }
    if after is not None:
        page["after"] = after
        page["passed"] = passed
        page["shutting_down"] = daemon.commit_point.shutting_down
    return page


async def _read(view: DaemonView, request: web.Request) -> dict[str, Any]:
    """The commit point, after waiting for it to pass ``after`` if the query asks."""
    long_poll = _long_poll_of(request)
    commit_point = view.commit_point
    if long_poll is None:
        return _page(view, commit_point.current(), None, None)
    target = long_poll.after
    if target is None:
        # Echo a moment no earlier than the one waited for (rounded up to the next
        # millisecond), so that a client repeating the request waits for at least as much.
        target = math.ceil(commit_point.wall_now() * 1000 + 1) / 1000
    timeout_s = long_poll.timeout_s
    if long_poll.after is None:
        # "now" is a moment just ahead, which only a sweep (every epoch) can pass: an idle
        # daemon asked with timeout=0 must still say it passed (``pydory wait --timeout 0``).
        timeout_s = max(timeout_s, NOW_GRACE_S)
    passed = await commit_point.wait_past(target, timeout_s)
    return _page(view, commit_point.current(), target, passed)


def _plain(page: dict[str, Any]) -> str:
    lines = [
        f"pid: {page['pid']}",
        f"version: {page['version']}",
        f"since: {page['since']} {time.ctime(page['since'])}",
        f"now: {page['now']} {time.ctime(page['now'])}",
        f"commit point (milliseconds since epoch): {page['commit_point_ms']} "
        f"{time.ctime(page['commit_point_ms'] // 1000)}",
        f"lag (seconds): {page['lag_s']:.3f}",
        f"open messages: {page['open_messages']}",
    ]
    if "after" in page:
        lines.append(f"after (seconds since epoch): {page['after']:.3f}")
        lines.append(f"passed: {'yes' if page['passed'] else 'no'}")
        if page["shutting_down"]:
            lines.append("shutting down: yes")
    return "".join(line + "\n" for line in lines)


def commit_point_routes(view: DaemonView) -> list[web.RouteDef]:
    """``GET /commit_point/json`` and ``/commit_point/plain`` for the status server.

    With ``?after=<epoch seconds | now>[&timeout=<s>]`` the request long-polls until the
    commit point passes ``after`` (default timeout LONG_POLL_DEFAULT_S, at most
    LONG_POLL_MAX_S) and says whether it did (``passed``).
    """

    async def as_json(request: web.Request) -> web.StreamResponse:
        return web.json_response(await _read(view, request), dumps=_dumps)

    async def as_plain(request: web.Request) -> web.StreamResponse:
        text = _plain(await _read(view, request))
        return web.Response(text=text, content_type="text/plain", charset="utf-8")

    return [
        web.get("/commit_point/plain", as_plain),
        web.get("/commit_point/json", as_json),
    ]


def _dumps(document: Any) -> str:
    return json.dumps(document, indent=4) + "\n"
