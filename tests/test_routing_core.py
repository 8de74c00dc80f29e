"""The client's routing core without a broker (headwater/client/core/routing.py): the table
made from a METADATA answer, the refresh's rate limit, and how several leaders' answers
make one."""

from __future__ import annotations

import doctest

import pytest

import headwater.client.core.routing as routing
from headwater.client.core.routing import (
    HOME,
    REFRESH,
    RefreshGate,
    RoutedCall,
    RoutingTable,
    merge_describe,
    merge_groups,
    merge_key_lookups,
    merge_pages,
    parse_bootstrap,
)
from headwater.client.core.subscribers import merge_subscribers
from headwater.errors import (
    InvalidArgumentError,
    NotCoordinatorError,
    NotLeaderError,
    OutcomeUnknownError,
    QueueNotFoundError,
    UnavailableError,
)
from headwater.model.batch import broker_prefix, decode_header, encode_batch
from headwater.model.cluster import (
    ClusterMetadata,
    coordinator_partition,
    keyed_coordinator_name,
)
from headwater.model.config import PartitionInfo, QueueConfig, QueueInfo, QueuePage
from headwater.model.groups import GroupSummary
from headwater.model.subscription import SubscriberInfo
from tests.support.cluster_metadata import cluster_metadata


def test_the_doctests_hold():
    assert doctest.testmod(routing, optionflags=doctest.ELLIPSIS).failed == 0


def test_the_table_names_each_partitions_leader_and_each_queue_id():
    table = RoutingTable(cluster_metadata({"orders": [1, 2, 3, 1, 2, 3], "audit": [2]}))
    assert [table.leader("orders", p).address for p in range(6)] == [f"127.0.0.1:{7070 + b}" for b in (1, 2, 3) * 2]
    assert table.leaders_of("orders") == {1: [0, 3], 2: [1, 4], 3: [2, 5]}
    assert table.partition_leaders("audit") == {0: 2}
    assert (table.queue_of(1000), table.queue_of(1001), table.queue_of(5)) == ("orders", "audit", None)
    assert table.knows("orders") and table.knows("orders", 5)
    assert not table.knows("orders", 6) and not table.knows("orders", -1) and not table.knows("nope")
    assert table.leaders_of("nope") == {}


def test_a_partition_without_a_leader_or_unknown_is_a_retriable_refusal():
    table = RoutingTable(cluster_metadata({"q": [1, -1, 9]}))  # 9: a broker the answer does not list
    assert table.leader("q", 0).broker_id == 1
    for partition in (1, 2, 3):
        with pytest.raises(NotLeaderError, match=rf"no leader of q\[{partition}\]") as caught:
            table.leader("q", partition)
        assert caught.value.retriable
    with pytest.raises(NotLeaderError, match=r"no leader of other\[0\]"):
        table.leader("other", 0)
    assert table.leaders_of("q") == {1: [0]}  # the leaderless are nobody's


def test_a_refresh_is_due_when_stale_and_at_most_once_per_interval():
    gate = RefreshGate(interval_s=0.1)
    assert not gate.due(0.0) and gate.wait_s(0.0) == 0  # fresh: no need; never asked: no wait
    gate.mark_stale()
    assert gate.due(0.0)
    gate.refreshed(now_s=1.0)
    assert not gate.stale and not gate.due(5.0)
    for _ in range(100):  # a burst of refusals is one refresh
        gate.mark_stale()
    assert not gate.due(1.05) and gate.wait_s(1.05) == pytest.approx(0.05)
    assert gate.due(1.1)
    gate.refreshed(now_s=1.1)
    gate.mark_stale()
    assert gate.wait_s(1.15) == pytest.approx(0.05) and gate.wait_s(3.0) == 0


def _info(name: str, ends: list[int], starts: list[int] | None = None, created_ms: int = 0) -> QueueInfo:
    starts = starts or [0] * len(ends)
    return QueueInfo(
        name=name,
        queue_id=1000,
        config=QueueConfig(),
        enabled=True,
        created_ms=created_ms,
        partitions=[PartitionInfo(p, s, e) for p, (s, e) in enumerate(zip(starts, ends, strict=True))],
    )


