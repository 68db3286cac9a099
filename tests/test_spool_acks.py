"""Acknowledgement marks and message identity in the spool (issue 24, items 1 and 2).

The mark's format is checked as a parser must be: any bytes parse or raise
``AckMarkCorrupt``, a flipped byte or a cut never marks a frame that was not marked.
Then the write-ahead and recovery together: a crash replays only the frames whose
group had not wholly settled, each under the identity its first send carried, however
many crashes it goes through.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pydory.daemon.books.commit_point import CommitPoint
from pydory.daemon.books.counters import Counters
from pydory.daemon.spool.acks import (
    ACK_HEADER_BYTES,
    AckedFrames,
    AckMarkCorrupt,
    encode_ack_header,
    encode_ack_records,
    parse_ack_mark,
)
from pydory.daemon.spool.identity import HEADER_NAME, MessageIds, unpack_origin
from pydory.daemon.spool.records import HEADER_BYTES
from pydory.daemon.spool.segments import Spool
from pydory.daemon.spool.write_ahead import WriteAhead

MiB = 1024 * 1024
SEGMENT, INCARNATION, STREAM = 7, 0x1234_5678_9ABC_DEF0, 3


def acked_set(acked: AckedFrames) -> set[int]:
    return {n for s, e in zip(acked.starts, acked.ends, strict=True) for n in range(s, e)}


def a_mark(ranges: list[tuple[int, int]]) -> bytes:
    header = encode_ack_header(SEGMENT, INCARNATION, STREAM)
    return header + encode_ack_records(header, ranges)


RANGES = st.lists(st.tuples(st.integers(0, 5000), st.integers(1, 50)), min_size=0, max_size=30)


# --- the format ------------------------------------------------------------------------------


def test_a_mark_round_trips_and_merges_its_ranges() -> None:
    acked = parse_ack_mark(a_mark([(0, 10), (10, 5), (40, 2)]), SEGMENT, INCARNATION, STREAM)
    assert (acked.starts, acked.ends, acked.marked) == ([0, 40], [15, 42], 17)
    assert acked.covers(14)
    assert not acked.covers(15)
    assert acked.covers(41)


@pytest.mark.parametrize(
    ("segment", "incarnation", "stream"),
    [
        (SEGMENT + 1, INCARNATION, STREAM),
        (SEGMENT, INCARNATION + 1, STREAM),
        (SEGMENT, INCARNATION, STREAM + 1),
    ],
)
def test_a_mark_of_another_segment_or_stream_is_refused(
    segment: int, incarnation: int, stream: int
) -> None:
    with pytest.raises(AckMarkCorrupt):
        parse_ack_mark(a_mark([(0, 10)]), segment, incarnation, stream)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
def test_property_any_bytes_parse_or_raise_ack_mark_corrupt(data: bytes) -> None:
    with contextlib.suppress(AckMarkCorrupt):  # anything else fails the test
        parse_ack_mark(data, SEGMENT, INCARNATION, STREAM)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(RANGES, st.data())
def test_property_a_flipped_byte_never_marks_a_frame_that_was_not_marked(
    ranges: list[tuple[int, int]], data: st.DataObject
) -> None:
    mark = a_mark(ranges)
    marked = acked_set(parse_ack_mark(mark, SEGMENT, INCARNATION, STREAM))
    damaged = bytearray(mark)
    offset = data.draw(st.integers(0, len(mark) - 1), label="offset")
    damaged[offset] ^= data.draw(st.integers(1, 255), label="xor")
    try:
        after = parse_ack_mark(bytes(damaged), SEGMENT, INCARNATION, STREAM)
    except AckMarkCorrupt:
        assert offset < ACK_HEADER_BYTES  # only a damaged header voids the whole mark
        return
    assert acked_set(after) <= marked
    assert after.ignored_records == 1  # the damaged record, exactly


@settings(max_examples=100, deadline=None)
@given(RANGES)
def test_property_every_cut_of_a_mark_marks_a_prefix_of_it(ranges: list[tuple[int, int]]) -> None:
    mark = a_mark(ranges)
    before: set[int] = set()
    for cut in range(len(mark) + 1):
        try:
            acked = acked_set(parse_ack_mark(mark[:cut], SEGMENT, INCARNATION, STREAM))
        except AckMarkCorrupt:
            assert cut < ACK_HEADER_BYTES
            continue
        assert before <= acked  # marks only grow as the file does
        before = acked
    assert before == acked_set(AckedFrames.of([(s, s + n) for s, n in ranges]))


# --- the write-ahead marks what settled; recovery replays only the rest ------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def write_ahead(directory: Path) -> tuple[Spool, WriteAhead, Callable[[], None]]:
    """A spool and its write-ahead under a commit point whose generations the test moves
    on (``next_generation``) as 10 ms passing would."""
    clock = Clock()
    commit_point = CommitPoint(clock=clock, schedule=lambda delay, callback: True, epoch_s=0.001)
    spool = Spool(
        str(directory), segment_bytes=64 * MiB, max_bytes=256 * MiB, fsync_interval_ms=None
    )
    spool.open()
    ahead = WriteAhead(commit_point, spool, Counters(), ids=MessageIds("host-a", spool.incarnation))

    def next_generation() -> None:
        clock.now += 1.0
        commit_point.sweep()

    return spool, ahead, next_generation


def crash(spool: Spool) -> None:
    """What a SIGKILL leaves: the files as written, the lock released, nothing closed."""
    assert spool._lock_fd is not None
    os.close(spool._lock_fd)
    spool._lock_fd = None


def identity(headers: object) -> bytes:
    assert isinstance(headers, list)
    ((name, value),) = headers
    assert name == HEADER_NAME
    assert isinstance(value, bytes)
    return value


def send_bursts(
    ahead: WriteAhead, next_generation: Callable[[], None], bursts: int, size: int
) -> tuple[list[list[int]], dict[bytes, bytes]]:
    """Write ahead and accept ``bursts`` bursts, one generation each; return each burst's
    tokens and every message's identity by its payload."""
    tokens, identities = [], {}
    for b in range(bursts):
        burst = [b"m-%03d-%03d" % (b, i) for i in range(size)]
        headers = ahead.begin_burst(burst)
        tokens.append([ahead.open() for _ in burst])
        ahead.end_burst()
        identities.update(zip(burst, map(identity, headers), strict=True))
        next_generation()
    return tokens, identities


