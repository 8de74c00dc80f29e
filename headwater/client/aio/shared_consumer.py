"""AsyncSharedConsumer: a member of a shared group, for asyncio (what it does:
:mod:`headwater.client.common.shared_consumer`).

The names and behaviour of :class:`~headwater.client.sync.shared_consumer.SharedConsumer`; what
talks to the broker is a coroutine (``receive``, ``ack``, ``nack``, ``extend``,
``describe``, ``close``), and so are :class:`AsyncDelivery`'s ``ack``, ``nack`` and
``extend``. Get one with ``hw.shared_consumer(group, queue, ...)`` on an
:class:`~headwater.client.aio.client.AsyncClient`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, cast

from headwater.client.aio.service import AsyncBrokerService
from headwater.client.common.closing import AsyncClosesOnExit
from headwater.client.common.shared_consumer import Delivery, SharedConsumerBase, deliveries_from
from headwater.client.common.twins import ASYNCIO
from headwater.model.service import AsyncStartsSharedReceive

__all__ = ["AsyncDelivery", "AsyncSharedConsumer"]


class AsyncDelivery(Delivery):
    """A leased message (see :class:`~headwater.client.common.shared_consumer.Delivery`), settled
    with coroutines."""

    __slots__ = ()

    async def ack(self) -> None:  # type: ignore[override]  # the asyncio twin of Delivery's method
        await self._consumer.ack([self])

    async def nack(self, reason: str = "", delay_ms: int | None = None) -> None:  # type: ignore[override]  # the asyncio twin of Delivery's method
        await self._consumer.nack([self], reason, delay_ms)

    async def extend(self, visibility_timeout_ms: int | None = None) -> None:  # type: ignore[override]  # the asyncio twin of Delivery's method
        await self._consumer.extend([self], visibility_timeout_ms)


class AsyncSharedConsumer(SharedConsumerBase, AsyncClosesOnExit, driver=ASYNCIO):
    """A member of shared group ``group`` on ``queue``, for asyncio. Use from one task."""

    _service: AsyncBrokerService
    _delivery = AsyncDelivery
    _sleep = staticmethod(asyncio.sleep)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._orphans: set[asyncio.Task[Any]] = set()  # embedded receives whose caller was cancelled

    async def _written_answer(self, args: tuple, timeout_s: float) -> Any:
        service = cast(AsyncStartsSharedReceive, self._service)
        # an asyncio.Future (model, which imports no asyncio, calls it an Awaitable)
        fut = cast("asyncio.Future[Any]", service.start_shared_receive(*args))
        try:
            done, _ = await asyncio.wait([fut], timeout=timeout_s)
            if not done and service.withdraw(fut):
                fut.cancel()
                return None
            if not fut.done():  # written: the broker answers by its long poll's end
                await asyncio.wait([fut])  # (not `await fut`: a cancelled wait would cancel it)
        except asyncio.CancelledError:
            self._orphan(service, fut)
            raise
        return fut.result()

    async def _local_answer(self, args: tuple) -> Any:
        """Embedded, a long poll runs in a thread a slice at a time: a caller cancelled while
        a slice runs must not lose what it leases, so the receive runs as a task of its own,
        whose answer goes to the next receive (:meth:`_late_answer`) when nobody waits."""
        task = asyncio.ensure_future(self._service.shared_receive(*args))
        try:
            await asyncio.wait([task])
        except asyncio.CancelledError:
            self._orphans.add(task)
            task.add_done_callback(self._orphans.discard)
            task.add_done_callback(self._late_answer)
            raise
        return task.result()

    def _end_orphans(self) -> Any:
        """Closing: the receives still running for cancelled callers end first (what one
        leases meanwhile runs out by itself); the coroutine that waits for them, or None."""
        if not self._orphans:
            return None
        for task in self._orphans:
            task.cancel()
        return asyncio.wait(list(self._orphans))

    def _orphan(self, service: AsyncStartsSharedReceive, fut: asyncio.Future[Any]) -> None:
        """The caller of a receive was cancelled: take the request back if it is not written
        (nothing is leased for it), else keep what the broker leases for it for the next
        receive, as it comes."""
        if not fut.done() and service.withdraw(fut):
            fut.cancel()
        else:
            fut.add_done_callback(self._late_answer)

    def _late_answer(self, fut: asyncio.Future[Any]) -> None:
        if fut.cancelled() or fut.exception() is not None:  # (retrieved: nothing leased for it)
            return
        res = fut.result()
        if res is not None and not self._closed:  # closed: the leases run out by themselves
            self._keep(deliveries_from(res, self.queue, self, self._delivery))

    async def __aiter__(self) -> AsyncIterator[AsyncDelivery]:
        while not self._closed:
            for d in await self.receive():
                yield d