def test_describe_takes_each_partition_from_its_leader_and_the_rest_from_the_base():
    base = _info("q", [0, 0, 0, 0], created_ms=7)
    answers = {1: _info("q", [5, 0, 0, 9]), 2: _info("q", [0, 6, 0, 0], starts=[0, 2, 0, 0])}
    leaders = {0: 1, 1: 2, 2: 3, 3: 1}  # broker 3 did not answer: partition 2 keeps the base's
    merged = merge_describe(base, answers, leaders)
    assert [(p.start_offset, p.end_offset) for p in merged.partitions] == [(0, 5), (2, 6), (0, 0), (0, 9)]
    assert [p.online for p in merged.partitions] == [True, True, False, True]  # its offsets are not known
    assert merged.offline == [2] and merged.message_count == 5 + 4 + 9
    assert (merged.name, merged.created_ms, merged.config) == ("q", 7, base.config)


def test_create_queue_is_answered_once_every_broker_has_the_queue():
    """The broker asked waits only for its own copy; a send right after to a leader that
    had none yet was refused with QueueNotFoundError (seen on a loaded cluster)."""
    from headwater.client.core.effects import PLANS, Call, Fanout, RoutedState, Sleep

    class Home:
        address = "127.0.0.1:7071"

    s = RoutedState(Home(), cluster_metadata({}), bootstrap=[Home.address])
    created = _info("q", [0, 0])
    plan = PLANS["create_queue"](s, "q", QueueConfig(partitions=2))
    assert next(plan) == Call(HOME, "create_queue", ("q", QueueConfig(partitions=2)), {})
    asked = plan.send(created)
    assert isinstance(asked, Fanout) and sorted(asked.asks) == [1, 2, 3]
    # broker 3 has no copy yet: not done, asked again after a pause
    assert isinstance(plan.send({1: created, 2: created, 3: QueueNotFoundError("no q")}), Sleep)
    assert isinstance(plan.send(None), Fanout)
    with pytest.raises(StopIteration) as done:
        plan.send({1: created, 2: created, 3: created})
    assert done.value.value == created


def test_pages_merge_queue_by_queue():
    base = QueuePage(queues=[_info("a", [0, 0]), _info("b", [0])], next_after="b")
    pages = {1: QueuePage(queues=[_info("a", [3, 0]), _info("b", [0])]), 2: QueuePage(queues=[_info("a", [0, 4])])}
    merged = merge_pages(base, pages, {"a": {0: 1, 1: 2}, "b": {0: 2}})
    assert [[p.end_offset for p in q.partitions] for q in merged.queues] == [[3, 4], [0]]
    assert merged.next_after == "b"


def _batch(partition: int, timestamp_ms: int, body: bytes) -> bytes:
    """A batch as a broker stores it: the broker's prefix (partition, append time), then the
    producer's bytes."""
    raw = bytes(encode_batch([body]))
    return broker_prefix(len(raw) - 4, 1000, partition, 0, timestamp_ms) + raw[40:]


def test_key_lookups_merge_oldest_first_up_to_the_limit_dropping_partitions_led_elsewhere():
    b1 = [_batch(0, 100, b"a"), _batch(0, 300, b"c")]
    b2 = [_batch(1, 200, b"b"), _batch(1, 400, b"d"), _batch(0, 50, b"stale copy of 0")]
    assert [decode_header(b).partition for b in b2] == [1, 1, 0]
    leaders = {0: 1, 1: 2}
    merged = merge_key_lookups({1: b1, 2: b2}, leaders, limit=10)
    assert merged == [b1[0], b2[0], b1[1], b2[1]]
    assert merge_key_lookups({1: b1, 2: b2}, leaders, limit=3) == merged[:3]
    assert merge_key_lookups({}, leaders, limit=3) == []


def test_the_bootstrap_list():
    assert parse_bootstrap("h1:1") == ["h1:1"]
    assert parse_bootstrap(" h1:1 , h2:2,,h1:1") == ["h1:1", "h2:2"]
    assert parse_bootstrap(["h1:1", "h2:2"]) == ["h1:1", "h2:2"]
    for bad in ("", " , ", []):
        with pytest.raises(InvalidArgumentError, match="no broker address"):
            parse_bootstrap(bad)
    with pytest.raises(InvalidArgumentError, match="is a str"):
        parse_bootstrap([7070])  # type: ignore[list-item]  # the wrong type on purpose


def test_a_group_goes_to_the_leader_of_its_coordinator_partition():
    table = RoutingTable(cluster_metadata({}, coordinators=[1, 2, 3, 1]))
    groups = [f"g{i}" for i in range(40)]
    for g in groups:
        expected = [1, 2, 3, 1][coordinator_partition(g, 4)]
        assert table.coordinator(g).address == f"127.0.0.1:{7070 + expected}"
    assert {table.coordinator(g).broker_id for g in groups} == {1, 2, 3}


