"""list_subscribers of :class:`~headwater.client.transport.routing.RoutedService`
(docs/design/cluster.md, "Subscriptions (built)"): it asks every broker and merges
(:func:`~headwater.client.core.subscribers.merge_subscribers`). A subscriber's add, delete,
describe and checkpoint go to its coordinator
(:mod:`~headwater.client.transport.routed_groups`), and so does its claim (CLAIM_SUBSCRIBER,
the epoch). A subscriber process opens one push stream per partition leader
(:mod:`headwater.client.common.cluster_push`), on the connection :meth:`broker_link` gives,
planned by the table :meth:`stream_table` gives.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, TypeVar

from headwater.client.core.routing import RefreshGate, RoutingTable
from headwater.client.core.subscribers import StreamPlan, merge_subscribers, plan_partitions
from headwater.client.transport.remote import RemoteService
from headwater.errors import UnavailableError
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
        def _refresh_soon(self) -> None: ...
        def _link(self, address: str) -> RemoteService: ...
        def _ask_leaders(
            self, brokers: list[int], body: m.RequestBody
        ) -> dict[int, concurrent.futures.Future[Any]]: ...
        def _answers(self, asked: dict[int, concurrent.futures.Future[Any]], *, strict: bool) -> dict[int, Any]: ...

    def stream_table(self, queue: str, fresh: bool = False) -> RoutingTable:
        """The table a subscriber plans its push streams by: asked for again first when
        ``fresh`` (a stream was refused or lost), stale, or when it does not know ``queue``."""
        if fresh or self._gate.stale or not self._table.knows(queue):
            self._gate.mark_stale()
            return self.refresh(time.monotonic() + self.request_timeout_s)
        return self._table

    def fetch_stream_plan(self, queue: str, partitions: Iterable[int], fresh: bool = False) -> StreamPlan:
        """Which broker is to stream which of ``partitions`` of ``queue`` (each by its
        leader), and those no live broker leads now, by the table as it is: without waiting
        (a consumer's poll keeps its timeout), a refresh nobody waits for is started when
        ``fresh`` (a stream was refused or lost), when the table is stale, or when it does
        not know ``queue``; the consumer plans again after it."""
        if fresh or self._gate.stale or not self._table.knows(queue):
            self._gate.mark_stale()
            self._refresh_soon()
        return plan_partitions(self._table, queue, partitions)

    def broker_link(self, broker_id: int) -> RemoteService:
        """The connection to broker ``broker_id`` of the table (opened if none is), for a
        push stream of the partitions it leads; UnavailableError if it is out of reach."""
        broker = self._table.brokers.get(broker_id)
        if broker is None:
            self._gate.mark_stale()
            raise UnavailableError(f"broker {broker_id} is not in the cluster's metadata now")
        return self._link(broker.address)

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
