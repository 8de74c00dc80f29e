"""AsyncProducer: the :class:`~headwater.client.producer.Producer` for asyncio.

The same batching, routing and idempotence, on the event loop instead of a sender thread:

- ``send_nowait()`` checks a message, picks its partition and appends it to that
  partition's *open batch*, then returns an ``asyncio.Future`` of its id (the async
  analogue of the sync ``send()``; like that one's, the future cannot be cancelled: the
  message is not taken back, and the future keeps its id). A partition's open batch is
  sent when it reaches ``batch_bytes_max``, when ``linger_ms`` has passed since its first
  message, or, with ``linger_ms=0``, as soon as the partition has no batch in flight
  (messages arriving meanwhile form the next batch). When the queue's metadata is not cached, the message
  waits for it (in send order) and errors that need the metadata go to the future; a
  cached copy past ``metadata_max_age_ms`` is used while a task refreshes it.
- ``await send()`` and ``await send_batch()`` do the same without lingering and return once
  the broker acknowledged. Cancelling the caller does not take the messages back.
- One *drainer* task per partition sends its batches, holding the partition's slot (an
  ``asyncio.Lock``). Over the network it pipelines up to ``max_in_flight`` batches (5 for
  an idempotent producer, as the sync producer does): it sends them in order and settles
  their answers in that order; after a failure to retry, the partition sends nothing new
  until what is in flight is settled, then sends the failed batches again one at a time, in
  order. Embedded (calls on threads keep no order) it sends one batch at a time.
- Idempotence as in the sync producer: a random 62-bit producer id and an epoch; each batch
  carries the sequence of its first message, counted per (queue, partition) and assigned
  when the batch is encoded, in the slot. A retriable error re-sends the same bytes after a
  backoff, so the broker recognises a retry and answers with the original offsets. When a
  batch fails for good after it may have reached the broker, the epoch is bumped; a batch
  refused as out of order (the broker lost earlier ones) is sent again under a new epoch.

Use from one event loop. Nothing here blocks; the pure helpers (message checks, the
partitioner, receipts) are shared with the sync producer
(:mod:`headwater.client.batching`, :mod:`headwater.client.partitioner`).
"""

from __future__ import annotations

import asyncio
import logging
import random
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from headwater.client.aio_service import AsyncBrokerService
from headwater.client.batching import (
    BatchReceipt,
    RetryPolicy,
    RetrySettings,
    check_compression,
    check_message,
    check_messages,
    closed_unsent,
    deliver_at_ms,
    give_back_sequence,
    int_setting,
    may_be_appended,
    new_identity,
    next_epoch,
    store_refreshed,
    take_sequence,
    too_large,
)
from headwater.client.partitioner import Partitioner, PartitionFn
from headwater.client.send_future import AsyncSendFuture
from headwater.errors import (
    ClosedError,
    InvalidArgumentError,
    MessageTooLargeError,
    OutOfOrderSequenceError,
    PartitionOutOfRangeError,
    QueueNotFoundError,
    UnavailableError,
)
from headwater.model.batch import BATCH_BYTES_MAX, encode_batch
from headwater.model.config import QueueInfo
from headwater.model.delay import DELAYED_PARTITION_BIT, joins_batch
from headwater.model.message import Message, MessageId
from headwater.model.producer_state import RECENT_BATCHES
from headwater.model.service import ProduceResult

__all__ = ["AsyncProducer"]

log = logging.getLogger("headwater.producer")

_NO_CAP = sys.maxsize  # checking types before the queue's message_bytes_max is known


class _Partition:
    """One (queue, partition): its open batch, sealed batches waiting, the slot and the
    drainer that holds it, the linger timer, and the idempotence sequence."""

    __slots__ = (
        "queue",
        "partition",
        "delayed",
        "open",
        "ready",
        "in_flight",
        "flying",
        "retry",
        "slot",
        "drainer",
        "timer",
        "identity",
        "next_sequence",
    )

    def __init__(self, queue: str, partition: int, delayed: bool = False) -> None:
        # delayed messages of a partition have a state of their own (see the sync producer)
        self.queue, self.partition, self.delayed = queue, partition, delayed
        self.open: _Batch | None = None
        self.ready: deque[_Batch] = deque()
        self.in_flight: list[_Batch] = []  # sent and not settled, in sending order (retries too)
        self.flying: deque[tuple[_Batch, asyncio.Future[ProduceResult]]] = deque()  # pipelined, answer awaited
        self.retry: list[tuple[_Batch, float]] = []  # failed while pipelined: (batch, backoff), in order
        self.slot = asyncio.Lock()  # held while batches are in flight
        self.drainer: asyncio.Task[None] | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.identity: tuple[int, int] | None = None  # (producer id, epoch) of next_sequence
        self.next_sequence = 0


