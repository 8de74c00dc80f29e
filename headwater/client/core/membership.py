"""What a group member knows about its membership, and the settings both group consumers
check: the no-I/O core under :class:`~headwater.client.sync.group_consumer.GroupConsumer` (threads)
and :class:`~headwater.client.aio.group_consumer.AsyncGroupConsumer` (asyncio).

Two parties update it: whoever heartbeats (a thread, or a task) records the broker's answers
with :meth:`MemberView.heard`; the application, at the start of ``poll``, takes what changed
(:meth:`MemberView.take`), applies it to its positions, and says so (:meth:`MemberView.applied`),
after which the next heartbeat acknowledges the generation. The sync consumer holds a lock
around every call; the asyncio one calls it from its one event loop.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from headwater.errors import InvalidArgumentError
from headwater.model.groups import MODES, SESSION_TIMEOUT_MS_MAX, SESSION_TIMEOUT_MS_MIN, GroupAssignment

__all__ = ["MemberView", "GroupSettings", "TP", "tps_of", "by_queue", "HEARTBEAT_WAITING_MS", "COMMIT_ATTEMPTS"]

TP = tuple[str, int]
COMMIT_ATTEMPTS = 3  # a commit refused as stale is retried after a heartbeat, this many times in all
HEARTBEAT_WAITING_MS = 50  # heartbeat interval while partitions of our target are still held by others
STRATEGIES = ("average", "sticky")


def tps_of(assignment: dict[str, list[int]]) -> set[TP]:
    return {(q, p) for q, ps in assignment.items() for p in ps}


def by_queue(offsets: dict[TP, int]) -> dict[str, dict[int, int]]:
    """``{(queue, partition): offset}`` as ``{queue: {partition: offset}}``; raises
    InvalidArgumentError naming the expected shape for anything else (what a user passes
    to ``commit(offsets)`` comes here)."""
    if not isinstance(offsets, dict):
        raise InvalidArgumentError(f"offsets are a dict {{(queue, partition): offset}}, got {offsets!r}")
    out: dict[str, dict[int, int]] = {}
    for tp, off in offsets.items():
        if not (
            isinstance(tp, tuple)
            and len(tp) == 2
            and isinstance(tp[0], str)
            and _is_int(tp[1])
            and _is_int(off)
            and off >= 0
        ):
            raise InvalidArgumentError(
                f"offsets are a dict {{(queue, partition): offset}} with offsets >= 0, e.g. {{('orders', 0): 42}}; "
                f"got the entry {tp!r}: {off!r}"
            )
        out.setdefault(tp[0], {})[tp[1]] = off
    return out


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class GroupSettings:
    """A member's settings, checked before anything is sent (the broker checks them again)."""

    def __init__(
        self,
        *,
        group: str | None,
        subscribe: str | Iterable[str],
        mode: str,
        strategy: str,
        session_timeout_ms: int,
        heartbeat_interval_ms: int | None,
        max_poll_interval_ms: int,
        offsets_path: object,
        client_id: str | None,
    ) -> None:
        if not group:
            raise InvalidArgumentError("a group consumer needs a group name: group='name'")
        queues = [subscribe] if isinstance(subscribe, str) else list(subscribe)
        if not queues or not all(isinstance(q, str) for q in queues):
            raise InvalidArgumentError(f"subscribe names one queue or a list of queues, got {subscribe!r}")
        if mode not in MODES:
            raise InvalidArgumentError(f"unknown group mode {mode!r}: use one of {', '.join(MODES)}")
        if strategy not in STRATEGIES:
            raise InvalidArgumentError(f"unknown assignment strategy {strategy!r}: use one of {', '.join(STRATEGIES)}")
        t = session_timeout_ms
        if isinstance(t, bool) or not isinstance(t, int) or not SESSION_TIMEOUT_MS_MIN <= t <= SESSION_TIMEOUT_MS_MAX:
            raise InvalidArgumentError(
                f"session_timeout_ms must be a whole number from {SESSION_TIMEOUT_MS_MIN} to {SESSION_TIMEOUT_MS_MAX}, "
                f"got {t!r}"
            )
        m = max_poll_interval_ms
        if isinstance(m, bool) or not isinstance(m, int) or m < SESSION_TIMEOUT_MS_MIN:
            raise InvalidArgumentError(
                f"max_poll_interval_ms (the longest a member may go between polls before it leaves the group) "
                f"must be a whole number of ms from {SESSION_TIMEOUT_MS_MIN}, got {m!r}"
            )
        if heartbeat_interval_ms is None:
            heartbeat_interval_ms = max(10, min(1000, session_timeout_ms // 3))
        if not 0 < heartbeat_interval_ms < session_timeout_ms:
            raise InvalidArgumentError(
                f"heartbeat_interval_ms ({heartbeat_interval_ms}) must be positive and shorter than "
                f"session_timeout_ms ({session_timeout_ms}); a third of it is usual"
            )
        if offsets_path is not None and mode != "broadcast":
            raise InvalidArgumentError("offsets_path is for broadcast groups; clustering groups commit to the broker")
        self.group = group
        self.queues = sorted(set(queues))
        self.mode = mode
        self.strategy = strategy
        self.session_timeout_ms = session_timeout_ms
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.max_poll_interval_ms = max_poll_interval_ms
        self.client_id = client_id or f"{os.uname().nodename}-{os.getpid()}"


class MemberView:
    """Membership as this member knows it. Not thread-safe: callers serialise."""

    def __init__(self) -> None:
        self.member_id: str | None = None
        self.applied_generation = 0  # the newest generation whose assignment the application applied
        self.known_generation = 0  # the newest generation the broker told us about
        self.assigned: frozenset[TP] = frozenset()
        self.update: GroupAssignment | None = None  # an answer not yet applied
        self.rejoin = False  # we are no longer a member: the next poll joins again
        self.waiting = False  # our target has partitions others still hold

    def joined(self, a: GroupAssignment) -> None:
        self.member_id = a.member_id
        self.applied_generation = 0
        self.known_generation = a.generation  # generations restart with a restarted broker
        self.rejoin = False
        self.update = None
        self.waiting = a.pending

    def member(self) -> str | None:
        """Our member id, or None if we are not a member now."""
        return None if self.rejoin else self.member_id

    def heard(self, a: GroupAssignment) -> bool:
        """Record a heartbeat's answer; True if the application should apply it."""
        # answers of two callers may cross: one older than what we know changes nothing
        if a.member_id != self.member_id or self.rejoin or a.generation < self.known_generation:
            return False
        self.known_generation = a.generation
        self.waiting = a.pending
        changed = a.generation != self.applied_generation or tps_of(a.assignment) != self.assigned
        if changed:
            self.update = a
        return changed

    def learned(self, a: GroupAssignment) -> None:
        """Record only the generation of a heartbeat's answer (a member that is leaving
        applies nothing, but its closing commit is refused as stale without it)."""
        if a.member_id == self.member_id and not self.rejoin and a.generation > self.known_generation:
            self.known_generation = a.generation

    def lost(self, member_id: str) -> None:
        """The broker does not know ``member_id`` (any more)."""
        if self.member_id == member_id:
            self.rejoin = True

    def left(self) -> None:
        """We left the group (closed)."""
        self.member_id = None

    def take(self) -> tuple[bool, GroupAssignment | None]:
        """What the application must do now: join again, or apply an answer (or nothing)."""
        update, self.update = self.update, None
        return self.rejoin, update

    def plan(self, a: GroupAssignment, current: set[TP]) -> tuple[set[TP], set[TP], set[TP]] | None:
        """``(new, revoked, added)`` for applying ``a`` to what is read now; None if ``a`` is
        older than what was applied."""
        if a.generation < self.applied_generation:
            return None
        new = tps_of(a.assignment)
        return new, current - new, new - current

    def applied(self, a: GroupAssignment, new: set[TP]) -> bool:
        """The application applied ``a``; True if that is a generation to acknowledge."""
        if a.member_id != self.member_id:
            return False
        acked = a.generation > self.applied_generation
        self.applied_generation = max(self.applied_generation, a.generation)
        self.assigned = frozenset(new)
        return acked
