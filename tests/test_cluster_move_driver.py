"""The controller's phase logic of moves (``headwater.cluster.moves``) on the in-memory
ensemble: queued moves start in plan order up to the bound, a copy within the lag is fenced,
a fenced and copied move switches in one transaction, and a move that cannot finish rolls
back; a fenced controller changes nothing, and a new controller continues from the tree.
The brokers' side runs on real brokers in tests/test_cluster_moves.py."""

from __future__ import annotations

from types import MappingProxyType

import pytest

from headwater.cluster.controller import ControllerContext, ControllerFencedError
from headwater.cluster.metadata import BrokerInfo, ClusterView
from headwater.cluster.moves import MOVE_OUTCOMES_KEPT, MoveDriver, plan_ops
from headwater.cluster.placement import Move
from headwater.cluster.records import (
    BrokerRecord,
    MoveFenced,
    MoveOutcomes,
    MoveProgress,
    MoveRecord,
    PartitionRecord,
    decode,
    encode,
    paths,
)
from headwater.testing import FakeClock
from headwater.testing.coordination import MemoryEnsemble

Q = "orders"


class World:
    """A tree with queue ``orders`` of ``partitions`` partitions all led by broker 1, the
    live brokers in ``live``, and a controller at epoch 1."""

    def __init__(self, partitions: int = 4) -> None:
        self.coord = MemoryEnsemble().connect()
        self.coord.create(paths.CONTROLLER_EPOCH, b"1")
        self.ctx = ControllerContext(self.coord, 1, 0, self.coord.session_id)
        for path in (paths.QUEUES, paths.MOVES, paths.queue(Q), paths.partitions(Q)):
            self.coord.create(path)
        for n in range(partitions):
            rec = PartitionRecord(replicas=[1], leader=1, leader_epoch=0, controller_epoch=1)
            self.coord.create(paths.partition(Q, n), encode(rec))
        self.live = {1, 2, 3}
        self.clock = FakeClock(1_000_000.0)
        self.driver = MoveDriver(self.coord, self.view, clock=self.clock, running_max=2, fence_lag=10)

    def view(self) -> ClusterView:
        rec = BrokerRecord(broker_id=0, host="h", port=1, version="t", started_ms=0, store_id="s")
        return ClusterView(brokers=MappingProxyType({b: BrokerInfo(rec, b) for b in self.live}))

    def plan(self, *moves: Move) -> None:
        self.ctx.commit(plan_ops(self.coord, self.ctx, self.view(), list(moves), int(self.clock() * 1000)))

    def move(self, n: int) -> MoveRecord | None:
        if self.coord.exists(paths.move(Q, n)) is None:
            return None
        return decode(self.coord.get(paths.move(Q, n))[0], MoveRecord, paths.move(Q, n))

    def phase(self, n: int) -> str | None:
        m = self.move(n)
        return None if m is None else m.phase

    def partition(self, n: int) -> PartitionRecord:
        return decode(self.coord.get(paths.partition(Q, n))[0], PartitionRecord, paths.partition(Q, n))

    def progress(self, n: int, copied: int, source_end: int, *, delayed_taken: bool = True) -> None:
        data = encode(
            MoveProgress(copied_offset=copied, source_end_offset=source_end, updated_ms=0, delayed_taken=delayed_taken)
        )
        if self.coord.exists(paths.move_progress(Q, n)) is None:
            self.coord.create(paths.move_progress(Q, n), data)
        else:
            self.coord.set(paths.move_progress(Q, n), data)

    def outcomes(self) -> list[tuple[int, int, int, str, str]]:
        """/move_outcomes as (partition, source, target, outcome, why), oldest first."""
        raw, _ = self.coord.get(paths.MOVE_OUTCOMES)
        return [
            (o.partition, o.source, o.target, o.outcome, o.why)
            for o in decode(raw, MoveOutcomes, paths.MOVE_OUTCOMES).outcomes
        ]

    def fenced(self, n: int, end: int) -> None:
        self.coord.create(paths.move_fenced(Q, n), encode(MoveFenced(end_offset=end, leader_epoch=0, broker_id=1)))


def test_queued_moves_start_in_plan_order_up_to_the_bound():
    w = World()
    w.plan(Move(Q, 2, 1, 2), Move(Q, 0, 1, 3), Move(Q, 1, 1, 2))
    assert [w.phase(n) for n in (0, 1, 2)] == ["queued"] * 3
    assert w.driver.tick(w.ctx) == 3
    assert [w.phase(n) for n in (2, 0, 1)] == ["copy", "copy", "queued"]  # plan order, not numbers
    assert w.driver.tick(w.ctx) == 3 and w.phase(1) == "queued"  # the bound holds


def test_a_copy_is_fenced_within_the_lag_and_switched_once_copied_to_the_fenced_end():
    w = World()
    w.plan(Move(Q, 0, 1, 2))
    w.driver.tick(w.ctx)
    w.progress(0, copied=100, source_end=500)
    w.driver.tick(w.ctx)
    assert w.phase(0) == "copy"  # 400 behind: not yet
    w.progress(0, copied=495, source_end=500)
    w.driver.tick(w.ctx)
    assert w.phase(0) == "fence"
    w.driver.tick(w.ctx)
    assert w.phase(0) == "fence" and w.partition(0).leader == 1  # the source has not fenced yet
    w.fenced(0, end=503)
    w.driver.tick(w.ctx)
    assert w.phase(0) == "fence"  # the target has not copied up to the fenced end
    w.progress(0, copied=503, source_end=503)
    assert w.driver.tick(w.ctx) == 0
    assert w.move(0) is None and w.coord.children(paths.MOVES) == []  # the move and its queue's node gone
    assert w.partition(0) == PartitionRecord(replicas=[2], leader=2, leader_epoch=1, controller_epoch=1)


