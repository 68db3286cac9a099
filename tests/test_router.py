"""The router's rules (spec §1), with broker liveness as input. Pure logic: no brokers."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from pydory.daemon.delivery.router import ANY_PARTITION_RUN, NO_LEADER, MetadataSnapshot, Router

TOPIC = "events"
BROKERS = {1: "127.0.0.1:9001", 2: "127.0.0.1:9002", 3: "127.0.0.1:9003"}


def router_for(leaders: dict[int, int]) -> Router:
    return Router(MetadataSnapshot.build(BROKERS, {TOPIC: leaders}))


def any_partition_counts(router: Router, messages: int) -> Counter[int]:
    return Counter(router.any_partition(TOPIC) for _ in range(messages))


# --- PartitionKey ---------------------------------------------------------------------------


def test_partition_key_is_key_modulo_the_partition_count() -> None:
    router = router_for({0: 1, 1: 2, 2: 3})
    assert [router.partition_key_partition(TOPIC, key) for key in range(6)] == [0, 1, 2, 0, 1, 2]


def test_partition_key_treats_the_key_as_unsigned_32_bit() -> None:
    router = router_for({0: 1, 1: 2, 2: 3})
    assert router.partition_key_partition(TOPIC, -1) == 0xFFFFFFFF % 3


def test_partition_key_takes_the_next_partition_with_a_leader_wrapping() -> None:
    router = router_for({0: 1, 1: 2, 2: NO_LEADER})
    assert router.partition_key_partition(TOPIC, 2) == 0


def test_partition_key_skips_partitions_of_an_unavailable_broker() -> None:
    router = router_for({0: 1, 1: 2, 2: 3})
    router.set_unavailable(brokers={2})
    assert [router.partition_key_partition(TOPIC, key) for key in range(3)] == [0, 2, 2]


def test_partition_key_skips_an_unavailable_partition() -> None:
    router = router_for({0: 1, 1: 2, 2: 3})
    router.set_unavailable(partitions={(TOPIC, 0)})
    assert router.partition_key_partition(TOPIC, 0) == 1


def test_partition_key_returns_to_its_partition_when_the_broker_is_back() -> None:
    router = router_for({0: 1, 1: 2, 2: 3})
    router.set_unavailable(brokers={2})
    router.set_unavailable(brokers=())
    assert router.partition_key_partition(TOPIC, 1) == 1


def test_partition_key_falls_back_to_metadata_when_no_partition_is_reachable() -> None:
    router = router_for({0: 1, 1: NO_LEADER, 2: 3})
    router.set_unavailable(brokers={1, 3})
    assert router.partition_key_partition(TOPIC, 1) == 2


def test_partition_key_keeps_its_partition_when_nothing_has_a_leader() -> None:
    router = router_for({0: NO_LEADER, 1: NO_LEADER})
    assert router.partition_key_partition(TOPIC, 1) == 1


# --- AnyPartition ---------------------------------------------------------------------------


def test_any_partition_stays_on_a_partition_for_a_run_then_moves_on() -> None:
    router = router_for({0: 1, 1: 2, 2: 3})
    choices = [router.any_partition(TOPIC) for _ in range(3 * ANY_PARTITION_RUN)]
    assert choices == [0] * ANY_PARTITION_RUN + [1] * ANY_PARTITION_RUN + [2] * ANY_PARTITION_RUN


def test_any_partition_spreads_by_each_brokers_share_of_leaders() -> None:
    router = router_for({0: 1, 1: 1, 2: 1, 3: 2, 4: 2, 5: 3})
    counts = any_partition_counts(router, 6 * ANY_PARTITION_RUN * 10)
    per_broker = Counter({1: counts[0] + counts[1] + counts[2], 2: counts[3] + counts[4]})
    per_broker[3] = counts[5]
    assert per_broker == Counter({1: 1920, 2: 1280, 3: 640})


def test_any_partition_avoids_partitions_without_a_leader() -> None:
    router = router_for({0: 1, 1: NO_LEADER, 2: 3})
    assert set(any_partition_counts(router, 10 * ANY_PARTITION_RUN)) == {0, 2}


def test_any_partition_avoids_an_unavailable_broker_and_comes_back_to_it() -> None:
    router = router_for({0: 1, 1: 2, 2: 3, 3: 2})
    assert router.set_unavailable(brokers={2})
    assert set(any_partition_counts(router, 10 * ANY_PARTITION_RUN)) == {0, 2}
    assert router.set_unavailable(brokers=())
    assert set(any_partition_counts(router, 10 * ANY_PARTITION_RUN)) == {0, 1, 2, 3}


def test_any_partition_avoids_an_unavailable_partition() -> None:
    router = router_for({0: 1, 1: 2, 2: 3})
    router.set_unavailable(partitions={(TOPIC, 2), ("other-topic", 0)})
    assert set(any_partition_counts(router, 10 * ANY_PARTITION_RUN)) == {0, 1}


def test_unavailable_marks_of_unknown_brokers_change_nothing_for_routing() -> None:
    router = router_for({0: 1, 1: 2})
    router.set_unavailable(brokers={7})
    assert set(any_partition_counts(router, 4 * ANY_PARTITION_RUN)) == {0, 1}


def test_any_partition_falls_back_to_metadata_when_every_broker_is_unavailable() -> None:
    router = router_for({0: 1, 1: NO_LEADER, 2: 3})
    router.set_unavailable(brokers={1, 2, 3})
    assert set(any_partition_counts(router, 10 * ANY_PARTITION_RUN)) == {0, 2}


def test_any_partition_uses_every_partition_when_none_has_a_leader() -> None:
    router = router_for({0: NO_LEADER, 1: NO_LEADER})
    assert set(any_partition_counts(router, 4 * ANY_PARTITION_RUN)) == {0, 1}


def test_a_reroute_avoids_the_partition_that_failed() -> None:
    router = router_for({0: 1, 1: 2})
    assert {router.any_partition(TOPIC, avoid=0) for _ in range(4 * ANY_PARTITION_RUN)} == {1}


def test_a_reroute_may_use_the_failed_partition_when_it_is_the_only_one() -> None:
    router = router_for({0: 1, 1: 2})
    router.set_unavailable(brokers={2})
    assert router.any_partition(TOPIC, avoid=0) == 0


def test_set_unavailable_reports_whether_anything_changed() -> None:
    router = router_for({0: 1})
    assert router.set_unavailable(brokers={1}) is True
    assert router.set_unavailable(brokers=[1]) is False
    assert router.unavailable_brokers == frozenset({1})
    assert router.set_unavailable(brokers={1}, partitions={(TOPIC, 0)}) is True


def test_available_lists_partitions_with_a_reachable_leader() -> None:
    router = router_for({0: 1, 1: 2, 2: NO_LEADER, 3: 3})
    router.set_unavailable(brokers={3})
    assert router.available(TOPIC) == (0, 1)


def test_liveness_survives_a_metadata_refresh() -> None:
    router = router_for({0: 1, 1: 2})
    router.set_unavailable(brokers={2})
    router.replace(MetadataSnapshot.build(BROKERS, {TOPIC: {0: 1, 1: 2, 2: 2}}))
    assert set(any_partition_counts(router, 10 * ANY_PARTITION_RUN)) == {0}


@given(
    leaders=st.dictionaries(
        st.integers(0, 31), st.sampled_from([NO_LEADER, 1, 2, 3]), min_size=1, max_size=12
    ),
    down=st.sets(st.sampled_from([1, 2, 3])),
    key=st.integers(-(2**31), 2**32 - 1),
)
def test_routes_always_name_a_partition_of_the_topic_and_prefer_reachable_ones(
    leaders: dict[int, int], down: set[int], key: int
) -> None:
    router = router_for(leaders)
    router.set_unavailable(brokers=down)
    reachable = {p for p, leader in leaders.items() if leader not in (NO_LEADER, *down)}
    keyed = router.partition_key_partition(TOPIC, key)
    spread = {router.any_partition(TOPIC) for _ in range(len(leaders) * ANY_PARTITION_RUN)}
    assert keyed in leaders
    assert spread <= set(leaders)
    if reachable:
        assert keyed in reachable
        assert spread == reachable


# --- metadata snapshots ---------------------------------------------------------------------


def cluster_metadata(brokers: list[int], leaders: dict[int, int]) -> Any:
    """The shape of confluent_kafka's ClusterMetadata that the router reads."""
    return SimpleNamespace(
        brokers={b: SimpleNamespace(id=b, host="127.0.0.1", port=9000 + b) for b in brokers},
        topics={
            TOPIC: SimpleNamespace(
                error=None,
                partitions={
                    p: SimpleNamespace(id=p, leader=leader, error=None)
                    for p, leader in leaders.items()
                },
            ),
            "__consumer_offsets": SimpleNamespace(error=None, partitions={}),
        },
    )


