"""AsyncClient and AsyncAdmin: the :class:`~headwater.client.sync.client.Client` shape for asyncio.

Every name of the sync client is here with the same arguments, written once in
:mod:`headwater.client.common.client`; what waits for the broker is a coroutine, what only
builds an object (``producer()``, ``consumer()``, ``scanner()``) is a plain call. Get one with
``await headwater.aio.connect("host:port")`` or ``await headwater.aio.open(path)``; the errors
are the sync client's classes.
"""

from __future__ import annotations

import asyncio
from typing import Any

from headwater.client.aio.consumer import AsyncConsumer
from headwater.client.aio.group_consumer import AsyncGroupConsumer
from headwater.client.aio.keyed_consumer import AsyncKeyedConsumer
from headwater.client.aio.producer import AsyncProducer
from headwater.client.aio.scanner import AsyncScanner
from headwater.client.aio.service import AsyncBrokerService
from headwater.client.aio.shared_consumer import AsyncSharedConsumer
from headwater.client.aio.subscriber import AsyncSubscriber
from headwater.client.common.client import AdminBase, ClientBase
from headwater.client.common.closing import AsyncClosesOnExit
from headwater.client.common.twins import ASYNCIO

__all__ = ["AsyncAdmin", "AsyncClient"]


class AsyncAdmin(AdminBase, driver=ASYNCIO):
    """Create, inspect and change queues; the methods of :class:`~headwater.Admin`, awaitable."""


class AsyncClient(ClientBase, AsyncClosesOnExit, driver=ASYNCIO):
    """Admin, producing, consuming, scanning and lookups over one broker, for asyncio.

    ``async with`` (or ``await close()``) closes the producers and consumers it made, then
    the connection or the embedded broker.
    """

    _admin_class = AsyncAdmin
    _producer_class = AsyncProducer
    _consumer_class = AsyncConsumer
    _group_consumer_class = AsyncGroupConsumer
    _shared_consumer_class = AsyncSharedConsumer
    _keyed_consumer_class = AsyncKeyedConsumer
    _subscriber_class = AsyncSubscriber
    _scanner_class = AsyncScanner
    _send_and_wait = staticmethod(AsyncProducer.send)  # it waits for the id

    def __init__(self, service: AsyncBrokerService) -> None:
        super().__init__(service)
        # open producers, consumers and subscribers, held until closed: one the application
        # dropped may still have work in flight, which close() must finish
        self._children: set[Any] = set()
        self._closed = False

    def _adopt(self, child: Any) -> None:
        self._children = {c for c in self._children if not c.closed}
        self._children.add(child)

    async def close(self) -> None:
        """Close the producers (flushing them) and consumers made here, then the service."""
        if self._closed:
            return
        self._closed = True
        outcomes = await asyncio.gather(*(c.close() for c in list(self._children)), return_exceptions=True)
        await self._service.close()
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
