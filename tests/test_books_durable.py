"""The books that survive the process (issue 24, item 3), without Kafka: the outcome
tallies in the acknowledgement marks (any bytes parse or are refused; a group's frames and
outcomes come back together or not at all), the books file, and a killed run's books
rebuilt from its segments, marks and file. The books topic on Apache Kafka, with a
SIGKILLed daemon: ``test_books_durable_kafka.py``."""

from __future__ import annotations

import json
import os
import tempfile
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pydory.daemon.books.accounting import Books
from pydory.daemon.books.commit_point import CommitPoint
from pydory.daemon.books.counters import Counters
from pydory.daemon.books.durable import REBUILT, SpoolFindings, rebuild_crashed
from pydory.daemon.books.keeper import DurableBooks
from pydory.daemon.spool.acks import (
    AckMarkCorrupt,
    encode_ack_header,
    encode_ack_records,
    parse_ack_mark,
)
from pydory.daemon.spool.identity import MessageIds
from pydory.daemon.spool.segments import Spool
from pydory.daemon.spool.tallies import BadTally, decode_tally, encode_tally
from pydory.daemon.spool.write_ahead import WriteAhead
from pydory.wire import encode_any_partition, encode_partition_key

SEGMENT, INCARNATION, STREAM = 7, 0x1234_5678_9ABC_DEF0, 3
OUTCOME = st.sampled_from(
    ["delivered", "possibly_delivered", "kafka_error", "failed_delivery_attempts"]
)
TALLIES = st.dictionaries(
    st.text(min_size=1, max_size=12),
    st.dictionaries(OUTCOME, st.integers(0, 10**6), min_size=1),
    max_size=4,
)
GROUPS = st.lists(
    st.tuples(
        st.lists(st.tuples(st.integers(0, 5000), st.integers(1, 50)), min_size=1, max_size=3),
        TALLIES,
    ),
    min_size=1,
    max_size=6,
)


# --- the bytes: tallies and the marks that carry them ---------------------------------------


@settings(max_examples=300, deadline=None)
@given(TALLIES)
def test_property_a_tally_round_trips(tally: dict[str, dict[str, int]]) -> None:
    assert decode_tally(encode_tally(tally)) == tally


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200) | st.text(max_size=60).map(str.encode))
def test_property_any_bytes_are_a_tally_or_bad_tally(data: bytes) -> None:
    try:
        tally = decode_tally(data)
    except BadTally:
        return
    assert all(n >= 0 for outcomes in tally.values() for n in outcomes.values())


def a_mark(groups: list[tuple[list[tuple[int, int]], dict[str, dict[str, int]]]]) -> bytes:
    header = encode_ack_header(SEGMENT, INCARNATION, STREAM)
    return header + b"".join(encode_ack_records(header, r, t) for r, t in groups)


def frames(ranges: list[tuple[int, int]]) -> set[int]:
    return {n for first, count in ranges for n in range(first, first + count)}


def summed(tallies: list[dict[str, dict[str, int]]]) -> Counter[tuple[str, str]]:
    total: Counter[tuple[str, str]] = Counter()
    for tally in tallies:
        for topic, outcomes in tally.items():
            for outcome, n in outcomes.items():
                total[(topic, outcome)] += n
    return +total  # zero counts dropped


def acked_set(starts: list[int], ends: list[int]) -> set[int]:
    return {n for s, e in zip(starts, ends, strict=True) for n in range(s, e)}


