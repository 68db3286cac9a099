"""The fleet audit's arithmetic (pydory.pipeline.audits.fleet_reconcile) and its kept state
(pydory.pipeline.audits.fleet_audit.FleetState), without Spark or Kafka: books records as the
daemons publish them, a lake summarised by identity."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pydory.pipeline.audits.fleet_reconcile import (
    LakeIdentities,
    RunRecord,
    UnreadableBooksRecord,
    reconcile_fleet,
)

pyspark = pytest.importorskip("pyspark")  # fleet_audit imports it (the state lives there)

from pydory.pipeline.audits.fleet_audit import FleetState, StateMismatch  # noqa: E402


def record(
    incarnation: str,
    topics: Mapping[str, Mapping[str, Any]],
    *,
    host: str = "h1",
    ended: str = "clean",
    started_ms: int = 0,
    replayed_from: Mapping[str, Mapping[str, int]] | None = None,
    unprotected: int = 0,
) -> RunRecord:
    return RunRecord.from_json(
        {
            "schema": 1,
            "host": host,
            "incarnation": incarnation,
            "previous_incarnation": None,
            "started_ms": started_ms,
            "updated_ms": started_ms,
            "final": ended != "running",
            "ended": ended,
            "topics": {t: {"accepted": 0, "delivered": 0, **v} for t, v in topics.items()},
            "unprotected": unprotected,
            "untallied": 0,
            "replayed_from": dict(replayed_from or {}),
            "folded": {},
            "folded_streams": [],
        }
    )


def lake(
    landed: Mapping[tuple[str, str, str], tuple[int, int]], found: set[str] | None = None
) -> LakeIdentities:
    return LakeIdentities(landed, {}, {}, lambda identity: identity in (found or set()))


A, B, C = "000000000000000a", "000000000000000b", "000000000000000c"


def test_a_run_that_stopped_cleanly_balances_exactly() -> None:
    books = [record(A, {"t": {"accepted": 10, "delivered": 8, "discarded": {"kafka_error": 2}}})]
    report = reconcile_fleet(books, lake({("h1", A, "t"): (8, 8)}))
    assert report.balanced
    (topic,) = report.hosts[0].topics
    assert (topic.new, topic.landed, topic.exact) == (10, 8, True)
    assert "balanced exactly" in report.render()


def test_a_crash_chain_balances_through_the_messages_handed_over() -> None:
    killed = record(
        A, {"t": {"accepted": 8, "delivered": 5, "handed_over": 3}}, ended="rebuilt_after_crash"
    )
    next_run = record(
        B,
        {"t": {"accepted": 7, "delivered": 7, "replayed": 3}},
        started_ms=1,
        replayed_from={A: {"t": 3}},
    )
    landed = {("h1", A, "t"): (8, 8), ("h1", B, "t"): (4, 4)}
    report = reconcile_fleet([killed, next_run], lake(landed))
    assert report.balanced, report.render()
    assert report.hosts[0].topics[0].outstanding == 0


def test_a_second_copy_in_the_lake_fails_the_audit() -> None:
    books = [record(A, {"t": {"accepted": 3, "delivered": 3}})]
    report = reconcile_fleet(books, lake({("h1", A, "t"): (4, 3)}))
    assert not report.balanced
    assert report.second_copies_in_lake == 1
    assert "1 second copies landed" in report.render()


@pytest.mark.parametrize("landed", [9, 11])
def test_a_message_missing_from_the_lake_or_one_too_many_fails_the_audit(landed: int) -> None:
    books = [record(A, {"t": {"accepted": 10, "delivered": 10}})]
    report = reconcile_fleet(books, lake({("h1", A, "t"): (landed, landed)}))
    assert not report.balanced
    assert f"landed {landed}, the books say 10" in report.render()


def test_each_possibly_delivered_message_is_looked_up_by_identity() -> None:
    ids = [f"h1/{A}/1/{n}" for n in (7, 8)]
    books = [
        record(
            A,
            {
                "t": {
                    "accepted": 5,
                    "delivered": 3,
                    "possibly_delivered": 2,
                    "possibly_delivered_ids": ids,
                }
            },
        )
    ]
    found_one = reconcile_fleet(books, lake({("h1", A, "t"): (4, 4)}, found={ids[0]}))
    assert found_one.balanced
    assert found_one.hosts[0].topics[0].possibly_found == 1
    # The lake lacks the one it says it found: one message is missing.
    assert not reconcile_fleet(books, lake({("h1", A, "t"): (3, 3)}, found={ids[0]})).balanced


def test_unlisted_possibly_delivered_messages_only_bound_the_lake() -> None:
    books = [record(A, {"t": {"accepted": 5, "delivered": 3, "possibly_delivered": 2}})]
    for landed in (3, 4, 5):
        report = reconcile_fleet(books, lake({("h1", A, "t"): (landed, landed)}))
        assert report.balanced
        assert not report.hosts[0].topics[0].exact
    assert not reconcile_fleet(books, lake({("h1", A, "t"): (6, 6)})).balanced


def test_identities_of_a_run_without_books_fail_the_audit() -> None:
    books = [record(A, {"t": {"accepted": 1, "delivered": 1}})]
    report = reconcile_fleet(books, lake({("h1", A, "t"): (1, 1), ("h1", B, "t"): (1, 1)}))
    assert not report.balanced
    assert any(B in problem for problem in report.hosts[0].problems)
    other_host = reconcile_fleet(books, lake({("h1", A, "t"): (1, 1), ("h9", C, "t"): (1, 1)}))
    assert not other_host.balanced
    assert "host h9" in other_host.problems[0]


def test_a_run_left_running_before_a_later_run_is_a_problem_the_last_one_is_not() -> None:
    running = record(A, {"t": {"accepted": 4, "delivered": 2, "in_flight": 2}}, ended="running")
    later = record(B, {"t": {"accepted": 1, "delivered": 1}}, started_ms=1)
    landed = {("h1", A, "t"): (2, 2), ("h1", B, "t"): (1, 1)}
    assert not reconcile_fleet([running, later], lake(landed)).balanced
    # Still running: its in-flight messages may have landed already, or not.
    for extra in (0, 2):
        alone = reconcile_fleet([running], lake({("h1", A, "t"): (2 + extra, 2 + extra)}))
        assert alone.balanced, alone.render()


def test_what_no_later_run_replayed_is_outstanding() -> None:
    stopped = record(A, {"t": {"accepted": 6, "delivered": 4, "left_for_next_start": 2}})
    report = reconcile_fleet([stopped], lake({("h1", A, "t"): (4, 4)}))
    assert report.balanced
    assert report.hosts[0].topics[0].outstanding == 2


def test_a_record_that_is_not_pydory_books_is_refused_by_name() -> None:
    with pytest.raises(UnreadableBooksRecord):
        RunRecord.from_json({"schema": 1, "host": "h"})
    with pytest.raises(UnreadableBooksRecord):
        RunRecord.from_json(["not", "a", "record"])


# --- a simulated host: every message's fate drawn, the books and the lake derived -------------

FATES = st.sampled_from(["delivered", "discarded", "maybe_landed", "maybe_lost", "handed"])


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 12), st.booleans()), min_size=1, max_size=5),
    st.data(),
)
def test_property_books_derived_from_any_fates_balance_and_any_loss_or_copy_is_caught(
    runs: list[tuple[int, bool]], data: st.DataObject
) -> None:
    """Each run first accepts ``new`` messages and takes over what the run before handed
    over; every message it holds meets a fate (handed over: to the next run, or, for the
    last, left in its spool). The books each run would publish and the lake that follows
    balance exactly; one landed message removed, or landed twice, never does."""
    records, landed, identity_run, delivered = [], Counter[str](), {}, []
    carried: list[str] = []
    for index, (new, crashed) in enumerate(runs):
        incarnation = f"{index + 1:016x}"
        mine = [f"h1/{incarnation}/1/{n}" for n in range(new)]
        identity_run.update(dict.fromkeys(mine, incarnation))
        held = carried + mine
        fates = [data.draw(FATES) for _ in held]
        counts = Counter(fates)
        for identity, fate in zip(held, fates, strict=True):
            if fate in ("delivered", "maybe_landed"):
                landed[identity] += 1
            if fate == "delivered":
                delivered.append(identity)
        maybe = [i for i, f in zip(held, fates, strict=True) if f.startswith("maybe")]
        handed = [i for i, f in zip(held, fates, strict=True) if f == "handed"]
        pending = "handed_over" if crashed else "left_for_next_start"
        records.append(
            record(
                incarnation,
                {
                    "t": {
                        "accepted": len(held),
                        "delivered": counts["delivered"],
                        "discarded": {"kafka_error": counts["discarded"]},
                        "possibly_delivered": len(maybe),
                        "possibly_delivered_ids": maybe,
                        pending: len(handed),
                        "replayed": len(carried),
                    }
                },
                ended="rebuilt_after_crash" if crashed else "clean",
                started_ms=index,
                replayed_from={f"{index:016x}": {"t": len(carried)}} if index else {},
            )
        )
        carried = handed

    def summarise(copies: Counter[str]) -> LakeIdentities:
        per_run: dict[tuple[str, str, str], tuple[int, int]] = {}
        for identity, n in copies.items():
            key = ("h1", identity_run[identity], "t")
            rows, distinct = per_run.get(key, (0, 0))
            per_run[key] = (rows + n, distinct + 1)
        return LakeIdentities(per_run, {}, {}, lambda identity: identity in copies)

    report = reconcile_fleet(records, summarise(landed))
    assert report.balanced, report.render()
    assert all(topic.exact for topic in report.hosts[0].topics)
    if landed:
        twice = landed.copy()
        twice[data.draw(st.sampled_from(sorted(landed)))] += 1
        assert not reconcile_fleet(records, summarise(twice)).balanced
    if delivered:  # (a possibly delivered one missing is one that did not land: no loss)
        lost = landed.copy()
        del lost[data.draw(st.sampled_from(delivered))]
        assert not reconcile_fleet(records, summarise(lost)).balanced


# --- the state kept between runs ----------------------------------------------------------------


def test_ranges_merge_when_they_touch_and_answer_whether_an_identity_landed(
    tmp_path: Path,
) -> None:
    state = FleetState("/lake", "pydory.books")
    key = ("h1", A, 3)
    state.add_ranges([(key, 10, 19), (key, 0, 4), (key, 5, 8)])
    assert state.ranges[key] == [[0, 8], [10, 19]]
    state.add_ranges([(key, 9, 9)])
    assert state.ranges[key] == [[0, 19]]
    assert state.landed(f"h1/{A}/3/0")
    assert state.landed(f"h1/{A}/3/19")
    assert not state.landed(f"h1/{A}/3/20")
    assert not state.landed(f"h1/{A}/4/5")
    assert not state.landed("not an identity")
    state.per_run_topic[("h1", A, "t")] = [20, 20]
    state.books["h1/" + A] = {"schema": 1}
    state.books_offsets[0] = 7
    state.read_through_us, state.files_at_mark = 1_764_300_000_000_000, {"file:/lake/a.parquet"}
    state.files_audited = 40
    state.save(str(tmp_path))
    again = FleetState.load(str(tmp_path), "/lake", "pydory.books")
    assert again == state
    # The state is bounded: how far the lake was read, never every file read.
    assert "files" not in json.loads((tmp_path / "fleet-audit-state.json").read_text())
    with pytest.raises(StateMismatch):
        FleetState.load(str(tmp_path), "/another-lake", "pydory.books")


def test_the_command_refuses_a_directory_that_is_not_a_lake_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from pydory.cli import main

    status = main(
        ["pipeline", "fleet-audit", "--lake", str(tmp_path), "--bootstrap-servers", "127.0.0.1:1"]
    )
    assert status == 2
    assert "_spark_metadata/ commit log" in capsys.readouterr().err


# --- a host that never came back, and books deleted by a tombstone ----------------------------


def test_a_crashed_host_that_never_came_back_is_proved_up_to_its_last_books_record() -> None:
    """Its last record (written every 5 s) counts 2,520 accepted; 2,700 of its identities
    landed: the 180 beyond are messages accepted after that record, never "NOT balanced".
    A delivered message missing, or a second copy, still fails the audit."""
    last_record = record(
        A, {"t": {"accepted": 2520, "delivered": 2500, "in_flight": 20}}, ended="running"
    )
    report = reconcile_fleet([last_record], lake({("h1", A, "t"): (2700, 2700)}))
    assert report.balanced, report.render()
    (topic,) = report.hosts[0].topics
    assert (topic.after_record, topic.exact) == (180, False)
    assert "180 of its identities landed beyond the 2520" in report.render()
    assert report.as_dict()["hosts"][0]["runs"][0]["open"] is True
    # A real loss: fewer than it delivered by its record.
    assert not reconcile_fleet([last_record], lake({("h1", A, "t"): (2499, 2499)})).balanced
    # A real second copy: one identity landed twice.
    assert not reconcile_fleet([last_record], lake({("h1", A, "t"): (2701, 2700)})).balanced


def test_only_the_last_run_of_a_host_may_have_landed_beyond_its_books() -> None:
    crashed = record(A, {"t": {"accepted": 10, "delivered": 10}}, ended="running")
    later = record(B, {"t": {"accepted": 5, "delivered": 5}}, started_ms=1)
    # The earlier run is not open: identities beyond its record are a problem.
    report = reconcile_fleet(
        [crashed, later], lake({("h1", A, "t"): (12, 12), ("h1", B, "t"): (5, 5)})
    )
    assert not report.balanced
    # A final (clean) run is never open either.
    clean = record(A, {"t": {"accepted": 10, "delivered": 10}})
    assert not reconcile_fleet([clean], lake({("h1", A, "t"): (12, 12)})).balanced


def test_a_run_whose_books_were_deleted_is_noted_not_failed_and_others_still_proved() -> None:
    other = record(B, {"t": {"accepted": 3, "delivered": 3}}, started_ms=1)
    landed = {("h1", A, "t"): (7, 7), ("h1", B, "t"): (3, 3)}
    report = reconcile_fleet([other], lake(landed), deleted=[f"h1/{A}"])
    assert report.balanced, report.render()
    assert "books were deleted" in report.render()
    # Without the tombstone the same lake fails: a run with no books at all.
    assert not reconcile_fleet([other], lake(landed)).balanced
    # The deleted run's identities do not hide a loss of another run.
    assert not reconcile_fleet(
        [other], lake({**landed, ("h1", B, "t"): (2, 2)}), deleted=[f"h1/{A}"]
    ).balanced
    # A host whose only run was deleted is listed, balanced.
    alone = reconcile_fleet([], lake({("h2", C, "t"): (4, 4)}), deleted=[f"h2/{C}"])
    assert alone.balanced
    assert alone.hosts[0].host == "h2"


def test_topics_limits_the_proof_to_the_topics_a_lake_holds() -> None:
    books = [
        record(A, {"t": {"accepted": 3, "delivered": 3}, "u": {"accepted": 2, "delivered": 2}})
    ]
    only_t = lake({("h1", A, "t"): (3, 3)})
    assert not reconcile_fleet(books, only_t).balanced  # u's 2 messages are not in this lake
    report = reconcile_fleet(books, only_t, topics=["t"])
    assert report.balanced, report.render()
    assert [topic.topic for topic in report.hosts[0].topics] == ["t"]
    # A loss in an audited topic is still caught.
    assert not reconcile_fleet(books, lake({("h1", A, "t"): (2, 2)}), topics=["t"]).balanced
