"""MemoryStore: the queues of a store kept in memory, for tests (``headwater.testing``).

It is a :class:`~headwater.storage.api.Store` like :class:`~headwater.storage.store.LogStore`:
batches are validated with the same codec and stored as the log stores them (the broker's
40-byte prefix, then the producer's bytes), idempotent producers are checked with the same
table, TTL and retention follow the injected clock, and every error carries the same words.
What it does not do is persist anything: every append is "durable" at once, and nothing
survives :meth:`MemoryStore.close`. The broker's internal ``__`` queues (offsets, groups,
subscribers, ...) live here too, so the real broker runs unchanged over it.

Layout: per partition, a list of stored batches in offset order, each with its offset,
count, append time, tag mask, key hashes and its *position*: the bytes appended to the
store before it, as a commit log would number them (what ``end_position`` and
``stamped_batches`` speak of).

Thread-safety: one lock guards everything; append listeners are called outside it.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from headwater.errors import (
    ClosedError,
    InvalidArgumentError,
    MessageNotFoundError,
    PartitionOutOfRangeError,
    QueueDisabledError,
    QueueNotFoundError,
)
from headwater.model.batch import BatchHeader, broker_prefix, crc32c, decode_header, validate_batch
from headwater.model.checks import check_int_arg, check_queue_arg
from headwater.model.config import (
    PartitionBounds,
    PartitionInfo,
    QueueConfig,
    QueueInfo,
    altered_config,
    is_internal_queue,
)
from headwater.model.producer_state import ProducerStateTable
from headwater.model.service import FetchResult, ProduceResult
from headwater.storage.log_state import read_only_refusal
from headwater.storage.memory_schedule import MemorySchedule
from headwater.storage.queue_table import QueueTable
from headwater.storage.quotas import check_added_partitions
from headwater.storage.settings import StoreConfig

if TYPE_CHECKING:
    from headwater.storage.api import Store

__all__ = ["EmptyDirectoryStore", "MemoryStore"]

log = logging.getLogger("headwater.storage")


class _Stored(NamedTuple):
    """One stored batch of a partition."""

    base_offset: int
    end_offset: int
    timestamp_ms: int
    tag_mask: int
    key_hashes: frozenset[int]
    position: int  # bytes appended to the store before this batch
    data: bytes


class _Partition:
    __slots__ = ("start_offset", "end_offset", "batches")

    def __init__(self) -> None:
        self.start_offset = 0  # past truncation and delete_before (TTL comes on top)
        self.end_offset = 0
        self.batches: list[_Stored] = []


class _Queue:
    __slots__ = ("name", "queue_id", "config", "enabled", "created_ms", "partitions")

    def __init__(self, name: str, queue_id: int, config: QueueConfig, created_ms: int) -> None:
        self.name, self.queue_id, self.config, self.created_ms = name, queue_id, config, created_ms
        self.enabled = True
        self.partitions = [_Partition() for _ in range(config.partitions)]


def _end(b: _Stored) -> int:
    return b.end_offset


def _time(b: _Stored) -> int:
    return b.timestamp_ms


class MemoryStore(QueueTable):
    """A store in memory (a :class:`~headwater.storage.api.Store`); close when done."""

    def __init__(self, config: StoreConfig | None = None, *, clock: Callable[[], float] = time.time) -> None:
        self.config = (config or StoreConfig()).validated()
        self.recovery_report: list[str] = []  # nothing is ever recovered: nothing was kept
        self.read_only = False  # a store in memory starts empty: reading only would be pointless
        self._clock = clock
        self._lock = threading.RLock()
        self._closed = False
        self._store_id = uuid.uuid4().bytes
        self._queues: dict[str, _Queue] = {}
        self._by_id: dict[int, _Queue] = {}
        self._next_queue_id = 1
        self._last_ts = 0
        self._position = 0
        self._producers = ProducerStateTable(self.config.producer_expiry_ms)
        self._append_listeners: list[Callable[[str, int, int], None]] = []
        self._retention_at_ms = 0  # when appends next drop what expired (no thread: memory)
        self._schedule = MemorySchedule()

    # -- what the broker asks of every store ------------------------------------------

    @property
    def kind(self) -> str:
        """``"memory"``: nothing is kept past :meth:`close`."""
        return "memory"

    @property
    def path(self) -> Path | None:
        """None: a store in memory has no data directory."""
        return None

    @property
    def clock(self) -> Callable[[], float]:
        """The wall clock this store times appends, TTL and retention with."""
        return self._clock

    @property
    def fsync_failed(self) -> bool:
        """Never: there is no fsync."""
        return False

    @property
    def store_id(self) -> bytes:
        """16 random bytes, new for each store."""
        return self._store_id

    @property
    def end_position(self) -> int:
        """The position the next append will take (bytes appended so far)."""
        with self._lock:
            return self._position

    def schedule_store(self) -> MemorySchedule:
        """The delay service's schedule: in memory too."""
        return self._schedule

    # -- small helpers ----------------------------------------------------------------

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("the in-memory store is closed")

    def _queue(self, name: str) -> _Queue:
        q = self._queues.get(name)
        if q is None:
            check_queue_arg(name)
            raise QueueNotFoundError(f"queue {name!r} does not exist; create it first")
        return q

    def _usable_queue(self, name: str) -> _Queue:
        q = self._queue(name)
        if not q.enabled:
            raise QueueDisabledError(f"queue {name!r} is disabled; enable it to read or write")
        return q

    @staticmethod
    def _partition(q: _Queue, partition: int) -> _Partition:
        check_int_arg(partition, "a partition")
        if not 0 <= partition < len(q.partitions):
            raise PartitionOutOfRangeError(
                f"queue {q.name!r} has partitions 0..{len(q.partitions) - 1}; there is no partition {partition}"
            )
        return q.partitions[partition]

    def _time_position(self, pl: _Partition, ts: int) -> int:
        """The first offset appended at or after ``ts`` and retained (the end if none)."""
        i = bisect_left(pl.batches, ts, key=_time)
        first = pl.batches[i].base_offset if i < len(pl.batches) else pl.end_offset
        return max(first, pl.start_offset)

    def _effective_start(self, q: _Queue, pl: _Partition, now_ms: int) -> int:
        """First offset a reader may see: past truncation, retention and TTL expiry."""
        ttl = q.config.ttl_s
        return pl.start_offset if ttl is None else self._time_position(pl, now_ms - ttl * 1000)

    def _bounds(self, q: _Queue, partitions: Iterable[int], now_ms: int) -> PartitionBounds:
        n = len(q.partitions)
        infos = {
            i: PartitionInfo(i, self._effective_start(q, q.partitions[i], now_ms), q.partitions[i].end_offset)
            for i in partitions
            if type(i) is int and 0 <= i < n
        }
        return PartitionBounds(name=q.name, queue_id=q.queue_id, partition_count=n, partitions=infos)

    def _info(self, q: _Queue, now_ms: int) -> QueueInfo:
        return QueueInfo(
            name=q.name,
            queue_id=q.queue_id,
            config=q.config,
            enabled=q.enabled,
            created_ms=q.created_ms,
            partitions=[
                PartitionInfo(i, self._effective_start(q, pl, now_ms), pl.end_offset)
                for i, pl in enumerate(q.partitions)
            ],
        )

    # -- admin ------------------------------------------------------------------------

    def create_queue(
        self, name: str, config: QueueConfig, *, internal: bool = False, queue_id: int | None = None
    ) -> QueueInfo:
        """Create a queue. ``internal`` queues (the broker's own, named ``__...``) are hidden
        from :meth:`list_queues`. ``queue_id``: the id a cluster's controller allocated (it
        must be free; later automatic ids stay past it)."""
        self._check_new_queue(name, config, internal)
        self._check_queue_id_arg(queue_id)
        with self._lock:
            self._check_room_locked(name, config)
            now = self._now_ms()
            qid, self._next_queue_id = self._take_queue_id_locked(name, queue_id, self._next_queue_id)
            q = _Queue(name, qid, config, now)
            self._queues[name] = self._by_id[q.queue_id] = q
            log.info("created queue %s (id %d, %d partitions)", name, q.queue_id, config.partitions)
            return self._info(q, now)

    def delete_before(self, queue: str, partition: int, offset: int) -> None:
        """Move the partition's start to ``offset``: the records before it are no longer
        served and their memory comes back with retention."""
        with self._lock:
            self._check_open()
            pl = self._partition(self._queue(queue), partition)
            if not pl.start_offset <= offset <= pl.end_offset:
                raise InvalidArgumentError(
                    f"offset {offset} is outside {queue}[{partition}] ({pl.start_offset}..{pl.end_offset})"
                )
            pl.start_offset = offset

    def reset_partition(self, queue: str, partition: int, offset: int) -> None:
        """Make an empty partition begin at ``offset``, not below its end offset, so that a
        copy keeps its source's offsets (:meth:`append_copy`)."""
        with self._lock:
            self._check_open()
            q = self._queue(queue)
            pl = self._partition(q, partition)
            self._check_reset(queue, partition, self._effective_start(q, pl, self._now_ms()), pl.end_offset, offset)
            pl.start_offset = pl.end_offset = offset
            pl.batches.clear()  # none is retained: each ends at or before the new start

    def rewind_partition(self, queue: str, partition: int, offset: int, last_batch: bytes | None = None) -> None:
        """Make an emptied partition begin at ``offset``, below its end: what it keeps from
        there on is served again if it is whole and ends with ``last_batch``; with nothing
        kept past ``offset`` it begins there empty (as :meth:`LogStore.rewind_partition`)."""
        with self._lock:
            self._check_open()
            q = self._queue(queue)
            pl = self._partition(q, partition)
            end = pl.end_offset
            self._check_rewind(queue, partition, self._effective_start(q, pl, self._now_ms()), end, offset)
            if offset == end:
                return
            kept = [b for b in pl.batches if b.end_offset > offset]
            if kept:
                covered = sum(b.end_offset - max(b.base_offset, offset) for b in kept)
                self._check_kept(queue, partition, offset, end, covered, kept[-1].data, last_batch)
                pl.start_offset = offset
            else:
                pl.start_offset = pl.end_offset = offset

    def delete_queue(self, name: str) -> None:
        with self._lock:
            self._check_open()
            q = self._queue(name)
            del self._queues[name], self._by_id[q.queue_id]
            log.info("deleted queue %s (id %d)", name, q.queue_id)

    def truncate_queue(self, name: str) -> QueueInfo:
        with self._lock:
            self._check_open()
            q = self._queue(name)
            for pl in q.partitions:
                pl.start_offset = pl.end_offset
            return self._info(q, self._now_ms())

    def set_queue_enabled(self, name: str, enabled: bool) -> QueueInfo:
        with self._lock:
            self._check_open()
            q = self._queue(name)
            q.enabled = bool(enabled)
            return self._info(q, self._now_ms())

    def alter_queue(self, name: str, changes: dict[str, Any]) -> QueueInfo:
        with self._lock:
            self._check_open()
            q = self._queue(name)
            q.config = altered_config(q.config, changes)
            return self._info(q, self._now_ms())

    def add_partitions(self, name: str, partitions: int) -> QueueInfo:
        """Grow the queue to ``partitions`` partitions (never shrink: keys would move)."""
        with self._lock:
            self._check_open()
            q = self._queue(name)
            now_n = len(q.partitions)
            check_added_partitions(self.config, name, now_n, partitions, self._partitions_held())
            q.config = q.config.replace(partitions=partitions)
            q.partitions.extend(_Partition() for _ in range(partitions - now_n))
            return self._info(q, self._now_ms())

    # -- appending --------------------------------------------------------------------

    def add_flush_listener(self, fn: Callable[[float], None]) -> None:
        """Nothing is ever fsynced in memory: ``fn`` is never called."""

    def add_append_listener(self, fn: Callable[[str, int, int], None]) -> None:
        """Call ``fn(queue, partition, end_offset)`` after every append (keep it quick)."""
        self._append_listeners.append(fn)

    def append(self, queue: str, partition: int, batch: bytes) -> ProduceResult:
        """Validate a producer's batch, append it, and return where it landed. A retry of a
        batch an idempotent producer already appended returns the original placement."""
        return self.append_nowait(queue, partition, batch)[0]

    def wait_durable(self, position: int) -> None:
        """Return at once: what is in memory is as durable as it gets."""

    def flush(self) -> None:
        """Nothing to flush; raises only if the store is closed."""
        self._check_open()

    def append_nowait(self, queue: str, partition: int, batch: bytes) -> tuple[ProduceResult, int | None]:
        """Like :meth:`append`; there is never a position to wait for (None)."""
        q = self._usable_queue(queue)
        self._partition(q, partition)
        h, payload = validate_batch(batch, message_bytes_max=q.config.message_bytes_max)
        with self._lock:
            self._check_open()
            q = self._usable_queue(queue)  # deleted (or re-created) meanwhile?
            self._partition(q, partition)
            result = self._producers.check(h, q.queue_id, partition)
            if result is not None:  # a retry: the original placement
                return result, None
            result = self._append_locked(q, partition, h, batch, payload.keys)
        for fn in self._append_listeners:
            fn(queue, partition, result.base_offset + result.count)
        return result, None

    def _append_locked(
        self,
        q: _Queue,
        partition: int,
        h: BatchHeader,
        batch: bytes | bytearray,
        keys: list[bytes | None] | None,
        broker_reserved: int = 0,
        timestamp_ms: int | None = None,
    ) -> ProduceResult:
        pl = q.partitions[partition]
        now = self._now_ms()
        if timestamp_ms is None:
            ts = self._last_ts = max(now, self._last_ts)  # append times never go back, as in the log
        else:  # a copy keeps its source's time; later appends come after it
            ts, self._last_ts = timestamp_ms, max(timestamp_ms, self._last_ts)
        base = pl.end_offset
        data = broker_prefix(h.length, q.queue_id, partition, base, ts, broker_reserved) + bytes(batch[40:])
        hashes = frozenset(crc32c(k) for k in keys if k is not None) if keys else frozenset()
        pl.batches.append(_Stored(base, base + h.count, ts, h.tag_mask, hashes, self._position, data))
        pl.end_offset = base + h.count
        self._position += len(data)
        self._producers.record(h, q.queue_id, partition, base, ts)
        if now >= self._retention_at_ms:
            # only what can never be seen again (truncated, deleted before: the broker's
            # internal queues compact that way); expired batches wait for enforce_retention,
            # as the log's wait for their segment's deletion (a clock moved back shows them)
            self._retention_at_ms = now + self.config.retention_interval_ms
            self._enforce_retention_locked(now, expired=False)
        return ProduceResult(q.queue_id, partition, base, h.count, ts)

    def append_copy(self, queue: str, partition: int, batch: bytes, base_offset: int) -> ProduceResult:
        """Append a batch as another store keeps it at its original offset, which must be
        the partition's end offset, byte for byte (LogStore.append_copy says more)."""
        check_int_arg(base_offset, "a base offset")
        q = self._queue(queue)
        self._partition(q, partition)
        h, payload = validate_batch(batch, message_bytes_max=q.config.message_bytes_max)
        self._check_copied_header(batch, h)
        with self._lock:
            self._check_open()
            q = self._queue(queue)  # deleted (or re-created) meanwhile?
            pl = self._partition(q, partition)
            last = pl.batches[-1] if pl.batches and pl.batches[-1].end_offset > pl.start_offset else None
            last_ts = None if last is None else last.timestamp_ms
            self._check_copy(queue, partition, h, q.queue_id, pl.end_offset, base_offset, last_ts)
            result = self._append_locked(q, partition, h, batch, payload.keys, h.broker_reserved, h.timestamp_ms)
        for fn in self._append_listeners:
            fn(queue, partition, result.base_offset + result.count)
        return result

    # -- for the broker's delay service ------------------------------------------------

    def produce_target(self, queue: str, partition: int) -> tuple[int, int, bool]:
        """``(queue id, message_bytes_max, sync flush?)`` of a partition a batch may be
        appended to; raises as an append would (unknown or disabled queue, bad partition)."""
        q = self._usable_queue(queue)
        self._partition(q, partition)
        return q.queue_id, q.config.message_bytes_max, (q.config.flush or self.config.flush) == "sync"

    def queue_name(self, queue_id: int) -> str | None:
        """The name of the queue with this id, or None if it no longer exists."""
        q = self._by_id.get(queue_id)
        return None if q is None else q.name

    def append_stamped(
        self, queue_id: int, partition: int, batch: bytes | bytearray, broker_reserved: int
    ) -> tuple[ProduceResult, int]:
        """Append a batch the broker produces itself (a delayed batch coming due), with its
        ``broker_reserved`` field set; the batch carries no producer id."""
        q = self._by_id.get(queue_id)
        if q is None:
            raise QueueNotFoundError(f"no queue has id {queue_id} (was it deleted?)")
        q = self._usable_queue(q.name)
        self._partition(q, partition)
        # no message_bytes_max: the broker checked it when it accepted the batch, and a limit
        # lowered since applies to new sends only (an acknowledged message is never dropped)
        h, payload = validate_batch(memoryview(batch))
        if h.producer_id >= 0:
            raise InvalidArgumentError("a batch the broker appends itself carries no producer id")
        with self._lock:
            self._check_open()
            if self._by_id.get(queue_id) is not q:
                raise QueueNotFoundError(f"no queue has id {queue_id} (was it deleted?)")
            result = self._append_locked(q, partition, h, batch, payload.keys, broker_reserved)
            end_position = self._position
        for fn in self._append_listeners:
            fn(q.name, partition, result.base_offset + result.count)
        return result, end_position

    def stamped_batches(self, since_position: int) -> list[BatchHeader]:
        """Headers of the retained batches at or after ``since_position`` whose
        ``broker_reserved`` field is set, in append order."""
        with self._lock:
            self._check_open()
            found = [
                (b.position, b.data)
                for q in self._queues.values()
                for pl in q.partitions
                for b in pl.batches
                if b.position >= since_position
            ]
        found.sort()
        return [h for h in (decode_header(data) for _, data in found) if h.broker_reserved]

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
        shares no bit with ``tag_mask`` (when non-zero) are skipped.
        """
        check_int_arg(offset, "an offset")
        q = self._usable_queue(queue)
        pl = self._partition(q, partition)
        with self._lock:
            self._check_open()
            start = self._effective_start(q, pl, self._now_ms())
            end = pl.end_offset
            stop = end if end_offset is None else min(end_offset, end)
            cur = max(offset, start)
            batches = pl.batches
            i = bisect_right(batches, cur, key=_end)
            out: list[bytes] = []
            total = 0
            while i < len(batches) and cur < stop and total < max_bytes:
                b = batches[i]
                i += 1
                if b.base_offset >= stop:
                    cur = stop
                    break
                cur = max(cur, b.end_offset)
                if tag_mask and not b.tag_mask & tag_mask:
                    continue  # the reader asks again from cur
                out.append(b.data)
                total += len(b.data)
            return FetchResult(out, cur, start, end)

    def end_offset(self, queue: str, partition: int) -> int:
        """The next offset the partition will assign."""
        return self._partition(self._queue(queue), partition).end_offset

    def offset_for_time(self, queue: str, partition: int, timestamp_ms: int) -> int:
        """The first offset appended at or after ``timestamp_ms`` (the end offset if none)."""
        q = self._usable_queue(queue)
        pl = self._partition(q, partition)
        with self._lock:
            self._check_open()
            return max(self._time_position(pl, timestamp_ms), self._effective_start(q, pl, self._now_ms()))

    def lookup_id(self, queue_id: int, partition: int, offset: int) -> tuple[str, bytes]:
        """(queue name, the stored batch holding the message) for a message id."""
        q = self._by_id.get(queue_id)
        if q is None:
            raise MessageNotFoundError(f"no queue has id {queue_id} (was it deleted?)")
        name = q.name
        q = self._usable_queue(name)
        pl = self._partition(q, partition)
        with self._lock:
            start = self._effective_start(q, pl, self._now_ms())
            if not start <= offset < pl.end_offset:
                raise MessageNotFoundError(
                    f"offset {offset} of {name}[{partition}] is not retained (retained: {start}..{pl.end_offset - 1})"
                    if start < pl.end_offset
                    else f"offset {offset} of {name}[{partition}] is not retained (the partition is empty)"
                )
            return name, pl.batches[bisect_right(pl.batches, offset, key=_end)].data

    def lookup_key(
        self, queue: str, key: bytes, start_ms: int | None = None, end_ms: int | None = None, limit: int = 1000
    ) -> list[bytes]:
        """Stored batches that may hold messages with ``key`` appended in [start_ms, end_ms),
        in append order. Found through key hashes, as in the log: the caller keeps the
        messages whose key is exactly ``key``."""
        if not isinstance(key, bytes):
            raise InvalidArgumentError(f"a key is bytes, got {type(key).__name__}")
        q = self._usable_queue(queue)
        h = crc32c(key)
        lo = start_ms if start_ms is not None else -(2**62)
        hi = end_ms if end_ms is not None else 2**62
        with self._lock:
            self._check_open()
            now = self._now_ms()
            found: list[tuple[int, bytes]] = []
            for pl in q.partitions:
                start = self._effective_start(q, pl, now)
                found += [
                    (b.position, b.data)
                    for b in pl.batches
                    if h in b.key_hashes and b.end_offset > start and lo <= b.timestamp_ms < hi
                ]
        found.sort()
        return [data for _, data in found[:limit]]

    # -- retention, stats, closing ------------------------------------------------------

    def enforce_retention(self) -> int:
        """Drop the batches no reader may see any more (truncated, deleted before, past
        their TTL) and expired producer state; return how many batches went."""
        with self._lock:
            if self._closed:
                return 0
            return self._enforce_retention_locked(self._now_ms(), expired=True)

    def _enforce_retention_locked(self, now_ms: int, *, expired: bool) -> int:
        dropped = 0
        for q in self._queues.values():
            for pl in q.partitions:
                if expired:
                    pl.start_offset = self._effective_start(q, pl, now_ms)
                n = bisect_right(pl.batches, pl.start_offset, key=_end)
                if n:
                    del pl.batches[:n]
                    dropped += n
        self._producers.expire(now_ms)
        return dropped

    def stats(self) -> dict[str, int]:
        """The figures ``status`` shows; a store in memory has no segments and no fsyncs."""
        with self._lock:
            user = [q for n, q in self._queues.items() if not is_internal_queue(n)]
            return {
                "segments": 0,
                "bytes": sum(len(b.data) for q in self._queues.values() for pl in q.partitions for b in pl.batches),
                "open_segments": 0,
                "queues": len(user),
                "partitions": sum(len(q.partitions) for q in user),
                "internal_queues": len(self._queues) - len(user),
                "fsyncs": 0,
                "page_cache_keep_bytes": 0,
                "uncached_bytes": 0,
            }

    def close(self) -> None:
        """Close the store: every later call raises ClosedError."""
        with self._lock:
            self._closed = True

    def __enter__(self) -> MemoryStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


if TYPE_CHECKING:  # mypy checks here that a MemoryStore is a Store

    def _is_a_store(store: MemoryStore) -> Store:
        return store


class EmptyDirectoryStore(MemoryStore):
    """A read-only open of an empty data directory: a store with no queues, held in memory,
    so that reading writes nothing there (a read-write open makes a new store in it:
    catalog, log, lock). Every write raises ReadOnlyStoreError, as a read-only LogStore's;
    the broker's own internal queues exist, in memory, as on any new store."""

    def __init__(
        self, path: Path, config: StoreConfig | None = None, *, clock: Callable[[], float] = time.time
    ) -> None:
        super().__init__(config, clock=clock)
        self.read_only = True
        self._path = path

    @property
    def path(self) -> Path:
        """The empty data directory this store stands for."""
        return self._path

    def create_queue(
        self, name: str, config: QueueConfig, *, internal: bool = False, queue_id: int | None = None
    ) -> QueueInfo:
        if not internal:
            raise read_only_refusal(self._path)
        return super().create_queue(name, config, internal=internal, queue_id=queue_id)

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise read_only_refusal(self._path)

    delete_before = reset_partition = rewind_partition = delete_queue = truncate_queue = _refuse
    set_queue_enabled = alter_queue = add_partitions = _refuse
    append = append_nowait = append_copy = append_stamped = _refuse
