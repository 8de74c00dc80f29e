"""AsyncSubscriber: the :class:`~headwater.client.sync.subscriber.Subscriber` for asyncio.

The same push subscription (see :mod:`headwater.client.sync.subscriber` and
docs/subscriptions.md): attach to a subscriber registered on the broker, and each record goes
through the listeners in order, one after the other, in offset order per partition; the
checkpoint passes only records whose listeners all returned, and is stored every
``checkpoint_interval_ms`` and when the subscriber stops.

Here the subscriber is a task on the event loop, not a thread. A listener is a plain
function or a coroutine function; a coroutine's result is awaited before the next listener
(and the next record) gets its turn::

    async def store(record): await db.insert(record.body)
    def notify(record): log.info("stored %s", record.message_id)

    sub = hw.subscribe("orders", "audit", listeners=[store, notify])
    ...
    await sub.stop()

A plain listener runs on the loop itself, so it must not block (hand blocking work to
``asyncio.to_thread`` in a coroutine listener). Over the network the broker pushes, with the
same credit, reconnection and takeover as the sync subscriber; with an embedded broker
(``headwater.aio.open``) the subscriber reads with long polling.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from headwater.client.aio.consumer import AsyncConsumer
from headwater.client.aio.service import AsyncBrokerService
from headwater.client.sync import subscriber
from headwater.client.sync.subscriber import (
    PARTITIONS_CHECK_S,
    RECONNECT_BACKOFF_S_MAX,
    Listener,
    SubscriberBase,
)
from headwater.errors import HeadwaterError, SubscriberNotFoundError, UnavailableError
from headwater.model.message import Record
from headwater.model.service import AsyncOpensPushStreams

__all__ = ["AsyncSubscriber"]

log = logging.getLogger("headwater.subscriber")

_STOP = object()  # wakes the push loop when stop() is called


class AsyncSubscriber(SubscriberBase):
    """One process attached to a registered subscriber, as a task. Listeners run on the
    event loop, in the subscriber's task; make one with ``AsyncClient.subscribe``.

    ``await stop()`` (or leaving ``async with``) finishes the record in progress, stores the
    checkpoint and detaches; ``await wait()`` re-raises what stopped the subscriber.

    >>> import asyncio, tempfile
    >>> import headwater.aio
    >>> async def main():
    ...     async with await headwater.aio.open(tempfile.mkdtemp()) as hw:
    ...         _ = await hw.admin.create_queue("orders")
    ...         _ = await hw.admin.add_subscriber("orders", "audit", start="earliest")
    ...         _ = await hw.send("orders", b"paid")
    ...         seen = []
    ...         async def store(record):
    ...             seen.append(record.body)
    ...         async with hw.subscribe("orders", "audit", listeners=[store]) as sub:
    ...             await sub.wait_for(lambda: seen, timeout_s=5)
    ...         return seen, sub.positions
    >>> asyncio.run(main())
    ([b'paid'], {0: 1})
    """

    def __init__(
        self,
        service: AsyncBrokerService,
        queue: str,
        name: str,
        listeners: Iterable[Listener] = (),
        *,
        credit_messages: int = 1000,
        credit_bytes: int = 4 << 20,
        checkpoint_interval_ms: int = 100,
        on_error: str = "stop",
        start: bool = True,
    ) -> None:
        super().__init__(
            queue,
            name,
            listeners,
            credit_messages=credit_messages,
            credit_bytes=credit_bytes,
            checkpoint_interval_ms=checkpoint_interval_ms,
            on_error=on_error,
        )
        self._service = service
        self.mode = "push" if isinstance(service, AsyncOpensPushStreams) else "pull"
        self._inbox: asyncio.Queue[Any] = asyncio.Queue()  # bounded by the credit
        self._stop_requested = asyncio.Event()  # set by stop(); binds to a loop when first awaited
        self._task: asyncio.Task[None] | None = None
        if start:
            self.start()

    # -- control ------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    @property
    def closed(self) -> bool:
        """Whether the subscriber was stopped, or stopped by itself (an error)."""
        return self._stopping or (self._task is not None and self._task.done())

    @property
    def _stopping(self) -> bool:
        return self._stop_requested.is_set()

    def start(self) -> None:
        """Attach to the subscriber on the broker and start delivering, in a task on the
        running event loop."""
        if self._task is not None:
            return
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"headwater-subscriber-{self.name}")

    async def stop(self, timeout_s: float = 10.0) -> None:
        """Finish the record in progress, store the checkpoint, detach. Idempotent. From a
        listener (the subscriber's own task) it asks for the stop and returns at once."""
        self._stop_requested.set()
        task = self._task
        if task is None:
            return
        self._inbox.put_nowait(_STOP)
        if task is asyncio.current_task() or task.done():
            return
        done, _ = await asyncio.wait([task], timeout=timeout_s)
        if not done:
            log.warning("subscriber %s/%s did not stop within %.1f s; cancelled", self.queue, self.name, timeout_s)
            task.cancel()
            await asyncio.wait([task])

    close = stop

    async def wait(self, timeout_s: float | None = None) -> bool:
        """Wait until the subscriber stops (True) or ``timeout_s`` passes (False); re-raise
        the error that stopped it, if one did."""
        if self._task is None:
            return self._stopping
        done, _ = await asyncio.wait([self._task], timeout=timeout_s)
        if done and self.error is not None:
            raise self.error
        return bool(done)

    async def wait_for(self, condition: Callable[[], Any], timeout_s: float = 10.0) -> bool:
        """Wait until ``condition()`` is true (checked every 5 ms), the subscriber stops, or
        ``timeout_s`` passes; whether it is true."""
        deadline = time.monotonic() + timeout_s
        while not condition():
            if (self._task is not None and self._task.done()) or time.monotonic() >= deadline:
                return bool(condition())
            await asyncio.sleep(0.005)
        return True

    async def __aenter__(self) -> AsyncSubscriber:
        self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- the task -----------------------------------------------------------------------------

    async def _run(self) -> None:
        try:
            if self.mode == "push":
                await self._run_push()
            else:
                await self._run_pull()
        except Exception as e:  # noqa: BLE001 - reported through wait()
            self._stopped_by(e)
        finally:
            try:
                await self._checkpoint(final=True)
            except (HeadwaterError, TimeoutError) as e:
                log.warning("subscriber %s/%s: the last checkpoint was not stored: %s", self.queue, self.name, e)
            await self._close_stream()

    async def _deliver(self, partition: int, records: Iterable[Record]) -> bool:
        """Give records to the listeners in order, awaiting a coroutine listener before the
        next; the position passes each one done. False if the subscriber began stopping
        before the last one (the rest waits for the next)."""
        for r in records:
            if self._stopping:
                return False
            if not self._fresh(partition, r):
                continue
            for fn in self._listeners:
                try:
                    result = fn(r)
                    if inspect.isawaitable(result):
                        await result
                except Exception as e:  # noqa: BLE001 - the application's error, reported
                    self._listener_failed(fn, r, e)
                    break  # the listeners after it do not see it either
            self._passed(partition, r)
        return True

    async def _checkpoint(self, *, final: bool = False) -> None:
        """Store the positions that moved, if the interval passed (or ``final``)."""
        changed = self._due_checkpoint(final)
        if changed is None:
            return
        if self.mode == "push":
            await self._ack(changed, wait=final)
        elif changed:
            await self._service.checkpoint_subscriber(self.queue, self.name, changed)
        self._checkpointed(changed)

    async def _pause(self, seconds: float) -> None:
        """Sleep, or less if the subscriber is stopped meanwhile."""
        try:
            await asyncio.wait_for(self._stop_requested.wait(), seconds)
        except TimeoutError:
            pass

    # -- pull (an embedded broker) ---------------------------------------------------------

    async def _run_pull(self) -> None:
        self._set_info(await self._service.describe_subscriber(self.queue, self.name))
        assert self.info is not None
        consumer = AsyncConsumer(self._service, tags=self.info.tags, max_poll_messages=self.credit_messages)
        try:
            parts: list[int] = []
            next_check = 0.0
            while not self._stopping:
                if time.monotonic() >= next_check:
                    await self._check_subscribed()
                    parts, new = self._new_partitions(await self._service.describe_queue(self.queue), parts)
                    if new:
                        await consumer.assign(self.queue, list(new))
                        for p, offset in new.items():
                            consumer.seek(self.queue, p, offset)
                    next_check = time.monotonic() + PARTITIONS_CHECK_S
                by_part = self._polled(await consumer.poll(timeout_ms=self._pull_wait_ms()))
                if by_part:
                    await self._check_subscribed()  # not one record for a subscriber deleted meanwhile
                done = {p for p, recs in by_part.items() if await self._deliver(p, recs)}
                self._past_skipped(parts, by_part, done, lambda p: consumer.position(self.queue, p))
                await self._checkpoint()
        finally:
            await consumer.close()

    async def _check_subscribed(self) -> None:
        """Raise if the subscriber was deleted (embedded: a call in this process)."""
        try:
            await self._service.describe_subscriber(self.queue, self.name)
        except SubscriberNotFoundError:
            raise self._deleted() from None

    # -- push (over the network) ----------------------------------------------------------------

    async def _run_push(self) -> None:
        backoff = 0.05
        while not self._stopping:
            token = object()
            try:
                sid, info = await self._service.open_push_stream(  # type: ignore[attr-defined]  # push mode: the service OpensPushStreams
                    self.queue,
                    self.name,
                    lambda body, t=token: self._inbox.put_nowait((t, body)),
                    credit_messages=self.credit_messages,
                    credit_bytes=self.credit_bytes,
                )
            except UnavailableError as e:
                log.info("subscriber %s/%s: cannot subscribe (%s); retrying", self.queue, self.name, e)
                await self._pause(backoff)
                backoff = min(backoff * 2, RECONNECT_BACKOFF_S_MAX)
                continue
            backoff = 0.05
            self._stream_opened(sid, token, info)
            if await self._pump(token):
                return  # stopping: the stream stays open for the last checkpoint, then closes
            self._stream = None  # lost or ended by the broker: nothing to close

    async def _pump(self, token: object) -> bool:
        """Deliver the stream's pushes until it is lost or ended (False), or the subscriber
        stops (True)."""
        inbox = self._inbox
        while not self._stopping:
            if inbox.empty():
                try:
                    item = await asyncio.wait_for(inbox.get(), self._checkpoint_wait_s())
                except TimeoutError:
                    await self._checkpoint()
                    continue
            else:
                item = inbox.get_nowait()
                await asyncio.sleep(0)  # a run of pushes leaves the loop's other tasks their turns
            if item is _STOP:
                return True
            t, body = item
            if t is not token:
                continue  # from a stream that already ended
            if self._push_lost(body):
                return False
            complete = not body.batches or await self._deliver(body.partition, self._push_records(body))
            if self._pushed(body, complete):
                await self._ack({}, wait=False)
            await self._checkpoint()
        return True

    async def _ack(self, offsets: dict[int, int], *, wait: bool) -> None:
        stream = self._stream
        if stream is None:  # the stream was lost: store the checkpoint without it
            if offsets:
                await self._service.checkpoint_subscriber(self.queue, self.name, offsets)
            return
        if not offsets and not self._owed_messages and not self._owed_bytes:
            return
        messages, size = self._take_owed()
        fut = self._service.ack_push_stream(stream[0], offsets, messages, size)  # type: ignore[attr-defined]  # push mode: the service OpensPushStreams
        if wait:
            await asyncio.wait_for(fut, subscriber.FINAL_ACK_TIMEOUT_S)
        else:
            fut.add_done_callback(self._ack_done)

    async def _close_stream(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            try:
                await self._service.close_push_stream(stream[0])  # type: ignore[attr-defined]  # push mode: the service OpensPushStreams
            except HeadwaterError:
                pass
