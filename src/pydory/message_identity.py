"""A message's identity as it travels: the contract between the daemon that gives it, the
lake that keeps it and the audits that read it.

Every message a daemon accepts is named ``(host, incarnation, stream, sequence)``
(:mod:`pydory.daemon.spool.identity` says how each part is drawn) and carries the name to
Kafka in the record header ``pydory-id``, as ASCII
``<host>/<incarnation: 16 lowercase hex digits>/<stream>/<sequence>``, e.g.
``3f0c...e1/9b2d4c0e7a1f3355/4/81234``. The landing job keeps it in the lake's
``pydory_id`` column; the audits parse it back. Stdlib only: the daemon, the pipeline and
a consumer of the lake import it without each other.

Rule: the header's name (`HEADER_NAME`) and the identity's text form (`run_prefix`,
`parse_identity`) are spelt here alone.
"""

from __future__ import annotations

import re
from typing import NamedTuple

__all__ = [
    "HEADER_NAME",
    "HOST_ID_PATTERN",
    "INCARNATION_PATTERN",
    "SEPARATOR",
    "Identity",
    "parse_identity",
    "run_prefix",
]

HEADER_NAME = "pydory-id"
"""The Kafka record header that carries a message's identity."""
SEPARATOR = "/"
#: A host id a daemon gives out (config, machine id, or generated).
HOST_ID_PATTERN = re.compile(r"[A-Za-z0-9._-]{1,64}", re.ASCII)
#: An incarnation as rendered: 16 lowercase hex digits (regular-expression text, for Spark
#: too).
INCARNATION_PATTERN = r"^[0-9a-f]{16}$"
_INCARNATION = re.compile(INCARNATION_PATTERN)
_NUMBER = re.compile(r"[0-9]{1,10}", re.ASCII)


class Identity(NamedTuple):
    """One message's identity, parsed."""

    host: str
    incarnation: str  # 16 hex digits, as rendered
    stream: int
    sequence: int


def run_prefix(host: str, incarnation: int) -> str:
    """The identities of one run start with this: ``<host>/<incarnation>/``; append
    ``<stream>/<sequence>``."""
    return f"{host}{SEPARATOR}{incarnation:016x}{SEPARATOR}"


def parse_identity(text: str) -> Identity | None:
    """``text`` as an identity, or None when it is not one (another producer's header)."""
    parts = text.split(SEPARATOR)
    if len(parts) != 4:
        return None
    host, incarnation, stream, sequence = parts
    if not (
        host
        and _INCARNATION.match(incarnation)
        and _NUMBER.fullmatch(stream)
        and _NUMBER.fullmatch(sequence)
    ):
        return None
    return Identity(host, incarnation, int(stream), int(sequence))
