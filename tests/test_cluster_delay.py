"""Delayed messages on a cluster move with their partition (docs/design/delay.md, "On a
cluster"): real brokers and a real ZooKeeper. Messages due in a few seconds are sent to
every partition, then partitions move (a rebalance onto a new broker, a decommission): each
message arrives exactly once, on the partition's new leader, not before its time; one
cancelled after the move by its original id never arrives; its id answers lookups on the new
leader; delay_stats adds up every broker's. A move rolled back (its target killed mid-copy)
leaves them to the source, which delivers each once. The pieces without a cluster:
tests/test_delay_handoff.py."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

import headwater
import headwater.aio
from headwater.errors import MessageNotFoundError, NotLeaderError
from headwater.model.message import MessageId
from tests.support.cluster import Cluster, eventually, move_phases, moves_left, recorded_leaders

QUEUE = "later"
PARTITIONS = 4
PER_PARTITION = 3


@pytest.fixture
def cluster(zk_server, tmp_path) -> Iterator[Cluster]:
    c = Cluster(zk_server, tmp_path, 2, "--set", "moves_running_max=4")
    try:
        yield c
    finally:
        c.stop()


def leaders(cluster: Cluster, via: int) -> dict[int, int]:
    with cluster.connect(via) as hw:
        return {p.partition: p.leader for p in hw.admin.cluster_metadata([QUEUE]).queue(QUEUE).partitions}


def bootstrap(cluster: Cluster) -> str:
    return ",".join(cluster.address(i) for i, b in sorted(cluster.brokers.items()) if b.alive())


def start(cluster: Cluster) -> None:
    cluster.controller()
    with cluster.connect(1) as hw:
        hw.admin.create_queue(QUEUE, partitions=PARTITIONS, ttl_s=None)
    eventually(lambda: all(len(leaders(cluster, i)) == PARTITIONS for i in cluster.brokers), what="the queue")


def join(cluster: Cluster, broker_id: int) -> None:
    cluster.start(broker_id)
    want = sorted(i for i, b in cluster.brokers.items() if b.alive())
    eventually(lambda: cluster.status(1)["brokers"] == want, what=f"broker {broker_id} joining")


def send_delayed(cluster: Cluster, due_in_s: float, tag: str) -> dict[MessageId, tuple[int, bytes]]:
    """PER_PARTITION messages to each partition, due ``due_in_s`` from now: id -> (partition, body)."""
    due_ms = int((time.time() + due_in_s) * 1000)
    sent = {}
    with headwater.connect(bootstrap(cluster)) as hw:
        for p in range(PARTITIONS):
            for i in range(PER_PARTITION):
                body = f"{tag}-{p}-{i}".encode()
                mid = hw.send(QUEUE, body, partition=p, deliver_at=due_ms + i * 100)
                assert mid.is_delayed
                sent[mid] = (p, body)
    return sent


def stored(cluster: Cluster, broker_id: int, p: int) -> list[headwater.Record]:
    with cluster.connect(broker_id) as hw:
        return list(hw.scanner(QUEUE, partitions=[p]))


def delivered_totals(cluster: Cluster) -> dict[int, int]:
    out = {}
    for i, b in cluster.brokers.items():
        if b.alive():
            with cluster.connect(i) as hw:
                out[i] = hw.delay_stats().delivered_total
    return out


def check_arrived_once(
    cluster: Cluster, expected: dict[int, set[bytes]], totals_before: dict[int, int], new: int | None = None
) -> None:
    """Each partition on its final leader holds exactly ``expected``, once each, none
    before its time; the brokers' delivered totals grew by exactly that many (``new``, if
    some were delivered before): nobody delivered one elsewhere, to a copy then dropped."""
    final = recorded_leaders(cluster, QUEUE)  # a broker's view may lag ZooKeeper a moment

    def complete() -> bool:
        return all(len(stored(cluster, final[p], p)) >= len(want) for p, want in expected.items())

    eventually(complete, timeout_s=60, what="every delayed message delivered")
    time.sleep(1.5)  # a second delivery, if any, would come now
    for p, want in expected.items():
        recs = stored(cluster, final[p], p)
        assert sorted(r.body for r in recs) == sorted(want), f"partition {p} on broker {final[p]}"
        assert all(r.scheduled_ms is not None and r.timestamp_ms >= r.scheduled_ms for r in recs), "delivered early"
    grown = {i: n - totals_before.get(i, 0) for i, n in delivered_totals(cluster).items()}
    assert sum(grown.values()) == (sum(len(w) for w in expected.values()) if new is None else new), grown


def test_delayed_messages_move_with_a_rebalance_and_keep_their_ids(cluster):
    start(cluster)
    join(cluster, 3)
    totals = delivered_totals(cluster)
    sent = send_delayed(cluster, 15, "r")
    before = leaders(cluster, 1)
    with headwater.connect(bootstrap(cluster)) as hw:
        assert hw.delay_stats().pending_messages == len(sent)  # two brokers' schedules, added up
        moves = hw.admin.rebalance()
    assert moves and {m.target for m in moves} == {3}
    eventually(lambda: moves_left(cluster) == 0, timeout_s=60, what="the moves finishing")
    moved = {m.partition for m in moves}
    # broker 2 learns of the moves from ZooKeeper's watches, a moment after they finish
    eventually(
        lambda: {p for p, b in leaders(cluster, 2).items() if b != before[p]} == moved,
        what="broker 2's metadata naming the moved partitions' new leader",
    )
    p = min(moved)
    ids = [mid for mid, (q, _) in sent.items() if q == p]
    with headwater.connect(bootstrap(cluster)) as hw:
        assert hw.get(ids[0]).body == sent[ids[0]][1]  # the id its producer got, on broker 3
        hw.cancel(ids[1])  # after the move, by its original id
        with pytest.raises(MessageNotFoundError, match="cancelled"):
            hw.get(ids[1])
        # the source forgets what it handed off once ZooKeeper shows the new owner
        eventually(lambda: hw.delay_stats().pending_messages == len(sent) - 1, what="the summed stats")

    async def stats_async() -> int:  # the asyncio client's twin adds them up too
        async with await headwater.aio.connect(bootstrap(cluster)) as hw:
            return (await hw.delay_stats()).pending_messages

    assert asyncio.run(stats_async()) == len(sent) - 1
    with cluster.connect(3) as on_3:
        assert on_3.delay_stats().pending_messages == PER_PARTITION * len(moved) - 1
        assert on_3.get(ids[2]).body == sent[ids[2]][1]
    with cluster.connect(before[p]) as source, pytest.raises(NotLeaderError):
        source.get(ids[0])  # not its partition any more: the client would go to broker 3
    expected: dict[int, set[bytes]] = {q: set() for q in range(PARTITIONS)}
    for mid, (q, body) in sent.items():
        if mid != ids[1]:
            expected[q].add(body)
    check_arrived_once(cluster, expected, totals)


def test_delayed_messages_move_off_a_decommissioned_broker(cluster):
    join(cluster, 3)
    start(cluster)
    totals = delivered_totals(cluster)
    sent = send_delayed(cluster, 12, "d")
    leaving = 1
    on_leaving = [p for p, b in leaders(cluster, 2).items() if b == leaving]
    assert on_leaving
    with headwater.connect(bootstrap(cluster)) as hw:
        hw.admin.decommission(leaving)
    eventually(lambda: moves_left(cluster) == 0, timeout_s=60, what="the decommission")
    eventually(lambda: leaving not in leaders(cluster, 2).values(), what="broker 2's metadata without the leaver")
    eventually(lambda: cluster_pending(cluster, leaving) == 0, what="the leaving broker's schedule empty")
    expected: dict[int, set[bytes]] = {q: set() for q in range(PARTITIONS)}
    for q, body in sent.values():
        expected[q].add(body)
    check_arrived_once(cluster, expected, totals)


def cluster_pending(cluster: Cluster, broker_id: int) -> int:
    with cluster.connect(broker_id) as hw:
        return hw.delay_stats().pending_messages


@pytest.mark.slow  # a fault test of ~25 s; the rebalance and decommission tests run by default
def test_a_move_rolled_back_leaves_its_delayed_messages_to_the_source_which_delivers_each_once(cluster):
    start(cluster)
    join(cluster, 3)
    totals = delivered_totals(cluster)
    sent = send_delayed(cluster, 8, "b")
    before = leaders(cluster, 1)
    cluster.brokers[3].pause()  # its copy waits: the move is mid-copy when it dies
    with headwater.connect(bootstrap(cluster).rsplit(",", 1)[0]) as hw:
        (move,) = hw.admin.rebalance()
    eventually(
        lambda: move_phases(cluster, QUEUE).get(move.partition, ("", 0))[1] == 3 or not moves_left(cluster),
        what="the move to broker 3 under way (or rolled back already)",
    )
    cluster.brokers[3].kill()
    eventually(lambda: moves_left(cluster) == 0, timeout_s=30, what="the rollback")
    assert leaders(cluster, 1) == before
    expected: dict[int, set[bytes]] = {q: set() for q in range(PARTITIONS)}
    for q, body in sent.values():
        expected[q].add(body)
    check_arrived_once(cluster, expected, totals)

    # the target back: the partition moves to it after all, with what is pending now
    join(cluster, 3)
    totals = delivered_totals(cluster)
    later = send_delayed(cluster, 12, "a")
    with headwater.connect(bootstrap(cluster)) as hw:
        assert [m.target for m in hw.admin.rebalance()] == [3]
    eventually(lambda: moves_left(cluster) == 0, timeout_s=60, what="the move done")
    for q, body in later.values():
        expected[q].add(body)
    check_arrived_once(cluster, expected, totals, new=len(later))
