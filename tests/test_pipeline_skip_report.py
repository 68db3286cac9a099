"""What a landing run with data loss accepted skipped, per partition (pure; no Spark)."""

from __future__ import annotations

from pydory.pipeline.landing.skip_report import (
    PartitionSkips,
    TopicSkips,
    plan_of_run,
    skips_of_run,
)
from pydory.pipeline.source.offsets import PartitionId

E0, E1 = PartitionId("events", 0), PartitionId("events", 1)


def test_contiguous_batches_merge_and_backward_jumps_stand_apart() -> None:
    plan = plan_of_run(
        [
            (None, {"events": {"0": 10, "1": 5}}),  # a new checkpoint's first batch
            ({"events": {"0": 10, "1": 5}}, {"events": {"0": 20, "1": 5}}),
            ({"events": {"0": 20, "1": 5}}, {"events": {"0": 30, "1": 2}}),
            ({"events": {"0": 30, "1": 2}}, {"events": {"0": 30, "1": 9}, "new": {"0": 4}}),
        ]
    )

    assert plan.forward == {E0: [(10, 30)], E1: [(2, 9)]}
    assert plan.backwards == {E1: [(5, 2)]}


def test_offsets_planned_but_not_landed_aged_out() -> None:
    plan = plan_of_run([({"events": {"0": 10}}, {"events": {"0": 1510}})])

    skips = skips_of_run(plan, {E0: 1_400}, reads_new_log=True)

    assert skips == [PartitionSkips(E0, aged_out=100)]
    assert skips[0].describe() == "events/0: 100 offsets aged out of Kafka before they were read"


def test_a_partition_that_landed_everything_is_not_reported() -> None:
    plan = plan_of_run([({"events": {"0": 10, "1": 0}}, {"events": {"0": 20, "1": 3}})])

    assert skips_of_run(plan, {E0: 10, E1: 3}, reads_new_log=False) == []


def test_a_jump_backwards_skips_the_new_log_only_where_the_connector_does_not_read_it() -> None:
    plan = plan_of_run([({"events": {"0": 6}}, {"events": {"0": 4}})])

    native = skips_of_run(plan, {}, reads_new_log=False)
    python = skips_of_run(plan, {}, reads_new_log=True)

    assert [skip.total for skip in native] == [4]
    assert native[0].describe() == (
        "events/0: offsets went backwards from 6 to 4 (topic recreated or log truncated): "
        "up to 4 records below offset 4 not read"
    )
    assert [skip.total for skip in python] == [0]
    assert "the new log read from its earliest offset" in python[0].describe()


def test_second_copies_dropped_are_never_counted_as_skipped() -> None:
    """The issue's case: 1,000 messages, the same 1,000 again (a crash's replay), 500 new,
    all planned in one range; the lake holds 1,500 rows, 1,000 copies were dropped."""
    plan = plan_of_run([({"events": {"0": 0}}, {"events": {"0": 2_500}})], [{"events": 1_000}])

    assert skips_of_run(plan, {E0: 1_500}, reads_new_log=True) == []


def test_a_real_skip_beside_dropped_second_copies_is_still_counted_for_its_topic() -> None:
    plan = plan_of_run(
        [
            ({"events": {"0": 0, "1": 0}}, {"events": {"0": 100, "1": 50}}),
            ({"events": {"0": 100, "1": 50}}, {"events": {"0": 200, "1": 60}}),
        ],
        [{"events": 30}, {}],
    )

    # Partition 0 lacks 40 rows, partition 1 lacks 5: 30 were dropped copies, 15 skipped.
    skips = skips_of_run(plan, {E0: 160, E1: 55}, reads_new_log=True)

    assert skips == [TopicSkips("events", (0, 1), aged_out=15, second_copies=30)]
    assert skips[0].describe() == (
        "events (partitions 0, 1): 15 offsets aged out of Kafka before they were read "
        "(30 others not landed were second copies dropped)"
    )
    # A batch with no start is not planned: what it dropped is not taken off either.
    unplanned = plan_of_run(
        [(None, {"events": {"0": 100}}), ({"events": {"0": 100}}, {"events": {"0": 110}})],
        [{"events": 50}, {}],
    )
    assert [skip.total for skip in skips_of_run(unplanned, {E0: 5}, reads_new_log=True)] == [5]
