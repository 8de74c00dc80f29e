"""AsyncSubscriber: a push subscription's process, as a task (the subscription and its
delivery, the same as the sync :class:`~headwater.client.sync.subscriber.Subscriber`'s:
:mod:`headwater.client.common.subscriber`; docs/subscriptions.md).

A listener is a plain function or a coroutine function; a coroutine's result is awaited
before the next listener (and the next record) gets its turn::

    async def store(record): await db.insert(record.body)
    def notify(record): log.info("stored %s", record.message_id)

    sub = hw.subscribe("orders", "audit", listeners=[store, notify])
    ...
    await sub.stop()

A plain listener runs on the loop itself, so it must not block (hand blocking work to
``asyncio.to_thread`` in a coroutine listener).
"""

from __future__ import annotations

import asyncio
from typing import Any

from headwater.client.aio.consumer import AsyncConsumer
from headwater.client.common.closing import AsyncClosesOnExit
from headwater.client.common.subscriber import SubscriberBase, log
from headwater.client.common.twins import ASYNCIO
from headwater.model.service import AsyncOpensPushStreams, AsyncRoutesPushStreams

__all__ = ["AsyncSubscriber"]


class AsyncSubscriber(SubscriberBase, AsyncClosesOnExit, driver=ASYNCIO):
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

    _Inbox = asyncio.Queue  # bounded by the credit
    _Event = asyncio.Event  # binds to a loop when first awaited
    _Consumer = AsyncConsumer
    _push_streams = AsyncOpensPushStreams
    _routes_push = AsyncRoutesPushStreams
    _sleep = staticmethod(asyncio.sleep)

    @property
    def closed(self) -> bool:
        """Whether the subscriber was stopped, or stopped by itself (an error)."""
        return self._stopping or (self._runner is not None and self._runner.done())

    async def __aenter__(self) -> AsyncSubscriber:
        self.start()
        return self

    def _launch(self) -> None:
        self._runner = asyncio.get_running_loop().create_task(self._run(), name=f"headwater-subscriber-{self.name}")

    async def _joined(self, timeout_s: float) -> None:
        task = self._runner
        if task is None or task is asyncio.current_task() or task.done():
            return
        done, _ = await asyncio.wait([task], timeout=timeout_s)
        if not done:
            log.warning("subscriber %s/%s did not stop within %.1f s; cancelled", self.queue, self.name, timeout_s)
            task.cancel()
            await asyncio.wait([task])

    async def _until_stopped(self, timeout_s: float | None) -> bool:
        if self._runner is None:
            return self._stopping
        done, _ = await asyncio.wait([self._runner], timeout=timeout_s)
        return bool(done)

    async def _next_push(self, timeout_s: float) -> Any:
        inbox = self._inbox
        if inbox.empty():
            try:
                return await asyncio.wait_for(inbox.get(), timeout_s)
            except TimeoutError:
                return None
        item = inbox.get_nowait()
        await asyncio.sleep(0)  # a run of pushes leaves the loop's other tasks their turns
        return item

    def _settled(self, fut: Any, timeout_s: float) -> Any:
        return asyncio.wait_for(fut, timeout_s)
