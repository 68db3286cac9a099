"""The exception hierarchy: each class says who is at fault and what the caller does.

- ClientProtocolError: a client sent bytes we cannot accept. Count it, report it,
  drop that message (or, for an oversized stream frame, that connection); never crash.
- ConfigError: the configuration is invalid. Refuse to start, naming where and why.
- ClientError: raised by the client library into the sending application.
"""

from __future__ import annotations


class PydoryError(Exception):
    """Base of every exception pydory raises on purpose."""


# --- client protocol errors (wire format): count and drop ---------------------------------


class ClientProtocolError(PydoryError):
    """Bytes from a client that do not form an acceptable message.

    ``reason`` is the discard reason used in counters and reports; ``prefix`` holds
    the first bytes of the offending message for the discard report.
    """

    reason = "malformed"

    def __init__(self, detail: str, prefix: bytes = b"") -> None:
        super().__init__(detail)
        self.detail = detail
        self.prefix = bytes(prefix)


class MalformedMessage(ClientProtocolError):
    """A size field disagrees with Size, flags are non-zero, or the frame is cut short."""

    reason = "malformed"


class UnsupportedApiKey(ClientProtocolError):
    """ApiKey is neither AnyPartition (256) nor PartitionKey (257)."""

    reason = "unsupported_api_key"

    def __init__(self, detail: str, prefix: bytes = b"", api_key: int = -1) -> None:
        super().__init__(detail, prefix)
        self.api_key = api_key


class UnsupportedApiVersion(ClientProtocolError):
    """ApiVersion is not one this daemon speaks for the given ApiKey."""

    reason = "unsupported_version"

    def __init__(
        self, detail: str, prefix: bytes = b"", api_key: int = -1, api_version: int = -1
    ) -> None:
        super().__init__(detail, prefix)
        self.api_key = api_key
        self.api_version = api_version


class BadTopic(ClientProtocolError):
    """The topic is empty, too long, or has characters Kafka does not allow."""

    reason = "bad_topic"

    def __init__(self, detail: str, prefix: bytes = b"", topic: bytes = b"") -> None:
        super().__init__(detail, prefix)
        self.topic = bytes(topic)


class OversizedFrame(ClientProtocolError):
    """A stream frame announces a Size above maxStreamMsgSize: close the connection."""

    reason = "oversized_frame"

    def __init__(self, detail: str, prefix: bytes = b"", size: int = 0) -> None:
        super().__init__(detail, prefix)
        self.size = size


# --- configuration errors: refuse to start --------------------------------------------------


class ConfigError(PydoryError):
    """An invalid configuration. The daemon must not start with it.

    ``path`` is the element path (e.g. ``/doryConfig/batching/namedConfigs/config``),
    ``line`` and ``column`` locate it in the file when known.
    """

    def __init__(
        self, reason: str, path: str = "", line: int | None = None, column: int | None = None
    ) -> None:
        self.reason = reason
        self.path = path
        self.line = line
        self.column = column
        super().__init__(self._render())

    def _render(self) -> str:
        where = []
        if self.line is not None:
            where.append(f"line {self.line}")
            if self.column is not None:
                where.append(f"column {self.column}")
        location = f"({', '.join(where)}) " if where else ""
        element = f"{self.path}: " if self.path else ""
        return f"Error in config file: {location}{element}{self.reason}"


#: How many config errors (or warnings) are shown; the rest are counted in one last line,
#: so a file with a million mistakes gives a readable message, not a million lines.
MAX_REPORTED_ERRORS = 100


class ConfigErrors(ConfigError):
    """Several config errors found in one pass; each is in ``errors``, the first
    :data:`MAX_REPORTED_ERRORS` are in the message, then how many more there are."""

    def __init__(self, errors: list[ConfigError], unlisted: int = 0) -> None:
        """``unlisted``: further errors that were counted but not kept (see ``total``)."""
        self.errors = list(errors)
        self.total = len(self.errors) + unlisted
        first = self.errors[0]
        super().__init__(first.reason, first.path, first.line, first.column)

    def _render(self) -> str:
        lines = [str(e) for e in self.errors[:MAX_REPORTED_ERRORS]]
        if self.total > len(lines):
            lines.append(f"... and {self.total - len(lines)} more errors")
        return "\n".join(lines)


# --- client library errors: raised into the sending application ---------------------------


class ClientError(PydoryError):
    """The client library could not hand a message to the daemon."""


class MessageTooLarge(ClientError):
    """The encoded message is larger than the chosen transport can carry."""


class DaemonUnavailable(ClientError):
    """The daemon's socket is missing, refuses connections, or went away."""