class _Batch:
    """Messages bound for one partition and the futures waiting for them.

    ``entries`` are ``(index, count, future)``: ``count == 0`` is one message (its future
    gets a MessageId), ``count > 0`` a ``send_batch`` group (its future gets the
    ProduceResult of that range)."""

    __slots__ = (
        "part",
        "messages",
        "entries",
        "size_bytes",
        "buffered_bytes",
        "created_s",
        "urgent",
        "encoded",
        "identity",
        "base_sequence",
        "attempts",
        "done",
        "deliver_times",
    )

    def __init__(self, part: _Partition, created_s: float) -> None:
        self.part = part
        self.messages: list[Message | bytes] = []
        self.entries: list[tuple[int, int, asyncio.Future[Any]]] = []
        self.size_bytes = 0
        self.buffered_bytes = 0  # the part of size_bytes that counts against buffer_bytes_max
        self.created_s = created_s
        self.urgent = False  # someone awaits it: do not linger
        self.encoded: bytearray | None = None
        self.identity: tuple[int, int] | None = None
        self.base_sequence = -1
        self.attempts = 0
        self.done = False
        # delayed batches: each message's deliver time (rising, within PRODUCER_SPAN_MS)
        self.deliver_times: list[int] | None = None


class _Parked(NamedTuple):
    """A ``send_nowait`` message waiting for its queue's metadata."""

    msg: Message | bytes
    size: int
    partition: int | None
    fut: asyncio.Future[MessageId]
    deliver_at_ms: int = 0


