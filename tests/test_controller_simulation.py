"""A seeded simulation of the controller's election against the in-memory ensemble.

N candidates stand; each step draws a fault (a session expired, a candidate closed and
restarted on a new session, a candidate's event delivery paused or resumed, a candidate
stalled in the middle of its election, between reading the epoch and its transaction, or let
go on) and then every
context ever elected, current or stale, tries a write of ``epoch:value`` to one counter node,
once while the election reacts and once after it settles. After every step:

- the epochs granted (the history of ``/controller_epoch``, as a watch of an observer sees
  it, in order) only grow, one at a time, and each elected context has its own;
- every write the counter took came from the context at the highest epoch granted by then,
  and exactly the writes its callers were told were accepted are there;
- at most one unfenced context is at the highest epoch, and a stale one stays unfenced only
  while its candidate is paused or stalled (it has heard nothing yet);
- after delivery resumes and the faults stop (every few steps and at the end), exactly one
  controller exists: /controller names it, it leads, every other context is fenced, and its
  write is taken.

The seed and the steps are printed on failure. Threads run the elections, so the same seed
draws the same faults, though who wins a race inside a step may differ from run to run.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from headwater.cluster.controller import ControllerContext, ControllerElection, ControllerFencedError
from headwater.cluster.coordination import Create, Op, Set, Stat
from headwater.cluster.records import ControllerRecord, decode, paths
from headwater.testing.coordination import MemoryCoordination, MemoryEnsemble

COUNTER = "/counter"
HEAL_EVERY_STEPS = 25  # resume everyone, fault nothing, and require one controller
SETTLE_TIMEOUT_S = 20.0


def eventually(check: Callable[[], bool], what: str, timeout_s: float = SETTLE_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"{what} did not come about in {timeout_s:g} s"
        time.sleep(0.001)


class StallableCoordination:
    """A candidate's session whose election transactions wait at a door while it is shut: the
    candidate stalls after it read the epoch, as a process paused mid-election."""

    def __init__(self, inner: MemoryCoordination) -> None:
        self.inner = inner
        self.door = threading.Event()
        self.door.set()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    @property
    def session_id(self) -> int:
        return self.inner.session_id

    def commit(self, ops: Sequence[Op]) -> None:
        if any(type(op) is Create and op.path == paths.CONTROLLER for op in ops):
            assert self.door.wait(SETTLE_TIMEOUT_S * 3), "a stalled election was never let go"
        self.inner.commit(ops)


@dataclass
class Candidate:
    """One broker's election on one session, and what its callbacks told."""

    broker_id: int
    coord: Any  # a StallableCoordination over a MemoryCoordination
    lock: threading.Lock = field(default_factory=threading.Lock)
    told: list[tuple[str, int]] = field(default_factory=list)
    contexts: list[ControllerContext] = field(default_factory=list)
    paused: bool = False
    stalled: bool = False
    election: ControllerElection | None = None

    def start(self) -> Candidate:
        self.election = ControllerElection(
            self.coord, self.broker_id, on_elected=self._elected, on_resigned=self._resigned
        )
        self.election.start()
        return self

    def _elected(self, ctx: ControllerContext) -> None:
        with self.lock:
            assert not self.told or self.told[-1][0] == "resigned", f"broker {self.broker_id} elected twice"
            assert not self.told or self.told[-1][1] < ctx.epoch, f"broker {self.broker_id}: epoch went back"
            self.contexts.append(ctx)
            self.told.append(("elected", ctx.epoch))

    def _resigned(self) -> None:
        with self.lock:
            assert self.told and self.told[-1][0] == "elected", f"broker {self.broker_id} resigned unelected"
            self.told.append(("resigned", self.told[-1][1]))

    @property
    def leading(self) -> ControllerContext | None:
        with self.lock:
            return self.contexts[-1] if self.told and self.told[-1][0] == "elected" else None


class Observer:
    """The history of the epoch and of the counter, interleaved as one session hears them."""

    def __init__(self, coord: MemoryCoordination) -> None:
        self.coord = coord
        self.lock = threading.Lock()
        self.history: list[tuple[str, int, int]] = []  # ("epoch", epoch, 0) | ("write", epoch, value)
        self.versions = {paths.CONTROLLER_EPOCH: -1, COUNTER: -1}
        coord.watch_data(paths.CONTROLLER_EPOCH, self._on_epoch)
        coord.watch_data(COUNTER, self._on_counter)

    def _on_epoch(self, data: bytes | None, stat: Stat | None) -> None:
        if data is not None and stat is not None:
            with self.lock:
                self.history.append(("epoch", int(data), 0))
                self.versions[paths.CONTROLLER_EPOCH] = stat.version

    def _on_counter(self, data: bytes | None, stat: Stat | None) -> None:
        if data is not None and stat is not None:
            epoch, value = (int(x) for x in data.split(b":"))
            with self.lock:
                self.history.append(("write", epoch, value))
                self.versions[COUNTER] = stat.version

    def caught_up(self) -> bool:
        with self.lock:
            return all(self.coord.get(path)[1].version == v for path, v in self.versions.items())


