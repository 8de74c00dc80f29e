"""What the thread-based and the asyncio producers share, and that does no I/O: the limits
of the idempotence fields and the sequences batches take, the retry policy, checks of
settings and messages, size estimates, deliver times, the receipt of a batch.

>>> check_message(Message(b"body", key=b"k", tag="t"), 1000)  # 4 + 1 + 1 + overhead
22
>>> r = BatchReceipt(ProduceResult(queue_id=1, partition=0, base_offset=10, count=3, timestamp_ms=0))
>>> [m.offset for m in r]
[10, 11, 12]
"""

from __future__ import annotations

import importlib
import logging
import random
import secrets
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

from headwater.errors import (
    ClosedError,
    InvalidArgumentError,
    MessageTooLargeError,
    OutOfOrderSequenceError,
    ProducerFencedError,
    QueueNotFoundError,
    UnavailableError,
    UsageError,
)
from headwater.model.batch import BATCH_BYTES_MAX, HEADER_SIZE, batch_too_large
from headwater.model.config import QueueInfo
from headwater.model.delay import resolve_deliver_at
from headwater.model.message import Message, MessageId
from headwater.model.service import ProduceResult

__all__ = [
    "SEQUENCE_MOD",
    "EPOCH_MAX",
    "MESSAGE_OVERHEAD_BYTES",
    "METADATA_RETRY_S",
    "COMPRESSIONS",
    "BatchReceipt",
    "check_compression",
    "RetryPolicy",
    "RetrySettings",
    "Sequenced",
    "closed_unsent",
    "store_refreshed",
    "new_identity",
    "next_epoch",
    "take_sequence",
    "give_back_sequence",
    "deliver_at_ms",
    "int_setting",
    "too_large",
    "check_message",
    "check_messages",
    "may_be_appended",
]

SEQUENCE_MOD = 2**31  # the broker counts sequences modulo this (a signed 32-bit field)
EPOCH_MAX = 2**15 - 1  # the epoch is a signed 16-bit field; past it, a new producer id
MESSAGE_OVERHEAD_BYTES = 16  # added to a message's size in the buffer and batch estimates
_ALONE_BYTES_MAX = BATCH_BYTES_MAX - HEADER_SIZE  # the estimate of a message that fills a batch alone
METADATA_RETRY_S = 0.5  # a background refresh of a queue's metadata that failed is tried again after this
COMPRESSIONS = (None, "zstd", "lz4")
_CODEC_MODULES = {"zstd": "zstandard", "lz4": "lz4.frame"}

log = logging.getLogger("headwater.producer")


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


