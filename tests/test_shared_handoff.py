"""A shared group's state of a partition handed over in a move (headwater/broker/shared.py,
``hand_off``/``adopt``/``forget``; docs/design/cluster.md, "Shared groups", "Moves"),
without a cluster: two brokers' stores on disk, the source exporting under its fence, the
target adopting durably. Acknowledged and dead offsets stay finished, a backoff keeps its
time, leases in flight come again with their delivery counted, an ack either lands before
the hand-off (and is in it) or is refused after, and a rolled-back adoption is forgotten
while the source goes on from its own state. Whole moves between real brokers:
tests/test_cluster_shared.py."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from types import MappingProxyType

import pytest

from headwater.broker.delay_moves import DelayedMoves
from headwater.broker.mover import Mover
from headwater.broker.shared import SharedGroups
from headwater.broker.shared_handoff import MOVE_REASON
from headwater.broker.shared_state import DeliveryState
from headwater.cluster.metadata import ClusterView, QueueView
from headwater.cluster.records import MoveRecord, PartitionRecord, QueueRecord, encode, paths
from headwater.errors import LeaseExpiredError, NotLeaderError, QueueNotFoundError
from headwater.model.batch import encode_batch
from headwater.model.config import QueueConfig, QueueInfo
from headwater.model.shared import HandedOffShared
from headwater.storage import LogStore
from headwater.testing import FakeClock
from headwater.testing.coordination import MemoryEnsemble

Q, QID = "q", 4242
AVAILABLE, LEASED, ACKED, DEAD = (int(s) for s in DeliveryState)


class Gate:
    """A broker's part in a cluster as shared groups see it: it leads ``led``."""

    def __init__(self, store: LogStore, led: set[int]) -> None:
        self.store, self.led = store, led

    def leads(self, queue: str, partition: int) -> bool:
        return queue != Q or partition in self.led

    def check_leader(self, queue: str, partition: int) -> None:
        if not self.leads(queue, partition):
            raise NotLeaderError(f"does not lead {queue}[{partition}]")

    def leader_address(self, queue: str, partition: int) -> str | None:
        return None

    def create_queue(self, name: str, config: QueueConfig) -> QueueInfo:
        return self.store.create_queue(name, config)

    def producing(self, queue: str, partition: int) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()


class Side:
    """One broker: its store (partition 0 of ``q`` holds 10 messages, 1 is empty) and its
    shared groups; ``gate`` None while it runs alone."""

    def __init__(self, path: Path, clock: FakeClock) -> None:
        self.path, self.clock = path, clock
        self.gate: Gate | None = None
        self.open()

    def open(self) -> None:
        self.store = LogStore(self.path, clock=self.clock)
        try:
            self.store.describe_queue(Q)
        except QueueNotFoundError:
            self.store.create_queue(Q, QueueConfig(partitions=2), queue_id=QID)
            self.store.append(Q, 0, encode_batch([b"m%d" % i for i in range(10)]))
        self.sg = SharedGroups(self.store, self.clock, cluster=lambda: self.gate)

    def reopen(self) -> None:
        self.store.close()
        self.open()

    def window(self, group: str, partition: int = 0) -> tuple[int, int, dict[int, tuple[int, int]]]:
        """floor, next and {offset: (state, attempts)} of the group's window here."""
        st = self.sg._groups[(group, QID)]
        c = st.cursors[partition]
        return c.floor, c.next, {o: (int(e.state), e.attempts) for o, e in c.entries.items()}


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def sides(tmp_path, clock) -> Iterator[tuple[Side, Side]]:
    a, b = Side(tmp_path / "a", clock), Side(tmp_path / "b", clock)
    try:
        yield a, b
    finally:
        a.store.close()
        b.store.close()


def busy_window(a: Side) -> dict[int, str]:
    """On ``a``: offsets 0 and 2 acked, 1 nacked with a minute's backoff, 3 dead (two
    attempts), 4-7 leased to member m; 8 and 9 never delivered. Returns the leases held."""
    settings = {"max_attempts": 2, "backoff_ms": 60_000}
    res = a.sg.receive("g", Q, "m", max_messages=8, visibility_timeout_ms=30_000, settings=settings)
    lease = {x.offset: x.lease_id for x in res.leases}
    assert sorted(lease) == list(range(8))
    assert a.sg.ack("g", Q, "m", [lease[0], lease[2]]) == []
    assert a.sg.nack("g", Q, "m", [lease[1]], reason="later", delay_ms=60_000) == []
    assert a.sg.nack("g", Q, "m", [lease[3]], delay_ms=0) == []
    (again,) = a.sg.receive("g", Q, "m", max_messages=1, visibility_timeout_ms=30_000).leases
    assert (again.offset, again.attempt) == (3, 2)
    assert a.sg.nack("g", Q, "m", [again.lease_id], reason="broken") == []  # attempts used up: dead
    return lease


