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

import msgspec

from headwater.errors import (
    ClosedError,
    GroupNotFoundError,
    InvalidArgumentError,
    MessageNotFoundError,
    PartitionOutOfRangeError,
    QueueDisabledError,
    QueueExistsError,
    QueueNotFoundError,
    SubscriberExistsError,
    SubscriberNotFoundError,
)
from headwater.model.batch import broker_prefix, decode_records, validate_batch
from headwater.model.checks import check_int_arg, check_offsets_given, check_queue_arg
from headwater.model.config import (
    PARTITIONS_MAX,
    PartitionInfo,
    QueueConfig,
    QueueInfo,
    check_user_queue,
    validate_queue_name,
)
from headwater.model.delay import DELAYED_PARTITION_BIT, DelayStats, peek_deliver_at
from headwater.model.filtering import TagMaskFilter, filter_batches, select_batches
from headwater.model.groups import GroupAssignment, GroupDescription, GroupSummary, Membership
from headwater.model.keyed import KeyedFetchResult, KeyedGroupInfo, KeyedGroupState, KeyHashFilter, parse_key_spec
from headwater.model.producer_state import ProducerStateTable
from headwater.model.service import FetchResult, ProduceResult
from headwater.model.shared import LeaseRefusal, SharedDeliveries, SharedGroupInfo
from headwater.model.shared_groups import SharedGroupsCore
from headwater.model.subscription import (
    SubscriberInfo,
    check_checkpoint,
    normalize_partitions,
    normalize_tags,
    resolve_start,
    validate_subscriber_name,
)
from headwater.testing.memory_delay import MemoryDelay

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
        # sessions on a monotonic clock, unless a test passed its own (as the broker does)
        self._group_clock = time.monotonic if clock is time.time else clock
        self._groups = Membership(self._partition_count, incarnation="mem")
        self._lock = threading.RLock()
        self._queues: dict[str, _Q] = {}
        self._by_id: dict[int, _Q] = {}
        self._next_id = 1
        self._last_ts = 0
        self._closed = False
        self._appended = threading.Condition()
        self._append_listeners: list[Callable[[str, int, int], None]] = []
        self._offsets: dict[tuple[str, int, int], int] = {}
        self._producers = ProducerStateTable()
        self._keyed: dict[tuple[int, str], KeyedGroupInfo] = {}
        self._subscribers: dict[tuple[int, str], SubscriberInfo] = {}
        self._shared = _MemoryShared(self)  # shared groups: the broker's operations, state in memory
        self.clock = clock  # producers in this process turn delay= into times with it
        self._delay = MemoryDelay(self)  # delayed messages (headwater.testing.memory_delay)

    def _now(self) -> int:
        return int(self._clock() * 1000)

    def _q(self, name: str, *, usable: bool = False) -> _Q:
        check_user_queue(name)  # the broker's own queues (__offsets, ...): not for users to name
        if self._closed:
            raise ClosedError("the in-memory broker is closed")
        q = self._queues.get(name)
        if q is None:
            check_queue_arg(name)
            raise QueueNotFoundError(f"queue {name!r} does not exist; create it first")
        if usable and not q.enabled:
            raise QueueDisabledError(f"queue {name!r} is disabled; enable it to read or write")
        return q

    @staticmethod
    def _p(q: _Q, partition: int) -> _Part:
        check_int_arg(partition, "a partition")
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
        return QueueInfo(
            name=q.name,
            queue_id=q.qid,
            config=q.config,
            enabled=q.enabled,
            created_ms=q.created_ms,
            partitions=[PartitionInfo(i, self._start(q, p, now), p.end) for i, p in enumerate(q.parts)],
        )

    # admin
    def create_queue(self, name: str, config: QueueConfig) -> QueueInfo:
        validate_queue_name(check_user_queue(name))
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
        self._delay.deliver_due()
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
        if peek_deliver_at(batch):  # a delayed message: scheduled, not appended (see Broker)
            return self._delay.accept(q, partition, batch)
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
        self._wake_readers({queue: {partition: base + h.count}})
        return ProduceResult(q.qid, partition, base, h.count, ts)

    def add_append_listener(self, fn: Callable[[str, int, int], None]) -> None:
        """Call ``fn(queue, partition, end_offset)`` after every append, from the appending
        thread (the real broker's call; ``headwater.aio`` waits on it)."""
        self._append_listeners.append(fn)

    def _wake_readers(self, ends: dict[str, dict[int, int]]) -> None:
        """After appends (outside the lock): wake long polls, listeners and shared groups.
        ``ends``: per queue, per partition, the end offset now."""
        with self._appended:
            self._appended.notify_all()
        for queue, parts in ends.items():
            for partition, end in parts.items():
                for fn in self._append_listeners:
                    fn(queue, partition, end)
            self._shared.notify(queue)

    def fetch(
        self,
        queue: str,
        partition: int,
        offset: int,
        *,
        max_bytes: int,
        tag_mask: int = 0,
        end_offset: int | None = None,
        max_wait_ms: int = 0,
    ) -> FetchResult:
        check_user_queue(queue)
        check_int_arg(offset, "an offset")
        deadline = time.monotonic() + max_wait_ms / 1000
        self._delay.deliver_due()
        while True:
            res = self._fetch_now(queue, partition, offset, max_bytes, tag_mask, end_offset)
            remaining = deadline - time.monotonic()
            if remaining <= 0 or res.settles(offset, end_offset):
                return res
            with self._appended:
                if self._q(queue).parts[partition].end <= offset:
                    self._appended.wait(remaining)

    def _fetch_now(
        self, queue: str, partition: int, offset: int, max_bytes: int, tag_mask: int, end_offset: int | None
    ) -> FetchResult:
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
            if tag_mask and out:  # whole batches were skipped above; drop the rest of the misses
                out = filter_batches(
                    out, TagMaskFilter(tag_mask), start_offset=max(offset, start), end_offset=end_offset
                )
            return FetchResult(out, cur, start, p.end)

    def lookup_id(self, queue_id: int, partition: int, offset: int) -> tuple[str, bytes]:
        if isinstance(partition, int) and partition & DELAYED_PARTITION_BIT:
            return self._delay.lookup(queue_id, partition, offset)
        with self._lock:
            q = self._by_id.get(queue_id)
            if q is None:
                raise MessageNotFoundError(f"no queue has id {queue_id} (was it deleted?)")
            q = self._q(q.name, usable=True)
            p = self._p(q, partition)
            start = self._start(q, p, self._now())
            if not start <= offset < p.end:
                raise MessageNotFoundError(
                    f"offset {offset} of {q.name}[{partition}] is not retained (retained: {start}..{p.end - 1})"
                    if start < p.end
                    else f"offset {offset} of {q.name}[{partition}] is not retained (the partition is empty)"
                )
            i = bisect_right(p.bases, offset) - 1
            return q.name, p.batches[i]

    def lookup_key(self, queue: str, key: bytes, start_ms: int | None, end_ms: int | None, limit: int) -> list[bytes]:
        check_user_queue(queue)
        if not isinstance(key, bytes):
            raise InvalidArgumentError(f"a key is bytes, got {type(key).__name__}")
        with self._lock:
            q = self._q(queue, usable=True)
            now = self._now()
            out = []
            for p in q.parts:
                start = self._start(q, p, now)
                for base, count, ts, b in zip(p.bases, p.counts, p.timestamps, p.batches):
                    if (
                        base + count <= start
                        or (start_ms is not None and ts < start_ms)
                        or (end_ms is not None and ts >= end_ms)
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

    def commit_offsets(
        self,
        group: str,
        queue: str,
        offsets: dict[int, int],
        member_id: str | None = None,
        generation: int | None = None,
    ) -> None:
        # the checks in the broker's order (Broker, GroupCoordinator, OffsetStore.commit)
        check_user_queue(queue)
        _check_group(group)
        with self._lock:
            parts = list(offsets) if isinstance(offsets, dict) else []
            self._groups.check_commit(group, member_id, generation, queue, parts, self._group_now())
            check_offsets_given(offsets)
            q = self._q(queue)
            now = self._now()
            for part, off in offsets.items():
                if isinstance(part, bool) or not isinstance(part, int) or not 0 <= part < len(q.parts):
                    raise PartitionOutOfRangeError(
                        f"queue {queue!r} has partitions 0..{len(q.parts) - 1}; there is no partition {part!r}"
                    )
                p = q.parts[part]
                check_int_arg(off, "an offset")
                if off > p.end:
                    raise InvalidArgumentError(
                        f"cannot commit offset {off} for {queue}[{part}]: beyond the log end {p.end}"
                    )
                start = self._start(q, p, now)
                if off < start:
                    raise InvalidArgumentError(
                        f"cannot commit offset {off} for {queue}[{part}]: before the log start {start}"
                    )
            for part, off in offsets.items():
                self._offsets[(group, q.qid, part)] = off

    def fetch_offsets(self, group: str, queue: str) -> dict[int, int]:
        check_user_queue(queue)
        _check_group(group)
        with self._lock:
            q = self._q(queue)
            return {
                p: self._offsets[(group, q.qid, p)] for p in range(len(q.parts)) if (group, q.qid, p) in self._offsets
            }

    # consumer groups: the same state machine as the broker's coordinator
    def _group_now(self) -> float:
        return self._group_clock() * 1000.0

    def _partition_count(self, queue: str) -> int:
        q = self._queues.get(queue)
        return 0 if q is None else len(q.parts)

    def _group_offsets(self, group: str) -> dict[str, dict[int, int]]:
        out: dict[str, dict[int, int]] = {}
        for (g, qid, part), off in sorted(self._offsets.items()):
            q = self._by_id.get(qid)
            if g == group and q is not None:
                out.setdefault(q.name, {})[part] = off
        return dict(sorted(out.items()))

    def join_group(
        self,
        group: str,
        member_id: str | None,
        client_id: str,
        queues: list[str],
        mode: str,
        strategy: str,
        session_timeout_ms: int,
    ) -> GroupAssignment:
        with self._lock:
            self._q_open()
            return self._groups.join(
                group,
                member_id=member_id,
                client_id=client_id,
                queues=queues,
                mode=mode,
                strategy=strategy,
                session_timeout_ms=session_timeout_ms,
                now_ms=self._group_now(),
            )

    def heartbeat_group(self, group: str, member_id: str, generation: int) -> GroupAssignment:
        with self._lock:
            self._q_open()
            return self._groups.heartbeat(group, member_id, generation, self._group_now())

    def leave_group(self, group: str, member_id: str) -> None:
        with self._lock:
            self._q_open()
            self._groups.leave(group, member_id, self._group_now())

    def describe_group(self, group: str) -> GroupDescription:
        with self._lock:
            self._q_open()
            _check_group(group)
            return self._groups.describe(group, self._group_now(), self._group_offsets(group))

    def list_groups(self) -> list[GroupSummary]:
        with self._lock:
            self._q_open()
            queues: dict[str, set[str]] = {}
            for g, qid, _ in self._offsets:
                if qid in self._by_id:
                    queues.setdefault(g, set()).add(self._by_id[qid].name)
            keyed = sorted(
                (info.summary() for (qid, _), info in self._keyed.items() if qid in self._by_id),
                key=lambda g: (g.group, g.queues),
            )
            live = [self._info(q) for q in self._queues.values()]
            listed = self._groups.summaries(self._group_now(), queues) + keyed
        return listed + self._shared.summaries(live)  # (shared groups take their own lock, never inside ours)

    def _q_open(self) -> None:
        if self._closed:
            raise ClosedError("the in-memory broker is closed")

    # shared groups: the same operations and state machine as the broker (not durable)
    def shared_receive(
        self,
        group: str,
        queue: str,
        member: str,
        max_messages: int = 32,
        visibility_timeout_ms: int = 30_000,
        at_most_once: bool = False,
        settings: dict[str, int | float] | None = None,
        max_wait_ms: int = 0,
    ) -> SharedDeliveries:
        check_user_queue(queue)
        return self._shared.receive(
            group, queue, member, max_messages, visibility_timeout_ms, at_most_once, settings, max_wait_ms
        )

    def shared_ack(self, group: str, queue: str, member: str, lease_ids: list[str]) -> list[LeaseRefusal]:
        check_user_queue(queue)
        return self._shared.ack(group, queue, member, lease_ids)

    def shared_nack(
        self, group: str, queue: str, member: str, lease_ids: list[str], reason: str = "", delay_ms: int | None = None
    ) -> list[LeaseRefusal]:
        check_user_queue(queue)
        return self._shared.nack(group, queue, member, lease_ids, reason, delay_ms)

    def shared_extend(
        self, group: str, queue: str, member: str, lease_ids: list[str], visibility_timeout_ms: int
    ) -> list[LeaseRefusal]:
        check_user_queue(queue)
        return self._shared.extend(group, queue, member, lease_ids, visibility_timeout_ms)

    def shared_describe(self, group: str, queue: str) -> SharedGroupInfo:
        check_user_queue(queue)
        return self._shared.describe(group, queue)

    # keyed groups: the model's state machine, held in a dict (headwater.model.keyed)
    def _keyed_state(self, q: _Q, group: str) -> KeyedGroupInfo:
        info = self._keyed.get((q.qid, group))
        if info is None:
            raise GroupNotFoundError(
                f"queue {q.name!r} has no keyed group {group!r}; a member creates it "
                f"(client.keyed_consumer(..., size=N))"
            )
        return info

    def _ranges(self, q: _Q) -> dict[int, tuple[int, int]]:
        return {pi.partition: (pi.start_offset, pi.end_offset) for pi in self._info(q).partitions}

    def keyed_group(
        self, queue: str, group: str, key: str | None = None, size: int | None = None, start: str = "earliest"
    ) -> KeyedGroupInfo:
        check_user_queue(queue)
        _check_group(group)
        if (key is None) != (size is None):
            raise InvalidArgumentError("declare a keyed group with both key and size, or neither to look it up")
        with self._lock:
            q = self._q(queue)
            info = self._keyed.get((q.qid, group))
            if info is None:
                if key is None:
                    self._keyed_state(q, group)  # raises GroupNotFoundError
                st = KeyedGroupState.create(queue, group, key, size, start, self._ranges(q))  # type: ignore[arg-type]
            else:
                st = KeyedGroupState(info)
                st.check_declared(key, size)
                st.try_complete({p: lo for p, (lo, _) in self._ranges(q).items()})
            self._keyed[(q.qid, group)] = st.info
            return st.info

    def keyed_fetch(
        self,
        queue: str,
        group: str,
        member: int,
        generation: int,
        partition: int,
        offset: int,
        *,
        max_bytes: int,
        max_wait_ms: int = 0,
    ) -> KeyedFetchResult:
        check_user_queue(queue)
        _check_group(group)
        deadline = time.monotonic() + max_wait_ms / 1000
        while True:
            with self._lock:
                st = KeyedGroupState(self._keyed_state(self._q(queue), group))
                st.check_member(member, generation)
                stop = st.stop_offset(partition)
                res = self._fetch_now(queue, partition, offset, max_bytes, 0, stop)
            flt = KeyHashFilter(parse_key_spec(st.info.key), st.info.size, member)
            batches, selections = select_batches(
                res.batches, flt, start_offset=max(offset, res.start_offset), end_offset=stop
            )
            remaining = deadline - time.monotonic()
            if batches or res.next_offset != offset or remaining <= 0 or (stop is not None and offset >= stop):
                return KeyedFetchResult(
                    batches, res.next_offset, res.start_offset, res.end_offset, st.info.generation, stop, selections
                )
            with self._appended:
                if self._q(queue).parts[partition].end <= offset:
                    self._appended.wait(remaining)

    def keyed_commit(
        self, queue: str, group: str, member: int, generation: int, offsets: dict[int, int]
    ) -> KeyedGroupInfo:
        check_user_queue(queue)
        _check_group(group)
        with self._lock:
            q = self._q(queue)
            st = KeyedGroupState(self._keyed_state(q, group))
            ranges = self._ranges(q)
            st.commit(member, generation, offsets, ranges)
            st.try_complete({p: lo for p, (lo, _) in ranges.items()})
            self._keyed[(q.qid, group)] = st.info
            return st.info

    def keyed_resize(self, queue: str, group: str, size: int) -> KeyedGroupInfo:
        check_user_queue(queue)
        _check_group(group)
        with self._lock:
            q = self._q(queue)
            st = KeyedGroupState(self._keyed_state(q, group))
            ranges = self._ranges(q)
            st.resize(size, ranges)
            st.try_complete({p: lo for p, (lo, _) in ranges.items()})
            self._keyed[(q.qid, group)] = st.info
            return st.info

    # push subscribers: the registry (delivery over the fake is the client's pull loop)
    def _subscriber(self, q: _Q, name: str) -> SubscriberInfo:
        validate_subscriber_name(name)
        info = self._subscribers.get((q.qid, name))
        if info is None:
            raise SubscriberNotFoundError(
                f"queue {q.name!r} has no subscriber {name!r}; add it with 'headwater subscriber add {q.name} {name}'"
            )
        return info

    def add_subscriber(
        self,
        queue: str,
        name: str,
        partitions: list[int] | None = None,
        tags: list[str] | None = None,
        start: str = "latest",
    ) -> SubscriberInfo:
        check_user_queue(queue)  # first, as the broker does
        validate_subscriber_name(name)
        tag_list = normalize_tags(tags)
        with self._lock:
            q = self._q(queue)
            qi = self._info(q)
            parts = normalize_partitions(partitions, len(q.parts), queue)
            if (q.qid, name) in self._subscribers:
                raise SubscriberExistsError(
                    f"queue {queue!r} already has a subscriber {name!r} (its checkpoint is kept); "
                    f"delete it first to start over, or pick another name"
                )
            following = parts if parts is not None else list(range(len(q.parts)))
            checkpoints = resolve_start(start, qi, following, lambda p, ms: self.offset_for_time(queue, p, ms))
            info = SubscriberInfo(
                queue=queue, name=name, partitions=parts, tags=tag_list, created_ms=self._now(), checkpoints=checkpoints
            )
            self._subscribers[(q.qid, name)] = info
            return info

    def delete_subscriber(self, queue: str, name: str) -> None:
        with self._lock:
            q = self._q(queue)
            self._subscriber(q, name)
            del self._subscribers[(q.qid, name)]

    def list_subscribers(self, queue: str | None = None) -> list[SubscriberInfo]:
        with self._lock:
            qids = {self._q(queue).qid} if queue is not None else set(self._by_id)
            return sorted(
                (s for (qid, _), s in self._subscribers.items() if qid in qids), key=lambda s: (s.queue, s.name)
            )

    def describe_subscriber(self, queue: str, name: str) -> SubscriberInfo:
        with self._lock:
            return self._subscriber(self._q(queue), name)

    def checkpoint_subscriber(self, queue: str, name: str, offsets: dict[int, int]) -> None:
        with self._lock:
            q = self._q(queue)
            info = self._subscriber(q, name)
            checkpoints = check_checkpoint(info, offsets, self._ranges(q))
            self._subscribers[(q.qid, name)] = msgspec.structs.replace(info, checkpoints=checkpoints)

    # delayed messages (headwater.testing.memory_delay)
    def _append_stamped(self, queue_id: int, partition: int, batch: bytes | bytearray, stamp: int) -> ProduceResult:
        """Append a delivered delayed batch (lock held; the caller notifies readers)."""
        q = self._by_id.get(queue_id)
        if q is None:
            raise QueueNotFoundError(f"no queue has id {queue_id} (was it deleted?)")
        if not q.enabled:
            raise QueueDisabledError(f"queue {q.name!r} is disabled; enable it to read or write")
        p = self._p(q, partition)
        h, _ = validate_batch(batch, message_bytes_max=q.config.message_bytes_max)
        ts = max(self._now(), self._last_ts)
        self._last_ts = ts
        p.bases.append(p.end)
        p.counts.append(h.count)
        p.timestamps.append(ts)
        p.batches.append(broker_prefix(h.length, q.qid, partition, p.end, ts, stamp) + bytes(batch[40:]))
        base = p.end
        p.end += h.count
        return ProduceResult(q.qid, partition, base, h.count, ts)

    def cancel_delayed(self, queue_id: int, partition: int, offset: int) -> None:
        self._delay.cancel(queue_id, partition, offset)

    def delay_stats(self) -> DelayStats:
        return self._delay.stats()

    def status(self) -> dict[str, object]:
        with self._lock:
            return {
                "version": "memory",
                "mode": "memory",
                "queues": len(self._queues),
                "partitions": sum(len(q.parts) for q in self._queues.values()),
                "bytes": sum(len(b) for q in self._queues.values() for p in q.parts for b in p.batches),
                "recovery": [],
            }

    def close(self) -> None:
        self._delay.close()
        with self._lock:
            self._closed = True


class _MemoryShared(SharedGroupsCore):
    """Shared groups over the in-memory queues: the core's operations, nothing durable."""

    def __init__(self, broker: MemoryBroker) -> None:
        super().__init__(broker._clock)
        self._broker = broker

    def _queue_info(self, queue: str) -> QueueInfo:
        return self._broker.describe_queue(queue)

    def _read(self, queue: str, partition: int, offset: int, end_offset: int) -> FetchResult:
        return self._broker._fetch_now(queue, partition, offset, 16 << 20, 0, end_offset)

    def _append_dead_letters(self, dlq: str, like: QueueConfig, partition: int, batch: bytes) -> None:
        try:
            info = self._broker.describe_queue(dlq)
        except QueueNotFoundError:
            try:
                info = self._broker.create_queue(dlq, like)
            except QueueExistsError:
                info = self._broker.describe_queue(dlq)
        if not info.enabled:
            self._broker.set_queue_enabled(dlq, True)  # a dead letter must not be dropped
        self._broker.produce(dlq, partition % len(info.partitions), batch)


def _check_group(group: object) -> None:
    if not isinstance(group, str) or not _GROUP_RE.match(group):
        raise InvalidArgumentError(
            f"invalid group name {group!r}: use 1-200 letters, digits, '.', '_' and '-', "
            f"starting with a letter or digit"
        )
