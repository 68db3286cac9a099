"""The compiled hot path (pydory._cwire, issue 25) against its pure-Python reference
(pydory.wire): the same bytes, fed whole, byte by byte, in random splits and with trailing
data, give the same frames, the same parses and the same errors. And how it is built and
chosen: with a C compiler the extension is there, PYDORY_PURE_PYTHON=1 refuses it.
"""

from __future__ import annotations

import errno
import itertools
import os
import platform
import shutil
import socket
import subprocess
import sys
import tracemalloc
import zlib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hotpaths import IMPLEMENTATIONS, compiled_module, using
from pydory import hotpath, wire
from pydory.daemon.spool import identity, records
from pydory.errors import ClientProtocolError

ROOT = Path(__file__).parents[1]
cwire = compiled_module()
needs_compiled = pytest.mark.skipif(cwire is None, reason="pydory._cwire is not built here")

topics = st.sampled_from(["t", "orders", "a.b-c_9", "x" * 249]) | st.text(
    "abcXYZ019._-", min_size=1, max_size=12
).filter(lambda name: name not in (".", ".."))


@st.composite
def messages(draw: st.DrawFn) -> bytes:
    """A valid message of either ApiKey, maybe damaged: a byte or a fixed field changed, cut
    short, lengthened, or replaced by garbage."""
    topic, value, key = draw(topics), draw(st.binary(max_size=40)), draw(st.binary(max_size=8))
    timestamp = draw(st.integers(-(2**63), 2**63 - 1))
    if draw(st.booleans()):
        data = wire.encode_any_partition(topic, value, key, timestamp)
    else:
        data = wire.encode_partition_key(topic, value, draw(st.integers(0, 2**32 - 1)), key)
    damage = draw(st.sampled_from(["none", "byte", "field", "cut", "extend", "garbage"]))
    if damage == "field":  # a fixed field (Size, ApiKey, ApiVersion, Flags, TopicSize) at a bound
        at, width = draw(st.sampled_from([(0, 4), (4, 2), (6, 2), (8, 2), (10, 2)]))
        bound = draw(st.sampled_from([0, 1, -1, 255, 256, 257, 2**15 - 1, -(2**15)]))
        field = bound.to_bytes(4, "big", signed=True)[4 - width :]
        data = data[:at] + field + data[at + width :]
    elif damage == "byte":
        at = draw(st.integers(0, len(data) - 1))
        data = data[:at] + bytes([draw(st.integers(0, 255))]) + data[at + 1 :]
    elif damage == "cut":
        data = data[: draw(st.integers(0, len(data)))]
    elif damage == "extend":
        data += draw(st.binary(min_size=1, max_size=8))
    elif damage == "garbage":
        data = draw(st.binary(max_size=64))
    return data


def framed(data: bytes) -> bytes:
    """``data`` as a stream frame whose Size is right even if ``data`` is damaged inside."""
    return len(data).to_bytes(4, "big", signed=True) + data[4:] if len(data) >= 4 else data


def error_facts(error: BaseException | None) -> Any:
    if error is None:
        return None
    return (type(error), str(error), vars(error))


def run_framer(framer: Any, chunks: list[bytes]) -> list[Any]:
    """Everything a reader sees: per chunk, the frames drained and the error, the bytes
    held; at the end, the unclean remainder and what next_frame says."""
    seen: list[Any] = []
    for chunk in chunks:
        framer.feed(chunk)
        seen.append((framer.drain(), error_facts(framer.error), framer.buffered))
    seen.append(framer.unclean_remainder())
    try:
        seen.append(framer.next_frame())
    except ClientProtocolError as error:
        seen.append(("raised", error_facts(error), error is framer.error))
    return seen


def splits(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


@needs_compiled
@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(messages(), max_size=8),
    st.sampled_from(["whole", "byte by byte", "random"]),
    st.lists(st.integers(0, 10_000), max_size=12),
    st.binary(max_size=12),
    st.sampled_from([4, 40, 300, 1 << 20]),
    st.integers(0, 300),
)
def test_the_compiled_framer_sees_what_the_pure_one_sees(
    burst: list[bytes],
    how: str,
    cuts: list[int],
    trailing: bytes,
    max_size: int,
    prefix_size: int,
) -> None:
    # Mostly frames with a right Size (so damage inside reaches the parse), some raw.
    stream = b"".join(framed(m) if i % 3 else m for i, m in enumerate(burst)) + trailing
    if how == "whole":
        chunks = [stream]
    elif how == "byte by byte":
        chunks = [stream[i : i + 1] for i in range(len(stream))]
    else:
        chunks = splits(stream, cuts)
    pure = run_framer(wire.StreamFramer(max_size, prefix_size), chunks)
    compiled = run_framer(cwire.StreamFramer(max_size, prefix_size), chunks)
    assert compiled == pure


