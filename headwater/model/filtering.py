"""Filtering stored batches on the broker: send what matches, nothing else.

The broker filters for tag subscriptions (a FETCH ``tag_mask``, a push subscription's tags)
and for keyed groups (the hash of a message's key: :mod:`headwater.model.keyed`). Three outcomes per stored batch:

- **no message matches**: the batch is not sent at all (for tags the header's tag summary
  usually tells without reading the payload; the storage engine skips those batches);
- **every message matches**: the stored bytes are sent as they are, not copied or re-encoded;
- **some match**: the matching messages are re-encoded on the broker, in one of two shapes:

  * **runs** (:func:`filter_batch`, for FETCH, whose readers include every generic one):
    one batch per run of consecutive matching offsets. A batch's offsets are consecutive
    (``base_offset`` plus the index), so a run is the only way to drop messages without
    changing the format every reader understands. Each run costs a 96-byte header: when
    matches are scattered among small messages, the runs can outweigh the original batch.
  * **selections** (:func:`select_batch`, for PUSH frames and keyed fetches, whose readers
    are this package's subscriber and keyed consumer): one batch of all the matching
    messages, plus the list of their true offsets, which travels next to it in the frame
    (:func:`decode_selection` puts them back). One header per stored batch, whatever the
    pattern.

  Either way a re-encoded batch carries the broker's fields of the original (queue id,
  partition, append time), its own base offset, both checksums and a tag summary of what it
  holds: it passes every check a stored batch passes.

Deciding costs a decode of the payload's metadata columns (keys, tags, properties): the
bodies are left as raw msgpack (``msgspec.Raw``), so a filter that matches everything reads
no body and copies nothing. Only a partly matching batch is decoded in full. A compressed
batch is decompressed to decide and re-encoded uncompressed when it partly matches.

Control batches (transaction markers) always pass whole: they are not messages.

Thread-safety: pure functions over immutable bytes.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Protocol

import msgspec

from headwater.errors import InvalidBatchError
from headwater.model.batch import (
    COMPRESSION_MASK,
    FLAG_CONTROL,
    FLAG_HAS_KEYS,
    FLAG_HAS_PROPERTIES,
    FLAG_HAS_TAGS,
    HEADER,
    HEADER_SIZE,
    MAGIC,
    BatchHeader,
    BatchPayload,
    _decompress,  # the one decompressor, with its bound on the output (no bombs)
    check_batch,
    crc32c,
    decode_header,
    decode_payload,
    tag_bit,
    tags_mask,
)
from headwater.model.batch_reads import decode_records
from headwater.model.message import Message, Record

_COUNTED = struct.Struct("<I12xq24xI")  # a batch header's length, base_offset and count

__all__ = [
    "MessageFilter",
    "TagMaskFilter",
    "TagFilter",
    "AllOf",
    "filter_batch",
    "filter_batches",
    "Columns",
    "encode_run",
    "encode_selection",
    "select_batch",
    "select_batches",
    "decode_selection",
    "count_messages",
    "message_matches",
]

_U32 = struct.Struct("<I")


class Columns(msgspec.Struct, array_like=True, gc=False):
    """A batch payload's metadata columns; the bodies stay undecoded."""

    bodies: msgspec.Raw
    keys: list[bytes | None] | None = None
    tags: list[str | None] | None = None
    properties: list[dict[str, str] | None] | None = None


_columns = msgspec.msgpack.Decoder(Columns)
_EMPTY = msgspec.Raw(b"\x90")
_encoder = msgspec.msgpack.Encoder()


class MessageFilter(Protocol):
    """What a broker-side filter answers."""

    def batch_may_match(self, h: BatchHeader) -> bool:
        """False when the header alone shows that no message of the batch matches."""
        ...

    def batch_all_match(self, h: BatchHeader) -> bool:
        """True when the header alone shows that every message matches."""
        ...

    def matches(self, cols: Columns, count: int) -> list[bool]:
        """Which of the batch's ``count`` messages match."""
        ...


