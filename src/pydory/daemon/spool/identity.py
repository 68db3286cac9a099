"""Message identity: a durable name for every message the daemon reads, carried to Kafka
as the record header ``pydory-id``, so that a landing job can drop the second copies a
crash's replay sends (issue 24).

An identity is ``(host id, incarnation, stream, sequence)``, rendered in the header as
ASCII ``<host>/<incarnation: 16 hex digits>/<stream>/<sequence>``, e.g.
``3f0c...e1/9b2d4c0e7a1f3355/4/81234`` (the header's name and this text form are the
contract with the lake and the audits: :mod:`pydory.message_identity`):

- ``host``: ``<messageIdentity><hostId>`` in the config, else ``/etc/machine-id``, else
  an id generated once and kept in the spool directory (``host-id``); with neither a
  machine id nor a spool, one generated per run (logged).
- ``incarnation``: 64 random bits drawn at each start (one daemon run), so no two runs,
  nor two spool directories on one host, can ever give out the same name.
- ``stream`` and ``sequence``: with the spool, where the write-ahead first put the
  message: the stream of its segment (a number the run gives a segment each time it
  starts numbering frames from 0, written in the segment's header) and its frame number.
  A replay resends a message under that same identity (kept in the replayed frame,
  ``records.FLAG_ORIGIN``), however many crashes it goes through. Without the spool, or
  for a burst the spool refused (``spool_unprotected``), stream 0 and a counter of the
  run: never replayed, so never resent by a replay. A resend after a failed attempt
  (librdkafka's own retries, or the daemon's: its delivery callback keeps the headers,
  ``delivery/producer.py``) carries the same identity too.

The header is on by default; ``<messageIdentity enable="false">`` sends no header (for
consumers that cannot take record headers); identities are still given and spooled.

Rule: the only code that knows how a daemon forms an identity and gives it out
(:class:`MessageIds`; pydory.hotpath's ``identity_headers``, compiled where built, only
appends the sequence to the prefix made here, in :mod:`pydory.message_identity`'s form).
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import struct
from collections.abc import Iterator, Sequence
from typing import overload

from pydory.hotpath import identity_headers
from pydory.message_identity import HEADER_NAME, HOST_ID_PATTERN, run_prefix

log = logging.getLogger(__name__)

HOST_ID_FILE = "host-id"
"""In the spool directory: the host id generated when the machine has none."""
MACHINE_ID_PATH = "/etc/machine-id"
_ORIGIN = struct.Struct(">QII")  # incarnation, stream, sequence: a replayed frame's key

#: ``produce``'s headers (confluent-kafka's type: a value may be text or None too).
Headers = list[tuple[str, str | bytes | None]]


def identity_in(headers: Headers | None) -> str | None:
    """The identity a message was produced with (its ``pydory-id`` header), if any."""
    for name, value in headers or ():
        if name == HEADER_NAME and value is not None:
            return value if isinstance(value, str) else value.decode("ascii", "replace")
    return None


def new_incarnation() -> int:
    """A run's incarnation: 64 random bits (never 0, which names nothing)."""
    return secrets.randbits(64) or 1


def pack_origin(incarnation: int, stream: int, sequence: int) -> bytes:
    """An identity (without the host) as a replayed frame keeps it."""
    return _ORIGIN.pack(incarnation, stream, sequence)


def unpack_origin(origin: bytes) -> tuple[int, int, int]:
    incarnation, stream, sequence = _ORIGIN.unpack(origin)
    return incarnation, stream, sequence


def resolve_host_id(configured: str | None, spool_directory: str | None) -> str:
    """The host id: configured, else the machine id, else one kept in the spool directory
    (generated there the first time), else one for this run only."""
    if configured:
        return configured
    with contextlib.suppress(OSError, UnicodeDecodeError):
        with open(MACHINE_ID_PATH, encoding="ascii") as file:
            machine_id = file.read().strip()
        if HOST_ID_PATTERN.fullmatch(machine_id):
            return machine_id
    if spool_directory is not None:
        kept = _kept_host_id(spool_directory)
        if kept is not None:
            return kept
    generated = secrets.token_hex(16)
    log.warning(
        "message identity: no hostId configured, no %s and no spool to keep one: this "
        "run's host id is %s (set <messageIdentity><hostId> to keep it across restarts)",
        MACHINE_ID_PATH,
        generated,
    )
    return generated


