"""Shared groups on a cluster (docs/shared-groups.md, "On a cluster"): a group's state for
a partition lives on its leader. Three real brokers and a real ZooKeeper, shared by the
module: sync and asyncio shared consumers, bootstrapped from one broker, receive every
message of a queue spread over the three, ack, nack, extend, dead-letter to the cluster's
``<queue>.dlq``, and describe every partition."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import pytest

import headwater
import headwater.aio
from headwater.client.transport.routing import RoutedService
from headwater.errors import NotLeaderError
from headwater.model.shared import LeaseId
from tests.support.cluster import eventually

PARTITIONS = 6
PER_PARTITION = 20


def _queue(hw: headwater.Client, name: str) -> list[headwater.MessageId]:
    """A queue of PARTITIONS over the three brokers, PER_PARTITION messages in each."""
    hw.admin.create_queue(name, partitions=PARTITIONS)
    ids = []
    for p in range(PARTITIONS):
        ids.extend(hw.send_batch(name, [f"{name}-{p}-{i}".encode() for i in range(PER_PARTITION)], partition=p))
    md = hw.admin.cluster_metadata([name]).queue(name)
    assert Counter(p.leader for p in md.partitions) == {1: 2, 2: 2, 3: 2}
    return ids


def _receive_all(c, n: int, deadline_s: float = 30.0) -> list:
    got: list = []
    deadline = time.monotonic() + deadline_s
    while len(got) < n and time.monotonic() < deadline:
        got.extend(c.receive(max_messages=50, timeout_ms=500))
    return got


def test_a_sync_member_receives_every_partition_once_and_acks_on_each_leader(cluster):
    with headwater.connect(cluster.address(1)) as hw:
        assert isinstance(hw.service, RoutedService)
        ids = _queue(hw, "jobs")
        c = hw.shared_consumer("workers", "jobs", visibility_timeout_ms=60_000)
        got = _receive_all(c, len(ids))
        assert sorted(d.message_id for d in got) == sorted(ids)  # each once, from every broker
        c.ack(got)
        assert c.receive(max_messages=50, timeout_ms=300) == []  # nothing more: all acked in time
        info = c.describe()
        assert [p.partition for p in info.partitions] == list(range(PARTITIONS))
        assert all(p.committed_offset == p.end_offset == PER_PARTITION and p.leased == 0 for p in info.partitions)
        c.close()
        shared = [g for g in hw.service.list_groups() if g.mode == "shared" and g.group == "workers"]
        assert [g.queues for g in shared] == [["jobs"]]  # listed once, though three brokers keep it


def test_a_broker_refuses_leases_of_partitions_it_does_not_lead(cluster):
    with headwater.connect(cluster.address(2)) as hw:
        ids = _queue(hw, "refusals")
        c = hw.shared_consumer("g", "refusals", visibility_timeout_ms=60_000)
        got = _receive_all(c, len(ids))
        assert len(got) == len(ids)
        leaders = {p.partition: p.leader for p in hw.admin.cluster_metadata(["refusals"]).queue("refusals").partitions}
        mixed = [d.lease_id for d in got if leaders[d.message_id.partition] != 1][:3] + [
            d.lease_id for d in got if leaders[d.message_id.partition] == 1
        ][:3]
        with cluster.connect(1) as one:
            with pytest.raises(NotLeaderError, match="does not lead refusals"):
                one.service.shared_ack("g", "refusals", c.member, mixed)  # refused whole
        c.ack(got)  # nothing of it was applied: every lease is still good
        c.close()


def test_nack_redelivers_and_attempts_used_up_go_to_the_clusters_dead_letter_queue(cluster):
    with headwater.connect(cluster.address(3)) as hw:
        ids = _queue(hw, "flaky")
        c = hw.shared_consumer("g", "flaky", visibility_timeout_ms=60_000, max_attempts=2, backoff_ms=0)
        first = _receive_all(c, len(ids))
        assert len(first) == len(ids) and {d.attempt for d in first} == {1}
        c.extend(first, 120_000)  # extend, on each lease's leader
        c.nack(first, reason="try again", delay_ms=0)
        second = _receive_all(c, len(ids))
        assert sorted(d.message_id for d in second) == sorted(ids) and {d.attempt for d in second} == {2}
        c.nack(second, reason="broken", delay_ms=0)  # attempts used up: dead letters
        assert c.receive(max_messages=50, timeout_ms=300) == []
        info = c.describe()
        assert sum(p.dead_lettered for p in info.partitions) == len(ids)
        c.close()
        dlq = eventually(lambda: hw.admin.describe_queue("flaky.dlq"), what="flaky.dlq on the cluster")
        assert len(dlq.partitions) == PARTITIONS
        for i in (1, 2, 3):  # made by the three brokers' dead letters at once: one queue
            with cluster.connect(i) as one:
                assert eventually(lambda one=one: one.admin.describe_queue("flaky.dlq")).queue_id == dlq.queue_id
        letters = eventually(
            lambda: (r := list(hw.scanner("flaky.dlq"))) and len(r) == len(ids) and r, what="every dead letter"
        )
        assert sorted(r.body for r in letters) == sorted(f"flaky-{p}-{i}".encode() for p in range(6) for i in range(20))
        for r in letters:
            assert r.message_id.partition == int(r.body.split(b"-")[1])  # partition p's to dlq partition p


def test_an_asyncio_member_receives_acks_and_describes_every_partition(cluster):
    with headwater.connect(cluster.address(1)) as hw:
        ids = _queue(hw, "aio-jobs")

    async def main() -> None:
        hw = await headwater.aio.connect(cluster.address(2))
        try:
            c = hw.shared_consumer("workers", "aio-jobs", visibility_timeout_ms=60_000)
            got: list = []
            deadline = time.monotonic() + 30
            while len(got) < len(ids) and time.monotonic() < deadline:
                got.extend(await c.receive(max_messages=50, timeout_ms=500))
            assert sorted(d.message_id for d in got) == sorted(ids)
            await c.nack(got[:5], delay_ms=0)
            again = []
            while len(again) < 5 and time.monotonic() < deadline:
                again.extend(await c.receive(max_messages=50, timeout_ms=500))
            assert sorted(d.message_id for d in again) == sorted(d.message_id for d in got[:5])
            await c.ack(got[5:] + again)
            assert await c.receive(max_messages=50, timeout_ms=300) == []
            info = await c.describe()
            assert [p.committed_offset for p in info.partitions] == [PER_PARTITION] * PARTITIONS
            listed = [g for g in await hw.service.list_groups() if g.group == "workers" and g.queues == ["aio-jobs"]]
            assert [g.mode for g in listed] == ["shared"]  # once, though three brokers keep it
            await c.close()
        finally:
            await hw.close()

    asyncio.run(main())


def test_a_receive_returns_when_one_broker_has_messages_not_after_the_slowest_poll(cluster):
    with headwater.connect(cluster.address(1)) as hw:
        hw.admin.create_queue("sparse", partitions=PARTITIONS)
        c = hw.shared_consumer("g", "sparse", visibility_timeout_ms=60_000)
        assert c.receive(timeout_ms=0) == []
        mid = hw.send("sparse", b"only one", partition=4)
        started = time.monotonic()
        got = c.receive(max_messages=10, timeout_ms=60_000)  # the other leaders hold their polls
        assert [d.message_id for d in got] == [mid]
        assert time.monotonic() - started < 30  # well before the 60 s long poll
        c.ack(got)
        hw.send("sparse", b"next", partition=1)
        got = _receive_all(c, 1)  # the polls still out count for the next receive
        assert [d.body for d in got] == [b"next"]
        c.ack(got)
        c.close()


def _ack(c, deliveries: list, acked: Counter) -> set:
    """Ack ``deliveries``, counting the messages acked in ``acked``; returns the message ids
    whose lease was refused as expired."""
    refused: list = []
    try:
        c.ack(deliveries)
    except headwater.LeaseExpiredError as e:
        refused = [LeaseId.parse(r.lease_id) for r in e.refused]
    void = {(x.partition, x.offset, x.attempt) for x in refused}
    gone = {d.message_id for d in deliveries if (d.message_id.partition, d.message_id.offset, d.attempt) in void}
    acked.update(d.message_id for d in deliveries if d.message_id not in gone)
    return gone


def test_a_moved_partition_hands_its_state_over_and_only_leases_in_flight_come_again(cluster):
    """docs/design/cluster.md, "Shared groups", "Moves": two members of a group have taken
    part of a queue, acked some and hold the rest when broker 3's partitions move away. The
    new leaders take the group's state in the move: nothing acked is delivered again, the
    leases in flight at the fence come again (their delivery counted), the messages never
    delivered follow: each message acked once, none lost. It leaves broker 3 leading nothing."""
    with headwater.connect(cluster.address(1)) as hw:
        ids = _queue(hw, "moving")
        members = [hw.shared_consumer("g", "moving", visibility_timeout_ms=120_000) for _ in range(2)]
        held: dict[str, list] = {c.member: [] for c in members}
        deadline = time.monotonic() + 30
        while sum(map(len, held.values())) < len(ids) // 3 and time.monotonic() < deadline:
            for c in members:
                held[c.member].extend(c.receive(max_messages=5, timeout_ms=200))
        acked: Counter = Counter()
        for c in members:
            assert not _ack(c, [d for d in held[c.member] if d.message_id.offset % 2 == 0], acked)
        acked_before = set(acked)
        leaders = {p.partition: p.leader for p in hw.admin.cluster_metadata(["moving"]).queue("moving").partitions}
        moved = {p for p, b in leaders.items() if b == 3}
        in_flight = {
            d.message_id for c in members for d in held[c.member] if d.message_id.partition in moved
        } - acked_before
        assert in_flight and acked_before & {i for i in ids if i.partition in moved}  # part of each kind on 3
        assert hw.admin.decommission(3)

        def moved_off() -> bool:
            md = hw.admin.cluster_metadata(["moving"])
            return not md.moves and all(p.leader != 3 for p in md.queue("moving").partitions)

        eventually(moved_off, timeout_s=60, what="broker 3's partitions moved")
        void: set = set()
        for c in members:
            void |= _ack(c, [d for d in held[c.member] if d.message_id not in acked], acked)
        assert void == in_flight  # given by broker 3 before the fence: refused, they come again
        after: list = []
        deadline = time.monotonic() + 30
        while set(acked) != set(ids) and time.monotonic() < deadline:
            for c in members:
                got = c.receive(max_messages=50, timeout_ms=200)
                after.extend(got)
                void |= _ack(c, got, acked)  # leases kept by the client from before the move are refused too
        assert acked == Counter(set(ids))  # each message acked once: none lost, none twice
        assert not acked_before & {d.message_id for d in after}  # nothing acked is delivered again
        again = {d.message_id for d in after if d.attempt == 2}
        assert in_flight <= again <= void and {d.attempt for d in after} <= {1, 2}  # only leases in flight again
        for c in members:
            assert c.receive(max_messages=50, timeout_ms=300) == []
        info = members[0].describe()
        assert all(p.committed_offset == p.end_offset == PER_PARTITION for p in info.partitions)
        for c in members:
            c.close()


def test_a_member_reads_partitions_moved_to_a_broker_it_did_not_ask(cluster):
    """After the move above broker 3 leads nothing, so a new queue is placed on it alone;
    decommissioning it again moves them to brokers the member never asked. No receive fails
    (the old leader still answers, for what it leads: nothing), so only its answers' ``led``
    tell the member its table is old: it asks again and reads what is sent to the moved
    partitions (the code before never did)."""
    with headwater.connect(cluster.address(1)) as hw, headwater.connect(cluster.address(1)) as sender:
        hw.admin.create_queue("arriving", partitions=PARTITIONS)
        c = hw.shared_consumer("arrive", "arriving", visibility_timeout_ms=120_000)
        assert c.receive(max_messages=10, timeout_ms=100) == []  # the member's table, before the move
        before = {p.partition: p.leader for p in hw.admin.cluster_metadata(["arriving"]).queue("arriving").partitions}
        assert set(before.values()) == {3}
        assert hw.admin.decommission(3)

        def placed() -> dict[int, int] | None:
            md = sender.admin.cluster_metadata(["arriving"])
            return None if md.moves else {p.partition: p.leader for p in md.queue("arriving").partitions}

        after = eventually(placed, timeout_s=60, what="the moves")
        moved = sorted(p for p in after if after[p] != before[p])
        assert moved and not {after[p] for p in moved} & set(before.values())  # to brokers it never asked
        sent = [sender.send("arriving", b"moved", partition=p) for p in moved]
        got = _receive_all(c, len(sent), deadline_s=20)
        assert sorted(d.message_id for d in got) == sorted(sent)
        c.ack(got)
        c.close()


def _no_leader_for_some(table, queue: str) -> bool:
    return len(table.partition_leaders(queue)) < table.partition_count(queue)


def test_a_member_reads_a_leaders_partitions_again_once_it_is_back(cluster):
    """A broker leading some of the queue's partitions is killed until the member's table
    names no leader for them (its ZooKeeper session expired), then started again: the
    member asks METADATA again by itself and receives what is sent there. The code before
    never asked (no receive goes to a partition with no leader, so no error made the table
    stale): it read the other partitions only, for good."""
    with headwater.connect(cluster.address(1)) as hw, headwater.connect(cluster.address(1)) as sender:
        hw.admin.create_queue("comeback", partitions=PARTITIONS)
        for p in range(PARTITIONS):
            hw.send_batch("comeback", [b"before"] * PER_PARTITION, partition=p)
        leaders = {p.partition: p.leader for p in hw.admin.cluster_metadata(["comeback"]).queue("comeback").partitions}
        victim = max(set(leaders.values()) - {1})  # not the bootstrap broker: the clients keep theirs
        led = sorted(p for p, b in leaders.items() if b == victim)
        c = hw.shared_consumer("back", "comeback", visibility_timeout_ms=120_000)
        c.ack(_receive_all(c, PARTITIONS * PER_PARTITION))
        cluster.brokers[victim].kill()

        def leaderless() -> bool:
            c.receive(max_messages=10, timeout_ms=100)  # a receive at the victim fails: the table is asked again
            return _no_leader_for_some(hw.service.table, "comeback")

        eventually(leaderless, what="a table with no leader for the victim's partitions")
        cluster.start(victim)
        eventually(lambda: not _no_leader_for_some(sender.service.refresh(), "comeback"), what="the victim leading")
        sent = [sender.send("comeback", b"back", partition=p) for p in led]
        got = _receive_all(c, len(sent), deadline_s=20)
        assert sorted(d.message_id for d in got) == sorted(sent)
        c.ack(got)
        c.close()


@pytest.mark.slow  # a fault test of ~10 s; tests/test_cluster_routing.py kills a leader by default
def test_a_leader_killed_its_leases_are_refused_and_the_others_partitions_go_on(cluster):
    """The last test of the module: it kills a broker other than 1 leading part of queue
    "jobs" (the moves above placed it)."""
    with headwater.connect(cluster.address(1)) as hw:
        leaders = {p.partition: p.leader for p in hw.admin.cluster_metadata(["jobs"]).queue("jobs").partitions}
        victim = max(set(leaders.values()) - {1})
        on_victim = {p for p, b in leaders.items() if b == victim}
        c = hw.shared_consumer("fresh", "jobs", visibility_timeout_ms=120_000)
        got = _receive_all(c, PARTITIONS * PER_PARTITION)
        assert Counter(d.message_id.partition for d in got) == {p: PER_PARTITION for p in range(PARTITIONS)}
        cluster.brokers[victim].kill()
        with pytest.raises(headwater.UnavailableError) as refused:
            c.ack(got)  # the others' leases are acked; the victim's refused as out of reach
        assert Counter(LeaseId.parse(r.lease_id).partition for r in refused.value.refused) == {
            p: PER_PARTITION for p in on_victim
        }
        live = sorted(set(range(PARTITIONS)) - on_victim)
        sent = [hw.send("jobs", b"after", partition=p) for p in live]
        again = _receive_all(c, len(sent))  # the partitions led by live brokers go on
        assert sorted(d.message_id for d in again) == sorted(sent)
        c.ack(again)
        info = c.describe()
        assert [p.partition for p in info.partitions] == live  # what the live leaders answer
        c.close()
