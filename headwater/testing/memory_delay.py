"""Delayed messages for the in-memory broker: the same ids, rules and errors as the real
delay service (headwater.broker.delay), held in a heap.

Due messages are delivered by a small thread that looks at the broker's clock every
``POLL_S`` and, so that tests moving an injected clock need not wait for it, at the start
of the broker's reads (``fetch``, lookups, ``delay_stats``). Nothing survives ``close()``.
"""

from __future__ import annotations

import bisect
import heapq
import threading
from typing import TYPE_CHECKING

from headwater.errors import (
    ClosedError,
    MessageNotFoundError,
    QueueDisabledError,
    QueueNotFoundError,
)
from headwater.model.batch import decode_deliver_offsets, decode_header, validate_batch
from headwater.model.delay import (
    DELAY_MAX_S_DEFAULT,
    DELAYED_PARTITION_BIT,
    DelayBucketStats,
    DelayCounters,
    DelayStats,
    check_deliver_at,
    delay_offset,
    delivery_groups,
    prepare_delivery,
    single_message_batch,
    split_delay_offset,
)
from headwater.model.message import MessageId
from headwater.model.producer_state import ProducerStateTable
from headwater.model.service import ProduceResult

if TYPE_CHECKING:
    from headwater.testing.memory import MemoryBroker

__all__ = ["MemoryDelay"]

POLL_S = 0.02
_PENDING, _DELIVERED, _CANCELLED, _DROPPED = "pending", "delivered", "cancelled", "dropped"


class _Item:
    __slots__ = (
        "queue_id",
        "partition",
        "batch",
        "count",
        "due_ms",
        "accepted_ms",
        "state",
        "cancelled",
        "delivered_offset",
        "attempt_ms",
    )

    def __init__(self, queue_id: int, partition: int, batch: bytes, count: int, due_ms: int, now: int) -> None:
        self.queue_id, self.partition, self.batch, self.count = queue_id, partition, batch, count
        self.due_ms, self.accepted_ms, self.attempt_ms = due_ms, now, due_ms
        self.state = _PENDING
        self.cancelled: set[int] = set()
        self.delivered_offset = -1


