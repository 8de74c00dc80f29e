"""SharedGroupsCore: the shared-group operations, over storage hooks a subclass supplies.

``headwater.broker.shared.SharedGroups`` (durable, in the store's ``__shared`` queue)
subclasses this: the operations (validation, the order of steps, the errors, the results)
stay apart from how their changes are kept. Each operation runs under one
lock: the partitions' retained ranges are applied, expired leases end, the operation runs
on :class:`~headwater.broker.shared_state.SharedQueueState`, dead letters are written, and
the changes are handed to :meth:`_persist`. The caller is answered only after
:meth:`_wait_durable`, so an acknowledged change survives a crash. Message data is read
outside the lock.

Hooks (storage): :meth:`_queue_info`, :meth:`_fetch`, :meth:`_append_dead_letters`,
:meth:`_persist`, :meth:`_wait_durable`. Appends to the queue must call :meth:`notify` so
receivers waiting for messages wake up.

On a cluster (:meth:`_gate` returns the broker's part in it), a group's state for a
partition lives on the partition's leader (docs/design/cluster.md, "Coordinators follow
partitions"): a receive leases, expires and bounds only the partitions this broker leads
now, describe answers those, and an ack, nack or extend of a lease on another partition is
refused whole with ``NotLeaderError`` (retriable, nothing applied), so the client sends each
lease to its partition's leader. The state of a partition the broker no longer leads is
left as it was until it is forgotten. A partition a move has fenced here (``moving``) is
treated as not led from then on, checked under the lock: its state is handed to the move's
target under that lock (``headwater.broker.shared.SharedGroups.hand_off``), so an ack
applied here is in what is handed over, and one that comes after is refused.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from headwater.broker.shared_state import Changes, SharedQueueState
from headwater.errors import (
    GroupNotFoundError,
    HeadwaterError,
    InvalidArgumentError,
    LeaseExpiredError,
    NotLeaderError,
    QueueDisabledError,
)
from headwater.model.batch import encode_batch
from headwater.model.batch_reads import decode_records
from headwater.model.config import QueueConfig, QueueInfo
from headwater.model.groups import GroupState, GroupSummary
from headwater.model.message import Message, Record
from headwater.model.service import FetchResult
from headwater.model.shared import (
    DELAY_MS_MAX,
    DeadLetter,
    LeaseId,
    LeaseRefusal,
    SharedDeliveries,
    SharedGroupInfo,
    SharedGroupSettings,
    SharedLease,
    dead_letter_message,
    dead_letter_queue_name,
    parse_lease_ids,
    validate_group,
    validate_member,
    validate_receive,
)

__all__ = ["LeaderGate", "SharedGroupsCore"]

log = logging.getLogger("headwater.shared")

RECEIVE_WAIT_MS_MAX = 300_000
DEAD_LETTER_RETRY_MS = 5_000  # a dead letter whose copy failed is tried again after this


class LeaderGate(Protocol):
    """Which partitions a broker of a cluster leads now (``ClusterNode``)."""

    def leads(self, queue: str, partition: int) -> bool: ...
    def check_leader(self, queue: str, partition: int) -> None: ...


class SharedGroupsCore:
    """Shared groups of one broker. Thread-safe."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._groups: dict[tuple[str, int], SharedQueueState] = {}
        # long polling: receivers wait here until a change or an append may let them have more
        self._wake = threading.Condition()
        self._version = 0
        self._waiting = 0
        self._listeners: list[Callable[[str], None]] = []
        #: set on a cluster (``headwater.broker.delay_moves``): whether a move has fenced
        #: ``(queue, partition)`` here, so its state is being or was handed over
        self.moving: Callable[[str, int], bool] | None = None

    # -- hooks --------------------------------------------------------------------------

    def _queue_info(self, queue: str) -> QueueInfo:
        """The queue's description (QueueNotFoundError when there is none)."""
        raise NotImplementedError

    def _read(self, queue: str, partition: int, offset: int, end_offset: int) -> FetchResult:
        """One read of stored batches from ``offset``, stopping before ``end_offset``."""
        raise NotImplementedError

    def _fetch(self, queue: str, partition: int, offset: int, end_offset: int) -> list[bytes]:
        """Every stored batch holding an offset of [offset, end_offset) that is retained."""
        out: list[bytes] = []
        while offset < end_offset:
            res = self._read(queue, partition, offset, end_offset)
            out.extend(res.batches)
            if res.next_offset <= offset:
                break
            offset = res.next_offset
        return out

    def _append_dead_letters(self, dlq: str, like: QueueConfig, partition: int, batch: bytes) -> None:
        """Append to the dead-letter queue ``dlq``, creating it (settings ``like``) if needed."""
        raise NotImplementedError

    def _before_nack(self, queue: str) -> None:
        """Before a nack takes the lock: what its dead letters may need (on a cluster, the
        dead-letter queue made), so that none of it waits under the lock."""
        return None

    def _persist(self, st: SharedQueueState, changes: Changes) -> Any:
        """Record the changes; return what :meth:`_wait_durable` needs (None: nothing)."""
        return None

    def _wait_durable(self, token: Any) -> None:
        return None

    def _gate(self) -> LeaderGate | None:
        """The broker's part in its cluster; None when it runs alone (it leads everything)."""
        return None

    def _led(self, info: QueueInfo) -> set[int] | None:
        """The partitions of ``info`` this broker leads now and no move has fenced here
        (call it under the lock); None: all (a broker alone)."""
        gate = self._gate()
        if gate is None:
            return None
        return {
            p.partition
            for p in info.partitions
            if gate.leads(info.name, p.partition) and not self._frozen(info.name, p.partition)
        }

    def _frozen(self, queue: str, partition: int) -> bool:
        moving = self.moving
        return moving is not None and moving(queue, partition)

    # -- waking receivers --------------------------------------------------------------

    def add_listener(self, fn: Callable[[str], None]) -> None:
        """Call ``fn(queue)`` whenever a receive on ``queue`` may find more (an append, an
        ack, a nack). Called from the thread that made the change: keep it quick."""
        self._listeners.append(fn)

    def notify(self, queue: str) -> None:
        if self._waiting:
            with self._wake:
                self._version += 1
                self._wake.notify_all()
        for fn in self._listeners:
            fn(queue)

    # -- operations ---------------------------------------------------------------------

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    def receive(
        self,
        group: str,
        queue: str,
        member: str,
        max_messages: int = 32,
        visibility_timeout_ms: int = 30_000,
        at_most_once: bool = False,
        settings: Mapping[str, Any] | None = None,
        max_wait_ms: int = 0,
    ) -> SharedDeliveries:
        """Lease up to ``max_messages``; when none can be had, wait up to ``max_wait_ms``."""
        if (
            isinstance(max_wait_ms, bool)
            or not isinstance(max_wait_ms, int)
            or not 0 <= max_wait_ms <= RECEIVE_WAIT_MS_MAX
        ):
            raise InvalidArgumentError(f"max_wait_ms must be from 0 to {RECEIVE_WAIT_MS_MAX}, got {max_wait_ms!r}")
        deadline = time.monotonic() + max_wait_ms / 1000
        while True:
            with self._wake:
                self._waiting += 1
                seen = self._version
            try:
                res, hint_ms = self.receive_now(
                    group, queue, member, max_messages, visibility_timeout_ms, at_most_once, settings
                )
                remaining = deadline - time.monotonic()
                if res.leases or remaining <= 0:
                    return res
                timeout = remaining if hint_ms is None else min(remaining, hint_ms / 1000)
                with self._wake:
                    if self._version == seen:
                        self._wake.wait(timeout)
            finally:
                with self._wake:
                    self._waiting -= 1

    def receive_now(
        self,
        group: str,
        queue: str,
        member: str,
        max_messages: int,
        visibility_timeout_ms: int,
        at_most_once: bool,
        settings: Mapping[str, Any] | None,
    ) -> tuple[SharedDeliveries, int | None]:
        """Lease what can be had now. Also returns, when nothing could, in how many ms a
        lease expires or a backoff ends (None: only an append or an ack can help)."""
        validate_group(group)
        validate_member(member)
        validate_receive(max_messages, visibility_timeout_ms)
        if not isinstance(at_most_once, bool):
            raise InvalidArgumentError(f"at_most_once is a bool, got {type(at_most_once).__name__}")
        SharedGroupSettings.from_mapping(settings)  # unknown names and bad values fail here, first
        info = self._usable(queue)
        with self._lock:
            led = self._led(info)
            st = self._state(group, info.queue_id)
            changes = Changes()
            if settings:
                st.set_settings(SharedGroupSettings.from_mapping(settings, st.settings), changes)
            now = self._now_ms()
            self._bound(st, info, changes, led)
            dead = st.expire(now, changes, led)
            leases, spent = st.receive(member, max_messages, visibility_timeout_ms, at_most_once, now, changes, led)
            token = self._commit(group, info, st, changes, dead + spent)
            hint = None
            if not leases:
                due = st.next_due_ms(led)  # another's partition's old leases would wake it for nothing
                hint = None if due is None else max(1, due - now)
        batches = self._read_leased(queue, leases) if leases else []
        self._wait_durable(token)
        return SharedDeliveries(batches, leases, None if led is None else sorted(led)), hint

    def ack(self, group: str, queue: str, member: str, lease_ids: list[str]) -> list[LeaseRefusal]:
        """Finish the leased messages. Returns the leases refused (expired, not the
        member's), whose messages are unchanged; the others are acknowledged durably."""

        def op(st: SharedQueueState, leases: list[LeaseId], now: int, changes: Changes):
            return st.ack(member, leases, now, changes), []

        return self._lease_op(group, queue, member, lease_ids, op)

    def nack(
        self, group: str, queue: str, member: str, lease_ids: list[str], reason: str = "", delay_ms: int | None = None
    ) -> list[LeaseRefusal]:
        """Give the messages back: delivered again after ``delay_ms`` (None: the group's
        backoff), or dead-lettered with ``reason`` when their attempts are used up."""
        if not isinstance(reason, str):
            raise InvalidArgumentError(f"reason is a str, got {type(reason).__name__}")
        if delay_ms is not None and (
            isinstance(delay_ms, bool) or not isinstance(delay_ms, int) or not 0 <= delay_ms <= DELAY_MS_MAX
        ):
            raise InvalidArgumentError(f"delay_ms must be None or from 0 to {DELAY_MS_MAX}, got {delay_ms!r}")

        def op(st: SharedQueueState, leases: list[LeaseId], now: int, changes: Changes):
            return st.nack(member, leases, reason, delay_ms, now, changes)

        self._before_nack(queue)

        return self._lease_op(group, queue, member, lease_ids, op)

    def extend(
        self, group: str, queue: str, member: str, lease_ids: list[str], visibility_timeout_ms: int
    ) -> list[LeaseRefusal]:
        """Make the leases run ``visibility_timeout_ms`` from now."""
        validate_receive(1, visibility_timeout_ms)

        def op(st: SharedQueueState, leases: list[LeaseId], now: int, changes: Changes):
            return st.extend(member, leases, visibility_timeout_ms, now, changes), []

        return self._lease_op(group, queue, member, lease_ids, op)

    def describe(self, group: str, queue: str) -> SharedGroupInfo:
        """The group's settings and, per partition, its window: committed floor, delivered
        offset, leases (per member), messages awaiting a retry, dead letters."""
        validate_group(group)
        info = self._queue_info(queue)
        with self._lock:
            led = self._led(info)
            shown = [p for p in info.partitions if led is None or p.partition in led]
            st = self._groups.get((group, info.queue_id))
            if st is None:
                raise GroupNotFoundError(f"shared group {group!r} has received nothing from queue {queue!r}")
            changes = Changes()
            self._bound(st, info, changes, led)
            dead = st.expire(self._now_ms(), changes, led)
            token = self._commit(group, info, st, changes, dead)
            parts = st.describe(
                {p.partition: p.start_offset for p in shown}, {p.partition: p.end_offset for p in shown}
            )
            settings = st.settings
        self._wait_durable(token)
        return SharedGroupInfo(
            group=group,
            queue=queue,
            settings=settings,
            dead_letter_queue=dead_letter_queue_name(queue),
            partitions=parts,
        )

    def summaries(self, queues: Iterable[QueueInfo]) -> list[GroupSummary]:
        """A line per shared group and queue (of ``queues``, the broker's queues now: the
        state of a deleted queue's groups is not listed): ``members`` counts the members
        holding a lease now, and the state is ``stable`` while any does, else ``empty``."""
        names = {q.queue_id: q.name for q in queues}
        now = self._now_ms()
        out = []
        with self._lock:
            for (group, qid), st in self._groups.items():
                if qid in names:
                    holders = st.lease_holders(now)
                    out.append(
                        GroupSummary(
                            group=group,
                            state=(GroupState.STABLE if holders else GroupState.EMPTY).value,
                            mode="shared",
                            members=len(holders),
                            queues=[names[qid]],
                        )
                    )
        return sorted(out, key=lambda g: (g.group, g.queues))

    # -- steps --------------------------------------------------------------------------

    def _usable(self, queue: str) -> QueueInfo:
        info = self._queue_info(queue)
        if not info.enabled:
            raise QueueDisabledError(f"queue {queue!r} is disabled; enable it to read or write")
        return info

    def _state(self, group: str, queue_id: int) -> SharedQueueState:
        st = self._groups.get((group, queue_id))
        if st is None:
            st = self._groups[(group, queue_id)] = SharedQueueState(group, queue_id)
        return st

    @staticmethod
    def _bound(st: SharedQueueState, info: QueueInfo, changes: Changes, led: set[int] | None = None) -> None:
        # only the partitions led: a copy this broker no longer serves (emptied after a move)
        # must not move the group's floor past messages its leader still holds
        for p in info.partitions:
            if led is None or p.partition in led:
                st.bound(p.partition, p.start_offset, p.end_offset, changes)

    def _lease_op(
        self,
        group: str,
        queue: str,
        member: str,
        lease_ids: list[str],
        op: Callable[..., tuple[list[LeaseRefusal], list[DeadLetter]]],
    ) -> list[LeaseRefusal]:
        validate_group(group)
        validate_member(member)
        leases = parse_lease_ids(lease_ids)
        info = self._queue_info(queue)
        gate = self._gate()
        parts = sorted({x.partition for x in leases})
        if gate is not None:  # every lease's partition led here, or nothing is applied
            for p in parts:
                gate.check_leader(queue, p)
        with self._lock:
            led = self._led(info)
            for p in parts:  # under the lock: a hand-off of the partition's state takes it too
                if self._frozen(queue, p):
                    raise NotLeaderError(
                        f"{queue}[{p}] is moving to another broker, which takes its shared groups' state "
                        f"from here: its leases given here are void; the message comes again from its new leader"
                    )
            st = self._groups.get((group, info.queue_id))
            if st is None:
                return [
                    LeaseRefusal(
                        str(x),
                        LeaseExpiredError.code,
                        f"lease {x}: shared group {group!r} has received nothing from queue {queue!r}",
                    )
                    for x in leases
                ]
            changes = Changes()
            now = self._now_ms()
            dead = st.expire(now, changes, led)
            refused, spent = op(st, leases, now, changes)
            token = self._commit(group, info, st, changes, dead + spent)
        self._wait_durable(token)
        if len(refused) < len(leases):
            self.notify(queue)  # a finished or released message may let a waiting receiver in
        return refused

    def _commit(
        self, group: str, info: QueueInfo, st: SharedQueueState, changes: Changes, dead: list[DeadLetter]
    ) -> Any:
        """Write dead letters, then the changes (in this order: a crash in between copies a
        message to the dead-letter queue twice rather than losing it)."""
        if dead:
            for d in self._dead_letter(group, info, dead):
                st.revive(d, self._now_ms() + DEAD_LETTER_RETRY_MS, changes)
        return self._persist(st, changes) if changes else None

    def _dead_letter(self, group: str, info: QueueInfo, dead: list[DeadLetter]) -> list[DeadLetter]:
        """Copy ``dead`` to the dead-letter queue; returns those whose copy failed (on a
        cluster its partition's leader may be out of reach), to be tried again."""
        by_part: dict[int, list[Message]] = {}
        for d in dead:
            rec = self._record(info.name, d.partition, d.offset)
            if rec is None:
                log.warning(
                    "%s[%d] offset %d of shared group %s is not retained any more: nothing to dead-letter (%s)",
                    info.name,
                    d.partition,
                    d.offset,
                    group,
                    d.reason,
                )
                continue
            by_part.setdefault(d.partition, []).append(dead_letter_message(rec, group, d.attempts, d.reason))
        dlq = dead_letter_queue_name(info.name)
        failed: list[DeadLetter] = []
        for p, msgs in by_part.items():
            try:
                self._append_dead_letters(dlq, info.config, p, bytes(encode_batch(msgs)))
            except HeadwaterError as e:
                if self._gate() is None:
                    raise  # alone: the store's own failure, as before
                log.warning(
                    "dead letters of %s[%d] (shared group %s) could not be written to %s (%s); "
                    "they are tried again in %d ms",
                    info.name,
                    p,
                    group,
                    dlq,
                    e,
                    DEAD_LETTER_RETRY_MS,
                )
                failed.extend(d for d in dead if d.partition == p)
        return failed

    def _record(self, queue: str, partition: int, offset: int) -> Record | None:
        try:
            for b in self._fetch(queue, partition, offset, offset + 1):
                for r in decode_records(b, queue, start_offset=offset, end_offset=offset + 1):
                    return r
        except HeadwaterError as e:
            log.warning("cannot read %s[%d] offset %d for the dead-letter queue: %s", queue, partition, offset, e)
        return None

    def _read_leased(self, queue: str, leases: list[SharedLease]) -> list[bytes]:
        """The stored batches holding the leased offsets, each once."""
        runs: list[tuple[int, int, int]] = []  # (partition, first, end)
        for lease in sorted(leases, key=lambda x: (x.partition, x.offset)):
            if runs and runs[-1][0] == lease.partition and runs[-1][2] == lease.offset:
                runs[-1] = (lease.partition, runs[-1][1], lease.offset + 1)
            else:
                runs.append((lease.partition, lease.offset, lease.offset + 1))
        out: list[bytes] = []
        seen: set[tuple[int, int]] = set()
        for p, lo, hi in runs:
            for b in self._fetch(queue, p, lo, hi):
                key = (p, int.from_bytes(b[16:24], "little"))  # base offset (model.batch layout)
                if key not in seen:
                    seen.add(key)
                    out.append(b)
        return out
