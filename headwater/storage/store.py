"""LogStore: every queue and partition of one data directory, over one commit log.

Directory layout::

    DATA/headwater.json                catalog: store id, queues, settings, start offsets
    DATA/.lock                         flock held while a process has the store open
    DATA/log/<position:020d>.log       commit log segments (headwater.storage.segment)
    DATA/log/<position:020d>.idx       index of each sealed segment (segment_index)

Why one commit log per store (RocketMQ) rather than one log per partition (Kafka): the
number of open files and the write pattern do not depend on the number of partitions, so
10,000 partitions write as fast as one, and one fsync makes every queue's appends durable
at once (group commit across queues). docs/design/storage.md has the measurements and the
price (space of an expired queue is reclaimed only when its segment holds nothing live).

File descriptors: the active segment, plus at most ``open_segments_max`` sealed segments
open for reading (least recently read are closed first), plus the lock file.

Thread-safety: one lock guards the catalog, the partition tables and the active segment;
appends hold it only to assign offsets and write, reads only to plan which byte ranges to
read (the reads themselves happen outside it), fsyncs never.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from bisect import bisect_left, bisect_right
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from headwater.errors import (
    ClosedError,
    CorruptDataError,
    DataDirectoryError,
    InvalidArgumentError,
    MessageNotFoundError,
    NotADataDirectoryError,
    PartitionOutOfRangeError,
    QueueDisabledError,
    QueueExistsError,
    QueueNotFoundError,
    StorageError,
)
from headwater.model.batch import HEADER_SIZE, BatchHeader, broker_prefix, crc32c, decode_header, validate_batch
from headwater.model.checks import check_int_arg, check_queue_arg
from headwater.model.config import (
    INTERNAL_PREFIX,
    PARTITIONS_MAX,
    PartitionInfo,
    QueueConfig,
    QueueInfo,
    is_internal_queue,
    validate_queue_name,
)
from headwater.model.service import FetchResult, ProduceResult
from headwater.storage.catalog import CATALOG_FILE, Catalog, QueueEntry
from headwater.storage.dirlock import DirectoryLock
from headwater.storage.flusher import Flusher, GroupCommit
from headwater.storage.last_batches import LastBatches, Tail
from headwater.storage.loader import FSYNC_FAILED_FILE, key_hashes, load_segments, walk_headers
from headwater.storage.producer_state import ProducerStateTable, read_snapshot, write_snapshot
from headwater.storage.schedule import ScheduleDirectory
from headwater.storage.segment import SEGMENT_HEADER_SIZE, LogSegment, segment_name
from headwater.storage.segment_index import SegmentIndex
from headwater.storage.settings import StoreConfig

_new_tuple = tuple.__new__  # a namedtuple from a tuple, without its Python-level calls
# _append_locked builds the stored header by position: the broker's fields are 2 to 6
assert BatchHeader._fields[2:7] == ("queue_id", "partition", "base_offset", "timestamp_ms", "broker_reserved")

__all__ = ["LogStore", "StoreConfig"]

log = logging.getLogger("headwater.storage")

_TS_MAX = 2**63 - 1  # later than any timestamp


class _Span:
    """A partition's batches inside one segment."""

    __slots__ = ("segment_base", "first_offset", "end_offset", "first_ts", "last_ts")

    def __init__(self, segment_base: int, first_offset: int, end_offset: int, first_ts: int, last_ts: int):
        self.segment_base = segment_base
        self.first_offset = first_offset
        self.end_offset = end_offset
        self.first_ts = first_ts
        self.last_ts = last_ts


_UNCACHE_CHUNK_BYTES = 8 * 1024 * 1024  # the page cache is let go of this much at a time, or more
# batches a fetch skips (tag filter) before it answers with what it has and where it got to:
# the walk holds the store's lock, so appends wait for it (300,000 skipped: 0.1 s)
_SKIP_BATCHES_MAX = 8192


class _Expiry(NamedTuple):
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


class _Partition:
    __slots__ = ("start_offset", "end_offset", "spans", "expiry")

    def __init__(self, start_offset: int) -> None:
        self.start_offset = start_offset
        self.end_offset = start_offset
        self.spans: list[_Span] = []
        self.expiry: _Expiry | None = None


class _Queue:
    __slots__ = ("entry", "partitions")

    def __init__(self, entry: QueueEntry) -> None:
        self.entry = entry
        self.partitions = [_Partition(s) for s in entry.start_offsets]