@settings(max_examples=300, deadline=None)
@given(GROUPS)
def test_property_a_mark_gives_back_every_groups_frames_and_outcomes(
    groups: list[tuple[list[tuple[int, int]], dict[str, dict[str, int]]]],
) -> None:
    acked = parse_ack_mark(a_mark(groups), SEGMENT, INCARNATION, STREAM)
    assert acked_set(acked.starts, acked.ends) == set().union(*(frames(r) for r, _ in groups))
    assert summed([acked.tally]) == summed([t for _, t in groups])
    assert acked.untallied == 0


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(GROUPS, st.data())
def test_property_a_damaged_mark_keeps_whole_groups_or_drops_them(
    groups: list[tuple[list[tuple[int, int]], dict[str, dict[str, int]]]], data: st.DataObject
) -> None:
    """A flipped byte or a cut never separates a group's frames from its outcomes: what
    comes back is the groups before the damage, each whole (when in doubt, replay)."""
    mark = bytearray(a_mark(groups))
    header_bytes = len(encode_ack_header(SEGMENT, INCARNATION, STREAM))
    at = data.draw(st.integers(header_bytes, len(mark) - 1))
    if data.draw(st.booleans()):
        mark[at] ^= 1 << data.draw(st.integers(0, 7))
    else:
        del mark[at:]
    acked = parse_ack_mark(bytes(mark), SEGMENT, INCARNATION, STREAM)
    marked = acked_set(acked.starts, acked.ends)
    whole = [
        count
        for count in range(len(groups) + 1)
        if marked == set().union(*(frames(r) for r, _ in groups[:count]))
        and summed([acked.tally]) == summed([t for _, t in groups[:count]])
    ]
    assert whole, "a group came back in part, or a damaged one counted"


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_property_any_bytes_after_a_good_header_parse_or_raise_ack_mark_corrupt(
    body: bytes,
) -> None:
    mark = encode_ack_header(SEGMENT, INCARNATION, STREAM) + body
    try:
        acked = parse_ack_mark(mark, SEGMENT, INCARNATION, STREAM)
    except AckMarkCorrupt:
        return
    assert all(n >= 0 for outcomes in acked.tally.values() for n in outcomes.values())


# --- a run, killed, and its books rebuilt ----------------------------------------------------


class Run:
    """A daemon's spool, write-ahead and durable books, driven by hand: bursts of client
    messages written ahead and accepted, each message's outcome told as the ledger tells
    it (``settled_as`` then ``close``), then a SIGKILL (``kill``)."""

    def __init__(self, directory: Path, segment_bytes: int = 1 << 20) -> None:
        self.clock = 0.0
        self.commit_point = CommitPoint(
            clock=lambda: self.clock, schedule=lambda delay, callback: True, epoch_s=0.001
        )
        self.spool = Spool(
            str(directory), segment_bytes=segment_bytes, max_bytes=1 << 30, fsync_interval_ms=None
        )
        self.spool.open()
        self.live = Books(0, 64)
        self.books = DurableBooks(self.live, "host-a", self.spool.incarnation, str(directory))
        self.ahead = WriteAhead(
            self.commit_point,
            self.spool,
            Counters(),
            ids=MessageIds("host-a", self.spool.incarnation),
            on_fold=self.books.fold,
        )
        self.books.after_replay({}, {})
        self.sent: Counter[str] = Counter()

    def burst(self, topics: list[str]) -> list[tuple[int, str]]:
        """One burst (one generation): each message's token and topic."""
        burst = [
            encode_any_partition(t, b"v%d" % n) if n % 2 else encode_partition_key(t, b"k", n)
            for n, t in enumerate(topics)
        ]
        self.ahead.begin_burst(burst)
        tokens = [(self.ahead.open(), topic) for topic in topics]
        self.ahead.end_burst()
        self.sent.update(topics)
        self.clock += 1.0
        self.commit_point.sweep()
        return tokens

    def settle(self, token: int, topic: str, outcome: str) -> None:
        self.ahead.settled_as(token, topic, outcome)
        self.ahead.close(token)

    def kill(self) -> None:
        """What a SIGKILL leaves: the files as written, the lock released."""
        assert self.spool._lock_fd is not None
        os.close(self.spool._lock_fd)
        self.spool._lock_fd = None


