"""The kernel's side of the input sockets: their files, their limits, what they hold unread.

- Socket files: a stale one left by an earlier run is removed; one another process still
  serves, or a file that is not a socket, is refused.
- The kernel's datagram limits: the largest UNIX datagram a client sends without raising
  its SO_SNDBUF, and how many datagrams a socket's queue holds.
- Closing at shutdown: a duplicate of a socket keeps it (and a listening socket's backlog)
  open past the loop; what a stream socket already holds is read without waiting for
  more. UNIX sockets are first shut for reading, so that a client sending after that
  point gets EPIPE instead of losing its message silently.
- What is waiting: one poll(2) over many sockets, FIONREAD on one.

Who is on a socket (for the quotas) is pydory.daemon.inputs.peers's.

- Binding: the three kinds of input socket, made the same way whether the daemon binds
  them as its inputs open or ``pydory serve`` binds them before it imports the daemon
  (``daemon/inputs/handover.py``). Standard library only: the early binding imports this.

Rule: the inputs ask the kernel what a socket holds and what it allows only through here
(``read_buffered``, ``kernel_datagram_limit``), and a socket file is replaced or removed
only here (``prepare_socket_path``, ``remove_socket_file``).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import select
import socket
import stat
import struct
import termios
import time
from collections.abc import Callable, Iterable

from pydory.errors import ConfigError

# No logging imported at the top: ``pydory serve`` binds through here before it loads
# anything it can do without (daemon/inputs/handover.py), and logging costs as much
# start-up time as the rest of the binding.

#: Bytes asked of a stream socket per read while draining it at shutdown.
DRAIN_READ_SIZE = 256 * 1024
#: A UNIX datagram larger than this needs the client to raise SO_SNDBUF (Dory's
#: allowLargeUnixDatagrams); Linux's default net.core.wmem_default is 212992.
DEFAULT_WMEM_FILE = "/proc/sys/net/core/wmem_default"
#: The length of a UNIX datagram socket's receive queue, fixed when the socket is created.
MAX_DGRAM_QLEN_FILE = "/proc/sys/net/unix/max_dgram_qlen"


#: A listening socket's backlog (connections the kernel completes before they are accepted).
LISTEN_BACKLOG = 1024

#: The config elements that name each input's address, for the errors that refuse one.
TCP_PORT_ELEMENT = "/doryConfig/inputSources/tcp/port"
_PATH_ELEMENT: dict[int, str] = {
    socket.SOCK_DGRAM: "/doryConfig/inputSources/unixDatagram/path",
    socket.SOCK_STREAM: "/doryConfig/inputSources/unixStream/path",
}


def prepare_socket_path(path: str, kind: int) -> None:
    """Remove a stale socket file left by an earlier run; refuse to take over a socket that
    another process still serves, or to clobber a file that is not a socket."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    element = _PATH_ELEMENT.get(kind, "")
    if not stat.S_ISSOCK(st.st_mode):
        raise ConfigError(
            f"socket path {path} exists and is not a socket; refusing to replace it",
            path=element,
        )
    if _socket_is_served(path, kind):
        raise ConfigError(
            f"socket {path} is in use by another running process (another pydory? stop it, "
            "or choose another path)",
            path=element,
        )
    os.unlink(path)


def bind_unix_datagram(path: str) -> socket.socket:
    """A UNIX datagram socket bound to ``path`` (the caller prepared the path)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        sock.bind(path)
    except BaseException:
        sock.close()
        raise
    return sock


def listen_unix_stream(path: str) -> socket.socket:
    """A UNIX stream socket listening on ``path`` (the caller prepared the path)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
        sock.listen(LISTEN_BACKLOG)
    except BaseException:
        sock.close()
        raise
    return sock


def listen_tcp(host: str, port: int) -> socket.socket:
    """A TCP socket listening on ``host`` (a loopback address) and ``port``, as asyncio's
    ``create_server`` sets one up (SO_REUSEADDR; IPV6_V6ONLY)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind((host, port))
        sock.listen(LISTEN_BACKLOG)
    except BaseException:
        sock.close()
        raise
    return sock


def tcp_port_refused(host: str, port: int, error: OSError) -> ConfigError:
    """The one line that says the TCP input cannot listen on ``port`` (in use, or not
    allowed): the config element, the address and the system's reason."""
    reason = os.strerror(error.errno) if error.errno else str(error)
    return ConfigError(
        f"cannot listen for TCP clients on {host} port {port}: {reason} (is another pydory "
        "or Dory running? choose a free port)",
        path=TCP_PORT_ELEMENT,
    )


def _socket_is_served(path: str, kind: int) -> bool:
    """Whether something still listens on the UNIX socket at ``path`` (a stale file refuses)."""
    with socket.socket(socket.AF_UNIX, kind) as probe:
        try:
            probe.connect(path)
        except ConnectionRefusedError:
            return False
        except OSError as exc:
            # A live socket of the other type answers EPROTOTYPE: served, just not by us.
            return exc.errno == errno.EPROTOTYPE
        return True


def remove_socket_file(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def datagram_queue_limit() -> int | None:
    """The most datagrams the kernel queues for a UNIX datagram socket created now: one
    more than net.unix.max_dgram_qlen. None if unknown."""
    try:
        with open(MAX_DGRAM_QLEN_FILE) as f:
            return int(f.read().strip()) + 1
    except (OSError, ValueError):
        return None


def kernel_datagram_limit() -> int:
    """The largest UNIX datagram a client can send without raising its SO_SNDBUF."""
    try:
        with open(DEFAULT_WMEM_FILE) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return 212_992


def dup_socket(fd: int) -> socket.socket:
    """A non-blocking socket object on a duplicate of ``fd``: closing it leaves ``fd`` open
    (and the socket alive for as long as either is open)."""
    sock = socket.socket(fileno=os.dup(fd))
    sock.setblocking(False)
    return sock


def read_buffered(sock: socket.socket, feed: Callable[[bytes], bool], deadline: float) -> None:
    """Hand ``feed`` the bytes a stream socket holds now, without waiting for more.

    The socket is shut for reading first: a UNIX peer's next send fails (EPIPE), so nothing
    more arrives. A TCP peer can go on sending, so only the bytes queued at the start are
    read. Stops early at ``deadline`` or when ``feed`` returns False (the stream broke).
    """
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RD)
    remaining = unread_bytes_on(sock.fileno())
    while remaining > 0 and time.monotonic() < deadline:
        try:
            data = sock.recv(min(remaining, DRAIN_READ_SIZE))
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:  # e.g. the peer reset the connection
            import logging

            logging.getLogger(__name__).debug("reading a connection at shutdown: %s", exc)
            return
        if not data:
            return
        remaining -= len(data)
        if not feed(data):
            return


def unread_bytes_on(fd: int) -> int:
    """Bytes in a stream socket's receive queue (FIONREAD); 0 if the socket is gone."""
    try:
        result: int = struct.unpack("@i", fcntl.ioctl(fd, termios.FIONREAD, b"\0" * 4))[0]
    except OSError:
        return 0
    return result


def readable_fds(fds: Iterable[int]) -> set[int]:
    """Which of ``fds`` hold something to read (or to accept) now: one poll(2), no wait."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    return {fd for fd, _ in poller.poll(0)}
