"""The coordinated calls of :class:`~headwater.client.transport.routing.RoutedService`
(docs/design/cluster.md, "Coordinators follow partitions"): a consumer group's join,
heartbeat, leave, describe, commit_offsets and fetch_offsets, a keyed group's keyed_group,
keyed_commit and keyed_resize, and a subscriber's add, delete, describe and checkpoint go to
its coordinator, found in the routing table (``COORDINATED_CALLS`` and ``coordinated_by`` in
:mod:`headwater.client.core.routing`). After a :class:`~headwater.errors.NotCoordinatorError`,
or the coordinator out of reach for a call safe to send twice, the table is asked for again
and the call sent again within its deadline, as
:class:`~headwater.client.core.routing.RoutedCall` decides. A table that names no
coordinators (an older broker) sends them to the bootstrap broker. list_groups asks every
broker and merges the answers, each group once.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

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
        locate: Callable[[RoutingTable], BrokerAddress | None],
        call: Callable[[RemoteService], T],
    ) -> T:
        """``call`` on the connection of the coordinator ``locate`` finds, sent again (within the
        call's deadline, the table asked for again first) as :class:`RoutedCall` says."""
        deadline = time.monotonic() + self.request_timeout_s
        decide = RoutedCall(m.API_SPECS[api].resend is m.Resend.SAFE)
        while True:
            where = decide.coordinator(self._table, self._gate.stale, locate, late=time.monotonic() >= deadline)
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
    """The routed method of a coordinated call (see ``coordinated_by``)."""
    name = m.API_SPECS[api].method
    assert name is not None

    def call(self: RoutedGroupCalls, *args: Any, **kwargs: Any) -> Any:
        _, locate = coordinated_by(api, args, kwargs)
        return self._coordinated(api, locate, lambda s: getattr(s, name)(*args, **kwargs))

    call.__name__ = call.__qualname__ = name
    call.__doc__ = getattr(BrokerService, name).__doc__
    return call


for _api in COORDINATED_CALLS:
    setattr(RoutedGroupCalls, m.API_SPECS[_api].method or "", _to_coordinator(_api))
