"""The consumer-group calls of :class:`~headwater.client.transport.routing.RoutedService`
(docs/design/cluster.md, "Coordinators follow partitions"): a group's join, heartbeat,
leave, describe, commit_offsets and fetch_offsets go to its coordinator, found in the
routing table; after a :class:`~headwater.errors.NotCoordinatorError`, or the coordinator
out of reach for a call safe to send twice, the table is asked for again and the call sent
again within its deadline, as :class:`~headwater.client.core.routing.RoutedCall`
decides. A table that names no coordinators (an older broker) sends them to the bootstrap
broker. list_groups asks every broker and merges the answers, each group once.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from headwater.client.core.routing import (
    GROUP_CALLS,
    HOME,
    REFRESH,
    RefreshGate,
    RoutedCall,
    RoutingTable,
    merge_groups,
)
from headwater.client.transport.remote import RemoteService
from headwater.errors import HeadwaterError
from headwater.model.cluster import BrokerAddress
from headwater.model.groups import GroupSummary
from headwater.model.service import BrokerService
from headwater.protocol import messages as m

__all__ = ["RoutedGroupCalls"]

T = TypeVar("T")


class RoutedGroupCalls:
    """A mixin of :class:`~headwater.client.transport.routing.RoutedService`, which gives
    what is declared below."""

    if TYPE_CHECKING:
        request_timeout_s: float
        _home: RemoteService
        _gate: RefreshGate
        _table: RoutingTable

        def refresh(self, deadline: float | None = None) -> RoutingTable: ...
        def _link(self, address: str) -> RemoteService: ...
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
    ) -> T:
        """``call`` on the connection of ``group``'s coordinator, sent again (within the
        call's deadline, the table asked for again first) as :class:`RoutedCall` says."""
        deadline = time.monotonic() + self.request_timeout_s
        decide = RoutedCall(m.API_SPECS[api].resend is m.Resend.SAFE)
        while True:
            where = decide.coordinator(self._table, self._gate.stale, group, locate, late=time.monotonic() >= deadline)
            if where is REFRESH:
                self._gate.mark_stale()
                self.refresh(deadline)
                continue
            try:
                return call(self._home if where is HOME else self._link(where))
            except HeadwaterError as e:
                if decide.stales(e):
                    self._gate.mark_stale()
                if not decide.again(e, where, late=time.monotonic() >= deadline):
                    raise

    def list_groups(self) -> list[GroupSummary]:
        """Every broker's groups, each once (a consumer group as its coordinator lists it)."""
        if self._gate.stale:
            self.refresh(time.monotonic() + self.request_timeout_s)
        table = self._table
        answers = self._answers(self._ask_leaders(sorted(table.brokers), m.ListGroupsRequest()), strict=False)
        if not answers:
            return self._home.list_groups()
        return merge_groups(answers, table.metadata.coordinator, table.metadata.keyed_coordinator)


def _to_coordinator(api: m.ApiKey) -> Callable[..., Any]:
    """The routed method of a consumer-group call (the group is its first argument)."""
    name = m.API_SPECS[api].method
    assert name is not None

    def call(self: RoutedGroupCalls, *args: Any, **kwargs: Any) -> Any:
        group = args[0] if args else kwargs["group"]
        return self._coordinated(api, group, lambda s: getattr(s, name)(*args, **kwargs))

    call.__name__ = call.__qualname__ = name
    call.__doc__ = getattr(BrokerService, name).__doc__
    return call


for _api in GROUP_CALLS:
    setattr(RoutedGroupCalls, m.API_SPECS[_api].method or "", _to_coordinator(_api))