class MemoryDelay:
    """The in-memory broker's delayed messages. Uses the broker's lock."""

    def __init__(self, broker: MemoryBroker) -> None:
        self._b = broker
        self.delay_max_s = DELAY_MAX_S_DEFAULT
        self.bucket_ms = 3_600_000
        self._items: dict[tuple[int, int], _Item] = {}  # (bucket start, first number) -> batch
        self._numbers: dict[int, list[int]] = {}  # bucket start -> first numbers, ascending
        self._next: dict[int, int] = {}
        self._heap: list[tuple[int, int, int]] = []
        self._producers = ProducerStateTable()
        self.counters = DelayCounters()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def accept(self, q, partition: int, batch: bytes) -> ProduceResult:
        b = self._b
        h, payload = validate_batch(batch, message_bytes_max=q.config.message_bytes_max)
        offsets = decode_deliver_offsets(batch, h, payload=payload)
        runs = delivery_groups(h.deliver_at_ms, h.count, offsets)
        now = b._now()
        check_deliver_at(runs[-1][0], now, self.delay_max_s)
        key = partition | DELAYED_PARTITION_BIT
        with b._lock:
            dup = self._producers.check(h, q.qid, key)
            if dup is not None:
                return dup
            start = h.deliver_at_ms - h.deliver_at_ms % self.bucket_ms
            n = self._next.get(start, 0)
            self._next[start] = n + h.count
            for due, first, end in runs:  # each run of one deliver time is an item of its own
                sub = prepare_delivery(batch, (), first, end)
                assert sub is not None
                self._items[(start, n + first)] = _Item(q.qid, partition, bytes(sub), end - first, due, now)
                self._numbers.setdefault(start, []).append(n + first)
                heapq.heappush(self._heap, (due, start, n + first))
            result = ProduceResult(q.qid, key, delay_offset(start, n), h.count, now)
            self._producers.record(h, q.qid, key, result.base_offset, now)
            self.counters.accepted += h.count
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="headwater-memory-delay", daemon=True)
                self._thread.start()
        if runs[0][0] <= now:  # due already (the producer's clock disagreed): at once
            self.deliver_due()
        return result

    def _run(self) -> None:
        while not self._stop.wait(POLL_S):
            try:
                self.deliver_due()
            except ClosedError:
                return

    def close(self) -> None:
        self._stop.set()

    def deliver_due(self) -> None:
        """Append every batch due by the broker's clock to its partition, in due order."""
        b = self._b
        if not self._heap:
            return
        appended: dict[str, dict[int, int]] = {}  # queue -> partition -> end offset
        with b._lock:
            if b._closed:
                return
            now = b._now()
            while self._heap and self._heap[0][0] <= now:
                at, start, n = heapq.heappop(self._heap)
                it = self._items[(start, n)]
                if it.state != _PENDING or it.attempt_ms != at:
                    continue
                batch = prepare_delivery(it.batch, it.cancelled)
                try:
                    if batch is None:
                        raise QueueNotFoundError("every message was cancelled")
                    res = b._append_stamped(it.queue_id, it.partition, batch, delay_offset(start, n))
                except QueueDisabledError:
                    it.attempt_ms = now + 1000
                    heapq.heappush(self._heap, (it.attempt_ms, start, n))
                    continue
                except QueueNotFoundError:
                    it.state = _DROPPED
                    self.counters.dropped += it.count - len(it.cancelled)
                    continue
                it.state, it.delivered_offset = _DELIVERED, res.base_offset
                self.counters.on_delivered(res.count, now - it.due_ms)
                ends = appended.setdefault(b._by_id[it.queue_id].name, {})
                ends[it.partition] = res.base_offset + res.count
        if appended:  # wake readers as an append does, outside the broker's lock
            b._wake_readers(appended)

    def _find_locked(self, queue_id: int, partition: int, offset: int) -> tuple[_Item, int]:
        mid = MessageId(queue_id, partition, offset)
        start, number = split_delay_offset(offset)
        nums = self._numbers.get(start, [])
        i = bisect.bisect_right(nums, number) - 1
        it = self._items.get((start, nums[i])) if i >= 0 else None
        if (
            it is None
            or number >= nums[i] + it.count
            or it.queue_id != queue_id
            or (it.partition != partition & ~DELAYED_PARTITION_BIT)
        ):
            raise MessageNotFoundError(f"no delayed message has id {mid}")
        return it, number - nums[i]

    def cancel(self, queue_id: int, partition: int, offset: int) -> None:
        mid = MessageId(queue_id, partition, offset)
        if not partition & DELAYED_PARTITION_BIT:
            raise MessageNotFoundError(
                f"{mid} is the id of a message in its partition's log, not of a delayed message "
                f"waiting to be delivered; only those can be cancelled"
            )
        self.deliver_due()
        with self._b._lock:
            it, index = self._find_locked(queue_id, partition, offset)
            if it.state == _DELIVERED:
                off = it.delivered_offset + index - sum(1 for c in it.cancelled if c < index)
                raise MessageNotFoundError(
                    f"delayed message {mid} was already delivered; too late to cancel "
                    f"(its id in the queue is {MessageId(queue_id, it.partition, off)})"
                )
            if it.state == _DROPPED:
                raise MessageNotFoundError(
                    f"delayed message {mid} was dropped when it came due (its queue had been deleted)"
                )
            if index in it.cancelled:
                return
            it.cancelled.add(index)
            self.counters.cancelled += 1
            if len(it.cancelled) == it.count:
                it.state = _CANCELLED

    def lookup(self, queue_id: int, partition: int, offset: int) -> tuple[str, bytes]:
        mid = MessageId(queue_id, partition, offset)
        self.deliver_due()
        b = self._b
        with b._lock:
            it, index = self._find_locked(queue_id, partition, offset)
            q = b._by_id.get(queue_id)
            if index in it.cancelled:
                raise MessageNotFoundError(f"delayed message {mid} was cancelled")
            if it.state == _DROPPED or q is None:
                raise MessageNotFoundError(f"delayed message {mid}: its queue was deleted")
            if it.state == _PENDING:
                return q.name, single_message_batch(it.batch, index, queue_id, partition, offset, it.accepted_ms)
            off = it.delivered_offset + index - sum(1 for c in it.cancelled if c < index)
        name, stored = b.lookup_id(queue_id, it.partition, off)
        h = decode_header(stored)
        return name, single_message_batch(stored, off - h.base_offset, queue_id, it.partition, off, h.timestamp_ms)

    def stats(self) -> DelayStats:
        self.deliver_due()
        b = self._b
        with b._lock:
            now = b._now()
            per: dict[int, int] = {}
            batches = 0
            for (start, _), it in self._items.items():
                if it.state == _PENDING:
                    per[start] = per.get(start, 0) + it.count - len(it.cancelled)
                    batches += 1
            due = [
                at
                for at, s, n in self._heap
                if self._items[(s, n)].state == _PENDING and self._items[(s, n)].attempt_ms == at
            ]
            p50, p99, mx = self.counters.lateness()
            c = self.counters
            return DelayStats(
                now_ms=now,
                pending_messages=sum(per.values()),
                pending_batches=batches,
                next_due_ms=min(due) if due else None,
                accepted_total=c.accepted,
                delivered_total=c.delivered,
                cancelled_total=c.cancelled,
                dropped_total=c.dropped,
                delivered_per_s=c.rate_per_s(),
                lateness_p50_ms=p50,
                lateness_p99_ms=p99,
                lateness_max_ms=mx,
                loaded_batches=batches,
                bucket_ms=self.bucket_ms,
                buckets=[DelayBucketStats(s, s + self.bucket_ms, m, True) for s, m in sorted(per.items())],
            )
