"""Broker: the :class:`~headwater.model.service.BrokerService` over one store.

Embedded mode is this object used in-process (``headwater.open``); the network server
(a later layer of this package) puts the same object behind a socket. Consumer groups,
delay and transactions compose here, above storage, so the store stays a log engine.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from headwater._version import __version__
from headwater.model.config import QueueConfig, QueueInfo
from headwater.model.service import FetchResult, ProduceResult
from headwater.storage.store import LogStore, StoreConfig

__all__ = ["Broker"]


class Broker:
    """Serves one data directory. Thread-safe."""

    def __init__(self, store: LogStore) -> None:
        self.store = store
        self._started = time.monotonic()

    @classmethod
    def open(cls, path: str | Path, config: StoreConfig | None = None, *,
             clock: Callable[[], float] = time.time) -> Broker:
        return cls(LogStore(path, config, clock=clock))

    # admin
    def create_queue(self, name: str, config: QueueConfig) -> QueueInfo:
        return self.store.create_queue(name, config)

    def describe_queue(self, name: str) -> QueueInfo:
        return self.store.describe_queue(name)

    def list_queues(self) -> list[QueueInfo]:
        return self.store.list_queues()

    def delete_queue(self, name: str) -> None:
        self.store.delete_queue(name)

    def truncate_queue(self, name: str) -> QueueInfo:
        info = self.store.truncate_queue(name)
        self.store.enforce_retention()
        return info

    def set_queue_enabled(self, name: str, enabled: bool) -> QueueInfo:
        return self.store.set_queue_enabled(name, enabled)

    def add_partitions(self, name: str, partitions: int) -> QueueInfo:
        return self.store.add_partitions(name, partitions)

    # data
    def produce(self, queue: str, partition: int, batch: bytes) -> ProduceResult:
        return self.store.append(queue, partition, batch)

    def fetch(self, queue: str, partition: int, offset: int, *, max_bytes: int, tag_mask: int = 0,
              end_offset: int | None = None) -> FetchResult:
        return self.store.fetch(queue, partition, offset, max_bytes=max_bytes, tag_mask=tag_mask,
                                end_offset=end_offset)

    def lookup_id(self, queue_id: int, partition: int, offset: int) -> tuple[str, bytes]:
        return self.store.lookup_id(queue_id, partition, offset)

    def lookup_key(self, queue: str, key: bytes, start_ms: int | None, end_ms: int | None,
                   limit: int) -> list[bytes]:
        return self.store.lookup_key(queue, key, start_ms, end_ms, limit)

    def offset_for_time(self, queue: str, partition: int, timestamp_ms: int) -> int:
        return self.store.offset_for_time(queue, partition, timestamp_ms)

    def status(self) -> dict[str, object]:
        return {
            "version": __version__,
            "mode": "embedded",
            "data_dir": str(self.store.path),
            "uptime_s": round(time.monotonic() - self._started, 3),
            **self.store.stats(),
            "recovery": list(self.store.recovery_report),
        }

    def flush(self) -> None:
        self.store.flush()

    def close(self) -> None:
        self.store.close()
