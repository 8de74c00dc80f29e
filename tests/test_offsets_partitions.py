"""The OffsetStore and GroupCoordinator of a broker in a cluster, without a cluster: the
coordinator queue's partitions loaded and unloaded as a fake cluster node says, the commit
checks a cluster can make, the fence of a move (the real Mover, on the in-memory ensemble),
and compaction per partition; on the MemoryStore. (A broker alone: tests/test_groups.py and tests/test_consumer.py.)"""

from __future__ import annotations

import threading
from types import MappingProxyType

import pytest

from headwater.broker.groups import GroupCoordinator
from headwater.broker.mover import Mover
from headwater.broker.offsets import OFFSETS_QUEUE, OffsetStore
from headwater.cluster.metadata import ClusterView, QueueView
from headwater.cluster.records import MoveFenced, MoveRecord, PartitionRecord, QueueRecord, decode, encode, paths
from headwater.errors import (
    InvalidArgumentError,
    NotCoordinatorError,
    PartitionOutOfRangeError,
    UnknownMemberError,
)
from headwater.model.batch import encode_batch
from headwater.model.cluster import COORDINATOR_QUEUE, coordinator_partition
from headwater.model.config import QueueConfig
from headwater.model.message import Message
from headwater.storage.memory import MemoryStore
from headwater.testing.coordination import MemoryEnsemble
from tests.support.coordinator_node import PARTITIONS, FakeNode, group_of


@pytest.fixture
def setup():
    store = MemoryStore()
    offsets = OffsetStore(store, compact_min=20, compact_ratio=2)
    node = FakeNode()
    offsets.join_cluster(node)
    store.create_queue(COORDINATOR_QUEUE, QueueConfig(partitions=PARTITIONS, ttl_s=None, flush="sync"), internal=True)
    store.create_queue("orders", QueueConfig(partitions=3))
    store.append("orders", 0, encode_batch([Message(b"x")] * 5))  # orders[0] ends at 5 here
    yield store, offsets, node
    store.close()


def _lead(offsets: OffsetStore, node: FakeNode, partition: int) -> None:
    node.leading.add(partition)
    offsets.load(partition)


def test_a_group_is_served_only_once_its_partition_is_led_and_loaded(setup):
    store, offsets, node = setup
    g = group_of(1)
    with pytest.raises(NotCoordinatorError):
        offsets.fetch(g, "orders")  # not the coordinator
    node.leading.add(1)
    with pytest.raises(NotCoordinatorError, match="being loaded"):
        offsets.fetch(g, "orders")  # the coordinator, not loaded yet
    offsets.load(1)
    assert offsets.fetch(g, "orders") == {}
    offsets.commit(g, "orders", {1: 7})
    assert offsets.fetch(g, "orders") == {1: 7}
    assert store.end_offset(COORDINATOR_QUEUE, 1) == 1  # the commit is in the group's partition
    assert [store.end_offset(COORDINATOR_QUEUE, k) for k in (0, 2, 3)] == [0, 0, 0]
    assert store.end_offset(OFFSETS_QUEUE, 0) == 0  # the broker-alone queue is left alone


def test_unloading_forgets_and_loading_reads_the_partition_back(setup):
    store, offsets, node = setup
    _lead(offsets, node, 2)
    g = group_of(2)
    offsets.commit(g, "orders", {0: 3, 2: 9})
    offsets.commit(g, "orders", {0: 4})
    offsets.unload(2)
    assert offsets.loaded() == set()
    with pytest.raises(NotCoordinatorError):
        offsets.fetch(g, "orders")
    offsets.load(2)
    assert offsets.fetch(g, "orders") == {0: 4, 2: 9}
    assert offsets.fetch_group(g) == {"orders": {0: 4, 2: 9}}
    assert offsets.group_queues(2) == {g: {"orders"}} and offsets.group_queues(3) == {}


def test_a_cluster_commit_checks_the_log_only_of_partitions_led_here(setup):
    store, offsets, node = setup
    _lead(offsets, node, 0)
    g = group_of(0)
    node.leads_user.add(("orders", 0))
    with pytest.raises(InvalidArgumentError, match="beyond the log end 5"):
        offsets.commit(g, "orders", {0: 6})  # led here: its log is known
    offsets.commit(g, "orders", {0: 5, 1: 1_000})  # orders[1] is another broker's: not checked
    with pytest.raises(InvalidArgumentError, match="offsets start at 0"):
        offsets.commit(g, "orders", {1: -1})
    with pytest.raises(PartitionOutOfRangeError):
        offsets.commit(g, "orders", {3: 0})
    assert offsets.fetch(g, "orders") == {0: 5, 1: 1_000}


