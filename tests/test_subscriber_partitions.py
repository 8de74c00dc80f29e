"""The subscriber registry of a broker in a cluster, without a cluster: a fake node says
which partitions of ``__cluster_subscribers`` this broker leads and what each user
partition's leader says of its log (docs/design/cluster.md, "Subscriptions (built)")."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from headwater.broker.subscriptions import SubscriberRegistry
from headwater.errors import (
    InvalidArgumentError,
    NotCoordinatorError,
    NotLeaderError,
    SubscriberNotFoundError,
    UnavailableError,
)
from headwater.model.batch import encode_batch
from headwater.model.cluster import SUBSCRIBER_COORDINATOR_QUEUE, coordinator_partition, keyed_coordinator_name
from headwater.model.config import QueueConfig, QueueInfo
from headwater.model.message import Message
from headwater.storage.memory import MemoryStore

PARTITIONS = 4


class FakeNode:
    """A cluster node as the subscriber registry sees it."""

    def __init__(self, store: MemoryStore) -> None:
        self.store = store
        self.leading: set[int] = set()  # subscriber coordinator partitions
        self.fenced: set[int] = set()
        self.remote: dict[int, tuple[int, int]] = {}  # user partition -> (start, end) at its leader
        self.out_of_reach = False
        self.asked = 0

    def coordinator_partition(self, group: str, of: str = "") -> int:
        assert of == SUBSCRIBER_COORDINATOR_QUEUE
        k = coordinator_partition(group, PARTITIONS)
        if k not in self.leading:
            raise NotCoordinatorError(f"not the coordinator of {group!r}")
        return k

    @contextmanager
    def producing(self, queue: str, partition: int) -> Iterator[None]:
        assert queue == SUBSCRIBER_COORDINATOR_QUEUE
        if partition in self.fenced or partition not in self.leading:
            raise NotLeaderError(f"{queue}[{partition}] is moving")
        yield

    def log_ranges(self, queue: QueueInfo, ask_leaders: bool) -> dict[int, tuple[int, int]]:
        assert ask_leaders
        self.asked += 1
        if self.out_of_reach:
            raise UnavailableError("a leader is out of reach")
        local = {p.partition: (p.start_offset, p.end_offset) for p in queue.partitions}
        return {**local, **self.remote}

    def offset_for_time(self, queue: str, partition: int, timestamp_ms: int) -> int:
        if partition in self.remote:  # its leader's answer: its log's start, for this test
            return self.remote[partition][0]
        return self.store.offset_for_time(queue, partition, timestamp_ms)


def _name_of(partition: int, queue: str = "orders") -> str:
    return next(
        n
        for i in range(1000)
        if coordinator_partition(keyed_coordinator_name(queue, n := f"s{i}"), PARTITIONS) == partition
    )


@pytest.fixture
def setup():
    store = MemoryStore()
    registry = SubscriberRegistry(store)
    node = FakeNode(store)
    registry.join_cluster(node)
    store.create_queue(SUBSCRIBER_COORDINATOR_QUEUE, QueueConfig(partitions=PARTITIONS, flush="sync"), internal=True)
    store.create_queue("orders", QueueConfig(partitions=2))
    store.append("orders", 0, encode_batch([Message(b"m%d" % i) for i in range(5)]))  # orders[0] ends at 5 here
    node.remote = {1: (3, 40)}  # orders[1] is led elsewhere: this broker's copy is empty
    yield store, registry, node
    store.close()


def test_a_subscriber_is_served_only_once_its_partition_is_led_and_loaded(setup):
    _, registry, node = setup
    name = _name_of(2)
    with pytest.raises(NotCoordinatorError):
        registry.add("orders", name)
    node.leading.add(2)
    with pytest.raises(NotCoordinatorError, match="being loaded"):
        registry.add("orders", name)
    registry.load(2)
    assert registry.add("orders", name).checkpoints == {0: 5, 1: 40}  # "latest" at each leader
    assert registry.describe("orders", name).checkpoints == {0: 5, 1: 40}
    registry.unload(2)
    with pytest.raises(NotCoordinatorError):
        registry.describe("orders", name)
    registry.load(2)  # read back from the partition's log
    assert registry.describe("orders", name).checkpoints == {0: 5, 1: 40}
    assert [s.name for s in registry.list()] == [name]


def test_starts_and_checkpoints_are_checked_against_each_leaders_log(setup):
    _, registry, node = setup
    node.leading.update(range(PARTITIONS))
    for k in range(PARTITIONS):
        registry.load(k)
    assert registry.add("orders", "first", start="earliest").checkpoints == {0: 0, 1: 3}
    assert registry.add("orders", "clamped", start="offset:1").checkpoints == {0: 1, 1: 3}  # into [3, 40)
    assert registry.checkpoint("orders", "first", {1: 30}).checkpoints == {0: 0, 1: 30}
    with pytest.raises(InvalidArgumentError):
        registry.checkpoint("orders", "first", {1: 41})  # past the end its leader has
    node.out_of_reach = True
    with pytest.raises(UnavailableError):
        registry.checkpoint("orders", "first", {1: 31})
    node.out_of_reach = False
    assert registry.describe("orders", "first").checkpoints == {0: 0, 1: 30}


def test_a_time_start_is_resolved_by_each_partitions_leader(setup):
    _, registry, node = setup
    node.leading.update(range(PARTITIONS))
    for k in range(PARTITIONS):
        registry.load(k)
    assert registry.add("orders", "by-time", start="time:0").checkpoints == {0: 0, 1: 3}


def test_a_fenced_or_lost_partition_refuses_changes_as_not_coordinator(setup):
    _, registry, node = setup
    node.leading.add(3)
    registry.load(3)
    name = _name_of(3)
    registry.add("orders", name)
    node.fenced.add(3)
    with pytest.raises(NotCoordinatorError, match="does not coordinate"):
        registry.checkpoint("orders", name, {0: 1})
    with pytest.raises(NotCoordinatorError):
        registry.delete("orders", name)
    node.fenced.clear()
    assert registry.describe("orders", name).checkpoints == {0: 5, 1: 40}  # unchanged
    registry.delete("orders", name)
    with pytest.raises(SubscriberNotFoundError):
        registry.describe("orders", name)
