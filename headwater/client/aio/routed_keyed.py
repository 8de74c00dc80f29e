"""The keyed reads of :class:`~headwater.client.aio.routing.AsyncRoutedService`, the
twin of :mod:`headwater.client.transport.routed_keyed` (read it for the rules)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

from headwater.client.aio.service import AsyncService
from headwater.model.keyed import KeyedFetchResult
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
