"""DelayService: delayed messages, from acceptance to delivery, exactly once across crashes.

A batch whose ``deliver_at_ms`` lies in the future is not appended to its partition: the
broker hands it here. It is written to the schedule file of its time bucket
(:mod:`headwater.storage.schedule`), durable under the queue's flush policy before the
producer hears back, and answered with a delayed id (:mod:`headwater.model.delay`).
Buckets that come due within the lookahead (one bucket span) are *loaded*: their batches
sit in a heap by due time, and the dispatcher thread (:mod:`.dispatcher`) appends each to
its partition when it comes due, stamping the batch's ``broker_reserved`` field with its
delay id, then records DELIVERED in the bucket file. Later buckets stay on disk: memory is
bounded by what is due soon, not by what is pending.

Exactly once, in short (docs/design/delay.md has the argument): a DELIVERED record is
written only after the stamped batch is durable in the log, so a DELIVERED record always
means delivered; and a batch delivered whose DELIVERED record did not survive is found on
open by its stamp in the log, read from the dispatch checkpoint's position on (every stamp
before it has a durable DELIVERED record).

Thread-safety: one lock guards the buckets, the heap and the counters; file appends happen
under it, fsyncs (group commit) and the dispatcher's log appends outside it.
"""

from __future__ import annotations

import bisect
import heapq
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import NamedTuple

from headwater.broker.delay.buckets import Bucket, BucketIndex, Entry, Run, replay
from headwater.broker.delay.handoff import DelayHandoff, DeliveryGate
from headwater.broker.delay.lifecycle import CANCEL, State, move
from headwater.broker.delay.recovery import DelayRecovery
from headwater.errors import ClosedError, InvalidArgumentError, MessageNotFoundError, ReadOnlyStoreError, StorageError
from headwater.model.batch import decode_deliver_offsets, decode_header, validate_batch
from headwater.model.delay import (
    DELAYED_PARTITION_BIT,
    NUMBER_LIMIT,
    DelayBucketStats,
    DelayCounters,
    DelayStats,
    check_deliver_at,
    delay_offset,
    single_message_batch,
    split_delay_offset,
)
from headwater.model.message import MessageId
from headwater.model.producer_state import ProducerStateTable
from headwater.model.service import ProduceResult
from headwater.storage.api import Store
from headwater.storage.flusher import Flusher, GroupCommit
from headwater.storage.schedule import (
    CANCELLED,
    DELIVERED,
    DROPPED,
    SCHEDULE,
    DispatchCheckpoint,
    ScheduleFile,
    ScheduleRecord,
    encode_record,
)

__all__ = ["DelayService", "DelayTicket", "DelayLimits"]

log = logging.getLogger("headwater.delay")


class DelayLimits(NamedTuple):
    """The bounds of the delay service (tests shrink them)."""

    dispatch_batches_max: int = 5_000  # batches one dispatch round appends
    loaded_batches_max: int = 500_000  # stop loading more buckets past this (catching up)
    open_files_max: int = 64  # bucket files kept open besides the loaded ones
    poll_ms: int = 100  # the dispatcher looks at the clock at least this often
    checkpoint_interval_ms: int = 1_000
    retry_ms: int = 1_000  # a batch whose queue is disabled is tried again after this
    hold_ms: int = 200  # a batch of a partition another broker leads is looked at again after this


class DelayTicket:
    """What to wait for before acknowledging an accepted delayed batch (sync flush)."""

    __slots__ = ("writes",)

    def __init__(self, writes: int) -> None:
        self.writes = writes


