"""Keyed groups (CDAP's consumer groups that partition a queue by their own key), pure logic.

A keyed group declares a **key** — the message key (``"key"``) or a named property
(``"property:NAME"``) — and a **size** n. Member i (0 <= i < n) receives exactly the messages
whose key hashes to i: ``key_hash(key) % n`` (:mod:`headwater.model.hashing`), a message
without the key counting as the empty key (member 0). Every member reads every partition of
the queue, so this holds whatever the queue's partition count; the broker drops the other
members' messages before sending (:class:`KeyHashFilter`). Order per key follows: one key
lives in one partition (producers route by key) and is read by one member, in offset order.

Resizing is coordinated so per-key order holds across the change (pause, drain, resume)::

    STABLE(gen g, size n) --resize(m)--> RESIZING(gen g, size n, target m, barrier B)
          ^                                     |
          +------- every member of gen g ------+
                  committed up to B: gen g+1, size m, members start at B

``resize`` records a **barrier** B: every partition's end offset at that moment. Members of
generation g keep reading, but only up to B (the broker stops their fetches there), and commit.
Once each of the n members' committed position is at or past B in every partition, generation
g+1 begins with size m and all its members start from B. A key that moves from member i to
member j is therefore read by j only after i has committed everything of it before B.
Members of generation g+1 that were not in g wait (they have nothing to read yet); members in
both finish g first. A member that is not running stalls the resize: run it until it drains.

Positions are kept per (member, partition) for the current generation; a partition without
one starts at the generation's ``base`` (the barrier it began at, or what the group was
created with), and a partition absent from ``base`` (added to the queue later) at its
retained start.

The broker's :class:`~headwater.broker.keyed.KeyedGroupState` holds one group and checks
every transition before making it; this module holds the values and pure rules the broker
and the keyed consumer share. Thread-safety: pure functions and frozen values.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import msgspec

from headwater.errors import InvalidArgumentError
from headwater.model.batch import BatchHeader
from headwater.model.filtering import Columns
from headwater.model.groups import GroupSummary
from headwater.model.hashing import key_hash

__all__ = [
    "KeyedGroupInfo",
    "KeyedFetchResult",
    "KeyHashFilter",
    "parse_key_spec",
    "key_of",
    "member_of",
    "KEYED_SIZE_MAX",
    "START_FORMS",
    "check_keyed_size",
]

#: The most members a keyed group may have.
KEYED_SIZE_MAX = 10_000
_PROPERTY_RE = re.compile(r"^property:(.{1,200})$", re.S)
START_FORMS = ("earliest", "latest")


def parse_key_spec(spec: object) -> str | None:
    """``"key"`` -> None (the message key); ``"property:NAME"`` -> ``"NAME"``.

    >>> parse_key_spec("key"), parse_key_spec("property:user")
    (None, 'user')
    """
    if spec == "key":
        return None
    m = _PROPERTY_RE.match(spec) if isinstance(spec, str) else None
    if m is None:
        raise InvalidArgumentError(
            f"a keyed group's key is 'key' (the message key) or 'property:NAME' (a message property), got {spec!r}"
        )
    return m[1]


def key_of(property_name: str | None, key: bytes | None, properties: Mapping[str, str] | None) -> bytes:
    """The bytes a keyed group hashes for one message (empty when it has none)."""
    if property_name is None:
        return key or b""
    v = properties.get(property_name) if properties else None
    return v.encode() if v else b""


def member_of(key: bytes, size: int) -> int:
    """The member of a group of ``size`` that receives ``key``: ``key_hash(key) % size``.

    >>> member_of(b"user-17", 4), member_of(b"", 4)
    (2, 0)
    """
    return key_hash(key) % size if key else 0


def check_keyed_size(size: object, what: str = "size") -> int:
    if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= KEYED_SIZE_MAX:
        zero = " (a group needs at least one member)" if size == 0 else ""
        raise InvalidArgumentError(
            f"a keyed group's {what} is a whole number from 1 to {KEYED_SIZE_MAX}, got {size!r}{zero}"
        )
    return size


class KeyHashFilter:
    """The broker-side filter of member ``member`` of ``size``: see :func:`member_of`."""

    __slots__ = ("property", "size", "member")

    def __init__(self, property_name: str | None, size: int, member: int) -> None:
        assert 0 <= member < size
        self.property = property_name
        self.size = size
        self.member = member

    def batch_may_match(self, h: BatchHeader) -> bool:
        return True

    def batch_all_match(self, h: BatchHeader) -> bool:
        return self.size == 1

    def matches(self, cols: Columns, count: int) -> list[bool]:
        size, member = self.size, self.member
        if self.property is None:
            keys = cols.keys
            if keys is None:
                return [member == 0] * count
            return [(key_hash(k) % size if k else 0) == member for k in keys]
        props, name = cols.properties, self.property
        if props is None:
            return [member == 0] * count
        out = []
        for p in props:
            v = p.get(name) if p else None
            out.append((key_hash(v.encode()) % size if v else 0) == member)
        return out


class KeyedGroupInfo(msgspec.Struct, frozen=True, kw_only=True):
    """A keyed group as the broker holds it (a map on the wire).

    ``positions[member][partition]``: committed positions of the current generation.
    ``resizing_to`` and ``barrier`` are set while a resize drains.
    """

    queue: str
    group: str
    key: str
    size: int
    generation: int = 1
    base: dict[int, int] = {}
    positions: dict[int, dict[int, int]] = {}
    resizing_to: int | None = None
    barrier: dict[int, int] = {}

    def summary(self) -> GroupSummary:
        """Its line in the broker's list of groups: ``members`` is the group's size (its
        members are numbered slots, not sessions the broker tracks), the state ``resizing``
        while a resize drains, else ``stable``."""
        return GroupSummary(
            group=self.group,
            state="resizing" if self.resizing_to is not None else "stable",
            mode="keyed",
            generation=self.generation,
            members=self.size,
            queues=[self.queue],
        )

    def position(self, member: int, partition: int, start_offset: int) -> int:
        """Where ``member`` continues in ``partition`` (its commit, else the base, else the start)."""
        off = self.positions.get(member, {}).get(partition)
        if off is None:
            off = self.base.get(partition, start_offset)
        return max(off, start_offset)

    def behind(self, partition: int, start_offset: int, end_offset: int) -> int:
        """The offsets of ``partition`` its slowest member of the current generation has yet
        to read past (``end_offset`` minus that member's position; 0 when all are at the end):
        a keyed group's lag there, counted in offsets, as ``headwater group describe`` shows
        each member's (each member reads only its keys' messages in that range).

        >>> KeyedGroupInfo(queue="q", group="g", key="key", size=2, positions={0: {0: 7}}).behind(0, 0, 10)
        10
        """
        return max(max(0, end_offset - self.position(m, partition, start_offset)) for m in range(self.size))

    def draining(self, starts: Mapping[int, int]) -> list[int]:
        """Members of the current generation not yet at the barrier (while resizing).

        ``starts``: each partition's retained start offset (what expired counts as read).
        """
        if self.resizing_to is None:
            return []
        return [
            m
            for m in range(self.size)
            if any(self.position(m, p, starts.get(p, 0)) < b for p, b in self.barrier.items())
        ]

    def role(self, member: int) -> str:
        """What ``member`` does now: ``"active"`` (read), ``"draining"`` (read up to the
        barrier), ``"waiting"`` (new in a resize: wait for it) or ``"retired"`` (not in the
        group any more)."""
        if self.resizing_to is not None:
            return "draining" if member < self.size else ("waiting" if member < self.resizing_to else "retired")
        return "active" if member < self.size else "retired"


class KeyedFetchResult(msgspec.Struct, frozen=True, array_like=True):
    """A keyed member's fetch: only its messages, and where the group stands.

    ``batches``, ``next_offset``, ``start_offset`` and ``end_offset`` mean what they mean in
    :class:`~headwater.model.service.FetchResult`, except that a batch may be a **selection**
    of a stored batch's messages: ``selections[i]`` then lists the true offsets of batch
    ``i``'s messages (``[]`` for a stored batch; the whole list is empty when there is no
    selection; :func:`headwater.model.filtering.decode_selection` reads both). ``generation``
    is the group's; ``stop_offset`` the barrier of this partition while a resize drains (the
    member reads no further), else None.
    """

    batches: list[bytes]
    next_offset: int
    start_offset: int
    end_offset: int
    generation: int
    stop_offset: int | None = None
    selections: list[list[int]] = []
