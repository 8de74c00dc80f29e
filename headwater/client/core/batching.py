"""What the thread-based and the asyncio producers share above their core
(:mod:`headwater.client.core`), as httpx's clients share a base: :class:`ProducerBase` (the
settings, checked, the core, the split of a ``send_batch``), checks of messages, size
estimates, deliver times, the receipt of a batch.

>>> check_message(Message(b"body", key=b"k", tag="t"), 1000)  # 4 + 1 + 1 + overhead
22
>>> r = BatchReceipt(ProduceResult(queue_id=1, partition=0, base_offset=10, count=3, timestamp_ms=0))
>>> [m.offset for m in r]
[10, 11, 12]
"""

from __future__ import annotations

import importlib
import random
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from headwater.client.core.metadata import MetadataCache
from headwater.client.core.outcomes import RetryPolicy, Verdict, int_setting
from headwater.client.core.partitioner import Partitioner, PartitionFn
from headwater.client.core.producer import (
    DELAY_BATCHES_MAX_DEFAULT,
    DELAY_BATCHES_MAX_MAX,
    DELAY_BUCKET_MS_DEFAULT,
    DELAY_BUCKET_MS_MAX,
    Batch,
    PartitionState,
    ProducerCore,
)
from headwater.errors import (
    ClosedError,
    InvalidArgumentError,
    MessageTooLargeError,
    PartitionOutOfRangeError,
    QueueNotFoundError,
    UnavailableError,
)
from headwater.model.batch import BATCH_BYTES_MAX, HEADER_SIZE, batch_too_large
from headwater.model.config import QueueInfo
from headwater.model.delay import resolve_deliver_at
from headwater.model.message import Message, MessageId
from headwater.model.producer_state import RECENT_BATCHES
from headwater.model.service import ProduceResult

__all__ = [
    "MESSAGE_OVERHEAD_BYTES",
    "COMPRESSIONS",
    "BatchReceipt",
    "Groups",
    "ProducerBase",
    "as_message",
    "no_partition",
    "check_compression",
    "receipt",
    "check_batch_arg",
    "deliver_at_ms",
    "int_setting",
    "too_large",
    "check_message",
    "check_messages",
]

#: a ``send_batch``'s messages by partition (None: the sticky one), as indexes into its list
Groups = dict[int | None, Sequence[int]]

MESSAGE_OVERHEAD_BYTES = 16  # added to a message's size in the buffer and batch estimates
_ALONE_BYTES_MAX = BATCH_BYTES_MAX - HEADER_SIZE  # the estimate of a message that fills a batch alone
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

    def __getitem__(self, i: int | slice) -> Any:  # MessageId, or a list of them for a slice
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
        biggest = max(map(len, messages))  # type: ignore[arg-type]  # checked to be bytes or Messages: sized
        if biggest > cap:
            raise too_large(biggest, cap)
        size = sum(map(len, messages)) + MESSAGE_OVERHEAD_BYTES * len(messages)  # type: ignore[arg-type]  # checked to be bytes or Messages: sized
    else:
        size = sum(check_message(m, cap) for m in messages)
    if size > _ALONE_BYTES_MAX:
        raise batch_too_large(size + HEADER_SIZE, len(messages))
    return size


