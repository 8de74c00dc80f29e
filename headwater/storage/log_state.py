"""LogStoreBase: the state every part of :class:`~headwater.storage.store.LogStore` shares.

The store is one class cut into files by what its methods do: this base (the partition
tables, the catalog, the small helpers they all use), admin (:mod:`.store_admin`), reading
and lookups (:mod:`.store_reads`), retention (:mod:`.retention`), and the store itself
(:mod:`.store`: opening, appending, flushing, closing). Thread-safety and the directory
layout are described in :mod:`headwater.storage.store`.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from bisect import bisect_left, bisect_right
from collections import OrderedDict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import NamedTuple

from headwater.errors import (
    ClosedError,
    PartitionOutOfRangeError,
    QueueDisabledError,
    QueueNotFoundError,
    ReadOnlyStoreError,
    StorageError,
)
from headwater.model.checks import check_int_arg, check_queue_arg
from headwater.model.config import (
    PartitionBounds,
    PartitionInfo,
    QueueInfo,
)
from headwater.storage.catalog import CATALOG_FILE, Catalog, QueueEntry
from headwater.storage.flusher import GroupCommit
from headwater.storage.last_batches import LastBatches
from headwater.storage.loader import FSYNC_FAILED_FILE
from headwater.storage.segment import LogSegment, segment_name
from headwater.storage.segment_index import SegmentIndex
from headwater.storage.settings import StoreConfig

__all__ = ["LogStoreBase", "QueueState", "PartitionState", "Span", "Expiry"]

log = logging.getLogger("headwater.storage")

_TS_MAX = 2**63 - 1  # later than any timestamp


class Span:
    """A partition's batches inside one segment."""

    __slots__ = ("segment_base", "first_offset", "end_offset", "first_ts", "last_ts")

    def __init__(self, segment_base: int, first_offset: int, end_offset: int, first_ts: int, last_ts: int):
        self.segment_base = segment_base
        self.first_offset = first_offset
        self.end_offset = end_offset
        self.first_ts = first_ts
        self.last_ts = last_ts


class Expiry(NamedTuple):
    """A partition's first unexpired offset, remembered: it stays ``offset`` for every TTL
    cut-off in [``since``, ``until``] while the partition's start offset is ``start`` and,
    when everything had expired (``offset == end``), its end offset is still ``end``.
    Timestamps never decrease along a partition, so a later cut-off moves the answer only
    once it passes the timestamp of the batch the answer lies in."""

    since: int
    until: int
    start: int
    end: int
    offset: int


class PartitionState:
    __slots__ = ("start_offset", "end_offset", "spans", "expiry")

    def __init__(self, start_offset: int) -> None:
        self.start_offset = start_offset
        self.end_offset = start_offset
        self.spans: list[Span] = []
        self.expiry: Expiry | None = None


class QueueState:
    __slots__ = ("entry", "partitions")

    def __init__(self, entry: QueueEntry) -> None:
        self.entry = entry
        self.partitions = [PartitionState(s) for s in entry.start_offsets]


def read_only_refusal(path: Path) -> ReadOnlyStoreError:
    return ReadOnlyStoreError(
        f"the store at {path} was opened read-only: it serves reads, never writes; open it without read_only to write"
    )


