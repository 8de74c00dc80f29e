"""Bodies of shared groups: receive (leases), ack, nack, extend, describe."""

from __future__ import annotations

from headwater.model.shared import LeaseRefusal, SharedDeliveries, SharedGroupInfo, SharedLease
from headwater.protocol.messages.base import ApiKey, RequestBody, ResponseBody


class SharedReceiveRequest(RequestBody, frozen=True, array_like=True):
    """Lease up to ``max_messages`` of ``queue`` from any partition to ``member`` of the
    shared ``group``; ``settings`` (SharedGroupSettings names) become the group's. When none
    can be had the server may hold the request up to ``max_wait_ms`` (long polling)."""

    api = ApiKey.SHARED_RECEIVE
    group: str
    queue: str
    member: str
    max_messages: int
    visibility_timeout_ms: int
    at_most_once: bool = False
    settings: dict[str, int | float] = {}
    max_wait_ms: int = 0


class SharedReceiveResponse(ResponseBody, frozen=True, array_like=True):
    api = ApiKey.SHARED_RECEIVE
    batches: list[bytes]  # data section: stored batches holding the leased messages
    leases: list[SharedLease]
    led: list[int] | None = None  # on a cluster: the queue's partitions this broker leads now

    def result(self) -> SharedDeliveries:
        return SharedDeliveries(list(self.batches), list(self.leases), self.led)

    @classmethod
    def from_result(cls, value: SharedDeliveries) -> ResponseBody:
        return cls(list(value.batches), list(value.leases), value.led)


class _LeaseRefusals(ResponseBody, frozen=True, array_like=True):
    refused: list[LeaseRefusal]  # the leases not acted on; the rest were

    def result(self) -> list[LeaseRefusal]:
        return list(self.refused)

    @classmethod
    def from_result(cls, value: list[LeaseRefusal]) -> ResponseBody:
        return cls(list(value))


class SharedAckRequest(RequestBody, frozen=True, array_like=True):
    api = ApiKey.SHARED_ACK
    group: str
    queue: str
    member: str
    lease_ids: list[str]


class SharedAckResponse(_LeaseRefusals, frozen=True, array_like=True):
    api = ApiKey.SHARED_ACK


class SharedNackRequest(RequestBody, frozen=True, array_like=True):
    api = ApiKey.SHARED_NACK
    group: str
    queue: str
    member: str
    lease_ids: list[str]
    reason: str = ""
    delay_ms: int | None = None  # None: the group's backoff


class SharedNackResponse(_LeaseRefusals, frozen=True, array_like=True):
    api = ApiKey.SHARED_NACK


class SharedExtendRequest(RequestBody, frozen=True, array_like=True):
    api = ApiKey.SHARED_EXTEND
    group: str
    queue: str
    member: str
    lease_ids: list[str]
    visibility_timeout_ms: int


class SharedExtendResponse(_LeaseRefusals, frozen=True, array_like=True):
    api = ApiKey.SHARED_EXTEND


class SharedDescribeRequest(RequestBody, frozen=True, array_like=True):
    api = ApiKey.SHARED_DESCRIBE
    group: str
    queue: str


class SharedDescribeResponse(ResponseBody, frozen=True, array_like=True):
    api = ApiKey.SHARED_DESCRIBE
    info: SharedGroupInfo

    def result(self) -> SharedGroupInfo:
        return self.info

    @classmethod
    def from_result(cls, value: SharedGroupInfo) -> ResponseBody:
        return cls(value)