class Simulation:
    def __init__(self, seed: int, candidates: int) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.ensemble = MemoryEnsemble()
        setup = self.ensemble.connect()
        setup.create(paths.CONTROLLER_EPOCH, b"0")
        setup.create(COUNTER, b"0:0")
        self.observer = Observer(self.ensemble.connect())
        self.candidates = [self.candidate(b) for b in range(1, candidates + 1)]
        self.retired: list[Candidate] = []  # closed and restarted: their contexts stay, fenced
        self.accepted: list[tuple[int, int]] = []  # (epoch, value) of the writes told accepted
        self.next_value = 1
        self.steps: list[str] = []

    def candidate(self, broker_id: int) -> Candidate:
        return Candidate(broker_id, StallableCoordination(self.ensemble.connect())).start()

    # -- faults -------------------------------------------------------------------------------

    def step(self, number: int) -> None:
        if number % HEAL_EVERY_STEPS == HEAL_EVERY_STEPS - 1:
            self.steps.append("heal")
            self.heal()
            return
        c = self.rng.choice(self.candidates)
        kind = self.rng.choices(["expire", "restart", "pause", "stall", "nothing"], weights=[4, 2, 3, 2, 2])[0]
        if kind == "pause" and c.paused:
            kind = "resume"
        if kind == "stall" and c.stalled:
            kind = "unstall"
        self.steps.append(f"{kind} {c.broker_id}")
        if kind == "expire":
            self.ensemble.expire(c.coord.session_id)
        elif kind == "restart":
            self.restart(c)
        elif kind == "pause":
            c.paused = True
            c.coord.hold_events()
        elif kind == "resume":
            c.paused = False
            c.coord.release_events()
        elif kind == "stall":
            c.stalled = True
            c.coord.door.clear()
        elif kind == "unstall":
            c.stalled = False
            c.coord.door.set()
        self.write_all()  # while the elections react
        self.settle()
        self.write_all()
        self.check()

    def restart(self, c: Candidate) -> None:
        assert c.election is not None
        c.coord.door.set()  # close waits for the election's thread
        c.election.close()
        c.coord.close()
        self.retired.append(c)
        self.candidates[self.candidates.index(c)] = self.candidate(c.broker_id)

    def write_all(self) -> None:
        contexts = [ctx for c in self.candidates + self.retired for ctx in list(c.contexts)]
        self.rng.shuffle(contexts)
        for ctx in contexts:
            value, self.next_value = self.next_value, self.next_value + 1
            was_fenced = ctx.fenced
            try:
                ctx.commit([Set(COUNTER, f"{ctx.epoch}:{value}".encode())])
            except ControllerFencedError:
                assert ctx.fenced, "a refused context must stay fenced"
                continue
            assert not was_fenced, f"a fenced context (epoch {ctx.epoch}) wrote"
            self.accepted.append((ctx.epoch, value))

    def heal(self) -> None:
        for c in self.candidates:
            if c.paused:
                c.paused = False
                c.coord.release_events()
            if c.stalled:
                c.stalled = False
                c.coord.door.set()
        self.settle()
        leader = self.one_controller()
        ctx = leader.leading
        assert ctx is not None
        value, self.next_value = self.next_value, self.next_value + 1
        ctx.commit([Set(COUNTER, f"{ctx.epoch}:{value}".encode())])
        self.accepted.append((ctx.epoch, value))
        self.check()

    # -- waiting and checking ---------------------------------------------------------------

    def record(self) -> tuple[ControllerRecord | None, int]:
        """/controller as (record, owning session), or (None, 0)."""
        try:
            data, stat = self.observer.coord.get(paths.CONTROLLER)
        except Exception:  # gone between the look and the read: absent
            return None, 0
        return decode(data, ControllerRecord, paths.CONTROLLER), stat.ephemeral_owner

    def settled(self, c: Candidate) -> bool:
        """Whether ``c``'s election agrees with the tree: it sees what /controller holds, and
        leads exactly when /controller names its session and context."""
        assert c.election is not None
        record, owner = self.record()
        ctx = c.leading
        names_it = (
            record is not None
            and record.broker_id == c.broker_id
            and owner == c.coord.session_id
            and ctx is not None
            and ctx.epoch == record.epoch
        )
        return c.election.controller == record and (ctx is None or names_it)

    def settle(self) -> None:
        awake = [c for c in self.candidates if not (c.paused or c.stalled)]
        eventually(
            lambda: all(self.settled(c) for c in awake) and self.record()[0] is not None or not awake, "settling"
        )
        eventually(self.observer.caught_up, "the observer catching up")

    def one_controller(self) -> Candidate:
        leaders = [c for c in self.candidates if c.leading is not None]
        record, owner = self.record()
        assert len(leaders) == 1 and record is not None, f"not one controller: {leaders}, {record}"
        (leader,) = leaders
        ctx = leader.leading
        assert ctx is not None and not ctx.fenced
        assert record == ControllerRecord(broker_id=leader.broker_id, epoch=ctx.epoch)
        assert owner == leader.coord.session_id
        others = [x for c in self.candidates + self.retired for x in c.contexts if x is not ctx]
        assert all(x.fenced for x in others), "a stale context is unfenced after healing"
        return leader

    def _snapshot(self) -> tuple[list, list]:
        """The observer's history and every candidate's contexts, as of one moment: an
        election may still grant an epoch after the observer caught up (a step's expiry
        reaching a candidate late), and a context of it read after the history is then
        newer than the history; look again until none is."""
        deadline = time.monotonic() + 10
        while True:
            eventually(self.observer.caught_up, "the observer catching up")
            with self.observer.lock:
                history = list(self.observer.history)
            contexts = [ctx for c in self.candidates + self.retired for ctx in c.contexts]
            top = max((e for kind, e, _ in history if kind == "epoch"), default=0)
            if max((ctx.epoch for ctx in contexts), default=0) <= top or time.monotonic() > deadline:
                return history, contexts
            time.sleep(0.01)

    def check(self) -> None:
        history, contexts = self._snapshot()
        epoch, written = 0, []
        for kind, e, value in history:
            if kind == "epoch":
                assert e == epoch + 1 or (e == 0 and epoch == 0), f"epoch {e} granted after {epoch}"
                epoch = e
            elif value:
                assert e == epoch, f"write {value} of epoch {e} taken while epoch {epoch} was the highest"
                written.append((e, value))
        assert sorted(written) == sorted(self.accepted), "the writes taken are not the writes told accepted"
        epochs = [ctx.epoch for ctx in contexts]
        assert len(set(epochs)) == len(epochs), f"one epoch granted twice: {sorted(epochs)}"
        assert max(epochs, default=0) <= epoch
        newest = [ctx for ctx in contexts if not ctx.fenced and ctx.epoch == epoch]
        assert len(newest) <= 1
        paused = {id(x) for c in self.candidates if c.paused or c.stalled for x in c.contexts}
        stale = [ctx.epoch for ctx in contexts if not ctx.fenced and ctx.epoch < epoch and id(ctx) not in paused]
        assert not stale, f"contexts of epochs {stale} unfenced though their candidates heard of epoch {epoch}"

    def close(self) -> None:
        for c in self.candidates:
            assert c.election is not None
            c.coord.door.set()
            c.election.close()
            c.coord.close()
        self.observer.coord.close()