class TagMaskFilter:
    """Messages whose tag's bit is in ``mask`` (RocketMQ's broker-side check by tag hash).

    Two tags may share a bit, so this lets through a few messages a reader did not ask for;
    the reader re-checks the exact tag. A message without a tag never matches.
    """

    __slots__ = ("mask",)

    def __init__(self, mask: int) -> None:
        assert mask, "a zero mask is no filter"
        self.mask = mask

    def batch_may_match(self, h: BatchHeader) -> bool:
        return bool(h.tag_mask & self.mask)

    def batch_all_match(self, h: BatchHeader) -> bool:
        return False  # a message without a tag adds nothing to the summary: read the column

    def matches(self, cols: Columns, count: int) -> list[bool]:
        if cols.tags is None:
            return [False] * count
        mask = self.mask
        return [t is not None and bool(tag_bit(t) & mask) for t in cols.tags]


class TagFilter:
    """Messages whose tag is exactly one of ``tags`` (a subscription's tags)."""

    __slots__ = ("tags", "mask")

    def __init__(self, tags: frozenset[str]) -> None:
        assert tags, "an empty tag set is no filter"
        self.tags = tags
        self.mask = tags_mask(tags)

    def batch_may_match(self, h: BatchHeader) -> bool:
        return bool(h.tag_mask & self.mask)

    def batch_all_match(self, h: BatchHeader) -> bool:
        return False

    def matches(self, cols: Columns, count: int) -> list[bool]:
        if cols.tags is None:
            return [False] * count
        tags = self.tags
        return [t in tags for t in cols.tags]


class AllOf:
    """Messages every one of ``filters`` lets through."""

    __slots__ = ("filters",)

    def __init__(self, filters: Sequence[MessageFilter]) -> None:
        self.filters = tuple(filters)

    def batch_may_match(self, h: BatchHeader) -> bool:
        return all(f.batch_may_match(h) for f in self.filters)

    def batch_all_match(self, h: BatchHeader) -> bool:
        return all(f.batch_all_match(h) for f in self.filters)

    def matches(self, cols: Columns, count: int) -> list[bool]:
        out = [True] * count
        for f in self.filters:
            out = [a and b for a, b in zip(out, f.matches(cols, count))]
        return out


def filter_batch(
    buf: bytes | memoryview, flt: MessageFilter, *, start_offset: int = 0, end_offset: int | None = None
) -> list[bytes | memoryview]:
    """The parts of the stored batch ``buf`` that ``flt`` lets through, as stored batches.

    A batch whose every message matches is returned whole, as stored (it may reach outside
    ``[start_offset, end_offset)``: the reader trims the range, as for any fetched batch).
    Otherwise the matching messages inside the range are re-encoded: no message that does
    not match is ever returned.
    """
    h = decode_header(buf)
    if h.flags & FLAG_CONTROL:
        return [buf]
    if not flt.batch_may_match(h):
        return []
    if flt.batch_all_match(h):
        return [buf]
    lo = max(start_offset - h.base_offset, 0)
    hi = h.count if end_offset is None else min(end_offset - h.base_offset, h.count)
    if lo >= hi:
        return []
    cols = _decode_columns(buf, h)
    keep = flt.matches(cols, h.count)
    if all(keep):
        return [buf]
    if not any(keep[lo:hi]):
        return []
    payload = decode_payload(buf, h)
    out: list[bytes | memoryview] = []
    i = lo
    while i < hi:
        if not keep[i]:
            i += 1
            continue
        j = i + 1
        while j < hi and keep[j]:
            j += 1
        out.append(bytes(encode_run(h, payload, i, j)))
        i = j
    return out