class DelayService(DelayRecovery, DelayHandoff):
    """The delay service of one store. Thread-safe; :meth:`close` before the store.

    ``gate``: on a cluster, what says which partitions this broker may deliver to
    (:mod:`.handoff`); None for a broker alone, which delivers to every partition."""

    def __init__(
        self,
        store: Store,
        *,
        clock: Callable[[], float] = time.time,
        limits: DelayLimits | None = None,
        report: list[str] | None = None,
        gate: DeliveryGate | None = None,
    ) -> None:
        cfg = store.config
        self._store = store
        self._clock = clock
        self.limits = limits or DelayLimits()
        self.bucket_ms = cfg.delay_bucket_s * 1000
        self.lookahead_ms = self.bucket_ms
        self.delay_max_s = cfg.delay_max_s
        self._schedule = store.schedule_store()  # bucket files and checkpoint: a folder, or memory
        self.report = report if report is not None else []
        self._lock = threading.Lock()
        self.wakeup = threading.Condition(self._lock)  # the dispatcher waits on it
        self._buckets: dict[int, Bucket] = {}
        self._order: list[int] = []  # bucket starts, ascending
        self._heap: list[tuple[int, int, int, int]] = []  # (attempt_ms, bucket start, number, run)
        self._loaded_batches = 0
        self._open_lru: OrderedDict[int, None] = OrderedDict()
        self._writes = 0  # schedule records written; the group commit's position
        self._dirty: set[ScheduleFile] = set()
        self._accept_seq = 0
        self._producers = ProducerStateTable(cfg.producer_expiry_ms)
        self._floor_ms = 0
        self._last_ckpt: DispatchCheckpoint | None = None
        self.limbo = False  # a round's fsync failed: do not move the checkpoint past it
        self._checkpoint_failing: str | None = None  # why the last checkpoint write failed
        self.wake_at_ms: int | None = None
        self.counters = DelayCounters()
        self.closed = False
        self.read_only = store.read_only  # recovery in memory only; no dispatcher, no writes
        self.gate = gate
        # adopted batches by origin: (queue id, partition, origin bucket) -> origin number ->
        # (messages, bucket here, number here); and the partitions that may have open batches
        self._aliases: dict[tuple[int, int, int], dict[int, tuple[int, int, int]]] = {}
        self._partitions: set[tuple[int, int]] = set()
        self._recover()
        self._commit = GroupCommit(self._sync_files)
        self._flusher = Flusher("headwater-delay-flush", cfg.flush_interval_ms, self._commit.sync_now)
        from headwater.broker.delay.dispatcher import Dispatcher

        self._dispatcher = Dispatcher(self, store)
        if not self.read_only:
            self._flusher.start()
            self._dispatcher.start()

    # -- time and places ----------------------------------------------------------------

    def now_ms(self) -> int:
        return int(self._clock() * 1000)

    def _bucket_start(self, due_ms: int) -> int:
        g = self.bucket_ms
        start = due_ms - due_ms % g
        floor_start = -(-self._floor_ms // g) * g  # never file into a bucket that may be deleted
        return max(start, floor_start)

    # -- opening ------------------------------------------------------------------------

    def _checkpoint_written(self, ck: DispatchCheckpoint) -> bool:
        """Write ``ck`` (only the dispatcher, or close after it, gets here). A full disk is
        said once, not at every turn, and when it has room again: the previous checkpoint
        stands meanwhile (older, so the next start reads more of the log, never wrong)."""
        try:
            self._schedule.write_checkpoint(ck)
        except StorageError as e:
            if self._checkpoint_failing is None:
                log.warning("delay: the dispatch checkpoint could not be moved (%s); retrying each turn", e)
            self._checkpoint_failing = str(e)
            return False
        if self._checkpoint_failing is not None:
            log.info("delay: the dispatch checkpoint is written again")
            self._checkpoint_failing = None
        self._last_ckpt = ck
        return True

    def _check_writable(self) -> None:
        if self.read_only:
            raise ReadOnlyStoreError(
                "the store was opened read-only: delayed messages can be read, not sent or cancelled"
            )

    def _write_checkpoint(self, log_position: int) -> None:
        if self.read_only:  # what recovery found stays in memory
            return
        ck = DispatchCheckpoint(log_position, self._floor_ms, self._accept_seq, self._producers.to_bytes())
        if ck != self._last_ckpt:
            self._schedule.write_checkpoint(ck)
            self._last_ckpt = ck

    def _ensure_dir_locked(self) -> None:
        if self._last_ckpt is None:  # first delayed message of this store
            self._schedule.prepare()
            self._write_checkpoint(self._store.end_position)

    # -- buckets and files ------------------------------------------------------------

    def _new_bucket_locked(self, start: int, now: int) -> Bucket:
        self._ensure_dir_locked()
        f = self._schedule.create_bucket(start, start + self.bucket_ms, self._store.store_id, now)
        b = Bucket(f)
        i = bisect.bisect_left(self._order, start)
        prev_loaded = i == 0 or self._buckets[self._order[i - 1]].loaded
        next_loaded = i < len(self._order) and self._buckets[self._order[i]].loaded
        if prev_loaded and (next_loaded or start < now + self.lookahead_ms):
            b.loaded, b.entries = True, {}  # new and empty: nothing to read
        self._order.insert(i, start)
        self._buckets[start] = b
        self._touch_locked(b)
        return b

    def _touch_locked(self, b: Bucket) -> None:
        lru = self._open_lru
        lru[b.start_ms] = None
        lru.move_to_end(b.start_ms)
        if len(lru) <= self.limits.open_files_max:
            return
        for start in list(lru):
            if len(lru) <= self.limits.open_files_max:
                break
            o = self._buckets.get(start)
            if o is None:
                del lru[start]
            elif not (o.loaded or o.loading or o.file.unsynced):  # those stay open
                o.file.close()
                del lru[start]

    def _write_locked(self, b: Bucket, parts: list) -> int:
        pos = b.file.append(parts)
        self._writes += 1
        self._dirty.add(b.file)
        self._touch_locked(b)
        return pos

    def _sync_files(self) -> int:
        with self._lock:
            covered, dirty = self._writes, self._dirty
            self._dirty = set()
        for f in dirty:
            f.sync()
        return covered

    def wait_durable(self, ticket: DelayTicket) -> None:
        self._commit.wait_durable(ticket.writes)

    # -- accepting ----------------------------------------------------------------------

    def accept(self, queue: str, partition: int, batch: bytes) -> tuple[ProduceResult, DelayTicket | None]:
        """Schedule a producer's batch whose ``deliver_at_ms`` is in the future; the
        placement (a delayed id) and, under sync flush, the ticket to wait for."""
        self._check_writable()
        qid, cap, sync = self._store.produce_target(queue, partition)
        h, payload = validate_batch(batch, message_bytes_max=cap)
        offsets = decode_deliver_offsets(batch, h, payload=payload)
        now = self.now_ms()
        check_deliver_at(h.deliver_at_ms + (offsets[-1] if offsets else 0), now, self.delay_max_s)
        key_partition = partition | DELAYED_PARTITION_BIT  # delayed sequences count apart
        with self._lock:
            if self.closed:
                raise ClosedError("the broker is closed")
            dup = self._producers.check(h, qid, key_partition)
            if dup is not None:  # a retry: answer the first placement (it may not be durable yet)
                return dup, DelayTicket(self._writes) if sync else None
            start = self._bucket_start(h.deliver_at_ms)
            b = self._buckets.get(start) or self._new_bucket_locked(start, now)
            n = b.next_number
            if n + h.count > NUMBER_LIMIT:
                raise InvalidArgumentError(f"the schedule bucket starting at {start} is full; send later")
            self._accept_seq += 1
            pos = self._write_locked(
                b, encode_record(SCHEDULE, qid, partition, h.count, n, h.deliver_at_ms, now, self._accept_seq, batch)
            )
            b.next_number = n + h.count
            self._partitions.add((qid, partition))
            b.pending_messages += h.count
            b.pending_batches += 1
            if b.loaded:
                fields = (SCHEDULE, qid, partition, h.count, n, h.deliver_at_ms, now, self._accept_seq, pos)
                self._add_entry_locked(b, Entry(ScheduleRecord(*fields, len(batch), None, offsets)))
            result = ProduceResult(qid, key_partition, delay_offset(start, n), h.count, now)
            self._producers.record(h, qid, key_partition, result.base_offset, now)
            self.counters.accepted += h.count
            return result, DelayTicket(self._writes) if sync else None

    def _add_entry_locked(self, b: Bucket, e: Entry) -> None:
        assert b.entries is not None
        b.entries[e.number] = e
        b.numbers.append(e.number)
        self._loaded_batches += 1
        # One heap item per batch, not per run: its first pending run's. Runs come due in
        # index order, so taking a run's item pushes the next run's (_pop_locked); a batch
        # of random due times (a run per message) costs one push at acceptance, and the
        # heap holds batches, not messages.
        for i, g in enumerate(e.runs):
            if g.state == State.PENDING:
                heapq.heappush(self._heap, (g.attempt_ms, b.start_ms, e.number, i))
                if self.wake_at_ms is None or g.attempt_ms < self.wake_at_ms:
                    self.wake_at_ms = g.attempt_ms
                    self.wakeup.notify()
                break

    # -- loading (the dispatcher calls these) -----------------------------------------

    def begin_load(self, now: int) -> tuple[Bucket, int] | None:
        """The next bucket to load and the file size its first read covers, or None."""
        with self._lock:
            for start in self._order:
                b = self._buckets[start]
                if b.loaded:
                    continue
                if b.loading or start >= now + self.lookahead_ms:
                    return None
                if self._loaded_batches >= self.limits.loaded_batches_max and self._heap:
                    return None  # catching up: deliver what is loaded first
                b.loading = True
                self._touch_locked(b)
                return b, b.file.size
        return None

    def finish_load(self, b: Bucket, first_size: int) -> None:
        """Read the bucket file (outside the lock), then what was appended meanwhile."""
        entries: dict[int, Entry] = {}
        numbers: list[int] = []
        try:
            replay(b.file.scan(end=first_size, cut=False), entries, numbers)
            with self._lock:
                replay(b.file.scan(start=first_size, cut=False), entries, numbers)
                b.entries, b.numbers = {}, []
                for n in numbers:
                    self._add_entry_locked(b, entries[n])
                b.loaded, b.index = True, None
        finally:
            b.loading = False

    # -- dispatching (the dispatcher calls these) --------------------------------------

    def take_due(self, now: int) -> list[tuple[Bucket, Entry, Run]]:
        """Up to ``dispatch_batches_max`` runs due by ``now``, moved to DISPATCHING."""
        out: list[tuple[Bucket, Entry, Run]] = []
        heap = self._heap
        with self._lock:
            while heap and heap[0][0] <= now and len(out) < self.limits.dispatch_batches_max:
                item = self._pop_locked()
                found = self._item_locked(item)
                if found is None:
                    continue  # cancelled, or an older heap item of a retried run
                b, e, g = found
                if self.gate is not None and not self.deliverable_locked(e):
                    self.hold_locked(b, e, item[3], now)  # another broker's partition, for now
                    continue
                g.state = move(g.state, "take")
                b.in_flight += 1
                out.append((b, e, g))
        return out

    def _item_locked(self, item: tuple[int, int, int, int]) -> tuple[Bucket, Entry, Run] | None:
        """The run a heap item stands for, if it is still PENDING at that time."""
        at, start, n, i = item
        b = self._buckets.get(start)
        e = b.entries.get(n) if b is not None and b.entries is not None else None
        if e is None:
            return None
        g = e.runs[i]
        return (b, e, g) if g.state == State.PENDING and g.attempt_ms == at else None

    def next_wake_ms(self, now: int) -> int | None:
        """When the dispatcher has something to do next (a due batch, a bucket to load)."""
        with self._lock:
            self._clean_heap_top_locked()
            heap = self._heap
            wake = heap[0][0] if heap else None
            for start in self._order:
                b = self._buckets[start]
                if not b.loaded:
                    load_at = start - self.lookahead_ms
                    wake = load_at if wake is None else min(wake, load_at)
                    break
            self.wake_at_ms = wake
            return wake

    def _clean_heap_top_locked(self) -> None:
        heap = self._heap
        while heap and self._item_locked(heap[0]) is None:
            self._pop_locked()

    def _pop_locked(self) -> tuple[int, int, int, int]:
        """The heap's top item, taken off; if it is a run's own item (due at the run's time,
        not a retry's or a hold's), the batch's next run goes on the heap in its place."""
        item = heapq.heappop(self._heap)
        at, start, n, i = item
        b = self._buckets.get(start)
        e = b.entries.get(n) if b is not None and b.entries is not None else None
        if e is not None and i + 1 < len(e.runs) and at == e.runs[i].due_ms:
            nxt = e.runs[i + 1]
            heapq.heappush(self._heap, (nxt.due_ms, start, n, i + 1))
        return item

    def settle(
        self,
        delivered: list[tuple[Bucket, Entry, Run, ProduceResult, int]],
        dropped: list[tuple[Bucket, Entry, Run]],
        retry: list[tuple[Bucket, Entry, Run]],
        now: int,
    ) -> None:
        """Record what a round did: DELIVERED and DROPPED records, and retries."""
        with self._lock:
            parts: dict[int, list] = {}
            for b, e, g, res, appended_ms in delivered:
                e.close_run(g, move(g.state, "delivered"))
                g.delivered_offset = res.base_offset
                parts.setdefault(b.start_ms, []).extend(
                    encode_record(
                        DELIVERED, e.queue_id, e.partition, g.first, e.number, res.timestamp_ms, res.base_offset
                    )
                )
                self._done_locked(b, e, g)
                self.counters.on_delivered(res.count, appended_ms - g.due_ms)
            for b, e, g in dropped:
                e.close_run(g, move(g.state, "dropped"))
                parts.setdefault(b.start_ms, []).extend(
                    encode_record(DROPPED, e.queue_id, e.partition, g.first, e.number, now)
                )
                self._done_locked(b, e, g)
                self.counters.dropped += e.live(g)
            for b, e, g in retry:
                g.state = move(g.state, "retry")
                b.in_flight -= 1
                g.attempt_ms = now + self.limits.retry_ms
                heapq.heappush(self._heap, (g.attempt_ms, b.start_ms, e.number, e.runs.index(g)))
            for start, recs in parts.items():
                try:
                    self._write_locked(self._buckets[start], [b"".join(recs)])
                except Exception:
                    # the log has them, the file does not: keep the checkpoint before them, so
                    # the next open finds them by their stamps
                    self.limbo = True
                    raise

    def _done_locked(self, b: Bucket, e: Entry, g: Run) -> None:
        b.in_flight -= 1
        b.pending_messages -= e.live(g)
        if not e.is_open:
            b.pending_batches -= 1

    def read_batch(self, b: Bucket, e: Entry) -> bytes:
        return b.file.read(e.position, e.size)

    # -- checkpoint and reclaiming space ------------------------------------------------

    def checkpoint(self, now: int) -> None:
        """Make the bucket files durable, move the checkpoint to the log's end, and delete
        the buckets whose every batch is delivered or cancelled and whose span has passed."""
        with self._lock:
            if self._last_ckpt is None:
                return
            position = self._last_ckpt.log_position if self.limbo else self._store.end_position
            writes = self._writes
            doomed = [b for b in (self._buckets[s] for s in self._order) if _reclaimable(b, now)]
            if doomed:
                self._floor_ms = max(self._floor_ms, max(b.end_ms for b in doomed))
            # the producer table as of the records counted in ``writes``, which the next line
            # makes durable: it never names an acceptance a power loss could take back
            ck = DispatchCheckpoint(position, self._floor_ms, self._accept_seq, self._producers.to_bytes())
        self._commit.wait_durable(writes)
        if ck != self._last_ckpt and not self._checkpoint_written(ck):
            return  # nothing is deleted while the checkpoint that covers it is not written
        with self._lock:
            deleted = 0
            for b in doomed:
                if not _reclaimable(b, now) or self._buckets.get(b.start_ms) is not b:
                    continue  # something arrived meanwhile (the clock went back)
                del self._buckets[b.start_ms]
                self._order.remove(b.start_ms)
                self._open_lru.pop(b.start_ms, None)
                if b.entries is not None:
                    self._loaded_batches -= len(b.entries)
                self._forget_aliases_of_locked(b)
                b.file.delete()
                deleted += 1
        if deleted:
            self._schedule.sync_deletes()
            log.info("delay: deleted %d delivered bucket(s)", deleted)

    # -- cancel and lookup --------------------------------------------------------------

    def _find_locked(self, queue_id: int, partition: int, offset: int) -> tuple[Bucket, Entry, int]:
        mid = MessageId(queue_id, partition, offset)
        alias = self._alias_locked(queue_id, partition & ~DELAYED_PARTITION_BIT, offset)
        if alias is not None:  # adopted with its partition: found by the id its producer got
            b = self._buckets[alias[0]]
            e = b.find(alias[1]) if b.loaded else self._index_locked(b).read_entry(b.file, alias[1])
            if e is not None:
                return b, e, alias[2]
        start, number = split_delay_offset(offset)
        b = self._buckets.get(start)
        if b is None:
            if start < self._floor_ms:
                raise MessageNotFoundError(
                    f"delayed message {mid} was delivered or cancelled, and its schedule was reclaimed"
                )
            raise MessageNotFoundError(f"no delayed message has id {mid}")
        e = b.find(number) if b.loaded else self._index_locked(b).read_entry(b.file, number)
        if e is None or e.queue_id != queue_id or e.partition != partition & ~DELAYED_PARTITION_BIT:
            raise MessageNotFoundError(f"no delayed message has id {mid}")
        return b, e, number - e.number

    def _index_locked(self, b: Bucket) -> BucketIndex:
        """The index of bucket ``b`` (not loaded), caught up with its file; made here unless
        :meth:`_index_unlocked` made it first."""
        if b.index is None:
            b.index = BucketIndex()
        b.index.catch_up(b.file)
        self._touch_locked(b)
        return b.index

    def _index_unlocked(self, partition: int, offset: int) -> None:
        """Index the bucket of a delayed id, not loaded, outside the lock (as loading reads):
        its one whole read holds up nobody; what is appended meanwhile is caught up under it."""
        if partition & DELAYED_PARTITION_BIT:
            self._index_bucket_unlocked(split_delay_offset(offset)[0])

    def _index_bucket_unlocked(self, start: int) -> None:
        """Index the bucket starting at ``start``, if it is not loaded, outside the lock."""
        with self._lock:
            b = self._buckets.get(start)
            if b is None or b.loaded or b.loading or b.index is not None:
                return
            self._touch_locked(b)
            size = b.file.size
        index = BucketIndex()
        try:
            index.catch_up(b.file, end=size)
        except StorageError:
            return  # the file went meanwhile: the lookup under the lock says what is left
        with self._lock:
            if b.index is None and not b.loaded:
                b.index = index

    def cancel(self, queue_id: int, partition: int, offset: int) -> None:
        """Cancel one delayed message that is not delivered yet (cancelling twice is fine)."""
        self._check_writable()
        mid = MessageId(queue_id, partition, offset)
        if not partition & DELAYED_PARTITION_BIT:
            raise MessageNotFoundError(
                f"{mid} is the id of a message in its partition's log, not of a delayed message "
                f"waiting to be delivered; only those can be cancelled"
            )
        self._index_unlocked(partition, offset)
        with self._lock:
            if self.closed:
                raise ClosedError("the broker is closed")
            b, e, index = self._find_locked(queue_id, partition, offset)
            g = e.run_of(index)
            reason = CANCEL[g.state]
            if reason is not None:
                if g.state == State.DELIVERED:
                    reason += f" (its id in the queue is {MessageId(queue_id, e.partition, e.log_offset(index))})"
                raise MessageNotFoundError(f"delayed message {mid} {reason}")
            if g.state == State.CANCELLED or (e.cancelled and index in e.cancelled):
                return
            self._write_locked(b, encode_record(CANCELLED, e.queue_id, e.partition, index, e.number, self.now_ms()))
            e.cancel(index)  # on a loaded entry this is the state; else the file holds it
            b.pending_messages -= 1
            if not e.is_open:
                b.pending_batches -= 1
            self.counters.cancelled += 1
            writes = self._writes
        self._commit.wait_durable(writes)

    def lookup(self, queue_id: int, partition: int, offset: int) -> tuple[str, bytes]:
        """The queue and a batch of just this message: the pending message at its delayed
        id, or once delivered, the message as stored in its partition."""
        mid = MessageId(queue_id, partition, offset)
        self._index_unlocked(partition, offset)
        with self._lock:
            b, e, index = self._find_locked(queue_id, partition, offset)
            state, cancelled = e.run_of(index).state, bool(e.cancelled and index in e.cancelled)
            log_offset = e.log_offset(index) if state == State.DELIVERED else -1
        name = self._store.queue_name(queue_id)
        if cancelled or state == State.CANCELLED:
            raise MessageNotFoundError(f"delayed message {mid} was cancelled")
        if state == State.MOVED:
            raise MessageNotFoundError(f"delayed message {mid} {CANCEL[State.MOVED]}")
        if state == State.DROPPED or name is None:
            raise MessageNotFoundError(f"delayed message {mid}: its queue was deleted")
        if state == State.DELIVERED:
            name, stored = self._store.lookup_id(queue_id, e.partition, log_offset)
            h = decode_header(stored)
            return name, single_message_batch(
                stored, log_offset - h.base_offset, queue_id, e.partition, log_offset, h.timestamp_ms
            )
        data = b.file.read(e.position, e.size)
        return name, single_message_batch(data, index, queue_id, partition, offset, e.accepted_ms)

    # -- stats and closing --------------------------------------------------------------

    def stats(self) -> DelayStats:
        now = self.now_ms()
        with self._lock:
            self._clean_heap_top_locked()
            buckets = [
                DelayBucketStats(b.start_ms, b.end_ms, b.pending_messages, b.loaded)
                for b in (self._buckets[s] for s in self._order)
            ]
            nxt = self._next_due_locked()
            p50, p99, mx = self.counters.lateness()
            c = self.counters
            return DelayStats(
                now_ms=now,
                pending_messages=sum(x.pending_messages for x in buckets),
                pending_batches=sum(self._buckets[s].pending_batches for s in self._order),
                next_due_ms=nxt,
                accepted_total=c.accepted,
                delivered_total=c.delivered,
                cancelled_total=c.cancelled,
                dropped_total=c.dropped,
                delivered_per_s=c.rate_per_s(),
                lateness_p50_ms=p50,
                lateness_p99_ms=p99,
                lateness_max_ms=mx,
                loaded_batches=self._loaded_batches,
                bucket_ms=self.bucket_ms,
                buckets=buckets,
            )

    def _next_due_locked(self) -> int | None:
        """The earliest time a pending message is due: the heap's top, unless a pending
        bucket not loaded yet starts before it (the dispatcher loads buckets ahead of time,
        but asynchronously: just after opening, the first one may still be unloaded; and a
        bucket beyond the lookahead is not loaded at all). That bucket's index says when its
        earliest pending run is due: its start would be a time already past for a message
        due later in it."""
        nxt: int | None = self._heap[0][0] if self._heap else None
        for start in self._order:
            if nxt is not None and start >= nxt:
                break
            b = self._buckets[start]
            if b.loaded or not b.pending_messages:
                continue
            due = self._index_locked(b).next_due(b.file)
            if due is not None:
                return due if nxt is None else min(due, nxt)
        return nxt

    def summary(self) -> dict[str, object]:
        """The figures ``status`` shows."""
        s = self.stats()
        return {
            "delay_pending": s.pending_messages,
            "delay_next_due_ms": s.next_due_ms,
            "delay_buckets": len(s.buckets),
            "delay_delivered_total": s.delivered_total,
        }

    def close(self) -> None:
        """Stop the dispatcher after its round, checkpoint, close the files."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            self.wakeup.notify_all()
        if self.read_only:
            with self._lock:
                for b in self._buckets.values():
                    b.file.close()
            return
        self._dispatcher.join()
        try:
            self.checkpoint(self.now_ms())
        finally:
            self._flusher.stop()
            self._commit.sync_now()
            with self._lock:
                for b in self._buckets.values():
                    b.file.close()


def _reclaimable(b: Bucket, now: int) -> bool:
    return b.pending_batches == 0 and b.in_flight == 0 and not b.loading and b.end_ms <= now
