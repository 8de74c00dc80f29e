"""Consumer groups: the values that cross the service interface, the names and bounds a
group is checked against, and the table of what each event does in each state
(:data:`TRANSITIONS`). No I/O.

The coordinator that drives the table, :class:`~headwater.broker.membership.Membership`,
lives in the broker (``headwater/broker/membership.py`` explains how a rebalance goes).
"""

from __future__ import annotations

import re
from enum import Enum
from typing import NamedTuple

import msgspec

from headwater.errors import (
    GroupError,
    GroupNotEmptyError,
    UnknownMemberError,
)
from headwater.model.checks import check_name

__all__ = [
    "partition_lag",
    "GroupMode",
    "GroupState",
    "MemberState",
    "Event",
    "Transition",
    "TRANSITIONS",
    "GroupAssignment",
    "MemberDescription",
    "GroupDescription",
    "GroupSummary",
    "HandedOffGroup",
    "HandedOffMember",
    "validate_group_name",
    "CLIENT_ID_CHARS_MAX",
    "CLIENT_ID_BAD",
    "SESSION_TIMEOUT_MS_MIN",
    "SESSION_TIMEOUT_MS_MAX",
    "MODES",
]

SESSION_TIMEOUT_MS_MIN = 100
SESSION_TIMEOUT_MS_MAX = 3_600_000
CLIENT_ID_CHARS_MAX = 64
CLIENT_ID_BAD = re.compile(r"[^A-Za-z0-9._-]")


def partition_lag(committed: int | None, start_offset: int, end_offset: int) -> int | None:
    """Messages of a partition a group has not consumed: its end offset minus the committed
    offset (a commit older than the retained start counts from the start), never below 0;
    None when the group has committed nothing there. The one rule ``headwater group
    describe``, ``headwater queue lag`` and the broker's ``headwater_consumer_lag`` metric
    share, so they cannot disagree.

    >>> partition_lag(40, 0, 100), partition_lag(5, 20, 100), partition_lag(None, 0, 100)
    (60, 80, None)
    """
    if committed is None:
        return None
    return max(0, end_offset - max(committed, start_offset))


def validate_group_name(group: object) -> str:
    return check_name(group, "group name")


class GroupMode(str, Enum):
    CLUSTERING = "clustering"  # members share the partitions; offsets on the broker
    BROADCAST = "broadcast"  # every member reads everything; offsets kept by each member


MODES = tuple(m.value for m in GroupMode)


class GroupState(str, Enum):
    EMPTY = "empty"  # no members (the group may still have committed offsets)
    RECONCILING = "reconciling"  # some member holds a partition outside its target, or waits for one
    STABLE = "stable"  # every member holds exactly its target


class MemberState(str, Enum):
    STABLE = "stable"  # holds exactly its target
    REVOKING = "revoking"  # must give partitions up (will on its next heartbeat)
    WAITING = "waiting"  # waits for partitions others still hold


class Event(str, Enum):
    JOIN = "join"
    HEARTBEAT = "heartbeat"
    LEAVE = "leave"
    EXPIRE = "expire"  # members missed their heartbeats for their session timeout
    RESIZE = "resize"  # a subscribed queue's partition count changed (or it was deleted)
    MEMBER_COMMIT = "member_commit"
    PLAIN_COMMIT = "plain_commit"  # a commit without a member id (reset, simple consumer)


class Transition(NamedTuple):
    rebalance: bool  # does the event start a new generation
    next: frozenset[GroupState]  # the states the group may be in afterwards


_E, _R, _S = GroupState.EMPTY, GroupState.RECONCILING, GroupState.STABLE
_ANY_MEMBERS = frozenset({_R, _S})
_ANY = frozenset({_E, _R, _S})

