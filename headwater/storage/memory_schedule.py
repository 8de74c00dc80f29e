"""The delay schedule of a store in memory: the same bucket records, in byte strings.

The records are encoded and scanned exactly as on disk (:mod:`headwater.storage.schedule`),
so the delay service runs the same code over both stores; only the bytes stay in memory
and "durable" is immediate. Thread-safety: as :class:`~headwater.storage.schedule.ScheduleFile`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from headwater.errors import CorruptDataError, StorageError
from headwater.storage.schedule import (
    DispatchCheckpoint,
    ScheduleFile,
    bucket_file_name,
    encode_file_header,
)

__all__ = ["MemorySchedule", "MemoryScheduleFile"]


class MemoryScheduleFile(ScheduleFile):
    """One bucket held in a bytearray: a file with no descriptor."""

    def __init__(self, bucket_start_ms: int, bucket_end_ms: int, store_id: bytes, created_ms: int) -> None:
        # the name a file would have (the delay service reports buckets by it), never opened
        super().__init__(Path(bucket_file_name(bucket_start_ms)), bucket_start_ms, bucket_end_ms, 0)
        self._data = bytearray(encode_file_header(bucket_start_ms, bucket_end_ms, store_id, created_ms))
        self.size = len(self._data)

    @property
    def is_open(self) -> bool:
        return not self.deleted

    def close(self) -> None:
        pass  # nothing to let go of: the bytes are the bucket

    def delete(self) -> None:
        with self._lock:
            self.deleted = True
            self._data = bytearray()

    def append(self, parts: list[bytes | bytearray | memoryview]) -> int:
        with self._lock:
            if self.deleted:
                raise StorageError(f"schedule bucket {self.path} was deleted")
            pos = len(self._data)
            for p in parts:
                self._data += p
            self.size = len(self._data)
            return pos

    def read(self, position: int, length: int) -> bytes:
        with self._lock:
            data = bytes(self._data[position : position + length])
        if len(data) != length:
            raise CorruptDataError(f"{self.path} ends before byte {position + length}")
        return data

    def sync(self) -> None:
        pass  # memory: as durable as it gets

    def _cut(self, size: int) -> None:
        with self._lock:
            del self._data[size:]
            self.size = size


class MemorySchedule:
    """The delay schedule of a :class:`~headwater.storage.memory.MemoryStore` (a
    :class:`~headwater.storage.api.ScheduleStore`)."""

    def __init__(self) -> None:
        self._buckets: dict[int, MemoryScheduleFile] = {}
        self._checkpoint: DispatchCheckpoint | None = None
        self._prepared = False

    def exists(self) -> bool:
        return self._prepared

    def prepare(self) -> None:
        self._prepared = True

    def open_buckets(self, store_id: bytes, report: list[str], *, read_only: bool = False) -> Iterator[ScheduleFile]:
        for start in sorted(self._buckets):
            f = self._buckets[start]
            if not f.deleted:
                yield f

    def create_bucket(self, start_ms: int, end_ms: int, store_id: bytes, created_ms: int) -> ScheduleFile:
        f = MemoryScheduleFile(start_ms, end_ms, store_id, created_ms)
        self._buckets[start_ms] = f
        return f

    def read_checkpoint(self) -> DispatchCheckpoint | None:
        return self._checkpoint

    def write_checkpoint(self, ckpt: DispatchCheckpoint) -> None:
        self._checkpoint = ckpt

    def sync_deletes(self) -> None:
        self._buckets = {s: f for s, f in self._buckets.items() if not f.deleted}
