"""LogReads: fetches and lookups of a :class:`~headwater.storage.store.LogStore`. Each read
plans the byte ranges under the store's lock (from the indexes) and reads them outside it;
a read of a partition's newest batch is served from its copy in memory."""

from __future__ import annotations

from bisect import bisect_right

from headwater.errors import (
    InvalidArgumentError,
    MessageNotFoundError,
    StorageError,
)
from headwater.model.batch import crc32c
from headwater.model.checks import check_int_arg
from headwater.model.service import FetchResult
from headwater.storage.last_batches import Tail
from headwater.storage.log_state import LogStoreBase, PartitionState, QueueState
from headwater.storage.segment import LogSegment

__all__ = ["LogReads"]

# batches a fetch skips (tag filter) before it answers with what it has and where it got to:
# the walk holds the store's lock, so appends wait for it (300,000 skipped: 0.1 s)
_SKIP_BATCHES_MAX = 8192
#: The most one read of back-to-back batches takes (a run may end one batch past it).
RUN_BYTES_MAX = 8 << 20


class Run:
    """Batches that lie back to back in a segment file, read at once: where the first
    starts and each one's size."""

    __slots__ = ("start", "sizes")

    def __init__(self, start: int, sizes: list[int]) -> None:
        self.start = start
        self.sizes = sizes