def test_a_fenced_partition_refuses_commits_as_not_coordinator_and_writes_nothing(setup):
    store, offsets, node = setup
    _lead(offsets, node, 3)
    g = group_of(3)
    offsets.commit(g, "orders", {1: 1})
    node.fenced.add(3)
    with pytest.raises(NotCoordinatorError, match="moving"):
        offsets.commit(g, "orders", {1: 2})
    assert store.end_offset(COORDINATOR_QUEUE, 3) == 1 and offsets.fetch(g, "orders") == {1: 1}


def test_compaction_is_per_partition(setup):
    store, offsets, node = setup
    _lead(offsets, node, 1)
    _lead(offsets, node, 2)
    busy, quiet = group_of(1), group_of(2)
    offsets.commit(quiet, "orders", {2: 1})
    for i in range(60):
        offsets.commit(busy, "orders", {1: i})
    info = store.describe_queue(COORDINATOR_QUEUE)
    assert info.partitions[1].start_offset > 0  # compacted: its log starts at the last table
    assert info.partitions[1].end_offset - info.partitions[1].start_offset <= 20
    assert (info.partitions[2].start_offset, info.partitions[2].end_offset) == (0, 1)  # untouched
    for k in (1, 2):
        offsets.unload(k)
        offsets.load(k)
    assert offsets.fetch(busy, "orders") == {1: 59} and offsets.fetch(quiet, "orders") == {2: 1}


def test_the_coordinator_drops_members_of_a_partition_it_gave_up_and_holds_grants_on_taking_one(setup):
    store, offsets, node = setup
    now = [100.0]
    groups = GroupCoordinator(store, offsets, clock=lambda: now[0])
    g = group_of(1)
    node.leading.add(1)
    groups.load_partition(1)
    joined = groups.join_group(g, None, "c", ["orders"], "clustering", "average", 10_000)
    assert joined.assignment == {"orders": [0, 1, 2]}
    groups.commit_offsets(g, "orders", {0: 1}, joined.member_id, joined.generation)
    # the partition moves away: the members are forgotten, the calls refused
    node.leading.discard(1)
    groups.unload_partition(1)
    with pytest.raises(NotCoordinatorError):
        groups.heartbeat_group(g, joined.member_id, joined.generation)
    assert [s.group for s in groups.list_groups()] == []
    # and comes back (as to a new coordinator): the member is unknown, grants are held
    node.leading.add(1)
    groups.load_partition(1)
    with pytest.raises(UnknownMemberError):
        groups.heartbeat_group(g, joined.member_id, joined.generation)
    again = groups.join_group(g, None, "c", ["orders"], "clustering", "average", 10_000)
    assert again.assignment == {} and again.pending  # held: the old members may still read
    now[0] += 5
    assert groups.heartbeat_group(g, again.member_id, again.generation).assignment == {"orders": [0, 1, 2]}
    assert offsets.fetch(g, "orders") == {0: 1}


def test_a_moving_partitions_groups_are_handed_to_the_new_coordinator_and_go_on(setup):
    """Once a move fences the coordinator partition at the source, its groups' membership
    calls are refused (ask again) and their membership is handed off; the target adopts it
    and, once it leads the partition, answers the same members at the same generation,
    holding no grants back (it knows who holds what), and takes their commits."""
    store, offsets, node = setup
    now = [100.0]
    source = GroupCoordinator(store, offsets, clock=lambda: now[0])
    g, other = group_of(1), group_of(2)
    for k in (1, 2):
        node.leading.add(k)
        source.load_partition(k, grace_ms=0)
    a = source.join_group(g, None, "c", ["orders"], "clustering", "average", 10_000)
    b = source.join_group(g, None, "c", ["orders"], "clustering", "average", 10_000)
    a = source.heartbeat_group(g, a.member_id, b.generation)
    b = source.heartbeat_group(g, b.member_id, b.generation)
    source.join_group(other, None, "c", ["orders"], "clustering", "average", 10_000)
    source.commit_offsets(g, "orders", {p: 1 for p in b.assignment["orders"]}, b.member_id, b.generation)
    source.moving = lambda queue, partition: (queue, partition) == (COORDINATOR_QUEUE, 1)
    for call in (
        lambda: source.heartbeat_group(g, a.member_id, b.generation),
        lambda: source.join_group(g, None, "c", ["orders"], "clustering", "average", 10_000),
        lambda: source.leave_group(g, b.member_id),
    ):
        with pytest.raises(NotCoordinatorError, match=f"coordinator of group '{g}' is moving to another broker"):
            call()
    source.heartbeat_group(other, source.describe_group(other).members[0].member_id, 0)  # partition 2 stays
    handed = source.hand_off(1)
    assert [h.name for h in handed] == [g] and len(handed[0].members) == 2

    t_store = MemoryStore()
    t_offsets, t_node = OffsetStore(t_store), FakeNode()
    t_offsets.join_cluster(t_node)
    t_store.create_queue(COORDINATOR_QUEUE, QueueConfig(partitions=PARTITIONS, ttl_s=None, flush="sync"), internal=True)
    t_store.create_queue("orders", QueueConfig(partitions=3))
    target = GroupCoordinator(t_store, t_offsets, clock=lambda: 5.0)  # another broker's clock
    target.adopt(1, handed)
    assert target.list_groups() == []  # not its own until it leads the partition
    t_node.leading.add(1)
    target.load_partition(1)  # no grace: who holds what came with the group
    got = target.heartbeat_group(g, a.member_id, b.generation)
    assert (got.generation, got.assignment, got.pending) == (b.generation, a.assignment, False)
    target.commit_offsets(g, "orders", {p: 2 for p in b.assignment["orders"]}, b.member_id, b.generation)
    assert {s.group: s.members for s in target.list_groups()} == {g: 2}
    target.adopt(1, [])  # a hand-off asked again replaces the last one whole
    with pytest.raises(UnknownMemberError):
        target.heartbeat_group(g, a.member_id, b.generation)


