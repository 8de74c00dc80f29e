"""Record batch: the unit a producer sends, the broker appends and a reader fetches.

A batch travels and is stored as one byte string; the broker patches the fields it owns
(queue id, partition, base offset, append time) and writes the batch as is. Layout, all
integers little-endian::

    offset size field            owner     notes
     0      4   length           producer  bytes after this field (header rest + payload)
     4      4   header_crc       broker    CRC32C of bytes [8, 40): the broker-owned fields
     8      4   queue_id         broker
    12      4   partition        broker
    16      8   base_offset      broker    offset of the first message in its partition
    24      8   timestamp_ms     broker    append time, never decreasing within a store
    32      8   broker_reserved  broker    0, or for a batch the delay service delivered, its
                                           delay stamp (headwater.model.delay)
    40      4   crc              producer  CRC32C of bytes [44, end): the producer's content
    44      1   magic            producer  format version, 1
    45      1   flags            producer  see FLAG_*; bits 0-1 compression codec
    46      2   header_size      producer  96; readers skip to header_size for the payload
    48      4   count            producer  messages in the batch (>= 1)
    52      4   payload_size     producer  bytes of payload as stored (compressed or not)
    56      8   deliver_at_ms    producer  0, or the time a delayed batch becomes visible
    64      8   producer_id      producer  -1, or the idempotent producer's id
    72      4   base_sequence    producer  -1, or the producer's sequence of the first message
    76      2   producer_epoch   producer  -1, or the producer's epoch
    78      2   reserved         producer  0
    80      8   tag_mask         producer  OR of 1 << (crc32c(tag) & 63) over the batch's tags
    88      8   transaction_id   producer  0, or the transaction this batch belongs to
    96      -   payload          producer  msgpack array: [bodies, keys, tags, properties]

The payload is columnar: ``bodies`` is a list of byte strings; ``keys``, ``tags`` and
``properties`` are each either nil (no message has one) or a list as long as ``bodies``
with nil for the messages without one. Columns keep encoding and decoding in C (msgspec)
and let a reader skip what it does not need.

A delayed batch whose messages are due at different times (flag ``FLAG_DELIVER_TIMES``)
has a fifth column, ``deliver_offsets``: per message, milliseconds after ``deliver_at_ms``
(the earliest), never decreasing along the batch. Readers that know only four columns
ignore it; such batches reach only the broker's delay service, which delivers each run of
equal times as a batch of its own (headwater.model.delay).

Thread-safety: pure functions over immutable bytes. Crash policy: a batch whose ``length``
runs past the end of its file, or whose checksums disagree, is damaged and never served.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple, cast

import crc32c as _crc32c
import msgspec

from headwater.errors import HeadwaterError, InvalidArgumentError, InvalidBatchError, MessageTooLargeError
from headwater.model.message import Message

__all__ = [
    "HEADER",
    "HEADER_SIZE",
    "MAGIC",
    "BatchHeader",
    "BatchPayload",
    "CheckedPayload",
    "encode_batch",
    "decode_header",
    "decode_payload",
    "patch_batch",
    "broker_prefix",
    "check_batch",
    "validate_batch",
    "tag_bit",
    "tags_mask",
    "crc32c",
    "COMPRESSION_NONE",
    "COMPRESSION_ZSTD",
    "COMPRESSION_LZ4",
    "FLAG_HAS_KEYS",
    "FLAG_HAS_TAGS",
    "FLAG_HAS_PROPERTIES",
    "FLAG_TRANSACTIONAL",
    "FLAG_CONTROL",
    "FLAG_DELIVER_TIMES",
    "DELIVER_SPAN_MS_MAX",
    "decode_deliver_offsets",
    "BATCH_BYTES_MAX",
    "MESSAGE_ROOM_BYTES",
    "batch_too_large",
]

crc32c = _crc32c.crc32c

MAGIC = 1
HEADER = struct.Struct("<IIIIqqqIBBHIIqqihHQq")
HEADER_SIZE = HEADER.size
assert HEADER_SIZE == 96
_BROKER = struct.Struct("<IIqqq")  # queue_id, partition, base_offset, timestamp_ms, reserved
_U32 = struct.Struct("<I")

COMPRESSION_MASK = 0x03
COMPRESSION_NONE = 0
COMPRESSION_ZSTD = 1
COMPRESSION_LZ4 = 2
FLAG_HAS_KEYS = 0x04
FLAG_HAS_TAGS = 0x08
FLAG_HAS_PROPERTIES = 0x10
FLAG_TRANSACTIONAL = 0x20
FLAG_CONTROL = 0x40
FLAG_DELIVER_TIMES = 0x80  # a fifth payload column: per-message deliver offsets
_KNOWN_FLAGS = 0xFF
DELIVER_SPAN_MS_MAX = 60_000  # the messages of one batch are due within this of each other

#: The largest batch, header included: what a producer may encode and a broker accepts (a
#: PRODUCE frame of it fits the default frame_bytes_max). A queue's message_bytes_max stays
#: below it by MESSAGE_ROOM_BYTES (headwater.model.config.MESSAGE_BYTES_MAX).
BATCH_BYTES_MAX = 64 * 1024 * 1024
#: What a batch keeps beside the largest body a queue may allow: its header, the payload's
#: framing, and that message's key, tag and properties.
MESSAGE_ROOM_BYTES = 64 * 1024


class BatchPayload(msgspec.Struct, array_like=True, gc=False):
    bodies: list[bytes]
    keys: list[bytes | None] | None = None
    tags: list[str | None] | None = None
    properties: list[dict[str, str] | None] | None = None


class _TimedPayload(BatchPayload, array_like=True, gc=False):
    """The payload of a batch with ``FLAG_DELIVER_TIMES``: the four columns and the offsets."""

    deliver_offsets: list[int] | None = None


class CheckedPayload(msgspec.Struct, array_like=True, gc=False):
    """A compressed payload as :func:`validate_batch` decodes it: the bodies are views of
    the decompressed bytes, not copies. Only their sizes are checked (the batch is stored as
    it came), and copying a body that expands to 64 MiB held the interpreter lock for tens
    of milliseconds, stalling every connection of the broker (a compression bomb)."""

    bodies: list[memoryview]
    keys: list[bytes | None] | None = None
    tags: list[str | None] | None = None
    properties: list[dict[str, str] | None] | None = None
    deliver_offsets: list[int] | None = None


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(BatchPayload)
_timed_decoder = msgspec.msgpack.Decoder(_TimedPayload)
_checking_decoder = msgspec.msgpack.Decoder(CheckedPayload)
_new_tuple = tuple.__new__  # a namedtuple from a tuple, without its Python-level call


class BatchHeader(NamedTuple):
    length: int
    header_crc: int
    queue_id: int
    partition: int
    base_offset: int
    timestamp_ms: int
    broker_reserved: int
    crc: int
    magic: int
    flags: int
    header_size: int
    count: int  # type: ignore[assignment]  # the field's name on the wire; it shadows tuple.count
    payload_size: int
    deliver_at_ms: int
    producer_id: int
    base_sequence: int
    producer_epoch: int
    reserved: int
    tag_mask: int
    transaction_id: int

    @property
    def size(self) -> int:
        """Bytes the whole batch occupies."""
        return 4 + self.length

    @property
    def end_offset(self) -> int:
        return self.base_offset + self.count


def tag_bit(tag: str) -> int:
    return 1 << (crc32c(tag.encode()) & 63)


def tags_mask(tags: Iterable[str]) -> int:
    """The mask a filter on these tags tests batches against (0 means: no filter)."""
    mask = 0
    for t in tags:
        mask |= tag_bit(t)
    return mask


def _compress(codec: int, data: bytes) -> bytes:
    if codec == COMPRESSION_ZSTD:
        import zstandard

        return zstandard.ZstdCompressor(level=3).compress(data)
    if codec == COMPRESSION_LZ4:
        import lz4.frame

        return cast(bytes, lz4.frame.compress(data))
    return data


def _decompress(codec: int, data: bytes | memoryview, limit: int = BATCH_BYTES_MAX) -> bytes | memoryview:
    """The payload ``data`` decompressed, refused when it expands beyond ``limit`` bytes
    (the caller adds where the limit comes from)."""
    if not codec:
        return data
    try:
        # Bound the output, so a small batch cannot make the broker allocate gigabytes (a
        # decompression bomb). Both libraries trust a size the frame states (zstd ignores
        # max_output_size then; lz4 has no limit), and check that the content matches it,
        # so refuse a stated size over the limit and cap the unstated.
        if codec == COMPRESSION_ZSTD:
            import zstandard

            raw = bytes(data)
            if zstandard.frame_content_size(raw) > limit:
                raise MessageTooLargeError(f"the batch payload expands beyond {limit} bytes")
            return zstandard.ZstdDecompressor().decompress(raw, max_output_size=limit)
        if codec == COMPRESSION_LZ4:
            import lz4.frame

            raw = bytes(data)
            stated = lz4.frame.get_frame_info(raw)["content_size"]  # 0: not stated
            if stated > limit:
                raise MessageTooLargeError(f"the batch payload expands beyond {limit} bytes")
            if stated:
                return cast(bytes, lz4.frame.decompress(raw))
            d = lz4.frame.LZ4FrameDecompressor()
            out = d.decompress(raw, max_length=limit + 1)
            if len(out) > limit or not d.eof:
                raise InvalidBatchError(f"the batch payload expands beyond {limit} bytes, or is cut short")
            return cast(bytes, out)
    except ImportError as e:
        raise InvalidBatchError(
            f"the batch is compressed with a codec whose library is missing ({e.name}); install headwater[compression]"
        ) from e
    except (InvalidBatchError, MessageTooLargeError):
        raise
    except Exception as e:  # noqa: BLE001 - any codec failure means a damaged batch
        raise InvalidBatchError(f"the batch payload does not decompress within {limit} bytes: {e}") from e
    return data


def stated_payload_bytes(buf: bytes | bytearray | memoryview) -> int | None:
    """How many bytes the compressed payload of the producer batch ``buf`` says it expands
    to, read from the codec's frame header without decompressing; the payload's own size
    for an uncompressed batch, None when a compressed frame does not say (or ``buf`` is not
    a batch: the full check will say why)."""
    if len(buf) < HEADER_SIZE:
        return None
    codec = buf[45] & COMPRESSION_MASK
    if codec == COMPRESSION_NONE:
        return len(buf) - HEADER_SIZE
    try:
        head = bytes(buf[HEADER_SIZE : HEADER_SIZE + 32])  # both frame headers fit
        if codec == COMPRESSION_ZSTD:
            import zstandard

            stated = zstandard.frame_content_size(head)
        else:
            import lz4.frame

            stated = lz4.frame.get_frame_info(head)["content_size"] or -1
    except Exception:  # noqa: BLE001 - a damaged or unknown frame: the full check names it
        return None
    return int(stated) if stated >= 0 else None


_CODECS = {None: COMPRESSION_NONE, "none": COMPRESSION_NONE, "zstd": COMPRESSION_ZSTD, "lz4": COMPRESSION_LZ4}


def _due_offsets(deliver_times: Sequence[int], n: int) -> tuple[int, list[int] | None]:
    """The batch's due time and each message's offset from it (None when all are due at once)."""
    if len(deliver_times) != n:
        raise InvalidArgumentError("deliver_times needs one time per message")
    first = deliver_times[0]
    if deliver_times[-1] == first:
        return first, None
    return first, [t - first for t in deliver_times]


def _check_body_bytes(bodies: list[bytes], message_bytes_max: int) -> None:
    biggest = max(map(len, bodies))
    if biggest > message_bytes_max:
        raise MessageTooLargeError(
            f"a message body is {biggest} bytes; this queue's limit is {message_bytes_max} (setting message_bytes_max)"
        )


def encode_batch(
    messages: Sequence[Message | bytes],
    *,
    compression: str | None = None,
    deliver_at_ms: int = 0,
    producer_id: int = -1,
    base_sequence: int = -1,
    producer_epoch: int = -1,
    transaction_id: int = 0,
    extra_flags: int = 0,
    message_bytes_max: int | None = None,
    deliver_times: Sequence[int] | None = None,
) -> bytearray:
    """Encode messages (``Message`` objects or plain ``bytes`` bodies) into one batch.

    ``deliver_times`` (epoch ms, one per message, never decreasing) makes a delayed batch
    whose messages are due at different times; ``deliver_at_ms`` is then ignored.

    >>> b = encode_batch([b"a", Message(b"b", key=b"k", tag="t")])
    >>> from headwater.model.batch_reads import decode_records
    >>> [r.body for r in decode_records(b, "q")]
    [b'a', b'b']
    """
    n = len(messages)
    if n == 0:
        raise InvalidArgumentError("a batch needs at least one message")
    keys = tags = props = None
    flags = extra_flags
    offsets = None
    if deliver_times is not None:
        deliver_at_ms, offsets = _due_offsets(deliver_times, n)
        if offsets is not None:
            flags |= FLAG_DELIVER_TIMES
    if set(map(type, messages)) == {bytes}:  # the fast path: plain bodies, checked in C
        bodies = cast(list[bytes], list(messages))
    else:
        bodies, keys, tags, props, column_flags = _columns(messages)
        flags |= column_flags
    if message_bytes_max is not None:
        _check_body_bytes(bodies, message_bytes_max)
    mask = tags_mask({t for t in tags if t is not None}) if tags is not None else 0
    codec = _CODECS.get(compression)
    if codec is None:
        raise InvalidArgumentError(f"compression must be None, 'zstd' or 'lz4', got {compression!r}")
    columns = (
        BatchPayload(bodies, keys, tags, props)
        if offsets is None
        else _TimedPayload(bodies, keys, tags, props, offsets)
    )
    if codec:
        buf = bytearray(HEADER_SIZE) + _compress(codec, _encoder.encode(columns))
        flags |= codec
    else:  # encode straight after the header: one buffer, no copies of the payload
        buf = bytearray(HEADER_SIZE)
        _encoder.encode_into(columns, buf, HEADER_SIZE)
    if len(buf) > BATCH_BYTES_MAX:
        raise batch_too_large(len(buf), n)
    payload_size = len(buf) - HEADER_SIZE
    # header crc, queue id, partition, base offset, timestamp and reserved are the broker's,
    # patched when it appends; the crc, 0 here, is written last, over all that follows it
    broker_part = (0,) * 7
    producer_part = (producer_id, base_sequence, producer_epoch, 0, mask, transaction_id)
    HEADER.pack_into(
        buf, 0, HEADER_SIZE - 4 + payload_size, *broker_part, MAGIC, flags, HEADER_SIZE, n, payload_size,
        deliver_at_ms, *producer_part,
    )  # fmt: skip
    with memoryview(buf) as mv:
        _U32.pack_into(buf, 40, crc32c(mv[44:]))
    return buf


def _columns(
    messages: Sequence[Message | bytes],
) -> tuple[list[bytes], list[bytes | None] | None, list[str | None] | None, list[Any] | None, int]:
    """The columns of messages that are not all plain ``bytes`` (bodies, and keys, tags and
    properties where any message has one), checked, and the flags saying which are there."""
    bodies: list[bytes] = []
    for m in messages:
        if type(m) is bytes:
            bodies.append(m)
        elif isinstance(m, Message):
            bodies.append(m.body)
        elif isinstance(m, (bytearray, memoryview)):
            bodies.append(bytes(m))
        else:
            raise InvalidArgumentError(
                f"a message is a Message or bytes, got {type(m).__name__}"
                + (" (encode text first, e.g. 'text'.encode())" if isinstance(m, str) else "")
            )
    keys = tags = props = None
    flags = 0
    msgs = [m for m in messages if isinstance(m, Message)]
    if any(m.key is not None for m in msgs):
        keys = [m.key if isinstance(m, Message) else None for m in messages]
        flags |= FLAG_HAS_KEYS
    if any(m.tag is not None for m in msgs):
        tags = [m.tag if isinstance(m, Message) else None for m in messages]
        flags |= FLAG_HAS_TAGS
    if any(m.properties for m in msgs):
        props = [(m.properties or None) if isinstance(m, Message) else None for m in messages]
        flags |= FLAG_HAS_PROPERTIES
    _check_types(bodies, keys, tags, props)
    return bodies, keys, tags, props, flags


def _check_types(
    bodies: list[bytes], keys: list[bytes | None] | None, tags: list[str | None] | None, props: list[Any] | None
) -> None:
    for b in bodies:
        if type(b) is not bytes:
            raise InvalidArgumentError(
                f"a message body is bytes, got {type(b).__name__}"
                + (" (encode text first, e.g. 'text'.encode())" if isinstance(b, str) else "")
            )
    if keys is not None:
        for k in keys:
            if k is not None and type(k) is not bytes:
                raise InvalidArgumentError(f"a message key is bytes or None, got {type(k).__name__}")
    if tags is not None:
        for t in tags:
            if t is not None and (type(t) is not str or not t):
                raise InvalidArgumentError(f"a message tag is a non-empty str or None, got {t!r}")
    if props is not None:
        for p in props:
            if p is None:
                continue
            if not isinstance(p, dict) or not all(type(k) is str and type(v) is str for k, v in p.items()):
                raise InvalidArgumentError("message properties map str to str")


def decode_header(buf: bytes | bytearray | memoryview, pos: int = 0) -> BatchHeader:
    """The header of the batch at ``pos``; raises :class:`InvalidBatchError` if too short."""
    if len(buf) - pos < HEADER_SIZE:
        raise InvalidBatchError(f"a batch header is {HEADER_SIZE} bytes, got {len(buf) - pos}")
    return _new_tuple(BatchHeader, HEADER.unpack_from(buf, pos))  # _make, without its Python-level call


def check_batch(buf: bytes | bytearray | memoryview, pos: int = 0, *, broker_fields: bool = True) -> BatchHeader:
    """Verify the layout and checksums of the batch at ``pos``; return its header.

    Raises :class:`InvalidBatchError` naming what is wrong. ``broker_fields=False`` skips
    the broker checksum (a batch fresh from a producer has none yet).
    """
    h = decode_header(buf, pos)
    if h.magic != MAGIC:
        raise InvalidBatchError(f"unknown batch format version {h.magic} (this reader knows {MAGIC})")
    if h.header_size != HEADER_SIZE:
        raise InvalidBatchError(f"batch header_size is {h.header_size}, expected {HEADER_SIZE}")
    if h.length != HEADER_SIZE - 4 + h.payload_size:
        raise InvalidBatchError(f"batch length {h.length} disagrees with payload_size {h.payload_size}")
    size = 4 + h.length
    if len(buf) - pos < size:
        raise InvalidBatchError(f"batch is truncated: {len(buf) - pos} of {size} bytes present")
    if h.count < 1:
        raise InvalidBatchError("a batch must hold at least one message")
    if h.flags & ~_KNOWN_FLAGS or (h.flags & COMPRESSION_MASK) == 3:
        raise InvalidBatchError(f"unknown batch flags {h.flags:#x}")
    with memoryview(buf) as mv:
        if crc32c(mv[pos + 44 : pos + size]) != h.crc:
            raise InvalidBatchError("batch checksum mismatch: the batch was damaged")
    if broker_fields and crc32c(buf[pos + 8 : pos + 40]) != h.header_crc:  # the broker's fields
        raise InvalidBatchError("batch header checksum mismatch: the batch was damaged")
    return h


def decode_payload(buf: bytes | bytearray | memoryview, h: BatchHeader, pos: int = 0) -> BatchPayload:
    start = pos + HEADER_SIZE
    with memoryview(buf) as mv:
        raw = _decompress(h.flags & COMPRESSION_MASK, mv[start : start + h.payload_size])
        try:
            # a batch with deliver times decodes its fifth column too (the same four first)
            p = (_timed_decoder if h.flags & FLAG_DELIVER_TIMES else _decoder).decode(raw)
        except msgspec.DecodeError as e:
            raise InvalidBatchError(f"batch payload is malformed: {e}") from e
        finally:
            if isinstance(raw, memoryview):
                raw.release()
    _check_columns(p, h)
    return p


def _decode_compressed(
    buf: bytes | bytearray | memoryview, h: BatchHeader, message_bytes_max: int | None
) -> CheckedPayload:
    """The compressed payload of a producer's batch, decoded to be checked: its bodies as
    views of the decompressed bytes (:class:`CheckedPayload`), decompressed no further than
    its messages may hold (:func:`_payload_limit`). A compression bomb costs the broker no
    more than the batch could honestly hold."""
    limit = _payload_limit(h.count, message_bytes_max)
    try:
        with memoryview(buf) as mv:
            raw = _decompress(h.flags & COMPRESSION_MASK, mv[HEADER_SIZE : HEADER_SIZE + h.payload_size], limit)
    except (InvalidBatchError, MessageTooLargeError) as e:  # say where the limit comes from, only now
        raise type(e)(f"{e}{_room(h.count, message_bytes_max, limit)}") from None
    try:
        p = _checking_decoder.decode(raw)
    except msgspec.DecodeError as e:
        raise InvalidBatchError(f"batch payload is malformed: {e}") from e
    if p.deliver_offsets is not None and not h.flags & FLAG_DELIVER_TIMES:
        raise InvalidBatchError("batch payload is malformed: deliver offsets in a batch not flagged with deliver times")
    _check_columns(p, h)
    return p


def _check_columns(p: BatchPayload | CheckedPayload, h: BatchHeader) -> None:
    """Each column holds one value per message, as many as the header counts."""
    n = len(p.bodies)
    keys, tags, props = p.keys, p.tags, p.properties
    if (
        n != h.count
        or (keys is not None and len(keys) != n)
        or (tags is not None and len(tags) != n)
        or (props is not None and len(props) != n)
    ):
        raise InvalidBatchError(f"batch payload columns disagree with count {h.count}")


def _payload_limit(count: int, message_bytes_max: int | None) -> int:
    """What a payload of ``count`` messages may hold: each a body of at most
    ``message_bytes_max`` and MESSAGE_ROOM_BYTES for its key, tag, properties and framing
    (never more than a batch)."""
    if message_bytes_max is None:
        return BATCH_BYTES_MAX
    return min(BATCH_BYTES_MAX, count * (message_bytes_max + MESSAGE_ROOM_BYTES))


def _room(count: int, message_bytes_max: int | None, limit: int) -> str:
    """Where a payload limit comes from, for its error (formatted only when needed: an
    f-string per append cost the hot path a third of a microsecond)."""
    if limit == BATCH_BYTES_MAX or message_bytes_max is None:
        return ""
    return (
        f" ({count} message(s) of at most message_bytes_max={message_bytes_max} bytes, and "
        f"{MESSAGE_ROOM_BYTES} bytes for each one's key, tag and properties)"
    )


def decode_deliver_offsets(
    buf: bytes | bytearray | memoryview,
    h: BatchHeader,
    pos: int = 0,
    payload: BatchPayload | CheckedPayload | None = None,
) -> list[int] | None:
    """The per-message deliver offsets of a batch with ``FLAG_DELIVER_TIMES`` (None for any
    other batch), checked: one per message, starting at 0, never decreasing, within
    ``DELIVER_SPAN_MS_MAX``. ``payload``: the batch's, already decoded."""
    if not h.flags & FLAG_DELIVER_TIMES:
        return None
    p = payload if payload is not None else decode_payload(buf, h, pos)
    offsets = p.deliver_offsets if isinstance(p, (_TimedPayload, CheckedPayload)) else None
    if offsets is None or len(offsets) != h.count or h.deliver_at_ms <= 0:
        raise InvalidBatchError("a batch flagged with deliver times needs deliver_at_ms and one offset per message")
    if offsets[0] != 0 or any(b < a for a, b in zip(offsets, offsets[1:])):
        raise InvalidBatchError("deliver offsets must start at 0 and never decrease along the batch")
    if offsets[-1] > DELIVER_SPAN_MS_MAX:
        raise InvalidBatchError(f"the messages of one batch must be due within {DELIVER_SPAN_MS_MAX} ms of each other")
    return offsets


