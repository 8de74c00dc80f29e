"""SubscriberRegistry: the broker's durable registry of push subscribers and their checkpoints.

One record per subscriber, keyed by (queue id, name): a deleted queue takes its subscribers
with it. The record holds what ``headwater subscriber add`` set (partitions, tags) and the
checkpoints, rewritten durably by each checkpoint. The rules (names, start positions, what
a checkpoint may say) are :mod:`headwater.model.subscription`; delivery is
:mod:`headwater.broker.push` (over the network, a broker alone or each leader of a
cluster) or the client's pull loop (embedded).

Alone, the records are in the internal table ``__subscribers``
(:class:`~headwater.broker.table.DurableTable`). On a cluster (:meth:`join_cluster`;
docs/design/cluster.md, "Subscriptions (built)") subscriber (queue, name) is coordinated
by the leader of its partition of ``__cluster_subscribers``, which alone keeps its record,
in a table of that partition appended inside ``producing(...)`` (a move's fence covers it);
elsewhere its calls are refused with ``NotCoordinatorError``. A start and a checkpoint are
checked against every partition's log as its leader has it. The record's ``epoch`` is
bumped by each claim (:meth:`SubscriberRegistry.claim`, a process about to push on a
cluster); a checkpoint naming an older epoch is refused.

Thread-safety: one lock; every change returns once durable.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import Protocol

import msgspec

from headwater.broker.coordinated import CoordinatedTables
from headwater.broker.table import DurableTable
from headwater.errors import (
    SubscriberExistsError,
    SubscriberNotFoundError,
    UsageError,
)
from headwater.model.cluster import SUBSCRIBER_COORDINATOR_QUEUE, keyed_coordinator_name
from headwater.model.config import PartitionInfo, QueueInfo
from headwater.model.subscription import (
    SubscriberInfo,
    check_checkpoint,
    normalize_partitions,
    normalize_tags,
    replaced_message,
    resolve_start,
    validate_subscriber_name,
)
from headwater.storage.api import Store

__all__ = ["SUBSCRIBERS_QUEUE", "SubscriberPlace", "SubscriberRegistry"]

SUBSCRIBERS_QUEUE = "__subscribers"
_decoder = msgspec.msgpack.Decoder(SubscriberInfo)
_encoder = msgspec.msgpack.Encoder()


class SubscriberPlace(Protocol):
    """What the registry of a broker in a cluster asks of its cluster node."""

    def coordinator_partition(self, group: str, of: str = ...) -> int:
        """The partition of queue ``of`` whose leader coordinates ``group``, if this broker
        does now; else NotCoordinatorError naming the coordinator it knows."""
        ...

    def producing(self, queue: str, partition: int) -> AbstractContextManager[None]:
        """Around an append: refused unless this broker leads it and no move fences it."""
        ...

    def log_ranges(self, queue: QueueInfo, ask_leaders: bool) -> dict[int, tuple[int, int]]:
        """Each partition's (start, end) offsets, from its leader when ``ask_leaders``."""
        ...

    def offset_for_time(self, queue: str, partition: int, timestamp_ms: int) -> int:
        """The first offset of ``queue[partition]`` at or after ``timestamp_ms``, from its leader."""
        ...


