"""systemd's readiness protocol (sd_notify), without libsystemd.

Under a unit with ``Type=notify`` systemd passes ``$NOTIFY_SOCKET``: a UNIX datagram
socket, in the abstract namespace when the path starts with ``@``. The daemon sends
``READY=1`` once its inputs and status pages are open and ``STOPPING=1`` when its
shutdown begins (docs/systemd/pydory.service). Without ``$NOTIFY_SOCKET`` (run by
hand, in tests) every call is a no-op. A failed send is logged, never raised: the
daemon's work does not depend on systemd hearing it.

Rule: the daemon speaks to systemd only through :func:`notify`; without NOTIFY_SOCKET it
does nothing.
"""

from __future__ import annotations

import logging
import os
import socket

__all__ = ["notify"]

log = logging.getLogger(__name__)


def notify(state: str) -> bool:
    """Send ``state`` (e.g. ``"READY=1"``) to ``$NOTIFY_SOCKET``; True if it was sent."""
    path = os.environ.get("NOTIFY_SOCKET")
    if not path:
        return False
    address = "\0" + path[1:] if path.startswith("@") else path
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall(state.encode())
    except OSError as exc:
        log.warning("could not tell systemd %r on %s: %s", state, path, exc)
        return False
    return True