class LogReads(LogStoreBase):
    """The reading part of :class:`~headwater.storage.store.LogStore`."""

    def fetch(
        self,
        queue: str,
        partition: int,
        offset: int,
        *,
        max_bytes: int = 1024 * 1024,
        tag_mask: int = 0,
        end_offset: int | None = None,
    ) -> FetchResult:
        """Whole stored batches of a partition from ``offset`` on, about ``max_bytes`` of them.

        Offsets below the retained start are read from the start; batches whose tag mask
        shares no bit with ``tag_mask`` (when non-zero) are skipped without being read.
        """
        check_int_arg(offset, "an offset")
        for _attempt in range(3):
            q = self._usable_queue(queue)
            pl = self._partition(q, partition)
            tail = self._last.get((q.entry.queue_id, partition))
            if (
                tail is not None
                and tail.base_offset <= offset < tail.end_offset
                and end_offset is None
                and (not tag_mask or tail.tag_mask & tag_mask)
            ):
                hit = self._fetch_tail(q, pl, partition, tail)
                if hit is not None:
                    return hit
            plan, nxt, start, end = self._plan_fetch(q, pl, partition, offset, max_bytes, tag_mask, end_offset)
            try:
                return FetchResult(self._read_plan(plan), nxt, start, end)
            except StorageError:
                if not any(seg.deleted for seg, _ in plan):
                    raise
                # retention removed a segment under us: plan again from the new start
        raise StorageError("retention kept removing the segments being read; try again")

    def _fetch_tail(self, q: QueueState, pl: PartitionState, partition: int, tail: Tail) -> FetchResult | None:
        """The fetch of an offset inside the partition's last batch, from its copy in memory;
        None when that batch is no longer the last or no longer readable (read the file)."""
        with self._lock:
            self._check_open()
            if self._last.get((q.entry.queue_id, partition)) is not tail or pl.end_offset != tail.end_offset:
                return None
            start = self._effective_start(q, partition, self._now_ms())
            if start > tail.base_offset:  # truncated or expired: the plan skips what is gone
                return None
            return FetchResult([tail.data], tail.end_offset, start, tail.end_offset)

    def _plan_fetch(
        self,
        q: QueueState,
        pl: PartitionState,
        partition: int,
        offset: int,
        max_bytes: int,
        tag_mask: int,
        end_offset: int | None,
    ) -> tuple[list[tuple[LogSegment, list[Run]]], int, int, int]:
        """What to read for a fetch: each segment's runs of back-to-back batches, the next
        offset, and the partition's retained start and end."""
        key = (q.entry.queue_id, partition)
        plan: list[tuple[LogSegment, list[Run]]] = []
        with self._lock:
            self._check_open()
            start = self._effective_start(q, partition, self._now_ms())
            end = pl.end_offset
            stop = end if end_offset is None else min(end_offset, end)
            cur = max(offset, start)
            total = skipped = 0
            spans = pl.spans
            si = bisect_right(spans, cur, key=lambda s: s.end_offset)
            while si < len(spans) and cur < stop and total < max_bytes and skipped < _SKIP_BATCHES_MAX:
                sp = spans[si]
                pe = self._index(sp.segment_base).partitions[key]
                i = pe.index_of_offset(cur)
                runs: list[Run] = []
                run_end = -1  # where the last run ends: a batch starting there joins it
                n = len(pe)
                # the index's columns, read in place: this loop runs once per batch fetched
                offsets, counts, positions, sizes, masks = pe.offsets, pe.counts, pe.positions, pe.sizes, pe.tag_masks
                while i < n and total < max_bytes and skipped < _SKIP_BATCHES_MAX:
                    bo = offsets[i]
                    if bo >= stop:
                        # Nothing lies in [cur, stop): a gap left by a cut sealed segment.
                        # Without moving cur to stop this loop spun forever on the same batch
                        # (a lookup or a bounded scan of an offset inside the gap hung).
                        cur = stop
                        break
                    end_of_batch = bo + counts[i]
                    if end_of_batch > cur:
                        cur = end_of_batch
                    if tag_mask and not masks[i] & tag_mask:
                        i += 1
                        skipped += 1  # the reader asks again from cur
                        continue
                    pos, size = positions[i], sizes[i]
                    if pos == run_end and run_end - runs[-1].start < RUN_BYTES_MAX:
                        runs[-1].sizes.append(size)  # back to back with the batch before: one read
                    else:
                        runs.append(Run(pos, [size]))
                    run_end = pos + size
                    total += size
                    i += 1
                if runs:
                    seg = self._segments[sp.segment_base]
                    self._touch_segment(seg)
                    plan.append((seg, runs))
                if i >= n:
                    si += 1
        return plan, cur, start, end

    @staticmethod
    def _read_plan(plan: list[tuple[LogSegment, list[Run]]]) -> list[bytes]:
        """The batches of ``plan``: one read a run, each batch a view of it, not a copy."""
        out: list[bytes] = []
        add = out.append
        for seg, runs in plan:
            with seg.reading():
                for run in runs:
                    sizes = run.sizes
                    data = seg.read(run.start, sum(sizes))
                    if len(sizes) == 1:
                        add(data)
                        continue
                    mv = memoryview(data)
                    at = 0
                    for size in sizes:
                        add(mv[at : at + size])  # type: ignore[arg-type]  # encoded as bytes
                        at += size
        return out

    def end_offset(self, queue: str, partition: int) -> int:
        """The next offset the partition will assign (cheap: no lock, no I/O)."""
        return self._partition(self._queue(queue), partition).end_offset

    def offset_for_time(self, queue: str, partition: int, timestamp_ms: int) -> int:
        """The first offset appended at or after ``timestamp_ms`` (the end offset if none)."""
        q = self._usable_queue(queue)
        self._partition(q, partition)  # raises for a partition out of range
        with self._lock:
            self._check_open()
            now = self._now_ms()
            return max(
                self._time_position_locked(q, partition, timestamp_ms)[0], self._effective_start(q, partition, now)
            )

    def lookup_id(self, queue_id: int, partition: int, offset: int) -> tuple[str, bytes]:
        """(queue name, the stored batch holding the message) for a message id."""
        q = self._by_id.get(queue_id)
        if q is None:
            raise MessageNotFoundError(f"no queue has id {queue_id} (was it deleted?)")
        name = q.entry.name
        q = self._usable_queue(name)
        pl = self._partition(q, partition)
        with self._lock:
            start = self._effective_start(q, partition, self._now_ms())
            if not start <= offset < pl.end_offset:
                raise MessageNotFoundError(
                    f"offset {offset} of {name}[{partition}] is not retained (retained: {start}..{pl.end_offset - 1})"
                    if start < pl.end_offset
                    else f"offset {offset} of {name}[{partition}] is not retained (the partition is empty)"
                )
            plan, _, _, _ = self._plan_fetch(q, pl, partition, offset, 1, 0, offset + 1)
        try:
            batches = self._read_plan(plan)
        except StorageError:
            if not any(seg.deleted for seg, _ in plan):
                raise
            raise MessageNotFoundError(
                f"offset {offset} of {name}[{partition}] is no longer retained (retention removed it as it was read)"
            ) from None
        if not batches:
            raise MessageNotFoundError(f"offset {offset} of {name}[{partition}] is in a gap left by damage")
        return name, bytes(batches[0])

    def lookup_key(
        self, queue: str, key: bytes, start_ms: int | None = None, end_ms: int | None = None, limit: int = 1000
    ) -> list[bytes]:
        """Stored batches that may hold messages with ``key`` appended in [start_ms, end_ms).

        Found through key hashes: the caller keeps the messages whose key is exactly ``key``.
        """
        if not isinstance(key, bytes):
            raise InvalidArgumentError(f"a key is bytes, got {type(key).__name__}")
        for _attempt in range(3):
            plan = self._plan_lookup_key(queue, key, start_ms, end_ms, limit)
            try:
                return [bytes(b) for b in self._read_plan(plan)]
            except StorageError:
                if not any(seg.deleted for seg, _ in plan):
                    raise
                # retention removed a segment under us: what it held is gone, look again
        raise StorageError("retention kept removing the segments being read; try again")

    def _plan_lookup_key(
        self, queue: str, key: bytes, start_ms: int | None, end_ms: int | None, limit: int
    ) -> list[tuple[LogSegment, list[Run]]]:
        q = self._usable_queue(queue)
        qid = q.entry.queue_id
        h = crc32c(key)
        lo = start_ms if start_ms is not None else -(2**62)
        hi = end_ms if end_ms is not None else 2**62
        plan: list[tuple[LogSegment, list[Run]]] = []
        with self._lock:
            self._check_open()
            now = self._now_ms()
            starts = [self._effective_start(q, i, now) for i in range(len(q.partitions))]
            found = 0
            for base in list(self._bases):
                idx = self._index(base)
                if idx.max_ts < lo or idx.min_ts >= hi:
                    continue
                ranges: list[tuple[int, int]] = []
                seen: set[int] = set()
                for kq, kp, off in idx.find_key(h):
                    if kq != qid or kp >= len(starts) or off < starts[kp]:
                        continue
                    pe = idx.partitions[(kq, kp)]
                    i = pe.index_of_offset(off)
                    bo, cnt, pos, size, ts, _m = pe.entry(i)
                    if pos in seen or not lo <= ts < hi:
                        continue
                    seen.add(pos)
                    ranges.append((pos, size))
                if ranges:
                    ranges.sort()
                    seg = self._segments[base]
                    self._touch_segment(seg)
                    plan.append((seg, [Run(pos, [size]) for pos, size in ranges[: limit - found]]))
                    found += len(ranges)
                    if found >= limit:
                        break
        return plan