def hand_over(a: Side, b: Side, page_bytes: int = 1 << 20) -> list[HandedOffShared]:
    items: list[HandedOffShared] = []
    while True:
        page = a.sg.hand_off(QID, 0, len(items) - 1, page_bytes)
        assert page.batches == []
        items.extend(page.shared)
        if not page.more:
            break
    b.sg.adopt(QID, 0, items)
    return items


def test_a_window_round_trips_finished_stays_finished_and_leases_come_again(sides, clock):
    a, b = sides
    lease = busy_window(a)
    (item,) = hand_over(a, b)
    now_ms = int(clock() * 1000)
    assert (item.group, item.floor, item.next, item.dead_lettered) == ("g", 1, 8, 1)
    assert item.settings.max_attempts == 2 and item.settings.backoff_ms == 60_000
    assert item.entries[1][:2] == (AVAILABLE, 1) and item.entries[1][2] >= now_ms + 59_000
    assert item.entries[2][:2] == (ACKED, 1) and item.entries[3][:2] == (DEAD, 2)
    assert all(item.entries[o] == (AVAILABLE, 1, 0, MOVE_REASON) for o in range(4, 8))
    assert 0 not in item.entries  # below the floor: finished
    assert a.window("g")[2][4] == (LEASED, 1)  # the source keeps its own state (a rollback goes on from it)

    b.reopen()  # adopted durably
    assert b.window("g") == (
        1,
        8,
        {1: (AVAILABLE, 1), 2: (ACKED, 1), 3: (DEAD, 2), **dict.fromkeys(range(4, 8), (AVAILABLE, 1))},
    )
    b.gate = Gate(b.store, set())  # a cluster's member that does not lead the partition yet
    assert b.sg.receive("g", Q, "m", max_messages=100, visibility_timeout_ms=30_000).leases == []
    b.gate = Gate(b.store, {0, 1})  # the switch: b leads the partition
    refused = b.sg.ack("g", Q, "m", [lease[4]])
    assert [r.code for r in refused] == [LeaseExpiredError.code]  # the holder's ack: its message comes again
    res = b.sg.receive("g", Q, "m2", max_messages=100, visibility_timeout_ms=300_000)
    assert sorted((x.offset, x.attempt) for x in res.leases) == [(4, 2), (5, 2), (6, 2), (7, 2), (8, 1), (9, 1)]
    clock.advance(61)  # offset 1's backoff, kept across the move
    res2 = b.sg.receive("g", Q, "m2", max_messages=100, visibility_timeout_ms=300_000)
    assert [(x.offset, x.attempt) for x in res2.leases] == [(1, 2)]
    assert b.sg.ack("g", Q, "m2", [x.lease_id for x in res.leases + res2.leases]) == []
    (p0,) = [p for p in b.sg.describe("g", Q).partitions if p.partition == 0]
    assert (p0.committed_offset, p0.dead_lettered, p0.leased) == (10, 1, 0)


def test_adopting_replaces_older_state_of_the_partition_and_only_of_it(sides):
    a, b = sides
    busy_window(a)
    b.store.append(Q, 1, encode_batch([b"p1"]))
    for group in ("g", "old"):  # b led partition 0 before: it acked everything there, long ago
        res = b.sg.receive(group, Q, "m", max_messages=100, visibility_timeout_ms=30_000)
        b.sg.ack(group, Q, "m", [x.lease_id for x in res.leases if x.partition == 0])
    assert b.window("g") == (10, 10, {}) and b.window("g", 1)[2] == {0: (LEASED, 1)}
    hand_over(a, b)
    b.reopen()
    assert b.window("g")[:2] == (1, 8)  # a's, not b's older one
    assert 0 not in b.sg._groups[("old", QID)].cursors  # a group the source never had there starts over
    assert b.window("g", 1)[2] == b.window("old", 1)[2] == {0: (AVAILABLE, 1)}  # kept (released by the restart)
    assert b.sg._groups[("old", QID)].settings.max_attempts != 2  # a group b knew keeps its own settings


