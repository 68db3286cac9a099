"""Coverage-guided fuzzing of the compiled wire code (pydory._cwire) with atheris.

The invariant, for any bytes a client can send: they parse, or they raise our protocol
error (``pydory.errors.ClientProtocolError``), never anything else and never a crash; and
the compiled code answers exactly as the pure-Python reference (pydory.wire) does. Each
input is one client stream: its first two bytes choose the stream limit, the error prefix
and how the stream is cut into reads; the rest is the stream, then also one datagram.

    ./dev fuzz [RUNS]                  # clang + AddressSanitizer build, 10**6 inputs
    .venv/bin/python fuzz/cwire.py -runs=20000            # the installed extension
    .venv/bin/python fuzz/cwire.py --extension X.so -runs=N [libFuzzer flags] [CORPUS]

``./dev fuzz`` compiles ``_cwire.c`` with clang's ``-fsanitize=address,fuzzer-no-link``
(coverage counters and bounds checks in the C code), preloads atheris's
AddressSanitizer runtime, and runs this file; a failure leaves its input as
``crash-*`` in the current directory, to be run again by passing it as the only argument.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import sys
from types import ModuleType
from typing import Any

import atheris

with atheris.instrument_imports():
    from pydory import wire
    from pydory.errors import ClientProtocolError

#: Stream limits: below, at and above typical frames, and the smallest legal one.
LIMITS = (4, 5, 28, 40, 64, 255, 4096, 1 << 20)


def load_extension(path: str | None) -> ModuleType:
    if path is None:
        from pydory import _cwire

        return _cwire
    loader = importlib.machinery.ExtensionFileLoader("pydory._cwire", path)
    spec = importlib.util.spec_from_file_location("pydory._cwire", path, loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def facts(error: BaseException | None) -> Any:
    return None if error is None else (type(error), str(error), vars(error))


def framed(framer: Any, chunks: list[bytes]) -> tuple[list[bytes], list[Any]]:
    """Every frame and every observation of one framer over ``chunks``."""
    frames: list[bytes] = []
    seen: list[Any] = []
    for chunk in chunks:
        framer.feed(chunk)
        drained = framer.drain()
        frames += drained
        seen.append((drained, facts(framer.error), framer.buffered))
    seen.append(framer.unclean_remainder())
    try:
        seen.append(framer.next_frame())
    except ClientProtocolError as error:
        seen.append(("raised", facts(error)))
    return frames, seen


def judged(frame: bytes) -> Any:
    """The reference's verdict on one message: fields, or the protocol error's facts.
    Anything else it raises is a bug and ends the run."""
    try:
        return wire.decode(frame)
    except ClientProtocolError as error:
        return facts(error)


def one_input(cwire: ModuleType, data: bytes) -> None:
    if len(data) < 2:
        return
    limit, prefix_size = LIMITS[data[0] % len(LIMITS)], data[1]
    stream = data[2:]
    # Cut into 1 to 32 reads of equal length (the last shorter): byte by byte for short
    # streams, a whole stream at once, and every boundary between.
    step = max(1, -(-len(stream) // ((data[0] >> 3) + 1)))
    chunks = [stream[i : i + step] for i in range(0, len(stream), step)]
    frames, pure_seen = framed(wire.StreamFramer(limit, prefix_size), chunks)
    _, c_seen = framed(cwire.StreamFramer(limit, prefix_size), chunks)
    if c_seen != pure_seen:
        raise AssertionError(f"framers differ:\npure     {pure_seen!r}\ncompiled {c_seen!r}")
    burst = [*frames, stream]  # the frames, and the whole stream as one datagram
    for frame in burst:
        judged(frame)  # legal topics enter the cache the parses read
    cache = wire._topic_by_bytes
    pure = [wire.parse_any_partition(frame) for frame in burst]
    compiled = cwire.parse_any_partition_burst(burst, cache)
    if compiled != pure:
        raise AssertionError(f"parses differ:\npure     {pure!r}\ncompiled {compiled!r}")
    parsed = cwire.parse_burst(burst, cache)  # the burst path's form: items made when asked
    if len(parsed) != len(pure) or list(parsed) != pure:
        raise AssertionError(f"ParsedBurst differs:\npure     {pure!r}\ncompiled {list(parsed)!r}")
    for fields, frame in zip(compiled, burst, strict=True):
        if fields is not None:  # whatever the short path takes, decode takes the same way
            message = wire.decode(frame)
            assert fields == (message.topic, message.key, message.value, message.timestamp_ms)


def main() -> None:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--extension", help="a _cwire shared object to load (./dev fuzz's)")
    ours, libfuzzer_args = parser.parse_known_args()
    cwire = load_extension(ours.extension)
    atheris.Setup([sys.argv[0], *libfuzzer_args], lambda data: one_input(cwire, data))
    atheris.Fuzz()


if __name__ == "__main__":
    main()
