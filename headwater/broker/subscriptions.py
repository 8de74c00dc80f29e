"""SubscriberRegistry: the broker's durable registry of push subscribers and their checkpoints.

One record per subscriber in the internal table ``__subscribers``
(:class:`~headwater.broker.table.DurableTable`), keyed by (queue id, name): a deleted queue
takes its subscribers with it. The record holds what ``headwater subscriber add`` set
(partitions, tags) and the checkpoints, rewritten durably by each checkpoint. The rules
(names, start positions, what a checkpoint may say) are :mod:`headwater.model.subscription`;
delivery is :mod:`headwater.broker.push` (network) or the client's pull loop (embedded).

Thread-safety: one lock; every change returns once durable.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import msgspec

from headwater.broker.table import DurableTable
from headwater.errors import SubscriberExistsError, SubscriberNotFoundError
from headwater.model.config import QueueInfo
from headwater.model.subscription import (
    SubscriberInfo,
    check_checkpoint,
    normalize_partitions,
    normalize_tags,
    resolve_start,
    validate_subscriber_name,
)
from headwater.storage.api import Store

__all__ = ["SubscriberRegistry", "SUBSCRIBERS_QUEUE"]

SUBSCRIBERS_QUEUE = "__subscribers"
_decoder = msgspec.msgpack.Decoder(SubscriberInfo)
_encoder = msgspec.msgpack.Encoder()


class SubscriberRegistry:
    """Every subscriber of one store. Thread-safe. ``on_change(queue, name)`` listeners hear
    of deletions (the push service ends the subscriber's stream)."""

    def __init__(self, store: Store, *, clock: Callable[[], float] = time.time) -> None:
        self._store = store
        self._clock = clock
        self._lock = threading.Lock()
        self._table = DurableTable(store, SUBSCRIBERS_QUEUE, keep=self._live_keys)
        self._listeners: list[Callable[[str, str], None]] = []

    def add_delete_listener(self, fn: Callable[[str, str], None]) -> None:
        self._listeners.append(fn)

    def _live_keys(self):  # noqa: ANN202 - the DurableTable compaction hook
        live = {str(q.queue_id).encode() for q in self._store.list_queues()}
        return lambda key: key.split(b"\x00", 2)[1] in live

    @staticmethod
    def _key(qi: QueueInfo, name: str) -> bytes:
        return b"s\x00%d\x00%s" % (qi.queue_id, name.encode())

    def _existing(self, qi: QueueInfo, name: str) -> tuple[bytes, SubscriberInfo]:
        validate_subscriber_name(name)
        k = self._key(qi, name)
        raw = self._table.get(k)
        if raw is None:
            raise SubscriberNotFoundError(
                f"queue {qi.name!r} has no subscriber {name!r}; add it with 'headwater subscriber add {qi.name} {name}'"
            )
        return k, _decoder.decode(raw)

    def add(
        self,
        queue: str,
        name: str,
        partitions: list[int] | None = None,
        tags: list[str] | None = None,
        start: str = "latest",
    ) -> SubscriberInfo:
        validate_subscriber_name(name)
        tag_list = normalize_tags(tags)
        with self._lock:
            qi = self._store.describe_queue(queue)
            parts = normalize_partitions(partitions, len(qi.partitions), queue)
            k = self._key(qi, name)
            if self._table.get(k) is not None:
                raise SubscriberExistsError(
                    f"queue {queue!r} already has a subscriber {name!r} (its checkpoint is kept); "
                    f"delete it first to start over, or pick another name"
                )
            following = parts if parts is not None else list(range(len(qi.partitions)))
            checkpoints = resolve_start(start, qi, following, lambda p, ms: self._store.offset_for_time(queue, p, ms))
            info = SubscriberInfo(
                queue=queue,
                name=name,
                partitions=parts,
                tags=tag_list,
                created_ms=int(self._clock() * 1000),
                checkpoints=checkpoints,
            )
            self._table.put({k: _encoder.encode(info)})
            return info

    def delete(self, queue: str, name: str) -> None:
        with self._lock:
            qi = self._store.describe_queue(queue)
            k, _ = self._existing(qi, name)
            self._table.put({k: None})
        for fn in self._listeners:
            fn(queue, name)

    def describe(self, queue: str, name: str) -> SubscriberInfo:
        qi = self._store.describe_queue(queue)
        return self._existing(qi, name)[1]

    def list(self, queue: str | None = None) -> list[SubscriberInfo]:
        queues = [self._store.describe_queue(queue)] if queue is not None else self._store.list_queues()
        out = []
        for qi in queues:
            prefix = b"s\x00%d\x00" % qi.queue_id
            out.extend(_decoder.decode(v) for _, v in self._table.items(prefix))
        return sorted(out, key=lambda s: (s.queue, s.name))

    def checkpoint(self, queue: str, name: str, offsets: dict[int, int]) -> SubscriberInfo:
        """Store ``{partition: next offset to deliver}`` durably; the subscriber after it."""
        with self._lock:
            qi = self._store.describe_queue(queue)
            k, info = self._existing(qi, name)
            ranges = {p.partition: (p.start_offset, p.end_offset) for p in qi.partitions}
            checkpoints = check_checkpoint(info, offsets, ranges)
            if checkpoints == info.checkpoints:
                return info
            info = msgspec.structs.replace(info, checkpoints=checkpoints)
            self._table.put({k: _encoder.encode(info)})
            return info
