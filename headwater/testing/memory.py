"""MemoryBroker: the BrokerService contract held in memory.

It validates and stores record batches exactly as the real broker does (same codec, same
checks, same errors), keeps them in per-partition lists, and applies TTL, truncation,
disable and lookups with the same rules. What it does not do is persist anything.
"""

from __future__ import annotations

import re
import threading
import time
from bisect import bisect_left, bisect_right
from collections.abc import Callable

from headwater.errors import (
    ClosedError,
    InvalidArgumentError,
    MessageNotFoundError,
    PartitionOutOfRangeError,
    QueueDisabledError,
    QueueExistsError,
    QueueNotFoundError,
)
from headwater.model.batch import broker_prefix, decode_records, validate_batch
from headwater.model.config import PARTITIONS_MAX, PartitionInfo, QueueConfig, QueueInfo, validate_queue_name
from headwater.model.producer_state import ProducerStateTable
from headwater.model.service import FetchResult, ProduceResult

__all__ = ["MemoryBroker"]

_GROUP_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")


class _Part:
    __slots__ = ("start", "end", "bases", "timestamps", "batches", "counts")

    def __init__(self) -> None:
        self.start = 0
        self.end = 0
        self.bases: list[int] = []
        self.counts: list[int] = []
        self.timestamps: list[int] = []
        self.batches: list[bytes] = []


class _Q:
    def __init__(self, name: str, qid: int, config: QueueConfig, now: int) -> None:
        self.name, self.qid, self.config, self.created_ms = name, qid, config, now
        self.enabled = True
        self.parts = [_Part() for _ in range(config.partitions)]


