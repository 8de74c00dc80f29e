"""A seeded simulation of the controller's placement and move state machine
(``headwater.cluster.moves``, ``headwater.cluster.placement``) on the in-memory ensemble.

The brokers are simulated here, not run: each holds a prefix of every partition's one log
(the model of its data), a producer appends to a partition's leader while it is not fenced,
a move's target copies from its source and reports ``progress`` (sometimes an ``error``),
and a source in phase ``fence`` publishes ``fenced`` at its end offset and takes no sends
until its move is gone. Each step draws one of: plan a rebalance or a decommission (skipped
while moves are unfinished, as the admin path does), a copy, a fence, a fence of an earlier
move published late (at an older leader epoch: the broker writes ``fenced`` unconditionally),
a produce, a broker's death or return, a new controller (the old context kept, and sometimes
used: it must change nothing), the clock's advance, or a tick of the move driver. After
every step:

- every partition has exactly one leader, a broker id, its only replica;
- a leader epoch only grows, by exactly one at a change of leader, and only when the move
  that switched it was fenced at that epoch and copied to its end: the new leader holds
  every offset the old one acknowledged;
- a move that ends without a switch leaves the partition on its source at the same epoch;
- a stale controller's tick or plan changes nothing in the tree.

At the end the faults stop, every broker is live, the moves left finish or roll back, and
one more rebalance driven to its end leaves every broker within one partition of another.
The seed and the steps are printed on failure; everything is single-threaded, so a seed
replays exactly.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from types import MappingProxyType
from typing import TypeVar

import msgspec
import pytest

from headwater.cluster.controller import ControllerContext, ControllerFencedError
from headwater.cluster.metadata import BrokerInfo, ClusterView, QueueView
from headwater.cluster.moves import MoveDriver, plan_ops
from headwater.cluster.placement import PlacementError, apply_moves, plan_decommission, plan_rebalance
from headwater.cluster.records import (
    BrokerRecord,
    MoveFenced,
    MoveProgress,
    MoveRecord,
    PartitionRecord,
    QueueRecord,
    decode,
    encode,
    paths,
)
from headwater.testing import FakeClock
from headwater.testing.coordination import MemoryEnsemble

Key = tuple[str, int]
R = TypeVar("R", bound=msgspec.Struct)
FENCE_LAG = 5
COPY_TIMEOUT_S = 120.0
FENCE_TIMEOUT_S = 30.0
HEAL_ROUNDS = 200  # rounds of copy, fence, tick and clock at the end before a move must be gone


@dataclass(frozen=True)
class Seen:
    """A partition's record and its move as one snapshot of the tree read them."""

    part: PartitionRecord
    move: MoveRecord | None
    fenced: MoveFenced | None
    progress: MoveProgress | None