@needs_compiled
def test_a_framing_error_after_frames_keeps_the_frames_and_is_sticky() -> None:
    good = wire.encode_any_partition("t", b"v")
    for framer in (wire.StreamFramer(100, 6), cwire.StreamFramer(100, 6)):
        framer.feed(good + good + b"\x00\x00\x10\x00rest")
        assert framer.drain() == [good, good]
        error = framer.error
        assert (type(error).__name__, error.size, error.prefix) == (
            "OversizedFrame",
            4096,
            b"\x00\x00\x10\x00re",
        )
        framer.feed(good)  # dropped: the stream cannot be framed any more
        assert framer.drain() == []
        with pytest.raises(type(error)) as raised:
            framer.next_frame()
        assert raised.value is error


@needs_compiled
@settings(max_examples=400)
@given(st.lists(messages(), max_size=16), st.lists(topics, max_size=4))
def test_the_compiled_burst_parse_gives_the_pure_parses(
    burst: list[bytes], known: list[str]
) -> None:
    cache: dict[bytes, str] = {name.encode(): name for name in known}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(wire, "_topic_by_bytes", cache)
        pure = [wire.parse_any_partition(data) for data in burst]
    assert cwire.parse_any_partition_burst(burst, cache) == pure
    # A topic the cache holds parses to the very str the cache holds (no copy per message).
    for fields in cwire.parse_any_partition_burst(burst, cache):
        if fields is not None:
            assert fields[0] is cache[fields[0].encode()]


@needs_compiled
@settings(max_examples=400)
@given(st.lists(messages(), max_size=16), st.lists(topics, max_size=4))
def test_the_parsed_burst_gives_the_pure_parses_item_by_item(
    burst: list[bytes], known: list[str]
) -> None:
    """parse_burst (the burst path's parse: no object per message until asked) answers
    each item as the pure parse does, by index and by iteration, every time asked."""
    cache: dict[bytes, str] = {name.encode(): name for name in known}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(wire, "_topic_by_bytes", cache)
        pure = [wire.parse_any_partition(data) for data in burst]
    parsed = cwire.parse_burst(burst, cache)
    burst.clear()  # the parse holds its frames: the caller's list may change
    assert len(parsed) == len(pure)
    assert list(parsed) == pure
    assert [parsed[i] for i in range(len(pure))] == pure == list(parsed)
    for i, fields in enumerate(pure):
        assert parsed[i - len(pure)] == fields
        if fields is not None:
            assert parsed[i][0] is cache[fields[0].encode()]
    with pytest.raises(IndexError):
        parsed[len(pure)]


@needs_compiled
def test_the_parsed_burst_refuses_what_the_list_parse_refuses() -> None:
    data = wire.encode_any_partition("agree", b"v", b"k", 5)
    wire.validate_topic(b"agree")
    parsed = cwire.parse_burst([data, bytearray(data), memoryview(data)], wire._topic_by_bytes)
    assert list(parsed) == [("agree", b"k", b"v", 5), None, None]
    with pytest.raises(TypeError):
        cwire.parse_burst(5, {})
    with pytest.raises(TypeError):
        cwire.parse_burst([data], [])
    with pytest.raises(TypeError):
        cwire.parse_burst([data])  # type: ignore[call-arg]


@needs_compiled
def test_the_parsed_burst_survives_a_cache_lookup_that_empties_the_frames() -> None:
    """parse_burst reads the caller's list in place (no copy): a lookup that runs Python
    (a key's ``__eq__``) and empties the list stops the parse there, never a crash; the
    frames parsed before stay held."""
    data = wire.encode_any_partition("t", b"v")
    frames = [data, bytes(data), bytes(data)]

    class EmptiesTheFrames:
        def __hash__(self) -> int:
            return hash(b"t")

        def __eq__(self, other: object) -> bool:
            frames.clear()
            return False

    parsed = cwire.parse_burst(frames, {EmptiesTheFrames(): "t"})
    assert list(parsed) == [None]


@needs_compiled
def test_whatever_the_burst_parse_answers_decode_agrees_with() -> None:
    value, key = b"v" * 100, b"k"
    data = wire.encode_any_partition("agree", value, key, -5)
    wire.validate_topic(b"agree")
    (fields,) = cwire.parse_any_partition_burst([data], wire._topic_by_bytes)
    message = wire.decode(data)
    assert fields == (message.topic, message.key, message.value, message.timestamp_ms)
    # Not bytes, or not a sequence of bytes: None (decode judges) or a TypeError.
    assert cwire.parse_any_partition_burst([bytearray(data), memoryview(data)], {}) == [
        None,
        None,
    ]
    with pytest.raises(TypeError):
        cwire.parse_any_partition_burst(5, {})
    with pytest.raises(TypeError):
        cwire.parse_any_partition_burst([data], [])


