"""Shared groups: the delivery state of messages leased to any member (no I/O, clock passed in).

A shared group consumes a queue without binding partitions to members (QMQ's pull log,
Kafka's share groups): any member takes messages from any partition. The broker keeps, per
(group, queue, partition), a cursor::

    offsets:   0 .. floor-1 | floor ............................ next-1 | next .. end-1
               finished     | the window: each offset AVAILABLE (to    | never delivered
               (acked, dead |  redeliver), LEASED, ACKED or DEAD       |
               or expired)  |                                           |

``floor`` (Kafka's SPSO) moves up as the offsets at the bottom of the window finish, so
acknowledgements out of order cost one entry each until they become contiguous; ``next``
(SPEO) is how far the group has delivered. The window is bounded (``in_flight_max``):
when it is full, receivers wait until its bottom finishes. That bound is what keeps the
state of a group small whatever the backlog.

What may happen to one offset is the table :data:`TRANSITIONS` below, and nothing else:
every change goes through :func:`next_state`. The shared-group operations
(``headwater.broker.shared_core``) run it, and ``headwater.broker.shared`` makes its changes
durable and writes dead letters.

Thread-safety: none; the owner holds a lock around every call.
"""

from __future__ import annotations

import heapq
from collections.abc import Container, Iterable
from enum import Enum, IntEnum
from typing import NamedTuple

from headwater.errors import LeaseExpiredError, LeaseNotOwnedError
from headwater.model.shared import (
    REASON_CHARS_MAX,
    DeadLetter,
    LeaseId,
    LeaseRefusal,
    SharedGroupSettings,
    SharedLease,
    SharedPartitionInfo,
)

__all__ = [
    "DeliveryState",
    "DeliveryEvent",
    "TRANSITIONS",
    "next_state",
    "PartitionImage",
    "Changes",
    "PartitionCursor",
    "SharedQueueState",
]

# the table ---------------------------------------------------------------------------


class DeliveryState(IntEnum):
    """Where one offset of the window stands. ACKED and DEAD are final."""

    AVAILABLE = 0  # delivered before, waiting (maybe for its backoff) to be delivered again
    LEASED = 1  # delivered, its lease running
    ACKED = 2  # done (acknowledged, or delivered at most once)
    DEAD = 3  # attempts used up: copied to the dead-letter queue


class DeliveryEvent(Enum):
    DELIVER = "deliver"  # a member receives it (at least once: a lease starts)
    DELIVER_AT_MOST_ONCE = "deliver-at-most-once"  # a member receives it, done on delivery
    ACK = "ack"
    NACK = "nack"
    EXPIRE = "expire"  # the visibility timeout passed without an ack
    EXTEND = "extend"  # the member asks for more time
    RESTART = "restart"  # the broker restarted while it was leased


AVAILABLE, LEASED, ACKED, DEAD = DeliveryState
_ANY, _LEFT, _SPENT = "any", "attempts left", "attempts used up"

#: (state, event, guard) -> next state. A new record (never delivered) is AVAILABLE with 0
#: attempts. The guard is on the attempts so far: delivering an offset that has used them up
#: (max_attempts lowered, or its last lease was lost in a restart) dead-letters it instead.
_ROWS: list[tuple[DeliveryState, DeliveryEvent, str, DeliveryState]] = [
    (AVAILABLE, DeliveryEvent.DELIVER, _LEFT, LEASED),
    (AVAILABLE, DeliveryEvent.DELIVER, _SPENT, DEAD),
    (AVAILABLE, DeliveryEvent.DELIVER_AT_MOST_ONCE, _LEFT, ACKED),
    (AVAILABLE, DeliveryEvent.DELIVER_AT_MOST_ONCE, _SPENT, DEAD),
    (LEASED, DeliveryEvent.ACK, _ANY, ACKED),
    (LEASED, DeliveryEvent.EXTEND, _ANY, LEASED),
    (LEASED, DeliveryEvent.NACK, _LEFT, AVAILABLE),
    (LEASED, DeliveryEvent.NACK, _SPENT, DEAD),
    (LEASED, DeliveryEvent.EXPIRE, _LEFT, AVAILABLE),
    (LEASED, DeliveryEvent.EXPIRE, _SPENT, DEAD),
    (LEASED, DeliveryEvent.RESTART, _ANY, AVAILABLE),
]

