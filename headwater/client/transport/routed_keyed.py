"""The keyed reads of :class:`~headwater.client.transport.routing.RoutedService`
(docs/design/cluster.md, "Keyed groups (built)"): keyed_fetch goes to the partition's
leader, as fetch does, which filters the member's messages there. A keyed group's
keyed_group, keyed_commit and keyed_resize go to its coordinator
(:mod:`~headwater.client.transport.routed_groups`).
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from headwater.client.transport.remote import RemoteService
from headwater.client.transport.send_future import LazyFuture
from headwater.errors import UnavailableError
from headwater.model.keyed import KeyedFetchResult
from headwater.protocol import messages as m

__all__ = ["RoutedKeyedCalls"]

T = TypeVar("T")


class RoutedKeyedCalls:
    """A mixin of :class:`~headwater.client.transport.routing.RoutedService`, which gives
    what is declared below."""

    if TYPE_CHECKING:

        def leader_link_nowait(self, queue: str, partition: int) -> RemoteService: ...
        def _watch(self, fut: concurrent.futures.Future[Any]) -> None: ...
        def _routed(
            self, api: m.ApiKey, queue: str, partition: int, call: Callable[[RemoteService], T], wait_s: float = 0.0
        ) -> T: ...

    def keyed_fetch(
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
        return self._routed(
            m.ApiKey.KEYED_FETCH,
            queue,
            partition,
            lambda s: s.keyed_fetch(
                queue, group, member, generation, partition, offset, max_bytes=max_bytes, max_wait_ms=max_wait_ms
            ),
            max_wait_ms / 1000,
        )

    def keyed_fetch_async(
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
        lead: bool = False,
    ) -> concurrent.futures.Future[KeyedFetchResult]:
        """A keyed fetch from the partition's leader without waiting (never ``lead``, as
        ``RoutedService.fetch_async``); a refusal marks the table stale and is the answer."""
        try:
            link = self.leader_link_nowait(queue, partition)
        except UnavailableError as e:
            failed: concurrent.futures.Future[KeyedFetchResult] = LazyFuture()
            failed.set_exception(e)  # a read's error, ridden out as a lost connection's
            return failed
        fut = link.keyed_fetch_async(
            queue, group, member, generation, partition, offset, max_bytes=max_bytes, max_wait_ms=max_wait_ms
        )
        fut.add_done_callback(self._watch)
        return fut