def test_the_extension_is_built_wherever_a_c_compiler_is() -> None:
    """./dev setup's editable install compiles it (hatch_build.py); a missing one would
    otherwise only show as a slower daemon."""
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler here: the pure-Python install is the expected one")
    assert cwire is not None, "pydory._cwire is not importable: run ./dev setup"
    if os.environ.get(hotpath.PURE_PYTHON_VARIABLE) in (None, "", "0"):
        assert hotpath.IMPLEMENTATION == "compiled", hotpath.WHY


@pytest.mark.parametrize(("value", "expected"), [("1", "pure"), ("0", None), ("", None)])
def test_pydory_pure_python_forces_the_reference(value: str, expected: str | None) -> None:
    env = {**os.environ, hotpath.PURE_PYTHON_VARIABLE: value}
    result = subprocess.run(
        [sys.executable, "-c", "import pydory.hotpath as h; print(h.IMPLEMENTATION, h.WHY)"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    implementation = result.stdout.split()[0]
    assert implementation == (expected or ("compiled" if cwire is not None else "pure"))


@needs_compiled
def test_a_short_fuzzing_run_finds_nothing(tmp_path: Path) -> None:
    """CI's share of ./dev fuzz (10**6 inputs, clang + AddressSanitizer): 20,000 inputs on
    the installed extension, the harness's invariant checked on each (fuzz/cwire.py)."""
    pytest.importorskip("atheris")
    result = subprocess.run(
        [sys.executable, str(ROOT / "fuzz" / "cwire.py"), "-runs=20000", "-seed=25"],
        cwd=tmp_path,  # a failing input is written to the current directory
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert "Done 20000 runs" in result.stderr


def test_without_the_extension_the_pure_reference_runs() -> None:
    """The import is guarded: an install without pydory._cwire (no compiler at build time)
    runs the same rules in Python."""
    probe = (
        "import sys\n"
        "class NoExtension:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'pydory._cwire':\n"
        "            raise ImportError('not built')\n"
        "sys.meta_path.insert(0, NoExtension())\n"
        "import pydory.hotpath as h, pydory.wire as w\n"
        "assert h.StreamFramer is w.StreamFramer\n"
        "print(h.IMPLEMENTATION, '|', h.WHY)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != hotpath.PURE_PYTHON_VARIABLE}
    result = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "pure | the C extension is not built here (not built)"


def read_reference(sock: socket.socket, limit: int, max_size: int) -> tuple[list[Any], bool]:
    """inputs/datagram.py's recv_into loop, as items: bytes, or (size, prefix)."""
    buffer = bytearray(max_size + 1)
    items: list[Any] = []
    while len(items) < limit:
        try:
            size = sock.recv_into(buffer, len(buffer), socket.MSG_TRUNC)
        except BlockingIOError:
            return items, True
        if size <= max_size:
            items.append(bytes(buffer[:size]))
        else:
            items.append((size, bytes(buffer[: min(size, 64)])))
    return items, False


@needs_compiled
@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(0, 300), max_size=150),
    st.integers(1, 200),
    st.sampled_from([1, 10, 63, 100, 200]),
)
def test_recvmmsg_reads_what_recv_into_reads(sizes: list[int], limit: int, max_size: int) -> None:
    datagrams = [bytes([i % 251]) * size for i, size in enumerate(sizes)]
    results = []
    for read in ("reference", "compiled"):
        receiver, sender = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        with receiver, sender:
            receiver.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
            sender.setblocking(False)
            for data in datagrams:
                sender.send(data)
            receiver.setblocking(False)
            if read == "reference":
                results.append(read_reference(receiver, limit, max_size))
            else:
                items, oversized, drained = cwire.DatagramReader(receiver.fileno(), max_size).read(
                    limit
                )
                assert oversized == any(not isinstance(item, bytes) for item in items)
                results.append((items, drained))
    assert results[0] == results[1]


# --- the identity header (issue 25, step 2) -----------------------------------------------

#: First sequences: any frame number, around the odometer's carries (9 -> 10, 99..9 -> 10..0),
#: and far beyond 64 bits (stream 0's counter is a Python int).
first_sequences = (
    st.integers(0, 2**32)
    | st.tuples(st.integers(1, 40), st.integers(0, 2100)).map(lambda t: max(0, 10 ** t[0] - t[1]))
    | st.integers(2**63 - 2100, 2**64 + 2100)
    | st.integers(0, 10**60)
)


@needs_compiled
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=80), first_sequences, st.integers(0, 2000), st.text(max_size=12))
def test_the_compiled_identity_headers_are_the_pure_ones(
    prefix: bytes, first: int, count: int, name: str
) -> None:
    compiled = cwire.identity_headers(name, prefix, first, count)
    assert compiled == hotpath._pure_identity_headers(name, prefix, first, count)
    # The same kinds of objects, not just equal ones (a tuple equals no list, but bytes
    # would equal a bytes subclass), and the name itself, not a copy.
    assert {(type(h), type(h[0]), type(h[0][1])) for h in compiled} <= {(list, tuple, bytes)}
    assert all(headers[0][0] is name for headers in compiled)