def test_no_coordinators_means_the_bootstrap_broker_and_a_dead_one_a_retriable_refusal():
    assert RoutingTable(cluster_metadata({})).coordinator("g") is None  # an older broker: no coordinators
    table = RoutingTable(cluster_metadata({}, coordinators=[-1, 9]))  # none now, and a broker not listed
    for g in [f"g{i}" for i in range(10)]:
        with pytest.raises(NotCoordinatorError, match=f"no live coordinator of group '{g}'"):
            table.coordinator(g)


def test_a_group_call_is_sent_again_after_a_refusal_and_once_after_an_outage():
    call = RoutedCall(resend_safe=True)
    assert call.again(NotCoordinatorError("moved"), "a:1", late=False)
    assert call.again(NotCoordinatorError("moved"), "a:1", late=False)  # refusals: while time is left
    assert not call.again(NotCoordinatorError("moved"), "a:1", late=True)
    assert call.again(UnavailableError("down"), "a:1", late=False)
    assert call.again(UnavailableError("down"), "b:2", late=False)  # the table named another since
    assert not call.again(UnavailableError("down"), "b:2", late=False)  # the same one out of reach twice
    once = RoutedCall(resend_safe=False)  # a join: not sent twice after it may have arrived
    assert once.again(NotCoordinatorError("moved"), HOME, late=False)
    assert not once.again(UnavailableError("down"), HOME, late=False)
    bootstrap = RoutedCall(resend_safe=True)
    assert bootstrap.again(UnavailableError("down"), HOME, late=False)
    assert not bootstrap.again(UnavailableError("down"), HOME, late=False)
    assert not bootstrap.again(OutcomeUnknownError("sent, no answer"), "a:1", late=False)
    assert not bootstrap.again(InvalidArgumentError("bad"), "a:1", late=False)  # an answer, not a routing matter


def test_a_partition_call_refreshes_once_for_what_the_table_does_not_know():
    table = RoutingTable(cluster_metadata({}))  # knows no queue
    call = RoutedCall(resend_safe=True)
    assert call.leader(table, False, "q", 0) is REFRESH
    assert call.leader(table, False, "q", 0) is HOME  # asked anew, still unknown: the broker's own words
    known = RoutingTable(cluster_metadata({"orders": [1, 2]}))
    name = "orders"
    fresh = RoutedCall(resend_safe=True)
    assert fresh.leader(known, True, name, 0) is REFRESH  # stale: ask first
    assert fresh.leader(known, False, name, 0) == known.leader(name, 0).address
    assert not fresh.again(QueueNotFoundError("gone"), "a:1", late=False)  # asked anew already: it is gone
    old = RoutedCall(resend_safe=True)
    assert old.leader(known, False, name, 1) == known.leader(name, 1).address
    assert old.again(QueueNotFoundError("gone?"), "a:1", late=False)  # once: the table may be old
    assert not old.again(QueueNotFoundError("gone"), "a:1", late=False)
    assert fresh.again(NotLeaderError("moved"), "a:1", late=False) and RoutedCall.stales(NotLeaderError("moved"))
    assert not RoutedCall.stales(OutcomeUnknownError("?")) and not RoutedCall.stales(InvalidArgumentError("bad"))


def test_a_group_call_waits_for_a_coordinator_until_its_deadline():
    table = RoutingTable(cluster_metadata({}, coordinators=[-1]))  # no live coordinator now
    call = RoutedCall(resend_safe=True)

    def locate(t):
        return t.coordinator("g")

    assert call.coordinator(table, False, locate, late=False) is REFRESH
    with pytest.raises(NotCoordinatorError):
        call.coordinator(table, False, locate, late=True)
    assert (
        RoutedCall(resend_safe=True).coordinator(RoutingTable(cluster_metadata({})), False, locate, late=False) is HOME
    )


def test_list_groups_merge_each_group_once_the_coordinators_answer_first():
    def s(group, members=0, mode=None, queues=()):
        return GroupSummary(group=group, state="stable", mode=mode, members=members, queues=list(queues))

    answers = {
        1: [s("a", 1, "clustering"), s("k", 2, "keyed", ["q"]), s("sh", 0, "shared", ["q"])],
        2: [s("a", 3, "clustering"), s("b", 1, "broadcast"), s("k", 2, "keyed", ["q"])],
        3: [s("k", 5, "keyed", ["r"]), s("sh", 0, "shared", ["q"])],
    }
    coordinators = {"a": 2, "b": 2}
    merged = merge_groups(answers, coordinators.get)
    assert [(g.group, g.mode, g.members, tuple(g.queues)) for g in merged] == [
        ("a", "clustering", 3, ()),  # broker 1 gave it up lately: broker 2 coordinates it
        ("b", "broadcast", 1, ()),
        ("k", "keyed", 2, ("q",)),  # one keyed group per (name, queues)
        ("k", "keyed", 5, ("r",)),
        ("sh", "shared", 0, ("q",)),
    ]
    assert merge_groups({1: [s("a", 1)], 3: [s("a", 2)]}, lambda g: None)[0].members == 1  # no coordinator: lowest id


