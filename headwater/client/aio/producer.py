"""AsyncProducer: the :class:`~headwater.client.sync.producer.Producer` for asyncio.

The same batching, routing and idempotence, on the event loop instead of a sender thread:

- ``send_nowait()`` checks a message, picks its partition and appends it to that
  partition's *open batch*, then returns an ``asyncio.Future`` of its id (the async
  analogue of the sync ``send()``; like that one's, the future cannot be cancelled: the
  message is not taken back, and the future keeps its id). A partition's open batch is
  sent when it reaches ``batch_bytes_max``, when ``linger_ms`` has passed since its first
  message, or, with ``linger_ms=0``, at the end of the loop's turn while the partition has
  room in flight (messages arriving meanwhile form the next batch). When the queue's
  metadata is not cached, the message waits for it (in send order) and errors that need
  the metadata go to the future; a cached copy past ``metadata_max_age_ms`` is used while
  a task refreshes it.
- ``await send()`` and ``await send_batch()`` do the same without lingering and return once
  the broker acknowledged. Cancelling the caller does not take the messages back.
- What leaves when, and what follows each answer, is the core's, as in the sync producer
  (:mod:`headwater.client.core.producer` says its rules; idempotence and retries follow
  the table in :mod:`headwater.client.core.outcomes`). What is due leaves from a callback
  scheduled once per turn of the event loop (so the messages sent in one turn form one
  batch), from a timer when a linger or a retry backoff ends, and from where the answer
  that frees a partition's slot is taken: over the network, where up to ``max_in_flight``
  batches of a partition are in flight, the batch's sink (:class:`_Answer`, handed to the
  service's ``produce_into``) as the transport reads the answer; embedded, where calls on
  threads keep no order and one batch at a time goes, the task that awaited it. There is
  no task per partition.

Use from one event loop. Nothing here blocks; what does no I/O is shared with the sync
producer (:mod:`headwater.client.core`, :mod:`headwater.client.core.batching`,
:mod:`headwater.client.core.partitioner`).
"""

from __future__ import annotations

import asyncio
import logging
import sys
from array import array
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from headwater.client.aio.service import AsyncBrokerService, ThreadedService
from headwater.client.common.producer import Groups, Messages, ProducerBase
from headwater.client.common.twins import ASYNCIO
from headwater.client.core.batching import as_message, check_message, check_messages, no_partition, too_large
from headwater.client.core.outcomes import check_timeout_s, closed_unsent
from headwater.client.core.producer import Batch, PartitionState, moved_to
from headwater.client.transport.send_future import AsyncSendFuture
from headwater.errors import ClosedError, InvalidArgumentError, PartitionOutOfRangeError, UnavailableError
from headwater.model.config import QueueInfo
from headwater.model.message import Message, MessageId
from headwater.model.service import HasClock, ProduceResult, ProducesInto

__all__ = ["AsyncProducer"]

log = logging.getLogger("headwater.producer")

_new_tuple = tuple.__new__  # a namedtuple from a tuple, without its Python-level call
_NO_CAP = sys.maxsize  # checking types before the queue's message_bytes_max is known


class _Batch(Batch):
    """A core batch with the futures waiting for it: ``futures``, one per message sent alone
    (each gets a MessageId), in send order, each for the message at the same place of
    ``future_at`` (an array of ints, not a tuple per message: a waiting message costs the
    garbage collector its future only); ``entries``, ``(index, count, future)`` of the
    ``send_batch`` groups (each gets the ProduceResult of its range)."""

    __slots__ = ("entries", "futures", "future_at")

    def __init__(self, part: PartitionState, created_ms: float) -> None:
        super().__init__(part, created_ms)
        self.entries: list[tuple[int, int, asyncio.Future[Any]]] = []
        self.futures: list[asyncio.Future[Any]] = []
        self.future_at = array("q")

    def reordered(self, order: list[int]) -> None:
        """The core put the messages in due order (a delayed batch): move the futures along."""
        at = moved_to(order)
        self.future_at = array("q", map(at.__getitem__, self.future_at))
        if self.entries:
            self.entries = [(at[i], n, f) for i, n, f in self.entries]


