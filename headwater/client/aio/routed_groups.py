"""The consumer-group calls of :class:`~headwater.client.aio.routing.AsyncRoutedService`,
the twin of :mod:`headwater.client.transport.routed_groups` (read it for the rules)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from headwater.client.aio.service import AsyncService
from headwater.client.core.routing import (
    COORDINATED_CALLS,
    HOME,
    REFRESH,
    RefreshGate,
    RoutedCall,
    RoutingTable,
    coordinated_by,
    merge_groups,
)
from headwater.errors import HeadwaterError
from headwater.model.cluster import BrokerAddress
from headwater.model.groups import GroupSummary
from headwater.model.service import BrokerService
from headwater.protocol import messages as m

__all__ = ["AsyncRoutedGroupCalls"]

T = TypeVar("T")


class AsyncRoutedGroupCalls:
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

    async def _coordinated(
        self,
        api: m.ApiKey,
        locate: Callable[[RoutingTable], BrokerAddress | None],
        call: Callable[[AsyncService], Awaitable[T]],
    ) -> T:
        """``call`` on the service of the coordinator ``locate`` finds, sent again as
        ``RoutedService._coordinated`` sends it (a refresh waits out the rate limit)."""
        deadline = time.monotonic() + self.request_timeout_s
        decide = RoutedCall(m.API_SPECS[api].resend is m.Resend.SAFE)
        while True:
            where = decide.coordinator(self._table, self._gate.stale, locate, late=time.monotonic() >= deadline)
            if where is REFRESH:
                self._gate.mark_stale()
                await self.refresh(deadline)
                continue
            try:
                return await call(self._home if where is HOME else await self._link(where))
            except HeadwaterError as e:
                if decide.stales(e):
                    self._gate.mark_stale()
                if not decide.again(e, where, late=time.monotonic() >= deadline):
                    raise

    async def list_groups(self) -> list[GroupSummary]:
        """Every broker's groups, each once (a consumer group as its coordinator lists it)."""
        if self._gate.stale:
            await self.refresh(time.monotonic() + self.request_timeout_s)
        table = self._table
        answers = await self._ask_leaders(sorted(table.brokers), lambda s: s.list_groups(), strict=False)
        if not answers:
            return await self._home.list_groups()
        return merge_groups(answers, table.metadata.coordinator, table.metadata.keyed_coordinator)


def _to_coordinator(api: m.ApiKey) -> Callable[..., Any]:
    """The routed method of a coordinated call (see ``coordinated_by``)."""
    name = m.API_SPECS[api].method
    assert name is not None

    async def call(self: AsyncRoutedGroupCalls, *args: Any, **kwargs: Any) -> Any:
        _, locate = coordinated_by(api, args, kwargs)
        return await self._coordinated(api, locate, lambda s: getattr(s, name)(*args, **kwargs))

    call.__name__ = call.__qualname__ = name
    call.__doc__ = getattr(BrokerService, name).__doc__
    return call


for _api in COORDINATED_CALLS:
    setattr(AsyncRoutedGroupCalls, m.API_SPECS[_api].method or "", _to_coordinator(_api))
