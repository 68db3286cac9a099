"""The pydory client library: how a Python application hands messages to the daemon.

- ``DatagramSender``, ``UnixStreamSender``, ``TcpSender``: one per transport the daemon
  listens on (``inputSources`` in its config). Each has ``send`` and ``send_many``.
- ``encode_message``: the bytes one ``send`` writes, for batching with ``send_many``.
- ``PydoryLogHandler``: a ``logging.Handler`` that waits briefly (bounded) for a running
  daemon's room and never raises.

Errors come from :mod:`pydory.errors`: ``DaemonUnavailable`` and ``MessageTooLarge``,
both subclasses of ``ClientError``. See docs/client.md.

Modules: ``senders`` (the three senders), ``messages`` (``encode_message``),
``log_handler`` (``PydoryLogHandler``).
"""

from __future__ import annotations

from pydory.client.log_handler import JsonLogFormatter, PydoryLogHandler
from pydory.client.messages import encode_message
from pydory.client.senders import DatagramSender, TcpSender, UnixStreamSender

__all__ = [
    "DatagramSender",
    "JsonLogFormatter",
    "PydoryLogHandler",
    "TcpSender",
    "UnixStreamSender",
    "encode_message",
]
