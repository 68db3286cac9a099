"""The instructions of a stream read's share lookup (``StreamInputProtocol.get_buffer``'s
body since issue 33) against aa48e33's body (the buffer alone), N calls each: run under
callgrind at N = 0 and N = 200000; (difference) / N. Not a test.

    for n in 0 200000; do valgrind --tool=callgrind --callgrind-out-file=/tmp/r-$n \
        .venv/bin/python benchmarks/instructions_read.py src $n room; done   # or: plain

Issue 30: room 5,255, plain 866 instructions per call: the lookup adds ~4,400 per read.
"""

import sys

source, count, variant = sys.argv[1], int(sys.argv[2]), sys.argv[3]
sys.path.insert(0, source)

from pydory.daemon.books.events import Transport  # noqa: E402
from pydory.daemon.books.pool import MemoryPool  # noqa: E402
from pydory.daemon.inputs.stream_connection import FrameReader  # noqa: E402
from pydory.daemon.inputs.turns import READ_BYTES  # noqa: E402

reader = FrameReader(
    Transport.UNIX_STREAM, 1 << 20, None, MemoryPool(128 << 20), lambda: ("uid", 0)
)
buffer = memoryview(bytearray(READ_BYTES))


def room() -> memoryview:
    """get_buffer's body now."""
    space = reader.room()
    if space >= READ_BYTES:
        return buffer
    return buffer[: max(1, space)]


def plain() -> memoryview:
    """get_buffer's body at aa48e33."""
    return buffer


call = room if variant == "room" else plain
for _ in range(count):
    call()
