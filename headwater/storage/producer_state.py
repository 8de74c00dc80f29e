"""ProducerStateTable: what makes a producer's retries idempotent.

An idempotent producer stamps each batch with its producer id, epoch and the sequence number
of the batch's first message, counted per (queue, partition). For every
(producer id, queue id, partition) the table keeps the epoch, the last sequence appended, and
the last ``RECENT_BATCHES`` batches with the offsets they got. A batch whose sequence range
equals one of those is a retry of an appended batch: the store returns the original
placement instead of appending it again. A batch that skips ahead or falls behind is refused.

Persistence: when a segment is sealed the table is written beside it
(``<base>.producers``, msgpack, CRC32C); on open the newest snapshot is loaded and the batches
of later segments are replayed from their headers. So a retry after a broker crash is still
recognised.

Thread-safety: used under the store's lock.
"""

from __future__ import annotations

import os
import struct
from collections import deque
from pathlib import Path

import msgspec

from headwater.errors import (
    CorruptDataError,
    InvalidArgumentError,
    OutOfOrderSequenceError,
    ProducerFencedError,
)
from headwater.model.batch import BatchHeader, crc32c
from headwater.model.service import ProduceResult
from headwater.storage.segment import fsync_dir

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
        if e is None:
            return None  # a producer new to this partition (or expired) starts anywhere
        if h.producer_epoch < e.epoch:
            raise ProducerFencedError(
                f"producer {pid} epoch {h.producer_epoch} was fenced by epoch {e.epoch}; "
                f"a newer instance of this producer is running"
            )
        if h.producer_epoch > e.epoch:
            return None  # a new instance: its sequences start afresh
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

    def write(self, path: Path) -> None:
        body = msgspec.msgpack.encode(_Snapshot([(k[0], k[1], k[2], e) for k, e in self._entries.items()]))
        tmp = path.with_name(path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, struct.pack("<I", crc32c(body)) + body)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        fsync_dir(path.parent)

    @classmethod
    def read(cls, path: Path, expiry_ms: int) -> ProducerStateTable:
        data = path.read_bytes()
        if len(data) < 4 or struct.unpack_from("<I", data)[0] != crc32c(data[4:]):
            raise CorruptDataError(f"producer snapshot {path.name} is damaged")
        try:
            snap = msgspec.msgpack.decode(data[4:], type=_Snapshot)
        except msgspec.DecodeError as e:
            raise CorruptDataError(f"producer snapshot {path.name} is damaged: {e}") from e
        t = cls(expiry_ms)
        for pid, qid, part, e in snap.entries:
            t._entries[(pid, qid, part)] = e
        return t
