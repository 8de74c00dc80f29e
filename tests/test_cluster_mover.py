"""A move's source on one broker (``headwater.broker.mover``), on a store in memory and the
in-memory ensemble: the fence waits for the sends already accepted, refuses new ones, and
publishes the end offset that includes them; a rolled-back move lifts the fence only once
ZooKeeper shows this broker still leading; after a switch the partition's data is dropped
and the queue stays. Whole moves between real brokers: tests/test_cluster_moves.py."""

from __future__ import annotations

import threading
from types import MappingProxyType

import pytest

from headwater.broker.mover import Mover
from headwater.cluster.metadata import ClusterView, QueueView
from headwater.cluster.records import MoveFenced, MoveRecord, PartitionRecord, QueueRecord, decode, encode, paths
from headwater.errors import NotLeaderError
from headwater.model.batch import encode_batch
from headwater.model.config import QueueConfig
from headwater.storage.memory import MemoryStore
from headwater.testing.coordination import MemoryEnsemble

Q = "orders"
MOVE = MoveRecord(source=1, target=2, phase="fence", started_ms=0, controller_epoch=1)


class Source:
    """Broker 1 leading ``orders``/0 with 3 messages, its move to broker 2 in phase fence."""

    def __init__(self) -> None:
        self.coord = MemoryEnsemble().connect()
        self.store = MemoryStore()
        self.store.create_queue(Q, QueueConfig(partitions=1), queue_id=1000)
        self.store.append(Q, 0, bytes(encode_batch([b"a", b"b", b"c"])))
        for path in (paths.QUEUES, paths.queue(Q), paths.partitions(Q), paths.MOVES, paths.moves_of(Q)):
            self.coord.create(path)
        self.led = PartitionRecord(replicas=[1], leader=1, leader_epoch=0, controller_epoch=1)
        self.coord.create(paths.partition(Q, 0), encode(self.led))
        self.coord.create(paths.move(Q, 0), encode(MOVE))
        self.current = self.view(self.led, MOVE)
        self.mover = Mover(self.store, self.coord, 1, lambda: self.current, lambda: True, lambda task: None)

    def view(self, part: PartitionRecord, move: MoveRecord | None) -> ClusterView:
        qv = QueueView(QueueRecord(queue_id=1000, config={}, created_ms=0, controller_epoch=1), {0: part})
        moves = {} if move is None else {(Q, 0): move}
        return ClusterView(queues=MappingProxyType({Q: qv}), moves=MappingProxyType(moves))

    def send(self) -> None:
        with self.mover.producing(Q, 0):
            self.store.append(Q, 0, bytes(encode_batch([b"x"])))

    def fenced_end(self) -> int:
        raw, _ = self.coord.get(paths.move_fenced(Q, 0))
        return decode(raw, MoveFenced, "fenced").end_offset


def test_the_fence_waits_for_sends_under_way_refuses_new_ones_and_publishes_their_end():
    s = Source()
    inside, release = threading.Event(), threading.Event()

    def slow_send() -> None:
        with s.mover.producing(Q, 0):
            inside.set()
            release.wait(10)
            s.store.append(Q, 0, bytes(encode_batch([b"late", b"but accepted"])))

    sender = threading.Thread(target=slow_send)
    s.current = s.view(s.led, None)  # the send began before the fence was seen
    sender.start()
    assert inside.wait(10)
    s.current = s.view(s.led, MOVE)
    fencer = threading.Thread(target=s.mover.follow, args=(s.current,))
    fencer.start()
    fencer.join(0.3)
    assert fencer.is_alive() and s.coord.exists(paths.move_fenced(Q, 0)) is None  # waits for the send
    release.set()
    sender.join(10)
    fencer.join(10)
    assert s.fenced_end() == 5 == s.store.end_offset(Q, 0)  # the late send is inside the end
    with pytest.raises(NotLeaderError, match="moving from broker 1 to broker 2"):
        s.send()
    assert s.store.end_offset(Q, 0) == 5


def test_a_rolled_back_move_lifts_the_fence_only_when_zookeeper_shows_it_leading():
    s = Source()
    s.mover.follow(s.current)
    s.current = s.view(s.led, None)  # the cache saw the move go...
    with pytest.raises(NotLeaderError):
        s.send()  # ...but ZooKeeper still holds it: the fence stays
    s.mover.follow(s.current)
    with pytest.raises(NotLeaderError):
        s.send()
    s.coord.delete(paths.move_fenced(Q, 0))
    s.coord.delete(paths.move(Q, 0))  # rolled back: the partition is still broker 1's
    s.mover.follow(s.current)
    s.send()
    assert s.store.end_offset(Q, 0) == 4


def test_after_the_switch_the_fence_stays_until_the_view_shows_it_and_the_data_goes():
    s = Source()
    s.mover.follow(s.current)
    moved = PartitionRecord(replicas=[2], leader=2, leader_epoch=1, controller_epoch=1)
    s.coord.set(paths.partition(Q, 0), encode(moved))
    s.coord.delete(paths.move_fenced(Q, 0))
    s.coord.delete(paths.move(Q, 0))
    s.current = s.view(s.led, None)  # the cache saw the move go, not the new leader yet
    s.mover.follow(s.current)
    with pytest.raises(NotLeaderError):
        s.send()  # never unfenced: broker 2 leads
    assert s.store.end_offset(Q, 0) == 3
    s.current = s.view(moved, None)
    s.mover.follow(s.current)
    info = s.store.describe_queue(Q).partitions[0]
    assert info.start_offset == info.end_offset == 3  # dropped; the queue stays