class ProducerBase:
    """The settings both producers take, checked, and what they do with them without I/O:
    the core that keeps their batches, the partitioner, the producer's ids, deliver times,
    how a ``send_batch`` splits over partitions. ``pipelined``: the service keeps the order
    of requests (a connection), so batches of a partition may be pipelined.

    Options (all keyword-only; ``docs/producing.md`` explains each with an example):

    - ``partitioner``: ``"default"``, ``"key"``, ``"round_robin"``, ``"random"`` or a function
      ``(message, partition_count) -> partition`` (see :mod:`headwater.client.core.partitioner`).
    - ``compression``: ``None``, ``"zstd"`` or ``"lz4"`` (the ``compression`` extra).
    - ``linger_ms``: how long a partition's batch waits for more messages; 0 sends at once
      while the partition has room in flight (messages arriving meanwhile form the next one).
    - ``max_in_flight``: batches of one partition in flight at once, 1 to 5 (default 5 for
      an idempotent producer, whose retries keep their order; 1 otherwise). Embedded
      producers always use 1.
    - ``batch_bytes_max``: a batch is sent when its messages reach this size.
    - ``retries``, ``retry_backoff_ms``, ``retry_backoff_max_ms``: a batch failing with a
      retriable error is sent again up to ``retries`` times, after
      ``retry_backoff_ms * 2**n`` (capped, with jitter).
    - ``delivery_timeout_ms``: the longest a message may take from ``send()`` to its outcome
      (lingering, waiting for its partition, retries); then its future fails.
    - ``idempotent``: stamp batches with a producer id and sequence, so retries are stored
      once.
    - ``buffer_bytes_max``: the memory messages sent without waiting may hold.
    - ``metadata_max_age_ms``: how long a queue's partition count and limits are cached;
      an older copy is refreshed in the background while sends go on with it.
    - ``rng``: the randomness of the backoff jitter and of the ``"random"`` partitioner.
    - ``clock``: seconds since the epoch, for ``delay=`` and for how far ahead a delayed
      message is due (default: the embedded broker's clock, else ``time.time``).
    - ``delay_bucket_ms``: delayed messages of a partition due within one such aligned span
      share a batch, whatever the order of their times (each keeps its exact time); 1 to
      60,000. Messages due ten minutes ahead or more share one by the minute.
    - ``delay_batches_max``: open batches of delayed messages per partition (one per
      bucket), 1 to 65,536 (default 2,048); at the limit the oldest is sealed.
    """

    def __init__(
        self,
        service: object,
        *,
        new_batch: Callable[[PartitionState, float], Batch],
        pipelined: bool,
        partitioner: str | PartitionFn = "default",
        compression: str | None = None,
        linger_ms: int = 0,
        batch_bytes_max: int = 1 << 20,
        retries: int = 5,
        retry_backoff_ms: int = 100,
        retry_backoff_max_ms: int = 1000,
        delivery_timeout_ms: int = 120_000,
        idempotent: bool = True,
        buffer_bytes_max: int = 32 << 20,
        metadata_max_age_ms: int = 5000,
        max_in_flight: int | None = None,
        rng: random.Random | None = None,
        clock: Callable[[], float] | None = None,
        delay_bucket_ms: int = DELAY_BUCKET_MS_DEFAULT,
        delay_batches_max: int = DELAY_BATCHES_MAX_DEFAULT,
    ) -> None:
        check_compression(compression)
        if not isinstance(idempotent, bool):
            raise InvalidArgumentError(f"idempotent is True or False, got {idempotent!r}")
        self._rng = rng or random.Random()
        self._clock = clock or time.time  # turns delay= into a deliver time
        self._partitioner = Partitioner(partitioner, rng=self._rng)
        self._service = service
        self.compression = compression
        self.linger_ms = int_setting("linger_ms", linger_ms, 0, 3_600_000)
        self.batch_bytes_max = int_setting("batch_bytes_max", batch_bytes_max, 1, BATCH_BYTES_MAX // 2)
        self._retry = RetryPolicy(
            retries=retries,
            backoff_ms=retry_backoff_ms,
            backoff_max_ms=retry_backoff_max_ms,
            delivery_timeout_ms=delivery_timeout_ms,
            rng=self._rng,
        )
        self.idempotent = idempotent
        self.buffer_bytes_max = int_setting("buffer_bytes_max", buffer_bytes_max, 1, 1 << 40)
        self._metadata = MetadataCache(int_setting("metadata_max_age_ms", metadata_max_age_ms, 0, 86_400_000))
        self.max_in_flight = (
            (RECENT_BATCHES if idempotent else 1)
            if max_in_flight is None
            else int_setting("max_in_flight", max_in_flight, 1, RECENT_BATCHES)
        )
        self._core = ProducerCore(
            new_batch=new_batch,
            batch_sent=self._partitioner.batch_sent,
            retry=self._retry,
            linger_ms=self.linger_ms,
            batch_bytes_max=self.batch_bytes_max,
            pipeline=self.max_in_flight if pipelined else 1,
            idempotent=idempotent,
            compression=compression,
            delay_bucket_ms=int_setting("delay_bucket_ms", delay_bucket_ms, 1, DELAY_BUCKET_MS_MAX),
            delay_batches_max=int_setting("delay_batches_max", delay_batches_max, 1, DELAY_BATCHES_MAX_MAX),
            clock=self._clock,
        )
        self._parts = self._core.parts
        self._buffered_bytes = 0  # of messages sent without waiting, not settled yet
        self._flushing = 0
        self._closed = False

    @property
    def producer_id(self) -> int | None:
        """The id batches carry (None unless idempotent); changes only after 32767 epochs."""
        identity = self._core.identity
        return None if identity is None else identity[0]

    @property
    def producer_epoch(self) -> int | None:
        """The epoch batches carry; bumped when a batch fails after it may have been stored."""
        identity = self._core.identity
        return None if identity is None else identity[1]

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

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("the producer is closed")

    def _deliver_at(self, deliver_at: object, delay: object) -> int:
        """:func:`deliver_at_ms` with its common case (epoch ms as an int) inline: this runs
        once per delayed send, and a call less is a tenth of a delayed send's cost."""
        if type(deliver_at) is int and delay is None and -(10**15) < deliver_at < 10**15:
            if deliver_at > int(self._clock() * 1000):
                return deliver_at
            if deliver_at < 10**9:  # long past, and not epoch seconds by mistake (that warns)
                return 0
        return deliver_at_ms(self._clock, deliver_at, delay)

    def _check_room(self, size: int) -> None:
        """Refuse a message that could never fit in ``buffer_bytes_max``."""
        if size > self.buffer_bytes_max:
            raise MessageTooLargeError(
                f"a message of {size} bytes does not fit in the producer's buffer_bytes_max={self.buffer_bytes_max}"
            )

    def _judge(self, b: Batch, exc: BaseException, now_ms: float) -> Verdict:
        """The core's verdict on ``b``'s failed attempt. A broker out of reach also makes the
        queue's metadata stale: the next send asks for it again, and unkeyed messages leave
        the partitions it finds offline (:meth:`Partitioner.sticky`), and meanwhile the
        others (:meth:`Partitioner.avoid`)."""
        if isinstance(exc, UnavailableError):
            queue = b.part.queue
            got = self._metadata.entries.get(queue)
            if got is not None:
                self._partitioner.avoid(queue, b.part.partition, got[1].partitions)
            self._metadata.expire(queue)
        return self._core.judge(b, exc, now_ms)

    def _give_up(self, b: Batch, exc: BaseException) -> None:
        """``b`` fails for good with ``exc``: the core's bookkeeping (a new epoch, or its
        sequences given back), and the queue's metadata forgotten if ``exc`` says it changed."""
        self._core.fail(b, exc)
        if isinstance(exc, (QueueNotFoundError, PartitionOutOfRangeError)):
            self._metadata.forget(b.part.queue)

    def _split(self, info: QueueInfo, messages: Sequence[Message | bytes], partition: int | None) -> Groups:
        """The indexes of a ``send_batch``'s messages per partition (None: the sticky one)."""
        if partition is not None:
            return {partition: range(len(messages))}
        part = self._partitioner
        if part.sticky_batch(messages):
            return {None: range(len(messages))}
        groups: dict[int | None, list[int]] = {}
        n = len(info.partitions)
        for i, m in enumerate(messages):
            groups.setdefault(part.for_message(m, n), []).append(i)  # raises for a "key" without a key
        return groups  # type: ignore[return-value]  # lists are Sequences: dict is invariant


def check_batch_arg(messages: object) -> None:
    """Refuse a ``send_batch`` argument that is not a non-empty list of messages."""
    if isinstance(messages, (bytes, Message)):
        raise InvalidArgumentError("send_batch takes a list of messages; use send() for one")
    if len(messages) == 0:  # type: ignore[arg-type]  # a Sequence by contract; checked just below
        raise InvalidArgumentError("send_batch needs at least one message")


def receipt(count: int, groups: Groups, results: list[ProduceResult]) -> Sequence[MessageId]:
    """The ids of a ``send_batch`` of ``count`` messages, in their order, from each group's result."""
    if len(groups) == 1:
        return BatchReceipt(results[0])
    ids: list[MessageId | None] = [None] * count
    for idxs, result in zip(groups.values(), results):
        for i, mid in zip(idxs, BatchReceipt(result)):
            ids[i] = mid
    return ids  # type: ignore[return-value]  # every index is in one group


def as_message(body: object, key: object, tag: object, properties: object) -> Message | bytes:
    """A send's arguments as one message: plain bytes when there is nothing but a body."""
    if isinstance(body, Message):
        if key is not None or tag is not None or properties is not None:
            raise InvalidArgumentError("pass key, tag and properties inside the Message, not beside it")
        return body
    if isinstance(body, (bytearray, memoryview)):
        body = bytes(body)
    if type(body) is bytes and key is None and tag is None and not properties:
        return body
    if type(body) is bytes:
        return Message(body, key, tag, properties or None)  # type: ignore[arg-type]  # checked by check_message first
    return body  # type: ignore[return-value]  # check_message names the problem


def no_partition(queue: str, partitions: int, partition: int) -> PartitionOutOfRangeError:
    """The error of a send to a partition the queue does not have."""
    return PartitionOutOfRangeError(
        f"queue {queue!r} has partitions 0..{partitions - 1}; there is no partition {partition}"
    )


def deliver_at_ms(clock: Callable[[], float], deliver_at: object, delay: object) -> int:
    """The batch's deliver_at_ms for a send's ``deliver_at``/``delay`` (0: at once).

    >>> deliver_at_ms(lambda: 1000.0, None, 2.5), deliver_at_ms(lambda: 1000.0, 999_000, None)
    (1002500, 0)
    """
    if deliver_at is None and delay is None:
        return 0
    now_ms = int(clock() * 1000)
    if type(deliver_at) is int and delay is None and -(10**15) < deliver_at < 10**15:  # the common case
        if deliver_at > now_ms or deliver_at < 10**9:  # (past and epoch seconds by mistake: warned below)
            return deliver_at if deliver_at > now_ms else 0
    return resolve_deliver_at(deliver_at, delay, now_ms=now_ms)
