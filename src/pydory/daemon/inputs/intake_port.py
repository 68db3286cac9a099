"""What an input hands its bytes to: the ``Intake`` protocol, admission's side of the inputs.

Every transport (pydory.daemon.inputs.datagram, .stream, .stream_connection) calls these
methods and nothing else of admission; pydory.daemon.admission.intake implements them, and
the tests' fakes (tests/helpers.py) stand in for it. Rule: the inputs reach admission only
through this protocol, :class:`Intake`: no module under ``inputs/`` imports ``admission/``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from pydory.daemon.books.events import Transport
from pydory.errors import ClientProtocolError


class Intake(Protocol):
    """What the input agents hand their bytes to (implemented by pydory.daemon.admission.intake)."""

    def datagrams(self, burst: Sequence[bytes], client: object = None) -> None:
        """``client``: the key of the senders' share of the pool (books/shares.py)."""

    def datagram_too_large(self, size: int, prefix: bytes) -> None: ...

    def over_quota(self, burst: Sequence[bytes]) -> None: ...

    def frames(self, burst: Sequence[bytes], transport: Transport, client: object = None) -> None:
        """``client``: the key of the connection's client's share (books/shares.py)."""

    def broken_stream(self, error: ClientProtocolError, transport: Transport) -> None: ...

    def unclean_disconnect(self, prefix: bytes, transport: Transport) -> None: ...

    def connection_opened(self, transport: Transport) -> None: ...

    def connection_closed(
        self, transport: Transport, error: BaseException | None = None
    ) -> None: ...
