"""The controller's side of moving partitions (``docs/design/cluster.md``, "Moving a
partition (factor 1)").

A plan (``rebalance``, ``decommission``: :func:`plan_ops`) writes each move as
``/moves/<q>/<n>`` in phase ``queued``, in the order planned, in the transaction that answers
the request. :class:`MoveDriver` then drives every move from the tree alone, so a new
controller continues where the old one stopped:

======== ========================================================== ==========================
phase    waits for                                                  then
======== ========================================================== ==========================
queued   fewer than ``running_max`` moves in copy or fence          copy
copy     the target's ``progress`` within ``fence_lag`` of the end  fence
fence    the source's ``fenced`` end offset, copied by the target   switch (the move is gone)
         and its delayed and shared state taken (``delayed_taken``)
======== ========================================================== ==========================

The switch is one transaction, fenced by the controller epoch: the partition's record (at
the version read) names the target as leader and only replica at leader epoch + 1, and the
move and its children are deleted. A move whose target is gone, whose source is gone before
it fenced, that outlived its timeout, or whose partition changed owner since it was planned
is rolled back: its nodes are deleted and the partition stays where it is (the source, once
it reads that its move is gone and it still leads, takes sends again). Both are conditional
on the move's version, so a move either switches or rolls back, once: a partition never has
two leaders nor none.

Thread-safety: one driver belongs to the controller's move thread.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import msgspec

from headwater.cluster.controller import ControllerContext
from headwater.cluster.coordination import (
    Coordination,
    CoordinationError,
    Create,
    Delete,
    NoNodeError,
    Op,
    Set,
    TransactionFailedError,
)
from headwater.cluster.metadata import ClusterView
from headwater.cluster.placement import Move
from headwater.cluster.records import (
    MoveFenced,
    MoveOutcomes,
    MovePlan,
    MoveProgress,
    MoveRecord,
    PartitionRecord,
    RecordError,
    decode,
    encode,
    paths,
)
from headwater.model.cluster import MoveOutcome

__all__ = [
    "COPY_TIMEOUT_S",
    "FENCE_LAG_MESSAGES",
    "FENCE_TIMEOUT_S",
    "MOVES_RUNNING_MAX",
    "MOVE_OUTCOMES_KEPT",
    "MoveDriver",
    "MoveState",
    "plan_ops",
]

log = logging.getLogger("headwater.controller")

MOVES_RUNNING_MAX = 4  # moves in copy or fence at once; the others wait, queued in plan order
FENCE_LAG_MESSAGES = 1000  # the target is this close to the source's end: fence the source
COPY_TIMEOUT_S = 600.0  # a copy that has not come within the lag by then is rolled back
FENCE_TIMEOUT_S = 30.0  # a fenced source refuses sends; past this, give it its partition back
ACTIVE = ("copy", "fence")
MOVE_OUTCOMES_KEPT = 64  # how many ended moves /move_outcomes keeps, the latest
WHY_CHARS_MAX = 500  # a rollback's reason is kept up to this long
R = TypeVar("R", bound=msgspec.Struct)


@dataclass(frozen=True)
class MoveState:
    """One move as read from the tree: its record and version, and its children."""

    queue: str
    partition: int
    record: MoveRecord
    version: int
    progress: MoveProgress | None
    fenced: MoveFenced | None

    @property
    def plan(self) -> MovePlan:
        return MovePlan(
            queue=self.queue, partition=self.partition, source=self.record.source, target=self.record.target
        )


def plan_ops(
    coord: Coordination, ctx: ControllerContext, view: ClusterView, moves: Sequence[Move], now_ms: int
) -> list[Op]:
    """The operations that queue ``moves`` (in their order) as controller ``ctx``."""
    ops: list[Op] = []
    parents: set[str] = set()
    for i, m in enumerate(moves):
        parent = paths.moves_of(m.queue)
        if parent not in parents and coord.exists(parent) is None:
            ops.append(Create(parent))
        parents.add(parent)
        record = MoveRecord(
            source=m.source,
            target=m.target,
            phase="queued",
            started_ms=now_ms,
            controller_epoch=ctx.epoch,
            leader_epoch=view.leader_epoch(m.queue, m.partition) or 0,
            order=now_ms * 1000 + i,
        )
        ops.append(Create(paths.move(m.queue, m.partition), encode(record)))
    return ops


class MoveDriver:
    """Drives every move under ``/moves`` one step per :meth:`tick`, as the controller."""

    def __init__(
        self,
        coord: Coordination,
        view: Callable[[], ClusterView],
        *,
        clock: Callable[[], float] = time.time,
        running_max: int = MOVES_RUNNING_MAX,
        fence_lag: int = FENCE_LAG_MESSAGES,
        copy_timeout_s: float = COPY_TIMEOUT_S,
        fence_timeout_s: float = FENCE_TIMEOUT_S,
    ) -> None:
        if running_max < 1:
            raise ValueError(f"running_max must be at least 1, got {running_max}")
        self._coord = coord
        self._view = view
        self._clock = clock
        self.running_max = running_max
        self.fence_lag = fence_lag
        self.copy_timeout_s = copy_timeout_s
        self.fence_timeout_s = fence_timeout_s

    def read(self) -> list[MoveState]:
        """Every move in the tree, in plan order (a bad record is left out, logged)."""
        out: list[MoveState] = []
        for queue in self._children(paths.MOVES):
            for name in self._children(paths.moves_of(queue)):
                if not name.isdigit():
                    continue
                n = int(name)
                try:
                    raw, stat = self._coord.get(paths.move(queue, n))
                    record = decode(raw, MoveRecord, paths.move(queue, n))
                except NoNodeError:
                    continue
                except RecordError as e:
                    log.warning("%s; the move is left alone", e)
                    continue
                progress = self._child(paths.move_progress(queue, n), MoveProgress)
                fenced = self._child(paths.move_fenced(queue, n), MoveFenced)
                out.append(MoveState(queue, n, record, stat.version, progress, fenced))
        return sorted(out, key=lambda m: (m.record.order, m.queue, m.partition))

    def tick(self, ctx: ControllerContext) -> int:
        """One step of every move, as controller ``ctx``; the number still unfinished."""
        moves = self.read()
        running = sum(m.record.phase in ACTIVE for m in moves)
        left = 0
        for m in moves:
            if ctx.fenced:
                return left
            try:
                started, done = self._step(ctx, m, running)
            except TransactionFailedError as e:  # the tree moved under us: read again next tick
                log.info("move %s/%d: %s; trying again", m.queue, m.partition, e)
                started, done = False, False
            running += started
            left += not done
        self._tidy(ctx)
        return left

    def _step(self, ctx: ControllerContext, m: MoveState, running: int) -> tuple[bool, bool]:
        """One step of move ``m``: (whether it started, whether it is finished)."""
        view = self._view()
        rec, now = m.record, self._clock()
        try:
            raw, pstat = self._coord.get(paths.partition(m.queue, m.partition))
            part: PartitionRecord | None = decode(raw, PartitionRecord, paths.partition(m.queue, m.partition))
        except NoNodeError:
            part, pstat = None, None
        if part is None or part.leader != rec.source or part.leader_epoch != rec.leader_epoch:
            self._roll_back(ctx, m, "its partition is gone or changed owner since the move was planned")
            return False, True
        target_live, source_live = rec.target in view.brokers, rec.source in view.brokers
        age_s = now - rec.started_ms / 1000
        if rec.phase == "queued":
            if not (target_live and source_live):
                self._roll_back(ctx, m, f"broker {rec.target if not target_live else rec.source} is not live")
                return False, True
            if running < self.running_max:
                self._set_phase(ctx, m, "copy", now)
                return True, False
        elif rec.phase == "copy":
            if not (target_live and source_live) or age_s > self.copy_timeout_s:
                self._roll_back(
                    ctx, m, _gone(rec.source, rec.target, view) or _too_long("the copy", age_s, self.copy_timeout_s)
                )
                return False, True
            p = m.progress
            if p is not None and p.error:
                self._roll_back(ctx, m, f"broker {rec.target} cannot take it: {p.error}")
                return False, True
            if p is not None and p.source_end_offset - p.copied_offset <= self.fence_lag:
                self._set_phase(ctx, m, "fence", now)
        elif rec.phase == "fence":
            f, p = m.fenced, m.progress
            if (
                target_live
                and f is not None
                and p is not None
                and p.copied_offset >= f.end_offset
                and p.delayed_taken  # the target holds the partition's delayed messages and shared state
                and f.leader_epoch == part.leader_epoch
            ):
                assert pstat is not None
                self._switch(ctx, m, part, pstat.version)
                return False, True
            if not target_live or (f is None and not source_live) or age_s > self.fence_timeout_s:
                why = _gone(rec.source if f is None else None, rec.target, view)
                self._roll_back(ctx, m, why or _too_long("the fence", age_s, self.fence_timeout_s))
                return False, True
        else:
            self._roll_back(ctx, m, f"its phase {rec.phase!r} is unknown")
            return False, True
        return False, False

    def _set_phase(self, ctx: ControllerContext, m: MoveState, phase: str, now: float) -> None:
        rec = msgspec.structs.replace(m.record, phase=phase, started_ms=int(now * 1000), controller_epoch=ctx.epoch)
        ctx.commit([Set(paths.move(m.queue, m.partition), encode(rec), m.version)])
        log.info("move %s/%d from broker %d to %d: %s", m.queue, m.partition, rec.source, rec.target, phase)

    def _children_ops(self, m: MoveState) -> list[Op]:
        return [
            Delete(path)
            for path in (paths.move_progress(m.queue, m.partition), paths.move_fenced(m.queue, m.partition))
            if self._coord.exists(path) is not None
        ]

    def _switch(self, ctx: ControllerContext, m: MoveState, part: PartitionRecord, version: int) -> None:
        moved = PartitionRecord(
            replicas=[m.record.target],
            leader=m.record.target,
            leader_epoch=part.leader_epoch + 1,
            controller_epoch=ctx.epoch,
        )
        ctx.commit(
            [
                Set(paths.partition(m.queue, m.partition), encode(moved), version),
                *self._children_ops(m),
                Delete(paths.move(m.queue, m.partition), m.version),
                self._outcome_op(m, "moved"),
            ]
        )
        log.info(
            "moved %s/%d from broker %d to %d at leader epoch %d",
            m.queue,
            m.partition,
            m.record.source,
            m.record.target,
            moved.leader_epoch,
        )

    def _roll_back(self, ctx: ControllerContext, m: MoveState, why: str) -> None:
        ended = Delete(paths.move(m.queue, m.partition), m.version)
        ctx.commit([*self._children_ops(m), ended, self._outcome_op(m, "rolled back", why)])
        log.warning(
            "move %s/%d from broker %d to %d rolled back in phase %s: %s",
            m.queue,
            m.partition,
            m.record.source,
            m.record.target,
            m.record.phase,
            why,
        )

    def _outcome_op(self, m: MoveState, outcome: str, why: str = "") -> Op:
        """The write that records how ``m`` ended in ``/move_outcomes``, for the transaction
        that ends it (conditional on the version read: the tick tries again if it moved)."""
        ended = MoveOutcome(
            queue=m.queue,
            partition=m.partition,
            source=m.record.source,
            target=m.record.target,
            outcome=outcome,
            why=why[:WHY_CHARS_MAX],
            ended_ms=int(self._clock() * 1000),
        )
        try:
            raw, stat = self._coord.get(paths.MOVE_OUTCOMES)
        except NoNodeError:
            return Create(paths.MOVE_OUTCOMES, encode(MoveOutcomes(outcomes=[ended])))
        try:
            kept = decode(raw, MoveOutcomes, paths.MOVE_OUTCOMES).outcomes
        except RecordError as e:
            log.warning("%s; it is written anew", e)
            kept = []
        latest = [*kept, ended][-MOVE_OUTCOMES_KEPT:]
        return Set(paths.MOVE_OUTCOMES, encode(MoveOutcomes(outcomes=latest)), stat.version)

    def _tidy(self, ctx: ControllerContext) -> None:
        """Delete each ``/moves/<q>`` left empty (ZooKeeper refuses if a move is there)."""
        for queue in self._children(paths.MOVES):
            if not self._children(paths.moves_of(queue)):
                try:
                    ctx.commit([Delete(paths.moves_of(queue))])
                except TransactionFailedError:
                    pass  # a move was planned meanwhile

    def _children(self, path: str) -> list[str]:
        try:
            return self._coord.children(path)
        except NoNodeError:
            return []

    def _child(self, path: str, kind: type[R]) -> R | None:
        try:
            raw, _ = self._coord.get(path)
            return decode(raw, kind, path)
        except NoNodeError:
            return None
        except CoordinationError as e:  # a bad record too: the move waits, then times out
            log.warning("%s: %s", path, e)
            return None


def _gone(source: int | None, target: int, view: ClusterView) -> str:
    """Which broker of a move is not live (``source`` None: its loss does not matter now),
    in words; empty while both are."""
    if target not in view.brokers:
        return f"its target, broker {target}, is not live"
    if source is not None and source not in view.brokers:
        return f"its source, broker {source}, is not live"
    return ""


def _too_long(what: str, age_s: float, limit_s: float) -> str:
    return f"{what} took {age_s:.0f} s, past its limit of {limit_s:g} s"