def next_start(directory: Path, killed: int) -> tuple[dict[str, dict[str, object]], SpoolFindings]:
    """The next start's recovery (every frame read back) and the killed run's rebuilt
    books, per topic."""
    spool = Spool(str(directory), segment_bytes=1 << 20, max_bytes=1 << 30, fsync_interval_ms=None)
    spool.open()
    for _ in spool.recover_identified():
        pass
    report = spool.recovery_report
    findings = SpoolFindings(
        {key: (acked.tally, acked.untallied) for key, acked in report.settled.items()},
        report.handed_over,
    )
    rebuilt = rebuild_crashed(str(directory), findings, current=spool.incarnation, host="host-a")
    spool.close()
    (books,) = [b for b in rebuilt if b.incarnation == killed]
    assert books.final
    assert books.ended == REBUILT
    return books.rebuilt, findings


def test_a_killed_runs_books_are_rebuilt_from_its_marks_folds_and_handed_over_frames(
    tmp_path: Path,
) -> None:
    run = Run(tmp_path, segment_bytes=4096)  # small segments: some are deleted (folded)
    bursts = [run.burst(["a", "b", "a", "a", "b"] * 4) for _ in range(12)]
    truth: Counter[tuple[str, str]] = Counter()
    for index, burst in enumerate(bursts):
        if index in (5, 9):
            continue  # nothing of these settled: handed over whole
        settled = burst[:-3] if index in (3, 10) else burst  # partly settled: handed over
        for number, (token, topic) in enumerate(settled):
            outcome = "delivered"
            if number == 7:
                outcome = "kafka_error"
            elif number == 11:
                outcome = "possibly_delivered"
            run.settle(token, topic, outcome)
            if index not in (3, 10):
                truth[(topic, outcome)] += 1
    assert run.books.run.folded_streams, "no segment was deleted: the folds are not tested"
    assert truth[("a", "kafka_error")]
    assert truth[("b", "possibly_delivered")]
    killed = run.spool.incarnation
    run.kill()
    books, findings = next_start(tmp_path, killed)
    for topic in ("a", "b"):
        counts = books[topic]
        assert counts["delivered"] == truth[(topic, "delivered")]
        assert counts["possibly_delivered"] == truth[(topic, "possibly_delivered")]
        errors = truth[(topic, "kafka_error")]
        assert counts["discarded"] == ({"kafka_error": errors} if errors else {})
        # Bursts 3, 5, 9 and 10: every frame of them replayed by the next start.
        assert counts["handed_over"] == 4 * run.sent[topic] // 12
        assert counts["handed_over"] == findings.handed_over[killed][topic]
        assert counts["accepted"] == run.sent[topic]
        assert counts["accepted"] == (
            counts["delivered"]
            + counts["possibly_delivered"]
            + sum(counts["discarded"].values())  # type: ignore[attr-defined]
            + counts["handed_over"]
        )


def test_a_killed_runs_replays_are_counted_from_its_own_replayed_from_not_its_last_write(
    tmp_path: Path,
) -> None:
    """Killed within its first seconds, a run's last live write came before its replayed
    messages were in the books: the rebuilt ``replayed`` must still count them (the fleet
    audit counts a run's new messages as accepted - replayed)."""
    run = Run(tmp_path)
    run.books.run.replayed_from = {"00000000000000aa": {"a": 2}}
    run.books.write()  # the write right after the replay: topic "a" not in the books yet
    run.burst(["a", "a", "a"])  # the two replayed, written ahead again, and a new one
    killed = run.spool.incarnation
    run.kill()
    books, _ = next_start(tmp_path, killed)
    assert (books["a"]["accepted"], books["a"]["replayed"]) == (3, 2)