@needs_compiled
@pytest.mark.parametrize(("first", "count"), [(-3, 7), (-(10**30), 3), (5, -2), (0, 0)])
def test_identity_headers_agree_off_the_daemons_range_too(first: int, count: int) -> None:
    compiled = cwire.identity_headers("n", b"p/", first, count)
    assert compiled == hotpath._pure_identity_headers("n", b"p/", first, count)


@needs_compiled
def test_identity_headers_keep_no_reference_and_no_memory() -> None:
    name, prefix = "".join(["pydory-", "id"]), b"host/0000000000000001/4/"  # refs of our own
    held = sys.getrefcount(name), sys.getrefcount(prefix)
    headers = cwire.identity_headers(name, prefix, 9, 100)
    assert sys.getrefcount(name) == held[0] + 100  # one per message's tuple, as in Python
    del headers
    for first in (-50, 2**70):  # the negative path; a number no machine word holds
        cwire.identity_headers(name, prefix, first, 100)
    for bad in (("x", 0, 1), (prefix, 0.5, 1), (prefix, 0, "1")):
        with pytest.raises(TypeError):
            cwire.identity_headers(name, *bad)
    del bad  # it holds prefix
    assert (sys.getrefcount(name), sys.getrefcount(prefix)) == held
    tracemalloc.start()
    try:
        cwire.identity_headers(name, prefix, 0, 64)  # warm any cache first
        before = tracemalloc.get_traced_memory()[0]
        for first in range(0, 64 * 2000, 64):
            cwire.identity_headers(name, prefix, first, 64)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 100_000  # a leaked burst would be ~15 KB a call, 30 MB in all


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_message_ids_render_each_spooled_identity_on_either_path(implementation: str) -> None:
    """The header ``spooled`` gives is the identity ``render`` forms (identity.py's Rule),
    whichever implementation builds the burst."""
    with using(implementation):
        ids = identity.MessageIds("web-7", 0x9B2D4C0E7A1F3355)
        burst = ids.spooled(4, 99_998, 3)
    assert burst == [
        [(identity.HEADER_NAME, ids.render(ids.incarnation, 4, sequence))]
        for sequence in (99_998, 99_999, 100_000)
    ]
    assert burst[2] == [("pydory-id", b"web-7/9b2d4c0e7a1f3355/4/100000")]


# --- the spool's frames of a burst (daemon/spool/records.py) ---------------------------------


@needs_compiled
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.binary(max_size=300), max_size=80),
    st.integers(0, 2**32 - 81),
    st.sampled_from([list, tuple]),
)
def test_the_compiled_spool_frames_are_the_pure_ones(
    payloads: list[bytes], first: int, kind: type
) -> None:
    if getattr(cwire, "encode_payload_frames", None) is None:
        pytest.skip("zlib is not a shared library here: the spool encodes in Python")
    compiled = records.encode_payloads(kind(payloads), first)
    assert compiled == records.encode_payloads_reference(payloads, first)
    assert hotpath.payload_frames is not None or os.environ.get(hotpath.PURE_PYTHON_VARIABLE)


@needs_compiled
@settings(max_examples=500, deadline=None)
@given(
    st.one_of(st.binary(max_size=63), st.binary(min_size=64, max_size=2000)),
    st.integers(0, 2**32 - 1),
    st.integers(0, 15),
)
def test_the_spool_crc32_is_zlibs(data: bytes, crc: int, offset: int) -> None:
    """The frames' CRC (folded with PCLMULQDQ where the CPU has it, from 64 bytes on) is
    zlib's, at every length and starting value, from any alignment in memory."""
    if getattr(cwire, "crc32", None) is None:
        pytest.skip("zlib is not a shared library here: the spool encodes in Python")
    unaligned = (b"\0" * offset + data)[offset:]
    assert cwire.crc32(unaligned, crc) == zlib.crc32(data, crc)


