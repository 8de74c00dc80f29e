"""SharedGroups: shared groups' delivery state, kept durably in the store itself.

The operations are :class:`~headwater.broker.shared_core.SharedGroupsCore`'s; this class
supplies the storage. Every operation that changes a group's state appends one record to
the internal queue ``__shared`` (one partition, no TTL, sync flush) before it answers::

    key   "<group>\\0<queue id>"
    body  msgpack [replace: bool, settings: SharedGroupSettings map or nil,
                   parts: {partition: [floor, next, dead_lettered, {offset: [state, attempts, due_ms, reason]}]},
                   reset: [partition, ...]]

A change record (``replace`` false) holds the offsets the operation changed and the
partition's new floor and next; a snapshot (``replace`` true) holds a group's whole window.
A record may also name partitions to ``reset`` (a trailing field, empty in older records):
their window is dropped before ``parts`` apply. That is how a partition's state handed over
in a move is adopted whole (reset, then its window), and how a partition led elsewhere now
is forgotten (docs/design/cluster.md, "Shared groups", "Moves").
On open the queue is replayed in order into the in-memory state; then every lease that was
running is void (its member cannot know whether the broker kept it) and its message is
available again at once, its delivery counted as an attempt. Acknowledged offsets are never
delivered again: their change record was durable before the ack was answered.

Dead letters are appended to ``<queue>.dlq`` before the change record that marks them
dead, in the same commit log: waiting for the record's fsync covers the copy too, and a
crash in between copies a message twice rather than losing it.

Compaction: when the log holds many more records than groups, a snapshot of every group
is appended (and fsynced), then the queue's start is moved to it, so replay stays short
and a crash at any point leaves either the old or the new records readable. Groups of
deleted queues are dropped then (keys use the queue id, never reused).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable

import msgspec

from headwater.broker.shared_cluster import SharedCluster, append_dead_letters, ensure_dead_letter_queue
from headwater.broker.shared_core import LeaderGate, SharedGroupsCore
from headwater.broker.shared_handoff import export_partition, image_of
from headwater.broker.shared_state import Changes, PartitionImage, SharedQueueState
from headwater.errors import HeadwaterError, QueueExistsError, QueueNotFoundError
from headwater.model.batch import encode_batch
from headwater.model.batch_reads import decode_records
from headwater.model.config import INTERNAL_PREFIX, QueueConfig, QueueInfo
from headwater.model.delay import HandoffPage
from headwater.model.message import Message
from headwater.model.service import FetchResult
from headwater.model.shared import HandedOffShared, SharedGroupSettings, dead_letter_queue_name
from headwater.storage.api import Store

__all__ = ["SharedGroups", "SharedWaiters", "SHARED_QUEUE"]

log = logging.getLogger("headwater.shared")

SHARED_QUEUE = "__shared"
RESTART_REASON = "lease lost in a broker restart"
RECORDS_PER_BATCH = 1000  # records of one append (a snapshot, a hand-off adopted)


class _Record(msgspec.Struct, array_like=True):
    replace: bool
    settings: SharedGroupSettings | None
    parts: dict[int, PartitionImage]
    reset: list[int] = []  # partitions whose window is dropped before ``parts`` apply


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(_Record)


def _key(group: str, queue_id: int) -> bytes:
    return f"{group}\x00{queue_id}".encode()


class SharedGroups(SharedGroupsCore):
    """Shared groups over a :class:`Store`. Thread-safe."""

    def __init__(
        self,
        store: Store,
        clock: Callable[[], float],
        *,
        compact_ratio: int = 4,
        compact_min: int = 10_000,
        cluster: Callable[[], SharedCluster | None] = lambda: None,
    ) -> None:
        """``cluster``: the broker's part in its cluster now (None while it runs alone)."""
        super().__init__(clock)
        self._store = store
        self._cluster = cluster
        self._compact_ratio = compact_ratio
        self._compact_min = compact_min
        try:
            store.describe_queue(SHARED_QUEUE)
        except QueueNotFoundError:  # first start of this store
            store.create_queue(SHARED_QUEUE, QueueConfig(partitions=1, ttl_s=None, flush="sync"), internal=True)
        self._load()
        store.add_append_listener(self._on_append)

    def _on_append(self, queue: str, partition: int, end_offset: int) -> None:
        # is_internal_queue(queue) inline (the store's queue is always a str): one Python
        # call fewer on every append
        if not queue.startswith(INTERNAL_PREFIX):
            self.notify(queue)

    # -- loading --------------------------------------------------------------------------

    def _load(self) -> None:
        offset = self._store.describe_queue(SHARED_QUEUE).partitions[0].start_offset
        first = offset
        while True:
            res = self._store.fetch(SHARED_QUEUE, 0, offset, max_bytes=4 << 20)
            for b in res.batches:
                for r in decode_records(b, SHARED_QUEUE, start_offset=offset):
                    self._replay(r.key, r.body)
            if res.next_offset <= offset:
                break
            offset = res.next_offset
        self._appended = self._store.end_offset(SHARED_QUEUE, 0) - first
        live = {q.queue_id for q in self._store.list_queues()}
        released = 0
        for key in [k for k in self._groups if k[1] not in live]:
            del self._groups[key]
        for st in self._groups.values():
            released += st.release_all(RESTART_REASON)
        if self._groups:
            log.info(
                "shared groups: %d group(s) loaded, %d lease(s) released by the restart", len(self._groups), released
            )

    def _replay(self, key: bytes | None, body: bytes) -> None:
        if key is None:
            return
        group, _, qid = key.decode().rpartition("\x00")
        self._apply(self._state(group, int(qid)), _decoder.decode(body))

    @staticmethod
    def _apply(st: SharedQueueState, rec: _Record) -> None:
        if rec.settings is not None:
            st.settings = rec.settings
        for p in rec.reset:
            st.cursors.pop(p, None)
        st.load(rec.parts, rec.replace)

    # -- hooks ----------------------------------------------------------------------------

    def _queue_info(self, queue: str) -> QueueInfo:
        return self._store.describe_queue(queue)

    def _read(self, queue: str, partition: int, offset: int, end_offset: int) -> FetchResult:
        return self._store.fetch(queue, partition, offset, max_bytes=16 << 20, end_offset=end_offset)

    def _gate(self) -> LeaderGate | None:
        return self._cluster()

    def _before_nack(self, queue: str) -> None:
        cluster = self._cluster()
        if cluster is None:
            return  # alone, the store makes the dlq at once under the lock
        dlq = dead_letter_queue_name(queue)
        try:
            self._store.describe_queue(dlq)
        except QueueNotFoundError:  # a nack may use up attempts: have the dlq before the lock
            try:
                ensure_dead_letter_queue(self._store, cluster, dlq, self._queue_info(queue).config)
            except HeadwaterError as e:  # its dead letters wait and are tried again, as before
                log.info("dead-letter queue %s not made before a nack: %s", dlq, e)

    def _append_dead_letters(self, dlq: str, like: QueueConfig, partition: int, batch: bytes) -> None:
        cluster = self._cluster()
        if cluster is not None:
            append_dead_letters(self._store, cluster, dlq, like, partition, batch)
            return
        try:
            info = self._store.describe_queue(dlq)
        except QueueNotFoundError:
            try:
                info = self._store.create_queue(dlq, like)
                log.info("created dead-letter queue %s", dlq)
            except QueueExistsError:
                info = self._store.describe_queue(dlq)
        if not info.enabled:  # a dead letter must not be dropped
            log.warning("dead-letter queue %s was disabled; enabling it to store a dead letter", dlq)
            self._store.set_queue_enabled(dlq, True)
        self._store.append_nowait(dlq, partition % len(info.partitions), batch)

    def _persist(self, st: SharedQueueState, changes: Changes) -> int | None:
        rec = _Record(False, st.settings if changes.settings_changed else None, st.images(changes))
        return self._append([Message(_encoder.encode(rec), key=_key(st.group, st.queue_id))])

    def _append(self, msgs: list[Message]) -> int | None:
        """Append records (under the lock), ``RECORDS_PER_BATCH`` a batch; the token to wait
        on for their fsync (the last batch's covers the others)."""
        assert msgs, "nothing to append"
        for i in range(0, len(msgs), RECORDS_PER_BATCH):
            _, durable_at = self._store.append_nowait(SHARED_QUEUE, 0, encode_batch(msgs[i : i + RECORDS_PER_BATCH]))
        self._appended += len(msgs)
        if self._appended > max(self._compact_min, self._compact_ratio * len(self._groups)):
            self._compact()
            return None  # compaction waited for everything appended so far
        return durable_at

    # -- moves (headwater.broker.delay_moves) ----------------------------------------------

    def hand_off(self, queue_id: int, partition: int, after: int, max_bytes: int) -> HandoffPage:
        """A page of every group's state of the partition, by group name, from the one after
        index ``after`` (-1: the first), about ``max_bytes`` of it (at least one group).
        The caller checked that a move has fenced the partition here: from then on nothing
        changes it (every shared call on it is refused, under the lock taken here), so the
        pages of one hand-off agree and an ack answered here before it is in them."""
        out: list[HandedOffShared] = []
        size = 0
        with self._lock:
            states = sorted(
                (st for (_, qid), st in self._groups.items() if qid == queue_id and partition in st.cursors),
                key=lambda s: s.group,
            )
            for st in states[after + 1 :]:  # only this page's groups are exported
                item = export_partition(st, partition)
                assert item is not None  # it has a cursor of the partition
                n = len(_encoder.encode(item))
                if out and size + n > max_bytes:
                    return HandoffPage([], True, out)
                out.append(item)
                size += n
        return HandoffPage([], False, out)

    def adopt(self, queue_id: int, partition: int, items: list[HandedOffShared]) -> None:
        """Make ``items`` every group's state of the partition here, durably (returns once
        fsynced): what this broker had of it before is dropped, a group it never saw takes
        the handed settings. Acted on only once this broker leads the partition."""
        handed = {x.group: x for x in items}
        with self._lock:
            msgs: list[Message] = []
            for (group, qid), st in list(self._groups.items()):
                if qid == queue_id and partition in st.cursors and group not in handed:
                    msgs.append(self._applied(st, _Record(False, None, {}, [partition])))
            for x in items:
                new = (x.group, queue_id) not in self._groups
                st = self._state(x.group, queue_id)
                rec = _Record(False, x.settings if new else None, {partition: image_of(x)}, [partition])
                msgs.append(self._applied(st, rec))
            token = self._append(msgs) if msgs else None
        self._wait_durable(token)

    def forget(self, queue_id: int, partition: int) -> int:
        """Drop every group's state of the partition, durably (another broker leads it: it
        was handed over, or a rolled-back move's adoption). Returns how many groups had it."""
        with self._lock:
            msgs = [
                self._applied(st, _Record(False, None, {}, [partition]))
                for (_, qid), st in list(self._groups.items())
                if qid == queue_id and partition in st.cursors
            ]
            token = self._append(msgs) if msgs else None
        self._wait_durable(token)
        return len(msgs)

    def partitions_with_state(self) -> set[tuple[int, int]]:
        """(queue id, partition) of every partition some group keeps state of here."""
        with self._lock:
            return {(qid, p) for (_, qid), st in self._groups.items() for p in st.cursors}

    def _applied(self, st: SharedQueueState, rec: _Record) -> Message:
        """Apply ``rec`` to ``st`` as a replay would, and the message recording it."""
        self._apply(st, rec)
        return Message(_encoder.encode(rec), key=_key(st.group, st.queue_id))

    def _wait_durable(self, token: int | None) -> None:
        if token is not None:
            self._store.wait_durable(token)

    def _compact(self) -> None:
        """Snapshot every group, fsync, then drop the records before the snapshots.
        Runs under the lock, so no change lands between a snapshot and its group's state."""
        live = {q.queue_id for q in self._store.list_queues()}
        for key in [k for k in self._groups if k[1] not in live]:
            del self._groups[key]
        snapshot_at = self._store.end_offset(SHARED_QUEUE, 0)
        msgs = [
            Message(_encoder.encode(_Record(True, st.settings, st.images())), key=_key(st.group, st.queue_id))
            for st in self._groups.values()
        ]
        for i in range(0, len(msgs), RECORDS_PER_BATCH):
            self._store.append(SHARED_QUEUE, 0, encode_batch(msgs[i : i + RECORDS_PER_BATCH]))  # waits for the fsync
        self._store.delete_before(SHARED_QUEUE, 0, snapshot_at)
        self._appended = len(msgs)


