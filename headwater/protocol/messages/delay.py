"""Bodies of delayed messages: cancel one, the schedule's statistics; and, between the
brokers of a cluster, the hand-off of a moving partition's delayed messages."""

from __future__ import annotations

from headwater.model.delay import DelayStats, HandoffPage
from headwater.protocol.messages.base import ApiKey, RequestBody, ResponseBody, _NoResult


class CancelDelayedRequest(RequestBody, frozen=True, array_like=True):
    """Cancel one delayed message not delivered yet, named by its delayed id (the partition
    field has its high bit set). Cancelling twice is not an error; an unknown id, or a
    message already delivered, is ``MessageNotFoundError``."""

    api = ApiKey.CANCEL_DELAYED
    queue_id: int
    partition: int
    offset: int


class CancelDelayedResponse(_NoResult, frozen=True, array_like=True):
    api = ApiKey.CANCEL_DELAYED


class DelayStatsRequest(RequestBody, frozen=True, array_like=True):
    """The schedule of delayed messages, deliveries and their lateness (``headwater delay stats``)."""

    api = ApiKey.DELAY_STATS


class DelayStatsResponse(ResponseBody, frozen=True, array_like=True):
    api = ApiKey.DELAY_STATS
    stats: DelayStats

    def result(self) -> DelayStats:
        return self.stats

    @classmethod
    def from_result(cls, value: DelayStats) -> ResponseBody:
        return cls(value)


class HandoffDelayedRequest(RequestBody, frozen=True, array_like=True):
    """Broker to broker (a move's target to its source, docs/design/delay.md "On a
    cluster"): the delayed batches of ``queue``'s ``partition`` the source accepted after
    ``after`` (an ``accept_seq``; -1: from the first), about ``max_bytes`` of them. The source answers only
    once it has fenced the partition for the move planned at ``leader_epoch``; before,
    ``NotLeaderError`` (ask again). Clients never send it.

    ``shared``: the shared groups' state of the partition instead (docs/design/cluster.md,
    "Moves"), one :class:`~headwater.model.shared.HandedOffShared` per group, by group name,
    from the one after index ``after`` (-1: from the first); same fence, same epoch rule.
    ``groups``: of a coordinator queue's partition, the membership of its consumer groups
    (one :class:`~headwater.model.groups.HandedOffGroup` each, by name, from the one after
    index ``after``), so their members go on at the new coordinator without joining again.

    One request for every kind of a partition's state, not a key each: they differ only in
    what the page holds."""

    api = ApiKey.HANDOFF_DELAYED
    queue: str
    partition: int
    leader_epoch: int
    after: int
    max_bytes: int
    shared: bool = False
    groups: bool = False


class HandoffDelayedResponse(ResponseBody, frozen=True, array_like=True):
    api = ApiKey.HANDOFF_DELAYED
    page: HandoffPage

    def result(self) -> HandoffPage:
        return self.page

    @classmethod
    def from_result(cls, value: HandoffPage) -> ResponseBody:
        return cls(value)
