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


def free_loopback_ports(count: int) -> list[int]:
    """``count`` distinct free ports: the probes stay bound until all are picked (one at
    a time, the kernel may hand the same port out twice)."""
    probes = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for probe in probes:
            probe.bind((LOOPBACK, 0))
        return [probe.getsockname()[1] for probe in probes]
    finally:
        for probe in probes:
            probe.close()


def accepts_connections(host: str, port: int, timeout_s: float = 0.2) -> bool:
    """Whether a TCP connection to ``host:port`` succeeds within ``timeout_s``."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False
