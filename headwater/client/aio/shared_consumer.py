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
from typing import Any

from headwater.client.aio.service import AsyncBrokerService
from headwater.client.common.closing import AsyncClosesOnExit
from headwater.client.common.shared_consumer import Delivery, SharedConsumerBase, deliveries_from
from headwater.client.common.twins import ASYNCIO
from headwater.client.transport.polling import retrieve

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

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._orphans: set[asyncio.Task[Any]] = set()  # embedded receives whose caller was cancelled

    def wakeup(self) -> None:
        """End the receive that awaits now with :class:`~headwater.errors.WakeupError`, or
        the next receive if none awaits (``SharedConsumer.wakeup``'s twin): from another
        task, or from another thread (a plain call: it hands the wake to the consumer's
        loop). Cancelling the receiving task ends it too, with CancelledError. Each call
        raises once, and nothing leased is lost (see ``SharedConsumer.wakeup``)."""
        self._wake_asyncio()

    def _new_waiter(self) -> asyncio.Future[None]:
        return asyncio.get_running_loop().create_future()

    async def _wait_receive(self, futures: list[Any], timeout_s: float | None) -> None:
        # (asyncio.wait, not `await fut`: a cancelled wait would cancel the receive's future)
        await asyncio.wait(futures, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)

    def _withdrawn(self, fut: Any) -> None:
        fut.cancel()

    def _left(self, fut: Any) -> None:
        fut.add_done_callback(retrieve)  # an error nobody awaits (the client closed) is not logged

    async def _local_answer(self, args: tuple) -> Any:
        """Embedded, a long poll runs in a thread a slice at a time: a caller cancelled while
        a slice runs must not lose what it leases, so each slice runs as a task of its own,
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
        """Closing: the receives still running for cancelled callers end first (each is one
        slice of a long poll, ``LOCAL_SLICE_MS`` at most), and what they lease is given
        back with the rest; the coroutine that waits for them, or None."""
        if not self._orphans:
            return None
        return asyncio.wait(list(self._orphans))

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