def recover_identified(directory: Path) -> tuple[Spool, list[tuple[bytes, bytes | None]]]:
    spool = Spool(
        str(directory), segment_bytes=64 * MiB, max_bytes=256 * MiB, fsync_interval_ms=None
    )
    spool.open()
    return spool, [(record.value, origin) for record, origin in spool.recover_identified()]


def test_a_crash_replays_only_the_groups_not_wholly_settled(tmp_path: Path) -> None:
    spool, ahead, next_generation = write_ahead(tmp_path)
    tokens, identities = send_bursts(ahead, next_generation, bursts=10, size=20)
    for burst in (0, 1, 2, 4, 5, 7, 9):  # wholly delivered
        for token in tokens[burst]:
            ahead.close(token)
    for token in tokens[3][:19]:  # one message of burst 3 still in flight
        ahead.close(token)
    crash(spool)
    again, recovered = recover_identified(tmp_path)
    replayed = [value for value, _ in recovered]
    unsettled = [b"m-%03d-%03d" % (b, i) for b in (3, 6, 8) for i in range(20)]
    assert replayed == unsettled
    assert again.recovery_report.acknowledged == 7 * 20
    assert again.recovery_report.records == 10 * 20
    # Each under the identity its first send carried.
    ids = MessageIds("host-a", 1)
    for value, origin in recovered:
        assert origin is not None
        assert ids.render(*unpack_origin(origin)) == identities[value]


