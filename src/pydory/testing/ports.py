"""Free loopback TCP ports for brokers the tests start."""

from __future__ import annotations

import socket

LOOPBACK = "127.0.0.1"


def free_loopback_port() -> int:
    """Return a TCP port on 127.0.0.1 that nothing listens on right now.

    The kernel picks it; another process could take it before the caller binds,
    so callers that start a server should treat a bind failure as retryable.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((LOOPBACK, 0))
        port: int = probe.getsockname()[1]
        return port


def accepts_connections(host: str, port: int, timeout_s: float = 0.2) -> bool:
    """Whether a TCP connection to ``host:port`` succeeds within ``timeout_s``."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False
