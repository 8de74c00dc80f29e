"""Shared groups: the values that cross the service interface (no state, no I/O).

Settings of a group (:class:`SharedGroupSettings`), lease ids (:class:`LeaseId`), what a
receive returns (:class:`SharedDeliveries` of :class:`SharedLease`), what an ack, nack or
extend refuses (:class:`LeaseRefusal`), what describe tells (:class:`SharedGroupInfo`), and
the dead-letter copy of a message. The delivery state machine is
:mod:`headwater.broker.shared_state`; the guide is ``docs/shared-groups.md``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, NamedTuple

import msgspec

from headwater.errors import InvalidArgumentError
from headwater.model.checks import check_name, shown
from headwater.model.config import QUEUE_NAME_MAX
from headwater.model.message import Message, Record

__all__ = [
    "SharedGroupSettings",
    "LeaseId",
    "SharedLease",
    "SharedDeliveries",
    "LeaseRefusal",
    "SharedPartitionInfo",
    "SharedGroupInfo",
    "DeadLetter",
    "HandedOffShared",
    "dead_letter_queue_name",
    "dead_letter_message",
    "validate_group",
    "validate_member",
    "validate_receive",
    "parse_lease_ids",
    "VISIBILITY_TIMEOUT_MS_MAX",
    "RECEIVE_MESSAGES_MAX",
    "IN_FLIGHT_MAX_LIMIT",
    "REASON_CHARS_MAX",
    "DELAY_MS_MAX",
]

VISIBILITY_TIMEOUT_MS_MAX = 12 * 3_600_000  # as SQS: a lease longer than this is a stuck member
RECEIVE_MESSAGES_MAX = 10_000  # one receive
IN_FLIGHT_MAX_LIMIT = 100_000  # the largest window a group may ask for, per partition
REASON_CHARS_MAX = 1000  # a failure reason is cut to this length
DELAY_MS_MAX = 7 * 86_400_000

_MEMBER_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")


# settings and names --------------------------------------------------------------------


class SharedGroupSettings(msgspec.Struct, frozen=True, kw_only=True):
    """Settings of a shared group on a queue (the broker keeps them with the group's state).

    ``max_attempts``: deliveries before a message goes to the dead-letter queue.
    ``backoff_ms``: wait before a nacked or expired message is delivered again, multiplied
    by ``backoff_multiplier`` for every further attempt (1.0: fixed), at most
    ``backoff_max_ms``. ``in_flight_max``: the window of one partition (offsets delivered
    and not yet finished, counted from the lowest unfinished one); receivers wait when it is
    full.
    """

    max_attempts: int = 5
    backoff_ms: int = 1_000
    backoff_multiplier: float = 1.0
    backoff_max_ms: int = 600_000
    in_flight_max: int = 2_000

    @classmethod
    def from_mapping(
        cls, values: Mapping[str, Any] | None, base: SharedGroupSettings | None = None
    ) -> SharedGroupSettings:
        """Settings from ``{name: value}`` over ``base`` (defaults when None), validated.
        An unknown name is an error that lists the known ones."""
        if values is None:
            values = {}
        if not isinstance(values, Mapping):
            raise InvalidArgumentError(f"shared group settings are a mapping, got {type(values).__name__}")
        known = cls.__struct_fields__
        unknown = sorted(str(k) for k in values if k not in known)
        if unknown:
            raise InvalidArgumentError(
                f"unknown shared group setting{'s' if len(unknown) > 1 else ''} "
                f"{', '.join(repr(u) for u in unknown)}; the settings are: {', '.join(known)}"
            )
        merged = msgspec.structs.asdict(base or cls())
        merged.update(values)
        return cls(**merged).validated()

    def validated(self) -> SharedGroupSettings:
        _int_in("max_attempts", self.max_attempts, 1, 1000)
        _int_in("backoff_ms", self.backoff_ms, 0, DELAY_MS_MAX)
        _int_in("backoff_max_ms", self.backoff_max_ms, 0, DELAY_MS_MAX)
        _int_in("in_flight_max", self.in_flight_max, 1, IN_FLIGHT_MAX_LIMIT)
        m = self.backoff_multiplier
        if isinstance(m, bool) or not isinstance(m, (int, float)) or not 1.0 <= m <= 100.0:
            raise InvalidArgumentError(f"backoff_multiplier must be a number from 1.0 to 100.0, got {m!r}")
        if self.backoff_max_ms < self.backoff_ms:
            raise InvalidArgumentError(
                f"backoff_max_ms ({self.backoff_max_ms}) is below backoff_ms ({self.backoff_ms})"
            )
        return self

    def as_mapping(self) -> dict[str, Any]:
        return msgspec.structs.asdict(self)

    def backoff_for(self, attempts: int) -> int:
        """Milliseconds to wait before delivery number ``attempts + 1``."""
        if self.backoff_multiplier == 1.0 or attempts <= 1:
            return self.backoff_ms
        return int(min(self.backoff_ms * self.backoff_multiplier ** (attempts - 1), self.backoff_max_ms))


def _int_in(name: str, value: object, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise InvalidArgumentError(f"{name} must be a whole number from {lo} to {hi}, got {value!r}")
    return value


def validate_group(group: object) -> str:
    return check_name(group, "group name")


def validate_member(member: object) -> str:
    if not isinstance(member, str) or not _MEMBER_RE.match(member):
        raise InvalidArgumentError(
            f"invalid member id {shown(member)}: use 1-64 letters, digits, '.', '_' and '-', "
            f"starting with a letter or digit"
        )
    return member


def validate_receive(max_messages: object, visibility_timeout_ms: object) -> None:
    _int_in("max_messages", max_messages, 1, RECEIVE_MESSAGES_MAX)
    _int_in("visibility_timeout_ms", visibility_timeout_ms, 1, VISIBILITY_TIMEOUT_MS_MAX)


def dead_letter_queue_name(queue: str) -> str:
    """``<queue>.dlq`` (the source name is cut when the whole would be too long)."""
    return queue[: QUEUE_NAME_MAX - 4] + ".dlq"


def dead_letter_message(record: Record, group: str, attempts: int, reason: str) -> Message:
    """The copy of ``record`` for the dead-letter queue: the same body, key and tag, its
    properties plus why and after how many deliveries it failed, and where it came from."""
    props = dict(record.properties or {})
    props.update(
        {
            "dlq.reason": reason,
            "dlq.attempts": str(attempts),
            "dlq.group": group,
            "dlq.source_queue": record.queue,
            "dlq.source_id": str(record.message_id),
            "dlq.source_timestamp_ms": str(record.timestamp_ms),
        }
    )
    return Message(record.body, key=record.key, tag=record.tag, properties=props)


# leases --------------------------------------------------------------------------------


class LeaseId(NamedTuple):
    """What a lease id says: which delivery of which message, to which member.

    Printed as ``queue_id:partition:offset:attempt:member`` in hex for the numbers. The
    attempt makes every delivery's id unique, so an ack that arrives after the message was
    delivered again is recognised as stale; the member makes an ack by someone else's
    consumer recognisable as such.

    >>> str(LeaseId(7, 1, 300, 2, "m-1"))
    '7:1:12c:2:m-1'
    >>> LeaseId.parse('7:1:12c:2:m-1')
    LeaseId(queue_id=7, partition=1, offset=300, attempt=2, member='m-1')
    """

    queue_id: int
    partition: int
    offset: int
    attempt: int
    member: str

    def __str__(self) -> str:
        return f"{self.queue_id:x}:{self.partition:x}:{self.offset:x}:{self.attempt:x}:{self.member}"

    @classmethod
    def parse(cls, text: object) -> LeaseId:
        if isinstance(text, str):
            parts = text.split(":")
            if len(parts) == 5 and _MEMBER_RE.match(parts[4]):
                try:
                    nums = [int(p, 16) for p in parts[:4]]
                except ValueError:
                    nums = []
                if len(nums) == 4 and all(n >= 0 for n in nums) and all(p.isalnum() for p in parts[:4]):
                    return cls(nums[0], nums[1], nums[2], nums[3], parts[4])
        raise InvalidArgumentError(
            f"{text!r} is not a lease id: expected 'queue_id:partition:offset:attempt:member' "
            f"as received with the message"
        )


def parse_lease_ids(lease_ids: object) -> list[LeaseId]:
    if not isinstance(lease_ids, (list, tuple)) or not lease_ids:
        raise InvalidArgumentError("lease_ids is a non-empty list of lease id strings")
    return [LeaseId.parse(x) for x in lease_ids]


class SharedLease(msgspec.Struct, frozen=True, array_like=True):
    """One message handed to a member: where it is, which delivery this is, the lease id to
    ack it with (empty when delivered at most once: nothing to ack) and when the lease ends
    (ms since the epoch; 0 when delivered at most once)."""

    partition: int
    offset: int
    attempt: int
    lease_id: str
    deadline_ms: int


class SharedDeliveries(msgspec.Struct, frozen=True, array_like=True):
    """What a shared receive returns: stored batches holding the leased messages (whole, as
    stored; a batch may hold messages leased to others, which the reader skips) and the
    leases, in the order the messages should be handed to the application. ``led``: on a
    cluster, the partitions of the queue the answering broker leads now (a client whose
    table says otherwise asks for it again: a move sends it no error), else None."""

    batches: list[bytes]
    leases: list[SharedLease]
    led: list[int] | None = None


class LeaseRefusal(msgspec.Struct, frozen=True, array_like=True):
    """A lease an ack, nack or extend could not act on, why (an error code of
    :mod:`headwater.errors`, a LeaseError) and in words. The message's state is unchanged."""

    lease_id: str
    code: int
    message: str


class SharedPartitionInfo(msgspec.Struct, frozen=True, kw_only=True):
    """One partition of a shared group: the window and what is in it."""

    partition: int
    start_offset: int  # the partition's first retained offset
    end_offset: int  # the partition's next offset to be written
    committed_offset: int  # floor: every offset below is finished
    delivered_offset: int  # next: every offset below was delivered at least once
    leased: int  # messages leased now
    awaiting_retry: int  # nacked or expired, waiting to be delivered again
    acked_ahead: int  # finished above the floor (acks out of order)
    dead_lettered: int  # moved to the dead-letter queue since the group began
    members: dict[str, int] = {}  # leases per member
    next_lease_deadline_ms: int | None = None  # the soonest a lease here expires

    @property
    def lag(self) -> int:
        """Messages not yet finished: end minus the committed floor."""
        return self.end_offset - max(self.committed_offset, self.start_offset)


class SharedGroupInfo(msgspec.Struct, frozen=True, kw_only=True):
    """What ``shared_describe`` tells about a shared group on a queue."""

    group: str
    queue: str
    settings: SharedGroupSettings
    dead_letter_queue: str
    partitions: list[SharedPartitionInfo] = []

    @property
    def leased(self) -> int:
        return sum(p.leased for p in self.partitions)

    @property
    def lag(self) -> int:
        return sum(p.lag for p in self.partitions)


class DeadLetter(NamedTuple):
    """An offset whose attempts are used up: the owner copies it to the dead-letter queue."""

    partition: int
    offset: int
    attempts: int
    reason: str


class HandedOffShared(msgspec.Struct, frozen=True, array_like=True):
    """One shared group's state of a moving partition, handed from its old leader to its new
    one (docs/design/cluster.md, "Shared groups", "Moves"): the group's ``settings``, the
    window's ``floor`` and ``next``, how many were dead-lettered, and ``entries``
    ``{offset: (state, attempts, due_ms, reason)}`` (``headwater.broker.shared_state``'s
    states). The old leader hands its leases over as AVAILABLE again (due at once, their
    delivery counted in ``attempts``): their holders' acks are refused on the new leader."""

    group: str
    settings: SharedGroupSettings
    floor: int
    next: int
    dead_lettered: int
    entries: dict[int, tuple[int, int, int, str]]
