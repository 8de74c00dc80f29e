"""Push subscriptions (HQueue's subscribers), pure logic: what a subscriber is, where it starts.

A subscriber is a name registered on a queue (``headwater subscriber add QUEUE NAME``) with
the partitions it follows (all, present and future, by default), the tags it wants (all by
default) and a **checkpoint** per partition: the next offset to deliver. The broker keeps the
registry durably; a subscriber process connects under that name, the broker pushes what
follows the checkpoints, and the checkpoints advance as the process's listeners finish.

This module validates names, tags and start positions and resolves a start to offsets, for
the broker and the clients alike. Thread-safety: pure functions and frozen values.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from datetime import datetime

import msgspec

from headwater.errors import InvalidArgumentError, PartitionOutOfRangeError
from headwater.model.checks import (
    check_int_arg,
    check_name,
    check_offsets_given,
    partition_list_arg,
    partitions_of_queue,
    tag_list_arg,
)
from headwater.model.config import QueueInfo
from headwater.model.message import to_epoch_ms

__all__ = [
    "subscriber_settings",
    "SubscriberInfo",
    "validate_subscriber_name",
    "normalize_tags",
    "normalize_partitions",
    "resolve_start",
    "check_checkpoint",
    "subscribed_partitions",
    "replaced_message",
    "START_FORMS",
]

START_FORMS = "'earliest', 'latest', 'time:EPOCH_MS' or 'offset:N'"


class SubscriberInfo(msgspec.Struct, frozen=True, kw_only=True):
    """A registered subscriber (a map on the wire).

    ``partitions`` None: every partition of the queue, including ones added later (they
    start at their first offset). ``tags`` None: every message. ``checkpoints``: partition ->
    next offset to deliver. ``epoch``: on a cluster, bumped by the coordinator each time a
    process claims the subscriber (``claim_subscriber``), so the newest process's streams
    outrank the older ones' (0: never claimed).
    """

    queue: str
    name: str
    partitions: list[int] | None = None
    tags: list[str] | None = None
    created_ms: int = 0
    checkpoints: dict[int, int] = {}
    epoch: int = 0

    def checkpoint(self, partition: int, start_offset: int) -> int:
        """Where delivery continues in ``partition`` (never before the retained start)."""
        return max(self.checkpoints.get(partition, start_offset), start_offset)


def replaced_message(queue: str, name: str) -> str:
    """What a process is told when another took its subscriber over (one process per name)."""
    return (
        f"another connection subscribed as {name!r} on queue {queue!r} and took the stream over "
        f"(one process per subscriber name)"
    )


def validate_subscriber_name(name: object) -> str:
    return check_name(name, "subscriber name")


def normalize_tags(tags: str | Iterable[str] | None) -> list[str] | None:
    """A sorted tag list, or None for every message (``None``, ``"*"`` or a list with ``"*"``)."""
    if tags is None:
        return None
    out = set(tag_list_arg(tags))
    if not out:
        raise InvalidArgumentError("tags is a non-empty list, '*' or None (every message)")
    return None if "*" in out else sorted(out)


def normalize_partitions(partitions: int | Iterable[int] | None, count: int, queue: str) -> list[int] | None:
    """A sorted partition list checked against the queue's ``count``, or None for all."""
    if partitions is None:
        return None
    parts = partitions_of_queue(partitions, count, queue)
    if not parts:
        raise InvalidArgumentError("partitions is a non-empty list, or None for every partition")
    return parts


def subscribed_partitions(info: SubscriberInfo, count: int) -> list[int]:
    """The partitions delivered now, the queue having ``count`` partitions."""
    if info.partitions is None:
        return list(range(count))
    return [p for p in info.partitions if p < count]


def resolve_start(
    start: str, queue: QueueInfo, partitions: list[int], offset_for_time: Callable[[int, int], int]
) -> dict[int, int]:
    """The first checkpoint of each partition for ``start`` (see :data:`START_FORMS`).

    ``offset:N`` is clamped into each partition's retained range; ``time:MS`` is the first
    offset appended at or after that time (``offset_for_time(partition, ms)``).
    """
    if not isinstance(start, str):
        raise InvalidArgumentError(f"start is one of {START_FORMS}, got {start!r}")
    kind, _, value = start.partition(":")
    out: dict[int, int] = {}
    for p in partitions:
        pi = queue.partitions[p]
        if start == "earliest":
            out[p] = pi.start_offset
        elif start == "latest":
            out[p] = pi.end_offset
        elif kind in ("time", "offset") and value.lstrip("-").isdigit():
            n = int(value)
            if kind == "time":
                out[p] = offset_for_time(p, n)
            else:
                if n < 0:
                    raise InvalidArgumentError(f"start: an offset is >= 0, got {n}")
                out[p] = min(max(n, pi.start_offset), pi.end_offset)
        else:
            raise InvalidArgumentError(f"start is one of {START_FORMS}, got {start!r}")
    return out


def check_checkpoint(
    info: SubscriberInfo, offsets: Mapping[int, int], ranges: Mapping[int, tuple[int, int]]
) -> dict[int, int]:
    """Validate a checkpoint of ``{partition: next offset}`` against the subscriber and the
    partitions' (start, end) ``ranges``; the checkpoints after it.

    An offset before the retained start is stored as the start: retention may remove what a
    subscriber was delivered before its checkpoint arrives, and delivery resumes there anyway.
    """
    check_offsets_given(offsets)
    parts = set(subscribed_partitions(info, len(ranges)))
    for part, off in offsets.items():
        if isinstance(part, bool) or not isinstance(part, int) or part not in parts:
            raise PartitionOutOfRangeError(
                f"subscriber {info.name!r} of queue {info.queue!r} follows partitions "
                f"{sorted(parts)}; it cannot checkpoint partition {part!r}"
            )
        check_int_arg(off, "an offset")
        lo, hi = ranges[part]
        if off > hi:
            raise InvalidArgumentError(
                f"cannot checkpoint offset {off} for {info.queue}[{part}]: beyond the log end {hi}"
            )
        if off < 0:
            raise InvalidArgumentError(f"cannot checkpoint offset {off} for {info.queue}[{part}]: offsets are >= 0")
    return {**info.checkpoints, **{p: max(o, ranges[p][0]) for p, o in offsets.items()}}


def subscriber_settings(
    partitions: int | Iterable[int] | None, tags: str | Iterable[str] | None, start: str | datetime | int
) -> tuple[list[int] | None, list[str] | None, str]:
    """``add_subscriber``'s arguments as the service takes them: partitions sorted, tags a
    list, a start time as ``"time:EPOCH_MS"``."""
    if isinstance(start, (datetime, int)) and not isinstance(start, bool):
        start = f"time:{to_epoch_ms(start, 'start')}"
    return (
        None if partitions is None else partition_list_arg(partitions),
        None if tags is None else tag_list_arg(tags, empty_ok=True),
        start,  # type: ignore[return-value]  # a bool is passed on for the service to refuse by name
    )
