"""Which implementation of the hot path's codec runs: the compiled one (``pydory._cwire``,
built from ``_cwire.c`` by the package's build, hatch_build.py) when it is there, else
pure Python (pydory.wire, the reference: same rules, same results, same errors).

``PYDORY_PURE_PYTHON=1`` in the environment forces pure Python (read once, at import: set
it before the daemon starts); docs/operations.md says when to. What runs is
``IMPLEMENTATION``: ``"compiled"`` or ``"pure"``, and ``WHY`` says why.

What differs by implementation, each a drop-in for the other:

- ``StreamFramer(max_message_size, prefix_size)``: wire.StreamFramer's rule, with
  ``drain()`` (every whole frame held, in one call) and ``error``;
- ``parse_burst(frames)``: ``wire.parse_any_partition`` of each frame, in order (the
  compiled one: a ``_cwire.ParsedBurst`` made in one call, reading ``bytes`` only,
  anything else parsed as None, which ``decode`` then judges; its items are made when
  asked, and the compiled producer reads its fields without them; the pure one: lazily,
  a frame at a time); ``WHOLE_PARSES``, the types of a parse made whole at once (the
  burst path takes only those: an iterator would be consumed);
- ``DatagramReader(fd, max_size, credentials).read(limit)``: up to 64 datagrams per system
  call (recvmmsg), and ``read_runs(limit)``: the same with their runs of one sender (each
  datagram's SCM_CREDENTIALS, cut in C); or None: inputs/datagram.py reads one per
  ``recvmsg_into``, its sender's uid with it, and cuts the runs itself;
- ``DatagramDrain(fd, max_size, burst_datagrams)``: a thread of its own that empties the
  datagram socket into bursts for the loop, or None (whether the daemon uses it is
  daemon/inputs/datagram_drain.py's choice);
- ``StreamDrain()``: a thread of its own that does the UNIX stream connections' reads, or
  None (whether the daemon uses it is daemon/inputs/stream_drain.py's choice);
- ``identity_headers(name, prefix, first, count)``: a burst's ``produce()`` headers,
  ``[[(name, prefix + b"%d" % s)] for s in range(first, first + count)]`` (what the
  prefix holds is daemon/spool/identity.py's business, not this one's).
- ``payload_frames(payloads, first_sequence, head, head_crc, marker)``: the spool's frames
  of a burst (daemon/spool/records.py's ``encode_payloads_reference``, the same bytes), or
  None: records.py then encodes them in Python;
- ``write_payload_frames(fd, payloads, first_sequence, head, head_crc, marker, limit)``:
  the same frames written to ``fd`` in one call (no bytes object of them; above ``limit``
  bytes none, and ``-size`` returned), or None: daemon/spool/segments.py then encodes
  (``payload_frames``) and writes with ``os.write``.
- ``trim_heap()``: glibc's ``malloc_trim(0)`` (daemon/heap_trim.py says when), True if
  pages were given back; the pure one calls it through ctypes, imported at its first call
  (ctypes costs an idle daemon memory of its own), False where the C library has none.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Final

from pydory import wire

if TYPE_CHECKING:
    from pydory import _cwire

__all__ = [
    "IMPLEMENTATION",
    "WHOLE_PARSES",
    "WHY",
    "DatagramDrain",
    "DatagramReader",
    "StreamDrain",
    "StreamFramer",
    "identity_headers",
    "parse_burst",
    "payload_frames",
    "trim_heap",
    "write_payload_frames",
]

#: The environment variable that forces pure Python.
PURE_PYTHON_VARIABLE: Final = "PYDORY_PURE_PYTHON"

Fields = tuple[str, bytes, bytes, int]
#: A burst's headers as the caller keeps them (identity.Headers, or None, per message).
HeaderLists = list[list[tuple[str, str | bytes | None]] | None]


def _pure_parse_burst(frames: Sequence[bytes]) -> Iterable[Fields | None]:
    # Lazily, one frame at a time as the intake reaches it: exactly the reference's order
    # of work (a topic decode finds legal mid-burst parses on the short path after it).
    return map(wire.parse_any_partition, frames)


def _compiled_parse_burst(
    parse_with_cache: Callable[[Sequence[bytes], dict[bytes, str]], Iterable[Fields | None]],
) -> Callable[[Sequence[bytes]], Iterable[Fields | None]]:
    cache = wire._topic_by_bytes  # the same dict the pure code reads and fills (never rebound)

    def parse_burst(frames: Sequence[bytes]) -> Iterable[Fields | None]:
        return parse_with_cache(frames, cache)

    return parse_burst


def _pure_identity_headers(name: str, prefix: bytes, first: int, count: int) -> HeaderLists:
    return [[(name, prefix + b"%d" % sequence)] for sequence in range(first, first + count)]


def _pure_trim_heap() -> bool:
    import ctypes  # here: an idle daemon on the compiled path never loads it

    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    return bool(trim(0)) if trim is not None else False


StreamFramer: type[wire.StreamFramer] | type[_cwire.StreamFramer]
#: recvmmsg(2) for the datagram input, or None (inputs/datagram.py then reads one
#: datagram per recvmsg_into, the reference).
DatagramReader: type[_cwire.DatagramReader] | None
#: The datagram socket's drain thread (compiled only), or None.
DatagramDrain: type[_cwire.DatagramDrain] | None
#: The UNIX stream connections' reader thread (compiled only), or None.
StreamDrain: type[_cwire.StreamDrain] | None
parse_burst: Callable[[Sequence[bytes]], Iterable[Fields | None]]
#: The parses made whole at once (a list: tests and the reference's lists; a ParsedBurst).
WHOLE_PARSES: tuple[type, ...] = (list,)
identity_headers: Callable[[str, bytes, int, int], HeaderLists]
payload_frames: Callable[[Sequence[bytes], int, bytes, int, bytes], bytes] | None
write_payload_frames: Callable[[int, Sequence[bytes], int, bytes, int, bytes, int], int] | None
trim_heap: Callable[[], bool]

if os.environ.get(PURE_PYTHON_VARIABLE, "") not in ("", "0"):
    IMPLEMENTATION, WHY = "pure", f"{PURE_PYTHON_VARIABLE} is set"
    StreamFramer, parse_burst = wire.StreamFramer, _pure_parse_burst
    DatagramReader, identity_headers, payload_frames = None, _pure_identity_headers, None
    DatagramDrain = StreamDrain = write_payload_frames = None
    trim_heap = _pure_trim_heap
else:
    try:
        from pydory import _cwire
    except ImportError as error:
        IMPLEMENTATION, WHY = "pure", f"the C extension is not built here ({error})"
        StreamFramer, parse_burst = wire.StreamFramer, _pure_parse_burst
        DatagramReader, identity_headers, payload_frames = None, _pure_identity_headers, None
        DatagramDrain = StreamDrain = write_payload_frames = None
        trim_heap = _pure_trim_heap
    else:
        IMPLEMENTATION, WHY = "compiled", "pydory._cwire"
        StreamFramer = _cwire.StreamFramer
        DatagramReader = _cwire.DatagramReader
        DatagramDrain = _cwire.DatagramDrain
        StreamDrain = _cwire.StreamDrain
        parse_burst = _compiled_parse_burst(_cwire.parse_burst)
        WHOLE_PARSES = (list, _cwire.ParsedBurst)
        identity_headers = _cwire.identity_headers
        # Absent when the zlib this Python uses is not a shared library to share.
        payload_frames = getattr(_cwire, "encode_payload_frames", None)
        write_payload_frames = getattr(_cwire, "write_payload_frames", None)
        trim_heap = _cwire.trim_heap
