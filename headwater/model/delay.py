"""Delayed messages: ids, deliver times, and what the broker does to a batch it delivers.

Pure values and functions, shared by the broker's delay service
(:mod:`headwater.broker.delay`) and the clients. No I/O.

**Ids.** A delayed batch accepted by the broker is kept in a *bucket* of the schedule (the
messages due in one span of time, ``delay_bucket_s`` long) and numbered there: message
numbers count up from 0 within each bucket, a batch of ``n`` messages taking ``n`` numbers.
Until it is delivered, a message's id is::

    MessageId(queue_id, 0x80000000 | partition, offset)
    offset = (bucket_start_ms // 60_000) << 35 | number

The high bit of the partition field says "scheduled, not in the log yet"; the offset holds
the bucket's start in minutes (29 bits: until the year 2990) and the number (35 bits), so
the broker finds the message from its id without an index in memory. The same 64-bit value
is the batch's *stamp*: the broker writes the stamp of a batch's first message in the
``broker_reserved`` field of the batch it appends at delivery, so the log itself records
which scheduled batches were delivered (docs/design/delay.md).

>>> off = delay_offset(1_800_000_000_000 // 3_600_000 * 3_600_000, 7)
>>> split_delay_offset(off)
(1800000000000, 7)
>>> resolve_deliver_at(None, 90, now_ms=1_000)
91000
>>> resolve_deliver_at(None, 0, now_ms=1_000)
0
"""

from __future__ import annotations

import bisect
import math
import time
from collections import deque
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec

from headwater.errors import InvalidArgumentError, InvalidBatchError
from headwater.model.batch import (
    COMPRESSION_LZ4,
    COMPRESSION_MASK,
    COMPRESSION_ZSTD,
    FLAG_DELIVER_TIMES,
    FLAG_HAS_KEYS,
    FLAG_HAS_PROPERTIES,
    FLAG_HAS_TAGS,
    FLAG_TRANSACTIONAL,
    HEADER,
    HEADER_SIZE,
    MAGIC,
    BatchPayload,
    crc32c,
    decode_header,
    decode_payload,
    encode_batch,
    patch_batch,
    tags_mask,
)
from headwater.model.batch_reads import decode_records
from headwater.model.groups import HandedOffGroup
from headwater.model.message import Message, datetime_ms, warn_caller, warn_if_local_naive
from headwater.model.shared import HandedOffShared

__all__ = [
    "DELAYED_PARTITION_BIT",
    "SECONDS_LOOK",
    "BUCKET_UNIT_MS",
    "NUMBER_BITS",
    "DELAY_MAX_S_DEFAULT",
    "delay_offset",
    "split_delay_offset",
    "is_delayed_partition",
    "resolve_deliver_at",
    "check_deliver_at",
    "peek_deliver_at",
    "prepare_delivery",
    "delivery_groups",
    "single_message_batch",
    "DelayBucketStats",
    "DelayStats",
    "DelayCounters",
    "HandedOffBatch",
    "HandoffPage",
]

DELAYED_PARTITION_BIT = 0x80000000
BUCKET_UNIT_MS = 60_000  # bucket starts are whole minutes
NUMBER_BITS = 35
NUMBER_LIMIT = 1 << NUMBER_BITS  # message numbers per bucket
DELAY_MAX_S_DEFAULT = 2 * 366 * 86_400  # two years, as QMQ
_DELIVER_AT = slice(56, 64)


