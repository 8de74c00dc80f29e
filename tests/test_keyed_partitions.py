"""The keyed groups of a broker in a cluster, without a cluster: a fake node says which
partitions of ``__cluster_keyed`` this broker leads and which user partitions' logs it
knows; a fake coordinator answers a partition leader's question for the state
(docs/design/cluster.md, "Keyed groups (built)")."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from types import MappingProxyType

import pytest

from headwater.broker.keyed import KEYED_QUEUE, LOG_END_UNKNOWN, KeyedGroups
from headwater.broker.keyed_peers import KeyedPeers
from headwater.broker.table import DurableTable
from headwater.cluster.metadata import ClusterView, QueueView
from headwater.cluster.records import PartitionRecord, QueueRecord
from headwater.errors import (
    GroupNotFoundError,
    InvalidArgumentError,
    NotCoordinatorError,
    NotLeaderError,
    StaleGenerationError,
)
from headwater.model.batch import encode_batch
from headwater.model.cluster import KEYED_COORDINATOR_QUEUE, coordinator_partition, keyed_coordinator_name
from headwater.model.config import QueueConfig, QueueInfo
from headwater.model.keyed import KeyedGroupInfo, member_of
from headwater.model.message import Message
from headwater.storage.memory import MemoryStore

PARTITIONS = 4
KEYS = [b"k%d" % i for i in range(12)]


class FakeNode:
    """A cluster node as the keyed groups see it."""

    def __init__(self, store: MemoryStore) -> None:
        self.store = store
        self.leading: set[int] = set()  # keyed coordinator partitions
        self.leads_user: set[tuple[str, int]] = set()
        self.fenced: set[int] = set()
        self.coordinator: KeyedGroups | None = None  # another broker's, for keyed_state
        self.asked: list[bool] = []  # each keyed_state call's ``fresh``
        self.held: KeyedGroupInfo | None = None  # the state as last asked, served until asked afresh

    def coordinator_partition(self, group: str, of: str = "") -> int:
        assert of == KEYED_COORDINATOR_QUEUE
        k = coordinator_partition(group, PARTITIONS)
        if k not in self.leading:
            raise NotCoordinatorError(f"not the coordinator of {group!r}")
        return k

    @contextmanager
    def producing(self, queue: str, partition: int) -> Iterator[None]:
        assert queue == KEYED_COORDINATOR_QUEUE
        if partition in self.fenced or partition not in self.leading:
            raise NotLeaderError(f"{queue}[{partition}] is moving")
        yield

    def check_leader(self, queue: str, partition: int) -> None:
        pass

    def log_ranges(self, queue: QueueInfo, ask_leaders: bool) -> dict[int, tuple[int, int]]:
        return {
            p.partition: (p.start_offset, p.end_offset)
            if ask_leaders or (queue.name, p.partition) in self.leads_user
            else (0, LOG_END_UNKNOWN)
            for p in queue.partitions
        }

    def keyed_state(self, queue: QueueInfo, group: str, generation: int, fresh: bool = False) -> KeyedGroupInfo:
        self.asked.append(fresh)
        assert self.coordinator is not None
        if fresh or self.held is None:
            self.held = self.coordinator.group(queue.name, group)
        return self.held


def _group_of(partition: int, queue: str = "orders") -> str:
    return next(
        g
        for i in range(1000)
        if coordinator_partition(keyed_coordinator_name(queue, g := f"g{i}"), PARTITIONS) == partition
    )


@pytest.fixture
def setup():
    store = MemoryStore()
    keyed = KeyedGroups(store)
    node = FakeNode(store)
    keyed.join_cluster(node)
    config = QueueConfig(partitions=PARTITIONS, ttl_s=None, flush="sync")
    store.create_queue(KEYED_COORDINATOR_QUEUE, config, internal=True)
    store.create_queue("orders", QueueConfig(partitions=2))
    store.append("orders", 0, encode_batch([Message(b"%s" % k, key=k) for k in KEYS]))  # orders[0] ends at 12
    yield store, keyed, node
    store.close()


def test_a_keyed_group_is_served_only_once_its_partition_is_led_and_loaded(setup):
    store, keyed, node = setup
    g = _group_of(1)
    with pytest.raises(NotCoordinatorError):
        keyed.group("orders", g, "key", 2)
    node.leading.add(1)
    with pytest.raises(NotCoordinatorError, match="being loaded"):
        keyed.group("orders", g, "key", 2)
    keyed.load(1)
    assert keyed.group("orders", g, "key", 2).size == 2
    assert store.end_offset(KEYED_COORDINATOR_QUEUE, 1) == 1  # the state is in the group's partition
    assert [store.end_offset(KEYED_COORDINATOR_QUEUE, k) for k in (0, 2, 3)] == [0, 0, 0]
    assert store.end_offset(KEYED_QUEUE, 0) == 0  # the broker-alone table is left alone
    assert [s.group for s in keyed.summaries(store.list_queues())] == [g]


def test_unloading_forgets_and_loading_reads_the_state_back(setup):
    store, keyed, node = setup
    g = _group_of(2)
    node.leading.add(2)
    keyed.load(2)
    keyed.group("orders", g, "key", 2)
    keyed.commit("orders", g, 0, 1, {0: 4})
    keyed.unload(2)
    assert keyed.loaded() == set() and keyed.summaries(store.list_queues()) == []
    with pytest.raises(NotCoordinatorError):
        keyed.group("orders", g)
    keyed.load(2)
    assert keyed.group("orders", g).positions == {0: {0: 4}}


def test_a_commit_checks_the_log_only_of_partitions_led_here_and_the_barrier_everywhere(setup):
    store, keyed, node = setup
    g = _group_of(0)
    node.leading.add(0)
    keyed.load(0)
    keyed.group("orders", g, "key", 2)
    node.leads_user.add(("orders", 0))
    with pytest.raises(InvalidArgumentError, match="beyond the log end 12"):
        keyed.commit("orders", g, 0, 1, {0: 13})  # led here: its log is known
    keyed.commit("orders", g, 0, 1, {1: 1_000})  # orders[1] is another broker's: not checked
    keyed.resize("orders", g, 3)  # the barrier: every partition's end, from its leader
    with pytest.raises(InvalidArgumentError, match="barrier 0"):
        keyed.commit("orders", g, 1, 1, {1: 1})  # beyond the barrier of a log not known here
    assert keyed.group("orders", g).positions == {0: {1: 1_000}}


def test_a_fenced_partition_refuses_changes_as_not_coordinator_and_writes_nothing(setup):
    store, keyed, node = setup
    g = _group_of(3)
    node.leading.add(3)
    keyed.load(3)
    keyed.group("orders", g, "key", 2)
    node.fenced.add(3)
    with pytest.raises(NotCoordinatorError, match="moving"):
        keyed.commit("orders", g, 0, 1, {0: 2})
    assert store.end_offset(KEYED_COORDINATOR_QUEUE, 3) == 1 and keyed.group("orders", g).positions == {}


def test_a_partition_leader_filters_with_the_coordinators_state_asked_again_before_answering(setup):
    """The leader (this broker: not the coordinator) reads with the state it has and asks
    afresh before it answers with messages: a member left behind by a resize gets none."""
    store, keyed, node = setup
    other_store = MemoryStore()  # the coordinator, another broker
    other_store.create_queue(KEYED_COORDINATOR_QUEUE, QueueConfig(partitions=PARTITIONS), internal=True)
    other_store.create_queue("orders", QueueConfig(partitions=2))
    coordinator, other = KeyedGroups(other_store), FakeNode(other_store)
    coordinator.join_cluster(other)
    g = _group_of(1)
    other.leading.add(1)
    coordinator.load(1)
    node.coordinator = coordinator
    coordinator.group("orders", g, "key", 2)
    res = keyed.fetch_now("orders", g, 1, 1, 0, 0, 1 << 20)
    assert node.asked == [False, True]  # as held, then afresh before answering with messages
    assert res.batches and res.generation == 1
    coordinator.resize("orders", g, 3)  # at once: the coordinator's copy of orders is empty, at the barrier
    assert coordinator.group("orders", g).generation == 2
    with pytest.raises(StaleGenerationError, match="generation 2"):
        keyed.fetch_now("orders", g, 1, 1, 0, 0, 1 << 20)  # read with the held state, refused by the fresh one
    assert node.asked[-2:] == [False, True]
    res = keyed.fetch_now("orders", g, 2, 2, 0, 0, 1 << 20)
    assert res.generation == 2 and res.selections  # member 2 of 3 reads its keys only
    other_store.close()


def test_member_of_is_what_the_leader_filters_by():
    assert sorted({member_of(k, 3) for k in KEYS}) == [0, 1, 2]  # the keys above reach every member


def test_a_durable_table_can_be_one_partition_of_a_queue():
    store = MemoryStore()
    store.create_queue("__t", QueueConfig(partitions=3, ttl_s=None, flush="sync"), internal=True)
    table = DurableTable(store, "__t", 2, compact_min=4, compact_ratio=1)
    for i in range(10):
        table.put({b"a": b"%d" % i, b"b": b"x"})
    assert [store.end_offset("__t", p) for p in (0, 1)] == [0, 0]
    again = DurableTable(store, "__t", 2)
    assert again.items() == [(b"a", b"9"), (b"b", b"x")]
    assert store.describe_queue("__t").partitions[2].start_offset > 0  # compacted
    with pytest.raises(Exception):  # noqa: B017, PT011 - a named partition's queue must exist: the store's own error
        DurableTable(store, "__absent", 0)
    store.close()


class _Peers(KeyedPeers):
    """KeyedPeers whose coordinator is a function, counting the calls."""

    def __init__(self, view: ClusterView, answer, clock) -> None:
        super().__init__(MemoryStore(), 1, lambda: view, state_max_age_s=1.0, clock=clock)
        self.answer, self.calls = answer, 0

    def _ask(self, view, broker_id, who, call):
        self.calls += 1
        return self.answer()


def test_the_leader_caches_the_state_a_second_by_queue_id_and_asks_for_a_newer_generation():
    rec = PartitionRecord(replicas=[2], leader=2, leader_epoch=0, controller_epoch=1)
    qv = QueueView(
        QueueRecord(queue_id=1000, config={"partitions": PARTITIONS}, created_ms=0, controller_epoch=1),
        {k: rec for k in range(PARTITIONS)},
    )
    view = ClusterView(queues=MappingProxyType({KEYED_COORDINATOR_QUEUE: qv}))
    now = [100.0]
    state = [KeyedGroupInfo(queue="orders", group="g", key="key", size=2)]
    peers = _Peers(view, lambda: state[0], lambda: now[0])
    q = QueueInfo(name="orders", queue_id=1001, config=None, enabled=True, created_ms=0, partitions=[])
    assert peers.keyed_state(q, "g", 1).size == 2 and peers.calls == 1
    peers.keyed_state(q, "g", 1)
    assert peers.calls == 1  # cached
    peers.keyed_state(q, "g", 1, fresh=True)
    assert peers.calls == 2
    state[0] = KeyedGroupInfo(queue="orders", group="g", key="key", size=3, generation=2)
    assert peers.keyed_state(q, "g", 2).generation == 2 and peers.calls == 3  # a member names a newer one
    now[0] += 1.5
    peers.keyed_state(q, "g", 1)
    assert peers.calls == 4  # a second old
    made_again = QueueInfo(name="orders", queue_id=1002, config=None, enabled=True, created_ms=0, partitions=[])
    peers.keyed_state(made_again, "g", 1)
    assert peers.calls == 5  # another queue of the same name: not its cache
    with pytest.raises(GroupNotFoundError):
        _Peers(ClusterView(), lambda: state[0], lambda: now[0]).keyed_state(q, "g", 1)


def test_while_a_resize_drains_a_commit_asks_the_leaders_so_an_expired_barrier_completes_it(setup):
    store, keyed, node = setup
    g = _group_of(0)
    node.leading.add(0)
    keyed.load(0)
    keyed.group("orders", g, "key", 2)
    assert keyed.resize("orders", g, 3).barrier == {0: 12, 1: 0}  # orders[0] is another broker's
    store.append("orders", 0, encode_batch([Message(b"late", key=b"k0")] * 4))
    store.delete_before("orders", 0, 15)  # expired past the barrier, on its leader
    info = keyed.commit("orders", g, 0, 1, {0: 15})  # at the log start its leader gives
    assert info.generation == 2 and info.size == 3 and info.base == {0: 12, 1: 0}
