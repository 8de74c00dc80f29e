"""AsyncGroupConsumer: :class:`~headwater.client.sync.group_consumer.GroupConsumer` for asyncio
(the membership, written once: :mod:`headwater.client.common.group_consumer`).

The same membership, the same rules and guarantees (see docs/consumer-groups.md);
heartbeats come from a task instead of a thread. So processing is decoupled from liveness
as long as handlers await: a handler that blocks the event loop (CPU work, blocking I/O)
stops the heartbeats too; run such work with ``asyncio.to_thread``.

The member joins on ``start()``, ``async with``, or its first ``poll``. ``on_assign`` and
``on_revoke`` may be plain functions or coroutine functions.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from headwater.client.aio.consumer import AsyncConsumer
from headwater.client.common.group_consumer import GroupConsumerBase
from headwater.client.common.twins import ASYNCIO

__all__ = ["AsyncGroupConsumer"]

T = TypeVar("T")


class AsyncGroupConsumer(GroupConsumerBase, AsyncConsumer, driver=ASYNCIO):
    """A member of consumer group ``group``, for asyncio. Use from one task at a time.

    Get one with ``hw.consumer(group="billing", subscribe=["orders"])`` on an
    :class:`~headwater.client.aio.client.AsyncClient`::

        async with hw.consumer(group="billing", subscribe="orders") as c:
            async for record in c:
                await handle(record)
                await c.commit()
    """

    def _begin(self) -> None:
        self._start_lock = asyncio.Lock()
        self._beat = asyncio.Event()  # heartbeat now
        self._stopping = False  # close() has begun
        self._heartbeats: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Join the group (``poll`` and ``async with`` do this on their own)."""
        self._check_open()
        async with self._start_lock:
            if self._started:
                return
            self._last_poll = time.monotonic()
            await self._join_group()
            self._heartbeats = asyncio.create_task(self._heartbeat_loop(), name=f"headwater-heartbeat-{self.group}")

    async def __aenter__(self) -> AsyncGroupConsumer:
        await self.start()
        return self

    async def __aexit__(self, exc_type: object, *exc: object) -> None:
        await self.close(commit=exc_type is None)

    def _blocking_io(self, fn: Callable[..., T], *args: Any) -> Coroutine[Any, Any, T]:
        return asyncio.to_thread(fn, *args)

    async def _heartbeat_loop(self) -> None:
        while not self._closed and not self._stopping:
            try:
                # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow the
                # cancellation close() sends when the wait ends at the same moment, and this
                # loop would then run on forever
                async with asyncio.timeout(self._beat_interval_s()):
                    await self._beat.wait()
            except TimeoutError:
                pass
            if self._stopping:
                break
            self._beat.clear()
            await self._beat_once()

    async def _stop_heartbeats(self) -> None:
        self._stopping = True  # the heartbeat loop ends even if its cancellation were lost
        if self._heartbeats is not None:
            self._beat.set()
            self._heartbeats.cancel()
            await asyncio.gather(self._heartbeats, return_exceptions=True)
