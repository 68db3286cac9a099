"""Offset planning for the pydory-kafka source: pure functions, no Kafka, no Spark."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pydory.pipeline.errors import SourceOptionError
from pydory.pipeline.source.offsets import (
    EARLIEST,
    LATEST,
    LossKind,
    OffsetRange,
    OffsetSpec,
    PartitionId,
    Watermarks,
    admit,
    find_data_loss,
    next_end_offsets,
    offsets_from_json,
    offsets_to_json,
    parse_offset_spec,
    plan_ranges,
    resolve_offsets,
    starts_to_look_up,
)
from pydory.pipeline.source.source_options import SourceOptions

A0, A1, A2 = PartitionId("a", 0), PartitionId("a", 1), PartitionId("a", 2)
B0 = PartitionId("b", 0)


# --- JSON ----------------------------------------------------------------------------------


def test_offsets_round_trip_through_json_text() -> None:
    offsets = {A1: 40, B0: 7, A0: 23}

    text = json.dumps(offsets_to_json(offsets))

    assert offsets_from_json(json.loads(text)) == offsets


def test_offsets_json_is_canonical_whatever_the_insertion_order() -> None:
    # Spark compares offsets by their JSON text: equal offsets must print the same.
    first = json.dumps(offsets_to_json({B0: 1, A1: 2, A0: 3}))
    second = json.dumps(offsets_to_json({A0: 3, A1: 2, B0: 1}))

    assert first == second == '{"a": {"0": 3, "1": 2}, "b": {"0": 1}}'


def test_partitions_sort_numerically_in_json() -> None:
    offsets = {PartitionId("a", 10): 1, PartitionId("a", 2): 1}

    assert list(offsets_to_json(offsets)["a"]) == ["2", "10"]


@pytest.mark.parametrize(
    "data",
    [
        [1, 2],
        {"a": 5},
        {"a": {"x": 5}},
        {"a": {"0": "5"}},
        {"a": {"0": -3}},
        {"a": {"0": True}},
    ],
)
def test_offsets_from_json_rejects_other_shapes(data: object) -> None:
    with pytest.raises(SourceOptionError):
        offsets_from_json(data)


# --- startingOffsets / endingOffsets -------------------------------------------------------


def test_parse_offset_spec_words() -> None:
    assert parse_offset_spec("earliest", "startingOffsets", EARLIEST) == OffsetSpec(EARLIEST)
    assert parse_offset_spec(" LATEST ", "startingOffsets", EARLIEST) == OffsetSpec(LATEST)


def test_parse_offset_spec_json_with_sentinels() -> None:
    spec = parse_offset_spec('{"a": {"0": 23, "1": -2, "2": -1}}', "startingOffsets", EARLIEST)

    assert spec == OffsetSpec(EARLIEST, {A0: 23, A1: EARLIEST, A2: LATEST})


def test_parse_offset_spec_rejects_garbage_naming_the_option() -> None:
    with pytest.raises(SourceOptionError, match="startingOffsets"):
        parse_offset_spec("oldest", "startingOffsets", EARLIEST)


def test_resolve_offsets_replaces_sentinels_and_fills_unlisted_partitions() -> None:
    available = {A0: Watermarks(5, 50), A1: Watermarks(0, 10), A2: Watermarks(3, 30)}
    spec = OffsetSpec(LATEST, {A0: 23, A1: EARLIEST})

    assert resolve_offsets(spec, available) == {A0: 23, A1: 0, A2: 30}


def test_resolve_offsets_rejects_unknown_partitions() -> None:
    with pytest.raises(SourceOptionError, match="a/7"):
        resolve_offsets(OffsetSpec(EARLIEST, {PartitionId("a", 7): 0}), {A0: Watermarks(0, 1)})


# --- source options ------------------------------------------------------------------------


def _options(**extra: str) -> dict[str, str]:
    return {"kafka.bootstrap.servers": "127.0.0.1:9092", "subscribe": "a, b", **extra}


def test_source_options_defaults_mirror_spark_sql_kafka() -> None:
    stream = SourceOptions.parse(_options(), streaming=True)
    batch = SourceOptions.parse(_options(), streaming=False)

    assert stream.topics == ("a", "b")
    assert stream.starting_offsets == OffsetSpec(LATEST)
    assert batch.starting_offsets == OffsetSpec(EARLIEST)
    assert batch.ending_offsets == OffsetSpec(LATEST)
    assert stream.fail_on_data_loss is True
    assert stream.max_offsets_per_trigger is None


def test_source_option_names_are_case_insensitive() -> None:
    options = SourceOptions.parse(
        _options(MAXOFFSETSPERTRIGGER="10", failondataloss="False"), streaming=True
    )

    assert options.max_offsets_per_trigger == 10
    assert options.fail_on_data_loss is False


def test_kafka_prefixed_options_reach_librdkafka_but_cannot_break_range_reads() -> None:
    options = SourceOptions.parse(_options(**{"kafka.client.id": "lander"}), streaming=True)
    config = options.consumer_config()

    assert config["client.id"] == "lander"
    assert config["bootstrap.servers"] == "127.0.0.1:9092"
    assert config["enable.auto.commit"] is False
    assert config["auto.offset.reset"] == "error"
    with pytest.raises(SourceOptionError, match=r"kafka\.auto\.offset\.reset"):
        SourceOptions.parse(_options(**{"kafka.auto.offset.reset": "earliest"}), streaming=True)


@pytest.mark.parametrize(
    ("extra", "streaming", "bad_option"),
    [
        ({"subscribePattern": "a.*"}, True, "subscribePattern"),
        ({"minOffsetsPerTrigger": "100"}, True, "minOffsetsPerTrigger"),
        ({"MINOFFSETSPERTRIGGER": "100"}, None, "minOffsetsPerTrigger"),
        ({"maxTriggerDelay": "5m"}, None, "maxTriggerDelay"),
        ({"fetchOffset.numRetries": "3"}, None, "fetchOffset.numRetries"),
        (
            {"startingOffsetsByTimestampStrategy": "latest"},
            None,
            "startingOffsetsByTimestampStrategy",
        ),
        ({"maxOffsetsPerTrigger": "many"}, None, "maxOffsetsPerTrigger"),
        ({"startingOffsets": "whenever"}, True, "startingOffsets"),
        ({"endingOffsets": "latest"}, True, "endingOffsets"),
        ({"startingOffsets": "latest"}, False, "startingOffsets"),
        ({"endingOffsets": "earliest"}, False, "endingOffsets"),
        ({"maxOffsetsPerTrigger": "0"}, True, "maxOffsetsPerTrigger"),
        ({"failOnDataLoss": "maybe"}, True, "failOnDataLoss"),
        ({"startingOffsets": '{"c": {"0": 1}}'}, True, "startingOffsets"),
        ({"maxOfsetsPerTrigger": "5"}, True, "maxOfsetsPerTrigger"),
    ],
)
def test_bad_source_options_are_refused_by_name(
    extra: dict[str, str], streaming: bool | None, bad_option: str
) -> None:
    with pytest.raises(SourceOptionError) as caught:
        SourceOptions.parse(_options(**extra), streaming=streaming)

    assert caught.value.option == bad_option


# Every option spark-sql-kafka 4.2 reads (KafkaSourceProvider), as its docs spell them.
SPARK_KAFKA_OPTIONS = (
    "assign",
    "subscribe",
    "subscribePattern",
    "startingOffsets",
    "endingOffsets",
    "startingOffsetsByTimestamp",
    "endingOffsetsByTimestamp",
    "startingTimestamp",
    "endingTimestamp",
    "startingOffsetsByTimestampStrategy",
    "failOnDataLoss",
    "kafkaConsumer.pollTimeoutMs",
    "fetchOffset.numRetries",
    "fetchOffset.retryIntervalMs",
    "maxOffsetsPerTrigger",
    "minOffsetsPerTrigger",
    "maxTriggerDelay",
    "minPartitions",
    "maxRecordsPerPartition",
    "includeHeaders",
    "groupIdPrefix",
)


@pytest.mark.parametrize("name", SPARK_KAFKA_OPTIONS)
def test_every_option_of_spark_s_kafka_source_is_taken_or_refused_by_its_name(name: str) -> None:
    options = {"kafka.bootstrap.servers": "x:1", "subscribe": "a", name: "1"}
    refusal = None
    try:
        SourceOptions.parse(options, streaming=None)
    except SourceOptionError as error:
        refusal = error

    if refusal is not None:
        assert refusal.option == name
        assert "unknown option" not in refusal.reason


def test_what_applies_to_one_kind_of_read_waits_until_the_kind_is_known() -> None:
    either = _options(endingOffsets="latest", startingOffsets="latest")

    SourceOptions.parse(either, streaming=None)
    with pytest.raises(SourceOptionError, match="endingOffsets"):
        SourceOptions.parse(either, streaming=True)
    with pytest.raises(SourceOptionError, match="startingOffsets"):
        SourceOptions.parse(either, streaming=False)


def test_required_options() -> None:
    with pytest.raises(SourceOptionError, match=r"kafka\.bootstrap\.servers"):
        SourceOptions.parse({"subscribe": "a"}, streaming=True)
    with pytest.raises(SourceOptionError, match="subscribe"):
        SourceOptions.parse({"kafka.bootstrap.servers": "x:1", "subscribe": " , "}, True)


# --- data loss -----------------------------------------------------------------------------


def test_find_data_loss_names_aged_out_gone_and_reset_partitions() -> None:
    start = {A0: 10, A1: 3, A2: 90, B0: 0}
    available = {A0: Watermarks(5, 50), A1: Watermarks(8, 20), A2: Watermarks(0, 40)}

    losses = find_data_loss(start, available)

    assert [(loss.partition, loss.kind) for loss in losses] == [
        (A1, LossKind.AGED_OUT),
        (A2, LossKind.OFFSETS_RESET),
        (B0, LossKind.PARTITION_GONE),
    ]
    assert losses[0].lost == 5
    assert "a/1: offset 3 aged out of retention" in losses[0].describe()
    assert "8 to 19" in losses[0].describe()
    assert "(5 offsets lost)" in losses[0].describe()
    assert losses[1].describe() == (
        "a/2: offsets went backwards (the topic was deleted and recreated, or its log "
        "truncated): the query had read up to offset 90, the broker now holds offsets 0 to 39"
    )


def test_no_data_loss_at_the_edges_of_what_the_broker_holds() -> None:
    start = {A0: 5, A1: 20}
    available = {A0: Watermarks(5, 50), A1: Watermarks(8, 20)}

    assert find_data_loss(start, available) == []


# --- admission control ---------------------------------------------------------------------


def test_admit_everything_when_under_the_cap() -> None:
    assert admit({A0: 0, A1: 5}, {A0: 10, A1: 9}, max_offsets=100) == {A0: 10, A1: 9}


def test_admit_spreads_the_cap_in_proportion_to_the_lag() -> None:
    end = admit({A0: 0, A1: 0, A2: 0}, {A0: 600, A1: 300, A2: 100}, max_offsets=100)

    assert end == {A0: 60, A1: 30, A2: 10}


def test_admit_does_not_starve_a_nearly_idle_partition() -> None:
    end = admit({A0: 0, A1: 0}, {A0: 1_000_000, A1: 1}, max_offsets=10)

    assert end == {A0: 9, A1: 1}


def test_admit_with_a_cap_below_the_partition_count_serves_the_furthest_behind() -> None:
    end = admit({A0: 0, A1: 0, A2: 0}, {A0: 5, A1: 50, A2: 7}, max_offsets=2)

    assert end == {A0: 0, A1: 1, A2: 1}


def test_admit_leaves_caught_up_partitions_where_they_are() -> None:
    end = admit({A0: 10, A1: 0}, {A0: 10, A1: 100}, max_offsets=5)

    assert end == {A0: 10, A1: 5}


@given(
    lags=st.lists(st.integers(min_value=0, max_value=10_000), min_size=1, max_size=8),
    starts=st.lists(st.integers(min_value=0, max_value=1_000), min_size=8, max_size=8),
    max_offsets=st.integers(min_value=1, max_value=20_000),
)
def test_admit_never_exceeds_the_cap_nor_the_latest_and_uses_all_of_it(
    lags: list[int], starts: list[int], max_offsets: int
) -> None:
    partitions = [PartitionId("t", number) for number in range(len(lags))]
    start = {partition: starts[index] for index, partition in enumerate(partitions)}
    latest = {
        partition: start[partition] + lags[index] for index, partition in enumerate(partitions)
    }

    end = admit(start, latest, max_offsets)

    admitted = sum(end[partition] - start[partition] for partition in partitions)
    assert admitted == min(max_offsets, sum(lags))
    assert all(start[partition] <= end[partition] <= latest[partition] for partition in partitions)
    if max_offsets >= len(partitions):
        assert all(end[p] > start[p] for p in partitions if latest[p] > start[p])


# --- one micro-batch -----------------------------------------------------------------------


def test_next_end_is_start_when_nothing_is_new() -> None:
    start = {A0: 10, A1: 4}
    available = {A0: Watermarks(0, 10), A1: Watermarks(0, 4)}

    assert next_end_offsets(start, available) == start


def test_next_end_reads_to_the_latest_and_picks_up_new_partitions_from_earliest() -> None:
    start = {A0: 10}
    available = {A0: Watermarks(0, 15), A1: Watermarks(3, 9)}

    assert next_end_offsets(start, available) == {A0: 15, A1: 9}


def test_next_end_skips_lost_offsets_and_drops_gone_partitions() -> None:
    start = {A0: 2, A1: 90, B0: 5}
    available = {A0: Watermarks(40, 60), A1: Watermarks(0, 30)}

    end = next_end_offsets(start, available, max_offsets=10)

    # Lost offsets resume at the earliest available; the cap counts from there.
    assert end == {A0: 44, A1: 6}


def test_next_end_stops_at_the_available_now_target_and_keeps_every_started_partition() -> None:
    start = {A0: 10, A1: 4}
    available = {A0: Watermarks(0, 50), A1: Watermarks(0, 9), A2: Watermarks(0, 7)}
    target = {A0: 30, A1: 9}

    end = next_end_offsets(start, available, target=target)

    # a/2 appeared after the target was taken: left for a later run, untouched.
    assert end == {A0: 30, A1: 9}
    assert next_end_offsets(end, available, target=target) == end


def test_available_now_with_a_cap_takes_several_batches_then_returns_start() -> None:
    available = {A0: Watermarks(0, 100), A1: Watermarks(0, 20)}
    target = {A0: 80, A1: 20}
    start: dict[PartitionId, int] = {A0: 0, A1: 0}
    batches = []
    for _ in range(20):
        end = next_end_offsets(start, available, max_offsets=30, target=target)
        if end == start:
            break
        batches.append(sum(end[p] - start[p] for p in end))
        start = end

    assert start == target
    assert batches == [30, 30, 30, 10]


# --- ranges --------------------------------------------------------------------------------


def test_plan_ranges_one_per_partition_with_records() -> None:
    ranges = plan_ranges({A0: 10, A1: 4, A2: 7}, {A0: 15, A1: 4, A2: 9}, earliest={})

    assert ranges == [OffsetRange(A0, 10, 15), OffsetRange(A2, 7, 9)]


def test_plan_ranges_starts_new_and_reset_partitions_at_the_earliest() -> None:
    start = {A0: 50}
    end = {A0: 12, A1: 9}
    assert starts_to_look_up(start, end) == [A0, A1]

    ranges = plan_ranges(start, end, earliest={A0: 0, A1: 3})

    assert ranges == [OffsetRange(A0, 0, 12), OffsetRange(A1, 3, 9)]
