"""Queue and store settings, validated at the edge so the layers below can trust them."""

from __future__ import annotations

import re
from collections.abc import Iterable
from enum import Enum
from typing import Any, Protocol

import msgspec

from headwater.errors import InvalidArgumentError, InvalidQueueNameError, UnavailableError
from headwater.model.batch import BATCH_BYTES_MAX, MESSAGE_ROOM_BYTES

__all__ = [
    "DEFAULT_PORT",
    "INTERNAL_PREFIX",
    "is_internal_queue",
    "check_user_queue",
    "FlushPolicy",
    "QueueConfig",
    "QueueInfo",
    "QueuePage",
    "LIST_PAGE_PARTITIONS",
    "PartitionInfo",
    "PartitionBounds",
    "QueueIdentity",
    "validate_queue_name",
    "QUEUE_NAME_MAX",
    "PARTITIONS_MAX",
    "MESSAGE_BYTES_MAX",
    "TTL_S_MAX",
    "ALTERABLE",
    "altered_config",
]

QUEUE_NAME_MAX = 200
INTERNAL_PREFIX = "__"  # the broker's own queues (committed offsets, group state, subscribers)
#: The longest TTL a queue may have: 100 years (a longer one is None: keep forever)
TTL_S_MAX = 36_525 * 86_400
DEFAULT_PORT = 7070  # where `headwater serve` listens unless told otherwise
PARTITIONS_MAX = 100_000
#: The largest ``message_bytes_max`` a queue may have: 64 MiB less 64 KiB (67,043,328 bytes),
#: so that a body of that size, with the batch header and a key, tag and properties of up to
#: 64 KiB together, still fits in one batch (at most 64 MiB, which bounds a PRODUCE frame).
MESSAGE_BYTES_MAX = BATCH_BYTES_MAX - MESSAGE_ROOM_BYTES
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*\Z")


def is_internal_queue(name: object) -> bool:
    """Whether ``name`` is one of the broker's own queues (``__offsets``, ...), which users
    neither name nor see.

    >>> is_internal_queue("__offsets"), is_internal_queue("orders"), is_internal_queue(None)
    (True, False, False)
    """
    return isinstance(name, str) and name.startswith(INTERNAL_PREFIX)


def check_user_queue(name: str) -> str:
    """``name``, unless it is one of the broker's own queues (then InvalidArgumentError)."""
    if is_internal_queue(name):
        raise InvalidArgumentError(f"queue {name!r}: names starting with {INTERNAL_PREFIX!r} belong to the broker")
    return name


class FlushPolicy(str, Enum):
    """When an append is acknowledged.

    ``sync``: after the bytes are on disk (fdatasync); concurrent appends share one fsync.
    ``async``: after the bytes are in the operating system's page cache; a background thread
    fsyncs every ``flush_interval_ms``. A killed process loses nothing; a power loss loses at
    most the appends of the last interval.
    """

    SYNC = "sync"
    ASYNC = "async"


def validate_queue_name(name: object) -> str:
    if not isinstance(name, str):
        raise InvalidQueueNameError(f"a queue name is a string, got {type(name).__name__}")
    if not name:
        raise InvalidQueueNameError("a queue name cannot be empty")
    if len(name) > QUEUE_NAME_MAX:
        raise InvalidQueueNameError(f"queue name is {len(name)} characters long; the limit is {QUEUE_NAME_MAX}")
    if not _NAME_RE.match(name):
        raise InvalidQueueNameError(
            f"invalid queue name {name!r}: use letters, digits, '.', '_' and '-', starting with a letter or digit"
        )
    return name


class QueueConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Settings of one queue, fixed at creation (partitions can grow later).

    >>> QueueConfig(partitions=8, ttl_s=7 * 86400, flush="sync")
    QueueConfig(partitions=8, ttl_s=604800, flush='sync', message_bytes_max=1048576, settings={})
    """

    partitions: int = 1
    ttl_s: int | None = 7 * 86400
    flush: str | None = None  # None: the store's default policy
    message_bytes_max: int = 1024 * 1024
    settings: dict[str, str] = {}

    def validated(self) -> QueueConfig:
        p = self.partitions
        if isinstance(p, bool) or not isinstance(p, int) or not 1 <= p <= PARTITIONS_MAX:
            raise InvalidArgumentError(f"partitions must be a whole number from 1 to {PARTITIONS_MAX}, got {p!r}")
        t = self.ttl_s
        if t is not None and (isinstance(t, bool) or not isinstance(t, int) or not 0 < t <= TTL_S_MAX):
            raise InvalidArgumentError(
                f"ttl_s must be a whole number of seconds from 1 to {TTL_S_MAX:,} (100 years), or None "
                f"(keep forever), got {t!r}"
            )
        if self.flush is not None and self.flush not in ("sync", "async"):
            raise InvalidArgumentError(f"flush must be 'sync', 'async' or None, got {self.flush!r}")
        m = self.message_bytes_max
        if isinstance(m, bool) or not isinstance(m, int) or not 1 <= m <= MESSAGE_BYTES_MAX:
            raise InvalidArgumentError(
                f"message_bytes_max must be from 1 to {MESSAGE_BYTES_MAX} bytes (64 MiB less the "
                f"64 KiB a batch keeps for its header and a message's key, tag and properties), "
                f"got {m!r}"
            )
        if not isinstance(self.settings, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in self.settings.items()
        ):
            got = type(self.settings).__name__ if not isinstance(self.settings, dict) else "other types"
            raise InvalidArgumentError(f"settings must map strings to strings, got {got}")
        return self

    def replace(self, **changes: Any) -> QueueConfig:
        return msgspec.structs.replace(self, **changes)


#: The settings ``alter_queue`` may change after creation (partitions grow with add_partitions).
ALTERABLE = ("ttl_s", "message_bytes_max", "flush")


def altered_config(config: QueueConfig, changes: dict[str, Any]) -> QueueConfig:
    """``config`` with ``changes`` applied, checked as creation checks it.

    >>> altered_config(QueueConfig(), {"ttl_s": None}).ttl_s is None
    True
    """
    if not isinstance(changes, dict):
        raise InvalidArgumentError(f"changes must map setting names to values, got {type(changes).__name__}")
    unknown = sorted(set(changes) - set(ALTERABLE))
    if unknown:
        raise InvalidArgumentError(
            f"cannot alter {', '.join(map(repr, unknown))}: a queue's {', '.join(ALTERABLE)} can change "
            f"(its partitions grow with add_partitions)"
        )
    if not changes:
        raise InvalidArgumentError(f"nothing to alter: give at least one of {', '.join(ALTERABLE)}")
    return config.replace(**changes).validated()


class PartitionInfo(msgspec.Struct, frozen=True, omit_defaults=True):
    """Retained offsets of one partition: ``start_offset`` (first kept) to ``end_offset``
    (next to be written). ``online`` False: on a cluster, the partition's leader could not be
    asked (down, or out of reach), so its offsets are not known: the two given are another
    broker's (0 where it never led the partition), not the partition's. Encoded only when
    False."""

    partition: int
    start_offset: int
    end_offset: int
    online: bool = True


class QueueIdentity(Protocol):
    """A queue's name and id, as :class:`QueueInfo` and :class:`PartitionBounds` carry them:
    what a call that needs no partition's offsets asks for."""

    @property
    def name(self) -> str: ...

    @property
    def queue_id(self) -> int: ...


class PartitionBounds(msgspec.Struct, frozen=True, kw_only=True):
    """Some partitions of a queue (a store's ``describe_partitions``): the queue's name, id
    and partition count, and the retained offsets of the partitions asked for that exist,
    by partition: what ``describe_queue`` says of them, at the cost of those alone."""

    name: str
    queue_id: int
    partition_count: int
    partitions: dict[int, PartitionInfo]


class QueueInfo(msgspec.Struct, frozen=True, kw_only=True):
    """What ``describe`` tells about a queue."""

    name: str
    queue_id: int
    config: QueueConfig
    enabled: bool
    created_ms: int
    partitions: list[PartitionInfo] = []

    @property
    def message_count(self) -> int:
        """The messages retained (the partitions not online count none: theirs are unknown)."""
        return sum(p.end_offset - p.start_offset for p in self.partitions if p.online)

    @property
    def offline(self) -> list[int]:
        """The partitions that are not ``online`` (their leader could not be asked)."""
        return [p.partition for p in self.partitions if not p.online]

    def require_online(self, partitions: Iterable[int], doing: str) -> None:
        """:class:`~headwater.errors.UnavailableError` naming those of ``partitions`` that are
        not online, for a call (``doing``) that needs their offsets."""
        off = sorted({p for p in partitions if 0 <= p < len(self.partitions) and not self.partitions[p].online})
        if off:
            raise UnavailableError(
                f"cannot {doing}: the leader of {self.name}{off} is down or out of reach, so where "
                f"{'it begins and ends' if len(off) == 1 else 'they begin and end'} is not known; "
                f"try again once it is back (headwater cluster status shows the brokers)"
            )


class QueuePage(msgspec.Struct, frozen=True):
    """One page of a queue listing: queues in name order, and ``next_after``, the name to
    list after for the next page (None on the last). A listing pages so that its answer
    stays a small frame however many partitions a broker holds."""

    queues: list[QueueInfo]
    next_after: str | None = None


#: How many partitions one page of a queue listing describes at the most, unless the
#: caller asks for fewer; a queue bigger than that comes alone on its page.
LIST_PAGE_PARTITIONS = 20_000