def test_a_moves_fence_waits_for_a_commit_under_way_then_refuses_the_next():
    """The real Mover as the commit's ``producing``: the commit accepted before the fence
    is in the end offset the source publishes (so the target copies it); the next one is
    refused as NotCoordinator, and nothing more is written."""
    coord = MemoryEnsemble().connect()
    store = MemoryStore()
    config = QueueConfig(partitions=2, ttl_s=None, flush="sync")
    store.create_queue(COORDINATOR_QUEUE, config, internal=True, queue_id=1000)
    store.create_queue("orders", QueueConfig(partitions=1))
    q = COORDINATOR_QUEUE
    for path in (paths.QUEUES, paths.queue(q), paths.partitions(q), paths.MOVES, paths.moves_of(q)):
        coord.create(path)
    led = PartitionRecord(replicas=[1], leader=1, leader_epoch=0, controller_epoch=1)
    move = MoveRecord(source=1, target=2, phase="fence", started_ms=0, controller_epoch=1)
    coord.create(paths.partition(q, 0), encode(led))
    coord.create(paths.move(q, 0), encode(move))

    def view(with_move: bool) -> ClusterView:
        qv = QueueView(QueueRecord(queue_id=1000, config={}, created_ms=0, controller_epoch=1), {0: led})
        return ClusterView(
            queues=MappingProxyType({q: qv}), moves=MappingProxyType({(q, 0): move} if with_move else {})
        )

    current = [view(False)]
    mover = Mover(store, coord, 1, lambda: current[0], lambda: True, lambda task: None)

    class Place:
        def coordinator_partition(self, group: str) -> int:
            return coordinator_partition(group, 2)

        def leads(self, queue: str, partition: int) -> bool:
            return False

        def producing(self, queue: str, partition: int):
            return mover.producing(queue, partition)

    offsets = OffsetStore(store)
    offsets.join_cluster(Place())
    offsets.load(0)
    g = next(g for i in range(100) if coordinator_partition(g := f"g{i}", 2) == 0)
    inside, release = threading.Event(), threading.Event()
    append = store.append_nowait  # how a commit appends (it waits for the fsync itself when sync)

    def slow_append(queue, partition, batch):
        if queue == q:
            inside.set()
            release.wait(10)
        return append(queue, partition, batch)

    store.append_nowait = slow_append
    committer = threading.Thread(target=offsets.commit, args=(g, "orders", {0: 7}))
    committer.start()
    assert inside.wait(10)
    current[0] = view(True)
    fencer = threading.Thread(target=mover.follow, args=(current[0],))
    fencer.start()
    fencer.join(0.3)
    assert fencer.is_alive() and coord.exists(paths.move_fenced(q, 0)) is None  # waits for the commit
    release.set()
    committer.join(10)
    fencer.join(10)
    fenced = decode(coord.get(paths.move_fenced(q, 0))[0], MoveFenced, "fenced")
    assert fenced.end_offset == 1 == store.end_offset(q, 0)  # the commit is in what the target copies
    with pytest.raises(NotCoordinatorError, match="moving from broker 1 to broker 2"):
        offsets.commit(g, "orders", {0: 8})
    assert store.end_offset(q, 0) == 1 and offsets.fetch(g, "orders") == {0: 7}
    store.close()