def batch_too_large(size: int, count: int) -> MessageTooLargeError:
    """The error for a batch of ``count`` messages that is ``size`` bytes (encoded or
    estimated), over BATCH_BYTES_MAX: one message too large, or too many at once.

    >>> str(batch_too_large(67_200_000, 1)).startswith("one message is 67200000 bytes")
    True
    """
    if count == 1:
        return MessageTooLargeError(
            f"one message is {size} bytes in its batch (body, key, tag and properties, with the "
            f"{HEADER_SIZE}-byte batch header); a batch holds at most {BATCH_BYTES_MAX}: send a "
            f"smaller body, key or properties"
        )
    return MessageTooLargeError(
        f"the batch of {count} messages is {size} bytes; the limit is {BATCH_BYTES_MAX}: send fewer messages at once"
    )


def validate_batch(
    buf: bytes | bytearray | memoryview, *, message_bytes_max: int | None = None
) -> tuple[BatchHeader, BatchPayload | CheckedPayload]:
    """Everything the broker checks of a producer's batch before appending it."""
    p: BatchPayload | CheckedPayload | None = None
    try:
        if len(buf) > BATCH_BYTES_MAX:  # as encode_batch refuses, in process and over the network
            raise MessageTooLargeError(f"the batch is {len(buf)} bytes; the limit is {BATCH_BYTES_MAX}")
        h = check_batch(buf, 0, broker_fields=False)
        size = 4 + h.length  # h.size
        if size != len(buf):
            raise InvalidBatchError(f"{len(buf) - size} stray bytes after the batch")
        if h.flags & (FLAG_TRANSACTIONAL | FLAG_CONTROL):
            raise InvalidBatchError(
                f"batch flags {h.flags:#x}: 0x20 (transactional) and 0x40 (control) are reserved for "
                f"transactions, which this broker does not offer"
            )
        if h.flags & COMPRESSION_MASK:
            p = _decode_compressed(buf, h, message_bytes_max)
        else:  # its bodies came as they are (no bomb); the same bound as a compressed one's
            room = MESSAGE_ROOM_BYTES if message_bytes_max is None else message_bytes_max + MESSAGE_ROOM_BYTES
            if h.payload_size > room and h.payload_size > (limit := _payload_limit(h.count, message_bytes_max)):
                why = _room(h.count, message_bytes_max, limit)
                raise MessageTooLargeError(f"the batch payload is {h.payload_size} bytes, beyond {limit}{why}")
            p = decode_payload(buf, h)
        for flag, column, name in (
            (FLAG_HAS_KEYS, p.keys, "keys"),
            (FLAG_HAS_TAGS, p.tags, "tags"),
            (FLAG_HAS_PROPERTIES, p.properties, "properties"),
        ):
            if bool(h.flags & flag) != (column is not None):
                raise InvalidBatchError(
                    f"batch flag {flag:#x} ({name}) is {'set' if h.flags & flag else 'clear'} but the {name} "
                    f"column is {'nil' if column is None else 'present'}: they must agree"
                )
        if message_bytes_max is not None:
            biggest = max(map(len, p.bodies))
            if biggest > message_bytes_max:
                raise MessageTooLargeError(
                    f"a message body is {biggest} bytes; this queue's limit is {message_bytes_max}"
                )
        want = 0
        if p.tags is not None:
            if any(t == "" for t in p.tags):
                raise InvalidBatchError("a message tag cannot be empty")
            want = tags_mask({t for t in p.tags if t is not None})
        if want != h.tag_mask:
            raise InvalidBatchError("batch tag_mask does not match the tags inside")
        if h.flags & FLAG_DELIVER_TIMES:
            decode_deliver_offsets(buf, h, payload=p)
        return h, p
    except HeadwaterError as e:
        # The traceback holds the frames that decoded the payload, and through their locals
        # the decompressed bytes (up to 64 MiB). An error kept for its answer, or caught in a
        # reference cycle until a full collection, kept them all alive: a stream of
        # compression bombs grew a broker by 1.8 GiB. So the error leaves with no frame but
        # this one, and this one's payload let go; its message says what went wrong.
        p = None
        e.__cause__ = e.__context__ = None
        raise e.with_traceback(None)  # noqa: B904 - the cause was cleared on purpose, above


def patch_batch(
    buf: bytes | bytearray | memoryview,
    queue_id: int,
    partition: int,
    base_offset: int,
    timestamp_ms: int,
) -> bytearray:
    """A copy of the batch with the broker's fields set and their checksum computed."""
    out = bytearray(buf)
    _BROKER.pack_into(out, 8, queue_id, partition, base_offset, timestamp_ms, 0)
    _U32.pack_into(out, 4, crc32c(out[8:40]))
    return out


def broker_prefix(
    length: int, queue_id: int, partition: int, base_offset: int, timestamp_ms: int, broker_reserved: int = 0
) -> bytes:
    """The first 40 bytes of a stored batch: its length and the broker's fields, checksummed.

    The broker writes this prefix followed by the producer's bytes from offset 40 on, so
    appending never copies the batch."""
    fields = _BROKER.pack(queue_id, partition, base_offset, timestamp_ms, broker_reserved)
    return _U32.pack(length) + _U32.pack(crc32c(fields)) + fields