def simulate(seed: int, steps: int, candidates: int = 3) -> None:
    sim = Simulation(seed, candidates)
    try:
        sim.settle()
        for number in range(steps):
            sim.step(number)
        sim.heal()
        assert len(sim.accepted) > 0
    except BaseException:
        print(f"controller simulation failed: seed {seed}, {candidates} candidates, steps:")
        print(", ".join(sim.steps))
        raise
    finally:
        sim.close()


@pytest.mark.parametrize("seed", range(1, 9))
def test_the_controller_simulation(seed):
    simulate(seed, steps=300, candidates=2 + seed % 2)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(100, 140))
def test_the_controller_simulation_long(seed):
    simulate(seed, steps=600, candidates=2 + seed % 4)


def test_held_events_come_in_order_once_released():
    ensemble = MemoryEnsemble()
    held, awake, writer = ensemble.connect(), ensemble.connect(), ensemble.connect()
    seen: dict[str, list[bytes | None]] = {"held": [], "awake": []}
    held.watch_data("/n", lambda d, s: seen["held"].append(d))
    awake.watch_data("/n", lambda d, s: seen["awake"].append(d))
    eventually(lambda: seen == {"held": [None], "awake": [None]}, "the first calls")
    held.hold_events()
    writer.create("/n", b"1")
    writer.set("/n", b"2")
    ensemble.expire(held.session_id)
    eventually(lambda: seen["awake"] == [None, b"1", b"2"], "the awake session's events")
    assert seen["held"] == [None]
    held.create("/m", b"its operations work meanwhile")
    held.release_events()
    eventually(lambda: seen["held"] == [None, b"1", b"2"], "the held events")
    for c in (held, awake, writer):
        c.close()