#: What each event does in each state; an error class means the event is refused there.
#: Missing pairs cannot happen (an empty group has no member to expire or resize for).
TRANSITIONS: dict[tuple[GroupState, Event], Transition | type[GroupError]] = {
    (_E, Event.JOIN): Transition(True, _ANY_MEMBERS),
    (_E, Event.HEARTBEAT): UnknownMemberError,
    (_E, Event.LEAVE): UnknownMemberError,
    (_E, Event.MEMBER_COMMIT): UnknownMemberError,
    (_E, Event.PLAIN_COMMIT): Transition(False, frozenset({_E})),
    (_R, Event.JOIN): Transition(True, _ANY_MEMBERS),
    (_R, Event.HEARTBEAT): Transition(False, _ANY_MEMBERS),  # grants and releases
    (_R, Event.LEAVE): Transition(True, _ANY),
    (_R, Event.EXPIRE): Transition(True, _ANY),
    (_R, Event.RESIZE): Transition(True, _ANY_MEMBERS),
    (_R, Event.MEMBER_COMMIT): Transition(False, frozenset({_R})),
    (_R, Event.PLAIN_COMMIT): GroupNotEmptyError,
    (_S, Event.JOIN): Transition(True, _ANY_MEMBERS),
    (_S, Event.HEARTBEAT): Transition(False, frozenset({_S})),
    (_S, Event.LEAVE): Transition(True, _ANY),
    (_S, Event.EXPIRE): Transition(True, _ANY),
    (_S, Event.RESIZE): Transition(True, _ANY_MEMBERS),
    (_S, Event.MEMBER_COMMIT): Transition(False, frozenset({_S})),
    (_S, Event.PLAIN_COMMIT): GroupNotEmptyError,
}


# values that cross the service interface -----------------------------------------------


class GroupAssignment(msgspec.Struct, frozen=True, kw_only=True):
    """A member's answer to a join or heartbeat.

    ``assignment``: ``{queue: [partitions]}`` the member may read now (it holds them);
    anything it read before and is not listed must be given up, and then acknowledged by
    heartbeating with ``generation``. ``pending``: more partitions will come once others
    release them (heartbeat soon).
    """

    member_id: str
    generation: int
    assignment: dict[str, list[int]]
    pending: bool = False


class MemberDescription(msgspec.Struct, frozen=True, kw_only=True):
    member_id: str
    client_id: str
    queues: list[str]
    state: str  # MemberState
    assignment: dict[str, list[int]]  # held: what it may read now
    pending: dict[str, list[int]] = {}  # target partitions others still hold
    revoking: dict[str, list[int]] = {}  # held partitions it must give up
    acked_generation: int = 0
    session_timeout_ms: int = 0
    heartbeat_age_ms: int = 0  # since its last join or heartbeat


class GroupDescription(msgspec.Struct, frozen=True, kw_only=True):
    group: str
    state: str  # GroupState
    mode: str | None = None  # None when the group has no members
    strategy: str | None = None
    generation: int = 0
    members: list[MemberDescription] = []
    offsets: dict[str, dict[int, int]] = {}  # committed offsets per queue


class GroupSummary(msgspec.Struct, frozen=True, kw_only=True):
    group: str
    state: str
    mode: str | None = None
    strategy: str | None = None
    generation: int = 0
    members: int = 0
    queues: list[str] = []  # subscribed, or with committed offsets


class HandedOffMember(msgspec.Struct, frozen=True, array_like=True):
    """One member of a :class:`HandedOffGroup`: who it is, what it reads, its session
    timeout, its ``target`` and the partitions it ``held`` as ``(queue, partition)`` pairs,
    and the generation it last acknowledged."""

    member_id: str
    client_id: str
    queues: list[str]
    session_timeout_ms: int
    target: list[tuple[str, int]]
    held: list[tuple[str, int]]
    acked_generation: int


class HandedOffGroup(msgspec.Struct, frozen=True, array_like=True):
    """A consumer group's membership handed from its old coordinator to its new one when the
    coordinator queue's partition moves (docs/design/cluster.md, "Moving a partition"), so
    its members go on at the new one without joining again: the mode, the strategy, the
    generation, the partition counts of its last rebalance, the members, and how long from
    now grants of its partitions were still held (after a restart: ``grants_held_ms``). Also
    the record of a group's membership in the offsets' log (``headwater.broker.offsets``,
    "Members"), written as it changes, with ``grants_held_ms`` 0, and read back at a start."""

    name: str
    mode: str
    strategy: str
    generation: int
    counts: dict[str, int]
    members: list[HandedOffMember]
    grants_held_ms: float = 0.0
