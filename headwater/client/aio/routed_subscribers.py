"""The subscriber calls of :class:`~headwater.client.aio.routing.AsyncRoutedService`, the
twin of :mod:`headwater.client.transport.routed_subscribers` (read it for the rules)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from headwater.client.aio.service import AsyncService
from headwater.client.core.routing import RefreshGate, RoutingTable
from headwater.client.core.subscribers import merge_subscribers
from headwater.model.cluster import BrokerAddress
from headwater.model.subscription import SubscriberInfo
from headwater.protocol import messages as m

__all__ = ["AsyncRoutedSubscriberCalls"]

T = TypeVar("T")


class AsyncRoutedSubscriberCalls:
    """A mixin of :class:`~headwater.client.aio.routing.AsyncRoutedService`, which gives
    what is declared below."""

    if TYPE_CHECKING:
        request_timeout_s: float
        _home: AsyncService
        _gate: RefreshGate
        _table: RoutingTable

        async def refresh(self, deadline: float | None = None) -> RoutingTable: ...
        async def _ask_leaders(
            self, brokers: list[int], ask: Callable[[AsyncService], Awaitable[Any]], *, strict: bool
        ) -> dict[int, Any]: ...
        async def _coordinated(
            self,
            api: m.ApiKey,
            group: str,
            call: Callable[[AsyncService], Awaitable[T]],
            locate: Callable[[RoutingTable], BrokerAddress | None] | None = None,
        ) -> T: ...

    async def _subscriber(
        self, api: m.ApiKey, queue: str, name: str, call: Callable[[AsyncService], Awaitable[T]]
    ) -> T:
        return await self._coordinated(api, name, call, lambda table: table.subscriber_coordinator(queue, name))

    async def add_subscriber(
        self,
        queue: str,
        name: str,
        partitions: list[int] | None = None,
        tags: list[str] | None = None,
        start: str = "latest",
    ) -> SubscriberInfo:
        return await self._subscriber(
            m.ApiKey.ADD_SUBSCRIBER, queue, name, lambda s: s.add_subscriber(queue, name, partitions, tags, start)
        )

    async def delete_subscriber(self, queue: str, name: str) -> None:
        await self._subscriber(m.ApiKey.DELETE_SUBSCRIBER, queue, name, lambda s: s.delete_subscriber(queue, name))

    async def describe_subscriber(self, queue: str, name: str) -> SubscriberInfo:
        return await self._subscriber(
            m.ApiKey.DESCRIBE_SUBSCRIBER, queue, name, lambda s: s.describe_subscriber(queue, name)
        )

    async def checkpoint_subscriber(self, queue: str, name: str, offsets: dict[int, int]) -> None:
        await self._subscriber(
            m.ApiKey.CHECKPOINT_SUBSCRIBER, queue, name, lambda s: s.checkpoint_subscriber(queue, name, offsets)
        )

    async def list_subscribers(self, queue: str | None = None) -> list[SubscriberInfo]:
        """Every broker's subscribers (of ``queue``, or of every queue), each once."""
        if self._gate.stale:
            await self.refresh(time.monotonic() + self.request_timeout_s)
        table = self._table
        answers = await self._ask_leaders(sorted(table.brokers), lambda s: s.list_subscribers(queue), strict=False)
        if not answers:
            return await self._home.list_subscribers(queue)
        return merge_subscribers(answers, table.metadata.subscriber_coordinator)
