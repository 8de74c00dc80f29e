"""Bodies of delayed messages: cancel one, the schedule's statistics."""

from __future__ import annotations

from headwater.model.delay import DelayStats
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
