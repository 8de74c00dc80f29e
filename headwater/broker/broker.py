"""Broker: the :class:`~headwater.model.service.BrokerService` over one store.

Embedded mode is this object used in-process (``headwater.open``); the network server puts
the same object behind a socket (``headwater.broker.server``). Consumer offsets, groups,
delay and transactions compose here, above storage, so the store stays a log engine.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

from headwater._version import __version__
from headwater.broker.offsets import OffsetStore
from headwater.errors import InvalidArgumentError
from headwater.model.config import QueueConfig, QueueInfo
from headwater.model.service import FetchResult, ProduceResult
from headwater.storage.store import LogStore, StoreConfig

__all__ = ["Broker"]


def _user_queue(name: str) -> str:
    if isinstance(name, str) and name.startswith("__"):
        raise InvalidArgumentError(f"queue {name!r}: names starting with '__' belong to the broker")
    return name


class Broker:
    """Serves one data directory. Thread-safe."""

    def __init__(self, store: LogStore) -> None:
        self.store = store
        self._started = time.monotonic()
        self.offsets = OffsetStore(store)
        # long polling in-process: fetchers wait on this until an append wakes them
        self._appended = threading.Condition()
        self._waiting = 0
        store.add_append_listener(self._on_append)

    @classmethod
    def open(cls, path: str | Path, config: StoreConfig | None = None, *,
             clock: Callable[[], float] = time.time) -> Broker:
        store = LogStore(path, config, clock=clock)
        try:
            return cls(store)
        except BaseException:
            store.close()
            raise

    def add_append_listener(self, fn: Callable[[str, int, int], None]) -> None:
        """Call ``fn(queue, partition, end_offset)`` after every append, from the appending
        thread (keep it quick: hand work to another thread or loop)."""
        self.store.add_append_listener(fn)

    def _on_append(self, queue: str, partition: int, end_offset: int) -> None:
        if self._waiting:  # appends nobody waits for cost one attribute read
            with self._appended:
                self._appended.notify_all()

    # admin
    def create_queue(self, name: str, config: QueueConfig) -> QueueInfo:
        return self.store.create_queue(_user_queue(name), config)

    def describe_queue(self, name: str) -> QueueInfo:
        return self.store.describe_queue(_user_queue(name))

    def list_queues(self) -> list[QueueInfo]:
        return self.store.list_queues()

    def delete_queue(self, name: str) -> None:
        self.store.delete_queue(_user_queue(name))

    def truncate_queue(self, name: str) -> QueueInfo:
        info = self.store.truncate_queue(_user_queue(name))
        self.store.enforce_retention()
        return info

    def set_queue_enabled(self, name: str, enabled: bool) -> QueueInfo:
        return self.store.set_queue_enabled(_user_queue(name), enabled)

    def add_partitions(self, name: str, partitions: int) -> QueueInfo:
        return self.store.add_partitions(_user_queue(name), partitions)

    # data
    def produce(self, queue: str, partition: int, batch: bytes) -> ProduceResult:
        return self.store.append(_user_queue(queue), partition, batch)

    def produce_nowait(self, queue: str, partition: int, batch: bytes) -> tuple[ProduceResult, int | None]:
        """Append without waiting for the fsync; see :meth:`LogStore.append_nowait`."""
        return self.store.append_nowait(_user_queue(queue), partition, batch)

    def wait_durable(self, position: int) -> None:
        self.store.wait_durable(position)

    def fetch(self, queue: str, partition: int, offset: int, *, max_bytes: int, tag_mask: int = 0,
              end_offset: int | None = None, max_wait_ms: int = 0) -> FetchResult:
        """Batches from ``offset`` on; with ``max_wait_ms`` wait that long for data to arrive."""
        _user_queue(queue)
        deadline = time.monotonic() + max_wait_ms / 1000
        while True:
            res = self.store.fetch(queue, partition, offset, max_bytes=max_bytes, tag_mask=tag_mask,
                                   end_offset=end_offset)
            remaining = deadline - time.monotonic()
            if res.batches or res.next_offset != offset or remaining <= 0 or (
                end_offset is not None and offset >= end_offset
            ):
                return res
            with self._appended:
                self._waiting += 1
                try:
                    if self.store.end_offset(queue, partition) <= offset:
                        self._appended.wait(remaining)
                finally:
                    self._waiting -= 1

    def lookup_id(self, queue_id: int, partition: int, offset: int) -> tuple[str, bytes]:
        name, batch = self.store.lookup_id(queue_id, partition, offset)
        _user_queue(name)
        return name, batch

    def lookup_key(self, queue: str, key: bytes, start_ms: int | None, end_ms: int | None,
                   limit: int) -> list[bytes]:
        return self.store.lookup_key(_user_queue(queue), key, start_ms, end_ms, limit)

    def offset_for_time(self, queue: str, partition: int, timestamp_ms: int) -> int:
        return self.store.offset_for_time(_user_queue(queue), partition, timestamp_ms)

    # consumer offsets
    def commit_offsets(self, group: str, queue: str, offsets: dict[int, int]) -> None:
        self.offsets.commit(group, _user_queue(queue), offsets)

    def fetch_offsets(self, group: str, queue: str) -> dict[int, int]:
        return self.offsets.fetch(group, _user_queue(queue))

    # operations
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
