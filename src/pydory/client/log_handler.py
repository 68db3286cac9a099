"""A ``logging.Handler`` that ships log records to a Kafka topic through pydory.

Logging must not lose most of a burst, and must not stall the application for long
either. A daemon that is running takes records as fast as it reads its socket, but its
receive queue is short (``net.unix.max_dgram_qlen``, 10 on many hosts), so a burst of
records fills it in microseconds: the handler then waits for room, up to ``block_s`` per
record (1 s by default). A daemon that is not running (socket missing or refusing) is
not waited for, and a record too large for a datagram cannot be sent: both are dropped
at once, counted in ``dropped``. If a record waited its whole ``block_s`` in vain (the
daemon is stuck), the records after it do not wait, and are dropped whenever the queue
is full, until one gets through again: a stuck daemon costs the application one
``block_s``, not one per record.
"""

from __future__ import annotations

import errno
import json
import logging
import socket
import struct
from datetime import UTC, datetime

from pydory import wire

#: How long one record may wait for room in the daemon's receive queue, by default.
DEFAULT_BLOCK_S = 1.0


class PydoryLogHandler(logging.Handler):
    """Send each log record as one AnyPartition message to ``topic``.

    The value is the formatted record in UTF-8 (use :class:`JsonLogFormatter` for JSON);
    the message timestamp is the record's creation time. Datagrams are addressed by
    path on every record, so after a daemon restart the next record gets through.

    ``block_s``: how long a record may wait while the daemon's receive queue is full
    (0: never wait). ``dropped`` counts the records the daemon did not receive: socket
    missing or refusing, queue still full after the wait, record larger than a datagram
    may be. A record that cannot be formatted is a bug in the application's logging
    set-up, and goes through logging's standard ``handleError``. ``BadTopic``
    (pydory.errors) at construction if Kafka would refuse ``topic``.
    """

    def __init__(
        self,
        path: str,
        topic: str,
        *,
        key: bytes = b"",
        level: int = logging.NOTSET,
        block_s: float = DEFAULT_BLOCK_S,
    ) -> None:
        super().__init__(level)
        wire.validate_topic(topic.encode("utf-8"))  # a bad topic fails here, not per record
        if block_s < 0:
            raise ValueError(f"block_s must be 0 or more, not {block_s}")
        self.path = path
        self.topic = topic
        self.key = key
        self.block_s = block_s
        self.dropped = 0
        self._waiting = block_s > 0  # False after a wait in vain, until a record gets through
        self._socket: socket.socket | None = None

    def emit(self, record: logging.LogRecord) -> None:
        """Send ``record``; count it as dropped if the daemon cannot take it in time."""
        try:
            message = wire.encode_any_partition(
                self.topic,
                self.format(record).encode("utf-8"),
                self.key,
                timestamp_ms=int(record.created * 1000),
            )
        except Exception:  # noqa: BLE001 - logging's contract: report, never raise
            self.handleError(record)
            return
        flags = 0 if self._waiting else socket.MSG_DONTWAIT
        try:
            self._datagram_socket().sendto(message, flags, self.path)
        except OSError as error:
            # Expected whenever the daemon is down, stuck or the record is too big:
            # the application must carry on regardless.
            self.dropped += 1
            if error.errno in (errno.EAGAIN, errno.EWOULDBLOCK):
                self._waiting = False  # the queue stayed full: do not wait again for now
            return
        self._waiting = self.block_s > 0

    def _datagram_socket(self) -> socket.socket:
        if self._socket is None:
            self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            # A blocking socket whose sends give up after block_s: the kernel itself waits
            # until the daemon's queue has room (poll cannot see an unconnected peer's queue).
            # (Zero would mean "forever": block_s 0 never gets here without MSG_DONTWAIT.)
            seconds, micro = divmod(max(1, round(self.block_s * 1_000_000)), 1_000_000)
            self._socket.setsockopt(
                socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", seconds, micro)
            )
        return self._socket

    def close(self) -> None:
        """Release the socket; records emitted afterwards would open a new one."""
        self.acquire()
        try:
            if self._socket is not None:
                self._socket.close()
                self._socket = None
        finally:
            self.release()
        super().close()


class JsonLogFormatter(logging.Formatter):
    """Formats a record as one JSON object: time, level, logger, message, pid, exception.

    ``time`` is ISO 8601 in UTC with milliseconds; ``exception`` appears only when the
    record carries exception information.
    """

    def format(self, record: logging.LogRecord) -> str:
        fields: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "pid": record.process,
        }
        if record.exc_info:
            fields["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            fields["stack"] = self.formatStack(record.stack_info)
        return json.dumps(fields, ensure_ascii=False)
