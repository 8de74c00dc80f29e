"""What ``get`` and ``find`` do with the broker's answers, without I/O.

The sync :class:`~headwater.client.sync.client.Client` and the asyncio one make the same calls
and then share these functions, so the two cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from headwater.client.core.reads import positive_int
from headwater.errors import CorruptDataError, InvalidArgumentError, InvalidBatchError, MessageNotFoundError
from headwater.model.batch import check_batch
from headwater.model.batch_reads import decode_plain_run, decode_records
from headwater.model.message import MessageId, Record, to_epoch_ms

__all__ = ["decode_stored", "find_bounds", "record_for_id", "records_with_key", "stored_records"]


def decode_stored(batch: bytes | memoryview, queue: str, **kw: Any) -> list[Record]:
    """Records of a fetched batch after checking both checksums (damage is never served)."""
    try:
        h = check_batch(batch)
    except InvalidBatchError as e:
        raise CorruptDataError(
            f"a stored batch of queue {queue!r} failed its checks ({e}); run "
            f"'headwater check --data DIR' to cut the damaged part"
        ) from e
    return decode_records(batch, queue, header=h, **kw)


def stored_records(
    batches: Iterable[bytes | memoryview],
    queue: str,
    *,
    start_offset: int = 0,
    end_offset: int | None = None,
    tags: frozenset[str] | None = None,
) -> list[Record]:
    """:func:`decode_stored` of each of ``batches``, in order, with the same records and errors;
    uncompressed batches are decoded without a call each (:func:`~headwater.model.batch_reads.decode_plain_run`)."""

    def slow(b: bytes | memoryview) -> list[Record]:
        return decode_stored(b, queue, start_offset=start_offset, end_offset=end_offset, tags=tags)

    return decode_plain_run(batches, queue, slow, start_offset, end_offset, tags)


def record_for_id(mid: MessageId, queue: str, batch: bytes) -> Record:
    """The record ``mid`` names in the batch the broker answered for it."""
    if mid.is_delayed:  # the broker answers a batch of just this message
        recs = decode_stored(batch, queue)
    else:
        recs = decode_stored(batch, queue, start_offset=mid.offset, end_offset=mid.offset + 1)
    if not recs:
        raise MessageNotFoundError(f"message {mid} is not retained")
    return recs[0]


def find_bounds(
    key: object, limit: object, start_time: datetime | int | None, end_time: datetime | int | None
) -> tuple[int | None, int | None]:
    """Check ``find``'s arguments; the time range in epoch ms."""
    if not isinstance(key, bytes):
        raise InvalidArgumentError(
            "a key is bytes" + ("; encode it first, e.g. key.encode()" if isinstance(key, str) else "")
        )
    if not positive_int(limit):
        raise InvalidArgumentError(f"limit must be a positive int, got {limit!r}")
    return to_epoch_ms(start_time, "start_time"), to_epoch_ms(end_time, "end_time")


def records_with_key(batches: Iterable[bytes], queue: str, key: bytes, limit: int) -> list[Record]:
    """The records of ``batches`` whose key is exactly ``key``, oldest first, at most ``limit``."""
    out: list[Record] = []
    for b in batches:
        out.extend(r for r in decode_stored(b, queue) if r.key == key)
    out.sort(key=lambda r: (r.timestamp_ms, r.partition, r.offset))
    return out[:limit]
