"""LogAdmin: create, describe, list, delete, truncate, disable and grow the queues of a
:class:`~headwater.storage.store.LogStore`, and reset an empty partition's offsets; every
change is saved in the catalog before it counts (or undone in memory if the save fails)."""

from __future__ import annotations

import logging
from typing import Any

from headwater.errors import (
    InvalidArgumentError,
)
from headwater.model.config import (
    QueueConfig,
    QueueInfo,
    altered_config,
)
from headwater.storage.catalog import QueueEntry
from headwater.storage.log_state import LogStoreBase, PartitionState, QueueState
from headwater.storage.queue_table import QueueTable
from headwater.storage.quotas import check_added_partitions

__all__ = ["LogAdmin"]

log = logging.getLogger("headwater.storage")


class LogAdmin(QueueTable, LogStoreBase):
    """The admin part of :class:`~headwater.storage.store.LogStore`."""

    def create_queue(
        self, name: str, config: QueueConfig, *, internal: bool = False, queue_id: int | None = None
    ) -> QueueInfo:
        """Create a queue. ``internal`` queues (the broker's own, named ``__...``) are hidden
        from :meth:`list_queues`. ``queue_id`` is the id a cluster's controller allocated
        (every broker creates the queue under it): it must be free, here and in the log (a
        deleted queue's batches that retention has not reclaimed yet keep theirs); without
        it the queue takes the store's next id, which always stays past every id given."""
        self._check_new_queue(name, config, internal)
        self._check_queue_id_arg(queue_id)
        with self._lock:
            self._check_room_locked(name, config)
            next_id = self._catalog.next_queue_id
            qid, self._catalog.next_queue_id = self._take_queue_id_locked(name, queue_id, next_id)
            if queue_id is not None and self._id_in_log(qid):
                self._catalog.next_queue_id = next_id
                raise InvalidArgumentError(
                    f"cannot create queue {name!r} with id {qid}: the log still holds batches of a deleted "
                    f"queue with that id (until retention reclaims their segments); choose another id"
                )
            now = self._now_ms()
            entry = QueueEntry(
                name=name, queue_id=qid, config=config, created_ms=now, start_offsets=[0] * config.partitions
            )
            self._catalog.queues[name] = entry
            q = QueueState(entry)
            self._queues[name] = q
            self._by_id[entry.queue_id] = q

            def undo() -> None:
                del self._queues[name], self._by_id[entry.queue_id], self._catalog.queues[name]
                self._catalog.next_queue_id = next_id

            self._save_catalog_or_undo(undo)
            log.info("created queue %s (id %d, %d partitions)", name, entry.queue_id, config.partitions)
            return self._info(q, now)

    def _id_in_log(self, queue_id: int) -> bool:
        """Whether a segment holds batches with this queue id (of a deleted queue: a new
        queue with its id would take them for its own, and their offsets for its)."""
        if any(qid == queue_id for qid, _ in self._active_index.partitions):
            return True
        return any(key[0] == queue_id for summary in self._summaries.values() for key, _end, _ts in summary)

    def reset_partition(self, queue: str, partition: int, offset: int) -> None:
        """Make an empty partition (nothing retained: start == end) begin at ``offset``, not
        below its end offset (offsets are never reused), so that a copy from a store whose
        log begins there keeps its offsets (:meth:`append_copy`). Saved in the catalog
        before it counts: after a crash the partition's end offset is still ``offset``."""
        with self._lock:
            self._check_open()
            q = self._queue(queue)
            pl = self._partition(q, partition)
            start = self._effective_start(q, partition, self._now_ms())
            self._check_reset(queue, partition, start, pl.end_offset, offset)
            old = (pl.start_offset, pl.end_offset)
            pl.start_offset = pl.end_offset = offset
            pl.expiry = None

            def undo() -> None:
                pl.start_offset, pl.end_offset = old

            self._save_catalog_or_undo(undo)

    def rewind_partition(self, queue: str, partition: int, offset: int, last_batch: bytes | None = None) -> None:
        """Make an emptied partition (start == end, as after a move away) begin at ``offset``,
        below its end, for a copy from a store whose log begins there (a partition moved back
        to a broker that held it before). When the batches kept here from before reach from
        ``offset`` to the end without a gap and ``last_batch`` (the other store's batch at
        the end offset - 1) is the same as the one kept, they are served again from
        ``offset``; when none kept ends past ``offset``, the partition begins there empty.
        Anything else is refused: offsets are never reused for other messages. Saved in the
        catalog before it counts."""
        with self._lock:
            self._check_open()
            q = self._queue(queue)
            pl = self._partition(q, partition)
            end = pl.end_offset
            self._check_rewind(queue, partition, self._effective_start(q, partition, self._now_ms()), end, offset)
            if offset == end:
                return
            kept = bool(pl.spans) and pl.spans[-1].end_offset > offset
            if kept:
                covered, mine = self._kept_since(q, partition, offset)
                self._check_kept(queue, partition, offset, end, covered, mine, last_batch)
            old = (pl.start_offset, pl.end_offset)
            pl.start_offset, pl.end_offset = offset, (end if kept else offset)
            pl.expiry = None
            if not kept:
                self._last.drop((q.entry.queue_id, partition))  # a copy of a batch past the new end

            def undo() -> None:
                pl.start_offset, pl.end_offset = old

            self._save_catalog_or_undo(undo)
            log.info("rewound %s[%d] from offset %d to %d", queue, partition, end, offset)

    def _kept_since(self, q: QueueState, partition: int, offset: int) -> tuple[int, bytes]:
        """(how many offsets from ``offset`` on the partition's batches hold, its last batch
        as stored); under the lock, for a rewind: the counts add up in C, one slice a span."""
        key = (q.entry.queue_id, partition)
        covered = 0
        for sp in reversed(q.partitions[partition].spans):
            if sp.end_offset <= offset:
                break
            pe = self._index(sp.segment_base).partitions[key]
            i = pe.index_of_offset(offset)
            covered += sum(pe.counts[i:])
            if i < len(pe) and pe.offsets[i] < offset:
                covered -= offset - pe.offsets[i]  # the batch holding offset begins before it
        last = q.partitions[partition].spans[-1]
        pe = self._index(last.segment_base).partitions[key]
        seg = self._segments[last.segment_base]
        self._touch_segment(seg)
        with seg.reading():
            return covered, seg.read(pe.positions[-1], pe.sizes[-1])

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

    def alter_queue(self, name: str, changes: dict[str, Any]) -> QueueInfo:
        """Change the queue's ttl_s, message_bytes_max or flush (saved in the catalog)."""
        with self._lock:
            self._check_open()
            q = self._queue(name)
            config, q.entry.config = q.entry.config, altered_config(q.entry.config, changes)
            self._save_catalog_or_undo(lambda: setattr(q.entry, "config", config))
            log.info("altered queue %s: %s", name, changes)
            return self._info(q, self._now_ms())

    def add_partitions(self, name: str, partitions: int) -> QueueInfo:
        """Grow the queue to ``partitions`` partitions (never shrink: keys would move)."""
        with self._lock:
            self._check_open()
            q = self._queue(name)
            now_n = len(q.partitions)
            check_added_partitions(self.config, name, now_n, partitions, self._partitions_held())
            config, q.entry.config = q.entry.config, q.entry.config.replace(partitions=partitions)
            q.partitions.extend(PartitionState(0) for _ in range(partitions - now_n))

            def undo() -> None:
                q.entry.config = config
                del q.partitions[now_n:]

            self._save_catalog_or_undo(undo)
            return self._info(q, self._now_ms())