TRANSITIONS: dict[tuple[DeliveryState, DeliveryEvent, bool], DeliveryState] = {}
for _state, _event, _guard, _to in _ROWS:
    for _spent in (False, True) if _guard == _ANY else (_guard == _SPENT,):
        TRANSITIONS[(_state, _event, _spent)] = _to
del _state, _event, _guard, _to, _spent


class _NoTransition(Exception):
    """The event does not apply to the offset's state (turned into a lease refusal)."""


def next_state(state: DeliveryState, event: DeliveryEvent, attempts_spent: bool) -> DeliveryState:
    """The state after ``event``; :class:`_NoTransition` when the table has no such row."""
    try:
        return TRANSITIONS[(state, event, attempts_spent)]
    except KeyError:
        raise _NoTransition(f"{event.value} does not apply to a {state.name.lower()} message") from None


# the cursor of one partition -------------------------------------------------------------


class _Entry:
    __slots__ = ("state", "attempts", "due_ms", "member", "reason")

    def __init__(self, state: DeliveryState, attempts: int, due_ms: int, member: str, reason: str) -> None:
        self.state = state
        self.attempts = attempts
        self.due_ms = due_ms  # LEASED: the lease's deadline; AVAILABLE: the end of its backoff
        self.member = member  # LEASED: who holds it
        self.reason = reason  # the last failure, for the dead-letter copy


#: What is recorded of one offset: (state, attempts, due_ms, reason).
EntryImage = tuple[int, int, int, str]


class PartitionImage(NamedTuple):
    """A partition's cursor as data (durable records and snapshots): floor, next, how many
    were dead-lettered so far, and ``{offset: EntryImage}`` (a snapshot holds every entry of
    the window; a change record only those that changed)."""

    floor: int
    next: int
    dead_lettered: int
    entries: dict[int, EntryImage]


