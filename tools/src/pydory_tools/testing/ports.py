"""Free loopback TCP ports for brokers the tests start."""

from __future__ import annotations

import random
import socket

LOOPBACK = "127.0.0.1"


#: Below the kernel's ephemeral range (``net.ipv4.ip_local_port_range``, 32768 and up by
#: default), where the kernel never puts the local end of an outgoing connection or a
#: ``bind(0)``: a port the kernel picked itself is free only until the next connection of
#: any process on the machine takes it as its local port, and a listener then cannot bind
#: it (seen when two test suites ran side by side).
_PICK_FROM, _PICK_BELOW = 10_000, 32_768
_handed_out: set[int] = set()


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as ranges:
            return int(ranges.read().split()[0])
    except (OSError, ValueError, IndexError):
        return _PICK_BELOW


def free_loopback_port() -> int:
    """Return a TCP port on 127.0.0.1 that nothing listens on right now, below the
    ephemeral range and not handed out before by this process.

    Another process could still take it before the caller binds (a test suite running
    beside this one picks the same way), so callers that start a server should treat a
    bind failure as retryable.
    """
    below = min(_PICK_BELOW, _ephemeral_low())
    for _ in range(1000):
        port = random.randrange(_PICK_FROM, below)
        if port in _handed_out:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind((LOOPBACK, port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise OSError(f"no free loopback port between {_PICK_FROM} and {below}")


def free_loopback_ports(count: int) -> list[int]:
    """``count`` distinct free ports (never the same one twice: see free_loopback_port)."""
    return [free_loopback_port() for _ in range(count)]


def accepts_connections(host: str, port: int, timeout_s: float = 0.2) -> bool:  # not a deadline
    """Whether a TCP connection to ``host:port`` succeeds within ``timeout_s``."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False
