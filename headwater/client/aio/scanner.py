"""AsyncScanner: the :class:`~headwater.client.sync.scanner.Scanner` for asyncio.

The same ranges, bounds and tag filters, read with ``async for``. Bounds are checked by the
sync scanner's own helpers; what needs the broker (the queue's partitions, time bounds)
is looked up when iteration starts, so ``hw.scanner(...)`` itself does not wait.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from datetime import datetime

from headwater.client.aio.service import AsyncBrokerService
from headwater.client.core.lookups import decode_stored
from headwater.client.core.reads import FETCH_BYTES_DEFAULT, Bound, bound_id, bound_offset
from headwater.client.sync.scanner import Scanner
from headwater.errors import InvalidArgumentError, QueueDisabledError
from headwater.model.batch import tags_mask
from headwater.model.checks import tag_filter_arg
from headwater.model.message import Record, to_epoch_ms

__all__ = ["AsyncScanner"]


class AsyncScanner:
    """Iterate records of a queue in a range: ``async for record in scanner``.

    Partitions are read one after the other, each in offset order. ``async with`` closes
    the scanner; one that runs to the end closes itself. It keeps no state on the broker.
    Use it from one task. Errors about the queue itself (:class:`QueueNotFoundError`,
    :class:`QueueDisabledError`, a partition out of range) are raised when iteration starts.
    """

    def __init__(
        self,
        service: AsyncBrokerService,
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
        if (
            self._start_id is not None
            and self._stop_id is not None
            and self._start_id.partition != self._stop_id.partition
        ):
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

    async def _plan(self) -> list[tuple[int, int, int]]:
        """The (partition, first offset, end offset) ranges to read, from the queue's state."""
        svc, queue = self._service, self.queue
        info = await svc.describe_queue(queue)
        if not info.enabled:
            raise QueueDisabledError(f"queue {queue!r} is disabled; enable it to read or write")
        pinned = self._start_id or self._stop_id
        parts = Scanner._choose_partitions(info, self._partitions, pinned)
        for mid in (self._start_id, self._stop_id):
            if mid is not None and mid.queue_id != info.queue_id:
                raise InvalidArgumentError(f"message id {mid} is not of queue {queue!r}")
        ranges = []
        for p in parts:
            pi = info.partitions[p]
            lo = bound_offset(self._start_id or self._start, p, pi.start_offset)
            hi = bound_offset(self._stop_id or self._stop, p, pi.end_offset)
            if self._start_ms is not None:
                lo = max(lo, await svc.offset_for_time(queue, p, self._start_ms))
            if self._end_ms is not None:
                hi = min(hi, await svc.offset_for_time(queue, p, self._end_ms))
            if lo < hi:
                ranges.append((p, lo, hi))
        return ranges

    async def _fill(self) -> None:
        """Fetch until records are buffered or every range is read."""
        if self._ranges is None:
            self._ranges = await self._plan()
        svc, queue, tags = self._service, self.queue, self._tags
        while not self._buffer and not self._closed and self._range_index < len(self._ranges):
            p, lo, hi = self._ranges[self._range_index]
            cur = lo if self._cursor is None else self._cursor
            if cur >= hi:
                self._next_range()
                continue
            res = await svc.fetch(queue, p, cur, max_bytes=self._fetch_bytes, tag_mask=self._mask, end_offset=hi)
            cur = max(cur, res.start_offset)  # records before the partition's start expired
            for b in res.batches:
                self._buffer.extend(decode_stored(b, queue, start_offset=cur, end_offset=hi, tags=tags))
            if res.next_offset <= cur and not res.batches:
                self._next_range()  # nothing more to read here
                continue
            self._cursor = max(cur, res.next_offset)

    def _next_range(self) -> None:
        self._range_index += 1
        self._cursor = None

    def __aiter__(self) -> AsyncScanner:
        return self

    async def __anext__(self) -> Record:
        if not self._buffer:
            if self._closed:
                raise StopAsyncIteration
            await self._fill()
            if not self._buffer:
                self._closed = True
                raise StopAsyncIteration
        return self._buffer.popleft()

    def close(self) -> None:
        """Stop: iteration ends (nothing on the broker to release, so this does not wait)."""
        self._closed = True
        self._buffer.clear()

    async def __aenter__(self) -> AsyncScanner:
        if self._ranges is None:
            self._ranges = await self._plan()  # report a missing queue here, not mid-loop
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()