class PartitionCursor:
    """The window of one partition (see the module docstring)."""

    __slots__ = ("floor", "next", "entries", "dead_lettered", "_retry", "_leases")

    def __init__(self, floor: int = 0) -> None:
        self.floor = floor
        self.next = floor
        self.entries: dict[int, _Entry] = {}
        self.dead_lettered = 0
        # heaps with lazy deletion: an item is live while its entry still matches it
        self._retry: list[tuple[int, int, int]] = []  # (due_ms, offset, attempts) of AVAILABLE
        self._leases: list[tuple[int, int, int]] = []  # (deadline_ms, offset, attempts) of LEASED

    def _index(self, offset: int, e: _Entry) -> None:
        if e.state is AVAILABLE:
            heapq.heappush(self._retry, (e.due_ms, offset, e.attempts))
        elif e.state is LEASED:
            heapq.heappush(self._leases, (e.due_ms, offset, e.attempts))

    def _live(self, item: tuple[int, int, int], state: DeliveryState) -> _Entry | None:
        e = self.entries.get(item[1])
        if e is not None and e.state is state and e.due_ms == item[0] and e.attempts == item[2]:
            return e
        return None

    def _top(self, heap: list[tuple[int, int, int]], state: DeliveryState) -> tuple[int, int, int] | None:
        while heap:
            if self._live(heap[0], state) is not None:
                return heap[0]
            heapq.heappop(heap)
        return None

    def due_retry(self, now_ms: int) -> int | None:
        """The offset of the next message waiting to be delivered again whose backoff is over."""
        top = self._top(self._retry, AVAILABLE)
        return top[1] if top is not None and top[0] <= now_ms else None

    def expired_lease(self, now_ms: int) -> int | None:
        top = self._top(self._leases, LEASED)
        return top[1] if top is not None and top[0] <= now_ms else None

    def next_due_ms(self) -> int | None:
        tops = [t[0] for t in (self._top(self._retry, AVAILABLE), self._top(self._leases, LEASED)) if t]
        return min(tops) if tops else None

    def set(self, offset: int, state: DeliveryState, attempts: int, due_ms: int, member: str, reason: str) -> None:
        e = self.entries.get(offset)
        if state is DEAD and (e is None or e.state is not DEAD):
            self.dead_lettered += 1
        if e is None:
            e = self.entries[offset] = _Entry(state, attempts, due_ms, member, reason)
        else:
            e.state, e.attempts, e.due_ms, e.member, e.reason = state, attempts, due_ms, member, reason
        self._index(offset, e)

    def advance_floor(self) -> None:
        entries = self.entries
        while self.floor < self.next:
            e = entries.get(self.floor)
            if e is not None and e.state in (AVAILABLE, LEASED):
                return
            entries.pop(self.floor, None)
            self.floor += 1

    def skip_to(self, start: int) -> bool:
        """Forget offsets below ``start`` (expired by TTL or truncated); True if any were."""
        if not self._drop_below(start):
            return False
        self.advance_floor()
        return True

    def _drop_below(self, start: int) -> bool:
        if start <= self.floor:
            return False
        if start - self.floor < len(self.entries):
            for off in range(self.floor, min(start, self.next)):
                self.entries.pop(off, None)
        else:
            for off in [o for o in self.entries if o < start]:
                del self.entries[off]
        self.floor = start
        self.next = max(self.next, start)
        return True

    def image(self, offsets: Iterable[int] | None = None) -> PartitionImage:
        chosen = self.entries if offsets is None else offsets
        out: dict[int, EntryImage] = {}
        for off in chosen:
            e = self.entries.get(off)
            if e is not None:  # offsets gone from the window are below the floor: finished
                out[off] = (int(e.state), e.attempts, e.due_ms, e.reason)
        return PartitionImage(self.floor, self.next, self.dead_lettered, out)

    def load(self, img: PartitionImage, replace: bool) -> None:
        """Apply a recorded image: a snapshot (``replace``) or a change record."""
        if replace:
            self.entries.clear()
            self._retry.clear()
            self._leases.clear()
            self.floor = img.floor
            self.next = img.next
        else:  # the floor moves before the entries land: advancing it now would skip them
            self.next = max(self.next, img.next)
            self._drop_below(img.floor)
        for off, (state, attempts, due_ms, reason) in img.entries.items():
            if off < self.floor:
                continue
            e = self.entries.get(off)
            if e is None:
                e = self.entries[off] = _Entry(DeliveryState(state), attempts, due_ms, "", reason)
            else:
                e.state, e.attempts, e.due_ms, e.reason = DeliveryState(state), attempts, due_ms, reason
            self._index(off, e)
        self.dead_lettered = img.dead_lettered
        self.advance_floor()


class Changes:
    """The offsets one operation changed, per partition: what the owner makes durable."""

    __slots__ = ("offsets", "settings_changed")

    def __init__(self) -> None:
        self.offsets: dict[int, set[int]] = {}
        self.settings_changed = False

    def touch(self, partition: int, offset: int | None = None) -> None:
        s = self.offsets.setdefault(partition, set())
        if offset is not None:
            s.add(offset)

    def __bool__(self) -> bool:
        return bool(self.offsets) or self.settings_changed


# the state of one group on one queue ----------------------------------------------------