def test_a_copied_move_waits_for_its_delayed_messages_to_be_taken_before_the_switch():
    w = World()
    w.plan(Move(Q, 0, 1, 2))
    w.driver.tick(w.ctx)
    w.progress(0, copied=10, source_end=10, delayed_taken=False)
    w.driver.tick(w.ctx)
    w.fenced(0, end=10)
    w.driver.tick(w.ctx)
    assert w.phase(0) == "fence" and w.partition(0).leader == 1  # copied, but the schedule is not taken
    w.progress(0, copied=10, source_end=10, delayed_taken=True)
    w.driver.tick(w.ctx)
    assert w.move(0) is None and w.partition(0).leader == 2


@pytest.mark.parametrize("phase", ["queued", "copy", "fence"])
def test_a_move_whose_target_is_gone_rolls_back(phase):
    w = World()
    w.plan(Move(Q, 0, 1, 2))
    if phase != "queued":
        w.driver.tick(w.ctx)
    if phase == "fence":
        w.progress(0, 500, 500)
        w.driver.tick(w.ctx)
        w.fenced(0, 500)
    assert w.phase(0) == phase
    w.live.discard(2)
    w.driver.tick(w.ctx)
    assert w.move(0) is None and w.coord.exists(paths.move_fenced(Q, 0)) is None
    assert w.partition(0).leader == 1 and w.partition(0).leader_epoch == 0
    why = "broker 2 is not live" if phase == "queued" else "its target, broker 2, is not live"
    assert w.outcomes() == [(0, 1, 2, "rolled back", why)]


def test_a_fenced_source_that_dies_still_switches_once_the_target_has_its_end():
    w = World()
    w.plan(Move(Q, 0, 1, 2))
    w.driver.tick(w.ctx)
    w.progress(0, 500, 500)
    w.driver.tick(w.ctx)
    w.fenced(0, 500)
    w.live.discard(1)
    w.driver.tick(w.ctx)
    assert w.move(0) is None and w.partition(0).leader == 2


def test_a_copy_that_takes_too_long_rolls_back_and_a_stale_plan_is_void():
    w = World()
    w.driver.copy_timeout_s = 60
    w.plan(Move(Q, 0, 1, 2), Move(Q, 1, 1, 3))
    w.driver.tick(w.ctx)
    w.clock.advance(61)
    w.coord.set(
        paths.partition(Q, 1), encode(PartitionRecord(replicas=[3], leader=3, leader_epoch=4, controller_epoch=1))
    )
    w.driver.tick(w.ctx)
    assert w.move(0) is None and w.move(1) is None
    assert w.partition(0).leader == 1 and w.partition(1).leader_epoch == 4
    assert w.outcomes() == [
        (0, 1, 2, "rolled back", "the copy took 61 s, past its limit of 60 s"),
        (1, 1, 3, "rolled back", "its partition is gone or changed owner since the move was planned"),
    ]


def test_a_fenced_controller_changes_nothing_and_a_new_one_continues():
    w = World()
    w.plan(Move(Q, 0, 1, 2))
    w.driver.tick(w.ctx)
    w.progress(0, 500, 500)
    w.driver.tick(w.ctx)
    w.fenced(0, 500)
    w.coord.set(paths.CONTROLLER_EPOCH, b"2")  # another controller was elected meanwhile
    with pytest.raises(ControllerFencedError):
        w.driver.tick(w.ctx)
    assert w.phase(0) == "fence" and w.partition(0).leader == 1
    new = ControllerContext(w.coord, 2, 1, w.coord.session_id)
    assert MoveDriver(w.coord, w.view).tick(new) == 0
    assert w.partition(0) == PartitionRecord(replicas=[2], leader=2, leader_epoch=1, controller_epoch=2)


def test_how_each_move_ended_is_recorded_with_why_and_the_latest_are_kept():
    """The operator's tools say what became of a move (cluster rebalance/decommission): the
    controller records each end in the transaction that ends it, a rollback with its reason
    (the target's own words when it cannot take the partition)."""
    w = World()
    w.plan(Move(Q, 0, 1, 2), Move(Q, 1, 1, 3), Move(Q, 2, 1, 2))
    w.driver.tick(w.ctx)
    w.progress(0, 5, 5)
    w.driver.tick(w.ctx)
    w.fenced(0, 5)
    w.driver.tick(w.ctx)  # partition 0 switches
    cannot = "it held orders[1] before, up to offset 100, and cannot take the messages from 0"
    w.coord.create(
        paths.move_progress(Q, 1),
        encode(MoveProgress(copied_offset=0, source_end_offset=0, updated_ms=0, error=cannot)),
    )
    w.live.discard(2)  # and partition 2's target goes, before its move started
    w.driver.tick(w.ctx)
    assert w.outcomes() == [
        (0, 1, 2, "moved", ""),
        (1, 1, 3, "rolled back", f"broker 3 cannot take it: {cannot}"),
        (2, 1, 2, "rolled back", "broker 2 is not live"),
    ]
    assert w.partition(1).leader == 1 and w.partition(0).leader == 2
    w.live.add(2)
    for _ in range(MOVE_OUTCOMES_KEPT // 2):  # many more moves: only the latest are kept
        w.plan(Move(Q, 3, 1, 2), Move(Q, 2, 1, 3))
        w.driver.tick(w.ctx)
        w.live.discard(2), w.live.discard(3)
        w.driver.tick(w.ctx)
        w.live.update({2, 3})
    kept = w.outcomes()
    assert len(kept) == MOVE_OUTCOMES_KEPT and kept[-1][:4] == (2, 1, 3, "rolled back")
