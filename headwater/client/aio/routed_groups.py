"""The consumer-group calls of :class:`~headwater.client.aio.routing.AsyncRoutedService`,
the twin of :mod:`headwater.client.transport.routed_groups` (read it for the rules)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from headwater.client.aio.service import AsyncService
from headwater.client.core.routing import CoordinatorCall, RefreshGate, RoutingTable, merge_groups
from headwater.errors import OutcomeUnknownError, UnavailableError
from headwater.model.cluster import BrokerAddress
from headwater.model.groups import GroupAssignment, GroupDescription, GroupSummary
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
        group: str,
        call: Callable[[AsyncService], Awaitable[T]],
        locate: Callable[[RoutingTable], BrokerAddress | None] | None = None,
    ) -> T:
        """``call`` on the service of ``group``'s coordinator, sent again as
        ``RoutedService._coordinated`` sends it (a refresh waits out the rate limit)."""
        deadline = time.monotonic() + self.request_timeout_s
        decide = CoordinatorCall(m.API_SPECS[api].resend is m.Resend.SAFE)
        while True:
            table = await self.refresh(deadline) if self._gate.stale else self._table
            address: str | None = None
            try:
                where = table.coordinator(group) if locate is None else locate(table)
                address = None if where is None else where.address
                return await call(self._home if address is None else await self._link(address))
            except OutcomeUnknownError:
                raise
            except UnavailableError as e:
                self._gate.mark_stale()
                if not decide.again(e, address, late=time.monotonic() >= deadline):
                    raise

    async def join_group(
        self,
        group: str,
        member_id: str | None,
        client_id: str,
        queues: list[str],
        mode: str,
        strategy: str,
        session_timeout_ms: int,
    ) -> GroupAssignment:
        return await self._coordinated(
            m.ApiKey.JOIN_GROUP,
            group,
            lambda s: s.join_group(group, member_id, client_id, queues, mode, strategy, session_timeout_ms),
        )

    async def heartbeat_group(self, group: str, member_id: str, generation: int) -> GroupAssignment:
        return await self._coordinated(
            m.ApiKey.HEARTBEAT_GROUP, group, lambda s: s.heartbeat_group(group, member_id, generation)
        )

    async def leave_group(self, group: str, member_id: str) -> None:
        return await self._coordinated(m.ApiKey.LEAVE_GROUP, group, lambda s: s.leave_group(group, member_id))

    async def describe_group(self, group: str) -> GroupDescription:
        return await self._coordinated(m.ApiKey.DESCRIBE_GROUP, group, lambda s: s.describe_group(group))

    async def commit_offsets(
        self,
        group: str,
        queue: str,
        offsets: dict[int, int],
        member_id: str | None = None,
        generation: int | None = None,
    ) -> None:
        return await self._coordinated(
            m.ApiKey.COMMIT_OFFSETS,
            group,
            lambda s: s.commit_offsets(group, queue, offsets, member_id, generation),
        )

    async def fetch_offsets(self, group: str, queue: str) -> dict[int, int]:
        return await self._coordinated(m.ApiKey.FETCH_OFFSETS, group, lambda s: s.fetch_offsets(group, queue))

    async def list_groups(self) -> list[GroupSummary]:
        """Every broker's groups, each once (a consumer group as its coordinator lists it)."""
        if self._gate.stale:
            await self.refresh(time.monotonic() + self.request_timeout_s)
        table = self._table
        answers = await self._ask_leaders(sorted(table.brokers), lambda s: s.list_groups(), strict=False)
        if not answers:
            return await self._home.list_groups()
        return merge_groups(answers, table.metadata.coordinator, table.metadata.keyed_coordinator)