class SharedQueueState:
    """Every partition's cursor of one shared group on one queue, and the operations on them.

    Each operation takes ``now_ms`` and a :class:`Changes` to fill in; it returns what the
    caller must act on (leases to hand out, refusals to report, dead letters to write).
    Before each operation the caller passes the partitions' retained ranges to :meth:`bound`
    and runs :meth:`expire`.
    """

    def __init__(self, group: str, queue_id: int, settings: SharedGroupSettings | None = None) -> None:
        self.group = group
        self.queue_id = queue_id
        self.settings = settings or SharedGroupSettings()
        self.cursors: dict[int, PartitionCursor] = {}
        self._ends: dict[int, int] = {}
        self._rotation = 0

    def cursor(self, partition: int) -> PartitionCursor:
        c = self.cursors.get(partition)
        if c is None:
            c = self.cursors[partition] = PartitionCursor()
        return c

    def set_settings(self, settings: SharedGroupSettings, changes: Changes) -> None:
        if settings != self.settings:
            self.settings = settings
            changes.settings_changed = True

    def bound(self, partition: int, start: int, end: int, changes: Changes) -> None:
        """The partition's retained range now: offsets below ``start`` are gone (TTL,
        truncation), nothing at or above ``end`` exists yet."""
        self._ends[partition] = end
        c = self.cursor(partition)
        if c.skip_to(start):
            changes.touch(partition)

    # -- the operations ---------------------------------------------------------------

    def expire(self, now_ms: int, changes: Changes, only: Container[int] | None = None) -> list[DeadLetter]:
        """End every lease whose deadline has passed: back to AVAILABLE after a backoff, or
        dead when its attempts are used up. ``only``: the partitions to look at (on a
        cluster, those the broker leads: another's state is left as it is)."""
        dead: list[DeadLetter] = []
        for p, c in self.cursors.items():
            if only is not None and p not in only:
                continue
            while (off := c.expired_lease(now_ms)) is not None:
                d = self._fail(
                    p, c, off, DeliveryEvent.EXPIRE, "lease expired (visibility timeout)", None, now_ms, changes
                )
                if d is not None:
                    dead.append(d)
            c.advance_floor()
        return dead

    def receive(
        self,
        member: str,
        max_messages: int,
        visibility_timeout_ms: int,
        at_most_once: bool,
        now_ms: int,
        changes: Changes,
        only: Container[int] | None = None,
    ) -> tuple[list[SharedLease], list[DeadLetter]]:
        """Lease up to ``max_messages``: redeliveries whose backoff is over first, then new
        messages, from any partition (starting from a different one each call); ``only``:
        from these partitions alone (on a cluster, those the broker leads)."""
        out: list[SharedLease] = []
        dead: list[DeadLetter] = []
        parts = sorted(p for p in self._ends if only is None or p in only)
        if not parts:
            return out, dead
        self._rotation = (self._rotation + 1) % len(parts)
        event = DeliveryEvent.DELIVER_AT_MOST_ONCE if at_most_once else DeliveryEvent.DELIVER
        deadline = 0 if at_most_once else now_ms + visibility_timeout_ms
        max_attempts = self.settings.max_attempts
        for p in parts[self._rotation :] + parts[: self._rotation]:
            c = self.cursor(p)
            while len(out) < max_messages and (off := c.due_retry(now_ms)) is not None:
                e = c.entries[off]
                spent = e.attempts >= max_attempts
                state = next_state(AVAILABLE, event, spent)
                if state is DEAD:
                    c.set(off, DEAD, e.attempts, 0, "", e.reason)
                    dead.append(DeadLetter(p, off, e.attempts, e.reason or "max attempts reached"))
                else:
                    attempt = e.attempts + 1
                    c.set(off, state, attempt, deadline, member if state is LEASED else "", e.reason)
                    out.append(self._lease(p, off, attempt, member, deadline, at_most_once))
                changes.touch(p, off)
            stop = min(self._ends[p], c.floor + self.settings.in_flight_max)
            while len(out) < max_messages and c.next < stop:
                off = c.next
                state = next_state(AVAILABLE, event, max_attempts <= 0)
                c.set(off, state, 1, deadline, member if state is LEASED else "", "")
                c.next += 1
                out.append(self._lease(p, off, 1, member, deadline, at_most_once))
                changes.touch(p, off)
            c.advance_floor()
            if len(out) >= max_messages:
                break
        return out, dead

    def _lease(self, p: int, off: int, attempt: int, member: str, deadline: int, at_most_once: bool) -> SharedLease:
        lid = "" if at_most_once else str(LeaseId(self.queue_id, p, off, attempt, member))
        return SharedLease(p, off, attempt, lid, deadline)

    def ack(self, member: str, leases: list[LeaseId], now_ms: int, changes: Changes) -> list[LeaseRefusal]:
        refused = []
        for lease in leases:
            try:
                c, e = self._held(member, lease)
                c.set(lease.offset, next_state(e.state, DeliveryEvent.ACK, False), e.attempts, 0, "", "")
                changes.touch(lease.partition, lease.offset)
            except (LeaseExpiredError, LeaseNotOwnedError) as err:
                refused.append(LeaseRefusal(str(lease), err.code, str(err)))
        self._advance(leases)
        return refused

    def nack(
        self, member: str, leases: list[LeaseId], reason: str, delay_ms: int | None, now_ms: int, changes: Changes
    ) -> tuple[list[LeaseRefusal], list[DeadLetter]]:
        refused, dead = [], []
        reason = (reason or "nacked")[:REASON_CHARS_MAX]
        for lease in leases:
            try:
                c, _e = self._held(member, lease)
            except (LeaseExpiredError, LeaseNotOwnedError) as err:
                refused.append(LeaseRefusal(str(lease), err.code, str(err)))
                continue
            d = self._fail(lease.partition, c, lease.offset, DeliveryEvent.NACK, reason, delay_ms, now_ms, changes)
            if d is not None:
                dead.append(d)
        self._advance(leases)
        return refused, dead

    def extend(
        self, member: str, leases: list[LeaseId], visibility_timeout_ms: int, now_ms: int, changes: Changes
    ) -> list[LeaseRefusal]:
        refused = []
        for lease in leases:
            try:
                c, e = self._held(member, lease)
            except (LeaseExpiredError, LeaseNotOwnedError) as err:
                refused.append(LeaseRefusal(str(lease), err.code, str(err)))
                continue
            state = next_state(e.state, DeliveryEvent.EXTEND, False)
            c.set(lease.offset, state, e.attempts, now_ms + visibility_timeout_ms, member, e.reason)
            changes.touch(lease.partition, lease.offset)
        return refused

    def revive(self, d: DeadLetter, due_ms: int, changes: Changes) -> None:
        """Undo a dead-lettering whose copy could not be written (the dead-letter queue's
        partition was out of reach): the message is AVAILABLE again from ``due_ms``, its
        attempts still used up, so its next delivery dead-letters it again. At least once:
        a message is never marked dead without its copy."""
        c = self.cursor(d.partition)
        e = c.entries.get(d.offset)
        if e is not None and e.state is not DEAD:
            return
        c.dead_lettered = max(0, c.dead_lettered - 1)
        c.floor = min(c.floor, d.offset)  # the floor may have passed it: offsets missing below count as finished
        c.set(d.offset, AVAILABLE, d.attempts, due_ms, "", d.reason)
        changes.touch(d.partition, d.offset)

    def release_all(self, reason: str) -> int:
        """The broker restarted: every lease it had given is void, its message available
        again at once (the delivery counted as an attempt). Returns how many."""
        n = 0
        for c in self.cursors.values():
            for off, e in list(c.entries.items()):
                if e.state is LEASED:
                    c.set(off, next_state(LEASED, DeliveryEvent.RESTART, False), e.attempts, 0, "", reason)
                    n += 1
        return n

    def _fail(
        self,
        p: int,
        c: PartitionCursor,
        off: int,
        event: DeliveryEvent,
        reason: str,
        delay_ms: int | None,
        now_ms: int,
        changes: Changes,
    ) -> DeadLetter | None:
        e = c.entries[off]
        spent = e.attempts >= self.settings.max_attempts
        state = next_state(e.state, event, spent)
        changes.touch(p, off)
        if state is DEAD:
            c.set(off, DEAD, e.attempts, 0, "", reason)
            return DeadLetter(p, off, e.attempts, reason)
        wait = self.settings.backoff_for(e.attempts) if delay_ms is None else delay_ms
        c.set(off, state, e.attempts, now_ms + wait, "", reason)
        return None

    def _held(self, member: str, lease: LeaseId) -> tuple[PartitionCursor, _Entry]:
        """The cursor and entry of a lease ``member`` holds now, else the error saying why not."""
        if lease.member != member:
            raise LeaseNotOwnedError(f"lease {lease} belongs to member {lease.member!r}, not to {member!r}")
        if lease.queue_id != self.queue_id:
            raise LeaseExpiredError(
                f"lease {lease} is for a queue with id {lease.queue_id}, this one has id {self.queue_id} "
                f"(was the queue deleted and created again?)"
            )
        c = self.cursors.get(lease.partition)
        if c is None or lease.offset >= c.next:
            raise LeaseExpiredError(f"lease {lease}: that message was never delivered to this group")
        e = c.entries.get(lease.offset)
        if e is None:
            raise LeaseExpiredError(
                f"lease {lease}: the message is already finished (acknowledged, dead-lettered or no longer retained)"
            )
        if e.attempts != lease.attempt:
            raise LeaseExpiredError(
                f"lease {lease} expired: the message was delivered again since (attempt {e.attempts})"
            )
        if e.state is LEASED:
            return c, e
        if e.state is AVAILABLE:
            raise LeaseExpiredError(
                f"lease {lease} expired: it was released for redelivery ({e.reason or 'timed out'})"
            )
        if e.state is ACKED:
            raise LeaseExpiredError(f"lease {lease}: the message is already acknowledged")
        raise LeaseExpiredError(f"lease {lease}: the message was dead-lettered")

    def _advance(self, leases: list[LeaseId]) -> None:
        for p in {lease.partition for lease in leases}:
            c = self.cursors.get(p)
            if c is not None:
                c.advance_floor()

    # -- reading the state --------------------------------------------------------------

    def next_due_ms(self, only: Container[int] | None = None) -> int | None:
        """The soonest a lease expires or a backoff ends (something may become deliverable),
        in the partitions ``only`` (None: all)."""
        dues = [
            d for p, c in self.cursors.items() if (only is None or p in only) and (d := c.next_due_ms()) is not None
        ]
        return min(dues) if dues else None

    def lease_holders(self, now_ms: int) -> set[str]:
        """The members holding a lease that has not run out by ``now_ms`` (without expiring
        the others: a look, not an operation)."""
        return {
            e.member
            for c in self.cursors.values()
            for e in c.entries.values()
            if e.state is LEASED and e.due_ms > now_ms
        }

    def describe(self, starts: dict[int, int], ends: dict[int, int]) -> list[SharedPartitionInfo]:
        out = []
        for p in sorted(ends):
            c = self.cursors.get(p) or PartitionCursor(starts[p])
            counts = {s: 0 for s in DeliveryState}
            members: dict[str, int] = {}
            deadline = None
            for _off, e in c.entries.items():
                counts[e.state] += 1
                if e.state is LEASED:
                    members[e.member] = members.get(e.member, 0) + 1
                    deadline = e.due_ms if deadline is None else min(deadline, e.due_ms)
            out.append(
                SharedPartitionInfo(
                    partition=p,
                    start_offset=starts[p],
                    end_offset=ends[p],
                    committed_offset=max(c.floor, starts[p]),
                    delivered_offset=max(c.next, starts[p]),
                    leased=counts[LEASED],
                    awaiting_retry=counts[AVAILABLE],
                    acked_ahead=counts[ACKED] + counts[DEAD],
                    dead_lettered=c.dead_lettered,
                    members=members,
                    next_lease_deadline_ms=deadline,
                )
            )
        return out

    def images(self, changes: Changes | None = None) -> dict[int, PartitionImage]:
        """The changed part of each touched partition, or (``changes`` None) everything."""
        if changes is None:
            return {p: c.image() for p, c in self.cursors.items()}
        return {p: self.cursor(p).image(offs) for p, offs in changes.offsets.items()}

    def load(self, images: dict[int, PartitionImage], replace: bool) -> None:
        if replace:
            self.cursors.clear()
        for p, img in images.items():
            self.cursor(p).load(img, replace)