def test_a_replayed_message_keeps_its_first_identity_through_a_second_crash(
    tmp_path: Path,
) -> None:
    spool, ahead, next_generation = write_ahead(tmp_path)
    tokens, identities = send_bursts(ahead, next_generation, bursts=3, size=5)
    for token in tokens[0]:
        ahead.close(token)
    crash(spool)
    # The second run replays bursts 1 and 2 through its own write-ahead, then dies too.
    second, recovered = recover_identified(tmp_path)
    ahead_2 = WriteAhead(
        CommitPoint(schedule=lambda delay, callback: True),
        second,
        Counters(),
        ids=MessageIds("host-a", second.incarnation),
    )
    burst = [value for value, _ in recovered]
    headers = ahead_2.begin_burst(burst, [origin for _, origin in recovered])
    assert [identity(h) for h in headers] == [identities[v] for v in burst]
    tokens_2 = [ahead_2.open() for _ in burst]
    ahead_2.end_burst()
    second.finish_recovery()
    ahead_2.close(tokens_2[0])  # one of them delivered: its group is not whole, no mark
    crash(second)
    third, recovered_again = recover_identified(tmp_path)
    assert [value for value, _ in recovered_again] == burst
    ids = MessageIds("host-a", 1)
    for value, origin in recovered_again:
        assert origin is not None
        assert ids.render(*unpack_origin(origin)) == identities[value]
    crash(third)


def test_a_segment_cut_back_to_its_header_starts_a_new_stream_and_drops_its_mark(
    tmp_path: Path,
) -> None:
    """Frame 0 after the cut is another message than frame 0 before it: its identity
    differs, and the marks of the old frames cannot skip the new ones."""
    spool, ahead, next_generation = write_ahead(tmp_path)
    tokens, first = send_bursts(ahead, next_generation, bursts=2, size=4)
    for token in tokens[0]:
        ahead.close(token)  # marked: burst 1 still holds the segment
    assert spool.acknowledgement_records == 1
    for token in tokens[1]:
        ahead.close(token)  # all settled: cut back to its header, the mark deleted
    assert not list(tmp_path.glob("*.acks"))
    assert os.path.getsize(next(tmp_path.glob("segment-*.spool"))) == HEADER_BYTES
    _, second = send_bursts(ahead, next_generation, bursts=1, size=4)
    assert not set(second.values()) & set(first.values())
    crash(spool)
    _, recovered = recover_identified(tmp_path)
    assert [value for value, _ in recovered] == list(second)


def test_a_damaged_mark_replays_everything_it_marked(tmp_path: Path) -> None:
    spool, ahead, next_generation = write_ahead(tmp_path)
    tokens, _ = send_bursts(ahead, next_generation, bursts=3, size=5)
    for burst in (0, 1):
        for token in tokens[burst]:
            ahead.close(token)
    crash(spool)
    (mark,) = tmp_path.glob("*.acks")
    data = bytearray(mark.read_bytes())
    data[5] ^= 0x01  # the header: the whole mark is void
    mark.write_bytes(bytes(data))
    again, recovered = recover_identified(tmp_path)
    assert len(recovered) == 15
    assert again.recovery_report.acknowledged == 0
    assert any("acks" in problem for problem in again.recovery_report.problems)


def test_an_orphan_mark_is_removed_and_its_segment_id_never_reused(tmp_path: Path) -> None:
    header = encode_ack_header(41, INCARNATION, 1)
    (tmp_path / f"segment-{41:020d}.acks").write_bytes(
        header + encode_ack_records(header, [(0, 5)])
    )
    spool = Spool(str(tmp_path), segment_bytes=MiB, max_bytes=4 * MiB, fsync_interval_ms=None)
    with spool:
        assert spool.append_payloads([b"x"]) == 42
        assert not (tmp_path / f"segment-{41:020d}.acks").exists()