def _kept_host_id(directory: str) -> str | None:
    path = os.path.join(directory, HOST_ID_FILE)
    with contextlib.suppress(OSError, UnicodeDecodeError):
        with open(path, encoding="ascii") as file:
            kept = file.read().strip()
        if HOST_ID_PATTERN.fullmatch(kept):
            return kept
    generated = secrets.token_hex(16)
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        temporary = f"{path}.tmp"
        with open(temporary, "w", encoding="ascii") as file:
            file.write(generated + "\n")
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except OSError as exc:
        log.warning("message identity: cannot keep a host id in [%s]: %s", path, exc)
        return None
    return generated


class IdentityRun(Sequence["Headers | None"]):
    """The headers of a burst's fresh identities, frames ``first..first+count-1`` of one
    stream, made only when asked for: the compiled producer's burst path formats each in
    C from ``compiled`` (``prefix`` + the sequence in decimal), so a burst it takes whole
    makes no Python object per message (~90 ns each, measured)."""

    __slots__ = ("_count", "_first", "_headers", "_name", "_prefix")

    def __init__(self, name: str, prefix: bytes, first: int, count: int) -> None:
        self._name, self._prefix, self._first, self._count = name, prefix, first, count
        self._headers: list[Headers | None] | None = None

    @property
    def compiled(self) -> tuple[str, bytes, int]:
        """``(name, prefix, first)``: what ``produce_burst`` takes in place of a list."""
        return self._name, self._prefix, self._first

    def headers(self) -> list[Headers | None]:
        """Every message's headers, made once (one call: pydory.hotpath)."""
        if self._headers is None:
            self._headers = identity_headers(self._name, self._prefix, self._first, self._count)
        return self._headers

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, index: int) -> Headers | None: ...
    @overload
    def __getitem__(self, index: slice) -> list[Headers | None]: ...
    def __getitem__(self, index: int | slice) -> Headers | list[Headers | None] | None:
        return self.headers()[index]

    def __iter__(self) -> Iterator[Headers | None]:
        return iter(self.headers())


class MessageIds:
    """Gives out identities, a burst at a time, as ``produce``'s headers (None each when
    the header is off)."""

    def __init__(self, host_id: str, incarnation: int, *, headers: bool = True) -> None:
        if not HOST_ID_PATTERN.fullmatch(host_id):
            raise ValueError(f"host id {host_id!r} is not 1-64 of [A-Za-z0-9._-]")
        self.host_id = host_id
        self.incarnation = incarnation
        self.headers = headers
        self._prefix = run_prefix(host_id, incarnation).encode("ascii")
        self.unspooled_given = 0  # stream 0's sequence: messages given no spool frame
        self._stream_prefix = (-1, b"")  # the last stream's prefix, made once per stream

    def render(self, incarnation: int, stream: int, sequence: int) -> bytes:
        """The header value of an identity of this host."""
        return b"%s%d/%d" % (run_prefix(self.host_id, incarnation).encode(), stream, sequence)

    def spooled(self, stream: int, first: int, count: int) -> list[Headers | None]:
        """The messages of frames ``first..first+count-1`` of ``stream`` of this run."""
        return list(self.spooled_run(stream, first, count))

    def spooled_run(self, stream: int, first: int, count: int) -> Sequence[Headers | None]:
        """:meth:`spooled` as an :class:`IdentityRun` (its headers made when asked for)."""
        if not self.headers:
            return [None] * count
        known, prefix = self._stream_prefix
        if known != stream:
            prefix = self._prefix + b"%d/" % stream
            self._stream_prefix = (stream, prefix)
        return IdentityRun(HEADER_NAME, prefix, first, count)

    def unspooled(self, count: int) -> list[Headers | None]:
        """Messages that no spool frame holds: stream 0 of this run."""
        return list(self.unspooled_run(count))

    def unspooled_run(self, count: int) -> Sequence[Headers | None]:
        """:meth:`unspooled` as an :class:`IdentityRun`."""
        first = self.unspooled_given
        self.unspooled_given += count
        return self.spooled_run(0, first, count)

    def replayed(
        self, origins: Sequence[bytes | None], fresh: Sequence[Headers | None]
    ) -> Sequence[Headers | None]:
        """A replayed burst: each message under the identity it was first given, those
        without one (an older spool, a damaged header) under ``fresh``'s."""
        if not self.headers:
            return fresh
        render, name = self.render, HEADER_NAME
        return [
            fresh[index] if origin is None else [(name, render(*unpack_origin(origin)))]
            for index, origin in enumerate(origins)
        ]
