"""list_subscribers of :class:`~headwater.client.aio.routing.AsyncRoutedService`, the
twin of :mod:`headwater.client.transport.routed_subscribers` (read it for the rules)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from headwater.client.aio.service import AsyncService
from headwater.client.core.routing import RefreshGate, RoutingTable
from headwater.client.core.subscribers import merge_subscribers
from headwater.errors import UnavailableError
from headwater.model.subscription import SubscriberInfo

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
        async def _link(self, address: str) -> AsyncService: ...
        async def _ask_leaders(
            self, brokers: list[int], ask: Callable[[AsyncService], Awaitable[Any]], *, strict: bool
        ) -> dict[int, Any]: ...

    async def stream_table(self, queue: str, fresh: bool = False) -> RoutingTable:
        """The table a subscriber plans its push streams by (see the sync twin's)."""
        if fresh or self._gate.stale or not self._table.knows(queue):
            self._gate.mark_stale()
            return await self.refresh(time.monotonic() + self.request_timeout_s)
        return self._table

    async def broker_link(self, broker_id: int) -> AsyncService:
        """The connection to broker ``broker_id`` of the table (opened if none is)."""
        broker = self._table.brokers.get(broker_id)
        if broker is None:
            self._gate.mark_stale()
            raise UnavailableError(f"broker {broker_id} is not in the cluster's metadata now")
        return await self._link(broker.address)

    async def list_subscribers(self, queue: str | None = None) -> list[SubscriberInfo]:
        """Every broker's subscribers (of ``queue``, or of every queue), each once."""
        if self._gate.stale:
            await self.refresh(time.monotonic() + self.request_timeout_s)
        table = self._table
        answers = await self._ask_leaders(sorted(table.brokers), lambda s: s.list_subscribers(queue), strict=False)
        if not answers:
            return await self._home.list_subscribers(queue)
        return merge_subscribers(answers, table.metadata.subscriber_coordinator)