def select_batch(
    buf: bytes | memoryview, flt: MessageFilter, *, start_offset: int = 0, end_offset: int | None = None
) -> list[tuple[bytes | memoryview, list[int] | None]]:
    """Like :func:`filter_batch`, a partly matching batch re-encoded as one **selection**:
    ``(batch, offsets)`` pairs, ``offsets`` None for a batch returned whole (its offsets are
    its own), else the true offset of each message of the re-encoded batch."""
    h = decode_header(buf)
    if h.flags & FLAG_CONTROL:
        return [(buf, None)]
    if not flt.batch_may_match(h):
        return []
    if flt.batch_all_match(h):
        return [(buf, None)]
    lo = max(start_offset - h.base_offset, 0)
    hi = h.count if end_offset is None else min(end_offset - h.base_offset, h.count)
    if lo >= hi:
        return []
    keep = flt.matches(_decode_columns(buf, h), h.count)
    if all(keep):
        return [(buf, None)]
    chosen = [i for i in range(lo, hi) if keep[i]]
    if not chosen:
        return []
    batch = bytes(encode_selection(h, decode_payload(buf, h), chosen))
    return [(batch, [h.base_offset + i for i in chosen])]


def select_batches(
    batches: Sequence[bytes | memoryview],
    flt: MessageFilter | None,
    *,
    start_offset: int = 0,
    end_offset: int | None = None,
) -> tuple[list[bytes | memoryview], list[list[int]]]:
    """:func:`select_batch` over a read's batches: the batches, and their offsets lists
    (``[]`` for a batch sent whole; the whole list empty when no batch is a selection)."""
    if flt is None:
        return list(batches), []
    out: list[bytes | memoryview] = []
    offsets: list[list[int] | None] = []
    for b in batches:
        for batch, offs in select_batch(b, flt, start_offset=start_offset, end_offset=end_offset):
            out.append(batch)
            offsets.append(offs)
    if all(o is None for o in offsets):
        return out, []
    return out, [o or [] for o in offsets]


def decode_selection(
    buf: bytes | memoryview,
    offsets: Sequence[int],
    queue: str,
    *,
    start_offset: int = 0,
    end_offset: int | None = None,
    tags: frozenset[str] | None = None,
) -> list[Record]:
    """The records of a batch and its offsets list (empty: a stored batch, its own offsets),
    limited to ``[start_offset, end_offset)`` and ``tags``. Checks both checksums and that the
    offsets fit the batch (:class:`InvalidBatchError` otherwise)."""
    h = check_batch(buf)
    if not offsets:
        return decode_records(buf, queue, header=h, start_offset=start_offset, end_offset=end_offset, tags=tags)
    if len(offsets) != h.count or offsets[0] != h.base_offset or any(b <= a for a, b in zip(offsets, offsets[1:])):
        raise InvalidBatchError(
            f"a selection of {h.count} messages from offset {h.base_offset} came with offsets "
            f"{list(offsets)[:8]}: they must start there and increase"
        )
    out = []
    for r, off in zip(decode_records(buf, queue, header=h, tags=None), offsets):
        if off < start_offset or (end_offset is not None and off >= end_offset):
            continue
        if tags is not None and r.tag not in tags:
            continue
        out.append(msgspec.structs.replace(r, offset=off))
    return out


def count_messages(
    batches: Sequence[bytes | memoryview], selections: Sequence[Sequence[int]], lo: int, hi: int
) -> tuple[int, int]:
    """Messages of ``batches`` (with their ``selections``) inside ``[lo, hi)``, and the
    batches' bytes: what a push costs of a stream's credit, counted alike on both ends."""
    messages = size = 0
    if selections:
        for i, b in enumerate(batches):
            h = decode_header(b)
            offsets = selections[i]
            if offsets:
                messages += sum(lo <= o < hi for o in offsets)
            else:
                messages += max(0, min(h.end_offset, hi) - max(h.base_offset, lo))
            size += h.size
        return messages, size
    unpack = _COUNTED.unpack_from
    for b in batches:  # once per batch of every push and fetch: three fields, no call but the unpack
        if len(b) < HEADER_SIZE:
            decode_header(b)  # raises, naming the short header
        length, base, count = unpack(b)
        size += 4 + length
        end = base + count
        if base >= lo and end <= hi:
            messages += count
        else:
            clipped = (end if end < hi else hi) - (base if base > lo else lo)
            if clipped > 0:
                messages += clipped
    return messages, size