class LogStoreBase:
    """The fields and helpers the parts of :class:`~headwater.storage.store.LogStore` share;
    :meth:`LogStore.__init__ <headwater.storage.store.LogStore>` sets every field."""

    path: Path
    config: StoreConfig
    recovery_report: list[str]
    read_only: bool
    _clock: Callable[[], float]
    _lock: threading.RLock
    _closed: bool
    _files_closed: bool
    _last: LastBatches
    _catalog: Catalog
    _log_dir: Path
    _store_id: bytes
    _queues: dict[str, QueueState]
    _by_id: dict[int, QueueState]
    _segments: dict[int, LogSegment]
    _index_cache: OrderedDict[int, SegmentIndex]
    _open_lru: OrderedDict[int, LogSegment]
    _last_ts: int
    _summaries: dict[int, list[tuple[tuple[int, int], int, int]]]
    _active: LogSegment
    _active_index: SegmentIndex
    _bases: list[int]
    _commit: GroupCommit

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    # -- small helpers ----------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError(f"the store at {self.path} is closed")

    def _check_writable(self) -> None:
        """Under the lock, before an append: nothing is appended to a store opened
        read-only, nor after a failed fsync."""
        if self.read_only:
            raise read_only_refusal(self.path)
        if self._commit.failed is not None:
            raise self._commit.refusal()

    def _mark_fsync_failed(self, error: StorageError) -> None:
        """Leave a note for the next open (the page cache keeps it even if the disk does not):
        the log's tail may hold pages that look written but never reached the disk, so that
        open reads the tail from the disk (:func:`~headwater.storage.loader.load_segments`)."""
        try:
            (self._log_dir / FSYNC_FAILED_FILE).write_text(f"{error}\n")
        except OSError as e:
            log.error("cannot leave the note %s: %s", FSYNC_FAILED_FILE, e)

    def _queue(self, name: str) -> QueueState:
        q = self._queues.get(name)
        if q is None:
            check_queue_arg(name)
            raise QueueNotFoundError(f"queue {name!r} does not exist; create it first")
        return q

    def _usable_queue(self, name: str) -> QueueState:
        q = self._queue(name)
        if not q.entry.enabled:
            raise QueueDisabledError(f"queue {name!r} is disabled; enable it to read or write")
        return q

    @staticmethod
    def _partition(q: QueueState, partition: int) -> PartitionState:
        check_int_arg(partition, "a partition")
        if not 0 <= partition < len(q.partitions):
            raise PartitionOutOfRangeError(
                f"queue {q.entry.name!r} has partitions 0..{len(q.partitions) - 1}; there is no partition {partition}"
            )
        return q.partitions[partition]

    def _index(self, base: int) -> SegmentIndex:
        if base == self._active.base_position:
            return self._active_index
        idx = self._index_cache.get(base)
        if idx is None:
            idx = SegmentIndex.read(self._log_dir / segment_name(base, ".idx"))
            self._cache_index(idx)
        else:
            self._index_cache.move_to_end(base)
        return idx

    def _cache_index(self, idx: SegmentIndex) -> None:
        self._index_cache[idx.segment_base] = idx
        while len(self._index_cache) > self.config.index_cache_segments:
            self._index_cache.popitem(last=False)

    def _touch_segment(self, seg: LogSegment) -> None:
        if seg is self._active:
            return
        self._open_lru[seg.base_position] = seg
        self._open_lru.move_to_end(seg.base_position)
        while len(self._open_lru) > self.config.open_segments_max:
            for base, old in list(self._open_lru.items()):
                if old.close_if_idle():
                    del self._open_lru[base]
                    break
            else:
                break  # every open one is being read; let them finish

    def _ttl_cutoff(self, q: QueueState, now_ms: int) -> int | None:
        ttl = q.entry.config.ttl_s
        return None if ttl is None else now_ms - ttl * 1000

    def _effective_start(self, q: QueueState, part: int, now_ms: int) -> int:
        """First offset a reader may see: past truncation, retention and TTL expiry.

        Every fetch asks this (a fetch stream's push too), so under a TTL the answer is
        remembered (:class:`Expiry`) rather than searched for each time."""
        pl = q.partitions[part]
        cutoff = self._ttl_cutoff(q, now_ms)
        if cutoff is None:
            return pl.start_offset
        e = pl.expiry
        if (
            e is not None
            and e.since <= cutoff <= e.until
            and e.start == pl.start_offset
            and (e.offset < e.end or e.end == pl.end_offset)
        ):
            return e.offset
        offset, batch_ts = self._time_position_locked(q, part, cutoff)
        pl.expiry = Expiry(cutoff, _TS_MAX if batch_ts is None else batch_ts, pl.start_offset, pl.end_offset, offset)
        return offset

    def _time_position_locked(self, q: QueueState, part: int, ts: int) -> tuple[int, int | None]:
        """(the first offset appended at or after ``ts`` and retained, the timestamp of its
        batch); (the end offset, None) when there is none."""
        pl = q.partitions[part]
        spans = pl.spans
        start = pl.start_offset
        # Only what is retained is searched: append times never decrease from the start
        # offset on, but a partition reset for a copy (reset_partition) may keep older
        # batches below it, appended later than the copies by another broker's clock.
        live = bisect_right(spans, start, key=lambda s: s.end_offset)
        i = bisect_left(spans, ts, lo=live, key=lambda s: s.last_ts)
        while i < len(spans):
            sp = spans[i]
            pe = self._index(sp.segment_base).partitions[(q.entry.queue_id, part)]
            j = bisect_left(pe.timestamps, ts, lo=pe.index_of_offset(start))
            if j < len(pe):
                return max(pe.offsets[j], start), pe.timestamps[j]
            i += 1
        return pl.end_offset, None

    def _save_catalog(self) -> None:
        if self.read_only:
            raise read_only_refusal(self.path)
        for q in self._queues.values():
            q.entry.start_offsets = [pl.start_offset for pl in q.partitions]
        self._catalog.save(self.path / CATALOG_FILE)

    def _save_catalog_or_undo(self, undo: Callable[[], None]) -> None:
        """Save the catalog after an admin change; when that fails (a full disk), ``undo``
        the change in memory and raise. Otherwise the store would act on a catalog the disk
        does not hold: a queue created only in memory takes acknowledged messages and
        vanishes with them at the next open, and a retry says it already exists."""
        if self.read_only:  # undone before the check below, which a catalog unchanged on disk fools
            undo()
            raise read_only_refusal(self.path)
        try:
            self._save_catalog()
        except BaseException:
            path = self.path / CATALOG_FILE
            with contextlib.suppress(OSError):  # renamed into place, only the folder's fsync failed
                if path.read_bytes() == self._catalog.to_bytes():
                    raise
            undo()
            for q in self._queues.values():
                q.entry.start_offsets = [pl.start_offset for pl in q.partitions]
            raise

    def _bounds(self, q: QueueState, partitions: Iterable[int], now_ms: int) -> PartitionBounds:
        n = len(q.partitions)
        infos = {
            i: PartitionInfo(i, self._effective_start(q, i, now_ms), q.partitions[i].end_offset)
            for i in partitions
            if type(i) is int and 0 <= i < n
        }
        return PartitionBounds(name=q.entry.name, queue_id=q.entry.queue_id, partition_count=n, partitions=infos)

    def _info(self, q: QueueState, now_ms: int) -> QueueInfo:
        e = q.entry
        parts = [
            PartitionInfo(i, self._effective_start(q, i, now_ms), pl.end_offset) for i, pl in enumerate(q.partitions)
        ]
        return QueueInfo(
            name=e.name,
            queue_id=e.queue_id,
            config=e.config,
            enabled=e.enabled,
            created_ms=e.created_ms,
            partitions=parts,
        )