def test_many_groups_are_handed_over_in_pages_as_one(sides):
    a, b = sides
    for i in range(12):
        res = a.sg.receive(f"g{i:02d}", Q, "m", max_messages=1 + i % 5, visibility_timeout_ms=30_000)
        a.sg.ack(f"g{i:02d}", Q, "m", [x.lease_id for x in res.leases[::2]])
    whole = a.sg.hand_off(QID, 0, -1, 1 << 20)
    assert not whole.more and [x.group for x in whole.shared] == [f"g{i:02d}" for i in range(12)]
    paged = hand_over(a, b, page_bytes=1)  # one group a page
    assert paged == whole.shared
    b.reopen()
    for i in range(12):
        assert b.window(f"g{i:02d}")[:2] == a.window(f"g{i:02d}")[:2]


def test_an_ack_lands_before_the_hand_off_or_is_refused_after_it(sides):
    a, b = sides
    a.gate = Gate(a.store, {0, 1})
    res = a.sg.receive("g", Q, "m", max_messages=10, visibility_timeout_ms=30_000)
    leases = [x.lease_id for x in res.leases]
    frozen = threading.Event()
    a.sg.moving = lambda queue, partition: frozen.is_set() and partition == 0
    answered: dict[int, bool] = {}
    started = threading.Event()

    def acker() -> None:
        for i, lease in enumerate(leases):
            started.set()
            try:
                answered[i] = a.sg.ack("g", Q, "m", [lease]) == []
            except NotLeaderError:
                answered[i] = False

    t = threading.Thread(target=acker)
    t.start()
    started.wait(5)
    frozen.set()  # the fence: from here on the partition's state is the target's to take
    (item,) = hand_over(a, b)
    t.join(10)
    acked = {o for o, (state, *_rest) in item.entries.items() if state == ACKED} | set(range(item.floor))
    assert acked == {i for i, ok in answered.items() if ok}  # answered acks are in the hand-off, no other
    with pytest.raises(NotLeaderError, match="moving"):
        a.sg.ack("g", Q, "m", leases[-1:])
    assert a.sg.receive("g", Q, "m", max_messages=10, visibility_timeout_ms=30_000).leases == []  # no lease given
    assert [p.partition for p in a.sg.describe("g", Q).partitions] == [1]


def test_a_rolled_back_adoption_is_forgotten_and_the_source_goes_on_from_its_own_state(sides):
    a, b = sides
    a.gate = Gate(a.store, {0, 1})
    res = a.sg.receive("g", Q, "m", max_messages=4, visibility_timeout_ms=30_000)
    a.sg.ack("g", Q, "m", [res.leases[0].lease_id])
    a.sg.moving = lambda queue, partition: partition == 0
    hand_over(a, b)
    assert b.sg.partitions_with_state() == {(QID, 0)}
    assert b.sg.forget(QID, 0) == 1  # rolled back: b never led at the move's epoch
    b.reopen()
    assert b.sg.partitions_with_state() == set()
    a.sg.moving = None  # unfenced
    assert a.sg.ack("g", Q, "m", [x.lease_id for x in res.leases[1:]]) == []  # the holders' leases are good again
    again = a.sg.receive("g", Q, "m", max_messages=100, visibility_timeout_ms=30_000)
    assert [x.offset for x in again.leases] == list(range(4, 10))  # nothing acked comes again


class Ensemble:
    """The tree of a cluster where broker 1 leads both partitions of ``q`` at leader epoch 3,
    a move of partition 0 to broker 2 in phase fence, and the view a broker's cache gives."""

    def __init__(self) -> None:
        self.coord = MemoryEnsemble().connect()
        for path in (paths.QUEUES, paths.queue(Q), paths.partitions(Q), paths.MOVES, paths.moves_of(Q)):
            self.coord.create(path)
        self.led = PartitionRecord(replicas=[1], leader=1, leader_epoch=3, controller_epoch=1)
        self.move = MoveRecord(source=1, target=2, phase="fence", started_ms=0, controller_epoch=1, leader_epoch=3)
        for n in (0, 1):
            self.coord.create(paths.partition(Q, n), encode(self.led))
        self.coord.create(paths.move(Q, 0), encode(self.move))

    def view(self, moves: dict) -> ClusterView:
        qv = QueueView(
            QueueRecord(queue_id=QID, config={}, created_ms=0, controller_epoch=1), {0: self.led, 1: self.led}
        )
        return ClusterView(queues=MappingProxyType({Q: qv}), moves=MappingProxyType(moves))


