"""GroupCoordinator: consumer group membership on the broker, over its state machine.

The rules (joins, heartbeats, generations, who holds which partition, which commits are
refused) are :class:`headwater.broker.membership.Membership`, which does no I/O; this
module adds a clock, locks, the partition counts of the store, and the committed offsets
of :class:`~headwater.broker.offsets.OffsetStore`.

Membership is kept in memory and, once the broker serves the network
(:meth:`GroupCoordinator.keep_members`), in the log of the committed offsets too: every
call that changes a group's members, generation, targets or holders writes the group's
record before it is answered (``headwater.broker.offsets``, "Members"; a heartbeat that only
keeps a session alive writes nothing). A broker that starts again, after a crash as after a
clean stop, takes the members back from there, so they go on with the same ids, generation
and partitions, as after a coordinator's move; committed offsets are durable. On a cluster
this broker coordinates the groups of the coordinator queue's partitions it leads: every
call first asks the offsets whether it coordinates the group now (NotCoordinatorError
otherwise), and the cluster node calls :meth:`GroupCoordinator.load_partition` and
:meth:`GroupCoordinator.unload_partition` as partitions come and go. When such a
partition moves, its groups' membership moves with it: once the move has fenced the
partition here (``moving``), membership calls of its groups are refused
(NotCoordinatorError: ask again) and :meth:`GroupCoordinator.hand_off` gives the new
coordinator the members, generations and holders, which :meth:`GroupCoordinator.adopt`
takes, so the members go on there without joining again.

Members whose session ran out are removed lazily, by the next call that touches their group
(a survivor's heartbeat, a describe, a commit), never by a timer: nobody can observe a group
without such a call, and survivors only learn of a rebalance through their own heartbeats
anyway.

Locking: one lock serialises the state machine (every call on it is short, no I/O). A
member's commit is checked and written under a second lock of its group (striped), which
every membership change of that group also takes, so no rebalance slips in between the
check and the write: a commit accepted for a partition is written before anyone else can
be given the partition.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

import msgspec

from headwater.broker.membership import Membership
from headwater.broker.offsets import OffsetStore
from headwater.errors import (
    GroupNotEmptyError,
    GroupNotFoundError,
    HeadwaterError,
    NotCoordinatorError,
    QueueNotFoundError,
)
from headwater.model.groups import (
    GroupAssignment,
    GroupDescription,
    GroupSummary,
    HandedOffGroup,
    validate_group_name,
)
from headwater.storage.api import Store

__all__ = ["GroupCoordinator"]

log = logging.getLogger("headwater.groups")

#: After a broker (re)start, groups that have committed offsets (so may have members from
#: before, still reading until their next heartbeat) get no partitions for this long. It
#: must exceed the members' heartbeat interval (1 s by default).
RESTART_GRACE_MS = 3000
PARTITION_COUNTS_TTL_S = 1.0  # how stale a cached partition count may be (add_partitions shows up after this)
COMMIT_LOCK_STRIPES = 64


class GroupCoordinator:
    """The groups of one broker. Thread-safe.

    ``clock``: seconds on a monotonic scale (session timeouts); tests pass a fake one.
    """

    def __init__(
        self,
        store: Store,
        offsets: OffsetStore,
        *,
        clock: Callable[[], float] = time.monotonic,
        members_max: int = 10_000,
    ) -> None:
        self._store = store
        self._offsets = offsets
        self._clock = clock
        self._lock = threading.Lock()
        self._stripes = [threading.Lock() for _ in range(COMMIT_LOCK_STRIPES)]
        self._counts: dict[str, tuple[int, float, int]] = {}  # queue -> (partitions, until, queue id)
        self._membership = Membership(self._partitions_of, incarnation=secrets.token_hex(3), members_max=members_max)
        # on a cluster: whether a move has fenced (queue, partition) here (Mover.moving)
        self.moving: Callable[[str, int], bool] | None = None
        self._keep = False  # whether membership changes are written to the offsets' log
        self._saved: dict[str, int] = {}  # group -> Membership.version() of its last record written

    def keep_members(self, *, write: bool = True) -> int:
        """Called when the broker starts serving the network: take back the groups written
        to the offsets' log before (the members go on, each session starting now) and, unless
        ``write`` is false (a store opened read-only), write each group's membership there
        from now on as it changes. An embedded broker does neither: its members lived in the
        process that stopped. How many groups came back."""
        self._keep = write
        return self._adopt_saved(None)

    def _adopt_saved(self, partition: int | None) -> int:
        """Take the membership records of the loaded offsets' partitions (or of ``partition``)
        for the groups with no live member here (a group handed over by a move knows better)."""
        groups = []
        for name, raw in self._offsets.saved_members(partition).items():
            try:
                groups.append(msgspec.msgpack.decode(raw, type=HandedOffGroup))
            except (msgspec.DecodeError, msgspec.ValidationError) as e:
                log.warning("group %r: its members in the offsets' log cannot be read (%s): they join again", name, e)
        with self._lock:
            now = self._now_ms()
            fresh = [g for g in groups if not self._membership.live_members(g.name, now)]
            self._membership.adopt(fresh, now)
            for g in fresh:
                self._saved[g.name] = self._membership.version(g.name)
        if fresh:
            log.info("took back the members of %d group(s) from the offsets' log", len(fresh))
        return len(fresh)

    @contextmanager
    def _changing(self, group: str) -> Iterator[None]:
        """Hold ``group``'s stripe for a call that may change its membership; before the
        call is answered, write the group's record if the membership changed since the last
        one written (by this call, or by a read that expired members). A record that
        cannot be written fails a call that succeeded (its answer would not survive a
        restart); one that failed already keeps its own error."""
        with self._stripe(group):
            try:
                yield
            except BaseException:
                try:
                    self._save(group)
                except HeadwaterError as e:
                    log.warning("the members of group %r were not written to the offsets' log: %s", group, e)
                raise
            self._save(group)

    def _save(self, group: str) -> None:
        """Under ``group``'s stripe: its record, if it changed since the last one written."""
        if not self._keep:
            return
        with self._lock:
            version = self._membership.version(group)
            if version == self._saved.get(group, 0):
                return
            handed = self._membership.hand_off([group], self._now_ms())
        # held grants are not kept: a restart holds them anew (RESTART_GRACE_MS)
        record = msgspec.msgpack.encode(msgspec.structs.replace(handed[0], grants_held_ms=0.0)) if handed else b""
        self._offsets.save_members(group, record)
        if version:
            self._saved[group] = version
        else:
            self._saved.pop(group, None)

    def hold_grants_after_restart(self, grace_ms: float = RESTART_GRACE_MS) -> None:
        """Called when the broker starts serving the network: see :data:`RESTART_GRACE_MS`.
        (An embedded broker needs no grace: its members lived in the process that stopped.)
        A group whose members came back with it (:meth:`keep_members`) is not held."""
        self._hold_unknown(self._offsets.group_queues(), grace_ms)

    def _hold_unknown(self, groups: Iterable[str], grace_ms: float) -> None:
        """Hold the grants of those of ``groups`` with no live member here: members of
        theirs elsewhere (before a restart, at the old coordinator) may still be reading. A
        group whose members are here (restored, handed over) knows who holds what."""
        with self._lock:
            now = self._now_ms()
            held = [g for g in groups if not self._membership.live_members(g, now)]
            self._membership.hold_grants(held, now + grace_ms)

    def load_partition(self, partition: int, grace_ms: float = RESTART_GRACE_MS) -> None:
        """Take over the groups of the offsets' ``partition`` (this broker came to lead it):
        load their offsets and the members written with them (when keeping them), and hold
        the other groups' grants as after a restart, since the members of the previous
        coordinator may still be reading; a group whose members were handed over
        (:meth:`adopt`) or written down is not held: who holds what came with it."""
        self._offsets.load(partition)
        if self._keep:  # (a read-only store has no partitions to lead)
            self._adopt_saved(partition)
        self._hold_unknown(self._offsets.group_queues(partition), grace_ms)

    def hand_off(self, partition: int) -> list[HandedOffGroup]:
        """The membership of the groups of the offsets' ``partition``, for the broker it
        moves to; the caller has checked that the move fenced it here, so no call changes
        them any more (:meth:`_check_moving`)."""
        with self._lock:
            names = self._offsets.groups_of(partition, self._membership.groups())
            return self._membership.hand_off(names, self._now_ms())

    def adopt(self, partition: int, groups: list[HandedOffGroup]) -> None:
        """Take the groups of the offsets' ``partition`` handed off by the broker it moves
        from, in place of whatever was here of that partition's groups (a hand-off asked
        again replaces the last one whole); served once this broker leads the partition."""
        with self._lock:
            for g in self._offsets.groups_of(partition, self._membership.groups()):
                self._membership.forget(g)
            self._membership.adopt(groups, self._now_ms())

    def _check_moving(self, group: str, partition: int) -> None:
        """Under the lock: refuse a membership call of a group whose partition a move has
        fenced here (its membership is being handed off; the new coordinator answers soon)."""
        if self.moving is not None and self.moving(self._offsets.queue, partition):
            raise NotCoordinatorError(
                f"the coordinator of group {group!r} is moving to another broker (with partition {partition} of "
                f"{self._offsets.queue}): ask again in a moment"
            )

    def unload_partition(self, partition: int) -> None:
        """Give up the groups of the offsets' ``partition`` (another broker leads it now):
        their offsets and members are forgotten here."""
        gone = set(self._offsets.group_queues(partition))
        self._offsets.unload(partition)
        with self._lock:
            names = self._membership.groups()
        for name in names:
            if name in gone or self._not_here(name):
                with self._stripe(name), self._lock:
                    self._membership.forget(name)
                    self._saved.pop(name, None)  # its record is the new coordinator's to write

    def _not_here(self, group: str) -> bool:
        try:
            self._offsets.partition_of(group)
        except HeadwaterError:  # NotCoordinatorError, or the cluster could not say: not ours now
            return True
        return False

    def _now_ms(self) -> float:
        return self._clock() * 1000.0

    def _stripe(self, group: str) -> threading.Lock:
        return self._stripes[hash(group) % COMMIT_LOCK_STRIPES]

    def _partitions_of(self, queue: str) -> int:
        """A queue's partition count (0: no such queue); positive counts are cached briefly,
        so heartbeats do not describe every subscribed queue each time."""
        now = time.monotonic()
        hit = self._counts.get(queue)
        # a queue deleted and made again has a new id: its old count is no use
        if hit is not None and hit[1] > now and self._store.queue_name(hit[2]) == queue:
            return hit[0]
        try:
            info = self._store.describe_queue(queue)
        except QueueNotFoundError:
            self._counts.pop(queue, None)
            return 0
        n = len(info.partitions)
        self._counts[queue] = (n, now + PARTITION_COUNTS_TTL_S, info.queue_id)
        return n

    # -- membership ----------------------------------------------------------------------

    def join_group(
        self,
        group: str,
        member_id: str | None,
        client_id: str,
        queues: list[str],
        mode: str,
        strategy: str,
        session_timeout_ms: int,
    ) -> GroupAssignment:
        validate_group_name(group)
        k = self._offsets.partition_of(group)  # NotCoordinatorError unless this broker coordinates it
        with self._changing(group), self._lock:
            self._check_moving(group, k)
            return self._membership.join(
                group,
                member_id=member_id,
                client_id=client_id,
                queues=queues,
                mode=mode,
                strategy=strategy,
                session_timeout_ms=session_timeout_ms,
                now_ms=self._now_ms(),
            )

    def heartbeat_group(self, group: str, member_id: str, generation: int) -> GroupAssignment:
        validate_group_name(group)
        k = self._offsets.partition_of(group)  # NotCoordinatorError unless this broker coordinates it
        with self._changing(group), self._lock:
            self._check_moving(group, k)
            return self._membership.heartbeat(group, member_id, generation, self._now_ms())

    def leave_group(self, group: str, member_id: str) -> None:
        validate_group_name(group)
        k = self._offsets.partition_of(group)  # NotCoordinatorError unless this broker coordinates it
        with self._changing(group), self._lock:
            self._check_moving(group, k)
            self._membership.leave(group, member_id, self._now_ms())

    def describe_group(self, group: str) -> GroupDescription:
        validate_group_name(group)
        offsets = self._offsets.fetch_group(group)
        # a read: members it expires are written by the group's next call that changes it
        with self._stripe(group), self._lock:
            return self._membership.describe(group, self._now_ms(), offsets)

    def list_groups(self) -> list[GroupSummary]:
        offset_queues = self._offsets.group_queues()
        with self._lock:
            names = self._membership.groups()
        for name in names:  # expiring changes a group: under its stripe, like every change
            with self._stripe(name), self._lock:  # a read, as describe_group
                self._membership.expire(self._now_ms(), name)
        with self._lock:
            listed = self._membership.summaries(self._now_ms(), offset_queues, expire=False)
        # a group handed over here ahead of a move's switch (or left by one rolled back) is
        # another broker's to list
        return [s for s in listed if s.group in offset_queues or not self._not_here(s.group)]

    def delete_group(self, group: str, queue: str | None = None) -> None:
        """Delete the group's committed offsets (on ``queue`` alone, if given), unless it
        has live members; see :meth:`BrokerService.delete_group`."""
        validate_group_name(group)
        self._offsets.partition_of(group)  # NotCoordinatorError unless this broker coordinates it
        if queue is not None:
            self._store.describe_queue(queue)  # QueueNotFoundError names it
        with self._changing(group):
            with self._lock:
                n = self._membership.live_members(group, self._now_ms())
                if n:
                    raise GroupNotEmptyError(
                        f"group {group!r} has {n} live member(s): stop them first (or wait for their "
                        f"session timeout to pass after they stopped), then delete it"
                    )
            if not self._offsets.delete(group, queue):
                on = f" on queue {queue!r}" if queue is not None else ""
                raise GroupNotFoundError(f"group {group!r} has no committed offsets{on}: nothing to delete")
            if queue is None:
                with self._lock:
                    self._membership.forget(group)

    # -- offsets -------------------------------------------------------------------------

    def commit_offsets(
        self,
        group: str,
        queue: str,
        offsets: dict[int, int],
        member_id: str | None = None,
        generation: int | None = None,
    ) -> None:
        """Check the commit against the group's membership, then write it, with no
        rebalance of the group in between."""
        validate_group_name(group)
        self._offsets.partition_of(group)  # NotCoordinatorError unless this broker coordinates it
        parts: Iterable[int] = offsets.keys() if isinstance(offsets, dict) else ()
        with self._changing(group):  # the check expires members whose session ran out
            with self._lock:
                self._membership.check_commit(group, member_id, generation, queue, list(parts), self._now_ms())
            self._offsets.commit(group, queue, offsets)
