"""Checks and values both producers share at their edges (the state they share is the core,
:mod:`headwater.client.core`): checks of settings and messages, size estimates, deliver
times, the metadata cache's refresh rule, the receipt of a batch.

>>> check_message(Message(b"body", key=b"k", tag="t"), 1000)  # 4 + 1 + 1 + overhead
22
>>> r = BatchReceipt(ProduceResult(queue_id=1, partition=0, base_offset=10, count=3, timestamp_ms=0))
>>> [m.offset for m in r]
[10, 11, 12]
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Sequence

from headwater.client.core.outcomes import RetryPolicy, int_setting
from headwater.errors import InvalidArgumentError, MessageTooLargeError, QueueNotFoundError
from headwater.model.batch import BATCH_BYTES_MAX, HEADER_SIZE, batch_too_large
from headwater.model.config import QueueInfo
from headwater.model.delay import resolve_deliver_at
from headwater.model.message import Message, MessageId
from headwater.model.service import ProduceResult

__all__ = [
    "MESSAGE_OVERHEAD_BYTES",
    "METADATA_RETRY_S",
    "COMPRESSIONS",
    "BatchReceipt",
    "check_compression",
    "RetrySettings",
    "store_refreshed",
    "deliver_at_ms",
    "int_setting",
    "too_large",
    "check_message",
    "check_messages",
]

MESSAGE_OVERHEAD_BYTES = 16  # added to a message's size in the buffer and batch estimates
_ALONE_BYTES_MAX = BATCH_BYTES_MAX - HEADER_SIZE  # the estimate of a message that fills a batch alone
METADATA_RETRY_S = 0.5  # a background refresh of a queue's metadata that failed is tried again after this
COMPRESSIONS = (None, "zstd", "lz4")
_CODEC_MODULES = {"zstd": "zstandard", "lz4": "lz4.frame"}


def check_compression(compression: object) -> None:
    """Refuse a ``compression`` setting that is not a codec, or whose library is not
    installed (a plain ``pip install headwater`` has neither zstandard nor lz4): when the
    producer is made, not when its first batch is encoded, on its sender thread."""
    if compression not in COMPRESSIONS:
        raise InvalidArgumentError(f"compression must be None, 'zstd' or 'lz4', got {compression!r}")
    if compression is not None:
        module = _CODEC_MODULES[compression]
        try:
            importlib.import_module(module)
        except ImportError:
            raise InvalidArgumentError(
                f"compression={compression!r} needs the {module.split('.')[0]} package, which is not "
                f"installed: pip install 'headwater[compression]'"
            ) from None


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


def too_large(size: int, cap: int) -> MessageTooLargeError:
    return MessageTooLargeError(
        f"a message body is {size} bytes; this queue's limit is {cap} (setting message_bytes_max)"
    )


def check_message(m: Message | bytes, cap: int) -> int:
    """Validate one message as the broker would; return its size estimate. A body over
    ``cap`` (the queue's message_bytes_max), or a message that would not fit in a batch of
    its own (a body within the cap with a large key or properties), raises
    :class:`MessageTooLargeError`."""
    if type(m) is bytes:
        if len(m) > cap:
            raise too_large(len(m), cap)
        if len(m) + MESSAGE_OVERHEAD_BYTES > _ALONE_BYTES_MAX:  # a queue's cap keeps bodies below; no cap yet
            raise batch_too_large(len(m) + MESSAGE_OVERHEAD_BYTES + HEADER_SIZE, 1)
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
    if size > _ALONE_BYTES_MAX:
        raise batch_too_large(size + HEADER_SIZE, 1)
    return size


def check_messages(messages: Sequence[Message | bytes], cap: int) -> int:
    """Validate messages bound for one batch; return their size estimate."""
    if set(map(type, messages)) == {bytes}:  # plain bodies: checked in C
        biggest = max(map(len, messages))  # type: ignore[arg-type]
        if biggest > cap:
            raise too_large(biggest, cap)
        size = sum(map(len, messages)) + MESSAGE_OVERHEAD_BYTES * len(messages)  # type: ignore[arg-type]
    else:
        size = sum(check_message(m, cap) for m in messages)
    if size > _ALONE_BYTES_MAX:
        raise batch_too_large(size + HEADER_SIZE, len(messages))
    return size


class RetrySettings:
    """A producer's retry settings, read-only, as its :class:`RetryPolicy` (``_retry``) holds them."""

    __slots__ = ()
    _retry: RetryPolicy

    @property
    def retries(self) -> int:
        return self._retry.retries

    @property
    def retry_backoff_ms(self) -> int:
        return self._retry.base_backoff_ms

    @property
    def retry_backoff_max_ms(self) -> int:
        return self._retry.backoff_max_ms

    @property
    def delivery_timeout_ms(self) -> int:
        return self._retry.delivery_timeout_ms


def store_refreshed(
    cache: dict[str, tuple[float, QueueInfo]],
    queue: str,
    asked_at: float,
    outcome: QueueInfo | BaseException,
    *,
    max_age_s: float,
    now: float,
) -> None:
    """Keep what a background refresh of ``queue``'s metadata brought, in ``cache`` (queue:
    (when asked, metadata)): new metadata, stamped when it was asked for, unless a newer copy
    arrived meanwhile; for a queue that no longer exists, nothing (the next send asks again
    and fails with the broker's error); after any other failure, the old copy, stale again
    in ``METADATA_RETRY_S``.

    >>> cache = {"q": (0.0, "old")}
    >>> store_refreshed(cache, "q", 10.0, TimeoutError("down"), max_age_s=5.0, now=12.0)
    >>> cache["q"]  # due again at 12.5
    (7.5, 'old')
    >>> store_refreshed(cache, "q", 13.0, "new", max_age_s=5.0, now=13.1)
    >>> cache["q"]
    (13.0, 'new')
    >>> store_refreshed(cache, "q", 14.0, QueueNotFoundError("gone"), max_age_s=5.0, now=14.1)
    >>> cache
    {}
    """
    got = cache.get(queue)
    if isinstance(outcome, QueueNotFoundError):
        cache.pop(queue, None)
    elif isinstance(outcome, BaseException):
        if got is not None:
            cache[queue] = (max(got[0], now - max_age_s + METADATA_RETRY_S), got[1])
    elif got is None or got[0] <= asked_at:
        cache[queue] = (asked_at, outcome)


def deliver_at_ms(clock: Callable[[], float], deliver_at: object, delay: object) -> int:
    """The batch's deliver_at_ms for a send's ``deliver_at``/``delay`` (0: at once).

    >>> deliver_at_ms(lambda: 1000.0, None, 2.5), deliver_at_ms(lambda: 1000.0, 999_000, None)
    (1002500, 0)
    """
    if deliver_at is None and delay is None:
        return 0
    now_ms = int(clock() * 1000)
    if type(deliver_at) is int and delay is None and -(10**15) < deliver_at < 10**15:  # the common case
        return deliver_at if deliver_at > now_ms else 0
    return resolve_deliver_at(deliver_at, delay, now_ms=now_ms)