def filter_batches(
    batches: Sequence[bytes | memoryview],
    flt: MessageFilter | None,
    *,
    start_offset: int = 0,
    end_offset: int | None = None,
) -> list[bytes | memoryview]:
    """:func:`filter_batch` over a fetch's batches (``flt`` None: the batches unchanged)."""
    if flt is None:
        return list(batches)
    out: list[bytes | memoryview] = []
    for b in batches:
        out.extend(filter_batch(b, flt, start_offset=start_offset, end_offset=end_offset))
    return out


def _decode_columns(buf: bytes | memoryview, h: BatchHeader) -> Columns:
    # not released explicitly: the undecoded bodies (msgspec.Raw) hold the buffer until dropped
    raw = _decompress(h.flags & COMPRESSION_MASK, memoryview(buf)[HEADER_SIZE : HEADER_SIZE + h.payload_size])
    cols = _columns.decode(raw)
    cols.bodies = _EMPTY  # let go of the batch's bytes now
    return cols


def encode_run(h: BatchHeader, p: BatchPayload, lo: int, hi: int) -> bytearray:
    """Messages ``lo`` to ``hi`` (indexes) of a stored batch as a stored batch of their own.

    The broker's fields are those of the original with the base offset moved to the run's
    first message; producer fields are kept (the sequence moved likewise), so the run reads
    exactly like the messages did inside the original.
    """
    return encode_selection(h, p, range(lo, hi))


def encode_selection(h: BatchHeader, p: BatchPayload, indexes: Sequence[int]) -> bytearray:
    """The messages at ``indexes`` (increasing) of a stored batch as one batch, based at the
    first one's offset (see :func:`encode_run`; for a selection the true offsets travel beside)."""
    lo, n = indexes[0], len(indexes)
    keys = [p.keys[i] for i in indexes] if p.keys is not None else None
    tags = [p.tags[i] for i in indexes] if p.tags is not None else None
    props = [p.properties[i] for i in indexes] if p.properties is not None else None
    bodies = [p.bodies[i] for i in indexes]
    if keys is not None and all(k is None for k in keys):
        keys = None
    if tags is not None and all(t is None for t in tags):
        tags = None
    if props is not None and all(not x for x in props):
        props = None
    flags = h.flags & ~(COMPRESSION_MASK | FLAG_HAS_KEYS | FLAG_HAS_TAGS | FLAG_HAS_PROPERTIES)
    flags |= (FLAG_HAS_KEYS if keys is not None else 0) | (FLAG_HAS_TAGS if tags is not None else 0)
    flags |= FLAG_HAS_PROPERTIES if props is not None else 0
    mask = tags_mask({t for t in tags if t is not None}) if tags is not None else 0
    buf = bytearray(HEADER_SIZE)
    _encoder.encode_into(BatchPayload(bodies, keys, tags, props), buf, HEADER_SIZE)
    payload_size = len(buf) - HEADER_SIZE
    seq = h.base_sequence + lo if h.base_sequence >= 0 else h.base_sequence
    HEADER.pack_into(
        buf,
        0,
        HEADER_SIZE - 4 + payload_size,
        0,
        h.queue_id,
        h.partition,
        h.base_offset + lo,
        h.timestamp_ms,
        h.broker_reserved,
        0,
        MAGIC,
        flags,
        HEADER_SIZE,
        n,
        payload_size,
        h.deliver_at_ms,
        h.producer_id,
        seq,
        h.producer_epoch,
        0,
        mask,
        h.transaction_id,
    )
    with memoryview(buf) as mv:
        _U32.pack_into(buf, 40, crc32c(mv[44:]))
        _U32.pack_into(buf, 4, crc32c(mv[8:40]))
    return buf


def message_matches(flt: MessageFilter, m: Message) -> bool:
    """Whether ``flt`` lets one message through (for tests and client-side checks)."""
    cols = Columns(msgspec.Raw(b"\x90"), [m.key], [m.tag], [m.properties])
    return flt.matches(cols, 1)[0]
