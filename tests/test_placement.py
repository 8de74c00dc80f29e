"""Placement and rebalance plans (``headwater.cluster.placement``): examples, and the
properties the controller relies on, checked by hypothesis."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headwater.cluster.placement import (
    BrokerLoad,
    Move,
    PlacementError,
    apply_moves,
    broker_loads,
    place_partitions,
    plan_decommission,
    plan_rebalance,
)

# -- examples ------------------------------------------------------------------------------


def test_an_empty_cluster_takes_partitions_round_robin():
    assert place_partitions(6, [3, 1, 2], {}) == [[1], [2], [3], [1], [2], [3]]


def test_the_start_point_turns_with_the_first_partition_number():
    assert place_partitions(2, [1, 2, 3], {}, first_partition=1) == [[2], [3]]


def test_a_new_empty_broker_takes_the_new_partitions():
    load = {1: BrokerLoad(partitions=5, bytes=500), 2: BrokerLoad(partitions=5, bytes=100)}
    assert place_partitions(4, [1, 2, 3], load) == [[3], [3], [3], [3]]
    # at 5 partitions each, the fewest bytes go first: broker 3 (none), then 2 (100) before 1
    assert place_partitions(8, [1, 2, 3], load)[5:] == [[3], [2], [1]]


def test_replicas_are_distinct_and_leaders_go_round():
    placed = place_partitions(3, [1, 2, 3], {}, replication_factor=3)
    assert [sorted(r) for r in placed] == [[1, 2, 3]] * 3
    assert sorted(r[0] for r in placed) == [1, 2, 3]


def test_the_leader_is_the_chosen_broker_that_leads_least():
    load = {1: BrokerLoad(partitions=2, leaders=2), 2: BrokerLoad(partitions=2, leaders=0)}
    assert place_partitions(1, [1, 2], load, replication_factor=2) == [[2, 1]]


def test_equal_input_gives_equal_placement():
    load = {b: BrokerLoad(partitions=b % 3, bytes=b * 7, leaders=b % 2) for b in range(6)}
    assert place_partitions(9, [5, 4, 3, 2, 1, 0], load, 2) == place_partitions(9, [0, 1, 2, 3, 4, 5], dict(load), 2)


@pytest.mark.parametrize(
    ("partitions", "brokers", "factor", "first", "message"),
    [
        (3, [], 1, 0, "no live brokers"),
        (0, [1], 1, 0, "at least 1 partition, not 0"),
        (2, [1, 2], 0, 0, "replication factor 0 cannot be met"),
        (2, [1, 2], 3, 0, r"replication factor 3 .* number of live brokers, 2 now \(1, 2\)"),
        (2, [1, 1], 2, 0, r"1 now \(1\)"),
        (1, [1], 1, -1, "start at 0"),
    ],
)
def test_bad_placements_are_refused(partitions, brokers, factor, first, message):
    with pytest.raises(PlacementError, match=message):
        place_partitions(partitions, brokers, {}, factor, first)
    assert issubclass(PlacementError, ValueError)


def test_a_joining_broker_gets_its_share_of_the_smallest_partitions():
    assignment = {("q", n): [1] for n in range(4)} | {("r", n): [2] for n in range(4)}
    sizes = {("q", n): 100 - n for n in range(4)} | {("r", n): 50 + n for n in range(4)}
    moves = plan_rebalance(assignment, [1, 2, 3], sizes)
    assert len(moves) == 2
    assert {m.target for m in moves} == {3}
    assert set(moves) == {Move("q", 3, 1, 3), Move("r", 0, 2, 3)}


def test_a_dead_broker_always_moves_even_when_counts_are_even():
    assignment = {("q", 0): [1], ("q", 1): [2], ("q", 2): [9]}
    assert plan_rebalance(assignment, [1, 2, 3], {}) == [Move("q", 2, 9, 3)]


def test_a_balanced_cluster_plans_nothing():
    assignment = {("q", n): [n % 3 + 1] for n in range(7)}
    assert plan_rebalance(assignment, [1, 2, 3], {}) == []


def test_a_replica_never_moves_to_a_broker_that_holds_the_partition():
    assignment = {("q", 0): [1, 2], ("q", 1): [1, 2], ("q", 2): [1, 2]}
    moves = plan_rebalance(assignment, [1, 2, 3], {})
    after = apply_moves(assignment, moves)
    assert all(len(set(r)) == 2 for r in after.values())
    assert sorted(Counter(b for r in after.values() for b in r).values()) == [2, 2, 2]


def test_decommission_moves_only_what_is_on_the_leaving_broker():
    assignment = {("q", 0): [1], ("q", 1): [1], ("q", 2): [2], ("q", 3): [2], ("q", 4): [2], ("q", 5): [3]}
    sizes = {("q", 0): 10, ("q", 1): 20}
    moves = plan_decommission(assignment, [1, 2, 3], sizes, leaving=1)
    assert moves == [Move("q", 1, 1, 3), Move("q", 0, 1, 3)]  # the largest first, each to the emptiest
    assert plan_decommission(assignment, [2, 3], sizes, leaving=1) == moves  # gone already: the same


def test_decommissioning_the_last_broker_or_a_full_replica_set_is_refused():
    with pytest.raises(PlacementError, match="only live broker"):
        plan_decommission({("q", 0): [1]}, [1], {}, leaving=1)
    with pytest.raises(PlacementError, match=r"q/0 cannot leave broker 1: every live broker holds it"):
        plan_decommission({("q", 0): [1, 2]}, [1, 2], {}, leaving=1)
    with pytest.raises(PlacementError, match="no live brokers"):
        plan_rebalance({("q", 0): [1]}, [], {})
    with pytest.raises(PlacementError, match="lists a broker twice"):
        plan_rebalance({("q", 0): [1, 1]}, [1, 2], {})


def test_moves_that_do_not_fit_the_assignment_are_refused():
    with pytest.raises(PlacementError, match="not there"):
        apply_moves({("q", 0): [1]}, [Move("q", 0, 2, 3)])
    with pytest.raises(PlacementError, match="holds the partition already"):
        apply_moves({("q", 0): [1, 2]}, [Move("q", 0, 1, 2)])


def test_loads_count_replicas_bytes_and_leaders():
    loads = broker_loads({("q", 0): [1, 2], ("q", 1): [2, 1], ("r", 0): [2]}, {("q", 0): 5, ("r", 0): 7})
    assert loads == {1: BrokerLoad(2, 5, 1), 2: BrokerLoad(3, 12, 2)}


# -- properties ----------------------------------------------------------------------------

# never a speed assertion: a loaded machine is slow, not wrong
RELAXED = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
broker_ids = st.lists(st.integers(0, 40), min_size=1, max_size=8, unique=True)


@st.composite
def placements(draw):
    brokers = draw(broker_ids)
    factor = draw(st.integers(1, len(brokers)))
    load = draw(
        st.dictionaries(
            st.sampled_from(brokers),
            st.builds(BrokerLoad, st.integers(0, 50), st.integers(0, 10**9), st.integers(0, 50)),
        )
    )
    return draw(st.integers(1, 60)), brokers, load, factor, draw(st.integers(0, 100))


@given(placements())
@RELAXED
def test_every_partition_gets_factor_distinct_live_brokers(case):
    partitions, brokers, load, factor, first = case
    placed = place_partitions(partitions, brokers, load, factor, first)
    assert len(placed) == partitions
    for replicas in placed:
        assert len(replicas) == factor == len(set(replicas))
        assert set(replicas) <= set(brokers)
    assert placed == place_partitions(partitions, list(reversed(brokers)), dict(load), factor, first)


@given(broker_ids, st.integers(1, 80), st.data())
@RELAXED
def test_placement_into_an_empty_cluster_is_balanced_within_one(brokers, partitions, data):
    factor = data.draw(st.integers(1, len(brokers)))
    placed = place_partitions(partitions, brokers, {}, factor)
    held = Counter(b for r in placed for b in r)
    counts = [held[b] for b in brokers]
    assert max(counts) - min(counts) <= 1
    leaders = Counter(r[0] for r in placed)
    # the leader is chosen among the replicas only, so leaders may spread a little less evenly
    assert max(leaders[b] for b in brokers) - min(leaders[b] for b in brokers) <= 2


@st.composite
def clusters(draw, factor_max: int = 3):
    """An assignment over brokers some of which are gone, and the live brokers."""
    live = draw(broker_ids)
    gone = draw(st.lists(st.integers(41, 45), max_size=3, unique=True))
    everyone = live + gone
    factor = draw(st.integers(1, min(factor_max, len(live))))
    queues = draw(st.dictionaries(st.sampled_from("abcd"), st.integers(1, 12), min_size=0, max_size=3))
    assignment = {}
    for q, count in queues.items():
        for n in range(count):
            assignment[(q, n)] = draw(
                st.lists(st.sampled_from(everyone), min_size=factor, max_size=factor, unique=True)
            )
    sizes = {key: draw(st.integers(0, 10**6)) for key in assignment}
    return assignment, live, sizes


def _counts(assignment, live):
    held = Counter(b for r in assignment.values() for b in r)
    return [held[b] for b in live]


@given(clusters(factor_max=1))
@settings(RELAXED, max_examples=300)
def test_a_rebalance_balances_with_the_fewest_moves(cluster):
    assignment, live, sizes = cluster
    moves = plan_rebalance(assignment, live, sizes)
    assert all(m.target in live for m in moves)
    after = apply_moves(assignment, moves)
    assert all(b in live for r in after.values() for b in r)
    counts = _counts(after, live)
    mean = sum(counts) / len(live)
    assert all(abs(c - mean) < 1 for c in counts)
    assert len({(m.queue, m.partition) for m in moves}) == len(moves)  # a replica moves once at most
    # the fewest: a replica off a gone broker must move, and beyond those, every replica a
    # broker holds over the rounded-up mean must leave it
    if not any(b not in live for r in assignment.values() for b in r):
        high = -(-sum(counts) // len(live))
        low = sum(counts) // len(live)
        before = _counts(assignment, live)
        assert len(moves) == max(sum(max(c - high, 0) for c in before), sum(max(low - c, 0) for c in before))
    assert plan_rebalance(after, live, sizes) == []  # balanced now: nothing more to do


@given(clusters())
@RELAXED
def test_a_rebalance_with_replicas_keeps_them_distinct_and_live(cluster):
    assignment, live, sizes = cluster
    moves = plan_rebalance(assignment, live, sizes)
    after = apply_moves(assignment, moves)
    for key, replicas in after.items():
        assert len(set(replicas)) == len(replicas) == len(assignment[key])
        assert set(replicas) <= set(live)
    assert plan_rebalance(assignment, list(reversed(live)), dict(sizes)) == moves


@given(clusters(), st.data())
@RELAXED
def test_a_decommission_empties_the_leaving_broker_and_nothing_else_moves(cluster, data):
    assignment, live, sizes = cluster
    leaving = data.draw(st.sampled_from(live))
    staying = set(live) - {leaving}
    stuck = [r for r in assignment.values() if leaving in r and staying <= set(r)]
    if not staying or stuck:  # nowhere to go: refused, never a partial plan
        with pytest.raises(PlacementError):
            plan_decommission(assignment, live, sizes, leaving)
        return
    moves = plan_decommission(assignment, live, sizes, leaving)
    assert all(m.source == leaving and m.target in staying for m in moves)
    after = apply_moves(assignment, moves)
    assert not any(leaving in r for r in after.values())
    assert len(moves) == sum(leaving in r for r in assignment.values())
