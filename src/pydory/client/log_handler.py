"""A ``logging.Handler`` that ships log records to a Kafka topic through pydory.

Logging must never slow down or break the application it serves, so the handler sends
over a non-blocking UNIX datagram socket and treats every delivery failure (no daemon,
daemon's queue full, record too large) as a dropped record: it counts it in
``dropped`` and moves on, printing nothing.
"""

from __future__ import annotations

import json
import logging
import socket
from datetime import UTC, datetime

from pydory import wire


class PydoryLogHandler(logging.Handler):
    """Send each log record as one AnyPartition message to ``topic``.

    The value is the formatted record in UTF-8 (use :class:`JsonLogFormatter` for JSON);
    the message timestamp is the record's creation time. Datagrams are addressed by
    path on every record, so after a daemon restart the next record gets through.

    ``dropped`` counts the records the daemon did not receive: socket missing or
    refusing, receive queue full, record larger than a datagram may be. A record that
    cannot be formatted is a bug in the application's logging set-up, and goes through
    logging's standard ``handleError``. ``BadTopic`` (pydory.errors) at construction if
    Kafka would refuse ``topic``.
    """

    def __init__(
        self, path: str, topic: str, *, key: bytes = b"", level: int = logging.NOTSET
    ) -> None:
        super().__init__(level)
        wire.validate_topic(topic.encode("utf-8"))  # a bad topic fails here, not per record
        self.path = path
        self.topic = topic
        self.key = key
        self.dropped = 0
        self._socket: socket.socket | None = None

    def emit(self, record: logging.LogRecord) -> None:
        """Send ``record``; count it as dropped if the daemon cannot take it now."""
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
        try:
            self._datagram_socket().sendto(message, self.path)
        except OSError:
            # Expected whenever the daemon is down, busy or the record is too big:
            # the application must carry on regardless.
            self.dropped += 1

    def _datagram_socket(self) -> socket.socket:
        if self._socket is None:
            self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self._socket.setblocking(False)
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