class LogStore:
    """The storage engine of one data directory (a :class:`~headwater.storage.api.Store`);
    close when done."""

    def __init__(
        self, path: str | Path, config: StoreConfig | None = None, *, clock: Callable[[], float] = time.time
    ) -> None:
        self.path = Path(path)
        self.config = (config or StoreConfig()).validated()
        self._clock = clock
        self._lock = threading.RLock()
        self._closed = False
        self._files_closed = False
        self._last = LastBatches()  # copies of partitions' last batches, for readers at the end
        self._dir_lock = DirectoryLock(self._prepare_directory())
        self._dir_lock.acquire()
        try:
            self._open()
        except BaseException:
            self._dir_lock.release()
            raise
        self._append_listeners: list[Callable[[str, int, int], None]] = []
        # the page cache below _uncached_upto was let go of (what an earlier run wrote is left to the kernel)
        self._uncached_from = self._uncached_upto = self._active.end_position
        self._commit = GroupCommit(
            self._sync_active, durable=self._active.end_position, on_fail=self._mark_fsync_failed
        )
        self._flush_kick_at = self._active.end_position + self.config.flush_bytes
        self._flusher = Flusher("headwater-flush", self.config.flush_interval_ms, self._flush_tick)
        self._retention = Flusher("headwater-retention", self.config.retention_interval_ms, self.enforce_retention)
        self._flusher.start()
        self._retention.start()

    # -- opening ----------------------------------------------------------------------

    def _prepare_directory(self) -> Path:
        p = self.path
        if p.exists() and not p.is_dir():
            raise NotADataDirectoryError(f"{p} is a file; a data directory must be a directory")
        try:
            p.mkdir(parents=True, exist_ok=True)
        except OSError as e:  # a file on the way, a read-only file system, no permission
            raise DataDirectoryError(f"cannot create the data directory {p}: {e.strerror}") from e
        if not (p / CATALOG_FILE).exists():
            # the catalog's temp file is ours too: a crash during the very first open, before
            # the catalog was renamed into place, left it, and the directory must still open
            ours = (".lock", "log", CATALOG_FILE + ".tmp")
            foreign = sorted(x.name for x in p.iterdir() if x.name not in ours)
            if foreign:
                shown = ", ".join(foreign[:3]) + (", ..." if len(foreign) > 3 else "")
                raise NotADataDirectoryError(
                    f"{p} is not empty and is not a Headwater data directory (found {shown}); "
                    f"choose an empty or new directory"
                )
        return p

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    def _open(self) -> None:
        cat_path = self.path / CATALOG_FILE
        self._log_dir = self.path / "log"
        if cat_path.exists():
            self._catalog = Catalog.load(cat_path)
        elif any(self._log_dir.glob("*.log")):
            # A new catalog would carry a new store id that no segment matches, and would be
            # written before that was found out: refuse, and touch nothing.
            raise NotADataDirectoryError(
                f"{cat_path} is missing but {self._log_dir} holds log segments; restore "
                f"{CATALOG_FILE} (from a backup) or move the directory aside"
            )
        else:
            self._catalog = Catalog.new(self._now_ms())
            self._log_dir.mkdir(exist_ok=True)
            self._catalog.save(cat_path)
        self._log_dir.mkdir(exist_ok=True)
        self._store_id = self._catalog.store_id_bytes
        self._queues: dict[str, _Queue] = {}
        self._by_id: dict[int, _Queue] = {}
        for entry in self._catalog.queues.values():
            q = _Queue(entry)
            self._queues[entry.name] = q
            self._by_id[entry.queue_id] = q
        self.recovery_report: list[str] = []  # what opening had to repair, for `headwater check`
        loaded = load_segments(
            self._log_dir, self._store_id, verify_all=self.config.verify == "all", report=self.recovery_report
        )
        self._segments: dict[int, LogSegment] = {}
        self._index_cache: OrderedDict[int, SegmentIndex] = OrderedDict()
        self._open_lru: OrderedDict[int, LogSegment] = OrderedDict()
        self._last_ts = 0
        # per sealed segment, what retention needs: (partition key, end offset, last time)
        self._summaries: dict[int, list[tuple[tuple[int, int], int, int]]] = {}
        for seg, idx in loaded:
            self._segments[seg.base_position] = seg
            self._add_spans(idx)
            self._summaries[seg.base_position] = _summary(idx)
            self._last_ts = max(self._last_ts, idx.max_ts)
        for seg, idx in loaded[:-1]:
            seg.close()
            self._cache_index(idx)
        if loaded:
            self._active, self._active_index = loaded[-1]
        else:
            self._active = LogSegment.create(self._log_dir / segment_name(0, ".log"), 0, self._store_id, self._now_ms())
            self._segments[0] = self._active
            self._active_index = SegmentIndex(0)
        self._bases = sorted(self._segments)
        self._producers = self._load_producer_state()
        for q in self._queues.values():
            for pl in q.partitions:
                if pl.spans:
                    pl.end_offset = max(pl.end_offset, pl.spans[-1].end_offset)

    def _load_producer_state(self) -> ProducerStateTable:
        """The newest snapshot of a sealed segment, then every later batch replayed."""
        expiry = self.config.producer_expiry_ms
        table, after = ProducerStateTable(expiry), -1
        for base in reversed(self._bases[:-1]):
            path = self._log_dir / segment_name(base, ".producers")
            if path.exists():
                try:
                    table, after = read_snapshot(path, expiry), base
                    break
                except CorruptDataError as e:
                    log.warning("%s; using an older snapshot", e)
        for base in self._bases:
            if base <= after:
                continue
            for h in walk_headers(self._segments[base]):
                if h.producer_id >= 0:
                    table.record(h, h.queue_id, h.partition, h.base_offset, h.timestamp_ms)
        return table

    def _add_spans(self, idx: SegmentIndex) -> None:
        for (qid, part), pe in idx.partitions.items():
            q = self._by_id.get(qid)
            if q is None or part >= len(q.partitions):
                continue  # data of a deleted queue: dead, reclaimed by retention
            q.partitions[part].spans.append(
                _Span(idx.segment_base, pe.first_offset, pe.end_offset, pe.timestamps[0], pe.timestamps[-1])
            )

    # -- small helpers ----------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError(f"the store at {self.path} is closed")

    def _check_writable(self) -> None:
        """Under the lock, before an append: nothing is appended after a failed fsync."""
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

    def _queue(self, name: str) -> _Queue:
        q = self._queues.get(name)
        if q is None:
            check_queue_arg(name)
            raise QueueNotFoundError(f"queue {name!r} does not exist; create it first")
        return q

    def _usable_queue(self, name: str) -> _Queue:
        q = self._queue(name)
        if not q.entry.enabled:
            raise QueueDisabledError(f"queue {name!r} is disabled; enable it to read or write")
        return q

    @staticmethod
    def _partition(q: _Queue, partition: int) -> _Partition:
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

    def _ttl_cutoff(self, q: _Queue, now_ms: int) -> int | None:
        ttl = q.entry.config.ttl_s
        return None if ttl is None else now_ms - ttl * 1000

    def _effective_start(self, q: _Queue, part: int, now_ms: int) -> int:
        """First offset a reader may see: past truncation, retention and TTL expiry.

        Every fetch asks this (a fetch stream's push too), so under a TTL the answer is
        remembered (:class:`_Expiry`) rather than searched for each time."""
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
        pl.expiry = _Expiry(cutoff, _TS_MAX if batch_ts is None else batch_ts, pl.start_offset, pl.end_offset, offset)
        return offset

    def _time_position_locked(self, q: _Queue, part: int, ts: int) -> tuple[int, int | None]:
        """(the first offset appended at or after ``ts`` and retained, the timestamp of its
        batch); (the end offset, None) when there is none."""
        pl = q.partitions[part]
        spans = pl.spans
        i = bisect_left(spans, ts, key=lambda s: s.last_ts)
        while i < len(spans):
            sp = spans[i]
            if sp.end_offset > pl.start_offset:
                pe = self._index(sp.segment_base).partitions[(q.entry.queue_id, part)]
                j = pe.index_of_time(ts)
                if j < len(pe):
                    return max(pe.offsets[j], pl.start_offset), pe.timestamps[j]
            i += 1
        return pl.end_offset, None

    def _save_catalog(self) -> None:
        for q in self._queues.values():
            q.entry.start_offsets = [pl.start_offset for pl in q.partitions]
        self._catalog.save(self.path / CATALOG_FILE)

    def _save_catalog_or_undo(self, undo: Callable[[], None]) -> None:
        """Save the catalog after an admin change; when that fails (a full disk), ``undo``
        the change in memory and raise. Otherwise the store would act on a catalog the disk
        does not hold: a queue created only in memory takes acknowledged messages and
        vanishes with them at the next open, and a retry says it already exists."""
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

    def _info(self, q: _Queue, now_ms: int) -> QueueInfo:
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

    # -- admin ------------------------------------------------------------------------

    def create_queue(self, name: str, config: QueueConfig, *, internal: bool = False) -> QueueInfo:
        """Create a queue. ``internal`` queues (the broker's own, named ``__...``) are hidden
        from :meth:`list_queues`."""
        if internal:
            if not is_internal_queue(name):
                raise InvalidArgumentError(f"internal queue names start with {INTERNAL_PREFIX!r}, got {name!r}")
            validate_queue_name(name[len(INTERNAL_PREFIX) :])
        else:
            validate_queue_name(name)
        if not isinstance(config, QueueConfig):
            raise InvalidArgumentError(f"config must be a QueueConfig, got {type(config).__name__}")
        config.validated()
        with self._lock:
            self._check_open()
            if name in self._queues:
                raise QueueExistsError(f"queue {name!r} already exists")
            now = self._now_ms()
            entry = QueueEntry(
                name=name,
                queue_id=self._catalog.next_queue_id,
                config=config,
                created_ms=now,
                start_offsets=[0] * config.partitions,
            )
            self._catalog.next_queue_id += 1
            self._catalog.queues[name] = entry
            q = _Queue(entry)
            self._queues[name] = q
            self._by_id[entry.queue_id] = q

            def undo() -> None:
                del self._queues[name], self._by_id[entry.queue_id], self._catalog.queues[name]

            self._save_catalog_or_undo(undo)
            log.info("created queue %s (id %d, %d partitions)", name, entry.queue_id, config.partitions)
            return self._info(q, now)

    def describe_queue(self, name: str) -> QueueInfo:
        with self._lock:
            self._check_open()
            return self._info(self._queue(name), self._now_ms())

    def list_queues(self, *, include_internal: bool = False) -> list[QueueInfo]:
        with self._lock:
            self._check_open()
            now = self._now_ms()
            return [
                self._info(q, now)
                for name, q in sorted(self._queues.items())
                if include_internal or not is_internal_queue(name)
            ]

    def delete_before(self, queue: str, partition: int, offset: int) -> None:
        """Move the partition's start to ``offset`` (Kafka's DeleteRecords): the records
        before it are no longer served and their space comes back with retention."""
        with self._lock:
            self._check_open()
            q = self._queue(queue)
            pl = self._partition(q, partition)
            if not pl.start_offset <= offset <= pl.end_offset:
                raise InvalidArgumentError(
                    f"offset {offset} is outside {queue}[{partition}] ({pl.start_offset}..{pl.end_offset})"
                )
            old, pl.start_offset = pl.start_offset, offset
            self._save_catalog_or_undo(lambda: setattr(pl, "start_offset", old))

    def delete_queue(self, name: str) -> None:
        with self._lock:
            self._check_open()
            q = self._queue(name)
            del self._queues[name]
            del self._by_id[q.entry.queue_id]
            del self._catalog.queues[name]

            def undo() -> None:
                self._queues[name] = self._by_id[q.entry.queue_id] = q
                self._catalog.queues[name] = q.entry

            self._save_catalog_or_undo(undo)
            log.info("deleted queue %s (id %d)", name, q.entry.queue_id)

    def truncate_queue(self, name: str) -> QueueInfo:
        with self._lock:
            self._check_open()
            q = self._queue(name)
            starts = [pl.start_offset for pl in q.partitions]
            for pl in q.partitions:
                pl.start_offset = pl.end_offset

            def undo() -> None:
                for pl, start in zip(q.partitions, starts):
                    pl.start_offset = start

            self._save_catalog_or_undo(undo)
            return self._info(q, self._now_ms())

    def set_queue_enabled(self, name: str, enabled: bool) -> QueueInfo:
        with self._lock:
            self._check_open()
            q = self._queue(name)
            was, q.entry.enabled = q.entry.enabled, bool(enabled)
            self._save_catalog_or_undo(lambda: setattr(q.entry, "enabled", was))
            return self._info(q, self._now_ms())

    def add_partitions(self, name: str, partitions: int) -> QueueInfo:
        """Grow the queue to ``partitions`` partitions (never shrink: keys would move)."""
        with self._lock:
            self._check_open()
            q = self._queue(name)
            now_n = len(q.partitions)
            if (
                isinstance(partitions, bool)
                or not isinstance(partitions, int)
                or not (now_n < partitions <= PARTITIONS_MAX)
            ):
                raise InvalidArgumentError(
                    f"queue {name!r} has {now_n} partitions; the new count must be larger "
                    f"(up to {PARTITIONS_MAX}), got {partitions!r}"
                )
            config, q.entry.config = q.entry.config, q.entry.config.replace(partitions=partitions)
            q.partitions.extend(_Partition(0) for _ in range(partitions - now_n))

            def undo() -> None:
                q.entry.config = config
                del q.partitions[now_n:]

            self._save_catalog_or_undo(undo)
            return self._info(q, self._now_ms())

    # -- appending --------------------------------------------------------------------

    def add_append_listener(self, fn: Callable[[str, int, int], None]) -> None:
        """Call ``fn(queue, partition, end_offset)`` after every append (keep it quick)."""
        self._append_listeners.append(fn)

    def append(self, queue: str, partition: int, batch: bytes) -> ProduceResult:
        """Validate a producer's batch, append it, and return where it landed.

        Returns once the batch is durable under the queue's flush policy. A retry of a batch
        an idempotent producer already appended returns the original placement.
        """
        result, durable_at = self.append_nowait(queue, partition, batch)
        if durable_at is not None:
            self._commit.wait_durable(durable_at)
        return result

    def wait_durable(self, position: int) -> None:
        """Block until everything up to ``position`` is fsynced (shares fsyncs: group commit)."""
        self._commit.wait_durable(position)

    def append_nowait(self, queue: str, partition: int, batch: bytes) -> tuple[ProduceResult, int | None]:
        """Like :meth:`append` without waiting for the fsync: returns the placement and, under
        sync flush, the position to pass to :meth:`wait_durable` before acknowledging."""
        q = self._usable_queue(queue)
        self._partition(q, partition)
        h, payload = validate_batch(batch, message_bytes_max=q.entry.config.message_bytes_max)
        hashes = key_hashes(payload.keys) if payload.keys is not None else None
        with self._lock:
            self._check_open()
            self._check_writable()
            if self._queues.get(queue) is not q:  # deleted (or re-created) meanwhile
                q = self._usable_queue(queue)
                self._partition(q, partition)
            dup = self._producers.check(h, q.entry.queue_id, partition)
            if dup is None:
                result, end_pos = self._append_locked(q, partition, h, batch, hashes)
            else:  # a retry: already appended, maybe not yet durable
                result, end_pos = dup, self._active.end_position
        if dup is None:
            for fn in self._append_listeners:
                fn(queue, partition, result.base_offset + result.count)
        sync = (q.entry.config.flush or self.config.flush) == "sync"
        return result, (end_pos if sync else None)

    def _append_locked(
        self,
        q: _Queue,
        partition: int,
        h: BatchHeader,
        batch: bytes,
        hashes: list[int] | None,
        broker_reserved: int = 0,
    ) -> tuple[ProduceResult, int]:
        pl = q.partitions[partition]
        qid = q.entry.queue_id
        now = self._now_ms()
        ts = now if now > self._last_ts else self._last_ts
        self._last_ts = ts
        seg = self._active
        size = 4 + h.length  # the batch's bytes (BatchHeader.size)
        if seg.data_bytes > 0 and seg.size + size > self.config.segment_bytes_max:
            seg = self._roll()
        base = pl.end_offset
        prefix = broker_prefix(h.length, qid, partition, base, ts, broker_reserved)
        body = memoryview(batch)[40:]
        pos = seg.append([prefix, body])
        # h._replace(queue_id=qid, partition=partition, base_offset=base, timestamp_ms=ts,
        # broker_reserved=broker_reserved), without its two Python-level calls
        stored = _new_tuple(BatchHeader, (*h[:2], qid, partition, base, ts, broker_reserved, *h[7:]))
        self._active_index.add_batch(stored, pos, hashes)
        self._producers.record(h, qid, partition, base, ts)
        end = base + h.count
        pl.end_offset = end
        self._last.keep((qid, partition), base, end, h.tag_mask, prefix, body)
        spans = pl.spans
        if spans and spans[-1].segment_base == seg.base_position:
            sp = spans[-1]
            sp.end_offset = end
            sp.last_ts = ts
        else:
            spans.append(_Span(seg.base_position, base, end, ts, ts))
        end_pos = pos + size
        if end_pos >= self._flush_kick_at:  # flush_bytes written since the last kick: fsync now, not all at once later
            self._flush_kick_at = end_pos + self.config.flush_bytes
            self._flusher.kick()
        return ProduceResult(qid, partition, base, h.count, ts), end_pos

    # -- for the broker's delay service ------------------------------------------------

    def produce_target(self, queue: str, partition: int) -> tuple[int, int, bool]:
        """``(queue id, message_bytes_max, sync flush?)`` of a partition a batch may be
        appended to; raises as an append would (unknown or disabled queue, bad partition)."""
        q = self._usable_queue(queue)
        self._partition(q, partition)
        cfg = q.entry.config
        return q.entry.queue_id, cfg.message_bytes_max, (cfg.flush or self.config.flush) == "sync"

    def queue_name(self, queue_id: int) -> str | None:
        """The name of the queue with this id, or None if it no longer exists."""
        q = self._by_id.get(queue_id)
        return None if q is None else q.entry.name

    def append_stamped(
        self, queue_id: int, partition: int, batch: bytes | bytearray, broker_reserved: int
    ) -> tuple[ProduceResult, int]:
        """Append a batch the broker produces itself (a delayed batch coming due) to the
        queue with this id, with its ``broker_reserved`` field set, and return the placement
        and the end position to pass to :meth:`wait_durable`. The batch must carry no
        producer id: the broker checked idempotence when it accepted it."""
        q = self._by_id.get(queue_id)
        if q is None:
            raise QueueNotFoundError(f"no queue has id {queue_id} (was it deleted?)")
        name = q.entry.name
        q = self._usable_queue(name)
        self._partition(q, partition)
        h, payload = validate_batch(batch, message_bytes_max=q.entry.config.message_bytes_max)
        if h.producer_id >= 0:
            raise InvalidArgumentError("a batch the broker appends itself carries no producer id")
        hashes = key_hashes(payload.keys) if payload.keys is not None else None
        with self._lock:
            self._check_open()
            self._check_writable()
            if self._by_id.get(queue_id) is not q:
                raise QueueNotFoundError(f"no queue has id {queue_id} (was it deleted?)")
            result, end_pos = self._append_locked(q, partition, h, batch, hashes, broker_reserved)
        for fn in self._append_listeners:
            fn(name, partition, result.base_offset + result.count)
        return result, end_pos

    @property
    def kind(self) -> str:
        """``"file"``: this store keeps a data directory (the other kind: ``"memory"``)."""
        return "file"

    def schedule_store(self) -> ScheduleDirectory:
        """Where the delay service keeps its schedule: ``DATA/delay/``."""
        return ScheduleDirectory(self.path / "delay")

    @property
    def clock(self) -> Callable[[], float]:
        """The wall clock this store times appends with (injected by tests)."""
        return self._clock

    @property
    def fsync_failed(self) -> bool:
        """An fsync failed: the store appends and acknowledges nothing more until reopened."""
        return self._commit.failed is not None

    @property
    def store_id(self) -> bytes:
        """The 16 bytes that tie this directory's files to it."""
        return self._store_id

    @property
    def end_position(self) -> int:
        """The log position the next append will take (every batch so far lies before it)."""
        with self._lock:
            return self._active.end_position

    def stamped_batches(self, since_position: int) -> list[BatchHeader]:
        """Headers of the batches at or after ``since_position`` (a position some append
        ended at) whose ``broker_reserved`` field is set, in log order. Reads headers only."""
        with self._lock:
            self._check_open()
            segs = [self._segments[b] for b in self._bases]
            end = self._active.end_position
        out: list[BatchHeader] = []
        for seg in segs:
            stop = min(seg.end_position, end)
            pos = max(since_position, seg.base_position + SEGMENT_HEADER_SIZE)
            if pos >= stop:
                continue
            try:
                with seg.reading():
                    while pos + HEADER_SIZE <= stop:
                        h = decode_header(seg.read(pos, HEADER_SIZE))
                        if h.broker_reserved:
                            out.append(h)
                        pos += h.size
            except StorageError:
                if not seg.deleted:
                    raise  # retention deleting a segment under us is no error: nothing live was in it
        return out

    def _roll(self) -> LogSegment:
        """Seal the active segment (fsync, write its index) and start a new one."""
        old, idx = self._active, self._active_index
        try:
            old.sync()
        except StorageError as e:
            self._commit.fail(e)
            raise
        idx.segment_size = old.size
        self._producers.expire(self._now_ms())
        write_snapshot(self._producers, self._log_dir / segment_name(old.base_position, ".producers"))
        for stale in self._bases[:-2]:  # keep the two newest snapshots
            (self._log_dir / segment_name(stale, ".producers")).unlink(missing_ok=True)
        idx.write(self._log_dir / segment_name(old.base_position, ".idx"))
        self._cache_index(idx)
        self._summaries[old.base_position] = _summary(idx)
        base = old.end_position
        new = LogSegment.create(self._log_dir / segment_name(base, ".log"), base, self._store_id, self._now_ms())
        self._segments[base] = new
        self._bases.append(base)
        self._active, self._active_index = new, SegmentIndex(base)
        self._commit.durable = max(self._commit.durable, base)
        self._touch_segment(old)
        return new

    def _sync_active(self) -> int:
        with self._lock:
            seg = self._active
            covered = seg.end_position
            if self._files_closed or covered <= self._commit.durable:  # nothing new to make durable
                return covered
        if seg.deleted:
            return covered
        with seg.reading():
            seg.sync()
        return covered

    def _flush_tick(self) -> None:
        """The flusher's work: fsync what is written (async flush), then let go of the page
        cache behind it, here rather than in the fsync so that sync-flush acknowledgements
        never wait for the kernel to free pages."""
        self._commit.sync_now()
        self._uncache_behind(self._commit.durable)

    def _uncache_behind(self, durable: int) -> None:
        """Let the OS page cache drop the fsynced log more than ``page_cache_keep_bytes``
        behind ``durable``, so writing reuses the memory it freed instead of taking fresh
        pages (docs/design/storage.md, "The page cache and the allocator"). Called by the
        flusher thread only."""
        keep = self.config.page_cache_keep_bytes
        start, end = self._uncached_upto, durable - keep
        if not keep or end - start < _UNCACHE_CHUNK_BYTES:
            return
        with self._lock:
            first = max(bisect_right(self._bases, start) - 1, 0)
            last = bisect_left(self._bases, end)
            segs = [self._segments[b] for b in self._bases[first:last]]
        for seg in segs:
            seg.drop_cached(max(start, seg.base_position), min(end, seg.end_position))
        self._uncached_upto = end

    def flush(self) -> None:
        """Make everything appended so far durable (fsync)."""
        self._check_open()
        with self._lock:
            end = self._active.end_position
        self._commit.wait_durable(end)

    # -- reading ----------------------------------------------------------------------

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

    def _fetch_tail(self, q: _Queue, pl: _Partition, partition: int, tail: Tail) -> FetchResult | None:
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
        q: _Queue,
        pl: _Partition,
        partition: int,
        offset: int,
        max_bytes: int,
        tag_mask: int,
        end_offset: int | None,
    ):
        key = (q.entry.queue_id, partition)
        plan: list[tuple[LogSegment, list[tuple[int, int]]]] = []
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
                ranges: list[tuple[int, int]] = []
                n = len(pe)
                while i < n and total < max_bytes and skipped < _SKIP_BATCHES_MAX:
                    bo, cnt, pos, size, _ts, mask = pe.entry(i)
                    if bo >= stop:
                        # Nothing lies in [cur, stop): a gap left by a cut sealed segment.
                        # Without moving cur to stop this loop spun forever on the same batch
                        # (a lookup or a bounded scan of an offset inside the gap hung).
                        cur = stop
                        break
                    cur = max(cur, bo + cnt)
                    i += 1
                    if tag_mask and not mask & tag_mask:
                        skipped += 1  # the reader asks again from cur
                        continue
                    ranges.append((pos, size))
                    total += size
                if ranges:
                    seg = self._segments[sp.segment_base]
                    self._touch_segment(seg)
                    plan.append((seg, ranges))
                if i >= n:
                    si += 1
        return plan, cur, start, end

    @staticmethod
    def _read_plan(plan: list[tuple[LogSegment, list[tuple[int, int]]]]) -> list[bytes]:
        out: list[bytes] = []
        for seg, ranges in plan:
            with seg.reading():
                i = 0
                while i < len(ranges):
                    pos, size = ranges[i]
                    j = i + 1
                    run_end = pos + size
                    # coalesce batches that lie back to back into one read
                    while j < len(ranges) and ranges[j][0] == run_end and run_end - pos < 8 << 20:
                        run_end += ranges[j][1]
                        j += 1
                    data = seg.read(pos, run_end - pos)
                    if j == i + 1:
                        out.append(data)
                    else:
                        mv = memoryview(data)
                        for p, s in ranges[i:j]:
                            out.append(mv[p - pos : p - pos + s])
                    i = j
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
    ) -> list[tuple[LogSegment, list[tuple[int, int]]]]:
        q = self._usable_queue(queue)
        qid = q.entry.queue_id
        h = crc32c(key)
        lo = start_ms if start_ms is not None else -(2**62)
        hi = end_ms if end_ms is not None else 2**62
        plan: list[tuple[LogSegment, list[tuple[int, int]]]] = []
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
                    plan.append((seg, ranges[: limit - found]))
                    found += len(ranges)
                    if found >= limit:
                        break
        return plan

    # -- retention --------------------------------------------------------------------

    def enforce_retention(self) -> int:
        """Delete sealed segments that hold nothing live any more; return how many."""
        deleted = 0
        with self._lock:
            if self._closed:
                return 0
            now = self._now_ms()
            # decided from the in-memory summaries: no index is read while the lock is held
            doomed = [
                base
                for base in self._bases[:-1]
                if all(self._dead(key, end, last_ts, now) for key, end, last_ts in self._summaries[base])
            ]
            if not doomed:
                return 0
            for base in doomed:
                for (qid, part), end, _last_ts in self._summaries[base]:
                    q = self._by_id.get(qid)
                    if q is None or part >= len(q.partitions):
                        continue
                    pl = q.partitions[part]
                    pl.start_offset = max(pl.start_offset, end)
                    pl.spans = [s for s in pl.spans if s.segment_base != base]
            unsaved = None
            try:
                self._save_catalog()  # start offsets first: offsets are never reused after a crash
            except StorageError as e:
                # A full disk, which only deleting segments can cure: delete those whose loss
                # moves no offset back even if the catalog keeps its old start offsets, then
                # save again. (Insisting on the save first left a full disk full for good.)
                doomed = [base for base in doomed if self._deletable_unsaved(base)]
                if not doomed:
                    raise
                unsaved = e
            gone = []
            for base in doomed:
                del self._summaries[base]
                gone.append(self._segments.pop(base))
                self._bases.remove(base)
                self._index_cache.pop(base, None)
                self._open_lru.pop(base, None)
        # Unlinking large files can take a while: do it with the lock released, so appends
        # and reads never wait for it (nothing refers to these segments any more; a reader
        # that planned a read before keeps its descriptor until it is done).
        for seg in gone:
            seg.delete()
            (self._log_dir / segment_name(seg.base_position, ".idx")).unlink(missing_ok=True)
            (self._log_dir / segment_name(seg.base_position, ".producers")).unlink(missing_ok=True)
            deleted += 1
        if deleted:
            log.info("retention deleted %d segment(s)", deleted)
        if unsaved is not None:
            log.warning("retention deleted %d segment(s) before it could save the catalog (%s)", deleted, unsaved)
            with self._lock:
                if self._closed:
                    return deleted
                self._save_catalog()  # raises if there is still no room; the next run tries again
            deleted += self.enforce_retention()  # the doomed segments that had to wait for it
        return deleted

    def _deletable_unsaved(self, base: int) -> bool:
        """Whether sealed segment ``base`` (doomed, its spans gone) may be deleted before the
        catalog saves the start offsets that retention moved: whether every partition with
        data in it has data in a later segment that stays, from which an open recomputes its
        end offset, or belongs to a queue that is gone."""
        for (qid, part), _end, _last_ts in self._summaries[base]:
            q = self._by_id.get(qid)
            if q is None or part >= len(q.partitions):
                continue
            spans = q.partitions[part].spans
            if not spans or spans[-1].segment_base < base:
                return False
        return True

    def _dead(self, key: tuple[int, int], end_offset: int, last_ts: int, now: int) -> bool:
        q = self._by_id.get(key[0])
        if q is None or key[1] >= len(q.partitions):
            return True
        if end_offset <= q.partitions[key[1]].start_offset:
            return True
        cutoff = self._ttl_cutoff(q, now)
        return cutoff is not None and last_ts < cutoff

    # -- stats and closing --------------------------------------------------------------

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {
                "segments": len(self._segments),
                "bytes": sum(s.size for s in self._segments.values()),
                "open_segments": sum(1 for s in self._segments.values() if s.is_open),
                "queues": sum(1 for n in self._queues if not is_internal_queue(n)),
                "partitions": sum(len(q.partitions) for n, q in self._queues.items() if not is_internal_queue(n)),
                "internal_queues": sum(1 for n in self._queues if is_internal_queue(n)),
                "fsyncs": self._commit.fsyncs,
                "page_cache_keep_bytes": self.config.page_cache_keep_bytes,
                "uncached_bytes": self._uncached_upto - self._uncached_from,
            }

    def close(self) -> None:
        """Flush, stop the background threads, close every file, release the directory."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._flusher.stop()
        self._retention.stop()
        try:
            self._commit.wait_durable(self._active.end_position)
        finally:
            with self._lock:
                self._files_closed = True
                for seg in self._segments.values():
                    seg.close()
            self._dir_lock.release()

    def __enter__(self) -> LogStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _summary(idx: SegmentIndex) -> list[tuple[tuple[int, int], int, int]]:
    return [(key, pe.end_offset, pe.timestamps[-1]) for key, pe in idx.partitions.items()]
