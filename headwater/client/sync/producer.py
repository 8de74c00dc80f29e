"""Producer: the thread-based driver of the producer core (:mod:`headwater.client.core`).

The core keeps the batches and decides what leaves when and what follows each answer; this
module owns the threads, the waiting, the futures and the callbacks, and encodes in the
caller's process, so a broker only validates and appends. How few thread hops lie between a
caller and the socket, and why, is ``docs/design/client.md``; the user guide is
``docs/producing.md``.

Thread-safety: every method may be called from any thread. One lock guards the core and
the buffer count and the outbox (the batches put in flight, in order); a second one, the
wire lock, is held by the one thread that empties the outbox, encoding and handing batches
to the connection in that order (batches of a partition reach it in sequence order). A
send never waits for an encode: only a batch's final failure takes the wire lock under the
first (to give back its sequences). Send callbacks run in the sender thread ("headwater-producer"),
one at a time, in send order within a partition: keep them quick. The blocking methods
(``send_and_wait``, ``send_batch``, ``flush``, ``close``) raise :class:`UsageError` there,
always: over the network a callback can also run on the client's I/O thread (a batch
refused before it left, settled there), where a wait for an answer would never end.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from array import array
from collections import deque
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from headwater.client.common.producer import Groups, Messages, ProducerBase
from headwater.client.common.twins import BLOCKING
from headwater.client.core.batching import (
    MESSAGE_OVERHEAD_BYTES,
    BatchReceipt,
    as_message,
    check_batch_arg,
    check_message,
    check_messages,
    int_setting,
    no_partition,
    too_large,
)
from headwater.client.core.outcomes import check_timeout_s, closed_unsent
from headwater.client.core.producer import Batch, PartitionState, moved_to
from headwater.client.sync.producer_sender import ProducerSender
from headwater.client.transport.send_future import BatchOutcome, SendFuture, fail_sends, settle_sends
from headwater.errors import (
    InvalidArgumentError,
    UnavailableError,
    UsageError,
)
from headwater.model.config import QueueInfo
from headwater.model.message import Message, MessageId
from headwater.model.service import BrokerService, DescribesAsync, HasClock, ProduceResult, ProducesAsync

__all__ = ["Producer", "BatchReceipt", "SendCallback"]

log = logging.getLogger("headwater.producer")

SendCallback = Callable[[MessageId | None, BaseException | None], None]


class _Batch(Batch):
    """A core batch and what settles its senders: ``outcome``, which the futures of
    ``send()`` read (the batch keeps no future per message: see :class:`SendFuture`; None
    until the first); ``groups``, a blocking call's ``(index, count, future)``;
    ``callbacks`` in send order, each for the message at the same place of ``callback_at``
    (an array of ints, not a tuple per message: nothing the garbage collector walks)."""

    __slots__ = ("outcome", "groups", "callbacks", "callback_at")

    def __init__(self, part: PartitionState, created_ms: float) -> None:
        super().__init__(part, created_ms)
        self.outcome: BatchOutcome | None = None
        self.groups: list[tuple[int, int, SendFuture]] | None = None
        self.callbacks: list[SendCallback] | None = None
        self.callback_at: array[int] | None = None  # the index in the batch of each callback's message

    def reordered(self, order: list[int]) -> None:
        """The core put the messages in due order (a delayed batch): the futures' outcome
        learns where each went, and the groups and callbacks move along."""
        if self.outcome is not None:
            self.outcome.reordered(order)
        if self.groups or self.callbacks:
            at = moved_to(order)
            if self.groups:
                self.groups = [(at[i], n, f) for i, n, f in self.groups]
            if self.callback_at is not None:
                self.callback_at = array("q", map(at.__getitem__, self.callback_at))


def _now_ms() -> float:
    return time.monotonic() * 1000


class Producer(ProducerBase, ProducerSender, driver=BLOCKING):
    """Sends messages to queues. Thread-safe; one producer can serve a whole application.

    Get one from a client: ``hw.producer(...)`` (embedded or over the network, the same).
    ``send()`` queues a message and returns a future; ``send_and_wait()`` and ``send_batch()``
    block until stored; ``flush()`` waits for everything sent so far; ``close()`` flushes and
    stops the sender thread.

    >>> import headwater, tempfile
    >>> hw = headwater.open(tempfile.mkdtemp())
    >>> _ = hw.admin.create_queue("orders", partitions=4)
    >>> p = hw.producer(partitioner="key", linger_ms=5)
    >>> fut = p.send("orders", b"paid", key=b"order-17", tag="paid")
    >>> hw.get(fut.result()).body
    b'paid'
    >>> mid = p.send_and_wait("orders", b"shipped", key=b"order-17")
    >>> mid.partition == fut.result().partition       # one key, one partition
    True
    >>> done = []
    >>> _ = p.send("orders", b"late", key=b"order-9", callback=lambda mid, exc: done.append(exc))
    >>> p.flush()
    >>> done
    [None]
    >>> p.close()
    >>> hw.close()

    ``send_batch`` and ``send_identified`` are :class:`~headwater.client.common.producer.ProducerBase`'s.
    Options (all keyword-only) are :class:`~headwater.client.core.batching.ProducerBase`'s, and:

    - ``max_block_ms``: ``send()`` blocks up to this long for room in ``buffer_bytes_max``,
      then raises ``UnavailableError``.
    - ``send_threads``: threads that call an in-process broker (embedded mode only; over the
      network, batches of several partitions are pipelined on one connection).
    """

    def __init__(
        self,
        service: BrokerService,
        *,
        max_block_ms: int = 60_000,
        send_threads: int = 4,
        clock: Callable[[], float] | None = None,
        **settings: Any,
    ) -> None:
        self._produce_async = service.produce_async if isinstance(service, ProducesAsync) else None
        super().__init__(
            service,
            new_batch=_Batch,
            # embedded: batches go through a thread pool, which keeps no order, so one at a time
            pipelined=self._produce_async is not None,
            # an embedded broker's own (injected) clock
            clock=clock or (service.clock if isinstance(service, HasClock) else None),
            **settings,
        )
        self._service: BrokerService = service
        self.max_block_ms = int_setting("max_block_ms", max_block_ms, 0, 86_400_000)
        self.send_threads = int_setting("send_threads", send_threads, 1, 256)
        self._describe_async = service.describe_queue_async if isinstance(service, DescribesAsync) else None
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None

        self._lock = threading.Lock()
        self._wire = threading.Lock()  # held while batches are encoded and sent (_send_queued)
        self._outbox: deque[_Batch] = deque()  # in flight, to encode and send: filled under _lock
        self._wakeup = threading.Condition(self._lock)  # the sender waits on it
        self._space = threading.Condition(self._lock)  # send() waits on it for buffer room
        self._finished = threading.Condition(self._lock)  # flush() waits on it
        self._completions: deque[tuple[_Batch, concurrent.futures.Future]] = deque()
        self._space_waiters = 0
        self._sender: threading.Thread | None = None
        self._calling_back: set[int] = set()  # the threads running one of our send callbacks

    # -- public API -----------------------------------------------------------------------

    def send(
        self,
        queue: str,
        body: bytes | Message,
        *,
        key: bytes | None = None,
        tag: str | None = None,
        properties: dict[str, str] | None = None,
        partition: int | None = None,
        callback: SendCallback | None = None,
        deliver_at: datetime | int | None = None,
        delay: timedelta | float | None = None,
    ) -> concurrent.futures.Future[MessageId]:
        """Queue one message; return a future of its id.

        ``deliver_at`` (a datetime, naive meaning UTC, or epoch ms) or ``delay`` (a
        timedelta or seconds) make it a delayed message: the broker keeps it and appends it
        to its partition at that time; its id until then is a delayed id
        (``MessageId.is_delayed``), which ``Client.cancel`` takes. A time not in the future
        sends it at once. Beyond the broker's ``delay_max_s`` the future fails with
        :class:`InvalidArgumentError`.

        ``callback(message_id, error)`` is called once when the outcome is known, with
        exactly one of the two None, in the producer's sender thread; it may call ``send()``,
        not the methods that wait. Invalid input (a wrong type, a body over the queue's
        ``message_bytes_max`` or a message too large for a batch of its own, a partition out
        of range, an unknown queue, the ``"key"`` partitioner without a key) raises here,
        before anything is queued. A full buffer blocks up to ``max_block_ms``, then raises
        :class:`UnavailableError`.
        """
        at = 0 if deliver_at is None and delay is None else self._deliver_at(deliver_at, delay)
        return self._enqueue(queue, body, key, tag, properties, partition, callback, False, at)

    def send_and_wait(
        self,
        queue: str,
        body: bytes | Message,
        *,
        key: bytes | None = None,
        tag: str | None = None,
        properties: dict[str, str] | None = None,
        partition: int | None = None,
        callback: SendCallback | None = None,
        deliver_at: datetime | int | None = None,
        delay: timedelta | float | None = None,
    ) -> MessageId:
        """Send one message and return its id once it is stored (a delayed one: once it is
        scheduled, durably; ``deliver_at`` and ``delay`` as for :meth:`send`).

        It does not linger: when its partition is idle the message is sent at once from the
        calling thread; otherwise it joins the partition's next batch. A send callback cannot
        call it (:class:`UsageError`): it waits.
        """
        sender, me = self._sender, threading.get_ident()  # _in_sender(), inline: once per call
        if (sender is not None and sender.ident == me) or me in self._calling_back:
            self._refuse_in_sender("send_and_wait()")
        if type(body) is bytes and key is None and tag is None and properties is None and partition is None:
            if callback is None and deliver_at is None and delay is None:  # the common first program
                # _prepare's and _choose_partition's checks, without their calls (issue 32)
                self._check_open()
                got = self._metadata.entries.get(queue)  # _queue_info's fresh copy, inline
                now_ms = time.monotonic() * 1000
                if got is not None and now_ms - got[0] <= self._metadata.max_age_ms:
                    info = got[1]
                else:
                    info = self._queue_info(queue, now_ms=now_ms)
                size = check_message(body, info.config.message_bytes_max)
                p = None  # for_message's answer for bare bytes, unless the strategy must be asked
                if self._partitioner.bytes_need_asking:
                    p = self._partitioner.for_message(body, len(info.partitions))
                r = self._send_sync(queue, p, info, [body], size)
                return MessageId(r.queue_id, r.partition, r.base_offset)
        at = self._deliver_at(deliver_at, delay)
        if callback is not None:  # the callback runs in the sender thread, as for send()
            return self._enqueue(queue, body, key, tag, properties, partition, callback, True, at).result()
        info, msg, size = self._prepare(queue, body, key, tag, properties)
        p = self._choose_partition(queue, info, msg, partition)
        r = self._send_sync(queue, p, info, [msg], size, at)
        return MessageId(r.queue_id, r.partition, r.base_offset)

    send_nowait = send  # the asyncio producer's name for a send that returns a future

    _send_batch = ProducerBase.send_batch  # the shared body, driven as a blocking method

    def send_batch(
        self,
        queue: str,
        messages: Sequence[Message | bytes],
        *,
        partition: int | None = None,
        deliver_at: datetime | int | None = None,
        delay: timedelta | float | None = None,
    ) -> Sequence[MessageId]:
        check_batch_arg(messages)
        if (
            partition is not None
            or deliver_at is not None
            or delay is not None
            or not self._partitioner.sticky_batch(messages)
        ):
            return self._send_batch(queue, messages, partition=partition, deliver_at=deliver_at, delay=delay)
        # the common case, unkeyed messages for the sticky partition, without the shared
        # body's generator and groups: they cost an embedded send_batch of one message
        # about 3.5 us of 23 (sb.py, issue 29)
        self._refuse_in_sender("send_batch()")
        return BatchReceipt(self._send_sync(queue, None, self._queue_info(queue), messages, None))

    send_batch.__doc__ = ProducerBase.send_batch.__doc__

    def flush(self, timeout_s: float | None = None) -> None:
        """Send what is queued now, without lingering, and wait until every message sent so
        far is acknowledged or has failed (see the futures for which).

        Raises :class:`UnavailableError` if that takes longer than ``timeout_s``.
        """
        self._refuse_in_sender("flush()")
        check_timeout_s(timeout_s, "flush()")
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._lock:
            pending = self._core.pending()
            if not pending:
                return
            self._flushing += 1
            self._wake_locked()
            try:
                for b in pending:
                    while not b.done:
                        remaining = None if deadline is None else deadline - time.monotonic()
                        if remaining is not None and remaining <= 0:
                            left = sum(not x.done for x in pending)
                            raise UnavailableError(f"flush: {left} batches still unacknowledged after {timeout_s} s")
                        self._finished.wait(remaining)
            finally:
                self._flushing -= 1

    def close(self, timeout_s: float | None = None) -> None:
        """Flush, then stop the sender thread. Later sends raise :class:`ClosedError`.

        If the flush takes longer than ``timeout_s``, messages not yet sent fail with
        :class:`ClosedError` and batches in flight are left to finish on their own.
        """
        self._refuse_in_sender("close()")
        check_timeout_s(timeout_s, "close()")
        with self._lock:
            self._closed = True
            self._space.notify_all()
        try:
            self.flush(timeout_s)
            aborted = False
        except UnavailableError:
            aborted = True
        unsent: list[tuple[_Batch, BaseException]] = []
        with self._lock:
            if aborted:
                never_sent, waiting = self._core.abort()
                unsent = [(b, closed_unsent()) for b in never_sent]
                unsent.extend(
                    (b, UnavailableError("the producer was closed while this batch waited to be retried"))
                    for b in waiting
                )  # they leave the retry list when failed below
            sender = self._sender
            self._wake_locked(start=False)
        for b, exc in unsent:
            self._finish(b, None, exc)
        if sender is not None and sender is not threading.current_thread():
            sender.join(None if not aborted else 1.0)
        if self._pool is not None:
            self._pool.shutdown(wait=not aborted)

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _enqueue(
        self,
        queue: str,
        body: object,
        key: object,
        tag: object,
        properties: object,
        partition: int | None,
        callback: SendCallback | None,
        urgent: bool,
        deliver_at_ms: int = 0,
    ) -> SendFuture:
        """send(): check, pick the partition, append to its open batch (``urgent``: it must
        not linger). A delayed message joins an open batch only of its own deliver time."""
        now_ms = time.monotonic() * 1000  # when it was sent: its batch's linger and delivery time count from here
        if type(body) is bytes and key is None and tag is None and properties is None:  # the common case
            info = self._queue_info(queue, now_ms=now_ms)
            if len(body) > info.config.message_bytes_max:
                raise too_large(len(body), info.config.message_bytes_max)
            msg: Message | bytes = body
            size = len(body) + MESSAGE_OVERHEAD_BYTES
        else:
            info, msg, size = self._prepare(queue, body, key, tag, properties)
        if callback is not None and not callable(callback):
            raise InvalidArgumentError(f"callback must be callable, got {type(callback).__name__}")
        p = self._choose_partition(queue, info, msg, partition)
        with self._lock:
            self._check_open()
            if self._buffered_bytes + size > self.buffer_bytes_max:
                self._wait_for_space_locked(size)
            core = self._core
            if p is None:
                p = self._partitioner.sticky(queue, info.partitions)
            ps = core.partition(queue, p, deliver_at_ms)
            b, opened = core.append(ps, msg, size, now_ms, deliver_at_ms, urgent)
            outcome = b.outcome
            if outcome is None:
                outcome = b.outcome = BatchOutcome()
            index = len(b.messages) - 1
            fut = SendFuture(outcome, index)  # detached: the batch keeps no reference to it
            if callback is not None:
                if b.callbacks is None or b.callback_at is None:
                    b.callbacks, b.callback_at = [], array("q")
                b.callbacks.append(callback)
                b.callback_at.append(index)
            self._buffered_bytes += size
            lingers = self.linger_ms and not urgent
            if opened and lingers and core.mark_sendable(ps):
                self._wake_locked()  # the sender times its linger
            if lingers and ps.holds_open(b):
                return fut  # the sender sends it when its linger ends
            if not core.can_send(ps):
                return fut  # it leaves when a batch in flight is through
            batches = core.take(ps, now_ms, True)  # sent from this thread: no hand-off
            self._outbox.extend(batches)
        if batches:
            self._send_queued()
        return fut

    # -- validation and partitions --------------------------------------------------------

    def _queue_info(self, queue: str, *, refresh: bool = False, now_ms: float | None = None) -> QueueInfo:
        """The queue's metadata: asked for, and waited for, when unknown or ``refresh``.
        A stale copy is used while a fresh one is asked for in the background, over the
        network (in process, asking costs no round trip: it is asked for at once)."""
        if now_ms is None:
            now_ms = time.monotonic() * 1000
        got = self._metadata.entries.get(queue)
        if got is not None and not refresh and now_ms - got[0] <= self._metadata.max_age_ms:
            return got[1]  # the common case: a fresh copy
        info, stale = self._metadata.lookup(queue, now_ms)
        if refresh or info is None or (stale and self._describe_async is None):
            info = self._service.describe_queue(queue)
            self._metadata.put(queue, info, now_ms)
        elif stale and self._metadata.start_refresh(queue):
            self._refresh_later(queue, now_ms)
        return info

    def _refresh_later(self, queue: str, asked_at_ms: float) -> None:
        def refreshed(fut: concurrent.futures.Future) -> None:
            try:
                outcome: QueueInfo | BaseException = fut.result()
            except BaseException as e:  # noqa: BLE001 - kept by the cache
                outcome = e
            self._metadata.refreshed(queue, asked_at_ms, outcome, _now_ms())

        try:
            self._describe_async(queue).add_done_callback(refreshed)  # type: ignore[misc]  # set only when the service DescribesAsync
        except Exception as e:  # noqa: BLE001 - a closed client: the send finds out itself
            self._metadata.refreshed(queue, asked_at_ms, e, _now_ms())

    def _prepare(
        self, queue: str, body: object, key: object, tag: object, properties: object
    ) -> tuple[QueueInfo, Message | bytes, int]:
        msg = as_message(body, key, tag, properties)
        self._check_open()
        info = self._queue_info(queue)
        return info, msg, check_message(msg, info.config.message_bytes_max)

    def _check_partition(self, queue: str, info: QueueInfo, partition: object) -> QueueInfo:
        if isinstance(partition, bool) or not isinstance(partition, int):
            raise InvalidArgumentError(f"a partition is an int, got {type(partition).__name__}")
        n = len(info.partitions)
        if not 0 <= partition < n:
            info = self._queue_info(queue, refresh=True)  # it may have grown
            n = len(info.partitions)
            if not 0 <= partition < n:
                raise no_partition(queue, n, partition)
        return info

    def _choose_partition(self, queue: str, info: QueueInfo, msg: Message | bytes, partition: int | None) -> int | None:
        """The message's partition; None for the queue's sticky partition."""
        if partition is not None:
            if type(partition) is not int or not 0 <= partition < len(info.partitions):
                self._check_partition(queue, info, partition)  # the full check, only off the common case
            return partition
        return self._partitioner.for_message(msg, len(info.partitions))

    # -- what the shared bodies yield (common.producer): answers, as this driver waits --------

    _now_ms = staticmethod(_now_ms)

    def _info_for(self, queue: str, partition: int | None) -> QueueInfo:
        info = self._queue_info(queue)
        return info if partition is None else self._check_partition(queue, info, partition)

    def _open_info(self, queue: str) -> QueueInfo:
        return self._queue_info(queue)  # whether the producer is open is checked under the lock

    def _send_groups_of(
        self, queue: str, info: QueueInfo, messages: Messages, groups: Groups, deliver_at_ms: int
    ) -> list[ProduceResult]:
        if len(groups) == 1:  # sent inline when its partition is idle; checked as it is encoded
            return [self._send_sync(queue, next(iter(groups)), info, messages, None, deliver_at_ms)]
        by_partition = {p: [messages[i] for i in idxs] for p, idxs in groups.items()}
        return list(self._send_groups(queue, info, by_partition, deliver_at_ms).values())

    def _fly(self, b: _Batch) -> concurrent.futures.Future[ProduceResult]:
        fut = SendFuture()
        b.groups = [(0, len(b.messages), fut)]
        with self._lock:
            self._check_open()
            self._core.fly(b)
            self._outbox.append(b)
        self._send_queued()
        return fut

    # -- the accumulator (the core's, under _lock) -------------------------------------------

    def _in_sender(self) -> bool:
        """Whether this thread is the sender, or runs one of this producer's send callbacks
        (mostly on the sender; a batch refused before it left calls them on the thread that
        tried to send it, which can be the client's I/O thread)."""
        sender, me = self._sender, threading.get_ident()
        return (sender is not None and sender.ident == me) or me in self._calling_back

    def _refuse_in_sender(self, what: str) -> None:
        if self._in_sender():
            raise UsageError(
                f"{what} waits, so a send callback cannot call it: the wait would hold up the "
                f"producer's sender thread, or deadlock on the thread that reads the answers "
                f"(use send() there)"
            )

    _before_sending = _refuse_in_sender  # a closed producer is refused under the lock, later

    def _wait_for_space_locked(self, size: int) -> None:
        self._check_room(size)
        if self._in_sender():  # only the sender (or the I/O thread) makes room: never wait
            raise UnavailableError("producer buffer full (a send callback cannot wait for room)")
        deadline = time.monotonic() + self.max_block_ms / 1000
        self._space_waiters += 1
        self._wake_locked()  # batches lingering should go now
        try:
            while self._buffered_bytes + size > self.buffer_bytes_max:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise UnavailableError(
                        f"producer buffer full: {self._buffered_bytes} bytes queued (buffer_bytes_max="
                        f"{self.buffer_bytes_max}) for max_block_ms={self.max_block_ms}; the broker is slow "
                        f"or unreachable"
                    )
                self._space.wait(remaining)
                self._check_open()
        finally:
            self._space_waiters -= 1

    def _hurry_locked(self) -> bool:
        """Whether open batches leave now rather than when their linger ends."""
        return bool(not self.linger_ms or self._flushing or self._space_waiters or self._closed)

    # -- blocking sends -------------------------------------------------------------------

    def _send_sync(
        self,
        queue: str,
        partition: int | None,
        info: QueueInfo,
        messages: Sequence[Message | bytes],
        size: int | None,
        deliver_at_ms: int = 0,
    ) -> ProduceResult:
        """Send ``messages`` to one partition and wait: inline when the partition is idle,
        else as part of its next batch. ``size`` is None when they are not validated yet."""
        cap = info.config.message_bytes_max
        with self._lock:
            self._check_open()
            p = partition if partition is not None else self._partitioner.sticky(queue, info.partitions)
            ps = self._core.partition(queue, p, deliver_at_ms)
            b = self._core.exclusive(ps, messages, time.monotonic() * 1000, deliver_at_ms)  # _now_ms()
        if b is not None:
            return self._send_inline(b, cap)  # type: ignore[arg-type]  # the core made it with _Batch
        return self._send_groups(queue, info, {p: messages}, deliver_at_ms, None if size is None else {p: size})[p]

    def _send_groups(
        self,
        queue: str,
        info: QueueInfo,
        groups: dict[int | None, Sequence[Message | bytes]],
        deliver_at_ms: int = 0,
        sizes: dict[int | None, int] | None = None,
    ) -> dict[int | None, ProduceResult]:
        """Send each group to its partition (None: the sticky one) in parallel, in the next
        batches; wait for all. ``sizes``: None when the messages are not validated yet."""
        self._refuse_in_sender("a blocking send")
        cap = info.config.message_bytes_max
        if sizes is None:
            sizes = {p: check_messages(msgs, cap) for p, msgs in groups.items()}  # all valid, or none sent
        futs: dict[int | None, concurrent.futures.Future] = {}
        with self._lock:
            self._check_open()
            for p, msgs in groups.items():
                q = p if p is not None else self._partitioner.sticky(queue, info.partitions)
                ps = self._core.partition(queue, q, deliver_at_ms)
                # into the open batch, which leaves without lingering once the partition's slot is free
                b, _, index = self._core.append_group(ps, msgs, sizes[p], _now_ms(), deliver_at_ms)
                futs[p] = SendFuture()
                if b.groups is None:
                    b.groups = []
                b.groups.append((index, len(msgs), futs[p]))
                if self._core.mark_sendable(ps):
                    self._wake_locked()
        if len(futs) == 1:  # one group, the common case: one wait, for its result or error
            ((p, f),) = futs.items()
            return {p: f.result()}
        # every group settled before any error is raised; each future's own wait, not
        # concurrent.futures.wait(), whose waiter machinery cost the blocking send 3x its
        # overhead (16 threads sending one message each: -40 % in bench.storage T3)
        errors = [f.exception() for f in futs.values()]
        for e in errors:
            if e is not None:
                raise e
        return {p: f.result() for p, f in futs.items()}

    def _send_inline(self, b: _Batch, cap: int) -> ProduceResult:
        """Encode and send a batch that holds its partition exclusively, from the caller's
        thread, retrying as the core says."""
        core = self._core
        try:
            core.encode(b, cap)
        except BaseException as e:
            self._finish(b, None, e)
            raise
        ps = b.part
        while True:
            if b.encoded is None:  # to be sent under a new epoch
                b.send_identity = core.identity
                core.encode(b)
            b.attempts += 1
            try:
                result = self._service.produce(ps.queue, ps.partition, b.encoded)  # type: ignore[arg-type]  # encoded before it is sent
            except BaseException as e:
                with self._lock:
                    verdict = self._judge(b, e, _now_ms())
                if verdict.error is not None:
                    self._finish(b, None, verdict.error)
                    raise verdict.error  # noqa: B904 - e itself, or an error whose __cause__ is e
                time.sleep(verdict.delay_ms / 1000)
                continue
            self._finish(b, result, None)
            return result

    # -- outcomes -------------------------------------------------------------------------

    def _finish(self, b: _Batch, result: ProduceResult | None, exc: BaseException | None) -> None:
        """Take the batch out of flight, release its buffer room, then resolve its futures
        and callbacks. What waited for its slot leaves from this thread, as send() sends: no
        hand-off to the sender, which only times what still lingers."""
        core = self._core
        with self._lock:
            if result is None:
                assert exc is not None
                with self._wire:  # the sequences: a new epoch, or this batch's given back
                    self._give_up(b, exc)
            batches, wake = core.finish(b, _now_ms, self._hurry_locked)
            self._outbox.extend(batches)
            if wake:
                self._wake_locked()
            elif self._closed and not core.busy():  # close() waits for the sender, which waits for this
                self._wake_locked(start=False)
            if b.buffered_bytes:
                self._buffered_bytes -= b.buffered_bytes
                if self._space_waiters:
                    self._space.notify_all()
        if batches:
            self._send_queued()
        if result is None:
            fail_sends(b.outcome, b.groups or (), exc)  # type: ignore[arg-type]  # this driver's groups: (index, count, future)
            for callback in b.callbacks or ():
                self._call_back(callback, None, exc)
        elif b.outcome is not None or b.groups:  # neither when a blocking call sent it inline
            settle_sends(b.outcome, b.groups or (), result)
            for i, callback in zip(b.callback_at or (), b.callbacks or ()):
                self._call_back(callback, MessageId(result.queue_id, result.partition, result.base_offset + i), None)
        b.done = True
        if self._flushing:
            with self._lock:
                self._finished.notify_all()

    def _call_back(self, callback: SendCallback, mid: MessageId | None, exc: BaseException | None) -> None:
        me = threading.get_ident()
        nested = me in self._calling_back  # a callback's send() failed at once
        self._calling_back.add(me)
        try:
            callback(mid, exc)
        except Exception:  # noqa: BLE001 - a user's bug must not stop the sender
            log.exception("a send callback raised")
        finally:
            if not nested:
                self._calling_back.discard(me)