class _Answer:
    """Where the transport puts the answer to one batch's request (a
    :class:`~headwater.client.transport.async_transport.Sink`): straight to the producer, on
    the event loop, as the answer is read. A future would take a done-callback and a turn of
    the loop more per batch (about 10 Python calls: ``call_soon``, a ``Handle``, the future).

    Until ``armed`` (once the request is submitted) an outcome is only kept: a request the
    transport fails inside ``submit`` is judged on the next turn of the loop, as a failed
    future's callback was, not in the middle of the dispatch that sent it."""

    __slots__ = ("_producer", "_batch", "_outcome", "_callbacks", "armed")

    def __init__(self, producer: AsyncProducer, b: _Batch) -> None:
        self._producer = producer
        self._batch = b
        self._outcome: tuple[ProduceResult | None, BaseException | None] | None = None
        self._callbacks: list[Callable[[Any], object]] = []
        self.armed = False

    def done(self) -> bool:
        return self._outcome is not None

    def cancelled(self) -> bool:
        return False

    def exception(self) -> BaseException | None:
        if self._outcome is None:
            raise asyncio.InvalidStateError("no answer yet")
        return self._outcome[1]

    def set_result(self, result: ProduceResult) -> None:
        if self._outcome is not None or self._callbacks:  # (the rare cases: the general way)
            self._settle(result, None)
            return
        self._outcome = (result, None)
        if self.armed:  # once per batch: _settle and AsyncProducer._answered, inline
            b = self._batch
            if not b.done:  # else close() gave up on it
                try:  # the transport's reader calls this: what goes wrong here is the producer's
                    self._producer._finish(b, result, None)
                except Exception:
                    log.exception("the asyncio producer failed to take a batch's answer")

    def set_exception(self, exception: BaseException) -> None:
        self._settle(None, exception)

    def add_done_callback(self, fn: Callable[[Any], object]) -> None:
        if self._outcome is not None:
            asyncio.get_running_loop().call_soon(fn, self)
        else:
            self._callbacks.append(fn)

    def _settle(self, result: ProduceResult | None, exc: BaseException | None) -> None:
        if self._outcome is not None:
            raise asyncio.InvalidStateError("the batch was answered already")  # the transport ignores it
        self._outcome = (result, exc)
        if self.armed:
            try:  # the transport's reader calls this: what goes wrong here is the producer's
                self._producer._on_outcome(self._batch, result, exc)
            except Exception:
                log.exception("the asyncio producer failed to take a batch's answer")
        for fn in self._callbacks:
            asyncio.get_running_loop().call_soon(fn, self)

    def taken_early(self) -> None:
        """``submit`` settled it already (on the next turn, the producer judges it)."""
        assert self._outcome is not None
        self._producer._on_outcome(self._batch, *self._outcome)


class _Send(NamedTuple):
    """A message waiting for its queue's metadata: :meth:`AsyncProducer._route`'s arguments
    (``urgent``: an ``await send()``'s, neither lingering nor counted in the buffer)."""

    msg: Message | bytes
    size: int
    partition: int | None
    fut: asyncio.Future[MessageId]
    deliver_at_ms: int
    urgent: bool = False


