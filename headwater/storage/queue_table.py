"""What both stores do alike with their table of queues: check a queue to create and the
id it gets, describe and list queues, count the partitions they hold (the quotas' count),
and check a partition reset or a copied batch (for a cluster's moves), so that both stores
refuse the same mistakes in the same words.

A mixin of :class:`~headwater.storage.store.LogStore` and
:class:`~headwater.storage.memory.MemoryStore`: each keeps ``_queues`` (name to its own
queue state, which has ``partitions``) and ``_lock``, and says what a queue's
:class:`QueueInfo` is (``_info``). Thread-safety: under the store's lock, as the rest.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from headwater.errors import InvalidArgumentError, InvalidBatchError, QueueExistsError
from headwater.model.batch import BatchHeader, crc32c
from headwater.model.checks import check_int_arg
from headwater.model.config import (
    INTERNAL_PREFIX,
    PartitionBounds,
    QueueConfig,
    QueueInfo,
    is_internal_queue,
    validate_queue_name,
)
from headwater.storage.quotas import check_new_queue
from headwater.storage.settings import StoreConfig

__all__ = ["QueueTable", "QUEUE_ID_MAX", "OFFSET_MAX"]

QUEUE_ID_MAX = 2**32 - 1  # batches and message ids carry a queue id in 4 bytes
OFFSET_MAX = 2**62  # far beyond any log, and an offset plus a batch's count stays an int64


class QueueTable:
    _queues: dict[str, Any]
    _lock: threading.RLock
    config: StoreConfig

    if TYPE_CHECKING:  # each store's own; declared here for the type checker only

        def _check_open(self) -> None: ...
        def _now_ms(self) -> int: ...
        def _queue(self, name: str) -> Any: ...
        def _info(self, q: Any, now_ms: int) -> QueueInfo: ...
        def _bounds(self, q: Any, partitions: Iterable[int], now_ms: int) -> PartitionBounds: ...
        def queue_name(self, queue_id: int) -> str | None: ...

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

    @staticmethod
    def _check_queue_id_arg(queue_id: object) -> None:
        """Refuse a ``queue_id`` given to create_queue that is not None or an id that fits."""
        if queue_id is None:
            return
        check_int_arg(queue_id, "a queue id")
        assert isinstance(queue_id, int)
        if not 1 <= queue_id <= QUEUE_ID_MAX:
            raise InvalidArgumentError(f"a queue id is 1..{QUEUE_ID_MAX}, got {queue_id}")

    def _take_queue_id_locked(self, name: str, queue_id: int | None, next_id: int) -> tuple[int, int]:
        """(the new queue's id, the store's next automatic id after it). A given id must be
        free; the next automatic id moves past it, so later ones never collide with it."""
        if queue_id is None:
            if next_id > QUEUE_ID_MAX:
                raise InvalidArgumentError(
                    f"cannot create queue {name!r}: this store has given out every queue id up to "
                    f"{QUEUE_ID_MAX}; create it with a free queue_id"
                )
            return next_id, next_id + 1
        other = self.queue_name(queue_id)
        if other is not None:
            raise InvalidArgumentError(
                f"cannot create queue {name!r} with id {queue_id}: queue {other!r} of this store has "
                f"that id; choose another id (or delete {other!r} first)"
            )
        return queue_id, max(next_id, queue_id + 1)

    @staticmethod
    def _check_reset(queue: str, partition: int, start: int, end: int, offset: int) -> None:
        """Refuse to reset ``queue[partition]`` (retained from ``start`` to ``end``) to
        ``offset`` unless it is empty and ``offset`` is not below its end."""
        check_int_arg(offset, "an offset")
        if start != end:
            raise InvalidArgumentError(
                f"cannot reset {queue}[{partition}]: it holds offsets {start}..{end - 1}, and a reset "
                f"needs an empty partition (delete_before({end}) empties it)"
            )
        if not end <= offset <= OFFSET_MAX:
            raise InvalidArgumentError(
                f"cannot reset {queue}[{partition}] to offset {offset}: offsets are never reused, so "
                f"it goes forward only, from its end offset {end} to at most {OFFSET_MAX}"
            )

    @staticmethod
    def _check_rewind(queue: str, partition: int, start: int, end: int, offset: int) -> None:
        """Refuse to rewind ``queue[partition]`` (retained from ``start`` to ``end``) to
        ``offset`` unless it is empty and ``offset`` is not past its end."""
        check_int_arg(offset, "an offset")
        if start != end:
            raise InvalidArgumentError(
                f"cannot rewind {queue}[{partition}]: it holds offsets {start}..{end - 1}, and a rewind "
                f"needs an empty partition (delete_before({end}) empties it)"
            )
        if not 0 <= offset <= end:
            raise InvalidArgumentError(
                f"cannot rewind {queue}[{partition}] to offset {offset}: a rewind goes back, from its end "
                f"offset {end} to at least 0 (reset_partition goes forward)"
            )

    @staticmethod
    def _check_kept(
        queue: str, partition: int, offset: int, end: int, covered: int, mine: bytes, theirs: bytes | None
    ) -> None:
        """Refuse to serve again the batches ``queue[partition]`` keeps from ``offset`` to
        ``end`` (holding ``covered`` offsets of them; ``mine``, the last) unless they hold
        every offset there and ``theirs``, the other store's batch at ``end - 1``, is the same."""
        if covered != end - offset:
            raise InvalidArgumentError(
                f"cannot rewind {queue}[{partition}] to offset {offset}: it keeps {covered} of offsets "
                f"{offset}..{end - 1} from before, not all, and offsets are never reused"
            )
        if theirs is None or bytes(theirs) != mine:
            why = "was not given" if theirs is None else "differs from the one kept here"
            raise InvalidArgumentError(
                f"cannot rewind {queue}[{partition}] to offset {offset}: it keeps offsets {offset}..{end - 1} "
                f"from before, and the other log's batch holding offset {end - 1} {why} (the logs differ)"
            )

    @staticmethod
    def _check_copy(
        queue: str,
        partition: int,
        h: BatchHeader,
        queue_id: int,
        end: int,
        base_offset: int,
        last_ts: int | None,
    ) -> None:
        """Refuse a copied batch (``h``) unless it continues ``queue[partition]`` (id
        ``queue_id``, end offset ``end``, newest append time ``last_ts``) exactly where it
        was in its source: at ``base_offset``, with the broker fields it had there."""
        if base_offset != end:
            hole = "a gap" if base_offset > end else "an overlap"
            raise InvalidArgumentError(
                f"a copied batch of {queue}[{partition}] must begin at its end offset {end}, got "
                f"base_offset {base_offset} ({hole}); copy the batches in order from {end} on"
            )
        if (h.queue_id, h.partition, h.base_offset) != (queue_id, partition, base_offset):
            raise InvalidBatchError(
                f"the copied batch was stored as queue id {h.queue_id} partition {h.partition} offset "
                f"{h.base_offset}, not as {queue}[{partition}] (queue id {queue_id}) at offset "
                f"{base_offset}: create the queue with its source's queue_id and copy each partition "
                f"into the same partition"
            )
        if last_ts is not None and h.timestamp_ms < last_ts:
            raise InvalidBatchError(
                f"the copied batch at offset {base_offset} was appended at {h.timestamp_ms} ms, before "
                f"the last batch of {queue}[{partition}] ({last_ts} ms): append times never go back "
                f"along a partition; copy from one source, in order"
            )

    @staticmethod
    def _check_copied_header(batch: bytes | bytearray, h: BatchHeader) -> None:
        """Refuse a copied batch whose broker fields (set by its source) fail their checksum:
        they are stored as they are, append time included."""
        if crc32c(batch[8:40]) != h.header_crc:
            raise InvalidBatchError(
                "batch header checksum mismatch: the copied batch was damaged (or is a producer's "
                "batch, not one a fetch returned)"
            )

    def _partitions_held(self) -> int:
        return sum(len(q.partitions) for q in self._queues.values())

    def describe_queue(self, name: str) -> QueueInfo:
        with self._lock:
            self._check_open()
            return self._info(self._queue(name), self._now_ms())

    def describe_partitions(self, name: str, partitions: Iterable[int]) -> PartitionBounds:
        """What :meth:`describe_queue` says of ``partitions`` alone (those the queue has):
        a check of a few partitions of a queue of 10,000 costs the few."""
        with self._lock:
            self._check_open()
            return self._bounds(self._queue(name), partitions, self._now_ms())

    def list_queues(self, *, include_internal: bool = False) -> list[QueueInfo]:
        with self._lock:
            self._check_open()
            now = self._now_ms()
            return [
                self._info(q, now)
                for name, q in sorted(self._queues.items())
                if include_internal or not is_internal_queue(name)
            ]