def test_the_source_hands_over_only_once_fenced_at_the_moves_epoch_and_goes_on_after_a_rollback(sides):
    """Broker 1 (a) with its real mover: before its fence the hand-off is refused, after it
    the partition's shared calls are; a rolled-back move lifts the fence, and a's members go
    on with their leases, nothing acked delivered again."""
    a, b = sides
    zk = Ensemble()
    a.gate = Gate(a.store, {0, 1})
    current = zk.view({})
    mover = Mover(a.store, zk.coord, 1, lambda: current, lambda: True, lambda task: None)
    moves = DelayedMoves(NoDelay(), a.store, zk.coord, 1, lambda: current, lambda: True, mover, None, shared=a.sg)
    moves.start()
    res = a.sg.receive("g", Q, "m", max_messages=6, visibility_timeout_ms=30_000)
    a.sg.ack("g", Q, "m", [x.lease_id for x in res.leases[:2]])
    with pytest.raises(NotLeaderError, match="has not fenced"):
        moves.hand_off(Q, 0, 3, -1, 1 << 20, shared=True)
    current = zk.view({(Q, 0): zk.move})
    mover.follow(current)  # the fence
    with pytest.raises(NotLeaderError, match="moving"):
        a.sg.ack("g", Q, "m", [res.leases[2].lease_id])
    with pytest.raises(NotLeaderError, match="has not fenced"):
        moves.hand_off(Q, 0, 2, -1, 1 << 20, shared=True)  # an older move's epoch
    page = moves.hand_off(Q, 0, 3, -1, 1 << 20, shared=True)
    assert [(x.group, x.floor, x.next) for x in page.shared] == [("g", 2, 6)] and not page.more
    b.sg.adopt(QID, 0, page.shared)
    zk.coord.delete(paths.move_fenced(Q, 0))
    zk.coord.delete(paths.move(Q, 0))  # rolled back: broker 1 still leads at epoch 3
    current = zk.view({})
    mover.follow(current)
    assert a.sg.ack("g", Q, "m", [x.lease_id for x in res.leases[2:]]) == []  # a goes on from its own state
    again = a.sg.receive("g", Q, "m", max_messages=100, visibility_timeout_ms=30_000)
    assert [x.offset for x in again.leases] == list(range(6, 10))
    moves.close()
    assert a.sg.moving is None


class NoDelay:
    """The delay service as the stray check sees it: no delayed batches anywhere."""

    def partitions_with_batches(self) -> set[tuple[int, int]]:
        return set()


class NotFenced:
    def fenced_epoch(self, queue: str, partition: int) -> int | None:
        return None


def test_a_target_forgets_adopted_state_once_zookeeper_shows_the_move_rolled_back(sides):
    """Broker 2 (b) took partition 0's state in a move from broker 1; while the move is on it
    keeps it, once it is gone with broker 1 still leading it forgets it."""
    a, b = sides
    busy_window(a)
    hand_over(a, b)
    zk = Ensemble()
    # the delay service, the mover and the producing gate are stand-ins: the check reads no more of them
    moves = DelayedMoves(
        NoDelay(), b.store, zk.coord, 2, lambda: zk.view({}), lambda: True, NotFenced(), None, shared=b.sg
    )
    moves.forget_strays(zk.view({(Q, 0): zk.move}))
    assert b.sg.partitions_with_state() == {(QID, 0)}  # the move is on: kept
    moves.forget_strays(zk.view({}))  # the cache shows the move gone, ZooKeeper does not yet
    assert b.sg.partitions_with_state() == {(QID, 0)}
    zk.coord.delete(paths.move(Q, 0))  # rolled back
    moves.forget_strays(zk.view({}))
    assert b.sg.partitions_with_state() == set()
    b.reopen()
    assert b.sg.partitions_with_state() == set()


def test_the_source_forgets_its_state_once_zookeeper_shows_the_new_leader(sides):
    a, _b = sides
    busy_window(a)
    zk = Ensemble()
    moves = DelayedMoves(
        NoDelay(), a.store, zk.coord, 1, lambda: zk.view({}), lambda: True, NotFenced(), None, shared=a.sg
    )
    moved = PartitionRecord(replicas=[2], leader=2, leader_epoch=4, controller_epoch=1)
    zk.coord.set(paths.partition(Q, 0), encode(moved))
    moves.forget_strays(zk.view({(Q, 0): zk.move}))  # the cache still shows the move: kept
    assert a.sg.partitions_with_state() == {(QID, 0), (QID, 1)}
    zk.coord.delete(paths.move(Q, 0))  # switched
    zk.led = moved  # the cache shows broker 2 leading both partitions, ZooKeeper partition 0 only
    moves.forget_strays(zk.view({}))
    assert a.sg.partitions_with_state() == {(QID, 1)}
