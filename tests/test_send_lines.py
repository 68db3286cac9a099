"""`pydory send --lines`: how standard input is cut into messages, for any input and any
way the reads split it (the subprocess tests in test_send_command.py use a real pipe)."""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import given
from hypothesis import strategies as st

from pydory.commands.lines import Line, LongLine, line_batches

# Few distinct bytes, so that "\n" and "\r\n" come up often.
TEXT = st.binary(max_size=300).map(lambda b: bytes(b"ab\r\n"[x % 4] for x in b))


def reader(data: bytes, cuts: list[int]) -> Callable[[int], bytes]:
    """``read(n)`` returning ``data`` in pieces cut at ``cuts`` (and never more than n)."""
    pieces = []
    start = 0
    for cut in sorted({c % (len(data) + 1) for c in cuts}):
        pieces.append(data[start:cut])
        start = cut
    pieces.append(data[start:])
    queue = [p for p in pieces if p]

    def read(size: int) -> bytes:
        if not queue:
            return b""
        piece = queue.pop(0)
        if len(piece) > size:
            queue.insert(0, piece[size:])
        return piece[:size]

    return read


def expected_lines(data: bytes) -> list[bytes]:
    """Java readLine's lines, "\\n" endings only: the ending and a "\\r" before it dropped."""
    lines = data.split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    return [line.removesuffix(b"\r") for line in lines]


def cut(data: bytes, cuts: list[int], max_line_bytes: int) -> list[Line | LongLine]:
    return [
        line
        for batch in line_batches(reader(data, cuts), max_line_bytes, read_bytes=64)
        for line in batch
    ]


@given(TEXT, st.lists(st.integers(min_value=0), max_size=8))
def test_every_line_is_one_message_however_the_reads_fall(data: bytes, cuts: list[int]) -> None:
    lines = cut(data, cuts, max_line_bytes=1000)

    assert lines == [Line(n, value) for n, value in enumerate(expected_lines(data), start=1)]


@given(TEXT, st.lists(st.integers(min_value=0), max_size=8), st.integers(1, 20))
def test_a_line_over_the_limit_is_named_and_the_others_kept(
    data: bytes, cuts: list[int], max_line_bytes: int
) -> None:
    lines = cut(data, cuts, max_line_bytes)

    expected = expected_lines(data)
    assert [line.number for line in lines] == list(range(1, len(expected) + 1))
    for line, value in zip(lines, expected, strict=True):
        if len(value) > max_line_bytes:
            assert isinstance(line, LongLine)
            assert line.length >= len(value)
        else:
            assert line == Line(line.number, value)


def test_an_empty_input_is_no_message_and_an_empty_line_one_empty_message() -> None:
    assert cut(b"", [], 10) == []
    assert cut(b"\n", [], 10) == [Line(1, b"")]
    assert cut(b"\r\n\n", [], 10) == [Line(1, b""), Line(2, b"")]
