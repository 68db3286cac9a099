"""``/msg_debug/...``: Dory's message debugging switches, on the status server.

Dory's URLs, HTTP GET as Dory accepts them, answering Dory's plain-text lines::

    GET /msg_debug/add_topic/NAME    Enabled debug topic [NAME]   (or Failed to enable ...,
                                     also for a name Kafka would refuse as a topic)
    GET /msg_debug/del_topic/NAME    Disabled debug topic [NAME]  (or Failed to disable ...)
    GET /msg_debug/add_all_topics    All message debug topics enabled
    GET /msg_debug/del_all_topics    All message debug topics disabled
    GET /msg_debug/get_topics        topic: [NAME] per line, or All/No message debug topics ...
    GET /msg_debug/truncate_files    Message debug files truncated

What tracing does and where it writes is :mod:`pydory.daemon.books.msg_debug`; this module reads
and switches it only through the view's :class:`~pydory.status.view.MsgDebugControl`. When
``<msgDebug>`` is off, every ``/msg_debug/`` URL answers 404 saying how to turn it on.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from aiohttp import web

from pydory.wire import MAX_TOPIC_LENGTH, topic_name_problem

if TYPE_CHECKING:
    from pydory.status.view import DaemonView, MsgDebugControl

__all__ = ["DISABLED_TEXT", "msg_debug_routes"]

#: The answer of every ``/msg_debug/`` URL while ``<msgDebug>`` is off.
DISABLED_TEXT = (
    "message debugging is off in this daemon's config: enable it with "
    '<msgDebug enable="true"><path value="/a/directory"/></msgDebug> and restart\n'
)


def _plain(text: str, status: int = 200) -> web.Response:
    return web.Response(status=status, text=text, content_type="text/plain", charset="utf-8")


def _get_topics(control: MsgDebugControl, request: web.Request) -> str:
    return control.selection.describe()


def _add_all_topics(control: MsgDebugControl, request: web.Request) -> str:
    control.add_all_topics()
    return "All message debug topics enabled\n"


def _del_all_topics(control: MsgDebugControl, request: web.Request) -> str:
    control.del_all_topics()
    return "All message debug topics disabled\n"


def _truncate_files(control: MsgDebugControl, request: web.Request) -> str:
    control.truncate_files()
    return "Message debug files truncated\n"


def _echo(topic: str) -> str:
    """The name as the answer repeats it: a legal name as it is, as Dory does; a refused one
    escaped (no NUL or control character reaches a terminal) and cut to Kafka's length."""
    if topic_name_problem(topic) is None:
        return topic
    escaped = topic.encode("unicode_escape").decode("ascii")
    if len(escaped) > MAX_TOPIC_LENGTH:
        return escaped[:MAX_TOPIC_LENGTH] + "..."
    return escaped


def _add_topic(control: MsgDebugControl, request: web.Request) -> str:
    # Refused (Dory's "Failed to enable") when Kafka would refuse the name: the selection
    # applies Kafka's topic-name rules.
    topic = request.match_info["topic"]
    if control.add_topic(topic):
        return f"Enabled debug topic [{topic}]\n"
    return f"Failed to enable debug topic [{_echo(topic)}]\n"


def _del_topic(control: MsgDebugControl, request: web.Request) -> str:
    topic = request.match_info["topic"]
    if control.del_topic(topic):
        return f"Disabled debug topic [{topic}]\n"
    return f"Failed to disable debug topic [{_echo(topic)}]\n"


_Action = Callable[["MsgDebugControl", web.Request], str]

#: URL -> what it does; ``{topic}`` is the rest of the path (Dory takes everything after
#: the prefix as the name).
_ROUTES: tuple[tuple[str, _Action], ...] = (
    ("/msg_debug/get_topics", _get_topics),
    ("/msg_debug/add_all_topics", _add_all_topics),
    ("/msg_debug/del_all_topics", _del_all_topics),
    ("/msg_debug/truncate_files", _truncate_files),
    ("/msg_debug/add_topic/{topic:.*}", _add_topic),
    ("/msg_debug/del_topic/{topic:.*}", _del_topic),
)


def msg_debug_routes(view: DaemonView) -> list[web.RouteDef]:
    """The six GET routes of ``view``'s message debugging (404 with advice when off)."""
    control = view.msg_debug

    def handler(action: _Action) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def handle(request: web.Request) -> web.StreamResponse:
            if control is None:
                return _plain(DISABLED_TEXT, status=404)
            return _plain(action(control, request))

        return handle

    return [web.get(path, handler(action)) for path, action in _ROUTES]
