"""The instructions of a stream read's share work: ``StreamInputProtocol.get_buffer``, and
``get_buffer`` + ``buffer_updated`` of a read that leaves a partial frame (charged to its
client's share), N calls each: run under callgrind at N = 0 and N = 200000; (difference)
/ N. Not a test.

    for n in 0 200000; do valgrind --tool=callgrind --callgrind-out-file=/tmp/r-$n \\
        .venv/bin/python benchmarks/instructions_read.py src $n get_buffer; done

Variants: ``room`` (the body ``get_buffer`` had in issue 33: ``FrameReader.room`` asked
per read), ``get_buffer`` (the tree's own method), ``plain`` (aa48e33's body: the buffer
alone, one call like the others), ``read`` (the tree's ``get_buffer`` and
``buffer_updated`` of 18,000 bytes of 101-byte frames: every read completes the frame
the previous one left and leaves a partial one; a stand-in intake takes the frames), and
``copy`` (``read``'s copy into the read buffer alone, to subtract from it). Run against
another tree (``git archive REV src``, the same C extensions copied in) to compare.

Issue 30: room 5,255, plain 866 instructions per call: the lookup added ~4,400 per read.
"""

import sys

source, count, variant = sys.argv[1], int(sys.argv[2]), sys.argv[3]
sys.path.insert(0, source)

from pydory.daemon.books.counters import Counters  # noqa: E402
from pydory.daemon.books.events import Transport  # noqa: E402
from pydory.daemon.books.pool import MemoryPool  # noqa: E402
from pydory.daemon.inputs.stream_connection import (  # noqa: E402
    Connections,
    StreamInputProtocol,
)
from pydory.daemon.inputs.turns import READ_BYTES  # noqa: E402


class Intake:
    """Takes the frames and forgets them."""

    def frames(self, frames: object, kind: object, client: object) -> None:
        pass


pool = MemoryPool(128 << 20)
connections = Connections(Transport.UNIX_STREAM, None, Counters(), lambda: 0.0, pool)  # type: ignore[arg-type]
protocol = StreamInputProtocol(Transport.UNIX_STREAM, 1 << 20, Intake(), connections)  # type: ignore[arg-type]
protocol._client_key = ("uid", 0)  # as a UNIX peer's
buffer = connections.read_buffer
reader = protocol._reader

FRAME, READ = 101, 18_000
frame = FRAME.to_bytes(4, "big") + bytes(FRAME - 4)
stream = frame * READ  # FRAME reads of READ bytes: the offsets' whole cycle
chunks = [stream[i : i + READ] for i in range(0, len(stream), READ)]
protocol.get_buffer(-1)  # the first read asks who the client is


def room() -> memoryview:
    """get_buffer's body in issue 33."""
    space = reader.room()
    if space >= READ_BYTES:
        return buffer
    return buffer[: max(1, space)]


def plain() -> memoryview:
    """get_buffer's body at aa48e33."""
    return buffer


def get_buffer() -> memoryview:
    return protocol.get_buffer(-1)


def read(i: int) -> None:
    protocol.get_buffer(-1)
    chunk = chunks[i % FRAME]
    buffer[:READ] = chunk
    protocol.buffer_updated(READ)


def copy(i: int) -> None:
    chunk = chunks[i % FRAME]
    buffer[:READ] = chunk


if variant in ("read", "copy"):
    step = read if variant == "read" else copy
    for i in range(count):
        step(i)
else:
    call = {"room": room, "plain": plain, "get_buffer": get_buffer}[variant]
    for _ in range(count):
        call()
assert not protocol._reader.broken
