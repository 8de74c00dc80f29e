"""DurableTable: a small key -> value table kept in an internal queue of the store.

Keyed groups and push subscribers keep their state here (group size, barriers and member
positions; the subscriber registry and checkpoints). It is :class:`OffsetStore`'s scheme with
byte values instead of offsets: each ``put`` appends one batch to the internal queue (one
partition, no TTL, sync flush) holding one message per key changed, the key as the
message key and the value as its body; an empty body deletes the key. The latest value of
each key is kept in memory; on open the queue is read back. When the log holds many more
records than live keys, the live table is appended again and the queue's start moved to it,
so the log stays a small multiple of the table.

Why not :class:`~headwater.broker.offsets.OffsetStore` itself: its values are offsets, its
keys are (group, queue, partition) and its names are those of user groups, while this state
holds structured values that change together. One ``put`` of several keys is one batch, and a
batch is appended whole or not at all, so a change of several keys (a resize completing, a
subscriber deleted) survives a crash entirely or not at all.

Thread-safety: all methods take the table's lock; ``put`` returns once the batch is durable.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping

from headwater.model.batch import encode_batch
from headwater.model.batch_reads import decode_records
from headwater.model.config import QueueConfig
from headwater.model.message import Message
from headwater.storage.api import Store

__all__ = ["DurableTable"]

_CHUNK = 5_000  # keys per batch when the table is written out whole


class DurableTable:
    """key bytes -> value bytes, durable. ``keep``, when given, is called at each compaction
    and returns the test of whether a key still matters (e.g. its queue still exists).
    ``partition``: the table is that partition of ``queue``, which must exist then (a
    cluster's internal queue keeps one table per partition); the default makes ``queue``
    with one partition at the first start of the store."""

    def __init__(
        self,
        store: Store,
        queue: str,
        partition: int | None = None,
        *,
        keep: Callable[[], Callable[[bytes], bool]] | None = None,
        compact_ratio: int = 4,
        compact_min: int = 2_000,
    ) -> None:
        self._store = store
        self._queue = queue
        self._partition = 0 if partition is None else partition
        self._keep = keep
        self._lock = threading.Lock()
        self._table: dict[bytes, bytes] = {}
        self._compact_ratio = compact_ratio
        self._compact_min = compact_min
        try:
            store.describe_queue(queue)
        except Exception:  # noqa: BLE001 - first start of this store
            if partition is not None:
                raise
            store.create_queue(queue, QueueConfig(partitions=1, ttl_s=None, flush="sync"), internal=True)
        self._appended = self._load()

    def _load(self) -> int:
        start = offset = self._store.describe_queue(self._queue).partitions[self._partition].start_offset
        while True:
            res = self._store.fetch(self._queue, self._partition, offset, max_bytes=4 << 20)
            for b in res.batches:
                for r in decode_records(b, self._queue, start_offset=offset):
                    if r.key is None:
                        continue
                    if r.body:
                        self._table[r.key] = r.body
                    else:
                        self._table.pop(r.key, None)
            if res.next_offset <= offset:
                break
            offset = res.next_offset
        return offset - start

    def get(self, key: bytes) -> bytes | None:
        with self._lock:
            return self._table.get(key)

    def items(self, prefix: bytes = b"") -> list[tuple[bytes, bytes]]:
        """The live entries whose key starts with ``prefix``, sorted by key."""
        with self._lock:
            return sorted((k, v) for k, v in self._table.items() if k.startswith(prefix))

    def put(self, changes: Mapping[bytes, bytes | None]) -> None:
        """Set each key to its value (None deletes it), all at once and durably."""
        if not changes:
            return
        msgs = []
        for k, v in changes.items():
            assert isinstance(k, bytes) and k, "keys are non-empty bytes"
            assert v is None or (isinstance(v, bytes) and v), "values are non-empty bytes or None"
            msgs.append(Message(v or b"", key=k))
        with self._lock:
            self._store.append(self._queue, self._partition, encode_batch(msgs))
            for k, v in changes.items():
                if v is None:
                    self._table.pop(k, None)
                else:
                    self._table[k] = v
            self._appended += len(msgs)
            if self._appended > max(self._compact_min, self._compact_ratio * len(self._table)):
                self._compact()

    def _compact(self) -> None:
        if self._keep is not None:
            wanted = self._keep()
            self._table = {k: v for k, v in self._table.items() if wanted(k)}
        snapshot_at = self._store.end_offset(self._queue, self._partition)
        items = list(self._table.items())
        for i in range(0, len(items), _CHUNK):
            chunk = items[i : i + _CHUNK]
            self._store.append(self._queue, self._partition, encode_batch([Message(v, key=k) for k, v in chunk]))
        self._store.delete_before(self._queue, self._partition, snapshot_at)
        self._appended = len(items)