class Simulation:
    """One seeded run: the tree on the in-memory ensemble, the brokers' model, the controllers."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.steps: list[str] = []
        self.coord = MemoryEnsemble().connect()
        self.clock = FakeClock(1_000_000.0)
        self.brokers = list(range(1, self.rng.randint(2, 5) + 1))
        self.live = set(self.brokers)
        for path in (paths.BROKERS, paths.QUEUES, paths.MOVES):
            self.coord.create(path)
        for b in self.brokers:
            self._register(b)
        self.coord.create(paths.CONTROLLER_EPOCH, b"1")
        self.ctx = ControllerContext(self.coord, 1, 0, self.coord.session_id)
        self.stale: list[ControllerContext] = []
        self.end: dict[Key, int] = {}  # the log's end: every offset below was acknowledged
        self.held: dict[tuple[int, Key], int] = {}  # (broker, partition): the prefix it holds
        self.latched: set[Key] = set()  # partitions whose source fenced for the move there now
        self.fences: list[tuple[Key, MoveFenced]] = []  # every fence published, for late ones
        for q in range(self.rng.randint(1, 3)):
            name = f"q{q}"
            self.coord.create(
                paths.queue(name), encode(QueueRecord(queue_id=q, config={}, created_ms=0, controller_epoch=1))
            )
            self.coord.create(paths.partitions(name))
            for n in range(self.rng.randint(1, 4)):
                leader = self.rng.choice(self.brokers)
                rec = PartitionRecord(replicas=[leader], leader=leader, leader_epoch=0, controller_epoch=1)
                self.coord.create(paths.partition(name, n), encode(rec))
                self.end[(name, n)] = 0
        self.driver = MoveDriver(
            self.coord,
            self.view,
            clock=self.clock,
            running_max=2,
            fence_lag=FENCE_LAG,
            copy_timeout_s=COPY_TIMEOUT_S,
            fence_timeout_s=FENCE_TIMEOUT_S,
        )
        self.seen = self.read()

    # the tree, read
    def _register(self, b: int) -> None:
        rec = BrokerRecord(broker_id=b, host="127.0.0.1", port=9000 + b, version="t", started_ms=0, store_id=f"s{b}")
        self.coord.create(paths.broker(b), encode(rec))

    def view(self) -> ClusterView:
        brokers = {}
        for name in self.coord.children(paths.BROKERS):
            raw, stat = self.coord.get(paths.broker(int(name)))
            brokers[int(name)] = BrokerInfo(decode(raw, BrokerRecord, name), stat.created_zxid)
        queues = {}
        for q in self.coord.children(paths.QUEUES):
            rec = decode(self.coord.get(paths.queue(q))[0], QueueRecord, q)
            parts = {int(n): self.partition((q, int(n))) for n in self.coord.children(paths.partitions(q))}
            queues[q] = QueueView(rec, MappingProxyType(parts))
        moves = {key: s.move for key, s in self.read().items() if s.move is not None}
        return ClusterView(
            brokers=MappingProxyType(brokers), queues=MappingProxyType(queues), moves=MappingProxyType(moves)
        )

    def partition(self, key: Key) -> PartitionRecord:
        path = paths.partition(*key)
        return decode(self.coord.get(path)[0], PartitionRecord, path)

    def _get(self, path: str, kind: type[R]) -> R | None:
        if self.coord.exists(path) is None:
            return None
        return decode(self.coord.get(path)[0], kind, path)

    def read(self) -> dict[Key, Seen]:
        out = {}
        for key in self.end:
            move = self._get(paths.move(*key), MoveRecord)
            fenced = self._get(paths.move_fenced(*key), MoveFenced)
            progress = self._get(paths.move_progress(*key), MoveProgress)
            out[key] = Seen(self.partition(key), move, fenced, progress)
        return out

    def snapshot(self, path: str = "/") -> dict[str, tuple[bytes, int]]:
        out = {}
        for name in self.coord.children(path):
            child = f"{path.rstrip('/')}/{name}"
            raw, stat = self.coord.get(child)
            out[child] = (raw, stat.version)
            out.update(self.snapshot(child))
        return out

    # the brokers' side
    def produce(self, key: Key) -> None:
        s = self.seen[key]
        leader = s.part.leader
        if leader not in self.live or key in self.latched:
            return  # a dead leader takes nothing; a fenced source refuses until its move is gone
        if self.held.get((leader, key), 0) != self.end[key]:
            raise AssertionError(f"{key}: leader {leader} does not hold the log's end {self.end[key]}")
        self.end[key] += self.rng.randint(1, 20)
        self.held[(leader, key)] = self.end[key]

    def copy(self, key: Key) -> None:
        m = self.seen[key].move
        if m is None or m.phase not in ("copy", "fence") or m.target not in self.live or m.source not in self.live:
            return
        source_end = self.held.get((m.source, key), 0)
        if self.seen[key].progress is None:
            self.held[(m.target, key)] = 0  # a new move's target starts an empty copy
        have = self.held.get((m.target, key), 0)
        copied = min(source_end, have + self.rng.randint(0, 60))
        self.held[(m.target, key)] = copied
        error = "disk full" if self.rng.random() < 0.02 else ""
        self._put(
            paths.move_progress(*key),
            MoveProgress(copied_offset=copied, source_end_offset=source_end, updated_ms=0, error=error),
        )

    def fence(self, key: Key) -> None:
        s = self.seen[key]
        m = s.move
        if m is None or m.phase != "fence" or key in self.latched or m.source not in self.live:
            return
        self.latched.add(key)  # the source refuses sends from now until its move is gone
        rec = MoveFenced(
            end_offset=self.held.get((m.source, key), 0), leader_epoch=s.part.leader_epoch, broker_id=m.source
        )
        self._put(paths.move_fenced(*key), rec)
        self.fences.append((key, rec))

    def late_fence(self, key: Key) -> None:
        """A fence of an earlier move of ``key`` (at an older leader epoch), published late
        into the move there now: the broker creates or sets ``fenced`` unconditionally."""
        m = self.seen[key].move
        old = [rec for k, rec in self.fences if k == key and rec.leader_epoch < self.seen[key].part.leader_epoch]
        if m is not None and m.phase in ("copy", "fence") and old:
            self._put(paths.move_fenced(*key), self.rng.choice(old))

    def _put(self, path: str, rec: msgspec.Struct) -> None:
        data = encode(rec)
        if self.coord.exists(path) is None:
            self.coord.create(path, data)
        else:
            self.coord.set(path, data)

    # the controller's side
    def plan(self, op: str, ctx: ControllerContext) -> None:
        view = self.view()
        if view.moves:
            return  # the admin path refuses while moves are unfinished
        live = sorted(view.brokers)
        assignment = {k: r for k, r in view.assignment().items() if all(b in view.brokers for b in r)}
        try:
            if op == "rebalance":
                moves = plan_rebalance(assignment, live, {})
            else:
                moves = plan_decommission(assignment, live, {}, self.rng.choice(live))
        except PlacementError:
            return
        apply_moves(assignment, moves)  # raises if a move names a replica that is not there
        if moves:
            ctx.commit(plan_ops(self.coord, ctx, view, moves, int(self.clock() * 1000)))

    def new_controller(self) -> None:
        epoch = self.ctx.epoch + 1
        stat = self.coord.set(paths.CONTROLLER_EPOCH, str(epoch).encode())
        self.stale.append(self.ctx)
        self.ctx = ControllerContext(self.coord, epoch, stat.version, self.coord.session_id)

    def stale_acts(self) -> None:
        old = self.rng.choice(self.stale)
        before = self.snapshot()
        try:
            if self.rng.random() < 0.7:
                self.driver.tick(old)
            else:
                self.plan("rebalance", old)
        except ControllerFencedError:
            pass
        assert self.snapshot() == before, f"stale controller epoch {old.epoch} changed the tree"

    # one step
    def step(self) -> None:
        keys = sorted(self.end)
        r = self.rng.random()
        key = self.rng.choice(keys)
        moving = [k for k in keys if self.seen[k].move is not None]
        if moving and self.rng.random() < 0.8:
            key = self.rng.choice(moving)  # the brokers of a move work at it, mostly
        if r < 0.05:
            what = self.rng.choice(["rebalance", "decommission"])
            self.steps.append(what)
            self.plan(what, self.ctx)
        elif r < 0.25:
            self.steps.append(f"copy {key}")
            self.copy(key)
        elif r < 0.34:
            self.steps.append(f"fence {key}")
            self.fence(key)
        elif r < 0.35:
            self.steps.append(f"late fence {key}")
            self.late_fence(key)
        elif r < 0.50:
            self.steps.append(f"produce {key}")
            self.produce(key)
        elif r < 0.52:
            dead = sorted(set(self.brokers) - self.live)
            b = self.rng.choice(dead if dead and self.rng.random() < 0.6 else self.brokers)
            if b in self.live and len(self.live) > 1:
                self.steps.append(f"broker {b} dies")
                self.coord.delete(paths.broker(b))
                self.live.discard(b)
            elif b not in self.live:
                self.steps.append(f"broker {b} returns")
                self._register(b)
                self.live.add(b)
        elif r < 0.59:
            self.steps.append(f"controller epoch {self.ctx.epoch + 1}")
            self.new_controller()
        elif r < 0.63:
            if self.stale:
                self.steps.append("a stale controller acts")
                self.stale_acts()
        elif r < 0.75:
            dt = self.rng.choice([1.0] * 14 + [5.0, 5.0, FENCE_TIMEOUT_S + 1, COPY_TIMEOUT_S + 1])
            self.steps.append(f"clock +{dt:g} s")
            self.clock.advance(dt)
        else:
            self.steps.append("tick")
            self.driver.tick(self.ctx)
        self.check()

    # the invariants
    def check(self) -> None:
        now = self.read()
        for key, s in now.items():
            before = self.seen[key]
            p, old = s.part, before.part
            assert p.leader in self.brokers and p.replicas == [p.leader], f"{key}: one leader, a broker: {p}"
            if s.move is not None:
                assert s.move.leader_epoch == p.leader_epoch and s.move.source == p.leader, f"{key}: {s.move} for {p}"
            if p.leader != old.leader or p.leader_epoch != old.leader_epoch:
                self._check_switch(key, before, s)
            elif before.move is not None and s.move is None:
                # rolled back: the partition stays on its source at the same epoch (checked above)
                assert p.leader == before.move.source
            if s.move is None:
                self.latched.discard(key)  # rolled back, the source takes sends again; switched, it leads no more
        self.seen = now

    def _check_switch(self, key: Key, before: Seen, s: Seen) -> None:
        p, old, m = s.part, before.part, before.move
        assert p.leader_epoch == old.leader_epoch + 1, f"{key}: leader epoch {old.leader_epoch} -> {p.leader_epoch}"
        assert p.leader != old.leader, f"{key}: a new leader epoch without a new leader"
        assert m is not None and s.move is None, f"{key}: switched to {p.leader} without a move"
        assert p.leader == m.target and old.leader == m.source, f"{key}: switched to {p.leader} by {m}"
        assert m.target in self.live, f"{key}: switched to broker {m.target}, not live"
        f = before.fenced
        assert f is not None and f.leader_epoch == old.leader_epoch, f"{key}: switched without a fence at its epoch"
        held = self.held.get((p.leader, key), 0)
        assert held >= f.end_offset, f"{key}: switched to a target that has {held} of the fenced end {f.end_offset}"
        assert held >= self.end[key], f"{key}: acknowledged offsets lost: new leader has {held} of {self.end[key]}"

    # the end
    def heal(self) -> None:
        self.steps.append("heal")
        for b in self.brokers:
            if b not in self.live:
                self._register(b)
                self.live.add(b)
        self.check()
        self.drive("the moves left")
        self.plan("rebalance", self.ctx)
        self.check()
        self.drive("the last rebalance")
        counts = dict.fromkeys(self.brokers, 0)
        for key in self.end:
            counts[self.partition(key).leader] += 1
        assert max(counts.values()) - min(counts.values()) <= 1, f"not balanced at the end: {counts}"

    def drive(self, what: str) -> None:
        for _ in range(HEAL_ROUNDS):
            for key in sorted(self.end):
                self.copy_all(key)
                self.fence(key)
            self.check()  # the brokers' writes, seen before the tick that reads them
            left = self.driver.tick(self.ctx)
            self.check()
            if left == 0 and not self.coord.children(paths.MOVES):
                return
            self.clock.advance(1.0)
        raise AssertionError(f"{what} did not finish in {HEAL_ROUNDS} rounds: {self.coord.children(paths.MOVES)}")

    def copy_all(self, key: Key) -> None:
        m = self.seen[key].move
        if m is None or m.phase not in ("copy", "fence"):
            return
        end = self.held.get((m.source, key), 0)
        self.held[(m.target, key)] = end
        self._put(paths.move_progress(*key), MoveProgress(copied_offset=end, source_end_offset=end, updated_ms=0))


def simulate(seed: int, steps: int) -> None:
    sim = Simulation(seed)
    try:
        for _ in range(steps):
            sim.step()
        sim.heal()
    except BaseException:
        print(f"move simulation failed: seed {seed}, {len(sim.brokers)} brokers, steps:")
        print(", ".join(sim.steps))
        raise
    finally:
        sim.coord.close()


@pytest.mark.parametrize("seed", range(1, 11))
def test_the_move_simulation(seed: int) -> None:
    simulate(seed, steps=400)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(100, 200))
def test_the_move_simulation_long(seed: int) -> None:
    simulate(seed, steps=3000)


def test_the_simulation_moves_partitions_and_stale_controllers_act() -> None:
    """The faults and moves above happen: a test that never switched a partition nor let a
    stale controller act could not fail."""
    switched = stale = rolled_back = 0
    for seed in range(1, 11):
        sim = Simulation(seed)
        for _ in range(400):
            before = {k: s.part.leader_epoch for k, s in sim.seen.items()}
            had = {k for k, s in sim.seen.items() if s.move is not None}
            sim.step()
            switched += sum(sim.seen[k].part.leader_epoch > e for k, e in before.items())
            rolled_back += sum(
                1 for k in had if sim.seen[k].move is None and sim.seen[k].part.leader_epoch == before[k]
            )
            stale += sim.steps[-1:] == ["a stale controller acts"]
        sim.coord.close()
    assert switched >= 10 and rolled_back >= 10 and stale >= 10, (switched, rolled_back, stale)
