"""The subscriber calls of :class:`~headwater.client.transport.routing.RoutedService`
(docs/design/cluster.md, "Subscriptions (built)"): add, delete, describe and checkpoint go
to the subscriber's coordinator
(:meth:`~headwater.client.core.routing.RoutingTable.subscriber_coordinator`), sent again
after a :class:`~headwater.errors.NotCoordinatorError` as a consumer group's calls are;
list_subscribers asks every broker and merges (:func:`~headwater.client.core.subscribers.merge_subscribers`).
A table that names no subscriber coordinators sends them to the bootstrap broker (an
older broker; or the cluster's first subscriber call, which makes the queue). A routed
service opens no push stream: the subscriber pulls from each partition's leader.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from headwater.client.core.routing import RefreshGate, RoutingTable
from headwater.client.core.subscribers import merge_subscribers
from headwater.client.transport.remote import RemoteService
from headwater.model.cluster import BrokerAddress
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
        def _coordinated(
            self,
            api: m.ApiKey,
            group: str,
            call: Callable[[RemoteService], T],
            locate: Callable[[RoutingTable], BrokerAddress | None] | None = None,
        ) -> T: ...

    def _subscriber(self, api: m.ApiKey, queue: str, name: str, call: Callable[[RemoteService], T]) -> T:
        return self._coordinated(api, name, call, lambda table: table.subscriber_coordinator(queue, name))

    def add_subscriber(
        self,
        queue: str,
        name: str,
        partitions: list[int] | None = None,
        tags: list[str] | None = None,
        start: str = "latest",
    ) -> SubscriberInfo:
        return self._subscriber(
            m.ApiKey.ADD_SUBSCRIBER, queue, name, lambda s: s.add_subscriber(queue, name, partitions, tags, start)
        )

    def delete_subscriber(self, queue: str, name: str) -> None:
        self._subscriber(m.ApiKey.DELETE_SUBSCRIBER, queue, name, lambda s: s.delete_subscriber(queue, name))

    def describe_subscriber(self, queue: str, name: str) -> SubscriberInfo:
        return self._subscriber(m.ApiKey.DESCRIBE_SUBSCRIBER, queue, name, lambda s: s.describe_subscriber(queue, name))

    def checkpoint_subscriber(self, queue: str, name: str, offsets: dict[int, int]) -> None:
        self._subscriber(
            m.ApiKey.CHECKPOINT_SUBSCRIBER, queue, name, lambda s: s.checkpoint_subscriber(queue, name, offsets)
        )

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