class MemoryBroker:
    """An in-memory BrokerService for tests. Thread-safe."""

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.RLock()
        self._queues: dict[str, _Q] = {}
        self._by_id: dict[int, _Q] = {}
        self._next_id = 1
        self._last_ts = 0
        self._closed = False
        self._appended = threading.Condition()
        self._offsets: dict[tuple[str, int, int], int] = {}
        self._producers = ProducerStateTable()

    def _now(self) -> int:
        return int(self._clock() * 1000)

    def _q(self, name: str, *, usable: bool = False) -> _Q:
        if self._closed:
            raise ClosedError("the in-memory broker is closed")
        q = self._queues.get(name)
        if q is None:
            raise QueueNotFoundError(f"queue {name!r} does not exist; create it first")
        if usable and not q.enabled:
            raise QueueDisabledError(f"queue {name!r} is disabled; enable it to read or write")
        return q

    @staticmethod
    def _p(q: _Q, partition: int) -> _Part:
        if isinstance(partition, bool) or not isinstance(partition, int):
            raise InvalidArgumentError(f"a partition is an int, got {type(partition).__name__}")
        if not 0 <= partition < len(q.parts):
            raise PartitionOutOfRangeError(
                f"queue {q.name!r} has partitions 0..{len(q.parts) - 1}; there is no partition {partition}"
            )
        return q.parts[partition]

    def _start(self, q: _Q, p: _Part, now: int) -> int:
        if q.config.ttl_s is None:
            return p.start
        i = bisect_left(p.timestamps, now - q.config.ttl_s * 1000)
        first = p.bases[i] if i < len(p.bases) else p.end
        return max(p.start, first)

    def _info(self, q: _Q) -> QueueInfo:
        now = self._now()
        return QueueInfo(name=q.name, queue_id=q.qid, config=q.config, enabled=q.enabled,
                         created_ms=q.created_ms,
                         partitions=[PartitionInfo(i, self._start(q, p, now), p.end)
                                     for i, p in enumerate(q.parts)])

    # admin
    def create_queue(self, name: str, config: QueueConfig) -> QueueInfo:
        validate_queue_name(name)
        config.validated()
        with self._lock:
            if self._closed:
                raise ClosedError("the in-memory broker is closed")
            if name in self._queues:
                raise QueueExistsError(f"queue {name!r} already exists")
            q = _Q(name, self._next_id, config, self._now())
            self._next_id += 1
            self._queues[name] = self._by_id[q.qid] = q
            return self._info(q)

    def describe_queue(self, name: str) -> QueueInfo:
        with self._lock:
            return self._info(self._q(name))

    def list_queues(self) -> list[QueueInfo]:
        with self._lock:
            if self._closed:
                raise ClosedError("the in-memory broker is closed")
            return [self._info(q) for _, q in sorted(self._queues.items())]

    def delete_queue(self, name: str) -> None:
        with self._lock:
            q = self._q(name)
            del self._queues[name], self._by_id[q.qid]

    def truncate_queue(self, name: str) -> QueueInfo:
        with self._lock:
            q = self._q(name)
            for p in q.parts:
                p.start = p.end
            return self._info(q)

    def set_queue_enabled(self, name: str, enabled: bool) -> QueueInfo:
        with self._lock:
            q = self._q(name)
            q.enabled = bool(enabled)
            return self._info(q)

    def add_partitions(self, name: str, partitions: int) -> QueueInfo:
        with self._lock:
            q = self._q(name)
            n = len(q.parts)
            if isinstance(partitions, bool) or not isinstance(partitions, int) or not n < partitions <= PARTITIONS_MAX:
                raise InvalidArgumentError(
                    f"queue {name!r} has {n} partitions; the new count must be larger "
                    f"(up to {PARTITIONS_MAX}), got {partitions!r}"
                )
            q.config = q.config.replace(partitions=partitions)
            q.parts.extend(_Part() for _ in range(partitions - n))
            return self._info(q)

    # data
    def produce(self, queue: str, partition: int, batch: bytes) -> ProduceResult:
        q = self._q(queue, usable=True)
        self._p(q, partition)
        h, _ = validate_batch(batch, message_bytes_max=q.config.message_bytes_max)
        with self._lock:
            q = self._q(queue, usable=True)
            p = self._p(q, partition)
            dup = self._producers.check(h, q.qid, partition)
            if dup is not None:  # an idempotent retry: the original placement
                return dup
            ts = max(self._now(), self._last_ts)
            self._last_ts = ts
            stored = broker_prefix(h.length, q.qid, partition, p.end, ts) + bytes(batch[40:])
            p.bases.append(p.end)
            p.counts.append(h.count)
            p.timestamps.append(ts)
            p.batches.append(stored)
            base = p.end
            p.end += h.count
            self._producers.record(h, q.qid, partition, base, ts)
        with self._appended:
            self._appended.notify_all()
        return ProduceResult(q.qid, partition, base, h.count, ts)

    def fetch(self, queue: str, partition: int, offset: int, *, max_bytes: int, tag_mask: int = 0,
              end_offset: int | None = None, max_wait_ms: int = 0) -> FetchResult:
        if isinstance(offset, bool) or not isinstance(offset, int):
            raise InvalidArgumentError(f"an offset is an int, got {type(offset).__name__}")
        deadline = time.monotonic() + max_wait_ms / 1000
        while True:
            res = self._fetch_now(queue, partition, offset, max_bytes, tag_mask, end_offset)
            remaining = deadline - time.monotonic()
            if res.batches or res.next_offset != offset or remaining <= 0 or (
                end_offset is not None and offset >= end_offset
            ):
                return res
            with self._appended:
                if self._q(queue).parts[partition].end <= offset:
                    self._appended.wait(remaining)

    def _fetch_now(self, queue: str, partition: int, offset: int, max_bytes: int, tag_mask: int,
                   end_offset: int | None) -> FetchResult:
        with self._lock:
            q = self._q(queue, usable=True)
            p = self._p(q, partition)
            start = self._start(q, p, self._now())
            stop = p.end if end_offset is None else min(end_offset, p.end)
            cur = max(offset, start)
            i = max(bisect_right(p.bases, cur) - 1, 0)
            out: list[bytes] = []
            total = 0
            while i < len(p.bases) and cur < stop and total < max_bytes:
                base, count, b = p.bases[i], p.counts[i], p.batches[i]
                i += 1
                if base + count <= cur:
                    continue
                cur = base + count
                mask = int.from_bytes(b[80:88], "little")
                if tag_mask and not mask & tag_mask:
                    continue
                out.append(b)
                total += len(b)
            return FetchResult(out, cur, start, p.end)

    def lookup_id(self, queue_id: int, partition: int, offset: int) -> tuple[str, bytes]:
        with self._lock:
            q = self._by_id.get(queue_id)
            if q is None:
                raise MessageNotFoundError(f"no queue has id {queue_id} (was it deleted?)")
            q = self._q(q.name, usable=True)
            p = self._p(q, partition)
            start = self._start(q, p, self._now())
            if not start <= offset < p.end:
                raise MessageNotFoundError(f"offset {offset} of {q.name}[{partition}] is not retained")
            i = bisect_right(p.bases, offset) - 1
            return q.name, p.batches[i]

    def lookup_key(self, queue: str, key: bytes, start_ms: int | None, end_ms: int | None,
                   limit: int) -> list[bytes]:
        if not isinstance(key, bytes):
            raise InvalidArgumentError(f"a key is bytes, got {type(key).__name__}")
        with self._lock:
            q = self._q(queue, usable=True)
            now = self._now()
            out = []
            for p in q.parts:
                start = self._start(q, p, now)
                for base, count, ts, b in zip(p.bases, p.counts, p.timestamps, p.batches):
                    if base + count <= start or (start_ms is not None and ts < start_ms) or (
                        end_ms is not None and ts >= end_ms
                    ):
                        continue
                    if any(r.key == key for r in decode_records(b, queue, start_offset=start)):
                        out.append(b)
            out.sort(key=lambda b: int.from_bytes(b[24:32], "little"))
            return out[:limit]

    def offset_for_time(self, queue: str, partition: int, timestamp_ms: int) -> int:
        with self._lock:
            q = self._q(queue, usable=True)
            p = self._p(q, partition)
            i = bisect_left(p.timestamps, timestamp_ms)
            found = p.bases[i] if i < len(p.bases) else p.end
            return max(found, self._start(q, p, self._now()))

    def commit_offsets(self, group: str, queue: str, offsets: dict[int, int]) -> None:
        if not isinstance(group, str) or not _GROUP_RE.match(group):
            raise InvalidArgumentError(f"invalid group name {group!r}")
        if not isinstance(offsets, dict) or not offsets:
            raise InvalidArgumentError("offsets is a non-empty {partition: offset} mapping")
        with self._lock:
            q = self._q(queue)
            now = self._now()
            for part, off in offsets.items():
                p = self._p(q, part)
                if isinstance(off, bool) or not isinstance(off, int):
                    raise InvalidArgumentError(f"an offset is an int, got {type(off).__name__}")
                if off > p.end:
                    raise InvalidArgumentError(f"cannot commit offset {off} for {queue}[{part}]: beyond the log end {p.end}")
                if off < self._start(q, p, now):
                    raise InvalidArgumentError(f"cannot commit offset {off} for {queue}[{part}]: before the log start")
            for part, off in offsets.items():
                self._offsets[(group, q.qid, part)] = off

    def fetch_offsets(self, group: str, queue: str) -> dict[int, int]:
        if not isinstance(group, str) or not _GROUP_RE.match(group):
            raise InvalidArgumentError(f"invalid group name {group!r}")
        with self._lock:
            q = self._q(queue)
            return {p: self._offsets[(group, q.qid, p)] for p in range(len(q.parts))
                    if (group, q.qid, p) in self._offsets}

    def status(self) -> dict[str, object]:
        with self._lock:
            return {"version": "memory", "mode": "memory", "queues": len(self._queues),
                    "partitions": sum(len(q.parts) for q in self._queues.values()),
                    "bytes": sum(len(b) for q in self._queues.values() for p in q.parts for b in p.batches),
                    "recovery": []}

    def close(self) -> None:
        with self._lock:
            self._closed = True
