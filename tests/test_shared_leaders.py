"""Shared groups of one broker of a cluster (headwater/broker/shared_core.py, "On a
cluster"): the broker acts only on the partitions it leads now, refuses whole an ack holding
a lease of another partition, and never marks a message dead without its copy. The cluster
is a fake here (which partitions this broker leads is the test's to say); the real one is
tests/test_cluster_shared.py."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from headwater.broker.broker import Broker
from headwater.broker.shared import SharedGroups
from headwater.errors import NotLeaderError
from headwater.model.batch import encode_batch
from headwater.model.config import QueueConfig, QueueInfo
from headwater.model.message import Message
from headwater.testing import FakeClock


class FakeCluster:
    """A broker's part in a cluster, as shared groups see it: ``led`` is what it leads."""

    def __init__(self, broker: Broker, led: set[tuple[str, int]]) -> None:
        self.broker = broker
        self.led = led

    def leads(self, queue: str, partition: int) -> bool:
        return (queue, partition) in self.led

    def check_leader(self, queue: str, partition: int) -> None:
        if not self.leads(queue, partition):
            raise NotLeaderError(f"broker 1 does not lead {queue}[{partition}]")

    def leader_address(self, queue: str, partition: int) -> str | None:
        return None  # the other brokers are out of reach

    def create_queue(self, name: str, config: QueueConfig) -> QueueInfo:
        return self.broker.store.create_queue(name, config)

    def producing(self, queue: str, partition: int) -> contextlib.AbstractContextManager[None]:
        self.check_leader(queue, partition)
        return contextlib.nullcontext()


@pytest.fixture
def setup(tmp_path) -> Iterator[tuple[Broker, SharedGroups, FakeCluster, FakeClock]]:
    clock = FakeClock()
    broker = Broker.open(tmp_path / "d", clock=clock)
    broker.store.create_queue("q", QueueConfig(partitions=3))
    for p in range(3):
        broker.store.append("q", p, encode_batch([Message(b"%d-%d" % (p, i)) for i in range(4)]))
    cluster = FakeCluster(broker, {("q", 0), ("q", 1)})
    shared = SharedGroups(broker.store, clock, cluster=lambda: cluster)
    try:
        yield broker, shared, cluster, clock
    finally:
        broker.close()


def _parts(res) -> list[int]:
    return sorted({x.partition for x in res.leases})


def test_a_receive_leases_only_the_partitions_this_broker_leads(setup):
    _broker, shared, cluster, clock = setup
    res = shared.receive("g", "q", "m", max_messages=100, visibility_timeout_ms=1000, settings={"backoff_ms": 0})
    assert _parts(res) == [0, 1] and len(res.leases) == 8
    assert [p.partition for p in shared.describe("g", "q").partitions] == [0, 1]
    cluster.led = {("q", 2)}  # partitions 0 and 1 moved away, 2 moved here
    clock.advance(5)  # the leases of 0 and 1 ran out, but their state is their leader's now
    res = shared.receive("g", "q", "m", max_messages=100, visibility_timeout_ms=1000)
    assert _parts(res) == [2]
    info = shared.describe("g", "q")
    assert [(p.partition, p.leased) for p in info.partitions] == [(2, 4)]
    cluster.led = {("q", 0), ("q", 1), ("q", 2)}  # back: what expired meanwhile comes again
    res = shared.receive("g", "q", "m", max_messages=100, visibility_timeout_ms=1000)
    assert _parts(res) == [0, 1] and {x.attempt for x in res.leases} == {2}


def test_an_ack_holding_a_lease_of_another_partition_is_refused_whole(setup):
    _broker, shared, cluster, _clock = setup
    cluster.led = {("q", 0), ("q", 1), ("q", 2)}
    res = shared.receive("g", "q", "m", max_messages=100, visibility_timeout_ms=60_000)
    by_part = {x.partition: x.lease_id for x in reversed(res.leases)}
    cluster.led = {("q", 0), ("q", 1)}
    with pytest.raises(NotLeaderError, match=r"does not lead q\[2\]"):
        shared.ack("g", "q", "m", [by_part[0], by_part[2]])
    with pytest.raises(NotLeaderError):
        shared.nack("g", "q", "m", [by_part[2], by_part[1]])
    with pytest.raises(NotLeaderError):
        shared.extend("g", "q", "m", [by_part[2]], 1000)
    assert shared.ack("g", "q", "m", [by_part[0], by_part[1]]) == []  # nothing was applied before


def test_a_dead_letter_whose_partition_leader_is_out_of_reach_is_tried_again(setup):
    broker, shared, cluster, clock = setup
    cluster.led = {("q", 0)}
    settings = {"max_attempts": 1, "backoff_ms": 0}
    res = shared.receive("g", "q", "m", max_messages=1, visibility_timeout_ms=1000, settings=settings)
    (lease,) = res.leases
    cluster.create_queue("q.dlq", QueueConfig(partitions=3))  # its partition 0 led by another broker
    assert shared.nack("g", "q", "m", [lease.lease_id], "broken", 0) == []
    assert broker.store.describe_queue("q.dlq").partitions[0].end_offset == 0
    info = shared.describe("g", "q")
    assert info.partitions[0].dead_lettered == 0 and info.partitions[0].awaiting_retry == 1  # not dead: no copy
    cluster.led = {("q", 0), ("q.dlq", 0)}  # now the dlq partition is led here
    clock.advance(10)  # past the retry delay
    res = shared.receive("g", "q", "m", max_messages=100, visibility_timeout_ms=1000, settings=settings)
    assert lease.offset not in {x.offset for x in res.leases if x.partition == 0}  # dead-lettered on delivery
    assert broker.store.describe_queue("q.dlq").partitions[0].end_offset == 1
    assert shared.describe("g", "q").partitions[0].dead_lettered == 1
