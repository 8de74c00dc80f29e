"""The rules of a read that both clients check before they send anything: a scan's bounds,
the partitions a read names, and the arguments of a poll. No I/O.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from headwater.errors import InvalidArgumentError
from headwater.model.checks import partitions_of_queue
from headwater.model.config import QueueInfo
from headwater.model.message import MessageId

__all__ = [
    "Bound",
    "FETCH_BYTES_DEFAULT",
    "POLL_MESSAGES_DEFAULT",
    "bound_id",
    "bound_offset",
    "check_poll",
    "check_read_settings",
    "partitions_named",
    "positive_int",
]

Bound = int | MessageId | str | Mapping[int, int] | None

FETCH_BYTES_DEFAULT = 1024 * 1024


def partitions_named(info: QueueInfo, partitions: int | Iterable[int] | None) -> list[int]:
    """The partitions of queue ``info`` that ``partitions`` names (one, several, or all when
    None), in order, each checked to exist.

    >>> from headwater.model.config import PartitionInfo, QueueConfig
    >>> info = QueueInfo(name="q", queue_id=1, config=QueueConfig(partitions=3), enabled=True, created_ms=0,
    ...                  partitions=[PartitionInfo(p, 0, 0) for p in range(3)])
    >>> partitions_named(info, None), partitions_named(info, 2), partitions_named(info, [2, 0, 2])
    ([0, 1, 2], [2], [0, 2])
    >>> partitions_named(info, [3])
    Traceback (most recent call last):
    headwater.errors.PartitionOutOfRangeError: queue 'q' has partitions 0..2; there is no partition 3
    """
    n = len(info.partitions)
    if partitions is None:
        return list(range(n))
    return partitions_of_queue(partitions, n, info.name)


#: Records one poll returns at most, unless told otherwise: 32, as EQueue's batch pull.
POLL_MESSAGES_DEFAULT = 32


def positive_int(value: object) -> bool:
    """Whether ``value`` is an int above 0 (a bool is not)."""
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def check_read_settings(*, fetch_bytes: object, max_poll_messages: object) -> None:
    """Check the read settings every consumer kind takes (plain, group, keyed), before
    anything is sent: a bad one would otherwise fail only at the first poll, as the
    protocol's encoder's complaint (over the network) or not at all (embedded)."""
    if not positive_int(fetch_bytes):
        raise InvalidArgumentError(f"fetch_bytes (the most one read returns) is an int >= 1, got {fetch_bytes!r}")
    if not positive_int(max_poll_messages):
        raise InvalidArgumentError(f"max_poll_messages must be a positive int, got {max_poll_messages!r}")


def check_poll(max_messages: object, timeout_ms: object, default_messages: int, *, call: str = "poll") -> int:
    """The records a ``poll(max_messages, timeout_ms)`` returns at most (``default_messages``
    when ``max_messages`` is None); raises InvalidArgumentError for arguments that are not
    a positive int and a finite number of milliseconds >= 0. Like Kafka's ``poll(Duration)``,
    a poll always has a bound: there is no "wait forever" (iterate the consumer for that).
    ``call``: the method's name in the errors (a shared consumer's ``receive``)."""
    if max_messages is None:
        limit = default_messages
    elif (type(max_messages) is int and max_messages > 0) or positive_int(max_messages):
        # a plain int tested inline first: every poll() checks its arguments, twice when it waits
        limit = max_messages  # type: ignore[assignment]  # None means no limit, narrowed just below
    else:
        default = "max_poll_messages" if call == "poll" else default_messages
        raise InvalidArgumentError(
            f"{call}(): max_messages is a positive int (or None: {default}), got {max_messages!r}"
        )
    if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, (int, float)) or not 0 <= timeout_ms < math.inf:
        more = "; to read without end, iterate the consumer" if call == "poll" else ""
        raise InvalidArgumentError(
            f"{call}(): timeout_ms is how long it waits for messages, in milliseconds: a number >= 0 "
            f"(0: return what has come), got {timeout_ms!r}{more}"
        )
    return limit


def bound_id(bound: Bound, what: str) -> MessageId | None:
    """The message id a scan bound names, if it names one (``what``: start or stop)."""
    if isinstance(bound, MessageId):
        return bound
    if isinstance(bound, str):
        return MessageId.parse(bound)
    return None


def bound_offset(bound: Bound, partition: int, default: int) -> int:
    """The offset a scan bound names in ``partition`` (``default`` when it names none)."""
    if bound is None:
        return default
    if isinstance(bound, MessageId):
        return bound.offset
    if isinstance(bound, str):
        return MessageId.parse(bound).offset
    if isinstance(bound, bool):
        raise InvalidArgumentError("an offset bound is an int, a message id or {partition: offset}")
    if isinstance(bound, int):
        if bound < 0:
            raise InvalidArgumentError(f"an offset cannot be negative, got {bound}")
        return bound
    if isinstance(bound, Mapping):
        v = bound.get(partition, default)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise InvalidArgumentError(f"offset for partition {partition} must be an int >= 0, got {v!r}")
        return v
    raise InvalidArgumentError(
        f"an offset bound is an int, a message id or {{partition: offset}}, got {type(bound).__name__}"
    )