def int_setting(name: str, value: object, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise InvalidArgumentError(f"{name} must be an int from {lo} to {hi}, got {value!r}")
    return value


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
    if size > _ALONE_BYTES_MAX:
        raise batch_too_large(size + HEADER_SIZE, len(messages))
    return size


class RetryPolicy:
    """When a producer sends a failed batch again, and what the batch's futures get when it
    does not: the ``retries``, ``retry_backoff_ms``, ``retry_backoff_max_ms`` and
    ``delivery_timeout_ms`` settings, checked. Times are the caller's monotonic seconds.

    >>> p = RetryPolicy(retries=3, backoff_ms=100, backoff_max_ms=300, delivery_timeout_ms=5000,
    ...                 rng=random.Random(7))
    >>> waits = [p.backoff_s(n, created_s=0.0, now_s=0.0) for n in (1, 2, 3, 4)]
    >>> all(0.8 * b <= w <= 1.2 * b for w, b in zip(waits, (0.1, 0.2, 0.3, 0.3)))  # doubling, capped, +-20 %
    True
    >>> p.backoff_s(1, created_s=0.0, now_s=4.99) is None  # it would end past delivery_timeout_ms
    True
    >>> p.gives_up(attempts=4, aborting=False), p.gives_up(attempts=3, aborting=False)
    (True, False)
    """

    __slots__ = ("retries", "backoff_ms", "backoff_max_ms", "delivery_timeout_ms", "_timeout_s", "_rng")

    def __init__(
        self, *, retries: int, backoff_ms: int, backoff_max_ms: int, delivery_timeout_ms: int, rng: random.Random
    ) -> None:
        self.retries = int_setting("retries", retries, 0, 1_000_000)
        self.backoff_ms = int_setting("retry_backoff_ms", backoff_ms, 0, 3_600_000)
        self.backoff_max_ms = int_setting("retry_backoff_max_ms", backoff_max_ms, self.backoff_ms, 3_600_000)
        self.delivery_timeout_ms = int_setting("delivery_timeout_ms", delivery_timeout_ms, 1, 86_400_000)
        self._timeout_s = delivery_timeout_ms / 1000
        self._rng = rng

    def gives_up(self, attempts: int, aborting: bool) -> bool:
        """No more attempts: ``attempts`` used up the retries, or the producer is closing."""
        return attempts > self.retries or aborting

    def backoff_s(self, attempts: int, created_s: float, now_s: float) -> float | None:
        """Seconds to wait before attempt ``attempts + 1`` of a batch made at ``created_s``;
        None when that would end past the delivery timeout."""
        backoff_ms = min(self.backoff_ms * 2 ** min(attempts - 1, 30), self.backoff_max_ms)
        delay = backoff_ms / 1000 * (0.8 + 0.4 * self._rng.random())  # +-20% jitter
        if now_s + delay - created_s > self._timeout_s:
            return None
        return delay

    def refuse_first_send(self, created_s: float, now_s: float, aborting: bool) -> BaseException | None:
        """Why a batch made at ``created_s`` must not go out for its first attempt (the
        producer is closing, or the batch waited past the delivery timeout); None when it may."""
        if aborting:
            return closed_unsent()
        if now_s - created_s > self._timeout_s:
            return UnavailableError(
                f"the batch waited longer than delivery_timeout_ms={self.delivery_timeout_ms} to be sent"
            )
        return None

    def final_error(self, exc: BaseException, attempts: int, aborting: bool) -> BaseException:
        """What a batch failing with ``exc`` after ``attempts`` fails with: a retriable error
        that ran out of time says so (the error is its cause); any other is itself."""
        if getattr(exc, "retriable", False) and not self.gives_up(attempts, aborting):
            err = UnavailableError(
                f"not acknowledged within delivery_timeout_ms={self.delivery_timeout_ms} "
                f"({attempts} attempts); last error: {exc}"
            )
            err.__cause__ = exc
            return err
        return exc


class RetrySettings:
    """A producer's retry settings, read-only, as its :class:`RetryPolicy` (``_retry``) holds them."""

    __slots__ = ()
    _retry: RetryPolicy

    @property
    def retries(self) -> int:
        return self._retry.retries

    @property
    def retry_backoff_ms(self) -> int:
        return self._retry.backoff_ms

    @property
    def retry_backoff_max_ms(self) -> int:
        return self._retry.backoff_max_ms

    @property
    def delivery_timeout_ms(self) -> int:
        return self._retry.delivery_timeout_ms


class Sequenced(Protocol):
    """A partition's sequence state, in either producer: the (producer id, epoch) its
    ``next_sequence`` counts under."""

    identity: tuple[int, int] | None
    next_sequence: int


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
    >>> store_refreshed(cache, "q", 10.0, UnavailableError("down"), max_age_s=5.0, now=12.0)
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


def closed_unsent() -> ClosedError:
    """What a message still unsent when its producer closed fails with."""
    return ClosedError("the producer was closed before this message was sent")


def new_identity(idempotent: bool) -> tuple[int, int] | None:
    """A fresh (producer id, epoch): a random 62-bit id, so two producers never share one."""
    return (secrets.randbits(62), 0) if idempotent else None


def next_epoch(identity: tuple[int, int]) -> tuple[int, int]:
    """The identity after a batch failed once it may have been stored: the next epoch, whose
    sequences start afresh (a new id past ``EPOCH_MAX``).

    >>> next_epoch((5, 0)), next_epoch((5, EPOCH_MAX))[0] != 5
    ((5, 1), True)
    """
    pid, epoch = identity
    log.info("producer %d: epoch bumped to %d after a failed batch", pid, epoch + 1)
    return (secrets.randbits(62), 0) if epoch >= EPOCH_MAX else (pid, epoch + 1)


def take_sequence(part: Sequenced, identity: tuple[int, int] | None, count: int) -> tuple[int, int, int]:
    """(producer id, base sequence, epoch) to encode a batch of ``count`` messages with; the
    partition's next batch follows it, before this one's answer. ``-1``s when not idempotent.

    >>> class P: identity, next_sequence = None, 0
    >>> part = P()
    >>> take_sequence(part, (9, 0), 3), take_sequence(part, (9, 0), 2), take_sequence(part, (9, 1), 1)
    ((9, 0, 0), (9, 3, 0), (9, 0, 1))
    """
    if identity is None:
        return -1, -1, -1
    if part.identity != identity:  # first batch, or a new epoch: sequences start afresh
        part.identity, part.next_sequence = identity, 0
    seq = part.next_sequence
    part.next_sequence = (seq + count) % SEQUENCE_MOD
    return identity[0], seq, identity[1]


def give_back_sequence(part: Sequenced, identity: tuple[int, int] | None, base_sequence: int, count: int) -> None:
    """A batch encoded at ``base_sequence`` was not stored: its range is free again, unless a
    later batch already took the next one (then the broker will say what is missing)."""
    if (
        identity is not None
        and part.identity == identity
        and part.next_sequence == (base_sequence + count) % SEQUENCE_MOD
    ):
        part.next_sequence = base_sequence


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
