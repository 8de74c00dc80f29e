"""Scanners: read-only range reads over a queue, as HQueue's three scanners.

One scanner reads the whole queue, one partition, or a chosen set of partitions, each in
offset order, one partition after the other. Bounds are offsets, message ids or times;
tags filter on the broker (whole batches skipped by their tag mask) and again here
(message by message). A scanner keeps no state on the broker: closing it is only a
courtesy, and a scanner that runs to the end closes itself.

:class:`ScannerBase` holds both kinds' reading; :class:`~headwater.client.sync.scanner.Scanner`
iterates it with ``for``, :class:`~headwater.client.aio.scanner.AsyncScanner` with ``async for``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Generator, Iterable
from datetime import datetime
from typing import Any

from headwater.client.common.twins import Twins, waits
from headwater.client.core.lookups import stored_records
from headwater.client.core.reads import FETCH_BYTES_DEFAULT, Bound, bound_id, bound_offset, partitions_named
from headwater.errors import InvalidArgumentError, QueueDisabledError
from headwater.model.batch import tags_mask
from headwater.model.checks import tag_filter_arg
from headwater.model.message import Record, to_epoch_ms

__all__ = ["ScannerBase"]


class ScannerBase(Twins):
    """The ranges a scan reads and the reading of them; what needs the broker (the
    queue's partitions, time bounds) is looked up by :meth:`_open`. Use from one thread
    or task."""

    def __init__(
        self,
        service: Any,
        queue: str,
        *,
        partitions: int | Iterable[int] | None = None,
        start: Bound = None,
        stop: Bound = None,
        start_time: datetime | int | None = None,
        end_time: datetime | int | None = None,
        tags: str | Iterable[str] | None = None,
        fetch_bytes: int = FETCH_BYTES_DEFAULT,
    ) -> None:
        self._service = service
        self.queue = queue
        # what can be checked without the broker is checked now
        self._start_id, self._stop_id = bound_id(start, "start"), bound_id(stop, "stop")
        if self._start_id and self._stop_id and self._start_id.partition != self._stop_id.partition:
            raise InvalidArgumentError(
                f"start id {self._start_id} and stop id {self._stop_id} are in different partitions "
                f"({self._start_id.partition} and {self._stop_id.partition}); id bounds pin one partition"
            )
        self._start, self._stop = start, stop
        self._partitions = partitions
        self._tags = tag_filter_arg(tags)
        self._mask = tags_mask(self._tags) if self._tags else 0
        self._fetch_bytes = fetch_bytes
        self._start_ms = to_epoch_ms(start_time, "start_time")
        self._end_ms = to_epoch_ms(end_time, "end_time")
        self._ranges: list[tuple[int, int, int]] | None = None  # (partition, lo, hi), once planned
        self._range_index = 0
        self._cursor: int | None = None  # next offset of the current range
        self._buffer: deque[Record] = deque()
        self._closed = False

    def _plan(self) -> Generator[Any, Any, None]:
        """Find the (partition, first offset, end offset) ranges to read, once."""
        if self._ranges is not None:
            return
        svc, queue = self._service, self.queue
        info = yield svc.describe_queue(queue)
        if not info.enabled:
            raise QueueDisabledError(f"queue {queue!r} is disabled; enable it to read or write")
        pinned = self._start_id or self._stop_id
        partitions = pinned.partition if self._partitions is None and pinned is not None else self._partitions
        parts = partitions_named(info, partitions)
        if pinned is not None and parts != [pinned.partition]:
            raise InvalidArgumentError(
                f"a message id bound belongs to partition {pinned.partition}; scan that partition alone"
            )
        for mid in (self._start_id, self._stop_id):
            if mid is not None and mid.queue_id != info.queue_id:
                raise InvalidArgumentError(f"message id {mid} is not of queue {queue!r}")
        info.require_online(parts, f"scan {queue!r}")
        ranges = []
        for p in parts:
            pi = info.partitions[p]
            lo = bound_offset(self._start_id or self._start, p, pi.start_offset)
            hi = bound_offset(self._stop_id or self._stop, p, pi.end_offset)
            if self._start_ms is not None:
                lo = max(lo, (yield svc.offset_for_time(queue, p, self._start_ms)))
            if self._end_ms is not None:
                hi = min(hi, (yield svc.offset_for_time(queue, p, self._end_ms)))
            if lo < hi:
                ranges.append((p, lo, hi))
        self._ranges = ranges

    @waits
    def _open(self) -> Generator[Any, Any, None]:
        """Plan the ranges now: a missing queue is reported here, not mid-loop."""
        yield from self._plan()

    @waits
    def _fill(self) -> Generator[Any, Any, None]:
        """Fetch until records are buffered or every range is read."""
        yield from self._plan()
        assert self._ranges is not None
        svc, queue, tags = self._service, self.queue, self._tags
        while not self._buffer and not self._closed and self._range_index < len(self._ranges):
            p, lo, hi = self._ranges[self._range_index]
            cur = lo if self._cursor is None else self._cursor
            if cur >= hi:
                self._next_range()
                continue
            res = yield svc.fetch(queue, p, cur, max_bytes=self._fetch_bytes, tag_mask=self._mask, end_offset=hi)
            cur = max(cur, res.start_offset)  # records before the partition's start expired
            self._buffer.extend(stored_records(res.batches, queue, start_offset=cur, end_offset=hi, tags=tags))
            if res.next_offset <= cur and not res.batches:
                self._next_range()  # nothing more to read here
                continue
            self._cursor = max(cur, res.next_offset)

    def _next_range(self) -> None:
        self._range_index += 1
        self._cursor = None

    def _exhausted(self) -> bool:
        """After a fill: whether iteration ends here (then the scanner is closed)."""
        if not self._buffer:
            self._closed = True
        return self._closed

    def close(self) -> None:
        """Stop: iteration ends (nothing on the broker to release, so this does not wait)."""
        self._closed = True
        self._buffer.clear()