class SubscriberRegistry:
    """Every subscriber of one store (alone), or of the subscriber coordinator partitions
    this broker leads (on a cluster). Thread-safe. ``on_change(queue, name)`` listeners hear
    of deletions (the push service ends the subscriber's stream)."""

    def __init__(self, store: Store, *, clock: Callable[[], float] = time.time) -> None:
        self._store = store
        self._clock = clock
        self._lock = threading.Lock()
        self._tables: CoordinatedTables[DurableTable] = CoordinatedTables(
            DurableTable(store, SUBSCRIBERS_QUEUE, keep=self._live_keys),
            lambda n: DurableTable(store, SUBSCRIBER_COORDINATOR_QUEUE, n, keep=self._live_keys),
            SUBSCRIBER_COORDINATOR_QUEUE,
            "subscriber",
        )
        self._place: SubscriberPlace | None = None  # None: a broker alone
        self._listeners: list[Callable[[str, str], None]] = []

    def add_delete_listener(self, fn: Callable[[str, str], None]) -> None:
        self._listeners.append(fn)

    # -- on a cluster ---------------------------------------------------------------------

    def join_cluster(self, place: SubscriberPlace) -> None:
        """From now on keep the cluster's subscriber coordinator queue, of which no
        partition is loaded until the cluster node :meth:`load`\\ s it; ``__subscribers``
        stays on disk, unused."""
        self._place = place
        self._tables.join_cluster(place)

    def load(self, partition: int) -> None:
        """Read ``partition``'s records back from the local log (again, if loaded)."""
        self._tables.load(partition)

    def unload(self, partition: int) -> None:
        """Forget ``partition``'s subscribers: another broker coordinates them now."""
        self._tables.unload(partition)

    def loaded(self) -> set[int]:
        return self._tables.loaded()

    def _table_of(self, queue: str, name: str) -> tuple[int, DurableTable]:
        """The table of the subscriber (on a cluster NotCoordinatorError unless coordinated here)."""
        return self._tables.of(keyed_coordinator_name(queue, name), f"{name!r} of {queue!r}")

    def _save(self, k: int, table: DurableTable, key: bytes, info: SubscriberInfo | None, name: str) -> None:
        with self._tables.writing(k, table, repr(name)):
            table.put({key: None if info is None else _encoder.encode(info)})

    def _located(self, qi: QueueInfo) -> QueueInfo:
        """``qi`` with each partition's log range as its leader has it (alone: as it is)."""
        if self._place is None:
            return qi
        ranges = self._place.log_ranges(qi, ask_leaders=True)
        parts = [PartitionInfo(n, *ranges[n]) for n in range(len(qi.partitions))]
        return msgspec.structs.replace(qi, partitions=parts)

    def _offset_for_time(self, qi: QueueInfo) -> Callable[[int, int], int]:
        place = self._place
        if place is None:
            return lambda partition, ms: self._store.offset_for_time(qi.name, partition, ms)
        return lambda partition, ms: place.offset_for_time(qi.name, partition, ms)

    # -- records --------------------------------------------------------------------------

    def _live_keys(self, queues: Iterable[QueueInfo] | None = None):  # noqa: ANN202 - the DurableTable compaction hook
        live = {str(q.queue_id).encode() for q in (self._store.list_queues() if queues is None else queues)}
        return lambda key: key.split(b"\x00", 2)[1] in live

    @staticmethod
    def _key(qi: QueueInfo, name: str) -> bytes:
        return b"s\x00%d\x00%s" % (qi.queue_id, name.encode())

    def _existing(self, qi: QueueInfo, name: str, table: DurableTable) -> tuple[bytes, SubscriberInfo]:
        k = self._key(qi, name)
        raw = table.get(k)
        if raw is None:
            raise SubscriberNotFoundError(
                f"queue {qi.name!r} has no subscriber {name!r}; add it with 'headwater subscriber add {qi.name} {name}'"
            )
        return k, _decoder.decode(raw)

    # -- calls ----------------------------------------------------------------------------

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
        self._table_of(queue, name)  # first: the first subscriber call of a cluster makes its queue, unlocked
        qi = self._store.describe_queue(queue)
        parts = normalize_partitions(partitions, len(qi.partitions), queue)
        following = parts if parts is not None else list(range(len(qi.partitions)))
        # on a cluster the leaders are asked (before the lock: a slow one holds up no other subscriber)
        checkpoints = resolve_start(start, self._located(qi), following, self._offset_for_time(qi))
        with self._lock:
            n, table = self._table_of(queue, name)
            k = self._key(qi, name)
            if table.get(k) is not None:
                raise SubscriberExistsError(
                    f"queue {queue!r} already has a subscriber {name!r} (its checkpoint is kept); "
                    f"delete it first to start over, or pick another name"
                )
            info = SubscriberInfo(
                queue=queue,
                name=name,
                partitions=parts,
                tags=tag_list,
                created_ms=int(self._clock() * 1000),
                checkpoints=checkpoints,
            )
            self._save(n, table, k, info, name)
            return info

    def delete(self, queue: str, name: str) -> None:
        validate_subscriber_name(name)
        with self._lock:
            qi = self._store.describe_queue(queue)
            n, table = self._table_of(queue, name)
            k, _ = self._existing(qi, name, table)
            self._save(n, table, k, None, name)
        for fn in self._listeners:
            fn(queue, name)

    def describe(self, queue: str, name: str) -> SubscriberInfo:
        validate_subscriber_name(name)
        qi = self._store.describe_queue(queue)
        return self._existing(qi, name, self._table_of(queue, name)[1])[1]

    def list(self, queue: str | None = None) -> list[SubscriberInfo]:
        """The subscribers of ``queue`` (of every queue when None); on a cluster, those
        coordinated here (a client asks every broker and merges)."""
        queues = [self._store.describe_queue(queue)] if queue is not None else self._store.list_queues()
        with self._lock:
            tables = self._tables.all()
        out = []
        for qi in queues:
            prefix = b"s\x00%d\x00" % qi.queue_id
            for table in tables:
                out.extend(_decoder.decode(v) for _, v in table.items(prefix))
        return sorted(out, key=lambda s: (s.queue, s.name))

    def claim(self, queue: str, name: str) -> SubscriberInfo:
        """Bump the subscriber's epoch, durably (it moves with the record, so a new
        coordinator never hands out an epoch an older process already holds); the
        subscriber with it."""
        validate_subscriber_name(name)
        qi = self._store.describe_queue(queue)
        with self._lock:
            n, table = self._table_of(queue, name)
            k, info = self._existing(qi, name, table)
            info = msgspec.structs.replace(info, epoch=info.epoch + 1)
            self._save(n, table, k, info, name)
            return info

    def checkpoint(self, queue: str, name: str, offsets: dict[int, int], epoch: int = 0) -> SubscriberInfo:
        """Store ``{partition: next offset to deliver}`` durably; the subscriber after it.
        With an ``epoch`` older than the subscriber's, refused: a newer process claimed it."""
        validate_subscriber_name(name)
        qi = self._store.describe_queue(queue)
        self._table_of(queue, name)  # NotCoordinatorError before asking the leaders
        ranges = self._located(qi).partitions  # before the lock: a slow leader holds up no other subscriber
        with self._lock:
            n, table = self._table_of(queue, name)
            k, info = self._existing(qi, name, table)
            if epoch and epoch < info.epoch:
                raise UsageError(replaced_message(queue, name))
            checkpoints = check_checkpoint(info, offsets, {p.partition: (p.start_offset, p.end_offset) for p in ranges})
            if checkpoints == info.checkpoints:
                return info
            info = msgspec.structs.replace(info, checkpoints=checkpoints)
            self._save(n, table, k, info, name)
            return info