def test_a_kill_between_a_fold_and_its_deletion_counts_the_segment_once(tmp_path: Path) -> None:
    run = Run(tmp_path, segment_bytes=4096)
    bursts = [run.burst(["a"] * 20) for _ in range(6)]
    fold = run.books.fold

    class Killed(Exception):
        pass

    def fold_then_die(segment: int, stream: int, tally: dict[str, dict[str, int]]) -> None:
        fold(segment, stream, tally)  # the books file has it ...
        raise Killed  # ... and the process dies before the segment and its mark go

    run.ahead._on_fold = fold_then_die

    def settle_all() -> None:
        for burst in bursts:
            for token, topic in burst:
                run.settle(token, topic, "delivered")

    with pytest.raises(Killed):
        settle_all()
    delivered = sum(1 for burst in bursts for _ in burst) - sum(
        run.spool._segments[s].outstanding for s in run.spool._segments
    )
    killed = run.spool.incarnation
    run.kill()
    books, _ = next_start(tmp_path, killed)
    assert books["a"]["delivered"] == delivered
    assert books["a"]["accepted"] == run.sent["a"] == 120


def test_a_clean_stop_writes_final_books_that_are_not_rebuilt(tmp_path: Path) -> None:
    run = Run(tmp_path)
    for token, topic in run.burst(["a"] * 5):
        run.settle(token, topic, "delivered")
    run.spool.close()
    run.books.run.final, run.books.run.ended = True, "clean"
    assert run.books.file is not None
    run.books.file.write()
    record = json.loads(Path(run.books.file.path).read_text())
    assert (record["final"], record["ended"], record["host"]) == (True, "clean", "host-a")
    assert rebuild_crashed(str(tmp_path), SpoolFindings({}, {}), current=1, host="host-a") == []


def test_the_books_record_names_the_possibly_delivered_and_a_rebuild_keeps_them(
    tmp_path: Path,
) -> None:
    run = Run(tmp_path)
    run.live.accepted("a")
    run.live.possibly_delivered("a", 1, b"v", b"", "_MSG_TIMED_OUT", "host-a/01/1/0")
    run.books.write()
    record = json.loads(Path(run.books.file.path).read_text())  # type: ignore[union-attr]
    assert record["topics"]["a"]["possibly_delivered_ids"] == ["host-a/01/1/0"]
    (rebuilt,) = rebuild_crashed(str(tmp_path), SpoolFindings({}, {}), current=2, host="host-a")
    assert rebuilt.record()["topics"]["a"]["possibly_delivered_ids"] == ["host-a/01/1/0"]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.lists(st.tuples(st.sampled_from("abc"), OUTCOME | st.none()), min_size=1, max_size=30),
        min_size=1,
        max_size=12,
    ),
    st.sampled_from([2048, 8192, 1 << 20]),
)
def test_property_rebuilt_books_balance_and_never_claim_more_than_happened(
    bursts: list[list[tuple[str, str | None]]], segment_bytes: int
) -> None:
    """Whatever settled before the kill: per topic, accepted == every message sent ==
    delivered + possibly delivered + discarded + handed over, each outcome at most what
    really happened, and the handed over exactly what the next start replays."""
    with tempfile.TemporaryDirectory() as directory:
        run = Run(Path(directory), segment_bytes=segment_bytes)
        happened: Counter[tuple[str, str]] = Counter()
        for messages in bursts:
            tokens = run.burst([topic for topic, _ in messages])
            for (token, topic), (_, outcome) in zip(tokens, messages, strict=True):
                if outcome is not None:
                    run.settle(token, topic, outcome)
                    happened[(topic, outcome)] += 1
        killed = run.spool.incarnation
        run.kill()
        books, findings = next_start(Path(directory), killed)
    for topic, sent in run.sent.items():
        counts = books[topic]
        discarded: dict[str, int] = counts["discarded"]  # type: ignore[assignment]
        assert counts["accepted"] == sent
        for outcome in ("delivered", "possibly_delivered"):
            assert counts[outcome] <= happened[(topic, outcome)]
        for reason, n in discarded.items():
            assert n <= happened[(topic, reason)]
        assert counts["handed_over"] == findings.handed_over.get(killed, {}).get(topic, 0)
