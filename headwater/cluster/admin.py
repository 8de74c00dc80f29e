"""Changes to the cluster's queues: asked by any broker, made by the controller alone.

A client may call any broker to create, delete or grow a queue. That broker writes an
:class:`~headwater.cluster.records.AdminRequest` as a sequential node under ``/requests``
(:func:`ask`); the controller (:class:`AdminHandler`) takes the requests in order and makes
each change in **one transaction with its answer**: the queue's nodes, the placement of its
partitions, the next queue id, and the request node's data set to the result, checked
against the version the controller read and fenced by the controller epoch. So a request is
answered exactly when its change is made. An asker that gives up deletes its request at the
version it wrote: if that succeeds, the controller can no longer apply it (its transaction
needs the node at that version), and the answer "nothing was changed" is true; if it fails,
the answer is there to read.

Queue ids of a cluster are allocated from ``/queue_ids``, from ``FIRST_QUEUE_ID``: every
broker creates a queue under the cluster's id, and the ids below it stay for each broker's
own internal queues.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import msgspec

from headwater.cluster.controller import ControllerContext
from headwater.cluster.coordination import (
    BadVersionError,
    Check,
    Coordination,
    Create,
    Delete,
    NodeExistsError,
    NoNodeError,
    Op,
    Set,
    TransactionFailedError,
)
from headwater.cluster.metadata import ClusterView
from headwater.cluster.moves import plan_ops
from headwater.cluster.placement import (
    PlacementError,
    broker_loads,
    place_partitions,
    plan_decommission,
    plan_rebalance,
)
from headwater.cluster.records import (
    AdminRequest,
    AdminResult,
    MovePlan,
    PartitionRecord,
    QueueRecord,
    decode,
    encode,
    paths,
)
from headwater.errors import (
    HeadwaterError,
    InvalidArgumentError,
    QueueExistsError,
    QueueNotFoundError,
    UnavailableError,
    error_for_code,
)
from headwater.model.config import QueueConfig, altered_config

__all__ = ["FIRST_QUEUE_ID", "AdminHandler", "ask"]

#: One change's ZooKeeper transaction is kept under this, half of ZooKeeper's default
#: largest request (jute.maxbuffer, 1 MiB): the chroot prefixes every path on the wire.
TRANSACTION_BYTES_MAX = 512 * 1024
OP_OVERHEAD_BYTES = 32  # an op's type, lengths and flags in the request

log = logging.getLogger("headwater.controller")

FIRST_QUEUE_ID = 1000
REQUEST_PREFIX = "r-"


def ask(coord: Coordination, request: AdminRequest, timeout_s: float) -> AdminResult:
    """Ask the controller for a change and wait for its answer; raise the error it answered
    with, or :class:`~headwater.errors.UnavailableError` when no controller answered within
    ``timeout_s`` (and then nothing was changed)."""
    for parent in (paths.REQUESTS,):
        try:
            coord.create(parent)
        except NodeExistsError:
            pass
    path = coord.create(paths.request(REQUEST_PREFIX), encode(request), sequential=True)
    answered = threading.Event()
    coord.watch_data(path, lambda data, stat: answered.set() if stat is None or stat.version > 0 else None)
    answered.wait(timeout_s)
    try:
        coord.delete(path, version=0)  # unanswered: withdraw it, so it is never applied
    except BadVersionError:
        pass  # answered meanwhile: read the answer
    except NoNodeError:
        raise UnavailableError(
            f"the request {path} vanished before it was answered; look before asking again"
        ) from None
    else:
        raise UnavailableError(
            f"no controller answered within {timeout_s:g} s (is a controller elected? `headwater cluster status`); "
            f"nothing was changed"
        )
    raw, _ = coord.get(path)
    coord.delete(path)
    answer = decode(raw, AdminRequest, path).result
    assert answer is not None  # a version past 0 is the controller's answer
    if answer.code:
        raise error_for_code(answer.code)(answer.message)
    return answer


class AdminHandler:
    """The controller's side: answer every request under ``/requests``, in order, with its
    change (see the module's docstring). ``view`` gives the controller's latest metadata."""

    def __init__(self, coord: Coordination, view: Callable[[], ClusterView], clock: Callable[[], float] = time.time):
        self._coord = coord
        self._view = view
        self._clock = clock
        self._parents_made = False

    def handle_all(self, ctx: ControllerContext) -> None:
        """Answer every request not answered yet (oldest first), as controller ``ctx``."""
        if not self._parents_made:
            for parent in (paths.QUEUES, paths.MOVES):  # once: the changes' transactions need them
                try:
                    self._coord.create(parent)
                except NodeExistsError:
                    pass
            self._parents_made = True
        try:
            names = self._coord.children(paths.REQUESTS)
        except NoNodeError:
            return
        for name in names:
            if ctx.fenced:
                return
            self._handle(ctx, name)

    def _handle(self, ctx: ControllerContext, name: str) -> None:
        path = paths.request(name)
        try:
            raw, stat = self._coord.get(path)
        except NoNodeError:
            return  # withdrawn
        try:
            req = decode(raw, AdminRequest, path)
        except HeadwaterError as e:
            log.warning("%s; removing it", e)
            self._coord.delete(path)
            return
        if req.result is not None:
            return  # answered; the asker removes it
        answer_at = Set(path, b"", version=stat.version)  # its data is filled in below
        try:
            ops, result = self._change(ctx, req)
        except HeadwaterError as e:
            ops, result = [], AdminResult(code=e.code, message=str(e), controller_epoch=ctx.epoch)
        done = msgspec.structs.replace(req, result=result)
        try:
            ctx.commit([*ops, answer_at._replace(data=encode(done))])
        except TransactionFailedError as e:
            if e.index == len(ops):  # the answer's Set: the asker withdrew it meanwhile
                return
            why = _refusal(req, e)
            refused = AdminResult(code=why.code, message=str(why), controller_epoch=ctx.epoch)
            try:
                ctx.commit([answer_at._replace(data=encode(msgspec.structs.replace(req, result=refused)))])
            except TransactionFailedError:
                return
        log.info("controller %d answered %s %s: %s", ctx.epoch, req.op, req.queue, done.result)

    def _change(self, ctx: ControllerContext, req: AdminRequest) -> tuple[list[Op], AdminResult]:
        if req.op == "create_queue":
            return self._create(ctx, req)
        if req.op == "delete_queue":
            return self._delete(ctx, req)
        if req.op == "add_partitions":
            return self._grow(ctx, req)
        if req.op == "set_enabled":
            return self._set_enabled(ctx, req)
        if req.op == "alter_queue":
            return self._alter(ctx, req)
        if req.op in ("rebalance", "decommission"):
            return self._plan_moves(ctx, req)
        raise InvalidArgumentError(f"unknown cluster request {req.op!r}")

    def _create(self, ctx: ControllerContext, req: AdminRequest) -> tuple[list[Op], AdminResult]:
        try:
            config = msgspec.convert(req.config or {}, QueueConfig).validated()
        except msgspec.ValidationError as e:
            raise InvalidArgumentError(f"queue {req.queue!r}: {e}") from None
        view = self._view()
        if req.queue in view.queues:
            raise QueueExistsError(f"queue {req.queue!r} already exists")
        queue_id, id_ops = self._next_queue_id()
        replicas = self._place(view, config.partitions, 0)
        record = QueueRecord(
            queue_id=queue_id,
            config=msgspec.to_builtins(config),
            created_ms=int(self._clock() * 1000),
            controller_epoch=ctx.epoch,
        )
        ops: list[Op] = [
            *id_ops,
            Create(paths.queue(req.queue), encode(record)),
            Create(paths.partitions(req.queue)),
            *self._partition_nodes(ctx, req.queue, replicas, 0),
        ]
        _check_size(
            ops,
            config.partitions,
            f"queue {req.queue!r} with {config.partitions} partitions",
            "create it with at most about {fits} partitions, then grow it with add_partitions by as many at a time",
        )
        return ops, AdminResult(queue_id=queue_id, controller_epoch=ctx.epoch)

    def _delete(self, ctx: ControllerContext, req: AdminRequest) -> tuple[list[Op], AdminResult]:
        try:
            raw, stat = self._coord.get(paths.queue(req.queue))
            numbers = self._coord.children(paths.partitions(req.queue))
        except NoNodeError:
            raise QueueNotFoundError(f"queue {req.queue!r} does not exist") from None
        queue_id = decode(raw, QueueRecord, paths.queue(req.queue)).queue_id
        ops: list[Op] = [Delete(f"{paths.partitions(req.queue)}/{n}") for n in numbers]
        ops += [Delete(paths.partitions(req.queue)), Delete(paths.queue(req.queue), stat.version)]
        return ops, AdminResult(queue_id=queue_id, controller_epoch=ctx.epoch)

    def _grow(self, ctx: ControllerContext, req: AdminRequest) -> tuple[list[Op], AdminResult]:
        try:
            raw, stat = self._coord.get(paths.queue(req.queue))
        except NoNodeError:
            raise QueueNotFoundError(f"queue {req.queue!r} does not exist") from None
        record = decode(raw, QueueRecord, paths.queue(req.queue))
        config = msgspec.convert(record.config, QueueConfig)
        now = config.partitions
        if req.partitions <= now:
            raise InvalidArgumentError(
                f"queue {req.queue!r} has {now} partitions; add_partitions takes a larger total, got {req.partitions}"
            )
        grown = msgspec.structs.replace(config, partitions=req.partitions).validated()
        replicas = self._place(self._view(), req.partitions - now, now)
        new_record = msgspec.structs.replace(record, config=msgspec.to_builtins(grown))
        ops: list[Op] = [
            Set(paths.queue(req.queue), encode(new_record), stat.version),
            *self._partition_nodes(ctx, req.queue, replicas, now),
        ]
        added = req.partitions - now
        _check_size(
            ops,
            added,
            f"adding {added} partitions to queue {req.queue!r}",
            "grow it by at most about {fits} partitions at a time",
        )
        return ops, AdminResult(queue_id=record.queue_id, controller_epoch=ctx.epoch)

    def _set_enabled(self, ctx: ControllerContext, req: AdminRequest) -> tuple[list[Op], AdminResult]:
        """Disable or enable a queue: its record says so, and every broker follows it."""
        try:
            raw, stat = self._coord.get(paths.queue(req.queue))
        except NoNodeError:
            raise QueueNotFoundError(f"queue {req.queue!r} does not exist") from None
        record = decode(raw, QueueRecord, paths.queue(req.queue))
        ops: list[Op] = []
        if record.enabled != req.enabled:
            changed = msgspec.structs.replace(record, enabled=req.enabled, controller_epoch=ctx.epoch)
            ops.append(Set(paths.queue(req.queue), encode(changed), stat.version))
        return ops, AdminResult(queue_id=record.queue_id, controller_epoch=ctx.epoch)

    def _alter(self, ctx: ControllerContext, req: AdminRequest) -> tuple[list[Op], AdminResult]:
        """Change a queue's ttl_s, message_bytes_max or flush (``req.config``: the changes):
        its record says so, and every broker follows it."""
        try:
            raw, stat = self._coord.get(paths.queue(req.queue))
        except NoNodeError:
            raise QueueNotFoundError(f"queue {req.queue!r} does not exist") from None
        record = decode(raw, QueueRecord, paths.queue(req.queue))
        config = altered_config(msgspec.convert(record.config, QueueConfig), dict(req.config or {}))
        changed = msgspec.structs.replace(record, config=msgspec.to_builtins(config), controller_epoch=ctx.epoch)
        ops: list[Op] = [Set(paths.queue(req.queue), encode(changed), stat.version)]
        return ops, AdminResult(queue_id=record.queue_id, controller_epoch=ctx.epoch)

    def rebalance_now(self, ctx: ControllerContext) -> list[MovePlan]:
        """Plan a rebalance and queue its moves, as controller ``ctx``, with no request (the
        automatic mode); the moves planned (none on a balanced cluster)."""
        req = AdminRequest(op="rebalance", queue="", asked_by=-1, asked_ms=int(self._clock() * 1000))
        ops, result = self._plan_moves(ctx, req)
        if ops:
            ctx.commit(ops)
        return result.moves

    def _plan_moves(self, ctx: ControllerContext, req: AdminRequest) -> tuple[list[Op], AdminResult]:
        """A rebalance or a decommission: the moves planned, queued unless ``dry_run``.
        Partitions on brokers that are not live stay out of the plan: nothing can copy them."""
        view = self._view()
        if view.moves:
            raise InvalidArgumentError(
                f"{len(view.moves)} partition move(s) are not finished yet: wait for them "
                f"(`headwater cluster status` shows them), then plan again"
            )
        live = sorted(view.brokers)
        assignment = {k: r for k, r in view.assignment().items() if all(b in view.brokers for b in r)}
        try:
            if req.op == "rebalance":
                moves = plan_rebalance(assignment, live, {})
            else:
                if req.broker_id not in view.brokers:
                    held = any(req.broker_id in r for r in view.assignment().values())
                    raise InvalidArgumentError(
                        f"broker {req.broker_id} is not live: start it again to move its partitions off it"
                        if held
                        else f"broker {req.broker_id} is not a broker of this cluster (live brokers: "
                        f"{', '.join(map(str, live)) or 'none'})"
                    )
                moves = plan_decommission(assignment, live, {}, req.broker_id)
        except PlacementError as e:
            raise InvalidArgumentError(str(e)) from None
        planned = [MovePlan(queue=m.queue, partition=m.partition, source=m.source, target=m.target) for m in moves]
        result = AdminResult(controller_epoch=ctx.epoch, moves=planned)
        if req.dry_run or not moves:
            return [], result
        return plan_ops(self._coord, ctx, view, moves, int(self._clock() * 1000)), result

    @staticmethod
    def _place(view: ClusterView, partitions: int, first: int) -> list[list[int]]:
        try:
            return place_partitions(
                partitions, sorted(view.brokers), broker_loads(view.assignment(), {}), first_partition=first
            )
        except PlacementError as e:
            raise InvalidArgumentError(str(e)) from None

    @staticmethod
    def _partition_nodes(ctx: ControllerContext, queue: str, replicas: list[list[int]], first: int) -> list[Op]:
        return [
            Create(
                paths.partition(queue, first + i),
                encode(PartitionRecord(replicas=r, leader=r[0], leader_epoch=0, controller_epoch=ctx.epoch)),
            )
            for i, r in enumerate(replicas)
        ]

    def _next_queue_id(self) -> tuple[int, list[Op]]:
        """The id a new queue takes, and the operations that take it."""
        try:
            raw, stat = self._coord.get(paths.QUEUE_IDS)
        except NoNodeError:
            return FIRST_QUEUE_ID, [Create(paths.QUEUE_IDS, str(FIRST_QUEUE_ID + 1).encode())]
        if not raw.isdigit():
            raise InvalidArgumentError(f"{paths.QUEUE_IDS} holds {raw[:40]!r}, not a queue id: repair it (zkCli.sh)")
        return int(raw), [Check(paths.QUEUE_IDS, stat.version), Set(paths.QUEUE_IDS, str(int(raw) + 1).encode())]


def _check_size(ops: list[Op], partitions: int, what: str, advice: str) -> None:
    """Refuse a change too big for one ZooKeeper transaction (a node per partition), which
    ZooKeeper would refuse by dropping the controller's connection."""
    size = sum(len(op.path) + len(getattr(op, "data", b"")) + OP_OVERHEAD_BYTES for op in ops)
    if size <= TRANSACTION_BYTES_MAX:
        return
    fits = max(1, partitions * TRANSACTION_BYTES_MAX // size)
    raise InvalidArgumentError(
        f"{what} is too big for one change of the cluster (about {size // 1024} KiB of ZooKeeper nodes, at most "
        f"{TRANSACTION_BYTES_MAX // 1024} KiB): " + advice.format(fits=fits)
    )


def _refusal(req: AdminRequest, e: TransactionFailedError) -> HeadwaterError:
    """What a change that ZooKeeper refused means to the asker."""
    if req.op in ("rebalance", "decommission"):
        return UnavailableError(f"the cluster changed while the {req.op} was planned; nothing was changed: ask again")
    if req.op == "create_queue" and isinstance(e.cause, NodeExistsError) and e.cause.path == paths.queue(req.queue):
        return QueueExistsError(f"queue {req.queue!r} already exists")
    if isinstance(e.cause, NoNodeError | BadVersionError) and req.op != "create_queue":
        return QueueNotFoundError(f"queue {req.queue!r} changed or went while it was being changed; look again")
    return UnavailableError(f"the cluster changed while {req.op} {req.queue!r} was made; nothing was changed: retry")