def test_a_leader_missing_from_the_broker_list_counts_as_no_leader() -> None:
    # librdkafka's mock cluster (and a real cluster, briefly) lists a downed broker as
    # leader but leaves it out of the brokers.
    snapshot = MetadataSnapshot.from_cluster_metadata(cluster_metadata([1, 2], {0: 1, 1: 3}))
    assert dict(snapshot.topics[TOPIC].leaders) == {0: 1, 1: NO_LEADER}
    assert snapshot.topics[TOPIC].available == (0,)
    assert "__consumer_offsets" not in snapshot.topics


def test_same_layout_compares_brokers_and_leaders() -> None:
    before = MetadataSnapshot.build(BROKERS, {TOPIC: {0: 1, 1: 2}})
    assert before.same_layout(MetadataSnapshot.build(BROKERS, {TOPIC: {0: 1, 1: 2}}))
    assert not before.same_layout(MetadataSnapshot.build(BROKERS, {TOPIC: {0: 1, 1: 3}}))


@given(
    st.lists(st.integers(min_value=1, max_value=300), min_size=1, max_size=12),
    st.sets(st.integers(min_value=0, max_value=5)),
)
def test_any_partition_runs_are_the_partitions_any_partition_gives_one_by_one(
    bursts: list[int], unavailable: set[int]
) -> None:
    """The burst path's runs (admission/burst_path.py) name the very partitions, in order,
    that as many any_partition calls would, whatever came before."""
    leaders = {p: 1 + p % 3 for p in range(6)}
    one_by_one, in_runs = router_for(leaders), router_for(leaders)
    for router in (one_by_one, in_runs):
        router.set_unavailable(set(), {(TOPIC, p) for p in unavailable})
    for count in bursts:
        expected = [one_by_one.any_partition(TOPIC) for _ in range(count)]
        runs = in_runs.any_partition_runs(TOPIC, count)
        assert [p for p, n in runs for _ in range(n)] == expected
        assert all(n >= 1 for _, n in runs)
