"""AsyncSharedConsumer: a member of a shared group, for asyncio.

The names and behaviour of :class:`~headwater.client.sync.shared_consumer.SharedConsumer`; what
talks to the broker is a coroutine (``receive``, ``ack``, ``nack``, ``extend``,
``describe``, ``close``), and so are :class:`AsyncDelivery`'s ``ack``, ``nack`` and
``extend``. Get one with ``hw.shared_consumer(group, queue, ...)`` on an
:class:`~headwater.client.aio.client.AsyncClient`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterable
from typing import Any, cast

from headwater.client.aio.service import AsyncBrokerService
from headwater.client.sync.shared_consumer import Delivery, SharedConsumerBase, deliveries_from, raise_refused
from headwater.errors import HeadwaterError, UnavailableError
from headwater.model.service import AsyncStartsSharedReceive
from headwater.model.shared import SharedGroupInfo

__all__ = ["AsyncDelivery", "AsyncSharedConsumer"]


class AsyncDelivery(Delivery):
    """A leased message (see :class:`~headwater.client.sync.shared_consumer.Delivery`), settled
    with coroutines."""

    __slots__ = ()

    async def ack(self) -> None:  # type: ignore[override]  # the asyncio twin of Delivery's method
        await self._consumer.ack([self])

    async def nack(self, reason: str = "", delay_ms: int | None = None) -> None:  # type: ignore[override]  # the asyncio twin of Delivery's method
        await self._consumer.nack([self], reason, delay_ms)

    async def extend(self, visibility_timeout_ms: int | None = None) -> None:  # type: ignore[override]  # the asyncio twin of Delivery's method
        await self._consumer.extend([self], visibility_timeout_ms)


class AsyncSharedConsumer(SharedConsumerBase):
    """A member of shared group ``group`` on ``queue``, for asyncio. Use from one task."""

    _service: AsyncBrokerService

    async def receive(self, max_messages: int = 32, timeout_ms: int = 1000) -> list[AsyncDelivery]:
        """Up to ``max_messages`` deliveries from any partition, waiting up to ``timeout_ms``
        (while the broker is away: nothing after ``timeout_ms``, as the sync ``receive``)."""
        args = self._receive_args(max_messages, timeout_ms)
        res = await (self._receive_remote(args) if self._starts_receive else self._service.shared_receive(*args))
        return [] if res is None else self._track(deliveries_from(res, self.queue, self, AsyncDelivery))

    async def _receive_remote(self, args: tuple) -> Any:
        """The sync consumer's ``_receive_remote``, awaited."""
        timeout_s = args[-1] / 1000
        submitted_at = time.monotonic()
        service = cast(AsyncStartsSharedReceive, self._service)
        # an asyncio.Future (model, which imports no asyncio, calls it an Awaitable)
        fut = cast("asyncio.Future[Any]", service.start_shared_receive(*args))
        try:
            done, _ = await asyncio.wait([fut], timeout=timeout_s)
            if not done and service.withdraw(fut):
                fut.cancel()
                self._outage.unsent(submitted_at)
                return None
            res = await fut  # written: the broker answers by its long poll's end
        except UnavailableError as e:  # the connection was lost, or the broker is stopping
            if self.at_most_once or not self._outage.rides_out(e):
                raise  # at most once: an answer lost on the way would have lost its messages
            await asyncio.sleep(max(0.0, min(self._outage.backoff_s(), submitted_at + timeout_s - time.monotonic())))
            return None
        self._outage.over()
        return res

    async def __aiter__(self) -> AsyncIterator[AsyncDelivery]:
        while not self._closed:
            for d in await self.receive():
                yield d

    async def ack(self, deliveries: Iterable[Delivery]) -> None:
        ids = self._ids(deliveries)
        if ids:
            refused = await self._service.shared_ack(self.group, self.queue, self.member, ids)
            self._settle(ids)
            raise_refused(refused, "ack")

    async def nack(self, deliveries: Iterable[Delivery], reason: str = "", delay_ms: int | None = None) -> None:
        ids = self._ids(deliveries)
        if ids:
            refused = await self._service.shared_nack(self.group, self.queue, self.member, ids, reason, delay_ms)
            self._settle(ids)
            raise_refused(refused, "nack")

    async def extend(self, deliveries: Iterable[Delivery], visibility_timeout_ms: int | None = None) -> None:
        ids = self._ids(deliveries)
        if ids:
            vt = self.visibility_timeout_ms if visibility_timeout_ms is None else visibility_timeout_ms
            raise_refused(await self._service.shared_extend(self.group, self.queue, self.member, ids, vt), "extend")

    async def describe(self) -> SharedGroupInfo:
        return await self._service.shared_describe(self.group, self.queue)

    async def close(self) -> None:
        """Give back what this member still holds, then stop."""
        if self._closed:
            return
        held = list(self._held)
        self._held.clear()
        if held:
            try:
                await self._service.shared_nack(
                    self.group, self.queue, self.member, held, "released: consumer closed", 0
                )
            except HeadwaterError:
                pass  # they run out by themselves
        self._closed = True

    async def __aenter__(self) -> AsyncSharedConsumer:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()