class AsyncProducer(RetrySettings):
    """Sends messages to queues from asyncio code. One producer can serve a whole application.

    Get one from a client: ``hw.producer(...)``. ``await send()`` returns a message's id once
    it is stored; ``send_nowait()`` returns a future at once, for many messages in flight;
    ``await flush()`` waits for everything sent so far; ``await close()`` flushes and stops.

    Options are the sync :class:`~headwater.client.producer.Producer`'s: ``partitioner``,
    ``compression``, ``linger_ms``, ``batch_bytes_max``, ``retries``, ``retry_backoff_ms``,
    ``retry_backoff_max_ms``, ``delivery_timeout_ms``, ``idempotent``, ``buffer_bytes_max``
    (the bytes ``send_nowait`` messages may hold unacknowledged; past it ``send_nowait``
    raises :class:`UnavailableError` instead of blocking), ``metadata_max_age_ms``,
    ``max_in_flight``, ``rng`` and ``clock``. Every send takes ``deliver_at=`` or ``delay=`` for a delayed message, as
    the sync producer's do.
    """

    def __init__(
        self,
        service: AsyncBrokerService,
        *,
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
    ) -> None:
        check_compression(compression)
        if not isinstance(idempotent, bool):
            raise InvalidArgumentError(f"idempotent is True or False, got {idempotent!r}")
        self._rng = rng or random.Random()
        # turns delay= into a deliver time; an embedded broker's own (injected) clock by default
        self._clock = clock or getattr(getattr(service, "service", service), "clock", None) or time.time
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
        self._metadata_max_age_s = int_setting("metadata_max_age_ms", metadata_max_age_ms, 0, 86_400_000) / 1000
        self._linger_s = linger_ms / 1000
        self._identity = new_identity(idempotent)  # (producer id, epoch)
        self.max_in_flight = (
            (RECENT_BATCHES if idempotent else 1)
            if max_in_flight is None
            else int_setting("max_in_flight", max_in_flight, 1, RECENT_BATCHES)
        )
        # only a connection keeps the sending order (an embedded broker's calls run on threads)
        self._pipeline = self.max_in_flight if hasattr(service, "produce_nowait") else 1
        self._metadata: dict[str, tuple[float, QueueInfo]] = {}
        self._parts: dict[tuple[str, int], _Partition] = {}
        self._parked: dict[str, list[_Parked]] = {}  # by queue, in send order
        self._metadata_tasks: dict[str, asyncio.Task[None]] = {}
        self._refreshes: dict[str, asyncio.Task[None]] = {}  # background refreshes of stale metadata
        self._tasks: set[asyncio.Task[None]] = set()  # drainers and metadata tasks, for close()
        self._batch_done = asyncio.Event()  # set whenever a batch finishes (flush waits on it)
        self._buffered_bytes = 0
        self._flushing = 0
        self._closed = False
        self._aborting = False

    # -- public API -----------------------------------------------------------------------

    @property
    def producer_id(self) -> int | None:
        """The id batches carry (None unless idempotent); changes only after 32767 epochs."""
        return None if self._identity is None else self._identity[0]

    @property
    def producer_epoch(self) -> int | None:
        """The epoch batches carry; bumped when a batch fails after it may have been stored."""
        return None if self._identity is None else self._identity[1]

    @property
    def closed(self) -> bool:
        """True once close() began: sends are refused."""
        return self._closed

    def send_nowait(
        self,
        queue: str,
        body: bytes | Message,
        *,
        key: bytes | None = None,
        tag: str | None = None,
        properties: dict[str, str] | None = None,
        partition: int | None = None,
        deliver_at: datetime | int | None = None,
        delay: timedelta | float | None = None,
    ) -> asyncio.Future[MessageId]:
        """Queue one message; return a future of its id (call from the event loop).
        ``deliver_at``/``delay`` make it a delayed message (see ``Producer.send``).

        Wrong types raise here. When the queue's metadata is cached, so do a body over the
        queue's ``message_bytes_max``, a partition out of range and an unknown queue;
        otherwise those arrive through the future. Raises :class:`UnavailableError` when
        ``buffer_bytes_max`` bytes already wait (``await flush()`` or ``await send()`` then).

        The future cannot be cancelled, as the sync producer's: a queued message is not
        taken back, so ``cancel()`` returns False and the future still gets its id. A task
        awaiting it can be cancelled (or time out with ``asyncio.timeout``): that ends only
        its wait (see :class:`~headwater.client.send_future.AsyncSendFuture`).
        """
        self._check_open()
        msg = _as_message(body, key, tag, properties)
        size = check_message(msg, _NO_CAP)
        _check_partition_type(partition)
        at = self._deliver_at(deliver_at, delay)
        if self._buffered_bytes + size > self.buffer_bytes_max:
            if size > self.buffer_bytes_max:
                raise MessageTooLargeError(
                    f"a message of {size} bytes does not fit in the producer's buffer_bytes_max={self.buffer_bytes_max}"
                )
            raise UnavailableError(
                f"producer buffer full: {self._buffered_bytes} bytes wait for acknowledgement "
                f"(buffer_bytes_max={self.buffer_bytes_max}); await flush() or send() to wait for room"
            )
        fut: asyncio.Future[MessageId] = AsyncSendFuture(loop=asyncio.get_running_loop())
        info = self._cached_info(queue, partition)
        if info is None:
            self._park(queue, _Parked(msg, size, partition, fut, at))
        else:
            self._route(queue, info, msg, size, partition, fut, urgent=False, buffered=True, deliver_at_ms=at)
        self._buffered_bytes += size
        return fut

    async def send(
        self,
        queue: str,
        body: bytes | Message,
        *,
        key: bytes | None = None,
        tag: str | None = None,
        properties: dict[str, str] | None = None,
        partition: int | None = None,
        deliver_at: datetime | int | None = None,
        delay: timedelta | float | None = None,
    ) -> MessageId:
        """Send one message and return its id once it is stored (a delayed one: scheduled).
        It does not linger."""
        self._check_open()
        msg = _as_message(body, key, tag, properties)
        size = check_message(msg, _NO_CAP)
        at = self._deliver_at(deliver_at, delay)
        info = await self._info_for(queue, partition)
        self._check_open()
        fut: asyncio.Future[MessageId] = asyncio.get_running_loop().create_future()
        self._route(queue, info, msg, size, partition, fut, urgent=True, buffered=False, deliver_at_ms=at)
        return await asyncio.shield(fut)

    send_and_wait = send  # the sync producer's name for a send that waits

    async def send_batch(
        self,
        queue: str,
        messages: Sequence[Message | bytes],
        *,
        partition: int | None = None,
        deliver_at: datetime | int | None = None,
        delay: timedelta | float | None = None,
    ) -> Sequence[MessageId]:
        """Send messages as one batch per partition; return their ids in the given order.

        With ``partition`` every message goes there; otherwise the partitioner decides.
        Every message is checked before any is queued. When messages go to several
        partitions and one fails, the others may be stored.
        """
        if isinstance(messages, (bytes, Message)):
            raise InvalidArgumentError("send_batch takes a list of messages; use send() for one")
        if len(messages) == 0:
            raise InvalidArgumentError("send_batch needs at least one message")
        self._check_open()
        at = self._deliver_at(deliver_at, delay)
        info = await self._info_for(queue, partition)
        n = len(info.partitions)
        part = self._partitioner
        groups: dict[int | None, list[int]]
        if partition is not None:
            groups = {partition: list(range(len(messages)))}
        elif not callable(part.strategy) and not (
            part.per_message and any(isinstance(m, Message) and m.key is not None for m in messages)
        ):
            if part.strategy == "key":
                part.for_message(messages[0], n)  # raises: a key is required
            groups = {None: list(range(len(messages)))}
        else:
            groups = {}
            for i, m in enumerate(messages):
                groups.setdefault(part.for_message(m, n), []).append(i)
        cap = info.config.message_bytes_max
        msgs = {p: [messages[i] for i in idxs] for p, idxs in groups.items()}
        sizes = {p: check_messages(ms, cap) for p, ms in msgs.items()}  # all valid, or none sent
        self._check_open()
        loop = asyncio.get_running_loop()
        futs: dict[int | None, asyncio.Future[ProduceResult]] = {}
        for p, ms in msgs.items():
            ps = self._partition_state(queue, p if p is not None else part.sticky(queue, n), at)
            futs[p] = loop.create_future()
            self._enqueue(ps, ms, sizes[p], (len(ms), futs[p]), urgent=True, deliver_at_ms=at)
        results = await asyncio.shield(asyncio.gather(*futs.values()))
        if len(groups) == 1:
            return BatchReceipt(results[0])
        ids: list[MessageId | None] = [None] * len(messages)
        for idxs, result in zip(groups.values(), results):
            for i, mid in zip(idxs, BatchReceipt(result)):
                ids[i] = mid
        return ids  # type: ignore[return-value]

    async def flush(self, timeout_s: float | None = None) -> None:
        """Send what is queued now, without lingering, and wait until every message sent so
        far is acknowledged or has failed (see the futures for which).

        Raises :class:`UnavailableError` if that takes longer than ``timeout_s``.
        """
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        if self._metadata_tasks:  # messages waiting for metadata take their places first
            tasks = list(self._metadata_tasks.values())
            _, late = await asyncio.wait(tasks, timeout=_left(loop, deadline))
            if late:
                raise UnavailableError(f"flush: queue metadata still unknown after {timeout_s} s")
        pending = [b for ps in self._parts.values() for b in (*ps.in_flight, *ps.ready, ps.open) if b is not None]
        if not pending:
            return
        self._flushing += 1
        try:
            for ps in self._parts.values():
                if ps.open is not None or ps.ready:
                    self._kick(ps)
            for b in pending:
                while not b.done:
                    remaining = _left(loop, deadline)
                    if remaining is not None and remaining <= 0:
                        left = sum(not x.done for x in pending)
                        raise UnavailableError(f"flush: {left} batches still unacknowledged after {timeout_s} s")
                    self._batch_done.clear()
                    try:  # asyncio.timeout: wait_for may swallow a cancellation on Python 3.11
                        async with asyncio.timeout(remaining):
                            await self._batch_done.wait()
                    except TimeoutError:
                        pass
        finally:
            self._flushing -= 1

    async def close(self, timeout_s: float | None = None) -> None:
        """Flush, then stop. Later sends raise :class:`ClosedError`.

        If the flush takes longer than ``timeout_s``, messages not yet acknowledged fail with
        :class:`ClosedError` (one in flight may still have been stored). Every task of the
        producer has ended when this returns.
        """
        self._closed = True
        try:
            await self.flush(timeout_s)
        except UnavailableError:
            self._abort()
        for ps in self._parts.values():
            if ps.timer is not None:
                ps.timer.cancel()
                ps.timer = None
        for task in list(self._refreshes.values()):  # nobody needs them now
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def __aenter__(self) -> AsyncProducer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- metadata and routing -------------------------------------------------------------

    async def _queue_info(self, queue: str, *, refresh: bool = False) -> QueueInfo:
        """The queue's metadata: asked for, and awaited, when unknown or ``refresh``; a
        copy older than ``metadata_max_age_ms`` is still used while a refresh task asks for a
        fresh one (as in the sync producer)."""
        now = asyncio.get_running_loop().time()
        got = self._metadata.get(queue)
        if refresh or got is None:
            info = await self._service.describe_queue(queue)
            self._metadata[queue] = (now, info)
            return info
        self._refresh_if_stale(queue, got[0], now)
        return got[1]

    def _cached_info(self, queue: str, partition: int | None) -> QueueInfo | None:
        """The queue's metadata if ``send_nowait`` may route with it now; None if the message
        must wait (unknown, an explicit partition beyond it, or earlier messages of the
        queue still waiting)."""
        got = self._metadata.get(queue)
        if got is None or queue in self._parked:
            return None
        at, info = got
        self._refresh_if_stale(queue, at, asyncio.get_running_loop().time())
        if partition is not None and partition >= len(info.partitions):
            return None  # the queue may have grown: refresh before refusing
        return info

    def _refresh_if_stale(self, queue: str, at: float, now: float) -> None:
        if now - at > self._metadata_max_age_s and queue not in self._refreshes:
            task = asyncio.get_running_loop().create_task(
                self._refresh(queue, now), name=f"headwater-producer-refresh-{queue}"
            )
            self._refreshes[queue] = task
            self._track(task)

    async def _refresh(self, queue: str, asked_at: float) -> None:
        try:
            outcome: QueueInfo | BaseException = await self._service.describe_queue(queue)
        except Exception as e:  # noqa: BLE001 - kept by store_refreshed
            outcome = e
        finally:
            self._refreshes.pop(queue, None)
        store_refreshed(
            self._metadata,
            queue,
            asked_at,
            outcome,
            max_age_s=self._metadata_max_age_s,
            now=asyncio.get_running_loop().time(),
        )

    async def _info_for(self, queue: str, partition: int | None) -> QueueInfo:
        """Metadata for a waiting send, after earlier ``send_nowait`` messages took their places."""
        task = self._metadata_tasks.get(queue)
        if task is not None:
            await asyncio.wait([task])
        info = await self._queue_info(queue)
        _check_partition_type(partition)
        if partition is not None and not 0 <= partition < len(info.partitions):
            info = await self._queue_info(queue, refresh=True)  # it may have grown
            n = len(info.partitions)
            if not 0 <= partition < n:
                raise PartitionOutOfRangeError(
                    f"queue {queue!r} has partitions 0..{n - 1}; there is no partition {partition}"
                )
        return info

    def _park(self, queue: str, item: _Parked) -> None:
        self._parked.setdefault(queue, []).append(item)
        if queue not in self._metadata_tasks:
            task = asyncio.get_running_loop().create_task(
                self._route_parked(queue), name=f"headwater-producer-metadata-{queue}"
            )
            self._metadata_tasks[queue] = task
            self._track(task)

    async def _route_parked(self, queue: str) -> None:
        """Fetch the queue's metadata, then route the messages that waited for it, in order."""
        try:
            try:
                info: QueueInfo | None = await self._queue_info(queue, refresh=True)
                error: BaseException | None = None
            except Exception as e:  # noqa: BLE001 - it belongs to the waiting futures
                info, error = None, e
            for item in self._parked.pop(queue, []):
                failure = error
                if info is not None:
                    try:
                        self._route(
                            queue,
                            info,
                            item.msg,
                            item.size,
                            item.partition,
                            item.fut,
                            urgent=False,
                            buffered=True,
                            deliver_at_ms=item.deliver_at_ms,
                        )
                    except Exception as e:  # noqa: BLE001 - this message's own failure
                        failure = e
                if failure is not None:
                    self._buffered_bytes -= item.size
                    _fail(item.fut, failure)
        finally:
            self._metadata_tasks.pop(queue, None)

    def _route(
        self,
        queue: str,
        info: QueueInfo,
        msg: Message | bytes,
        size: int,
        partition: int | None,
        fut: asyncio.Future[MessageId],
        *,
        urgent: bool,
        buffered: bool,
        deliver_at_ms: int = 0,
    ) -> None:
        """Check the message against the queue and append it to its partition's open batch."""
        cap = info.config.message_bytes_max
        body_len = len(msg) if type(msg) is bytes else len(msg.body)  # type: ignore[union-attr,arg-type]
        if body_len > cap:
            raise too_large(body_len, cap)
        n = len(info.partitions)
        if partition is not None:
            if not 0 <= partition < n:
                raise PartitionOutOfRangeError(
                    f"queue {queue!r} has partitions 0..{n - 1}; there is no partition {partition}"
                )
            p = partition
        else:
            chosen = self._partitioner.for_message(msg, n)
            p = chosen if chosen is not None else self._partitioner.sticky(queue, n)
        ps = self._partition_state(queue, p, deliver_at_ms)
        self._enqueue(
            ps, msg, size, (0, fut), urgent=urgent, buffered=size if buffered else 0, deliver_at_ms=deliver_at_ms
        )

    def _partition_state(self, queue: str, partition: int, deliver_at_ms: int = 0) -> _Partition:
        key = (queue, partition | DELAYED_PARTITION_BIT) if deliver_at_ms else (queue, partition)
        ps = self._parts.get(key)
        if ps is None:
            ps = self._parts[key] = _Partition(queue, partition, bool(deliver_at_ms))
        return ps

    def _deliver_at(self, deliver_at: object, delay: object) -> int:
        return deliver_at_ms(self._clock, deliver_at, delay)

    # -- the accumulator ------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("the producer is closed")

    def _enqueue(
        self,
        ps: _Partition,
        msgs: Message | bytes | list[Message | bytes],
        size: int,
        entry: tuple[int, asyncio.Future[Any]],
        *,
        urgent: bool,
        buffered: int = 0,
        deliver_at_ms: int = 0,
    ) -> None:
        """Add one message (``entry[0] == 0``) or a ``send_batch`` group to the open batch of
        ``ps``; seal it when full; start the drainer when there is something to send."""
        b = ps.open
        if b is not None and (
            b.size_bytes + size > self.batch_bytes_max or not joins_batch(b.deliver_times, deliver_at_ms)
        ):
            self._seal(ps)  # would overflow, or an earlier deliver time: the newcomer starts the next batch
            b = None
        new = b is None
        if b is None:
            b = ps.open = _Batch(ps, asyncio.get_running_loop().time())
        count, fut = entry
        if deliver_at_ms:
            b.deliver_times = (b.deliver_times or []) + [deliver_at_ms] * (count or 1)
        b.entries.append((len(b.messages), count, fut))
        if count:
            b.messages.extend(msgs)  # type: ignore[arg-type]
        else:
            b.messages.append(msgs)  # type: ignore[arg-type]
        b.size_bytes += size
        b.buffered_bytes += buffered
        if urgent:
            b.urgent = True
        sealed = b.size_bytes >= self.batch_bytes_max
        if sealed:
            self._seal(ps)
        if new or sealed or urgent:
            self._kick(ps)

    def _seal(self, ps: _Partition) -> None:
        ps.ready.append(ps.open)  # type: ignore[arg-type]
        ps.open = None
        self._partitioner.batch_sent(ps.queue, ps.partition)

    def _kick(self, ps: _Partition) -> None:
        """Make sure the partition's drainer runs (it sends what is due, then ends); a
        pipelining drainer that is waiting for an answer sends what is due now, from here."""
        if ps.drainer is not None and ps.flying:
            self._pump(ps)
        elif ps.drainer is None:
            ps.drainer = asyncio.get_running_loop().create_task(
                self._drain(ps), name=f"headwater-producer-{ps.queue}-{ps.partition}"
            )
            self._track(ps.drainer)

    def _linger_ended(self, ps: _Partition) -> None:
        ps.timer = None
        self._kick(ps)

    def _track(self, task: asyncio.Task[None]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._task_ended)

    def _task_ended(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("a producer task failed", exc_info=task.exception())

    async def _drain(self, ps: _Partition) -> None:
        """Send the partition's due batches, holding the slot: one at a time, or pipelined."""
        try:
            async with ps.slot:
                if self._pipeline > 1:
                    await self._drain_pipelined(ps)
                    return
                while (b := self._take_due(ps)) is not None:
                    ps.in_flight.append(b)
                    try:
                        await self._deliver(b)
                    finally:
                        ps.in_flight.remove(b)
        finally:
            ps.drainer = None

    async def _drain_pipelined(self, ps: _Partition) -> None:
        """Up to ``max_in_flight`` batches in flight, sent in order and settled in that order,
        so a failure is seen before any answer to a batch sent after it. Then the partition
        recovers: nothing new leaves, the batches still in flight are settled, and those to
        retry are sent again one at a time, in their order."""
        flying, retry = ps.flying, ps.retry
        try:
            while True:
                self._pump(ps)
                if not flying:
                    if not retry:
                        return
                    for b, delay in retry:
                        await asyncio.sleep(delay)
                        await self._deliver(b)
                        ps.in_flight.remove(b)
                    retry.clear()
                    continue
                b, fut = flying[0]
                try:
                    result = await fut
                except asyncio.CancelledError:
                    raise
                except Exception as e:  # noqa: BLE001 - judged below: retry or settle
                    flying.popleft()
                    delay = self._retry_delay(b, e)
                    if delay is None:
                        ps.in_flight.remove(b)
                        self._finish(b, None, self._final_error(b, e))
                    else:
                        retry.append((b, delay))
                    continue
                flying.popleft()
                ps.in_flight.remove(b)
                self._finish(b, result, None)
        except asyncio.CancelledError:  # close() gave up waiting
            for b in ps.in_flight:
                if not b.done:
                    self._finish(b, None, ClosedError("the producer was closed before this batch was acknowledged"))
            ps.in_flight.clear()
            flying.clear()
            retry.clear()
            raise

    def _pump(self, ps: _Partition) -> None:
        """Send the partition's due batches while there is room in flight, in order."""
        flying = ps.flying
        while (
            not ps.retry
            and len(flying) < self._pipeline
            and (
                not flying or flying[-1][0].identity == self._identity  # an old epoch's go first
            )
        ):
            b = self._take_due(ps)
            if b is None:
                break
            fut = self._start(b)
            if fut is not None:
                ps.in_flight.append(b)
                flying.append((b, fut))

    def _start(self, b: _Batch) -> asyncio.Future[ProduceResult] | None:
        """Encode (first attempt) and send a batch without waiting; None if it was settled
        instead (the producer is closing, the batch waited too long, it does not encode)."""
        if b.encoded is None and not self._encode_first(b):
            return None
        b.attempts += 1
        return self._service.produce_nowait(b.part.queue, b.part.partition, b.encoded)  # type: ignore[attr-defined]

    def _take_due(self, ps: _Partition) -> _Batch | None:
        """The next batch to send now; None if there is none, or the open one still lingers
        (then a timer restarts the drainer when it is due)."""
        if ps.ready:
            return ps.ready.popleft()
        b = ps.open
        if b is None:
            return None
        if not (b.urgent or not self._linger_s or self._flushing or self._closed):
            loop = asyncio.get_running_loop()
            due = b.created_s + self._linger_s
            if due > loop.time():
                if ps.timer is None:
                    ps.timer = loop.call_at(due, self._linger_ended, ps)
                return None
        ps.open = None
        self._partitioner.batch_sent(ps.queue, ps.partition)
        return b

    async def _deliver(self, b: _Batch) -> None:
        """Encode (first attempt) and send a batch, retrying retriable errors; settle it."""
        ps = b.part
        try:
            if b.encoded is None and not self._encode_first(b):
                return
            while True:
                if b.encoded is None:  # refused as out of order: sent again under a new epoch
                    self._encode(b)
                b.attempts += 1
                try:
                    result = await self._service.produce(ps.queue, ps.partition, b.encoded)  # type: ignore[arg-type]
                except Exception as e:  # noqa: BLE001 - judged below: retry or settle
                    delay = self._retry_delay(b, e)
                    if delay is None:
                        self._finish(b, None, self._final_error(b, e))
                        return
                    await asyncio.sleep(delay)
                    continue
                self._finish(b, result, None)
                return
        except asyncio.CancelledError:  # close() gave up waiting
            if not b.done:
                self._finish(b, None, ClosedError("the producer was closed before this batch was acknowledged"))
            raise

    def _encode_first(self, b: _Batch) -> bool:
        """Encode a batch for its first attempt; False if it was settled instead (the
        producer is closing, the batch waited too long to be sent, it does not encode)."""
        refused = self._retry.refuse_first_send(b.created_s, asyncio.get_running_loop().time(), self._aborting)
        if refused is not None:
            self._finish(b, None, refused)
            return False
        try:
            self._encode(b)
        except Exception as e:  # noqa: BLE001 - it belongs to the batch's futures
            self._finish(b, None, e)
            return False
        return True

    def _encode(self, b: _Batch) -> None:
        """Encode in the slot: the batch's sequence follows what its partition acknowledged."""
        ident = self._identity
        pid, seq, epoch = take_sequence(b.part, ident, len(b.messages))
        # messages were checked against the queue's limit when queued
        b.encoded = encode_batch(
            b.messages,
            compression=self.compression,
            producer_id=pid,
            base_sequence=seq,
            producer_epoch=epoch,
            deliver_times=b.deliver_times,
        )
        b.identity, b.base_sequence = ident, seq

    def _retry_delay(self, b: _Batch, exc: BaseException) -> float | None:
        """Seconds to wait before sending ``b`` again, or None if ``exc`` is final."""
        if self._retry.gives_up(b.attempts, self._aborting):
            return None
        if isinstance(exc, OutOfOrderSequenceError) and b.identity is not None:
            # the broker stored nothing of it and lost (or forgot) our earlier batches, as a
            # crash under async flush can make it: send it again under a new epoch, from 0
            if b.identity == self._identity:
                self._bump_epoch()
            b.encoded = None
            return 0.0
        if not getattr(exc, "retriable", False):
            return None
        return self._retry.backoff_s(b.attempts, b.created_s, asyncio.get_running_loop().time())

    def _final_error(self, b: _Batch, exc: BaseException) -> BaseException:
        return self._retry.final_error(exc, b.attempts, self._aborting)

    def _finish(self, b: _Batch, result: ProduceResult | None, exc: BaseException | None) -> None:
        """Settle a batch: advance or reset the sequence, free its buffer room, resolve its futures."""
        ps = b.part
        if result is not None:
            qid, part, base = result.queue_id, result.partition, result.base_offset
            for index, count, fut in b.entries:
                if not fut.done():  # settled once, whatever happens
                    fut.set_result(
                        ProduceResult(qid, part, base + index, count, result.timestamp_ms)
                        if count
                        else MessageId(qid, part, base + index)
                    )
        else:
            assert exc is not None
            if b.attempts and b.identity is not None and b.identity == self._identity and may_be_appended(exc):
                self._bump_epoch()
            else:  # not stored: give its sequence back, if nothing took the next one
                give_back_sequence(ps, b.identity, b.base_sequence, len(b.messages))
            if isinstance(exc, (QueueNotFoundError, PartitionOutOfRangeError)):
                self._metadata.pop(ps.queue, None)
            for _, _, fut in b.entries:
                _fail(fut, exc)
        self._buffered_bytes -= b.buffered_bytes
        b.buffered_bytes = 0
        b.done = True
        self._batch_done.set()

    def _bump_epoch(self) -> None:
        self._identity = next_epoch(self._identity)  # type: ignore[arg-type]

    def _abort(self) -> None:
        """close() gave up on the flush: fail what is unsent, stop what is in flight."""
        self._aborting = True
        closed = closed_unsent()
        for queue in list(self._parked):
            for item in self._parked.pop(queue):
                self._buffered_bytes -= item.size
                _fail(item.fut, closed)
        for ps in self._parts.values():
            for b in (*ps.ready, ps.open):
                if b is not None:
                    self._finish(b, None, closed)
            ps.ready.clear()
            ps.open = None
        for task in self._tasks:
            task.cancel()


def _as_message(body: object, key: object, tag: object, properties: object) -> Message | bytes:
    if isinstance(body, Message):
        if key is not None or tag is not None or properties is not None:
            raise InvalidArgumentError("pass key, tag and properties inside the Message, not beside it")
        return body
    if isinstance(body, (bytearray, memoryview)):
        body = bytes(body)
    if type(body) is bytes and key is None and tag is None and not properties:
        return body
    if type(body) is bytes:
        return Message(body, key, tag, properties or None)  # type: ignore[arg-type]
    return body  # type: ignore[return-value]  # check_message names the problem


def _check_partition_type(partition: object) -> None:
    if partition is not None and (isinstance(partition, bool) or not isinstance(partition, int)):
        raise InvalidArgumentError(f"a partition is an int, got {type(partition).__name__}")
    if isinstance(partition, int) and partition < 0:
        raise PartitionOutOfRangeError(f"there is no partition {partition}: partitions count from 0")


def _fail(fut: asyncio.Future[Any], exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)


def _left(loop: asyncio.AbstractEventLoop, deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - loop.time())