class SharedWaiters:
    """Receives parked on an event loop until their queue may have more (the server's long
    polling of SHARED_RECEIVE). ``notify`` may be called from any thread; it crosses into
    the loop only when someone waits on that queue."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._loop_thread = threading.get_ident()  # created on the loop's thread
        self._waiting: dict[str, list[asyncio.Future[None]]] = {}

    def wait(self, queue: str) -> asyncio.Future[None]:
        fut = self._loop.create_future()
        self._waiting.setdefault(queue, []).append(fut)
        return fut

    def discard(self, queue: str, fut: asyncio.Future[None]) -> None:
        lst = self._waiting.get(queue)
        if lst and fut in lst:
            lst.remove(fut)
            if not lst:
                del self._waiting[queue]

    def notify(self, queue: str) -> None:
        if queue in self._waiting:
            if threading.get_ident() == self._loop_thread:
                self._wake(queue)
            else:
                try:
                    self._loop.call_soon_threadsafe(self._wake, queue)
                except RuntimeError:  # the loop is closed: nobody is left to wake
                    pass

    def _wake(self, queue: str) -> None:
        for fut in self._waiting.get(queue, ()):
            if not fut.done():
                fut.set_result(None)

    def wake_all(self) -> None:
        for lst in self._waiting.values():
            for fut in lst:
                if not fut.done():
                    fut.set_result(None)
