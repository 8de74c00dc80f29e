"""AsyncSharedRouter: the receives of shared groups on a cluster, for
:class:`~headwater.client.aio.routing.AsyncRoutedService`: the blocking
:class:`~headwater.client.transport.shared_routing.SharedRouter`'s rounds, with asyncio's
futures, a task per request, and a receive that never waits for a refresh. Used from
one event loop."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

from headwater.client.transport.remote import call_arguments
from headwater.client.transport.shared_routing import SharedRouter
from headwater.model.shared import SharedDeliveries
from headwater.protocol import messages as m

__all__ = ["AsyncSharedRouter"]


class AsyncSharedRouter(SharedRouter):
    """The shared-group receives of one AsyncRoutedService."""

    def __init__(self, service: Any) -> None:
        super().__init__(service)
        self._tasks: set[asyncio.Future[Any]] = set()  # the receives and refreshes under way

    def _spawn(self, aw: Awaitable[Any]) -> asyncio.Future[Any]:
        task = asyncio.ensure_future(aw)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _new_future(self) -> asyncio.Future[Any]:
        return asyncio.get_running_loop().create_future()

    def _send(self, address: str, body: m.SharedReceiveRequest) -> asyncio.Future[Any]:
        return self._spawn(self._ask(address, body))

    async def _ask(self, address: str, body: m.SharedReceiveRequest) -> SharedDeliveries:
        link = await self._service._link(address)
        args, kwargs = call_arguments(body)
        result: SharedDeliveries = await link.start_shared_receive(*args, **kwargs)
        return result

    def _addresses(self, queue: str) -> list[str]:
        """By the table in use; one that does not know ``queue`` yet: the bootstrap
        broker, the table refreshed meanwhile (a receive never waits for it)."""
        s = self._service
        table = s.table
        if s._gate.stale or not table.knows(queue):
            s._gate.mark_stale()
            self._spawn(s.refresh(s._deadline()))
        elif table.leaderless(queue):  # see SharedRouter._addresses: a refresh, rate limited
            s._gate.mark_stale()
            s._refresh_soon()
        return sorted({table.brokers[b].address for b in table.leaders_of(queue)}) or [s.address]

    async def receive(self, body: m.SharedReceiveRequest) -> SharedDeliveries:
        """A receive that waits for its answer."""
        fut = self.start_receive(body)
        timeout_s = self._service.request_timeout_s + body.max_wait_ms / 1000
        done, _ = await asyncio.wait([fut], timeout=timeout_s)
        if not done:
            self.withdraw(fut)  # answered empty, unless its answer came meanwhile
        return await fut
