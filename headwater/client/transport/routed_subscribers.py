"""list_subscribers of :class:`~headwater.client.transport.routing.RoutedService`
(docs/design/cluster.md, "Subscriptions (built)"): it asks every broker and merges
(:func:`~headwater.client.core.subscribers.merge_subscribers`). A subscriber's add, delete,
describe and checkpoint go to its coordinator
(:mod:`~headwater.client.transport.routed_groups`). A routed service opens no push stream:
the subscriber pulls from each partition's leader.
"""

from __future__ import annotations

import concurrent.futures
import time
from typing import TYPE_CHECKING, Any, TypeVar

from headwater.client.core.routing import RefreshGate, RoutingTable
from headwater.client.core.subscribers import merge_subscribers
from headwater.client.transport.remote import RemoteService
from headwater.model.subscription import SubscriberInfo
from headwater.protocol import messages as m

__all__ = ["RoutedSubscriberCalls"]

T = TypeVar("T")


class RoutedSubscriberCalls:
    """A mixin of :class:`~headwater.client.transport.routing.RoutedService`, which gives
    what is declared below."""

    if TYPE_CHECKING:
        request_timeout_s: float
        _home: RemoteService
        _gate: RefreshGate
        _table: RoutingTable

        def refresh(self, deadline: float | None = None) -> RoutingTable: ...
        def _ask_leaders(
            self, brokers: list[int], body: m.RequestBody
        ) -> dict[int, concurrent.futures.Future[Any]]: ...
        def _answers(self, asked: dict[int, concurrent.futures.Future[Any]], *, strict: bool) -> dict[int, Any]: ...

    def list_subscribers(self, queue: str | None = None) -> list[SubscriberInfo]:
        """Every broker's subscribers (of ``queue``, or of every queue), each once."""
        if self._gate.stale:
            self.refresh(time.monotonic() + self.request_timeout_s)
        table = self._table
        asked = self._ask_leaders(sorted(table.brokers), m.ListSubscribersRequest(queue))
        answers = self._answers(asked, strict=False)
        if not answers:
            return self._home.list_subscribers(queue)
        return merge_subscribers(answers, table.metadata.subscriber_coordinator)
