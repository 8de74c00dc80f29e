"""ProducerStateTable: what makes a producer's retries idempotent.

An idempotent producer stamps each batch with its producer id, epoch and the sequence number
of the batch's first message, counted per (queue, partition). For every
(producer id, queue id, partition) the table keeps the epoch, the last sequence appended, and
the last ``RECENT_BATCHES`` batches with the offsets they got. A batch whose sequence range
equals one of those is a retry of an appended batch: the store returns the original
placement instead of appending it again. A batch that skips ahead or falls behind is refused,
and so is a first batch (of a producer id new to the partition, or of a new epoch) that does
not start at sequence 0: its predecessor was lost, and the producer must send that first.

Persistence is the store's business (headwater.storage.producer_snapshots): the table
only turns itself into bytes and back. The in-memory test broker uses the same table, so
it dedupes retries exactly as the real one does.

Thread-safety: callers hold their own lock.
"""

from __future__ import annotations

import struct
from collections import deque

import msgspec

from headwater.errors import (
    CorruptDataError,
    InvalidArgumentError,
    OutOfOrderSequenceError,
    ProducerFencedError,
)
from headwater.model.batch import BatchHeader, crc32c
from headwater.model.service import ProduceResult

__all__ = ["ProducerStateTable", "RECENT_BATCHES"]

RECENT_BATCHES = 5
_SEQ_MOD = 2**31


class _Entry(msgspec.Struct, array_like=True):
    epoch: int
    last_seq: int
    last_ms: int
    recent: list[tuple[int, int, int, int]]  # (base_seq, count, base_offset, timestamp_ms)


class _Snapshot(msgspec.Struct, array_like=True):
    entries: list[tuple[int, int, int, _Entry]]  # (producer_id, queue_id, partition, entry)


class ProducerStateTable:
    def __init__(self, expiry_ms: int = 7 * 86_400_000) -> None:
        self._entries: dict[tuple[int, int, int], _Entry] = {}
        self.expiry_ms = expiry_ms

    def __len__(self) -> int:
        return len(self._entries)

    def check(self, h: BatchHeader, queue_id: int, partition: int) -> ProduceResult | None:
        """None to append the batch; the original placement if it is a retry; raises if
        the sequence is out of order or the producer was fenced."""
        pid = h.producer_id
        if pid < 0:
            return None
        if h.base_sequence < 0 or h.producer_epoch < 0:
            raise InvalidArgumentError("an idempotent batch needs a sequence and an epoch >= 0")
        e = self._entries.get((pid, queue_id, partition))
        if e is None or h.producer_epoch > e.epoch:
            # a producer new to this partition (or forgotten), or a new epoch, starts at 0:
            # a later batch arriving first means the first was lost, and storing it would
            # put it ahead of that batch's retry
            if h.base_sequence != 0:
                raise OutOfOrderSequenceError(
                    f"producer {pid} epoch {h.producer_epoch} sent sequence {h.base_sequence} to "
                    f"partition {partition} of queue id {queue_id}, which knows no batch of it yet "
                    f"(new, forgotten after the producer expiry, or a new epoch): its first batch "
                    f"has sequence 0 (an earlier batch was lost; send it first)"
                )
            return None
        if h.producer_epoch < e.epoch:
            raise ProducerFencedError(
                f"producer {pid} epoch {h.producer_epoch} was fenced by epoch {e.epoch}; "
                f"a newer instance of this producer is running"
            )
        for base_seq, count, base_offset, ts in e.recent:
            if base_seq == h.base_sequence and count == h.count:
                return ProduceResult(queue_id, partition, base_offset, count, ts)
        expected = (e.last_seq + 1) % _SEQ_MOD
        if h.base_sequence != expected:
            raise OutOfOrderSequenceError(
                f"producer {pid} sent sequence {h.base_sequence} to partition {partition} of queue "
                f"id {queue_id}; expected {expected} (a batch was lost or this one is a stale retry)"
            )
        return None

    def record(self, h: BatchHeader, queue_id: int, partition: int, base_offset: int, ts: int) -> None:
        pid = h.producer_id
        if pid < 0:
            return
        key = (pid, queue_id, partition)
        e = self._entries.get(key)
        if e is None or h.producer_epoch != e.epoch:
            e = self._entries[key] = _Entry(h.producer_epoch, 0, ts, [])
        e.last_seq = (h.base_sequence + h.count - 1) % _SEQ_MOD
        e.last_ms = ts
        recent = deque(e.recent, maxlen=RECENT_BATCHES)
        recent.append((h.base_sequence, h.count, base_offset, ts))
        e.recent = list(recent)

    def expire(self, now_ms: int) -> None:
        cutoff = now_ms - self.expiry_ms
        for key in [k for k, e in self._entries.items() if e.last_ms < cutoff]:
            del self._entries[key]

    # -- snapshots --------------------------------------------------------------------

    def to_bytes(self) -> bytes:
        body = msgspec.msgpack.encode(_Snapshot([(k[0], k[1], k[2], e) for k, e in self._entries.items()]))
        return struct.pack("<I", crc32c(body)) + body

    @classmethod
    def from_bytes(cls, data: bytes, expiry_ms: int, what: str = "producer snapshot") -> ProducerStateTable:
        if len(data) < 4 or struct.unpack_from("<I", data)[0] != crc32c(data[4:]):
            raise CorruptDataError(f"{what} is damaged")
        try:
            snap = msgspec.msgpack.decode(data[4:], type=_Snapshot)
        except msgspec.DecodeError as e:
            raise CorruptDataError(f"{what} is damaged: {e}") from e
        t = cls(expiry_ms)
        for pid, qid, part, entry in snap.entries:
            t._entries[(pid, qid, part)] = entry
        return t
