"""What the thread-based and the asyncio producers share, and that does no I/O: the limits
of the idempotence fields, checks of settings and messages, size estimates, the receipt of
a batch.

>>> check_message(Message(b"body", key=b"k", tag="t"), 1000)  # 4 + 1 + 1 + overhead
22
>>> r = BatchReceipt(ProduceResult(queue_id=1, partition=0, base_offset=10, count=3, timestamp_ms=0))
>>> [m.offset for m in r]
[10, 11, 12]
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from headwater.errors import (
    InvalidArgumentError,
    MessageTooLargeError,
    OutOfOrderSequenceError,
    ProducerFencedError,
    UsageError,
)
from headwater.model.batch import BATCH_BYTES_MAX, HEADER_SIZE
from headwater.model.message import Message, MessageId
from headwater.model.service import ProduceResult

__all__ = [
    "SEQUENCE_MOD",
    "EPOCH_MAX",
    "MESSAGE_OVERHEAD_BYTES",
    "COMPRESSIONS",
    "BatchReceipt",
    "int_setting",
    "too_large",
    "check_message",
    "check_messages",
    "may_be_appended",
]

SEQUENCE_MOD = 2**31  # the broker counts sequences modulo this (a signed 32-bit field)
EPOCH_MAX = 2**15 - 1  # the epoch is a signed 16-bit field; past it, a new producer id
MESSAGE_OVERHEAD_BYTES = 16  # added to a message's size in the buffer and batch estimates
COMPRESSIONS = (None, "zstd", "lz4")


class BatchReceipt(Sequence[MessageId]):
    """The ids of one appended batch, made on demand (a batch of 500 makes no 500 objects)."""

    __slots__ = ("result",)

    def __init__(self, result: ProduceResult) -> None:
        self.result = result

    def __len__(self) -> int:
        return self.result.count

    def __getitem__(self, i):  # type: ignore[override]
        r = self.result
        if isinstance(i, slice):
            return [MessageId(r.queue_id, r.partition, r.base_offset + j) for j in range(r.count)[i]]
        if i < 0:
            i += r.count
        if not 0 <= i < r.count:
            raise IndexError(i)
        return MessageId(r.queue_id, r.partition, r.base_offset + i)

    def __iter__(self) -> Iterator[MessageId]:
        r = self.result
        for j in range(r.count):
            yield MessageId(r.queue_id, r.partition, r.base_offset + j)

    def __repr__(self) -> str:
        r = self.result
        return f"<BatchReceipt partition={r.partition} offsets={r.base_offset}..{r.base_offset + r.count - 1}>"


def int_setting(name: str, value: object, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise InvalidArgumentError(f"{name} must be an int from {lo} to {hi}, got {value!r}")
    return value


def too_large(size: int, cap: int) -> MessageTooLargeError:
    return MessageTooLargeError(
        f"a message body is {size} bytes; this queue's limit is {cap} (setting message_bytes_max)"
    )


def check_message(m: Message | bytes, cap: int) -> int:
    """Validate one message as the broker would; return its size estimate."""
    if type(m) is bytes:
        if len(m) > cap:
            raise too_large(len(m), cap)
        return len(m) + MESSAGE_OVERHEAD_BYTES
    if not isinstance(m, Message):
        raise InvalidArgumentError(
            f"a message is a Message or bytes, got {type(m).__name__}"
            + (" (encode text first, e.g. 'text'.encode())" if isinstance(m, str) else "")
        )
    body, key, tag, props = m.body, m.key, m.tag, m.properties
    if type(body) is not bytes:
        raise InvalidArgumentError(
            f"a message body is bytes, got {type(body).__name__}"
            + (" (encode text first, e.g. 'text'.encode())" if isinstance(body, str) else "")
        )
    if len(body) > cap:
        raise too_large(len(body), cap)
    size = len(body) + MESSAGE_OVERHEAD_BYTES
    if key is not None:
        if type(key) is not bytes:
            raise InvalidArgumentError(
                f"a message key is bytes or None, got {type(key).__name__}"
                + (" (encode it first, e.g. key.encode())" if isinstance(key, str) else "")
            )
        size += len(key)
    if tag is not None:
        if type(tag) is not str or not tag:
            raise InvalidArgumentError(f"a message tag is a non-empty str or None, got {tag!r}")
        size += len(tag)
    if props:
        if not isinstance(props, dict) or not all(type(k) is str and type(v) is str for k, v in props.items()):
            raise InvalidArgumentError("message properties map str to str")
        size += sum(len(k) + len(v) for k, v in props.items())
    return size


def may_be_appended(exc: BaseException) -> bool:
    """Could the broker have appended a batch whose request ended with ``exc``? A usage
    error is a refusal before appending, except the sequence errors (our state disagrees
    with the broker's)."""
    return not isinstance(exc, UsageError) or isinstance(exc, (OutOfOrderSequenceError, ProducerFencedError))


def check_messages(messages: Sequence[Message | bytes], cap: int) -> int:
    """Validate messages bound for one batch; return their size estimate."""
    if set(map(type, messages)) == {bytes}:  # plain bodies: checked in C
        biggest = max(map(len, messages))  # type: ignore[arg-type]
        if biggest > cap:
            raise too_large(biggest, cap)
        size = sum(map(len, messages)) + MESSAGE_OVERHEAD_BYTES * len(messages)  # type: ignore[arg-type]
    else:
        size = sum(check_message(m, cap) for m in messages)
    if size + HEADER_SIZE > BATCH_BYTES_MAX:
        raise MessageTooLargeError(
            f"the batch is about {size} bytes; the limit is {BATCH_BYTES_MAX}: send fewer messages at once"
        )
    return size