def delay_offset(bucket_start_ms: int, number: int) -> int:
    """The id offset (and stamp) of message ``number`` of the bucket starting at ``bucket_start_ms``."""
    assert bucket_start_ms % BUCKET_UNIT_MS == 0 and 0 <= number < NUMBER_LIMIT
    return (bucket_start_ms // BUCKET_UNIT_MS) << NUMBER_BITS | number


def split_delay_offset(offset: int) -> tuple[int, int]:
    """``(bucket_start_ms, number)`` of a delayed id's offset."""
    return (offset >> NUMBER_BITS) * BUCKET_UNIT_MS, offset & (NUMBER_LIMIT - 1)


def is_delayed_partition(partition: int) -> bool:
    return bool(partition & DELAYED_PARTITION_BIT)


def resolve_deliver_at(deliver_at: object = None, delay: object = None, *, now_ms: int | None = None) -> int:
    """The ``deliver_at_ms`` a batch carries for ``send(..., deliver_at=...)`` or ``delay=``.

    ``deliver_at`` is a datetime (naive means UTC) or epoch milliseconds; ``delay`` is a
    timedelta or seconds. 0 means "deliver now": neither given, a zero delay, or a time
    that is not in the future. Raises :class:`InvalidArgumentError` for anything else.
    """
    if deliver_at is None and delay is None:
        return 0
    if deliver_at is not None and delay is not None:
        raise InvalidArgumentError("pass deliver_at or delay, not both")
    now = int(time.time() * 1000) if now_ms is None else now_ms
    if delay is not None:
        if isinstance(delay, timedelta):
            ms = delay / timedelta(milliseconds=1)
        elif isinstance(delay, (int, float)) and not isinstance(delay, bool):
            ms = delay * 1000
        else:
            raise InvalidArgumentError(f"delay is a timedelta or a number of seconds, got {type(delay).__name__}")
        if ms != ms or ms < 0:  # NaN or negative
            raise InvalidArgumentError(f"delay must be zero or positive, got {delay!r}")
        if ms > 1e15:
            raise InvalidArgumentError(f"delay {delay!r} is beyond any deliverable time")
        at = now + math.ceil(ms) if ms else 0  # a fraction of a ms rounds up: never early
    elif isinstance(deliver_at, datetime):
        warn_if_local_naive(deliver_at, "deliver_at")
        at = datetime_ms(deliver_at)  # a fraction of a ms rounds up: never early
    elif isinstance(deliver_at, (int, float)) and not isinstance(deliver_at, bool):
        if deliver_at != deliver_at or not -1e15 < deliver_at < 1e15:
            raise InvalidArgumentError(f"deliver_at {deliver_at!r} is not a time")
        at = math.ceil(deliver_at)  # as a datetime's fraction of a ms: never early
        if SECONDS_LOOK[0] <= deliver_at < SECONDS_LOOK[1]:
            _warn_seconds(deliver_at)
    else:
        raise InvalidArgumentError(f"deliver_at is a datetime or epoch milliseconds, got {type(deliver_at).__name__}")
    return at if at > now else 0


#: epoch times from 2001 to 2286 in seconds: as epoch milliseconds they fall in January 1970,
#: a time nobody schedules on purpose (``time.time() + 60`` where ``* 1000`` was meant)
SECONDS_LOOK = (1e9, 1e10)


def _warn_seconds(deliver_at: float) -> None:
    warn_caller(
        f"deliver_at={deliver_at!r} looks like epoch seconds: it is taken as epoch milliseconds, "
        f"a moment in January 1970, so the message goes at once; pass milliseconds "
        f"(time.time() * 1000 + ...), an aware datetime, or delay= in seconds"
    )


def check_deliver_at(deliver_at_ms: int, now_ms: int, delay_max_s: int) -> None:
    """Refuse a deliver time beyond the broker's bound (setting ``delay_max_s``)."""
    if deliver_at_ms - now_ms > delay_max_s * 1000:
        when = (
            datetime.fromtimestamp(deliver_at_ms / 1000, tz=UTC).isoformat(timespec="seconds")
            if deliver_at_ms < 253402300799000
            else f"{deliver_at_ms} ms"
        )
        raise InvalidArgumentError(
            f"deliver time {when} is more than delay_max_s={delay_max_s} seconds "
            f"({delay_max_s / 86400:g} days) ahead; the broker's bound is the setting delay_max_s"
        )


def peek_deliver_at(batch: bytes | bytearray | memoryview) -> int:
    """The ``deliver_at_ms`` field of a producer's batch (0 if it is too short to have one:
    validation then names the problem)."""
    if len(batch) < HEADER_SIZE:
        return 0
    return int.from_bytes(batch[_DELIVER_AT], "little", signed=True)


_CODEC_NAMES = {COMPRESSION_ZSTD: "zstd", COMPRESSION_LZ4: "lz4"}
_encoder = msgspec.msgpack.Encoder()


def delivery_groups(deliver_at_ms: int, count: int, offsets: list[int] | None) -> list[tuple[int, int, int]]:
    """The runs of a delayed batch that come due together: ``(due_ms, first, end)`` index
    ranges, in due order (one run for a batch of one deliver time).

    >>> delivery_groups(1000, 4, [0, 0, 5, 5])
    [(1000, 0, 2), (1005, 2, 4)]
    """
    if offsets is None:
        return [(deliver_at_ms, 0, count)]
    out = []
    first = 0
    for i in range(1, count + 1):
        if i == count or offsets[i] != offsets[first]:
            out.append((deliver_at_ms + offsets[first], first, i))
            first = i
    return out


def prepare_delivery(
    batch: bytes | memoryview,
    cancelled: Iterable[int] = (),
    first: int = 0,
    end: int | None = None,
    *,
    payload: BatchPayload | None = None,
) -> bytearray | None:
    """Messages ``[first, end)`` of a producer's delayed batch as they are appended at
    delivery, or None if every one of them was cancelled.

    The messages at the indexes in ``cancelled`` are left out, and so are the other runs of
    a batch of several deliver times: then the batch is encoded again (with its
    compression), due at the run's time. The idempotence fields are cleared: they were
    checked when the batch was accepted, and the sequence numbers of delayed batches count
    apart from the partition's (so the log's own check must not see them).
    ``deliver_at_ms`` stays: the records read back carry it as ``scheduled_ms``.
    ``payload``: the batch's, already decoded, when the caller delivers several runs of it.
    """
    h = decode_header(batch)
    end = h.count if end is None else end
    gone = {i for i in cancelled if first <= i < end}
    if not (gone or first or end != h.count or h.flags & FLAG_DELIVER_TIMES):
        out = bytearray(batch)
        fields = list(HEADER.unpack_from(out, 0))
        fields[14], fields[15], fields[16] = -1, -1, -1  # producer_id, base_sequence, producer_epoch
        HEADER.pack_into(out, 0, *fields)
        out[40:44] = crc32c(memoryview(out)[44:]).to_bytes(4, "little")
        return out
    if h.flags & FLAG_TRANSACTIONAL:
        raise InvalidBatchError("a transactional batch cannot be split")
    p = payload if payload is not None else decode_payload(batch, h)
    idx = [i for i in range(first, end) if i not in gone]
    if not idx:
        return None
    offsets = getattr(p, "deliver_offsets", None)
    due = h.deliver_at_ms + (offsets[first] if offsets else 0)
    return _encode_subset(p, idx, due, h.flags & COMPRESSION_MASK)


def _encode_subset(p: BatchPayload, idx: list[int], deliver_at_ms: int, codec: int) -> bytearray:
    """The messages ``idx`` of a decoded payload as a batch of their own (no producer)."""

    def column(col: list[Any] | None) -> list[Any] | None:
        if col is None:
            return None
        picked = [col[i] for i in idx]
        return picked if any(v is not None for v in picked) else None

    bodies = [p.bodies[i] for i in idx]
    keys, tags, props = column(p.keys), column(p.tags), column(p.properties)
    if codec:  # rare: compressed delayed batches take the general path
        msgs = [
            Message(
                b,
                None if keys is None else keys[j],
                None if tags is None else tags[j],
                None if props is None else props[j],
            )
            for j, b in enumerate(bodies)
        ]
        return encode_batch(msgs, compression=_CODEC_NAMES.get(codec), deliver_at_ms=deliver_at_ms)
    flags = (
        (FLAG_HAS_KEYS if keys is not None else 0)
        | (FLAG_HAS_TAGS if tags is not None else 0)
        | (FLAG_HAS_PROPERTIES if props is not None else 0)
    )
    mask = tags_mask({t for t in tags if t is not None}) if tags is not None else 0
    buf = bytearray(HEADER_SIZE)
    _encoder.encode_into(BatchPayload(bodies, keys, tags, props), buf, HEADER_SIZE)
    size = len(buf) - HEADER_SIZE
    HEADER.pack_into(
        buf,
        0,
        HEADER_SIZE - 4 + size,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        MAGIC,
        flags,
        HEADER_SIZE,
        len(bodies),
        size,
        deliver_at_ms,
        -1,
        -1,
        -1,
        0,
        mask,
        0,
    )
    with memoryview(buf) as mv:
        buf[40:44] = crc32c(mv[44:]).to_bytes(4, "little")
    return buf


def single_message_batch(
    batch: bytes | memoryview, index: int, queue_id: int, partition: int, offset: int, timestamp_ms: int
) -> bytearray:
    """A stored batch holding only message ``index`` of ``batch``, placed at ``offset``:
    how the broker answers a lookup of a delayed id (one message, whatever its batch)."""
    h = decode_header(batch)
    r = decode_records(batch, "", header=h)[index]
    one = encode_batch([Message(r.body, r.key, r.tag, r.properties)], deliver_at_ms=r.scheduled_ms or 0)
    return patch_batch(one, queue_id, partition, offset, timestamp_ms)


class DelayBucketStats(msgspec.Struct, frozen=True, array_like=True):
    """One bucket of the schedule: the messages due in ``[start_ms, end_ms)``."""

    start_ms: int
    end_ms: int
    pending_messages: int
    loaded: bool  # held in memory (due soon), not only on disk


class HandedOffBatch(msgspec.Struct, frozen=True, array_like=True):
    """A pending delayed batch handed from a partition's old leader to its new one when the
    partition moves (docs/design/delay.md, "On a cluster"): the batch as its producer sent
    it, the delayed offset its producer was given for its first message (``origin``: the id
    keeps working on the new leader), its place in the old leader's acceptance order
    (``accept_seq``: the new leader adopts in that order, so each producer's sequences stay
    in order in its idempotence table), its acceptance time, and what became of it so far:
    ``cancelled`` message indexes, and ``delivered`` runs as (index of the run's first
    message, its base offset in the partition, which the new leader copied)."""

    origin: int
    accept_seq: int
    accepted_ms: int
    batch: bytes
    cancelled: list[int] = []
    delivered: list[tuple[int, int]] = []


class HandoffPage(msgspec.Struct, frozen=True, array_like=True):
    """Some of a partition's delayed batches, by ascending ``accept_seq``; ``more``: ask
    again after the last one's. A page of the partition's shared-group state instead (the
    request's ``shared``) holds no batches but ``shared``, by group name; one of a
    coordinator queue partition's consumer groups (``groups``) holds ``groups``, by name;
    ``more``: ask again after the index of the last group handed."""

    batches: list[HandedOffBatch]
    more: bool
    shared: list[HandedOffShared] = []
    groups: list[HandedOffGroup] = []


class DelayStats(msgspec.Struct, frozen=True, kw_only=True):
    """What ``headwater delay stats`` shows: the schedule, deliveries and their lateness.

    ``lateness_*_ms`` are over the last deliveries (up to ``LATENESS_SAMPLES`` batches,
    weighted by messages): delivery time minus scheduled time. ``delivered_per_s`` is the
    rate over the last ``RATE_WINDOW_S`` seconds.
    """

    now_ms: int
    pending_messages: int
    pending_batches: int
    next_due_ms: int | None
    accepted_total: int
    delivered_total: int
    cancelled_total: int
    dropped_total: int  # due when their queue no longer existed
    delivered_per_s: float
    lateness_p50_ms: float | None
    lateness_p99_ms: float | None
    lateness_max_ms: int | None
    loaded_batches: int
    bucket_ms: int
    buckets: list[DelayBucketStats] = []


class DelayCounters:
    """Totals, the delivery rate and a window of lateness samples (not thread-safe: the
    owner holds its lock)."""

    LATENESS_SAMPLES = 10_000
    RATE_WINDOW_S = 10.0

    def __init__(self) -> None:
        self.accepted = 0
        self.delivered = 0
        self.cancelled = 0
        self.dropped = 0
        self._lateness: deque[tuple[int, int]] = deque(maxlen=self.LATENESS_SAMPLES)
        self._rate: deque[tuple[float, int]] = deque()

    def on_delivered(self, count: int, lateness_ms: int) -> None:
        self.delivered += count
        self._lateness.append((max(lateness_ms, 0), count))
        now = time.monotonic()
        if self._rate and self._rate[-1][0] > now - 0.1:  # one sample per 100 ms bounds the deque
            t, n = self._rate[-1]
            self._rate[-1] = (t, n + count)
        else:
            self._rate.append((now, count))
        self._trim(now)

    def _trim(self, now: float) -> None:
        while self._rate and now - self._rate[0][0] > self.RATE_WINDOW_S:
            self._rate.popleft()

    def rate_per_s(self) -> float:
        """Messages delivered per second over the last ``RATE_WINDOW_S`` seconds."""
        self._trim(time.monotonic())
        return round(sum(n for _, n in self._rate) / self.RATE_WINDOW_S, 1)

    def lateness(self) -> tuple[float | None, float | None, int | None]:
        """(p50, p99, max) of lateness in ms, weighted by messages."""
        if not self._lateness:
            return None, None, None
        samples = sorted(self._lateness)
        cum: list[int] = []
        total = 0
        for _, n in samples:
            total += n
            cum.append(total)

        def pct(q: float) -> float:
            i = bisect.bisect_left(cum, q * total)
            return float(samples[min(i, len(samples) - 1)][0])

        return pct(0.5), pct(0.99), samples[-1][0]
