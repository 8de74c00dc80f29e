"""Planning reads: offset ranges per partition, how to split them, how much a trigger takes.

Pure functions over a :class:`~headwater.model.QueueInfo` (and, for time bounds, a function
that maps a time to an offset), so the rules are tested without Spark or a broker:

- :func:`batch_ranges`: the ``[start, end)`` of every partition a batch read covers;
- :func:`split_ranges`: cut large ranges so there are at least ``minPartitions`` pieces
  (Kafka's ``KafkaOffsetRangeCalculator``: pieces in proportion to the range sizes);
- :func:`rate_limit`: end offsets for one micro-batch that take at most ``max_offsets``
  in total, shared in proportion to each partition's backlog;
- :class:`StreamOffset`: the offset a streaming query keeps in its checkpoint.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from headwater.errors import (
    InvalidArgumentError,
    MessageNotFoundError,
    PartitionOutOfRangeError,
)
from headwater.model.config import QueueInfo
from headwater.spark.options import EARLIEST, LATEST, OffsetSpec, ReadOptions

__all__ = [
    "OffsetRange",
    "StreamOffset",
    "batch_ranges",
    "check_named_partitions",
    "choose_partitions",
    "data_loss_message",
    "lost_tail_message",
    "rate_limit",
    "split_ranges",
    "start_offsets",
]


@dataclass(frozen=True)
class OffsetRange:
    partition: int
    start: int  # inclusive
    end: int  # exclusive

    @property
    def size(self) -> int:
        return self.end - self.start


def choose_partitions(info: QueueInfo, wanted: Sequence[int] | None) -> list[int]:
    n = len(info.partitions)
    if wanted is None:
        return list(range(n))
    missing = [p for p in wanted if p >= n]
    if missing:
        raise PartitionOutOfRangeError(
            f"option 'partitions' names {', '.join(map(str, missing))}, but queue {info.name!r} "
            f"has partitions 0..{n - 1}"
        )
    return list(wanted)


def check_named_partitions(spec: OffsetSpec, name: str, info: QueueInfo) -> None:
    """Offsets JSON naming a partition the queue does not have is a mistake (a wrong queue,
    a typo): refuse it rather than read other ranges than the user wrote. (A partition that
    option 'partitions' leaves out is not read, whatever its offset.)"""
    if spec.kind != "offsets":
        return
    n = len(info.partitions)
    beyond = sorted(p for p in spec.offsets if p >= n)
    if beyond:
        raise PartitionOutOfRangeError(
            f"option {name!r} names partition{'s' if len(beyond) > 1 else ''} "
            f"{', '.join(map(str, beyond))}, but queue {info.name!r} has partitions 0..{n - 1}; "
            f"give offsets only for partitions that exist"
        )


def data_loss_message(
    queue: str, partition: int, lost_from: int, lost_to: int, retained: tuple[int, int] | None = None
) -> str:
    held = ""
    if retained is not None:
        held = (
            f" (the partition now holds {retained[0]}..{retained[1]})"
            if retained[0] <= retained[1]
            else f" (the partition is empty; its next offset is {retained[0]})"
        )
    return (
        f"offsets {lost_from}..{lost_to - 1} of partition {partition} of queue {queue!r} are no "
        f"longer retained{held}: the queue's TTL or a truncate removed them before they were "
        f"read. Set option failOnDataLoss=false to skip what is gone and go on, or start "
        f"from offsets that exist (startingOffsets='earliest')"
    )


def lost_tail_message(queue: str, partition: int, position: int, end: int) -> str:
    """A partition that ends before offsets a read was planned for, or read, from it: the
    broker lost acknowledged messages, and new ones take those offsets again."""
    return (
        f"partition {partition} of queue {queue!r} ends at offset {end}, but offsets up to "
        f"{position - 1} were there when this read was planned or read: the broker lost "
        f"messages it had acknowledged (a power loss under the async flush policy, a data "
        f"directory restored from an older copy or made anew), and messages appended from "
        f"now on take those offsets again, so reading on from {position} would skip them. "
        f"Set option failOnDataLoss=false to read on from offset {end}, or start the query "
        f"with a new checkpointLocation"
    )


def _resolve(spec_value: int, lo: int, hi: int) -> int:
    if spec_value == EARLIEST:
        return lo
    if spec_value == LATEST:
        return hi
    return spec_value


def start_offsets(
    opts: ReadOptions, info: QueueInfo, offset_for_time: Callable[[int, int], int], partitions: Sequence[int]
) -> dict[int, int]:
    """Where reading starts in each partition, from startingOffsets and startingTimestamp.

    An explicit offset before the retained range is data loss (an error unless
    failOnDataLoss=false, then the earliest retained offset); one past the end is an error.
    A partition whose leader is out of reach (not ``online``: its offsets unknown) starts at
    the offset given, or 0 for earliest, and is read once its leader is back; latest, or a
    starting timestamp, needs its leader now.
    """
    check_named_partitions(opts.starting, "startingOffsets", info)
    out: dict[int, int] = {}
    for p in partitions:
        pi = info.partitions[p]
        spec = opts.starting.for_partition(p)
        if not pi.online and spec != LATEST and opts.starting_timestamp_ms is None:
            out[p] = 0 if spec == EARLIEST else spec
            continue
        info.require_online([p], f"find where reading {info.name!r} starts")
        start = _resolve(opts.starting.for_partition(p), pi.start_offset, pi.end_offset)
        if start < pi.start_offset:
            if opts.fail_on_data_loss:
                raise MessageNotFoundError(
                    "startingOffsets: "
                    + data_loss_message(info.name, p, start, pi.start_offset, (pi.start_offset, pi.end_offset - 1))
                )
            start = pi.start_offset
        if start > pi.end_offset:
            raise InvalidArgumentError(
                f"startingOffsets: offset {start} of partition {p} of queue {info.name!r} is past "
                f"its end (the next offset to be written is {pi.end_offset})"
            )
        if opts.starting_timestamp_ms is not None:
            start = max(start, offset_for_time(p, opts.starting_timestamp_ms))
        out[p] = start
    return out


def batch_ranges(opts: ReadOptions, info: QueueInfo, offset_for_time: Callable[[int, int], int]) -> list[OffsetRange]:
    """The range of each partition a batch read covers; empty ranges are left out.

    Offsets and times both bound the range: it starts at the later of startingOffsets and
    startingTimestamp and ends at the earlier of endingOffsets and endingTimestamp.
    """
    parts = choose_partitions(info, opts.partitions)
    check_named_partitions(opts.ending, "endingOffsets", info)
    info.require_online(parts, f"plan a batch read of {info.name!r}")  # else it would read nothing there
    starts = start_offsets(opts, info, offset_for_time, parts)
    ranges = []
    for p in parts:
        pi = info.partitions[p]
        end = _resolve(opts.ending.for_partition(p), pi.start_offset, pi.end_offset)
        if end > pi.end_offset:
            raise InvalidArgumentError(
                f"endingOffsets: offset {end} of partition {p} of queue {info.name!r} is past its "
                f"end (the next offset to be written is {pi.end_offset}); use -1 or 'latest' for "
                f"the end"
            )
        # against the start asked for: one moved later by startingTimestamp or past offsets
        # gone (failOnDataLoss=false) makes the range empty, not the options wrong
        given = _resolve(opts.starting.for_partition(p), pi.start_offset, pi.end_offset)
        if opts.ending.kind == "offsets" and p in opts.ending.offsets and end < given:
            raise InvalidArgumentError(f"endingOffsets: offset {end} of partition {p} is before its start {given}")
        if opts.ending_timestamp_ms is not None:
            end = min(end, offset_for_time(p, opts.ending_timestamp_ms))
        if end > starts[p]:
            ranges.append(OffsetRange(p, starts[p], end))
    return ranges


def split_ranges(ranges: Sequence[OffsetRange], min_partitions: int | None) -> list[OffsetRange]:
    """At least ``min_partitions`` pieces when there are enough offsets: each range is cut
    into pieces in proportion to its share of all offsets (a range never splits below one
    offset per piece). Without ``min_partitions``, one piece per queue partition.

    >>> [(r.partition, r.start, r.end) for r in split_ranges([OffsetRange(0, 0, 90), OffsetRange(1, 0, 10)], 4)]
    [(0, 0, 22), (0, 22, 45), (0, 45, 67), (0, 67, 90), (1, 0, 10)]
    """
    total = sum(r.size for r in ranges)
    if not min_partitions or min_partitions <= len(ranges) or total == 0:
        return list(ranges)
    out: list[OffsetRange] = []
    for r in ranges:
        pieces = min(r.size, max(1, math.ceil(r.size / total * min_partitions)))
        for i in range(pieces):
            lo = r.start + r.size * i // pieces
            hi = r.start + r.size * (i + 1) // pieces
            out.append(OffsetRange(r.partition, lo, hi))
    return out


def rate_limit(starts: Mapping[int, int], ends: Mapping[int, int], max_offsets: int) -> dict[int, int]:
    """End offsets that advance at most ``max_offsets`` in total, shared in proportion to each
    partition's backlog (largest remainders first, ties to the lower partition).

    >>> rate_limit({0: 0, 1: 100}, {0: 300, 1: 200}, 40)   # backlogs 300 and 100
    {0: 30, 1: 110}
    """
    backlog = {p: max(0, ends[p] - starts[p]) for p in ends}
    total = sum(backlog.values())
    if total <= max_offsets:
        return dict(ends)
    share = {p: backlog[p] * max_offsets // total for p in backlog}
    left = max_offsets - sum(share.values())
    by_remainder = sorted(backlog, key=lambda p: (-(backlog[p] * max_offsets % total), p))
    for p in by_remainder:
        if left == 0:
            break
        if share[p] < backlog[p]:
            share[p] += 1
            left -= 1
    return {p: starts[p] + share[p] for p in ends}


@dataclass(frozen=True)
class StreamOffset:
    """A streaming query's position: the next offset to read in every partition it follows.

    Stored in the checkpoint as JSON, e.g.
    ``{"queue": "events", "queue_id": 3, "offsets": {"0": 120, "1": 98}}``. The queue id
    catches a queue deleted and created again under the same name: its offsets mean
    nothing to the new queue. Keys are written in partition order, so equal positions have
    equal JSON (which is how Spark tells "no new data").
    """

    queue: str
    queue_id: int
    offsets: Mapping[int, int]

    def to_json(self) -> dict:
        return {
            "queue": self.queue,
            "queue_id": self.queue_id,
            "offsets": {str(p): self.offsets[p] for p in sorted(self.offsets)},
        }

    @classmethod
    def from_json(cls, doc: Mapping | str) -> StreamOffset:
        if isinstance(doc, str):
            doc = json.loads(doc)
        try:
            return cls(str(doc["queue"]), int(doc["queue_id"]), {int(p): int(o) for p, o in doc["offsets"].items()})
        except (KeyError, TypeError, ValueError, AttributeError):
            raise InvalidArgumentError(
                f"the checkpoint holds an offset this connector did not write: {doc!r}; use a new "
                f"checkpointLocation for this query"
            ) from None

    def check_queue(self, info: QueueInfo) -> None:
        if self.queue != info.name:
            raise InvalidArgumentError(
                f"the checkpoint's offsets are of queue {self.queue!r}, but the query reads queue "
                f"{info.name!r}; a checkpoint belongs to one query: use a new checkpointLocation"
            )
        if self.queue_id != info.queue_id:
            raise InvalidArgumentError(
                f"queue {info.name!r} was deleted and created again since this query's checkpoint "
                f"was written (queue id {self.queue_id}, now {info.queue_id}); its offsets do not "
                f"apply to the new queue: start the query with a new checkpointLocation"
            )
