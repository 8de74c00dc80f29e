"""The keyed-group calls of :class:`~headwater.client.aio.routing.AsyncRoutedService`, the
twin of :mod:`headwater.client.transport.routed_keyed` (read it for the rules)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

from headwater.client.aio.service import AsyncService
from headwater.client.core.routing import RoutingTable
from headwater.model.cluster import BrokerAddress
from headwater.model.keyed import KeyedFetchResult, KeyedGroupInfo
from headwater.protocol import messages as m

__all__ = ["AsyncRoutedKeyedCalls"]

T = TypeVar("T")


class AsyncRoutedKeyedCalls:
    """A mixin of :class:`~headwater.client.aio.routing.AsyncRoutedService`, which gives
    what is declared below."""

    if TYPE_CHECKING:

        async def _routed(
            self,
            api: m.ApiKey,
            queue: str,
            partition: int,
            call: Callable[[AsyncService], Awaitable[T]],
            wait_s: float = 0.0,
        ) -> T: ...
        async def _coordinated(
            self,
            api: m.ApiKey,
            group: str,
            call: Callable[[AsyncService], Awaitable[T]],
            locate: Callable[[RoutingTable], BrokerAddress | None] | None = None,
        ) -> T: ...

    async def _keyed(self, api: m.ApiKey, queue: str, group: str, call: Callable[[AsyncService], Awaitable[T]]) -> T:
        return await self._coordinated(api, group, call, lambda table: table.keyed_coordinator(queue, group))

    async def keyed_group(
        self, queue: str, group: str, key: str | None = None, size: int | None = None, start: str = "earliest"
    ) -> KeyedGroupInfo:
        return await self._keyed(
            m.ApiKey.KEYED_GROUP, queue, group, lambda s: s.keyed_group(queue, group, key, size, start)
        )

    async def keyed_commit(
        self, queue: str, group: str, member: int, generation: int, offsets: dict[int, int]
    ) -> KeyedGroupInfo:
        return await self._keyed(
            m.ApiKey.KEYED_COMMIT, queue, group, lambda s: s.keyed_commit(queue, group, member, generation, offsets)
        )

    async def keyed_resize(self, queue: str, group: str, size: int) -> KeyedGroupInfo:
        return await self._keyed(m.ApiKey.KEYED_RESIZE, queue, group, lambda s: s.keyed_resize(queue, group, size))

    async def keyed_fetch(
        self,
        queue: str,
        group: str,
        member: int,
        generation: int,
        partition: int,
        offset: int,
        *,
        max_bytes: int,
        max_wait_ms: int = 0,
    ) -> KeyedFetchResult:
        return await self._routed(
            m.ApiKey.KEYED_FETCH,
            queue,
            partition,
            lambda s: s.keyed_fetch(
                queue, group, member, generation, partition, offset, max_bytes=max_bytes, max_wait_ms=max_wait_ms
            ),
            max_wait_ms / 1000,
        )
