"""Reading stored batches back as records: :func:`decode_records` for any batch, and the
one-call path for *plain* batches (uncompressed, no deliver times) that readers of batches
of one message each spend their time in (:func:`plain_batch`, :func:`decode_plain_run`).

Thread-safety: pure functions over immutable bytes. The layout and its checks are
:mod:`headwater.model.batch`'s; a batch that fails one here is decoded the general way,
which names what is wrong.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable
from typing import Any

import msgspec

from headwater.model.batch import (
    FLAG_DELIVER_TIMES,
    FLAG_HAS_KEYS,
    FLAG_HAS_PROPERTIES,
    FLAG_HAS_TAGS,
    HEADER,
    HEADER_SIZE,
    MAGIC,
    BatchHeader,
    BatchPayload,
    crc32c,
    decode_deliver_offsets,
    decode_header,
    decode_payload,
)
from headwater.model.message import Record

__all__ = ["decode_plain_run", "decode_records", "plain_batch"]

_decoder = msgspec.msgpack.Decoder(BatchPayload)


def decode_records(
    buf: bytes | memoryview,
    queue: str,
    pos: int = 0,
    *,
    start_offset: int = 0,
    end_offset: int | None = None,
    tags: frozenset[str] | None = None,
    header: BatchHeader | None = None,
) -> list[Record]:
    """The records of the stored batch at ``pos``, limited to ``[start_offset, end_offset)``
    and to messages whose tag is in ``tags`` (when given)."""
    h = header if header is not None else decode_header(buf, pos)
    p = decode_payload(buf, h, pos)
    base, qid, part, ts = h.base_offset, h.queue_id, h.partition, h.timestamp_ms
    sched = h.deliver_at_ms or None
    if h.flags & FLAG_DELIVER_TIMES:  # a delayed batch read back before delivery
        offs = decode_deliver_offsets(buf, h, pos) or []
        return [
            r
            if r.scheduled_ms is None
            else msgspec.structs.replace(r, scheduled_ms=r.scheduled_ms + offs[r.offset - base])
            for r in decode_records(
                buf,
                queue,
                pos,
                start_offset=start_offset,
                end_offset=end_offset,
                tags=tags,
                header=h._replace(flags=h.flags & ~FLAG_DELIVER_TIMES),
            )
        ]
    lo = max(start_offset - base, 0)
    hi = h.count if end_offset is None else min(end_offset - base, h.count)
    bodies = p.bodies
    if p.keys is None and p.tags is None and p.properties is None:
        if tags is not None:
            return []
        return [Record(queue, part, base + i, ts, bodies[i], None, None, None, qid, sched) for i in range(lo, hi)]
    keys = p.keys or [None] * h.count
    tgs = p.tags or [None] * h.count
    props = p.properties or [None] * h.count
    return [
        Record(queue, part, base + i, ts, bodies[i], keys[i], tgs[i], props[i], qid, sched)
        for i in range(lo, hi)
        if tags is None or tgs[i] in tags
    ]


_unpack_header = HEADER.unpack_from
_plain_length = HEADER_SIZE - 4  # a batch's length field less its payload
_COLUMN_FLAGS = FLAG_HAS_KEYS | FLAG_HAS_TAGS | FLAG_HAS_PROPERTIES


def plain_batch(b: bytes | bytearray | memoryview) -> tuple[int, int, int, int, int, int, BatchPayload] | None:
    """``(queue_id, partition, base_offset, timestamp_ms, deliver_at_ms, payload_size,
    payload)`` of the stored batch ``b``, checked as :func:`check_batch` checks it and decoded
    in this one call, when it is *plain*: uncompressed, without deliver times (keys, tags and
    properties may be there), its columns as long as its count. None for any other batch and
    for one that fails a check: decode that one the usual way, which says what is wrong.

    Readers of batches of one message each (a producer that sends one at a time) spend their
    time per batch, and the calls of ``check_batch`` and ``decode_payload`` were most of it."""
    try:
        h = _unpack_header(b)
    except struct.error:
        return None
    length, header_crc, qid, part, base, ts, _, crc, magic, flags, header_size, count, payload_size, at = h[:14]
    size = 4 + length
    if (
        flags & ~_COLUMN_FLAGS
        or magic != MAGIC
        or header_size != HEADER_SIZE
        or length != _plain_length + payload_size
        or count < 1
        or len(b) < size
    ):
        return None
    mv = memoryview(b)
    if crc32c(mv[44:size]) != crc or crc32c(mv[8:40]) != header_crc:
        return None
    try:
        p = _decoder.decode(mv[HEADER_SIZE:size])
    except msgspec.DecodeError:
        return None
    keys, tgs, props = p.keys, p.tags, p.properties
    if (
        len(p.bodies) != count
        or (keys is not None and len(keys) != count)
        or (tgs is not None and len(tgs) != count)
        or (props is not None and len(props) != count)
    ):
        return None
    return qid, part, base, ts, at, payload_size, p


def decode_plain_run(
    batches: Iterable[bytes | bytearray | memoryview],
    queue: str,
    slow: Callable[[Any], list[Record]],
    start_offset: int = 0,
    end_offset: int | None = None,
    tags: frozenset[str] | None = None,
) -> list[Record]:
    """The records of stored ``batches`` in ``[start_offset, end_offset)`` and whose tag is
    in ``tags`` (when given), in order: each :func:`plain_batch` made into records here, any
    other batch by ``slow(batch)`` (``decode_stored``), which decodes it or raises the error
    that names what is wrong. The same records and errors as ``slow`` on each batch."""
    out: list[Record] = []
    add = out.append
    end = end_offset
    for b in batches:
        got = plain_batch(b)
        if got is None:
            out.extend(slow(b))
            continue
        qid, part, base, ts, at, _, p = got
        bodies, keys, tgs, props = p.bodies, p.keys, p.tags, p.properties
        count = len(bodies)
        sched = at or None
        lo = start_offset - base if start_offset > base else 0
        hi = count if end is None or end - base >= count else end - base
        if keys is None and tgs is None and props is None:
            if tags is not None:
                continue  # no message of it has a tag
            if lo == 0 and hi == 1:  # one message: no loop
                add(Record(queue, part, base, ts, bodies[0], None, None, None, qid, sched))
            else:
                out.extend(
                    [Record(queue, part, base + i, ts, bodies[i], None, None, None, qid, sched) for i in range(lo, hi)]
                )
            continue
        keys = keys or [None] * count
        tgs = tgs or [None] * count
        props = props or [None] * count
        out.extend(
            [
                Record(queue, part, base + i, ts, bodies[i], keys[i], tgs[i], props[i], qid, sched)
                for i in range(lo, hi)
                if tags is None or tgs[i] in tags
            ]
        )
    return out