@needs_compiled
def test_the_spool_crc32_is_folded_where_the_cpu_can() -> None:
    """On x86-64 with PCLMULQDQ (this machine kind) the folded path is the one in use, so
    the test above holds it to zlib's, not zlib to itself."""
    if platform.machine() != "x86_64" or "pclmulqdq" not in Path("/proc/cpuinfo").read_text():
        pytest.skip("no PCLMULQDQ here: zlib's table computes every CRC")
    assert cwire.FOLDS_CRC32 == 1
    block = bytes(range(256)) * 40
    for length in (64, 65, 79, 80, 127, 128, 129, 1000, len(block)):
        assert cwire.crc32(block[:length], 0xFFFFFFFF) == zlib.crc32(block[:length], 0xFFFFFFFF)


@needs_compiled
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.binary(max_size=300), min_size=1, max_size=80),
    st.integers(0, 2**32 - 81),
    st.sampled_from([list, tuple]),
    st.binary(max_size=50),
)
def test_the_compiled_spool_write_writes_the_pure_frames(
    payloads: list[bytes], first: int, kind: type, before: bytes
) -> None:
    """write_payload_frames (the write-ahead's one call: frames and write) puts the pure
    reference's frames after what the file held, and says how many bytes it wrote."""
    write = getattr(cwire, "write_payload_frames", None)
    if write is None:
        pytest.skip("zlib is not a shared library here: the spool encodes in Python")
    reference = records.encode_payloads_reference(payloads, first)
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, before)
        head, crc, marker = records.PAYLOAD_HEAD, records.PAYLOAD_HEAD_CRC, records.SYNC_MARKER
        assert write(write_end, kind(payloads), first, head, crc, marker, len(reference)) == len(
            reference
        )
        os.close(write_end)
        write_end = -1
        written = b""
        while chunk := os.read(read_end, 1 << 16):
            written += chunk
    finally:
        os.close(read_end)
        if write_end >= 0:
            os.close(write_end)
    assert written == before + reference


@needs_compiled
def test_the_compiled_spool_write_refuses_above_its_limit_and_reports_failures(
    tmp_path: Path,
) -> None:
    write = getattr(cwire, "write_payload_frames", None)
    if write is None:
        pytest.skip("zlib is not a shared library here: the spool encodes in Python")
    head, crc, marker = records.PAYLOAD_HEAD, records.PAYLOAD_HEAD_CRC, records.SYNC_MARKER
    payloads = [b"a" * 10, b"b" * 20]
    size = len(records.encode_payloads_reference(payloads, 0))
    path = tmp_path / "segment"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        assert write(fd, payloads, 0, head, crc, marker, size - 1) == -size  # over: none
        assert path.stat().st_size == 0
        assert write(fd, payloads, 7, head, crc, marker, size) == size
        assert path.read_bytes() == records.encode_payloads_reference(payloads, 7)
        with pytest.raises(ValueError, match="sequence"):
            write(fd, payloads, 2**32 - 1, head, crc, marker, size)
        with pytest.raises(TypeError):
            write(fd, ["text"], 0, head, crc, marker, size)
        with pytest.raises(TypeError):
            write(fd, payloads, 0, head, crc, b"xx", size)
    finally:
        os.close(fd)
    with pytest.raises(OSError, match=os.strerror(errno.EBADF)):
        write(fd, payloads, 0, head, crc, marker, size)  # closed
    if Path("/dev/full").exists():
        full = os.open("/dev/full", os.O_WRONLY)
        try:
            with pytest.raises(OSError, match=os.strerror(errno.ENOSPC)):
                write(full, payloads, 0, head, crc, marker, size)
        finally:
            os.close(full)


@needs_compiled
def test_the_compiled_spool_frames_refuse_what_the_format_cannot_hold() -> None:
    frames = getattr(cwire, "encode_payload_frames", None)
    if frames is None:
        pytest.skip("zlib is not a shared library here: the spool encodes in Python")
    head, crc, marker = records._PAYLOAD_HEAD, records._PAYLOAD_HEAD_CRC, records.SYNC_MARKER
    with pytest.raises(ValueError, match="sequence"):
        frames([b"a", b"b"], 2**32 - 1, head, crc, marker)
    with pytest.raises(TypeError):
        frames(["text"], 0, head, crc, marker)
    with pytest.raises(TypeError):
        frames([b"a"], 0, head, crc, b"xx")  # a marker is 4 bytes
    assert frames([], 0, head, crc, marker) == b""
