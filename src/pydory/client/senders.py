"""Senders: write encoded messages to the daemon over one of its three transports.

The daemon never answers on a client socket, so a sender only writes; it never reads.
Operating-system errors that a caller can act on become :mod:`pydory.errors` classes
whose message names the socket and what to check:

- ``DaemonUnavailable``: the socket is missing, refuses, is not a socket of the right
  type, is not accessible, or the daemon closed the connection.
- ``MessageTooLarge``: the message does not fit the wire format or one datagram.

Any other ``OSError`` is a surprise and propagates unchanged.
"""

from __future__ import annotations

import errno
import os
import socket
import stat
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from types import TracebackType
from typing import NoReturn, Self

from pydory.client.messages import encode_message
from pydory.errors import DaemonUnavailable, MessageTooLarge

# Without it, writing to a connection the daemon closed raises SIGPIPE, whose default
# action kills the process (Python ignores SIGPIPE, but an embedding program may not).
_SEND_FLAGS = getattr(socket, "MSG_NOSIGNAL", 0)

# sun_path holds 108 bytes on Linux, including the terminating NUL.
_MAX_UNIX_PATH_BYTES = 107

_WHAT_WENT_WRONG = {
    errno.ENOENT: "does not exist",
    errno.ENOTDIR: "does not exist",
    errno.ECONNREFUSED: "refused the connection (nothing is listening on it)",
    errno.ENOTSOCK: "is not a socket",
    errno.EPROTOTYPE: "is a socket of the other type (datagram vs stream)",
    errno.EACCES: "is not accessible to this user (check the socket's mode)",
    errno.EPERM: "is not accessible to this user (check the socket's mode)",
    errno.EPIPE: "was closed by the daemon (did it stop or restart?)",
    errno.ECONNRESET: "was closed by the daemon (did it stop or restart?)",
}


@dataclass(frozen=True)
class _Endpoint:
    """Where a sender writes, described for error messages."""

    label: str  # e.g. "UNIX datagram socket /run/pydory/dgram.sock"
    config_element: str  # the daemon config element that enables this input
    unix_path: str | None = None

    def raise_unavailable(self, error: OSError) -> NoReturn:
        """Raise the DaemonUnavailable that explains ``error``, or ``error`` itself."""
        what = _WHAT_WENT_WRONG.get(error.errno or 0)
        if what is None:
            raise error
        if error.errno == errno.ECONNREFUSED and self._path_is_not_a_socket():
            what = "is not a socket"
        raise DaemonUnavailable(
            f"{self.label} {what}: is pydory running? "
            f"is {self.config_element} enabled in its config, at this address?"
        ) from error

    def _path_is_not_a_socket(self) -> bool:
        # Linux answers ECONNREFUSED for a regular file too; say which case it is.
        if self.unix_path is None:
            return False
        try:
            return not stat.S_ISSOCK(os.stat(self.unix_path).st_mode)
        except OSError:
            return False


def check_unix_path(path: str) -> None:
    """Raise ValueError unless ``path`` can be a UNIX socket address."""
    if not path:
        raise ValueError("the socket path must not be empty")
    if len(os.fsencode(path)) > _MAX_UNIX_PATH_BYTES:
        raise ValueError(
            f"the socket path {path!r} is longer than the {_MAX_UNIX_PATH_BYTES} bytes "
            "a UNIX socket address can hold"
        )


