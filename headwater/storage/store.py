"""LogStore: every queue and partition of one data directory, over one commit log.

This file opens the store, appends, flushes and closes it; the rest of the class lives
beside it by what it does: the shared state and helpers (``log_state.py``), admin
(``store_admin.py``), fetches and lookups (``store_reads.py``), retention (``retention.py``).

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

import logging
import threading
import time
from bisect import bisect_left, bisect_right
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from headwater.errors import (
    CorruptDataError,
    DataDirectoryError,
    InvalidArgumentError,
    NotADataDirectoryError,
    QueueNotFoundError,
    StorageError,
)
from headwater.model.batch import HEADER_SIZE, BatchHeader, broker_prefix, decode_header, validate_batch
from headwater.model.checks import check_int_arg
from headwater.model.config import (
    is_internal_queue,
)
from headwater.model.service import ProduceResult
from headwater.storage.catalog import CATALOG_FILE, Catalog
from headwater.storage.dirlock import DirectoryLock
from headwater.storage.flusher import Flusher, GroupCommit
from headwater.storage.last_batches import LastBatches
from headwater.storage.loader import Scan, key_hashes, load_segments, walk_headers
from headwater.storage.log_state import QueueState, Span
from headwater.storage.producer_state import ProducerStateTable, read_snapshot, write_snapshot
from headwater.storage.recovery_point import read_recovery_point, write_recovery_point
from headwater.storage.retention import LogRetention, _summary
from headwater.storage.schedule import ScheduleDirectory
from headwater.storage.segment import SEGMENT_HEADER_SIZE, LogSegment, segment_name
from headwater.storage.segment_index import SegmentIndex
from headwater.storage.settings import StoreConfig
from headwater.storage.store_admin import LogAdmin
from headwater.storage.store_reads import LogReads

_RECOVERY_POINT_INTERVAL_S = 1.0  # the recovery point moves at most this often (besides close)
_UNCACHE_CHUNK_BYTES = 8 * 1024 * 1024  # the page cache is let go of this much at a time, or more
_new_tuple = tuple.__new__  # a namedtuple from a tuple, without its Python-level calls
# _append_locked builds the stored header by position: the broker's fields are 2 to 6
assert BatchHeader._fields[2:7] == ("queue_id", "partition", "base_offset", "timestamp_ms", "broker_reserved")

if TYPE_CHECKING:
    from headwater.storage.api import Store

__all__ = ["LogStore", "StoreConfig"]

log = logging.getLogger("headwater.storage")


class LogStore(LogAdmin, LogReads, LogRetention):
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
        self.read_only = self.config.read_only
        self._dir_lock = DirectoryLock(self._prepare_directory(), shared=self.read_only)
        self._dir_lock.acquire()
        try:
            self._open()
        except BaseException:
            self._dir_lock.release()
            raise
        self._append_listeners: list[Callable[[str, int, int], None]] = []
        self._flush_listeners: list[Callable[[float], None]] = []
        # the page cache below _uncached_upto was let go of (what an earlier run wrote is left to the kernel)
        self._uncached_from = self._uncached_upto = self._active.end_position
        self._commit = GroupCommit(
            self._sync_active, durable=self._active.end_position, on_fail=self._mark_fsync_failed
        )
        self._flush_kick_at = self._active.end_position + self.config.flush_bytes
        self._flusher = Flusher("headwater-flush", self.config.flush_interval_ms, self._flush_tick)
        self._retention = Flusher("headwater-retention", self.config.retention_interval_ms, self.enforce_retention)
        if not self.read_only:
            self._flusher.start()
            self._retention.start()

    # -- opening ----------------------------------------------------------------------

    def _prepare_directory(self) -> Path:
        p = self.path
        if p.exists() and not p.is_dir():
            raise NotADataDirectoryError(f"{p} is a file; a data directory must be a directory")
        if self.read_only:  # nothing is made: the directory must be a store already
            if not (p / CATALOG_FILE).exists():
                raise NotADataDirectoryError(f"there is no Headwater data directory at {str(p)!r}")
            return p
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

    def _load_catalog(self) -> Catalog:
        """The catalog on disk, or a new one for a new store (written before any segment)."""
        cat_path = self.path / CATALOG_FILE
        if cat_path.exists():
            catalog = Catalog.load(cat_path)
        elif any(self._log_dir.glob("*.log")):
            # A new catalog would carry a new store id that no segment matches, and would be
            # written before that was found out: refuse, and touch nothing.
            raise NotADataDirectoryError(
                f"{cat_path} is missing but {self._log_dir} holds log segments; restore "
                f"{CATALOG_FILE} (from a backup) or move the directory aside"
            )
        else:
            catalog = Catalog.new(self._now_ms())
            self._log_dir.mkdir(exist_ok=True)
            catalog.save(cat_path)
        if not self.read_only:
            self._log_dir.mkdir(exist_ok=True)
        return catalog

    def _open(self) -> None:
        self._log_dir = self.path / "log"
        self._catalog = self._load_catalog()
        self._store_id = self._catalog.store_id_bytes
        self._queues: dict[str, QueueState] = {}
        self._by_id: dict[int, QueueState] = {}
        for entry in self._catalog.queues.values():
            q = QueueState(entry)
            self._queues[entry.name] = q
            self._by_id[entry.queue_id] = q
        self.recovery_report: list[str] = []  # what opening had to repair, for `headwater check`
        self.damage = Scan()  # flushed data found damaged: skipped, never cut
        loaded = load_segments(
            self._log_dir,
            self._store_id,
            verify_all=self.config.verify == "all",
            report=self.recovery_report,
            recovery_point=(point := read_recovery_point(self._log_dir, self._store_id, self.recovery_report)),
            scan=self.damage,
            read_only=self.read_only,
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
        elif self.read_only:
            raise DataDirectoryError(f"{self._log_dir} holds no log segment; open the store read-write once")
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
        self._report_lost_offsets()
        self._start_recovery_point(point)

    def _report_lost_offsets(self) -> None:
        for lost in self.damage.lost:
            owner = self._by_id.get(lost.queue_id)
            if owner is not None and lost.partition < len(owner.partitions):
                if lost.end <= owner.partitions[lost.partition].start_offset:
                    continue  # below the start (a reset jumps there): no reader misses them
            name = owner.entry.name if owner is not None else f"(deleted queue {lost.queue_id})"
            self.recovery_report.append(
                f"queue {name!r} partition {lost.partition}: offsets {lost.first}-{lost.end - 1} were in "
                f"damaged bytes; readers skip them"
            )

    def _start_recovery_point(self, point: int) -> None:
        """What recovery kept is made durable (a crash of the process alone left the tail
        in the page cache) and the recovery point covers it; after a clean close it does
        already, and opening writes nothing."""
        self._recovery_point = point
        self._recovery_point_at = time.monotonic()
        if self.read_only or point == self._active.end_position:
            return
        try:
            self._active.sync()
        except StorageError as e:
            log.warning("the recovery point stays where it was: %s", e)
        else:
            self._write_recovery_point(self._active.end_position)

    def _write_recovery_point(self, position: int) -> None:
        """Record ``position`` as flushed; a failure (a full disk) only keeps the older point."""
        self._recovery_point_at = time.monotonic()
        try:
            write_recovery_point(self._log_dir, self._store_id, position)
        except StorageError as e:
            log.warning("the recovery point could not be moved (%s); the older one stands", e)
            return
        self._recovery_point = position

    def _load_producer_state(self) -> ProducerStateTable:
        """The newest snapshot of a sealed segment, then every later batch replayed."""
        expiry = self.config.producer_expiry_ms
        table, after = ProducerStateTable(expiry), -1
        # after a clean close the last segment has a snapshot too, written with its index
        candidates = self._bases if self.damage.last_from_close else self._bases[:-1]
        for base in reversed(candidates):
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
                Span(idx.segment_base, pe.first_offset, pe.end_offset, pe.timestamps[0], pe.timestamps[-1])
            )

    # -- appending --------------------------------------------------------------------

    def add_append_listener(self, fn: Callable[[str, int, int], None]) -> None:
        """Call ``fn(queue, partition, end_offset)`` after every append (keep it quick)."""
        self._append_listeners.append(fn)

    def add_flush_listener(self, fn: Callable[[float], None]) -> None:
        """Call ``fn(seconds)`` after every fsync of the log, with the time it took, from the
        thread that made it (keep it quick: the broker's metrics count it)."""
        self._flush_listeners.append(fn)

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
        # the checks of _usable_queue, _partition, _check_open and _check_writable, tested
        # inline first (6 Python calls fewer per append); they raise when one fails
        q = self._queues.get(queue)
        if q is None or not q.entry.enabled:
            q = self._usable_queue(queue)
        if type(partition) is not int or not 0 <= partition < len(q.partitions):
            self._partition(q, partition)
        h, payload = validate_batch(batch, message_bytes_max=q.entry.config.message_bytes_max)
        hashes = key_hashes(payload.keys) if payload.keys is not None else None
        with self._lock:
            if self._closed or self.read_only or self._commit.failed is not None:
                self._check_open()
                self._check_writable()
            if self._queues.get(queue) is not q:  # deleted (or re-created) meanwhile
                q = self._usable_queue(queue)
                self._partition(q, partition)
            # a plain (non-idempotent) batch has nothing to check: skip the call
            dup = None if h.producer_id < 0 else self._producers.check(h, q.entry.queue_id, partition)
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
        q: QueueState,
        partition: int,
        h: BatchHeader,
        batch: bytes | bytearray,
        hashes: list[int] | None,
        broker_reserved: int = 0,
        timestamp_ms: int | None = None,
    ) -> tuple[ProduceResult, int]:
        """Append ``batch`` at the partition's end, stamped with the broker's fields: the
        append time is now (never before the last one), or for a copy ``timestamp_ms``."""
        pl = q.partitions[partition]
        qid = q.entry.queue_id
        if timestamp_ms is None:
            now = int(self._clock() * 1000)  # self._now_ms(), one call fewer
            ts = now if now > self._last_ts else self._last_ts
            self._last_ts = ts
        else:  # a copy keeps its source's time; later appends come after it
            ts = timestamp_ms
            if ts > self._last_ts:
                self._last_ts = ts
        seg = self._active
        size = 4 + h.length  # the batch's bytes (BatchHeader.size)
        if seg.size > SEGMENT_HEADER_SIZE and seg.size + size > self.config.segment_bytes_max:  # seg.data_bytes > 0
            seg = self._roll()
        base = pl.end_offset
        prefix = broker_prefix(h.length, qid, partition, base, ts, broker_reserved)
        body = memoryview(batch)[40:]
        pos = seg.append([prefix, body])
        # h._replace(queue_id=qid, partition=partition, base_offset=base, timestamp_ms=ts,
        # broker_reserved=broker_reserved), without its two Python-level calls
        stored = _new_tuple(BatchHeader, (*h[:2], qid, partition, base, ts, broker_reserved, *h[7:]))
        self._active_index.add_batch(stored, pos, hashes)
        if h.producer_id >= 0:  # record() ignores plain batches: skip the call
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
            spans.append(Span(seg.base_position, base, end, ts, ts))
        end_pos = pos + size
        if end_pos >= self._flush_kick_at:  # flush_bytes written since the last kick: fsync now, not all at once later
            self._flush_kick_at = end_pos + self.config.flush_bytes
            self._flusher.kick()
        return ProduceResult(qid, partition, base, h.count, ts), end_pos

    def append_copy(self, queue: str, partition: int, batch: bytes, base_offset: int) -> ProduceResult:
        """Append a batch read from another store's log (the bytes its fetch returned) at
        its original offset, ``base_offset``, which must be the partition's end offset.
        Checked as :meth:`append` checks a producer's batch, and its broker fields' checksum;
        the queue id, partition and base offset those fields hold must be this partition's
        already, and the batch is stored byte for byte (append time and ``broker_reserved``
        included). Producer state is recorded as an append records it, without the sequence
        check (a copy may begin after a producer's first batch). Durable on return under the
        queue's flush policy. A disabled queue takes copies: moving it is no use of it."""
        check_int_arg(base_offset, "a base offset")
        q = self._queue(queue)
        self._partition(q, partition)
        h, payload = validate_batch(batch, message_bytes_max=q.entry.config.message_bytes_max)
        self._check_copied_header(batch, h)
        hashes = key_hashes(payload.keys) if payload.keys is not None else None
        with self._lock:
            self._check_open()
            self._check_writable()
            q = self._queue(queue)  # deleted (or re-created) meanwhile?
            pl = self._partition(q, partition)
            last_ts = pl.spans[-1].last_ts if pl.spans and pl.spans[-1].end_offset > pl.start_offset else None
            self._check_copy(queue, partition, h, q.entry.queue_id, pl.end_offset, base_offset, last_ts)
            result, end_pos = self._append_locked(q, partition, h, batch, hashes, h.broker_reserved, h.timestamp_ms)
        for fn in self._append_listeners:
            fn(queue, partition, result.base_offset + result.count)
        if (q.entry.config.flush or self.config.flush) == "sync":
            self._commit.wait_durable(end_pos)
        return result

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
        # no message_bytes_max: the broker checked it when it accepted the batch, and a limit
        # lowered since applies to new sends only (an acknowledged message is never dropped)
        h, payload = validate_batch(batch)
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
        started = time.perf_counter()
        with seg.reading():
            seg.sync()
        for fn in self._flush_listeners:
            fn(time.perf_counter() - started)
        return covered

    def _flush_tick(self) -> None:
        """The flusher's work: fsync what is written (async flush), then let go of the page
        cache behind it, here rather than in the fsync so that sync-flush acknowledgements
        never wait for the kernel to free pages."""
        self._commit.sync_now()
        durable = self._commit.durable
        if durable > self._recovery_point and time.monotonic() - self._recovery_point_at >= _RECOVERY_POINT_INTERVAL_S:
            self._write_recovery_point(durable)
        self._uncache_behind(durable)

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
                # flushed data found damaged when the store opened: skipped, never cut
                "damaged_ranges": len(self.damage.damage),
                "damaged_bytes": sum(d.end_byte - d.first_byte for d in self.damage.damage),
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
            if not self.read_only:
                self._commit.wait_durable(self._active.end_position)
                if self._commit.durable != self._recovery_point:
                    self._write_recovery_point(self._commit.durable)
                self._save_active_index()
        finally:
            with self._lock:
                self._files_closed = True
                for seg in self._segments.values():
                    seg.close()
            self._dir_lock.release()

    def _save_active_index(self) -> None:
        """At a clean close, once the recovery point covers the active segment: its producer
        snapshot, then its index, so the next open reads neither (loader: crash policy). A
        failure only makes that open read the segment, as after a crash."""
        with self._lock:
            seg, idx = self._active, self._active_index
            if self._recovery_point != seg.end_position:
                return  # not all on the disk (or not recorded so): the next open checks it
            try:
                self._producers.expire(self._now_ms())
                write_snapshot(self._producers, self._log_dir / segment_name(seg.base_position, ".producers"))
                idx.segment_size = seg.size
                idx.write(self._log_dir / segment_name(seg.base_position, ".idx"))
            except StorageError as e:
                log.warning("the next open reads %s again: %s", seg.path.name, e)

    def __enter__(self) -> LogStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


if TYPE_CHECKING:  # mypy checks here that a LogStore is a Store

    def _is_a_store(store: LogStore) -> Store:
        return store