class AsyncProducer(ProducerBase, driver=ASYNCIO):
    """Sends messages to queues from asyncio code. One producer can serve a whole application.

    Get one from a client: ``hw.producer(...)``. ``await send()`` returns a message's id once
    it is stored; ``send_nowait()`` returns a future at once, for many messages in flight;
    ``await flush()`` waits for everything sent so far; ``await close()`` flushes and stops.

    ``await send_batch()`` and ``await send_identified()`` are
    :class:`~headwater.client.common.producer.ProducerBase`'s. Options are
    :class:`~headwater.client.core.batching.ProducerBase`'s; past ``buffer_bytes_max``
    ``send_nowait`` raises :class:`UnavailableError` instead of blocking. Every send takes
    ``deliver_at=`` or ``delay=`` for a delayed message, as the sync producer's do.
    """

    def __init__(
        self, service: AsyncBrokerService, *, clock: Callable[[], float] | None = None, **settings: Any
    ) -> None:
        self._pipelined = isinstance(service, ProducesInto)  # an asyncio service's: a connection
        super().__init__(
            service,
            new_batch=_Batch,
            # only a connection keeps the sending order (an embedded broker's calls run on threads)
            pipelined=self._pipelined,
            # an embedded broker's own (injected) clock by default
            clock=clock or _clock_of(service),
            **settings,
        )
        self._service: AsyncBrokerService = service
        self._pump_soon: asyncio.Handle | None = None  # _pump, scheduled for this turn of the loop
        self._timer: asyncio.TimerHandle | None = None  # _pump, when a linger or a backoff ends
        self._timer_at_ms: float | None = None
        self._parked: dict[str, list[_Send]] = {}  # waiting for their queue's metadata, in send order
        self._metadata_tasks: dict[str, asyncio.Task[None]] = {}
        self._refreshes: dict[str, asyncio.Task[None]] = {}  # background refreshes of stale metadata
        self._tasks: set[asyncio.Task[Any]] = set()  # metadata tasks and embedded sends, for close()
        self._batch_done = asyncio.Event()  # set whenever a batch finishes (flush waits on it)

    # -- public API -----------------------------------------------------------------------

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
        its wait (see :class:`~headwater.client.transport.send_future.AsyncSendFuture`).
        """
        if self._closed:  # checked here, not by a call: this runs once per message
            self._check_open()
        msg = as_message(body, key, tag, properties)
        size = check_message(msg, _NO_CAP)
        if partition is not None:
            _check_partition_type(partition)
        at = 0 if deliver_at is None and delay is None else self._deliver_at(deliver_at, delay)
        if self._buffered_bytes + size > self.buffer_bytes_max:
            self._check_room(size)
            raise UnavailableError(
                f"producer buffer full: {self._buffered_bytes} bytes wait for acknowledgement "
                f"(buffer_bytes_max={self.buffer_bytes_max}); await flush() or send() to wait for room"
            )
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[MessageId] = AsyncSendFuture(loop=loop)
        now_ms = loop.time() * 1000
        info = self._cached_info(queue, partition, now_ms)
        if info is None:
            self._park(queue, _Send(msg, size, partition, fut, at))
        else:
            self._route(queue, info, msg, size, partition, fut, at, urgent=False, now_ms=now_ms)
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
        It does not linger. Cancelling the caller ends its wait, not the send."""
        self._check_open()
        msg = as_message(body, key, tag, properties)
        size = check_message(msg, _NO_CAP)
        if partition is not None:
            _check_partition_type(partition)
        at = self._deliver_at(deliver_at, delay)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[MessageId] = loop.create_future()
        now_ms = loop.time() * 1000
        info = self._cached_info(queue, partition, now_ms)
        if info is None:  # routed by the metadata task, also if this wait is cancelled meanwhile
            self._park(queue, _Send(msg, size, partition, fut, at, urgent=True))
        else:
            self._route(queue, info, msg, size, partition, fut, at, urgent=True, now_ms=now_ms)
        # fut is this call's own, so no shield (a turn of the loop less): a cancelled wait
        # cancels only it, which _finish then leaves alone; the message is sent all the same
        return await fut

    send_and_wait = send  # the sync producer's name for a send that waits

    async def flush(self, timeout_s: float | None = None) -> None:
        """Send what is queued now, without lingering, and wait until every message sent so
        far is acknowledged or has failed (see the futures for which).

        Raises :class:`UnavailableError` if that takes longer than ``timeout_s``.
        """
        check_timeout_s(timeout_s, "flush()")
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        if self._metadata_tasks:  # messages waiting for metadata take their places first
            tasks = list(self._metadata_tasks.values())
            _, late = await asyncio.wait(tasks, timeout=_left(loop, deadline))
            if late:
                raise UnavailableError(f"flush: queue metadata still unknown after {timeout_s} s")
        pending = self._core.pending()
        if not pending:
            return
        self._flushing += 1
        try:
            self._pump()  # what lingers leaves now
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
        check_timeout_s(timeout_s, "close()")
        self._closed = True
        try:
            await self.flush(timeout_s)
        except UnavailableError:
            self._abort()
        for handle in (self._timer, self._pump_soon):
            if handle is not None:
                handle.cancel()
        self._timer = self._pump_soon = None
        for task in list(self._refreshes.values()):  # nobody needs them now
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def __aenter__(self) -> AsyncProducer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- metadata and routing -------------------------------------------------------------

    async def _queue_info(self, queue: str, *, refresh: bool = False) -> QueueInfo:
        """The queue's metadata: asked for, and awaited, when unknown or ``refresh``; a stale
        copy is still used while a refresh task asks for a fresh one (as in the sync producer)."""
        now_ms = self._now_ms()
        info, stale = self._metadata.lookup(queue, now_ms)
        if refresh or info is None:
            info = await self._service.describe_queue(queue)
            self._metadata.put(queue, info, now_ms)
        elif stale:
            self._refresh(queue, now_ms)
        return info

    def _cached_info(self, queue: str, partition: int | None, now_ms: float) -> QueueInfo | None:
        """The queue's metadata if ``send_nowait`` may route with it now; None if the message
        must wait (unknown, an explicit partition beyond it, or earlier messages of the
        queue still waiting)."""
        got = self._metadata.entries.get(queue)
        if got is None or queue in self._parked:
            return None
        at_ms, info = got
        if now_ms - at_ms > self._metadata.max_age_ms:
            self._refresh(queue, now_ms)
        if partition is not None and partition >= len(info.partitions):
            return None  # the queue may have grown: refresh before refusing
        return info

    def _refresh(self, queue: str, asked_at_ms: float) -> None:
        """Ask for a stale copy's replacement in a task, unless one does already."""
        if not self._metadata.start_refresh(queue):
            return

        async def refresh() -> None:
            try:
                outcome: QueueInfo | BaseException = await self._service.describe_queue(queue)
            except Exception as e:  # noqa: BLE001 - kept by the cache
                outcome = e
            finally:
                self._refreshes.pop(queue, None)
            self._metadata.refreshed(queue, asked_at_ms, outcome, self._now_ms())

        task = asyncio.get_running_loop().create_task(refresh(), name=f"headwater-producer-refresh-{queue}")
        self._refreshes[queue] = task
        self._track(task)

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
                raise no_partition(queue, n, partition)
        return info

    # -- what the shared bodies yield (common.producer): awaitables ---------------------------

    def _before_sending(self, what: str) -> None:
        self._check_open()  # one event loop and no sender thread: nowhere it may not wait

    async def _open_info(self, queue: str) -> QueueInfo:
        self._check_open()
        info = await self._queue_info(queue)
        self._check_open()
        return info

    async def _send_groups_of(
        self, queue: str, info: QueueInfo, messages: Messages, groups: Groups, deliver_at_ms: int
    ) -> list[ProduceResult]:
        cap = info.config.message_bytes_max
        msgs = {p: [messages[i] for i in idxs] for p, idxs in groups.items()}
        sizes = {p: check_messages(ms, cap) for p, ms in msgs.items()}  # all valid, or none sent
        self._check_open()
        loop = asyncio.get_running_loop()
        futs: list[asyncio.Future[ProduceResult]] = []
        for p, ms in msgs.items():
            ps = self._core.partition(
                queue, p if p is not None else self._partitioner.sticky(queue, info.partitions), deliver_at_ms
            )
            futs.append(loop.create_future())
            b, opened, index = self._core.append_group(ps, ms, sizes[p], self._now_ms(), deliver_at_ms)
            b.entries.append((index, len(ms), futs[-1]))
            self._due(ps, b, opened, urgent=True)
        if len(futs) == 1:  # neither gather nor shield, as in send(): two turns of the loop less
            return [await futs[0]]
        return await asyncio.shield(asyncio.gather(*futs))

    def _fly(self, b: _Batch) -> Awaitable[ProduceResult]:
        fut: asyncio.Future[ProduceResult] = asyncio.get_running_loop().create_future()
        b.entries.append((0, len(b.messages), fut))
        self._core.fly(b)
        self._dispatch(b)
        return asyncio.shield(fut)

    def _park(self, queue: str, item: _Send) -> None:
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
                        self._route(queue, info, *item[:-1], urgent=item.urgent)
                    except Exception as e:  # noqa: BLE001 - this message's own failure
                        failure = e
                if failure is not None:
                    if not item.urgent:
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
        deliver_at_ms: int,
        *,
        urgent: bool,
        now_ms: float | None = None,
    ) -> None:
        """Check a message against the queue and append it to its partition's open batch;
        ``urgent``: its sender waits for it, so it neither lingers nor counts against the
        buffer."""
        cap, n = info.config.message_bytes_max, len(info.partitions)
        body_len = len(msg) if type(msg) is bytes else len(msg.body)  # type: ignore[union-attr,arg-type]  # not bytes: a Message
        if body_len > cap:
            raise too_large(body_len, cap)
        p = partition
        if p is None:
            p = self._partitioner.for_message(msg, n)
            if p is None:
                p = self._partitioner.sticky(queue, info.partitions)
        elif not 0 <= p < n:
            raise no_partition(queue, n, p)
        ps = self._core.partition(queue, p, deliver_at_ms)
        now_ms = self._now_ms() if now_ms is None else now_ms
        b, opened = self._core.append(ps, msg, size, now_ms, deliver_at_ms, urgent, not urgent)
        b.futures.append(fut)
        b.future_at.append(len(b.messages) - 1)
        self._due(ps, b, opened, urgent)

    # -- the accumulator (the core's) and sending ---------------------------------------------

    def _now_ms(self) -> float:
        return asyncio.get_running_loop().time() * 1000

    def _hurry(self) -> bool:
        """Whether open batches leave now rather than when their linger ends."""
        return bool(not self.linger_ms or self._flushing or self._closed)

    def _due(self, ps: PartitionState, b: Batch, opened: bool, urgent: bool) -> None:
        """Messages joined ``b``, the open batch of ``ps`` (``opened``: a new one): when it
        is due, or has a linger to time, have the pump see to it in this turn of the loop."""
        if (opened or urgent or not ps.holds_open(b)) and self._core.mark_sendable(ps):
            self._schedule_pump()

    def _schedule_pump(self) -> None:
        if self._pump_soon is None:
            self._pump_soon = asyncio.get_running_loop().call_soon(self._scheduled_pump)

    def _scheduled_pump(self) -> None:
        self._pump_soon = None  # running now: nothing to cancel
        self._pump()

    def _pump(self) -> None:
        """Send every batch due now; set the timer for the next one due."""
        if self._pump_soon is not None:  # called directly (a flush): the scheduled call is not needed
            self._pump_soon.cancel()
            self._pump_soon = None
        batches, wake_at_ms = self._core.collect(self._now_ms(), self._hurry())
        for b in batches:
            self._dispatch(b)  # type: ignore[arg-type]  # the core made it with _Batch
        if wake_at_ms != self._timer_at_ms or self._timer is None:
            if self._timer is not None:
                self._timer.cancel()
            self._timer = self._timer_at_ms = None
            if wake_at_ms is not None:
                self._timer = asyncio.get_running_loop().call_at(wake_at_ms / 1000, self._on_timer)
                self._timer_at_ms = wake_at_ms

    def _on_timer(self) -> None:
        self._timer = self._timer_at_ms = None
        self._pump()

    def _dispatch(self, b: _Batch) -> None:
        """Encode (unless a retry of the same bytes) and send a batch the core put in flight,
        without waiting: the answer's callback settles it."""
        ps = b.part
        refused = self._encode_for_send(b)
        if refused is not None:
            self._finish(b, None, refused)
            return
        if not self._pipelined:
            task = asyncio.get_running_loop().create_task(self._produce_in_thread(b))
            self._track(task)
            return
        answer = _Answer(self, b)
        try:
            self._service.produce_into(ps.queue, ps.partition, b.encoded, answer)  # type: ignore[attr-defined]  # pipelined: the service ProducesInto
        except Exception as e:  # noqa: BLE001 - a closed service: judged like a failed request
            self._answered(b, None, e)
            return
        if answer._outcome is not None:  # failed inside submit: judged on the next turn, as before
            asyncio.get_running_loop().call_soon(answer.taken_early)
        else:
            answer.armed = True

    async def _produce_in_thread(self, b: _Batch) -> None:
        """Send a batch to the embedded broker (its calls run on threads) and judge the answer
        in this task, not in a done-callback: a turn of the loop less per batch."""
        ps = b.part
        try:
            result = await self._service.produce(ps.queue, ps.partition, b.encoded)  # type: ignore[arg-type]  # encoded before it is sent
        except asyncio.CancelledError:
            if not b.done:  # else close() gave up on it already
                self._finish(b, None, ClosedError("the producer was closed before this batch was acknowledged"))
            raise
        except Exception as e:  # noqa: BLE001 - the batch's error, judged by the core
            if not b.done:
                self._answered(b, None, e)
            return
        if not b.done:
            self._answered(b, result, None)

    def _on_outcome(self, b: _Batch, result: ProduceResult | None, exc: BaseException | None) -> None:
        """A batch's answer, from its :class:`_Answer`."""
        if not b.done:  # else close() gave up on it
            self._answered(b, result, exc)

    def _answered(self, b: _Batch, result: ProduceResult | None, exc: BaseException | None) -> None:
        """Settle a batch's attempt, or put it to be sent again, as the core's table says."""
        if exc is None:
            self._finish(b, result, None)
            return
        now_ms = self._now_ms()
        verdict = self._judge(b, exc, now_ms)
        if verdict.error is not None:
            self._finish(b, None, verdict.error)
            return
        self._core.retry_later(b, verdict.delay_ms, now_ms)
        self._schedule_pump()

    def _track(self, task: asyncio.Task[Any]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._task_ended)

    def _task_ended(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("a producer task failed", exc_info=task.exception())

    def _finish(self, b: _Batch, result: ProduceResult | None, exc: BaseException | None) -> None:
        """Settle a batch: resolve its futures, free its buffer room, advance or reset the
        sequences; then send what waited for its slot."""
        core = self._core
        if result is not None:
            qid, part, base = result.queue_id, result.partition, result.base_offset
            for index, fut in zip(b.future_at, b.futures):
                if not fut.done():  # settled once, whatever happens
                    fut.set_result(_new_tuple(MessageId, (qid, part, base + index)))  # MessageId(...), without a call
            for index, count, fut in b.entries:
                if not fut.done():
                    fut.set_result(ProduceResult(qid, part, base + index, count, result.timestamp_ms))
        else:
            assert exc is not None
            self._give_up(b, exc)
            for fut in b.futures:
                _fail(fut, exc)
            for _, _, fut in b.entries:
                _fail(fut, exc)
        self._buffered_bytes -= b.buffered_bytes
        b.buffered_bytes = 0
        b.done = True
        if self._flushing:  # only a flush waits on it (and clears it before it waits)
            self._batch_done.set()
        batches, wake = core.finish(b, self._now_ms, self._hurry)
        for nb in batches:
            self._dispatch(nb)  # type: ignore[arg-type]  # the core made it with _Batch
        if wake:
            self._schedule_pump()

    def _abort(self) -> None:
        """close() gave up on the flush: fail what is unsent, and what is in flight."""
        unsent, waiting = self._core.abort()
        closed = closed_unsent()
        for queue in list(self._parked):
            for item in self._parked.pop(queue):
                self._buffered_bytes -= item.size
                _fail(item.fut, closed)
        for b in unsent:
            self._finish(b, None, closed)  # type: ignore[arg-type]  # the core made it with _Batch
        gone = ClosedError("the producer was closed before this batch was acknowledged")
        for b in [*waiting, *(b for ps in self._core.parts.values() for b in ps.in_flight)]:
            if not b.done:
                self._finish(b, None, gone)  # type: ignore[arg-type]  # the core made it with _Batch
        for task in self._tasks:
            task.cancel()


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


def _clock_of(service: AsyncBrokerService) -> Callable[[], float] | None:
    """The clock of the embedded broker behind an asyncio service, if it is one."""
    inner = service.service if isinstance(service, ThreadedService) else service
    return inner.clock if isinstance(inner, HasClock) else None