class _Sender(ABC):
    """What every sender offers: ``send``, ``send_many``, ``close`` and ``with``."""

    def send(
        self,
        topic: str,
        value: bytes,
        key: bytes = b"",
        partition_key: int | None = None,
        timestamp_ms: int | None = None,
    ) -> None:
        """Send one message; see :func:`pydory.client.encode_message` for the arguments.

        Raises ``DaemonUnavailable`` or ``MessageTooLarge`` (and ``ValueError`` for an
        empty topic). Returning means the kernel took the bytes, not that Kafka has them.
        """
        self.send_many((encode_message(topic, value, key, partition_key, timestamp_ms),))

    @abstractmethod
    def send_many(self, encoded: Iterable[bytes]) -> None:
        """Send messages already built with :func:`pydory.client.encode_message`."""

    @abstractmethod
    def close(self) -> None:
        """Release the socket. Closing twice is harmless."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


class DatagramSender(_Sender):
    """Sends each message as one UNIX datagram: Dory's preferred transport.

    A datagram is addressed by path on every send, so a restarted daemon is reached
    without reconnecting. Sends block only when the daemon's receive queue is full
    (``net.unix.max_dgram_qlen``), which a healthy daemon does not let happen.
    A datagram cannot be larger than the socket's send buffer allows: pass ``sndbuf``
    (bounded by ``net.core.wmem_max``) for big messages, or use a stream sender.
    """

    def __init__(self, path: str, *, sndbuf: int | None = None) -> None:
        check_unix_path(path)
        self.path = path
        self._endpoint = _Endpoint(
            f"UNIX datagram socket {path}", "inputSources/unixDatagram", unix_path=path
        )
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        if sndbuf is not None:
            self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)

    def send_many(self, encoded: Iterable[bytes]) -> None:
        """Send each pre-encoded message as its own datagram, in order."""
        if self._socket.fileno() == -1:
            raise ValueError(f"send on a closed sender ({self._endpoint.label})")
        for message in encoded:
            self._send_datagram(message)

    def _send_datagram(self, message: bytes) -> None:
        try:
            self._socket.sendto(message, self.path)
        except OSError as error:
            if error.errno == errno.EMSGSIZE:
                raise self._too_large(len(message)) from error
            self._endpoint.raise_unavailable(error)

    def _too_large(self, size: int) -> MessageTooLarge:
        sndbuf = self._socket.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
        return MessageTooLarge(
            f"a {size}-byte message does not fit in one datagram on this socket "
            f"(SO_SNDBUF is {sndbuf} bytes): pass a larger sndbuf (up to "
            "net.core.wmem_max) and enable allowLargeUnixDatagrams in pydory's config, "
            "or send it over a stream socket"
        )

    def close(self) -> None:
        self._socket.close()


class _StreamSender(_Sender):
    """A stream connection opened on first use and kept; messages travel back to back.

    When the daemon restarts, the kept connection is dead: the next write fails with
    EPIPE or ECONNRESET before any byte is taken, and is retried once on a fresh
    connection. A write that fails part-way is not retried, because the daemon may
    already hold some of its messages and a resend could duplicate them.
    """

    def __init__(self, endpoint: _Endpoint) -> None:
        self._endpoint = endpoint
        self._socket: socket.socket | None = None
        self._closed = False

    @abstractmethod
    def _open_socket(self) -> socket.socket:
        """Connect to the daemon; OSError on failure."""

    def send_many(self, encoded: Iterable[bytes]) -> None:
        """Write all the pre-encoded messages in one write on the kept connection."""
        data = b"".join(encoded)
        if data:
            self._write(memoryview(data), may_reconnect=True)

    def _write(self, data: memoryview, *, may_reconnect: bool) -> None:
        reusing_connection = self._socket is not None
        connection = self._connection()
        written = 0
        try:
            while written < len(data):
                written += connection.send(data[written:], _SEND_FLAGS)
        except (BrokenPipeError, ConnectionResetError) as error:
            self._disconnect()
            if may_reconnect and reusing_connection and written == 0:
                self._write(data, may_reconnect=False)
                return
            self._endpoint.raise_unavailable(error)

    def _connection(self) -> socket.socket:
        if self._closed:
            raise ValueError(f"send on a closed sender ({self._endpoint.label})")
        if self._socket is None:
            try:
                self._socket = self._open_socket()
            except OSError as error:
                self._endpoint.raise_unavailable(error)
        return self._socket

    def _disconnect(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None

    def close(self) -> None:
        self._disconnect()
        self._closed = True


class UnixStreamSender(_StreamSender):
    """Sends over a UNIX stream socket: no size limit but the daemon's maxStreamMsgSize.

    Connects on the first send. A write blocks while the daemon applies backpressure.
    """

    def __init__(self, path: str) -> None:
        check_unix_path(path)
        self.path = path
        super().__init__(
            _Endpoint(f"UNIX stream socket {path}", "inputSources/unixStream", unix_path=path)
        )

    def _open_socket(self) -> socket.socket:
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            connection.connect(self.path)
        except OSError:
            connection.close()
            raise
        return connection


class TcpSender(_StreamSender):
    """Sends over TCP to the daemon's loopback port, for clients that cannot use UNIX sockets.

    Connects on the first send. A write blocks while the daemon applies backpressure.
    """

    def __init__(self, port: int, host: str = "127.0.0.1") -> None:
        self.host = host
        self.port = port
        super().__init__(_Endpoint(f"TCP port {host}:{port}", "inputSources/tcp"))

    def _open_socket(self) -> socket.socket:
        connection = socket.create_connection((self.host, self.port))
        # Each send is one complete write: waiting to coalesce (Nagle) only adds latency.
        connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return connection