def test_a_keyed_group_goes_to_the_leader_of_its_keyed_coordinator_partition():
    md = cluster_metadata({}, coordinators=[3, 3, 3, 3])
    keyed = ClusterMetadata(
        cluster_id=md.cluster_id, controller=1, brokers=md.brokers, queues=[], keyed_coordinators=[1, 2, 3, 1]
    )
    table = RoutingTable(keyed)
    for g in [f"g{i}" for i in range(40)]:
        expected = [1, 2, 3, 1][coordinator_partition(keyed_coordinator_name("orders", g), 4)]
        assert table.keyed_coordinator("orders", g).broker_id == expected
    # by queue and group: one group name on two queues is two groups, placed apart
    assert len({table.keyed_coordinator(q, "g").broker_id for q in ("a", "b", "c", "d", "e", "f")}) > 1
    assert RoutingTable(md).keyed_coordinator("orders", "g") is None  # none made yet, or an older broker
    dead = ClusterMetadata(cluster_id="c", controller=1, brokers=md.brokers, queues=[], keyed_coordinators=[9])
    with pytest.raises(NotCoordinatorError, match="no live coordinator of keyed group 'g' of 'orders'"):
        RoutingTable(dead).keyed_coordinator("orders", "g")


def test_list_groups_takes_a_keyed_group_from_its_coordinator():
    def k(members, queue="q"):
        return GroupSummary(group="k", state="active", mode="keyed", members=members, queues=[queue])

    answers = {1: [k(2)], 2: [k(3), k(4, "r")], 3: [k(5, "r")]}
    where = {("q", "k"): 2, ("r", "k"): 3}
    merged = merge_groups(answers, lambda g: None, lambda q, g: where.get((q, g)))
    assert [(g.queues, g.members) for g in merged] == [(["q"], 3), (["r"], 5)]
    assert [g.members for g in merge_groups(answers, lambda g: None)] == [2, 4]  # no coordinators: lowest id


def test_a_subscriber_goes_to_the_leader_of_its_subscriber_coordinator_partition():
    md = cluster_metadata({}, coordinators=[3, 3, 3, 3])
    subs = ClusterMetadata(
        cluster_id=md.cluster_id, controller=1, brokers=md.brokers, queues=[], subscriber_coordinators=[1, 2, 3, 1]
    )
    table = RoutingTable(subs)
    for s in [f"s{i}" for i in range(40)]:
        expected = [1, 2, 3, 1][coordinator_partition(keyed_coordinator_name("orders", s), 4)]
        assert table.subscriber_coordinator("orders", s).broker_id == expected
    assert table.keyed_coordinator("orders", "s0") is None  # the kinds' lists are apart
    assert RoutingTable(md).subscriber_coordinator("orders", "s") is None  # none made yet, or an older broker
    dead = ClusterMetadata(cluster_id="c", controller=1, brokers=md.brokers, queues=[], subscriber_coordinators=[9])
    with pytest.raises(NotCoordinatorError, match="no live coordinator of subscriber 's' of 'orders'"):
        RoutingTable(dead).subscriber_coordinator("orders", "s")


def test_list_subscribers_takes_each_from_its_coordinator():
    def s(queue, name, at):
        return SubscriberInfo(queue=queue, name=name, checkpoints={0: at})

    answers = {1: [s("q", "a", 1), s("r", "a", 7)], 2: [s("q", "a", 2), s("q", "b", 3)], 3: [s("q", "b", 4)]}
    where = {("q", "a"): 2, ("q", "b"): 3}
    merged = merge_subscribers(answers, lambda q, n: where.get((q, n)))
    assert [(i.queue, i.name, i.checkpoints[0]) for i in merged] == [("q", "a", 2), ("q", "b", 4), ("r", "a", 7)]
    lowest = merge_subscribers(answers, lambda q, n: None)  # no coordinators: the lowest id's answer
    assert [i.checkpoints[0] for i in lowest] == [1, 3, 7]
