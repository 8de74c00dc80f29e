"""Scanner: read-only range reads over a queue, as HQueue's three scanners.

One scanner reads the whole queue, one partition, or a chosen set of partitions, each in
offset order, one partition after the other. Bounds are offsets, message ids or times;
tags filter on the broker (whole batches skipped by their tag mask) and again here
(message by message). A scanner keeps no state on the broker: closing it is only a
courtesy, and a scanner that runs to the end closes itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from datetime import datetime

from headwater.client.core.lookups import decode_stored
from headwater.client.core.reads import FETCH_BYTES_DEFAULT, Bound, bound_id, bound_offset, partitions_named
from headwater.errors import InvalidArgumentError, QueueDisabledError
from headwater.model.batch import tags_mask
from headwater.model.checks import tag_filter_arg
from headwater.model.config import QueueInfo
from headwater.model.message import MessageId, Record, to_epoch_ms
from headwater.model.service import BrokerService

__all__ = ["Scanner"]


class Scanner(Iterator[Record]):
    """Iterate records of a queue in a range. Use as an iterator and a context manager."""

    def __init__(
        self,
        service: BrokerService,
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
        info = service.describe_queue(queue)
        if not info.enabled:
            raise QueueDisabledError(f"queue {queue!r} is disabled; enable it to read or write")
        self._info = info
        start_id, stop_id = bound_id(start, "start"), bound_id(stop, "stop")
        if start_id is not None and stop_id is not None and start_id.partition != stop_id.partition:
            raise InvalidArgumentError(
                f"start id {start_id} and stop id {stop_id} are in different partitions "
                f"({start_id.partition} and {stop_id.partition}); id bounds pin one partition"
            )
        parts = self._choose_partitions(info, partitions, start_id or stop_id)
        for mid in (start_id, stop_id):
            if mid is not None and mid.queue_id != info.queue_id:
                raise InvalidArgumentError(f"message id {mid} is not of queue {queue!r}")
        self._tags = tag_filter_arg(tags)
        self._mask = tags_mask(self._tags) if self._tags else 0
        self._fetch_bytes = fetch_bytes
        start_ms = to_epoch_ms(start_time, "start_time")
        end_ms = to_epoch_ms(end_time, "end_time")
        self._ranges: list[tuple[int, int, int]] = []
        for p in parts:
            pi = info.partitions[p]
            lo = bound_offset(start_id or start, p, pi.start_offset)
            hi = bound_offset(stop_id or stop, p, pi.end_offset)
            if start_ms is not None:
                lo = max(lo, service.offset_for_time(queue, p, start_ms))
            if end_ms is not None:
                hi = min(hi, service.offset_for_time(queue, p, end_ms))
            if lo < hi:
                self._ranges.append((p, lo, hi))
        self._gen: Iterator[Record] | None = self._run()

    @staticmethod
    def _choose_partitions(
        info: QueueInfo, partitions: int | Iterable[int] | None, pinned: MessageId | None
    ) -> list[int]:
        if partitions is None and pinned is not None:
            partitions = pinned.partition
        parts = partitions_named(info, partitions)
        if pinned is not None and parts != [pinned.partition]:
            raise InvalidArgumentError(
                f"a message id bound belongs to partition {pinned.partition}; scan that partition alone"
            )
        return parts

    def _run(self) -> Iterator[Record]:
        svc, queue, tags, mask = self._service, self.queue, self._tags, self._mask
        for p, lo, hi in self._ranges:
            cur = lo
            while cur < hi:
                res = svc.fetch(queue, p, cur, max_bytes=self._fetch_bytes, tag_mask=mask, end_offset=hi)
                cur = max(cur, res.start_offset)
                for b in res.batches:
                    recs = decode_stored(b, queue, start_offset=cur, end_offset=hi, tags=tags)
                    if recs:
                        yield from recs
                if res.next_offset <= cur and not res.batches:
                    break  # nothing more to read
                cur = max(cur, res.next_offset)

    def __next__(self) -> Record:
        if self._gen is None:
            raise StopIteration
        try:
            return next(self._gen)
        except StopIteration:
            self._gen = None
            raise

    def __iter__(self) -> Scanner:
        return self

    def close(self) -> None:
        if self._gen is not None:
            self._gen.close()  # type: ignore[attr-defined]  # a generator, typed as the iterator it is
            self._gen = None

    def __enter__(self) -> Scanner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
