"""What both stores do alike with their table of queues: check a queue to create, describe
and list queues, count the partitions they hold (the quotas' count).

A mixin of :class:`~headwater.storage.store.LogStore` and
:class:`~headwater.storage.memory.MemoryStore`: each keeps ``_queues`` (name to its own
queue state, which has ``partitions``) and ``_lock``, and says what a queue's
:class:`QueueInfo` is (``_info``). Thread-safety: under the store's lock, as the rest.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from headwater.errors import InvalidArgumentError, QueueExistsError
from headwater.model.config import (
    INTERNAL_PREFIX,
    QueueConfig,
    QueueInfo,
    is_internal_queue,
    validate_queue_name,
)
from headwater.storage.quotas import check_new_queue
from headwater.storage.settings import StoreConfig

__all__ = ["QueueTable"]


class QueueTable:
    _queues: dict[str, Any]
    _lock: threading.RLock
    config: StoreConfig

    if TYPE_CHECKING:  # each store's own; declared here for the type checker only

        def _check_open(self) -> None: ...
        def _now_ms(self) -> int: ...
        def _queue(self, name: str) -> Any: ...
        def _info(self, q: Any, now_ms: int) -> QueueInfo: ...

    @staticmethod
    def _check_new_queue(name: str, config: QueueConfig, internal: bool) -> None:
        """Refuse a bad name or config for a new queue (before the lock). ``internal``
        queues (the broker's own) are named ``__...``."""
        if internal:
            if not is_internal_queue(name):
                raise InvalidArgumentError(f"internal queue names start with {INTERNAL_PREFIX!r}, got {name!r}")
            validate_queue_name(name[len(INTERNAL_PREFIX) :])
        else:
            validate_queue_name(name)
        if not isinstance(config, QueueConfig):
            raise InvalidArgumentError(f"config must be a QueueConfig, got {type(config).__name__}")
        config.validated()

    def _check_room_locked(self, name: str, config: QueueConfig) -> None:
        """Refuse a queue that exists already or would pass the partition quotas."""
        self._check_open()
        if name in self._queues:
            raise QueueExistsError(f"queue {name!r} already exists")
        check_new_queue(self.config, name, config.partitions, self._partitions_held())

    def _partitions_held(self) -> int:
        return sum(len(q.partitions) for q in self._queues.values())

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
