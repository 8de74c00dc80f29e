"""The consumer-group calls of :class:`~headwater.client.transport.routing.RoutedService`
(docs/design/cluster.md, "Coordinators follow partitions"): a group's join, heartbeat,
leave, describe, commit_offsets and fetch_offsets go to its coordinator, found in the
routing table; after a :class:`~headwater.errors.NotCoordinatorError`, or the coordinator
out of reach for a call safe to send twice, the table is asked for again and the call sent
again within its deadline, as :class:`~headwater.client.core.routing.CoordinatorCall`
decides. A table that names no coordinators (an older broker) sends them to the bootstrap
broker. list_groups asks every broker and merges the answers, each group once.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from headwater.client.core.routing import CoordinatorCall, RefreshGate, RoutingTable, merge_groups
from headwater.client.transport.remote import RemoteService
from headwater.errors import OutcomeUnknownError, UnavailableError
from headwater.model.cluster import BrokerAddress
from headwater.model.groups import GroupAssignment, GroupDescription, GroupSummary
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
        call's deadline, the table asked for again first) as :class:`CoordinatorCall` says."""
        deadline = time.monotonic() + self.request_timeout_s
        decide = CoordinatorCall(m.API_SPECS[api].resend is m.Resend.SAFE)
        while True:
            table = self.refresh(deadline) if self._gate.stale else self._table
            address: str | None = None
            try:
                where = table.coordinator(group) if locate is None else locate(table)
                address = None if where is None else where.address
                return call(self._home if address is None else self._link(address))
            except OutcomeUnknownError:
                raise
            except UnavailableError as e:
                self._gate.mark_stale()
                if not decide.again(e, address, late=time.monotonic() >= deadline):
                    raise
            time.sleep(min(self._gate.wait_s(time.monotonic()), max(0.0, deadline - time.monotonic())))

    def join_group(
        self,
        group: str,
        member_id: str | None,
        client_id: str,
        queues: list[str],
        mode: str,
        strategy: str,
        session_timeout_ms: int,
    ) -> GroupAssignment:
        return self._coordinated(
            m.ApiKey.JOIN_GROUP,
            group,
            lambda s: s.join_group(group, member_id, client_id, queues, mode, strategy, session_timeout_ms),
        )

    def heartbeat_group(self, group: str, member_id: str, generation: int) -> GroupAssignment:
        return self._coordinated(
            m.ApiKey.HEARTBEAT_GROUP, group, lambda s: s.heartbeat_group(group, member_id, generation)
        )

    def leave_group(self, group: str, member_id: str) -> None:
        return self._coordinated(m.ApiKey.LEAVE_GROUP, group, lambda s: s.leave_group(group, member_id))

    def describe_group(self, group: str) -> GroupDescription:
        return self._coordinated(m.ApiKey.DESCRIBE_GROUP, group, lambda s: s.describe_group(group))

    def commit_offsets(
        self,
        group: str,
        queue: str,
        offsets: dict[int, int],
        member_id: str | None = None,
        generation: int | None = None,
    ) -> None:
        return self._coordinated(
            m.ApiKey.COMMIT_OFFSETS,
            group,
            lambda s: s.commit_offsets(group, queue, offsets, member_id, generation),
        )

    def fetch_offsets(self, group: str, queue: str) -> dict[int, int]:
        return self._coordinated(m.ApiKey.FETCH_OFFSETS, group, lambda s: s.fetch_offsets(group, queue))

    def list_groups(self) -> list[GroupSummary]:
        """Every broker's groups, each once (a consumer group as its coordinator lists it)."""
        if self._gate.stale:
            self.refresh(time.monotonic() + self.request_timeout_s)
        table = self._table
        answers = self._answers(self._ask_leaders(sorted(table.brokers), m.ListGroupsRequest()), strict=False)
        if not answers:
            return self._home.list_groups()
        return merge_groups(answers, table.metadata.coordinator, table.metadata.keyed_coordinator)
