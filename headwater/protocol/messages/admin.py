"""Bodies of ping, queue administration (create, describe, list, delete, truncate, enable,
add partitions), the broker's status and metrics, and the cluster's metadata (where each partition is)."""

from __future__ import annotations

from typing import Any

from headwater.model.cluster import ClusterMetadata, PartitionMove
from headwater.model.config import QueueConfig, QueueInfo, QueuePage
from headwater.model.service import MetricsExposition
from headwater.protocol.messages.base import ApiKey, RequestBody, ResponseBody, _NoResult


class _QueueInfoResult(ResponseBody, frozen=True, array_like=True):
    queue: QueueInfo

    def result(self) -> QueueInfo:
        return self.queue

    @classmethod
    def from_result(cls, value: QueueInfo) -> ResponseBody:
        return cls(value)


class PingRequest(RequestBody, frozen=True, array_like=True):
    api = ApiKey.PING


class PingResponse(_NoResult, frozen=True, array_like=True):
    api = ApiKey.PING


class CreateQueueRequest(RequestBody, frozen=True, array_like=True):
    api = ApiKey.CREATE_QUEUE
    name: str
    config: QueueConfig


class CreateQueueResponse(_QueueInfoResult, frozen=True, array_like=True):
    api = ApiKey.CREATE_QUEUE


class DescribeQueueRequest(RequestBody, frozen=True, array_like=True):
    api = ApiKey.DESCRIBE_QUEUE
    name: str


class DescribeQueueResponse(_QueueInfoResult, frozen=True, array_like=True):
    api = ApiKey.DESCRIBE_QUEUE


class ListQueuesRequest(RequestBody, frozen=True, array_like=True):
    api = ApiKey.LIST_QUEUES
    after: str | None = None  # list the queues named after this one (the last page's next_after)
    partitions_max: int = 0  # partitions on one page at the most; 0: the server's page size


class ListQueuesResponse(ResponseBody, frozen=True, array_like=True):
    api = ApiKey.LIST_QUEUES
    queues: list[QueueInfo]
    next_after: str | None = None  # None: the last page

    def result(self) -> QueuePage:
        return QueuePage(list(self.queues), self.next_after)

    @classmethod
    def from_result(cls, value: QueuePage) -> ResponseBody:
        return cls(list(value.queues), value.next_after)


class DeleteQueueRequest(RequestBody, frozen=True, array_like=True):
    api = ApiKey.DELETE_QUEUE
    name: str


class DeleteQueueResponse(_NoResult, frozen=True, array_like=True):
    api = ApiKey.DELETE_QUEUE


class TruncateQueueRequest(RequestBody, frozen=True, array_like=True):
    api = ApiKey.TRUNCATE_QUEUE
    name: str


class TruncateQueueResponse(_QueueInfoResult, frozen=True, array_like=True):
    api = ApiKey.TRUNCATE_QUEUE


class SetQueueEnabledRequest(RequestBody, frozen=True, array_like=True):
    api = ApiKey.SET_QUEUE_ENABLED
    name: str
    enabled: bool


class SetQueueEnabledResponse(_QueueInfoResult, frozen=True, array_like=True):
    api = ApiKey.SET_QUEUE_ENABLED


class AddPartitionsRequest(RequestBody, frozen=True, array_like=True):
    api = ApiKey.ADD_PARTITIONS
    name: str
    partitions: int


class AddPartitionsResponse(_QueueInfoResult, frozen=True, array_like=True):
    api = ApiKey.ADD_PARTITIONS


class AlterQueueRequest(RequestBody, frozen=True, array_like=True):
    """Change a queue's ``ttl_s``, ``message_bytes_max`` or ``flush``: the keys of
    ``changes`` (``ttl_s`` None: keep forever; ``flush`` None: the store's default)."""

    api = ApiKey.ALTER_QUEUE
    name: str
    changes: dict[str, int | str | None]


class AlterQueueResponse(_QueueInfoResult, frozen=True, array_like=True):
    api = ApiKey.ALTER_QUEUE


class StatusRequest(RequestBody, frozen=True, array_like=True):
    """Facts about the broker for operators (``headwater status``)."""

    api = ApiKey.STATUS


class StatusResponse(ResponseBody, frozen=True, array_like=True):
    api = ApiKey.STATUS
    status: dict[str, Any]

    def result(self) -> dict[str, Any]:
        return dict(self.status)

    @classmethod
    def from_result(cls, value: dict[str, Any]) -> ResponseBody:
        return cls(dict(value))


class MetricsRequest(RequestBody, frozen=True, array_like=True):
    """The broker's metrics in the Prometheus text exposition format (``headwater metrics``)."""

    api = ApiKey.METRICS


class MetricsResponse(ResponseBody, frozen=True, array_like=True):
    api = ApiKey.METRICS
    text: str
    content_type: str  # the HTTP Content-Type a scrape endpoint serves ``text`` with

    def result(self) -> MetricsExposition:
        return MetricsExposition(self.text, self.content_type)

    @classmethod
    def from_result(cls, value: MetricsExposition) -> ResponseBody:
        return cls(value.text, value.content_type)


class MetadataRequest(RequestBody, frozen=True, array_like=True):
    """Where things are: the brokers, the controller, and each partition's leader of the
    queues named (``None``: every queue; internal queues are named only when asked for)."""

    api = ApiKey.METADATA
    queues: list[str] | None = None


class MetadataResponse(ResponseBody, frozen=True, array_like=True):
    api = ApiKey.METADATA
    metadata: ClusterMetadata

    def result(self) -> ClusterMetadata:
        return self.metadata

    @classmethod
    def from_result(cls, value: ClusterMetadata) -> ResponseBody:
        return cls(value)


class RebalanceRequest(RequestBody, frozen=True, array_like=True):
    """Plan the moves that balance the live brokers; start them unless ``dry_run``."""

    api = ApiKey.REBALANCE
    dry_run: bool = False


class _MovesResult(ResponseBody, frozen=True, array_like=True):
    moves: list[PartitionMove]

    def result(self) -> list[PartitionMove]:
        return list(self.moves)

    @classmethod
    def from_result(cls, value: list[PartitionMove]) -> ResponseBody:
        return cls(list(value))


class RebalanceResponse(_MovesResult, frozen=True, array_like=True):
    api = ApiKey.REBALANCE


class DecommissionRequest(RequestBody, frozen=True, array_like=True):
    """Plan the moves of every partition off ``broker_id``; start them unless ``dry_run``."""

    api = ApiKey.DECOMMISSION
    broker_id: int
    dry_run: bool = False


class DecommissionResponse(_MovesResult, frozen=True, array_like=True):
    api = ApiKey.DECOMMISSION
