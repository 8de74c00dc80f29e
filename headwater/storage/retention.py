"""LogRetention: deleting the sealed segments of a :class:`~headwater.storage.store.LogStore`
that hold nothing live any more (expired by TTL, truncated, of a deleted queue)."""

from __future__ import annotations

import logging

from headwater.errors import (
    StorageError,
)
from headwater.storage.log_state import LogStoreBase
from headwater.storage.segment import segment_name
from headwater.storage.segment_index import SegmentIndex

__all__ = ["LogRetention"]

log = logging.getLogger("headwater.storage")


class LogRetention(LogStoreBase):
    """The retention part of :class:`~headwater.storage.store.LogStore`."""

    def enforce_retention(self) -> int:
        """Delete sealed segments that hold nothing live any more; return how many."""
        deleted = 0
        with self._lock:
            if self._closed or self.read_only:  # a read-only store deletes nothing
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


def _summary(idx: SegmentIndex) -> list[tuple[tuple[int, int], int, int]]:
    return [(key, pe.end_offset, pe.timestamps[-1]) for key, pe in idx.partitions.items()]
