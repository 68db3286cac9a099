"""The commit point's input marks: what every input socket held at one instant, and
whether the daemon has read it all since.

A mark is taken with one poll(2) over every input socket, and FIONREAD on the connections
holding bytes (pydory.daemon.books.commit_point explains why it needs them). Each input
notes its own part (``mark_unread``: the datagram queue, a connection's bytes, a backlog of
clients waiting); the notes are the classes here, and they read the inputs through the
small protocols below, so that this module imports no input and every input may import it.
Rule: when what a socket held at the mark counts as read is decided here alone
(:func:`mark_inputs` takes the marks, each :class:`InputMark` says when it is reached).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import Protocol

from pydory.daemon.inputs.sockets import readable_fds


class Pending(Protocol):
    """One input's part of a mark, not read yet."""

    def reached(self) -> bool: ...


class MarkedInput(Protocol):
    """An input as a mark sees it (pydory.daemon.inputs.datagram, .stream)."""

    def watched_fds(self) -> list[int]: ...

    def mark_unread(self, readable: set[int]) -> list[Pending]: ...


class MarkedDatagramInput(Protocol):
    """What a datagram mark reads of its input (pydory.daemon.inputs.datagram)."""

    @property
    def closed(self) -> bool: ...

    @property
    def datagrams_read(self) -> int: ...

    @property
    def times_drained(self) -> int: ...

    @property
    def queue_limit(self) -> int | None: ...


class MarkedConnection(Protocol):
    """What a connection mark reads of its connection (pydory.daemon.inputs.stream_connection)."""

    @property
    def fd(self) -> int: ...

    @property
    def bytes_read(self) -> int: ...

    @property
    def lost(self) -> bool: ...

    def unread(self) -> int:
        """Bytes sent and not handed to the intake yet (the kernel's, and what a reader
        thread holds for it)."""
        ...


class MarkedListener(Protocol):
    """What a backlog mark reads of its listener (pydory.daemon.inputs.stream)."""

    @property
    def listening_fds(self) -> list[int]: ...

    def connections(self) -> Iterable[MarkedConnection]: ...


class InputMark:
    """What the input sockets held at one instant; :meth:`reached` once the daemon has read
    all of it, whatever arrived since. pydory.daemon.books.commit_point builds on this."""

    def __init__(self, pending: list[Pending]) -> None:
        self._pending = pending

    def reached(self) -> bool:
        """Whether everything the sockets held when the mark was taken has been read."""
        self._pending = [item for item in self._pending if not item.reached()]
        return not self._pending


def mark_inputs(datagram: MarkedInput | None, streams: Iterable[MarkedInput]) -> InputMark:
    """Mark what every input socket holds now.

    One poll(2) over the datagram socket, every connection and every listening socket
    finds those holding anything, and only those are noted: how far the datagram queue
    reaches, how many bytes each connection holds (FIONREAD), which listening sockets
    have clients waiting. Connections the loop is accepting right now, whose sockets the
    input does not know yet, are noted too.
    """
    inputs: list[MarkedInput] = [*streams]
    if datagram is not None:
        inputs.append(datagram)
    readable = readable_fds(fd for source in inputs for fd in source.watched_fds())
    return InputMark([item for source in inputs for item in source.mark_unread(readable)])


class DatagramMark:
    """The datagrams queued at the mark: all read once the reader has since found the
    queue empty, or has read as many datagrams as the kernel can queue."""

    __slots__ = ("_datagram", "_drained", "_read_target")

    def __init__(self, datagram: MarkedDatagramInput) -> None:
        self._datagram = datagram
        self._drained = datagram.times_drained
        limit = datagram.queue_limit
        self._read_target = None if limit is None else datagram.datagrams_read + limit

    def reached(self) -> bool:
        datagram = self._datagram
        return (
            datagram.closed
            or datagram.times_drained > self._drained
            or (self._read_target is not None and datagram.datagrams_read >= self._read_target)
        )


class ConnectionMark:
    """The bytes one connection held at the mark: read once the daemon has read that many
    more. For a connection being accepted, counted from when its socket is known."""

    __slots__ = ("_connection", "_target")

    def __init__(self, connection: MarkedConnection, target: int | None) -> None:
        # Weak: a connection whose accept fails is dropped by the loop, and then by us.
        self._connection = weakref.ref(connection)
        self._target = target

    def reached(self) -> bool:
        connection = self._connection()
        if connection is None or connection.lost:
            return True  # gone: whatever it delivered has been handed to the intake
        if connection.fd < 0:
            return False  # accepted, its connection_made still to come
        if self._target is None:
            self._target = connection.bytes_read + connection.unread()
        return connection.bytes_read >= self._target


class BacklogMark:
    """Clients waiting to be accepted at the mark: all read once the listening sockets
    have since been seen with nobody waiting, and every connection known at that moment
    has been read as far as it held bytes then."""

    __slots__ = ("_connections", "_stream")

    def __init__(self, stream: MarkedListener) -> None:
        self._stream = stream
        self._connections: list[ConnectionMark] | None = None

    def reached(self) -> bool:
        if self._connections is None:
            if readable_fds(self._stream.listening_fds):
                return False
            self._connections = [ConnectionMark(c, None) for c in self._stream.connections()]
        self._connections = [c for c in self._connections if not c.reached()]
        return not self._connections
