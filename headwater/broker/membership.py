"""Consumer group membership: the coordinator's state machine. No I/O; the clock is passed in.

One :class:`Membership` holds every group of a broker; the group coordinator
(``headwater.broker.groups``) drives it under its lock and keeps the offsets durable.

How a rebalance goes (cooperative: partitions that do not move are never paused)
-----------------------------------------------------------------------------------
A join, a leave, a member missing its heartbeats for its ``session_timeout_ms``, or a
subscribed queue gaining partitions starts a **rebalance**: the group takes a new
**generation** (a number that only grows) and the strategy computes each member's
**target**. Targets are given out as soon as that is safe:

- a partition is **held** by at most one member at any time. A member holds what the
  coordinator has told it it may read and that it has not yet released;
- the answer to a join or heartbeat gives the member every partition of its target that
  nobody else holds (and marks them held by it). The rest is ``pending``: the member
  heartbeats more often until it gets them;
- a member that must give partitions up learns the new generation from its next heartbeat
  (its answer no longer lists them), stops reading them, may commit their positions (it still
  holds them, and its generation is current), and then heartbeats with the new generation:
  that **acknowledges** the generation and releases everything outside its target;
- a member that leaves or expires releases everything at once.

So no two members ever read the same partition, and a join pauses only the partitions that
move, for about one heartbeat interval of their previous holder.

Commits: a member's commit is accepted only from a current member, with the current
generation, for partitions it holds. A member paused past its session timeout was removed
(``UnknownMemberError``); one that missed a rebalance carries an old generation
(``StaleGenerationError``); both are refused, so neither can overwrite the progress of a
partition's new holder. A commit without a member id is accepted only while the group has no
members (offset resets and the simple consumer).

Broadcast groups: every member's target is every partition of its queues; partitions are not
exclusive and offsets stay with the members, so the coordinator only keeps the member list
(for ``group describe``) and refuses their commits.

The states of a group and what each event does in each is the table
:data:`~headwater.model.groups.TRANSITIONS`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from headwater.errors import (
    GroupNotFoundError,
    InvalidArgumentError,
    PartitionNotAssignedError,
    QueueNotFoundError,
    StaleGenerationError,
    UnknownMemberError,
)
from headwater.model.assignment import STRATEGIES, TP
from headwater.model.config import validate_queue_name
from headwater.model.groups import (
    CLIENT_ID_BAD,
    CLIENT_ID_CHARS_MAX,
    MODES,
    SESSION_TIMEOUT_MS_MAX,
    SESSION_TIMEOUT_MS_MIN,
    TRANSITIONS,
    Event,
    GroupAssignment,
    GroupDescription,
    GroupMode,
    GroupState,
    GroupSummary,
    HandedOffGroup,
    HandedOffMember,
    MemberDescription,
    MemberState,
    Transition,
    validate_group_name,
)

__all__ = ["Membership"]


# the state -------------------------------------------------------------------------------


@dataclass(eq=False)
class _Member:
    member_id: str
    client_id: str
    queues: frozenset[str]
    session_timeout_ms: int
    deadline_ms: float
    last_seen_ms: float
    target: set[TP] = field(default_factory=set)
    held: set[TP] = field(default_factory=set)
    acked_generation: int = 0

    def state(self) -> MemberState:
        if self.held - self.target:
            return MemberState.REVOKING
        if self.target - self.held:
            return MemberState.WAITING
        return MemberState.STABLE


@dataclass(eq=False)
class _Group:
    name: str
    mode: GroupMode
    strategy: str
    generation: int = 0
    members: dict[str, _Member] = field(default_factory=dict)
    holder: dict[TP, str] = field(default_factory=dict)  # clustering: who holds each partition
    counts: dict[str, int] = field(default_factory=dict)  # partition counts of the last rebalance
    version: int = 0  # Membership's change count at this group's last change (what a save compares)

    def state(self) -> GroupState:
        if not self.members:
            return GroupState.EMPTY
        if all(m.held == m.target for m in self.members.values()):
            return GroupState.STABLE
        return GroupState.RECONCILING


def _by_queue(tps: Iterable[TP]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for q, p in sorted(tps):
        out.setdefault(q, []).append(p)
    return out


class Membership:
    """Every group of one coordinator. Not thread-safe: the caller serialises calls.

    ``partitions_of(queue)`` gives a queue's partition count (0 if it does not exist).
    ``incarnation`` goes into member ids, so ids from before a restart never match new ones.
    ``now_ms`` arguments are a monotonic clock in milliseconds.
    """

    def __init__(
        self, partitions_of: Callable[[str], int], *, incarnation: str = "0", members_max: int = 10_000
    ) -> None:
        self._partitions_of = partitions_of
        self._incarnation = incarnation
        self._groups: dict[str, _Group] = {}
        self._generations = 0  # one counter for every group: a generation is never reused
        self._member_ids = 0
        self._changes = 0  # every change of a group's saved state, in all groups (version())
        self._grants_held: dict[str, float] = {}  # group -> no partition is granted before this time
        self.members_max = members_max

    # -- the table ------------------------------------------------------------------------

    def _fire(self, g: _Group | None, event: Event, refusal: str = "") -> Transition:
        state = GroupState.EMPTY if g is None else g.state()
        entry = TRANSITIONS[(state, event)]
        if isinstance(entry, type):
            raise entry(refusal)
        return entry

    @staticmethod
    def _settled(g: _Group, t: Transition) -> None:
        assert g.state() in t.next, (g.name, g.state(), t)

    def _changed(self, g: _Group) -> None:
        self._changes += 1
        g.version = self._changes

    def version(self, group: str) -> int:
        """A number that changes whenever what :meth:`hand_off` would give of ``group``
        changes (members, generation, targets, holders, acknowledged generations), and only
        then; 0 while the group has no members. A session kept alive changes nothing."""
        g = self._groups.get(group)
        return g.version if g is not None else 0

    # -- events ----------------------------------------------------------------------------

    def join(
        self,
        group: str,
        *,
        member_id: str | None,
        client_id: str,
        queues: Iterable[str],
        mode: str,
        strategy: str,
        session_timeout_ms: int,
        now_ms: float,
    ) -> GroupAssignment:
        """Add a member (or re-subscribe an existing one) and rebalance; the member's
        assignment at once (no second round trip)."""
        validate_group_name(group)
        mode_, subs, timeout = self._validate_join(client_id, queues, mode, strategy, session_timeout_ms)
        self._check_queues(subs)
        g = self._groups.get(group)
        if g is not None:
            self._expire(g, now_ms)
            g = self._groups.get(group)
        if g is not None and g.members:
            if g.mode is not mode_:
                raise InvalidArgumentError(
                    f"group {group!r} is a {g.mode.value} group ({len(g.members)} member(s)); "
                    f"a {mode_.value} member cannot join it: use another group name"
                )
            if mode_ is GroupMode.CLUSTERING and g.strategy != strategy:
                raise InvalidArgumentError(
                    f"group {group!r} assigns with strategy {g.strategy!r}; its members must all "
                    f"use it (asked for {strategy!r})"
                )
        m = g.members.get(member_id) if g is not None and member_id else None
        if m is None and g is not None and len(g.members) >= self.members_max:
            raise InvalidArgumentError(f"group {group!r} has {len(g.members)} members, the most allowed (members_max)")
        t = self._fire(g, Event.JOIN)
        if g is None or not g.members:
            g = self._groups[group] = _Group(group, mode_, strategy)
        if m is None:
            self._member_ids += 1
            cid = CLIENT_ID_BAD.sub("_", client_id)[:CLIENT_ID_CHARS_MAX] or "member"
            m = _Member(
                f"{cid}-{self._incarnation}-{self._member_ids}", client_id, subs, timeout, now_ms + timeout, now_ms
            )
            g.members[m.member_id] = m
        else:
            m.queues, m.session_timeout_ms = subs, timeout
        self._touch(m, now_ms)
        self._rebalance(g)
        answer = self._answer(g, m, now_ms)
        self._settled(g, t)
        return answer

    def heartbeat(self, group: str, member_id: str, generation: int, now_ms: float) -> GroupAssignment:
        """Keep the member alive. ``generation``: the newest generation whose assignment the
        member has applied; when it is the current one, the member has given up everything
        outside its target and that is released. Answers the current assignment."""
        g = self._live_group(group, now_ms)
        m = self._member(g, group, member_id, Event.HEARTBEAT)
        if isinstance(generation, bool) or not isinstance(generation, int) or not 0 <= generation <= g.generation:
            raise InvalidArgumentError(
                f"generation {generation!r} was never one of group {group!r} (it is at {g.generation})"
            )
        t = self._fire(g, Event.HEARTBEAT)
        self._touch(m, now_ms)
        if generation == g.generation:
            if m.acked_generation != generation:
                m.acked_generation = generation
                self._changed(g)
            self._release(g, m, m.held - m.target)
        answer = self._answer(g, m, now_ms)
        self._settled(g, t)
        return answer

    def leave(self, group: str, member_id: str, now_ms: float) -> None:
        """Remove the member; its partitions are free at once and the rest rebalance."""
        g = self._live_group(group, now_ms)
        m = self._member(g, group, member_id, Event.LEAVE)
        t = self._fire(g, Event.LEAVE)
        self._remove(g, m)
        self._after_removal(g, t)

    def check_commit(
        self,
        group: str,
        member_id: str | None,
        generation: int | None,
        queue: str,
        partitions: Iterable[int],
        now_ms: float,
    ) -> None:
        """Raise unless a commit of these partitions is allowed now (the state is unchanged
        either way, apart from expiring members whose session ran out)."""
        validate_group_name(group)
        g = self._groups.get(group)
        if g is not None:
            self._expire(g, now_ms)
            g = self._groups.get(group)
        if member_id is None:
            if generation is not None:
                raise InvalidArgumentError("a commit with a generation must also name its member_id")
            n = len(g.members) if g is not None else 0
            self._fire(
                g,
                Event.PLAIN_COMMIT,
                f"group {group!r} has {n} live member(s): only they commit its offsets "
                f"(with their member id and generation); stop them first, or wait for their "
                f"session timeout to pass after they stopped",
            )
            return
        m = self._member(g, group, member_id, Event.MEMBER_COMMIT)
        assert g is not None
        if g.mode is GroupMode.BROADCAST:
            raise InvalidArgumentError(
                f"group {group!r} is a broadcast group: its members keep their offsets themselves"
            )
        if isinstance(generation, bool) or not isinstance(generation, int):
            raise InvalidArgumentError(f"a member's commit carries its generation (an int), got {generation!r}")
        self._fire(g, Event.MEMBER_COMMIT)
        if generation != g.generation:
            raise StaleGenerationError(
                f"generation {generation} of group {group!r} is stale: the group rebalanced and is at "
                f"generation {g.generation}; heartbeat to learn the new assignment, then commit again"
            )
        missing = sorted(p for p in partitions if (queue, p) not in m.held)
        if missing:
            raise PartitionNotAssignedError(
                f"member {member_id!r} does not hold {queue}{missing} in generation {g.generation} "
                f"of group {group!r}; its partitions are {_by_queue(m.held)}"
            )

    def hold_grants(self, groups: Iterable[str], until_ms: float) -> None:
        """Grant no partition of these groups before ``until_ms``: after a broker restart the
        members of groups that existed before still read their partitions until a heartbeat
        tells them they are unknown, so handing those partitions out at once would have two
        members read one partition. Joins are answered (``pending``) meanwhile."""
        for group in groups:
            self._grants_held[group] = until_ms

    def forget(self, group: str) -> None:
        """Drop the group's members and held grants: another broker coordinates it now (its
        members hear NotCoordinator here, UnknownMember there, and join again)."""
        self._groups.pop(group, None)
        self._grants_held.pop(group, None)

    def hand_off(self, groups: Iterable[str], now_ms: float) -> list[HandedOffGroup]:
        """The membership of these groups (those with members), for their new coordinator
        (:meth:`adopt`); session deadlines are not handed: they begin again there."""
        out = []
        for name in sorted(set(groups)):
            g = self._groups.get(name)
            if g is None or not g.members:
                continue
            members = [
                HandedOffMember(
                    m.member_id,
                    m.client_id,
                    sorted(m.queues),
                    m.session_timeout_ms,
                    sorted(m.target),
                    sorted(m.held),
                    m.acked_generation,
                )
                for m in g.members.values()
            ]
            held = max(0.0, self._grants_held.get(name, 0.0) - now_ms)
            out.append(HandedOffGroup(name, g.mode.value, g.strategy, g.generation, dict(g.counts), members, held))
        return out

    def adopt(self, groups: Iterable[HandedOffGroup], now_ms: float) -> None:
        """Take over groups handed off by their old coordinator (:meth:`hand_off`), replacing
        whatever was here of them: the same members, generations and holders, so members go
        on without joining again; each member's session begins now."""
        for h in groups:
            g = _Group(h.name, GroupMode(h.mode), h.strategy, h.generation, counts=dict(h.counts))
            for hm in h.members:
                m = _Member(
                    hm.member_id,
                    hm.client_id,
                    frozenset(hm.queues),
                    hm.session_timeout_ms,
                    now_ms + hm.session_timeout_ms,
                    now_ms,
                    target={(q, p) for q, p in hm.target},
                    held={(q, p) for q, p in hm.held},
                    acked_generation=hm.acked_generation,
                )
                g.members[m.member_id] = m
                if g.mode is GroupMode.CLUSTERING:
                    g.holder.update(dict.fromkeys(m.held, m.member_id))
            self._groups[h.name] = g
            self._changed(g)
            self._generations = max(self._generations, h.generation)  # a generation is never reused
            self._grants_held.pop(h.name, None)
            if h.grants_held_ms > 0:
                self._grants_held[h.name] = now_ms + h.grants_held_ms

    def live_members(self, group: str, now_ms: float) -> int:
        """How many live members ``group`` has (expiring those whose session ran out)."""
        g = self._groups.get(group)
        if g is not None:
            self._expire(g, now_ms)
            g = self._groups.get(group)
        return len(g.members) if g is not None else 0

    def expire(self, now_ms: float, group: str | None = None) -> list[str]:
        """Remove the members whose session ran out (of one group, or of all); their ids."""
        gone: list[str] = []
        for g in list(self._groups.values()) if group is None else [self._groups.get(group)]:
            if g is not None:
                gone.extend(self._expire(g, now_ms))
        return gone

    # -- reading -----------------------------------------------------------------------------

    def describe(self, group: str, now_ms: float, offsets: Mapping[str, Mapping[int, int]]) -> GroupDescription:
        """The group's members and assignment; ``offsets`` are its committed offsets per queue
        (the caller reads them from where they are kept)."""
        validate_group_name(group)
        g = self._live_group(group, now_ms, missing_ok=True)
        if g is None:
            if not offsets:
                raise GroupNotFoundError(f"there is no group {group!r}: it has no members and no committed offsets")
            return GroupDescription(
                group=group, state=GroupState.EMPTY.value, offsets={q: dict(o) for q, o in offsets.items()}
            )
        members = [
            MemberDescription(
                member_id=m.member_id,
                client_id=m.client_id,
                queues=sorted(m.queues),
                state=m.state().value,
                assignment=_by_queue(m.held),
                pending=_by_queue(m.target - m.held),
                revoking=_by_queue(m.held - m.target),
                acked_generation=m.acked_generation,
                session_timeout_ms=m.session_timeout_ms,
                heartbeat_age_ms=int(now_ms - m.last_seen_ms),
            )
            for m in sorted(g.members.values(), key=lambda m: m.member_id)
        ]
        return GroupDescription(
            group=group,
            state=g.state().value,
            mode=g.mode.value,
            strategy=g.strategy,
            generation=g.generation,
            members=members,
            offsets={q: dict(o) for q, o in offsets.items()},
        )

    def summaries(
        self, now_ms: float, offset_queues: Mapping[str, Iterable[str]], *, expire: bool = True
    ) -> list[GroupSummary]:
        """Every group with members or committed offsets (``offset_queues``: group -> queues
        it has offsets on), by name. ``expire=False``: the caller expired them already."""
        if expire:
            self.expire(now_ms)
        names = sorted(set(self._groups) | set(offset_queues))
        out = []
        for name in names:
            g = self._groups.get(name)
            queues = set(offset_queues.get(name, ()))
            if g is None:
                out.append(GroupSummary(group=name, state=GroupState.EMPTY.value, queues=sorted(queues)))
                continue
            for m in g.members.values():
                queues |= m.queues
            out.append(
                GroupSummary(
                    group=name,
                    state=g.state().value,
                    mode=g.mode.value,
                    strategy=g.strategy,
                    generation=g.generation,
                    members=len(g.members),
                    queues=sorted(queues),
                )
            )
        return out

    # -- internals -------------------------------------------------------------------------

    @staticmethod
    def _validate_join(
        client_id: object, queues: object, mode: object, strategy: object, session_timeout_ms: object
    ) -> tuple[GroupMode, frozenset[str], int]:
        if mode not in MODES:
            raise InvalidArgumentError(f"unknown group mode {mode!r}: use one of {', '.join(MODES)}")
        if strategy not in STRATEGIES:
            raise InvalidArgumentError(
                f"unknown assignment strategy {strategy!r}: use one of {', '.join(sorted(STRATEGIES))}"
            )
        if not isinstance(client_id, str) or len(client_id) > 200:
            raise InvalidArgumentError("client_id is a string of at most 200 characters")
        if isinstance(queues, str) or not isinstance(queues, Iterable):
            raise InvalidArgumentError(f"queues is a list of queue names, got {queues!r}")
        subs = frozenset(queues)
        if not subs:
            raise InvalidArgumentError("a member subscribes to at least one queue")
        for q in subs:
            validate_queue_name(q)  # rejects the broker's own '__' names too: a name starts with a letter or digit
        t = session_timeout_ms
        if isinstance(t, bool) or not isinstance(t, int) or not SESSION_TIMEOUT_MS_MIN <= t <= SESSION_TIMEOUT_MS_MAX:
            raise InvalidArgumentError(
                f"session_timeout_ms must be from {SESSION_TIMEOUT_MS_MIN} to {SESSION_TIMEOUT_MS_MAX}, got {t!r}"
            )
        return GroupMode(mode), subs, t

    def _check_queues(self, subs: Iterable[str]) -> None:
        for q in sorted(subs):
            if self._partitions_of(q) <= 0:
                raise QueueNotFoundError(f"queue {q!r} does not exist; create it before subscribing to it")

    def _live_group(self, group: str, now_ms: float, *, missing_ok: bool = False) -> _Group | None:
        g = self._groups.get(group)
        if g is not None:
            self._expire(g, now_ms)
            g = self._groups.get(group)
        if g is not None:
            self._resize_if_needed(g)
        elif not missing_ok:
            validate_group_name(group)
            raise UnknownMemberError(
                f"group {group!r} has no members (its members left or missed their heartbeats); join again"
            )
        return g

    def _member(self, g: _Group | None, group: str, member_id: str, event: Event) -> _Member:
        m = g.members.get(member_id) if g is not None and isinstance(member_id, str) else None
        if m is None:
            raise UnknownMemberError(
                f"{member_id!r} is not a member of group {group!r}: it left, or missed heartbeats for its "
                f"session timeout and its partitions went to others; join again"
            )
        return m

    @staticmethod
    def _touch(m: _Member, now_ms: float) -> None:
        m.last_seen_ms = now_ms
        m.deadline_ms = now_ms + m.session_timeout_ms

    def _expire(self, g: _Group, now_ms: float) -> list[str]:
        gone = [m for m in g.members.values() if m.deadline_ms < now_ms]
        if not gone:
            return []
        t = self._fire(g, Event.EXPIRE)
        for m in gone:
            self._remove(g, m)
        self._after_removal(g, t)
        return [m.member_id for m in gone]

    def _resize_if_needed(self, g: _Group) -> None:
        subs = {q for m in g.members.values() for q in m.queues}
        if any(self._partitions_of(q) != g.counts.get(q, 0) for q in subs):
            t = self._fire(g, Event.RESIZE)
            self._rebalance(g)
            self._settled(g, t)

    def _remove(self, g: _Group, m: _Member) -> None:
        self._release(g, m, set(m.held))
        del g.members[m.member_id]
        self._changed(g)

    def _after_removal(self, g: _Group, t: Transition) -> None:
        if g.members:
            self._rebalance(g)
        self._settled(g, t)
        if not g.members:
            del self._groups[g.name]  # generations come from one counter: a new group never reuses one

    def _release(self, g: _Group, m: _Member, tps: set[TP]) -> None:
        if tps:
            self._changed(g)
        for tp in tps:
            m.held.discard(tp)
            if g.holder.get(tp) == m.member_id:
                del g.holder[tp]

    def _rebalance(self, g: _Group) -> None:
        self._changed(g)
        self._generations += 1
        g.generation = self._generations
        subs = {q for m in g.members.values() for q in m.queues}
        g.counts = {q: max(0, self._partitions_of(q)) for q in sorted(subs)}
        for m in g.members.values():  # partitions of deleted queues are nobody's
            self._release(g, m, {tp for tp in m.held if tp[1] >= g.counts.get(tp[0], 0)})
        if g.mode is GroupMode.BROADCAST:
            for m in g.members.values():
                m.target = {(q, p) for q in m.queues for p in range(g.counts.get(q, 0))}
            return
        members = {m.member_id: m.queues for m in g.members.values()}
        previous = {m.member_id: m.target for m in g.members.values()}
        target = STRATEGIES[g.strategy](members, g.counts, previous)
        for m in g.members.values():
            m.target = target[m.member_id]

    def _answer(self, g: _Group, m: _Member, now_ms: float) -> GroupAssignment:
        if g.mode is GroupMode.BROADCAST:
            if m.held != m.target:
                m.held = set(m.target)
                self._changed(g)
        elif now_ms < self._grants_held.get(g.name, 0.0):
            pass  # members from before a restart may still be reading: grant nothing yet
        else:
            for tp in m.target:
                if tp not in g.holder:
                    g.holder[tp] = m.member_id
                    m.held.add(tp)
                    self._changed(g)
        return GroupAssignment(
            member_id=m.member_id,
            generation=g.generation,
            assignment=_by_queue(m.held & m.target),
            pending=bool(m.target - m.held),
        )

    # -- for tests and operators ---------------------------------------------------------------

    def groups(self) -> list[str]:
        return sorted(self._groups)

    def snapshot(self, group: str) -> dict[str, object] | None:
        """A comparable picture of a group's whole state (tests check refused calls change nothing)."""
        g = self._groups.get(group)
        if g is None:
            return None
        return {
            "generation": g.generation,
            "mode": g.mode,
            "strategy": g.strategy,
            "counts": dict(g.counts),
            "holder": dict(g.holder),
            "members": {
                k: (m.queues, sorted(m.target), sorted(m.held), m.acked_generation, m.deadline_ms)
                for k, m in g.members.items()
            },
        }
