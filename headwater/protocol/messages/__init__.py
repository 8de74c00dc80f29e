"""API keys and the body of every frame: one msgspec struct per request and per response.

A body is a msgpack array of the struct's fields in the order declared here (nested model
structs, such as :class:`~headwater.model.config.QueueConfig`, are msgpack maps keyed by
field name). Request fields are named exactly like the parameters of the matching
:class:`~headwater.model.service.BrokerService` method, so a server can call
``getattr(service, spec.method)(**fields)`` (see :func:`invoke`); ``max_wait_ms`` of a
fetch is the one field the server handles itself (long polling).

Record batches (fields listed in ``DATA_FIELDS``) are not msgpack: in their place the head
holds their sizes in bytes (an int for one batch, an array of ints for a list), and the
batches follow the head in the frame's data section, back to back, exactly as stored.

Versioning: fields are only ever appended; a reader ignores array elements past the ones it
knows and gives a missing trailing field its default. Anything else is a new protocol
version, negotiated in the handshake.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import IntEnum
from typing import Annotated, Any, ClassVar, NamedTuple

import msgspec

from headwater.model.config import QueueConfig, QueueInfo
from headwater.model.delay import DelayStats
from headwater.model.groups import GroupAssignment, GroupDescription, GroupSummary
from headwater.model.keyed import KeyedFetchResult, KeyedGroupInfo
from headwater.model.service import BrokerService, FetchResult, ProduceResult
from headwater.model.shared import LeaseRefusal, SharedDeliveries, SharedGroupInfo, SharedLease
from headwater.model.subscription import SubscriberInfo

__all__ = [
    "ApiKey",
    "ApiSpec",
    "API_SPECS",
    "Resend",
    "RESERVED_API_KEYS",
    "PROTOCOL_MAGIC",
    "VERSION_MIN",
    "VERSION_MAX",
    "RequestBody",
    "ResponseBody",
    "HandshakeBody",
    "HandshakeAcceptedBody",
    "ErrorBody",
    "PingRequest",
    "PingResponse",
    "CreateQueueRequest",
    "CreateQueueResponse",
    "DescribeQueueRequest",
    "DescribeQueueResponse",
    "ListQueuesRequest",
    "ListQueuesResponse",
    "DeleteQueueRequest",
    "DeleteQueueResponse",
    "TruncateQueueRequest",
    "TruncateQueueResponse",
    "SetQueueEnabledRequest",
    "SetQueueEnabledResponse",
    "AddPartitionsRequest",
    "AddPartitionsResponse",
    "ProduceRequest",
    "ProduceResponse",
    "FetchRequest",
    "FetchResponse",
    "LookupIdRequest",
    "LookupIdResponse",
    "LookupKeyRequest",
    "LookupKeyResponse",
    "OffsetForTimeRequest",
    "OffsetForTimeResponse",
    "CommitOffsetsRequest",
    "CommitOffsetsResponse",
    "FetchOffsetsRequest",
    "FetchOffsetsResponse",
    "StatusRequest",
    "StatusResponse",
    "JoinGroupRequest",
    "JoinGroupResponse",
    "HeartbeatGroupRequest",
    "HeartbeatGroupResponse",
    "LeaveGroupRequest",
    "LeaveGroupResponse",
    "DescribeGroupRequest",
    "DescribeGroupResponse",
    "ListGroupsRequest",
    "ListGroupsResponse",
    "KeyedGroupRequest",
    "KeyedGroupResponse",
    "KeyedFetchRequest",
    "KeyedFetchResponse",
    "KeyedCommitRequest",
    "KeyedCommitResponse",
    "KeyedResizeRequest",
    "KeyedResizeResponse",
    "SubscribeRequest",
    "SubscribeResponse",
    "UnsubscribeRequest",
    "UnsubscribeResponse",
    "SubscriptionAckRequest",
    "SubscriptionAckResponse",
    "AddSubscriberRequest",
    "AddSubscriberResponse",
    "DeleteSubscriberRequest",
    "DeleteSubscriberResponse",
    "ListSubscribersRequest",
    "ListSubscribersResponse",
    "DescribeSubscriberRequest",
    "DescribeSubscriberResponse",
    "CheckpointSubscriberRequest",
    "CheckpointSubscriberResponse",
    "PushBody",
    "SubscriptionPush",
    "StreamPush",
    "FetchStreamRequest",
    "FetchStreamResponse",
    "StreamCreditRequest",
    "StreamCreditResponse",
    "CloseStreamRequest",
    "CloseStreamResponse",
    "STREAM_APIS",
    "PUSH_SPECS",
    "push_spec_for",
    "SharedReceiveRequest",
    "SharedReceiveResponse",
    "SharedAckRequest",
    "SharedAckResponse",
    "SharedNackRequest",
    "SharedNackResponse",
    "SharedExtendRequest",
    "SharedExtendResponse",
    "SharedDescribeRequest",
    "SharedDescribeResponse",
    "CancelDelayedRequest",
    "CancelDelayedResponse",
    "DelayStatsRequest",
    "DelayStatsResponse",
    "spec_for",
    "invoke",
]

PROTOCOL_MAGIC = "headwater"
VERSION_MIN = 1  # oldest protocol version this code speaks
VERSION_MAX = 1  # newest protocol version this code speaks

Size = Annotated[int, msgspec.Meta(ge=0, le=2**32 - 1)]
U32 = Annotated[int, msgspec.Meta(ge=0, le=2**32 - 1)]


class ApiKey(IntEnum):
    """The operation a request names (u16 in the frame header). 0 is never an API."""

    PING = 1
    # queue administration
    CREATE_QUEUE = 10
    DESCRIBE_QUEUE = 11
    LIST_QUEUES = 12
    DELETE_QUEUE = 13
    TRUNCATE_QUEUE = 14
    SET_QUEUE_ENABLED = 15
    ADD_PARTITIONS = 16
    # data
    PRODUCE = 20
    FETCH = 21
    LOOKUP_ID = 22
    LOOKUP_KEY = 23
    OFFSET_FOR_TIME = 24
    # fetch streams: a consumer's partitions pushed as they grow
    FETCH_STREAM = 25
    STREAM_CREDIT = 26
    CLOSE_STREAM = 27
    # consumer group offsets
    COMMIT_OFFSETS = 30
    FETCH_OFFSETS = 31
    # consumer group membership
    JOIN_GROUP = 40
    HEARTBEAT_GROUP = 41
    LEAVE_GROUP = 42
    DESCRIBE_GROUP = 43
    LIST_GROUPS = 44
    # keyed groups (46-49 of the membership range)
    KEYED_GROUP = 46
    KEYED_FETCH = 47
    KEYED_COMMIT = 48
    KEYED_RESIZE = 49
    # push subscriptions
    SUBSCRIBE = 60
    UNSUBSCRIBE = 61
    SUBSCRIPTION_ACK = 62
    ADD_SUBSCRIBER = 63
    DELETE_SUBSCRIBER = 64
    LIST_SUBSCRIBERS = 65
    DESCRIBE_SUBSCRIBER = 66
    CHECKPOINT_SUBSCRIBER = 67
    # shared groups: leases, acks, redelivery, dead letters
    SHARED_RECEIVE = 50
    SHARED_ACK = 51
    SHARED_NACK = 52
    SHARED_EXTEND = 53
    SHARED_DESCRIBE = 54
    # delayed messages
    CANCEL_DELAYED = 70
    DELAY_STATS = 71
    # status and metrics
    STATUS = 90


#: Key ranges held for later features, so their numbers never collide.
RESERVED_API_KEYS: dict[range, str] = {
    range(2, 10): "connection: authentication, metadata",
    range(17, 20): "more queue administration",
    range(28, 30): "more data operations",
    range(32, 40): "more consumer group offsets",
    range(45, 46): "more consumer group membership",
    range(55, 60): "more shared delivery",
    range(68, 70): "more push subscriptions",
    range(72, 80): "more delayed messages",
    range(80, 90): "transactions: prepare, commit, roll back, check back",
    range(91, 100): "more status and metrics",
    range(100, 200): "cluster: brokers, partition locations, replication",
    range(0x8000, 0x10000): "private extensions, never assigned by Headwater",
}


# connection-level bodies ---------------------------------------------------------------


class HandshakeBody(msgspec.Struct, frozen=True, array_like=True):
    """First frame of a connection, client to server."""

    magic: str  # always "headwater"
    version_min: U32
    version_max: U32
    client_name: str
    frame_bytes_max: U32  # the biggest frame this client accepts


class HandshakeAcceptedBody(msgspec.Struct, frozen=True, array_like=True):
    """The server's answer to a handshake it accepts."""

    version: U32
    server_name: str
    frame_bytes_max: U32  # the biggest frame this server accepts
    requests_in_flight_max: U32  # requests the client may have unanswered at once


class ErrorBody(msgspec.Struct, frozen=True, array_like=True):
    code: U32
    retriable: bool
    message: str


# operation bodies --------------------------------------------------------------------


class RequestBody(msgspec.Struct, frozen=True, array_like=True):
    """Base of request bodies. ``api`` is the key it travels under."""

    api: ClassVar[ApiKey]


class ResponseBody(msgspec.Struct, frozen=True, array_like=True):
    """Base of response bodies: :meth:`result` is what the BrokerService method returns."""

    api: ClassVar[ApiKey]

    def result(self) -> Any:
        raise NotImplementedError

    @classmethod
    def from_result(cls, value: Any) -> ResponseBody:
        raise NotImplementedError


class _NoResult(ResponseBody, frozen=True, array_like=True):
    def result(self) -> None:
        return None

    @classmethod
    def from_result(cls, value: Any) -> ResponseBody:
        return cls()


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


class ListQueuesResponse(ResponseBody, frozen=True, array_like=True):
    api = ApiKey.LIST_QUEUES
    queues: list[QueueInfo]

    def result(self) -> list[QueueInfo]:
        return list(self.queues)

    @classmethod
    def from_result(cls, value: list[QueueInfo]) -> ResponseBody:
        return cls(list(value))


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


class ProduceRequest(RequestBody, frozen=True, array_like=True):
    """Append one record batch (as built by ``encode_batch``) to a partition."""

    api = ApiKey.PRODUCE
    queue: str
    partition: int
    batch: bytes  # data section; any bytes-like object when sending


class ProduceResponse(ResponseBody, frozen=True, array_like=True):
    api = ApiKey.PRODUCE
    queue_id: int
    partition: int
    base_offset: int
    count: int
    timestamp_ms: int

    def result(self) -> ProduceResult:
        return ProduceResult(*msgspec.structs.astuple(self))

    @classmethod
    def from_result(cls, value: ProduceResult) -> ResponseBody:
        return cls(*msgspec.structs.astuple(value))


class FetchRequest(RequestBody, frozen=True, array_like=True):
    """Stored batches of a partition from ``offset`` on, about ``max_bytes`` of them.

    When nothing is there yet the server may hold the request up to ``max_wait_ms`` for
    data to arrive (long polling); 0 answers at once.
    """

    api = ApiKey.FETCH
    queue: str
    partition: int
    offset: int
    max_bytes: int
    tag_mask: int = 0
    end_offset: int | None = None
    max_wait_ms: int = 0


class FetchResponse(ResponseBody, frozen=True, array_like=True):
    api = ApiKey.FETCH
    batches: list[bytes]  # data section; any bytes-like objects when sending
    next_offset: int
    start_offset: int
    end_offset: int

    def result(self) -> FetchResult:
        return FetchResult(list(self.batches), self.next_offset, self.start_offset, self.end_offset)

    @classmethod
    def from_result(cls, value: FetchResult) -> ResponseBody:
        return cls(list(value.batches), value.next_offset, value.start_offset, value.end_offset)


class LookupIdRequest(RequestBody, frozen=True, array_like=True):
    api = ApiKey.LOOKUP_ID
    queue_id: int
    partition: int
    offset: int


class LookupIdResponse(ResponseBody, frozen=True, array_like=True):
    """The queue's name and the stored batch holding the message."""

    api = ApiKey.LOOKUP_ID
    queue: str
    batch: bytes  # data section

    def result(self) -> tuple[str, bytes]:
        return self.queue, self.batch

    @classmethod
    def from_result(cls, value: tuple[str, bytes]) -> ResponseBody:
        return cls(*value)


class LookupKeyRequest(RequestBody, frozen=True, array_like=True):
    api = ApiKey.LOOKUP_KEY
    queue: str
    key: bytes
    start_ms: int | None
    end_ms: int | None
    limit: int


class LookupKeyResponse(ResponseBody, frozen=True, array_like=True):
    """Stored batches that may hold messages with the key (the reader keeps exact matches)."""

    api = ApiKey.LOOKUP_KEY
    batches: list[bytes]  # data section

    def result(self) -> list[bytes]:
        return list(self.batches)

    @classmethod
    def from_result(cls, value: list[bytes]) -> ResponseBody:
        return cls(list(value))


class OffsetForTimeRequest(RequestBody, frozen=True, array_like=True):
    api = ApiKey.OFFSET_FOR_TIME
    queue: str
    partition: int
    timestamp_ms: int


class OffsetForTimeResponse(ResponseBody, frozen=True, array_like=True):
    api = ApiKey.OFFSET_FOR_TIME
    offset: int

    def result(self) -> int:
        return self.offset

    @classmethod
    def from_result(cls, value: int) -> ResponseBody:
        return cls(value)


# keyed groups ----------------------------------------------------------------------------


class _KeyedGroupResult(ResponseBody, frozen=True, array_like=True):
    group: KeyedGroupInfo

    def result(self) -> KeyedGroupInfo:
        return self.group

    @classmethod
    def from_result(cls, value: KeyedGroupInfo) -> ResponseBody:
        return cls(value)


class KeyedGroupRequest(RequestBody, frozen=True, array_like=True):
    """Look up a keyed group; with ``key`` and ``size``, create it if absent or check it."""

    api = ApiKey.KEYED_GROUP
    queue: str
    group: str
    key: str | None = None
    size: int | None = None
    start: str = "earliest"


class KeyedGroupResponse(_KeyedGroupResult, frozen=True, array_like=True):
    api = ApiKey.KEYED_GROUP


class KeyedFetchRequest(RequestBody, frozen=True, array_like=True):
    """A keyed member's fetch: only the messages whose key hashes to ``member``."""

    api = ApiKey.KEYED_FETCH
    queue: str
    group: str
    member: int
    generation: int
    partition: int
    offset: int
    max_bytes: int
    max_wait_ms: int = 0


class KeyedFetchResponse(ResponseBody, frozen=True, array_like=True):
    api = ApiKey.KEYED_FETCH
    batches: list[bytes]  # data section
    next_offset: int
    start_offset: int
    end_offset: int
    generation: int
    stop_offset: int | None = None
    selections: list[list[int]] = []  # per batch: the offsets of a selection, [] for a stored batch

    def result(self) -> KeyedFetchResult:
        return KeyedFetchResult(
            list(self.batches),
            self.next_offset,
            self.start_offset,
            self.end_offset,
            self.generation,
            self.stop_offset,
            list(self.selections),
        )

    @classmethod
    def from_result(cls, value: KeyedFetchResult) -> ResponseBody:
        return cls(
            list(value.batches),
            value.next_offset,
            value.start_offset,
            value.end_offset,
            value.generation,
            value.stop_offset,
            list(value.selections),
        )


class KeyedCommitRequest(RequestBody, frozen=True, array_like=True):
    api = ApiKey.KEYED_COMMIT
    queue: str
    group: str
    member: int
    generation: int
    offsets: dict[int, int]


class KeyedCommitResponse(_KeyedGroupResult, frozen=True, array_like=True):
    api = ApiKey.KEYED_COMMIT


class KeyedResizeRequest(RequestBody, frozen=True, array_like=True):
    api = ApiKey.KEYED_RESIZE
    queue: str
    group: str
    size: int


class KeyedResizeResponse(_KeyedGroupResult, frozen=True, array_like=True):
    api = ApiKey.KEYED_RESIZE


# push subscriptions ------------------------------------------------------------------------


class _SubscriberResult(ResponseBody, frozen=True, array_like=True):
    subscriber: SubscriberInfo

    def result(self) -> SubscriberInfo:
        return self.subscriber

    @classmethod
    def from_result(cls, value: SubscriberInfo) -> ResponseBody:
        return cls(value)


class FetchStreamRequest(RequestBody, frozen=True, array_like=True):
    """Open a fetch stream on this connection: the broker pushes the stored batches of
    ``queue``'s partitions from ``positions`` (``{partition: offset}``) on, as FETCH would
    return them, as soon as they are appended, while the stream has credit.

    ``stream_id`` (chosen by the client, unique among its open streams on the connection,
    subscriptions' included) names the stream in PUSH frames. ``credit_bytes``: the batch
    bytes the broker may push before more credit comes (STREAM_CREDIT); a push may overshoot
    by one batch. ``tag_mask`` as in FETCH; ``push_bytes_max``: about the most one PUSH
    carries.
    """

    api = ApiKey.FETCH_STREAM
    stream_id: U32
    queue: str
    positions: dict[int, int]
    credit_bytes: U32
    tag_mask: int = 0
    push_bytes_max: U32 = 1 << 20


class FetchStreamResponse(_NoResult, frozen=True, array_like=True):
    api = ApiKey.FETCH_STREAM


class StreamCreditRequest(RequestBody, frozen=True, array_like=True):
    """Let a fetch stream push ``credit_bytes`` more bytes."""

    api = ApiKey.STREAM_CREDIT
    stream_id: U32
    credit_bytes: U32


class StreamCreditResponse(_NoResult, frozen=True, array_like=True):
    api = ApiKey.STREAM_CREDIT


class CloseStreamRequest(RequestBody, frozen=True, array_like=True):
    """End a fetch stream (an id that is not open is not an error)."""

    api = ApiKey.CLOSE_STREAM
    stream_id: U32


class CloseStreamResponse(_NoResult, frozen=True, array_like=True):
    api = ApiKey.CLOSE_STREAM


class SubscribeRequest(RequestBody, frozen=True, array_like=True):
    """Open a push stream of subscriber ``name`` on this connection.

    ``subscription_id`` (chosen by the client, unique among its open streams on the
    connection) names the stream in PUSH frames. The broker pushes from the subscriber's
    checkpoints while the stream has credit: ``credit_messages`` messages and
    ``credit_bytes`` bytes to begin with, more with each SUBSCRIPTION_ACK.
    """

    api = ApiKey.SUBSCRIBE
    subscription_id: U32
    queue: str
    name: str
    credit_messages: U32
    credit_bytes: U32


class SubscribeResponse(_SubscriberResult, frozen=True, array_like=True):
    """The subscriber as the stream starts (its checkpoints are where pushes begin)."""

    api = ApiKey.SUBSCRIBE


class UnsubscribeRequest(RequestBody, frozen=True, array_like=True):
    api = ApiKey.UNSUBSCRIBE
    subscription_id: U32


class UnsubscribeResponse(_NoResult, frozen=True, array_like=True):
    api = ApiKey.UNSUBSCRIBE


class SubscriptionAckRequest(RequestBody, frozen=True, array_like=True):
    """Give a stream more credit and, when ``offsets`` is not empty, checkpoint it durably
    (``{partition: next offset to deliver}``) before answering."""

    api = ApiKey.SUBSCRIPTION_ACK
    subscription_id: U32
    offsets: dict[int, int]
    credit_messages: U32
    credit_bytes: U32


class SubscriptionAckResponse(_NoResult, frozen=True, array_like=True):
    api = ApiKey.SUBSCRIPTION_ACK


class AddSubscriberRequest(RequestBody, frozen=True, array_like=True):
    api = ApiKey.ADD_SUBSCRIBER
    queue: str
    name: str
    partitions: list[int] | None = None
    tags: list[str] | None = None
    start: str = "latest"


class AddSubscriberResponse(_SubscriberResult, frozen=True, array_like=True):
    api = ApiKey.ADD_SUBSCRIBER


class DeleteSubscriberRequest(RequestBody, frozen=True, array_like=True):
    api = ApiKey.DELETE_SUBSCRIBER
    queue: str
    name: str


class DeleteSubscriberResponse(_NoResult, frozen=True, array_like=True):
    api = ApiKey.DELETE_SUBSCRIBER


class ListSubscribersRequest(RequestBody, frozen=True, array_like=True):
    api = ApiKey.LIST_SUBSCRIBERS
    queue: str | None = None


class ListSubscribersResponse(ResponseBody, frozen=True, array_like=True):
    api = ApiKey.LIST_SUBSCRIBERS
    subscribers: list[SubscriberInfo]

    def result(self) -> list[SubscriberInfo]:
        return list(self.subscribers)

    @classmethod
    def from_result(cls, value: list[SubscriberInfo]) -> ResponseBody:
        return cls(list(value))


class DescribeSubscriberRequest(RequestBody, frozen=True, array_like=True):
    api = ApiKey.DESCRIBE_SUBSCRIBER
    queue: str
    name: str


class DescribeSubscriberResponse(_SubscriberResult, frozen=True, array_like=True):
    api = ApiKey.DESCRIBE_SUBSCRIBER


class CheckpointSubscriberRequest(RequestBody, frozen=True, array_like=True):
    api = ApiKey.CHECKPOINT_SUBSCRIBER
    queue: str
    name: str
    offsets: dict[int, int]


class CheckpointSubscriberResponse(_NoResult, frozen=True, array_like=True):
    api = ApiKey.CHECKPOINT_SUBSCRIBER


class PushBody(msgspec.Struct, frozen=True, array_like=True):
    """Base of PUSH frame bodies; ``api`` is the operation that opened the stream."""

    api: ClassVar[ApiKey]


class SubscriptionPush(PushBody, frozen=True, array_like=True):
    """Messages of one partition for the stream ``subscription_id`` (server to client).

    ``batches`` are stored batches or selections of one (only matching messages: the broker
    filters; ``selections`` as in KEYED_FETCH), from the stream's position on;
    ``next_offset`` is where the stream continues in ``partition``
    (past messages it skipped), ``end_offset`` the partition's end when read. A non-empty
    ``ended`` ends the stream (the reason, e.g. another connection took it over) and
    ``ended_code`` is the error code of that reason (its class tells whether subscribing again
    may help: UnavailableError when the broker stops); no push follows for it.
    """

    api = ApiKey.SUBSCRIBE
    subscription_id: U32
    partition: int
    batches: list[bytes]  # data section
    next_offset: int
    end_offset: int
    ended: str = ""
    ended_code: U32 = 0
    selections: list[list[int]] = []


class StreamPush(PushBody, frozen=True, array_like=True):
    """Batches of one partition for the fetch stream ``stream_id`` (server to client).

    ``batches``, ``next_offset``, ``start_offset`` and ``end_offset`` mean what they mean in
    a FETCH answer read at the stream's position in ``partition``: stored batches, whose
    records before that position (or not matching the tag mask) the client skips; where the
    stream continues; the partition's first and end offsets when read. A non-empty ``ended``
    ends the stream (the reason, e.g. the queue was deleted or the broker stops) and
    ``ended_code`` is that reason's error code; no push follows for it.
    """

    api = ApiKey.FETCH_STREAM
    stream_id: U32
    partition: int
    batches: list[bytes]  # data section
    next_offset: int
    start_offset: int
    end_offset: int
    ended: str = ""
    ended_code: U32 = 0


#: The body of a PUSH frame, by the api key in its header.
PUSH_SPECS: dict[ApiKey, type[PushBody]] = {ApiKey.SUBSCRIBE: SubscriptionPush, ApiKey.FETCH_STREAM: StreamPush}


# the table ---------------------------------------------------------------------------

#: Fields that travel in the data section: name -> True for a list of batches, False for one.
DATA_FIELDS: dict[type[msgspec.Struct], dict[str, bool]] = {
    ProduceRequest: {"batch": False},
    FetchResponse: {"batches": True},
    LookupIdResponse: {"batch": False},
    LookupKeyResponse: {"batches": True},
    KeyedFetchResponse: {"batches": True},
    SubscriptionPush: {"batches": True},
    StreamPush: {"batches": True},
}


class CommitOffsetsRequest(RequestBody, frozen=True, array_like=True):
    """Store a consumer group's positions: ``{partition: offset}`` (next offset to read)."""

    api = ApiKey.COMMIT_OFFSETS
    group: str
    queue: str
    offsets: dict[int, int]
    member_id: str | None = None  # a clustering group's member: its id and generation
    generation: int | None = None


class CommitOffsetsResponse(_NoResult, frozen=True, array_like=True):
    api = ApiKey.COMMIT_OFFSETS


class FetchOffsetsRequest(RequestBody, frozen=True, array_like=True):
    api = ApiKey.FETCH_OFFSETS
    group: str
    queue: str


class FetchOffsetsResponse(ResponseBody, frozen=True, array_like=True):
    api = ApiKey.FETCH_OFFSETS
    offsets: dict[int, int]

    def result(self) -> dict[int, int]:
        return dict(self.offsets)

    @classmethod
    def from_result(cls, value: dict[int, int]) -> ResponseBody:
        return cls(dict(value))


class JoinGroupRequest(RequestBody, frozen=True, array_like=True):
    """Join a consumer group; the answer carries the assignment (no second round trip)."""

    api = ApiKey.JOIN_GROUP
    group: str
    member_id: str | None  # None: a new member
    client_id: str
    queues: list[str]
    mode: str  # "clustering" or "broadcast"
    strategy: str  # "average" or "sticky"
    session_timeout_ms: int


class _GroupAssignmentResult(ResponseBody, frozen=True, array_like=True):
    assignment: GroupAssignment

    def result(self) -> GroupAssignment:
        return self.assignment

    @classmethod
    def from_result(cls, value: GroupAssignment) -> ResponseBody:
        return cls(value)


class JoinGroupResponse(_GroupAssignmentResult, frozen=True, array_like=True):
    api = ApiKey.JOIN_GROUP


class HeartbeatGroupRequest(RequestBody, frozen=True, array_like=True):
    api = ApiKey.HEARTBEAT_GROUP
    group: str
    member_id: str
    generation: int  # the newest generation whose assignment the member has applied


class HeartbeatGroupResponse(_GroupAssignmentResult, frozen=True, array_like=True):
    api = ApiKey.HEARTBEAT_GROUP


class LeaveGroupRequest(RequestBody, frozen=True, array_like=True):
    api = ApiKey.LEAVE_GROUP
    group: str
    member_id: str


class LeaveGroupResponse(_NoResult, frozen=True, array_like=True):
    api = ApiKey.LEAVE_GROUP


class DescribeGroupRequest(RequestBody, frozen=True, array_like=True):
    api = ApiKey.DESCRIBE_GROUP
    group: str


class DescribeGroupResponse(ResponseBody, frozen=True, array_like=True):
    api = ApiKey.DESCRIBE_GROUP
    group: GroupDescription

    def result(self) -> GroupDescription:
        return self.group

    @classmethod
    def from_result(cls, value: GroupDescription) -> ResponseBody:
        return cls(value)


class ListGroupsRequest(RequestBody, frozen=True, array_like=True):
    api = ApiKey.LIST_GROUPS


class ListGroupsResponse(ResponseBody, frozen=True, array_like=True):
    api = ApiKey.LIST_GROUPS
    groups: list[GroupSummary]

    def result(self) -> list[GroupSummary]:
        return list(self.groups)

    @classmethod
    def from_result(cls, value: list[GroupSummary]) -> ResponseBody:
        return cls(list(value))


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

    def result(self) -> SharedDeliveries:
        return SharedDeliveries(list(self.batches), list(self.leases))

    @classmethod
    def from_result(cls, value: SharedDeliveries) -> ResponseBody:
        return cls(list(value.batches), list(value.leases))


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


DATA_FIELDS[SharedReceiveResponse] = {"batches": True}


# delayed messages ----------------------------------------------------------------------


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


class BodyCodec(NamedTuple):
    """How one body type goes to and from a head (msgpack) plus data buffers."""

    type: type[msgspec.Struct]
    decoder: msgspec.msgpack.Decoder
    data: tuple[tuple[int, bool], ...]  # (field position, is a list) of data fields

    def split(self, body: msgspec.Struct) -> tuple[list[Any] | msgspec.Struct, list[Any]]:
        """The value to encode as the head, and the data buffers in order."""
        if not self.data:
            return body, []
        values = list(msgspec.structs.astuple(body))
        buffers: list[Any] = []
        for pos, many in self.data:
            value = values[pos]
            if many:
                sizes = []  # a loop, not a comprehension: one Python call fewer per frame
                for b in value:
                    sizes.append(len(b) if type(b) in _PLAIN_BYTES else _nbytes(b))
                values[pos] = sizes
                buffers.extend(value)
            else:
                values[pos] = len(value) if type(value) in _PLAIN_BYTES else _nbytes(value)
                buffers.append(value)
        return values, buffers

    def decode(self, head: bytes | memoryview, data: bytes) -> Any:
        """The body from a frame's head and data; raises msgspec.DecodeError or ValueError."""
        return self.join(self.decoder.decode(head), data)

    def join(self, head: Any, data: bytes) -> msgspec.Struct:
        """The body from a decoded head and the frame's data (raises ValueError)."""
        if not self.data:
            if data:
                raise ValueError(f"{len(data)} bytes of batch data in a frame that carries none")
            return head
        values = list(msgspec.structs.astuple(head))
        at = 0
        for pos, many in self.data:
            sizes = values[pos] if many else [values[pos]]
            parts = []
            for size in sizes:
                if at + size > len(data):
                    raise ValueError(f"batch sizes add up to more than the {len(data)} bytes of batch data")
                parts.append(data[at : at + size])
                at += size
            values[pos] = parts if many else parts[0]
        if at != len(data):
            raise ValueError(f"batch sizes add up to {at}, the frame carries {len(data)} bytes")
        return self.type(*values)


_PLAIN_BYTES = frozenset((bytes, bytearray))  # whose len() is their size in bytes


def _nbytes(b: Any) -> int:
    if not isinstance(b, (bytes, bytearray, memoryview)):
        raise TypeError(f"a record batch is bytes-like, got {type(b).__name__}")
    return memoryview(b).nbytes


def _codec(body_type: type[msgspec.Struct]) -> BodyCodec:
    data = DATA_FIELDS.get(body_type, {})
    names = body_type.__struct_fields__
    if not data:
        return BodyCodec(body_type, msgspec.msgpack.Decoder(body_type), ())
    fields = []
    for name, info in zip(names, msgspec.structs.fields(body_type)):
        if name in data:
            fields.append((name, list[Size] if data[name] else Size))
        elif info.default is not msgspec.NODEFAULT:
            fields.append((name, info.type, info.default))
        elif info.default_factory is not msgspec.NODEFAULT:  # a mutable default, e.g. []
            fields.append((name, info.type, msgspec.field(default_factory=info.default_factory)))
        else:
            fields.append((name, info.type))
    head_type = msgspec.defstruct(body_type.__name__ + "Head", fields, array_like=True, frozen=True)
    positions = tuple((names.index(n), many) for n, many in data.items())
    return BodyCodec(body_type, msgspec.msgpack.Decoder(head_type), positions)


class Resend(IntEnum):
    """Whether a client may send a request again after its connection was lost, written
    once per operation in its :class:`ApiSpec` (``docs/design/client.md``, "What a blocking
    call sends again"). A request that never left the client is always safe to send again:
    the broker never saw it."""

    #: Doing it twice is the same as once (reads, commits of offsets, enabling a queue,
    #: cancelling a delayed message): sent again even if it may have reached the broker.
    SAFE = 0
    #: Sent again only if it never left the client; written and then lost, the caller hears
    #: that it may or may not have been applied (OutcomeUnknownError).
    IF_UNSENT = 1
    #: Never sent again by the client's service: its caller retries it (the producer's
    #: appends, whose idempotent batches make that safe).
    NEVER = 2


def _resend_shared_receive(body: Any) -> Resend:
    # leases of a receive answered but lost expire and their messages come again (at least
    # once); at most once they would be lost, so the caller hears of it
    return Resend.IF_UNSENT if body.at_most_once else Resend.SAFE


class ApiSpec(NamedTuple):
    """One operation: its key, body types, the BrokerService method it maps to, the first
    protocol version that has it, whether a client may send it again (``resend``: a
    :class:`Resend`, or a function of the request giving one), and whether the server may
    hold it up to its ``max_wait_ms`` (``waits``: a long poll)."""

    key: ApiKey
    request: type[RequestBody]
    response: type[ResponseBody]
    method: str | None  # None: handled by the server itself (ping)
    since_version: int = 1
    resend: Resend | Callable[[Any], Resend] = Resend.SAFE
    waits: bool = False

    def resend_of(self, body: RequestBody) -> Resend:
        """Whether ``body`` (a request of this operation) may be sent again."""
        rule = self.resend
        return rule if isinstance(rule, Resend) else rule(body)

    def wait_s(self, body: Any) -> float:
        """How long the server may hold ``body`` (a request of this operation) before it
        answers: its ``max_wait_ms`` if the operation ``waits``, else 0."""
        return body.max_wait_ms / 1000 if self.waits else 0.0


_ONCE = Resend.IF_UNSENT  # (short, for the table below)

API_SPECS: dict[ApiKey, ApiSpec] = {
    s.key: s
    for s in (
        ApiSpec(ApiKey.PING, PingRequest, PingResponse, None),
        ApiSpec(ApiKey.CREATE_QUEUE, CreateQueueRequest, CreateQueueResponse, "create_queue", resend=_ONCE),
        ApiSpec(ApiKey.DESCRIBE_QUEUE, DescribeQueueRequest, DescribeQueueResponse, "describe_queue"),
        ApiSpec(ApiKey.LIST_QUEUES, ListQueuesRequest, ListQueuesResponse, "list_queues"),
        # a second delete could remove a queue created meanwhile; a second truncate would
        # drop what was sent since; a second add_partitions would add more
        ApiSpec(ApiKey.DELETE_QUEUE, DeleteQueueRequest, DeleteQueueResponse, "delete_queue", resend=_ONCE),
        ApiSpec(ApiKey.TRUNCATE_QUEUE, TruncateQueueRequest, TruncateQueueResponse, "truncate_queue", resend=_ONCE),
        ApiSpec(ApiKey.SET_QUEUE_ENABLED, SetQueueEnabledRequest, SetQueueEnabledResponse, "set_queue_enabled"),
        ApiSpec(ApiKey.ADD_PARTITIONS, AddPartitionsRequest, AddPartitionsResponse, "add_partitions", resend=_ONCE),
        ApiSpec(ApiKey.PRODUCE, ProduceRequest, ProduceResponse, "produce", resend=Resend.NEVER),
        ApiSpec(ApiKey.FETCH, FetchRequest, FetchResponse, "fetch", waits=True),
        ApiSpec(ApiKey.LOOKUP_ID, LookupIdRequest, LookupIdResponse, "lookup_id"),
        ApiSpec(ApiKey.LOOKUP_KEY, LookupKeyRequest, LookupKeyResponse, "lookup_key"),
        ApiSpec(ApiKey.OFFSET_FOR_TIME, OffsetForTimeRequest, OffsetForTimeResponse, "offset_for_time"),
        ApiSpec(ApiKey.COMMIT_OFFSETS, CommitOffsetsRequest, CommitOffsetsResponse, "commit_offsets"),
        ApiSpec(ApiKey.FETCH_OFFSETS, FetchOffsetsRequest, FetchOffsetsResponse, "fetch_offsets"),
        # a join answered but lost leaves a member that expires; a second leave is refused,
        # but the member is gone either way
        ApiSpec(ApiKey.JOIN_GROUP, JoinGroupRequest, JoinGroupResponse, "join_group", resend=_ONCE),
        ApiSpec(ApiKey.HEARTBEAT_GROUP, HeartbeatGroupRequest, HeartbeatGroupResponse, "heartbeat_group"),
        ApiSpec(ApiKey.LEAVE_GROUP, LeaveGroupRequest, LeaveGroupResponse, "leave_group"),
        ApiSpec(ApiKey.DESCRIBE_GROUP, DescribeGroupRequest, DescribeGroupResponse, "describe_group"),
        ApiSpec(ApiKey.LIST_GROUPS, ListGroupsRequest, ListGroupsResponse, "list_groups"),
        ApiSpec(
            ApiKey.SHARED_RECEIVE,
            SharedReceiveRequest,
            SharedReceiveResponse,
            "shared_receive",
            resend=_resend_shared_receive,
            waits=True,
        ),
        # an ack, nack or extend answered but lost would come back refused: the caller decides
        ApiSpec(ApiKey.SHARED_ACK, SharedAckRequest, SharedAckResponse, "shared_ack", resend=_ONCE),
        ApiSpec(ApiKey.SHARED_NACK, SharedNackRequest, SharedNackResponse, "shared_nack", resend=_ONCE),
        ApiSpec(ApiKey.SHARED_EXTEND, SharedExtendRequest, SharedExtendResponse, "shared_extend", resend=_ONCE),
        ApiSpec(ApiKey.SHARED_DESCRIBE, SharedDescribeRequest, SharedDescribeResponse, "shared_describe"),
        ApiSpec(ApiKey.KEYED_GROUP, KeyedGroupRequest, KeyedGroupResponse, "keyed_group"),
        ApiSpec(ApiKey.KEYED_FETCH, KeyedFetchRequest, KeyedFetchResponse, "keyed_fetch", waits=True),
        ApiSpec(ApiKey.KEYED_COMMIT, KeyedCommitRequest, KeyedCommitResponse, "keyed_commit"),
        ApiSpec(ApiKey.KEYED_RESIZE, KeyedResizeRequest, KeyedResizeResponse, "keyed_resize"),
        # the fetch streams' and subscriptions' requests act on the connection's push streams
        # (STREAM_APIS): the server handles them itself, and they die with the connection
        ApiSpec(ApiKey.FETCH_STREAM, FetchStreamRequest, FetchStreamResponse, None, resend=Resend.NEVER),
        ApiSpec(ApiKey.STREAM_CREDIT, StreamCreditRequest, StreamCreditResponse, None, resend=Resend.NEVER),
        ApiSpec(ApiKey.CLOSE_STREAM, CloseStreamRequest, CloseStreamResponse, None, resend=Resend.NEVER),
        ApiSpec(ApiKey.SUBSCRIBE, SubscribeRequest, SubscribeResponse, None, resend=Resend.NEVER),
        ApiSpec(ApiKey.UNSUBSCRIBE, UnsubscribeRequest, UnsubscribeResponse, None, resend=Resend.NEVER),
        ApiSpec(ApiKey.SUBSCRIPTION_ACK, SubscriptionAckRequest, SubscriptionAckResponse, None, resend=Resend.NEVER),
        # a second add or delete of a subscriber would come back as "exists" or "not found"
        ApiSpec(ApiKey.ADD_SUBSCRIBER, AddSubscriberRequest, AddSubscriberResponse, "add_subscriber", resend=_ONCE),
        ApiSpec(
            ApiKey.DELETE_SUBSCRIBER,
            DeleteSubscriberRequest,
            DeleteSubscriberResponse,
            "delete_subscriber",
            resend=_ONCE,
        ),
        ApiSpec(ApiKey.LIST_SUBSCRIBERS, ListSubscribersRequest, ListSubscribersResponse, "list_subscribers"),
        ApiSpec(
            ApiKey.DESCRIBE_SUBSCRIBER, DescribeSubscriberRequest, DescribeSubscriberResponse, "describe_subscriber"
        ),
        ApiSpec(
            ApiKey.CHECKPOINT_SUBSCRIBER,
            CheckpointSubscriberRequest,
            CheckpointSubscriberResponse,
            "checkpoint_subscriber",
        ),
        # cancelling twice is fine (the second finds it cancelled)
        ApiSpec(ApiKey.CANCEL_DELAYED, CancelDelayedRequest, CancelDelayedResponse, "cancel_delayed"),
        ApiSpec(ApiKey.DELAY_STATS, DelayStatsRequest, DelayStatsResponse, "delay_stats"),
        ApiSpec(ApiKey.STATUS, StatusRequest, StatusResponse, "status"),
    )
}

#: The requests that act on a connection's push streams (subscriptions' and fetch streams'):
#: only a server serves them.
STREAM_APIS = frozenset(
    {
        ApiKey.FETCH_STREAM,
        ApiKey.STREAM_CREDIT,
        ApiKey.CLOSE_STREAM,
        ApiKey.SUBSCRIBE,
        ApiKey.UNSUBSCRIBE,
        ApiKey.SUBSCRIPTION_ACK,
    }
)

for _s in API_SPECS.values():
    assert _s.request.api is _s.key and _s.response.api is _s.key, _s
    assert not _s.waits or "max_wait_ms" in _s.request.__struct_fields__, _s
del _s

_CODECS: dict[type[msgspec.Struct], BodyCodec] = {
    t: _codec(t)
    for t in (
        HandshakeBody,
        HandshakeAcceptedBody,
        ErrorBody,
        *(s.request for s in API_SPECS.values()),
        *(s.response for s in API_SPECS.values()),
        *PUSH_SPECS.values(),
    )
}
_encoder = msgspec.msgpack.Encoder()


# keyed by plain int: looked up with the api key of every frame, where ApiKey(api) would
# cost an Enum call (and an exception for an unknown key)
_SPECS_BY_INT: dict[int, ApiSpec] = {int(k): s for k, s in API_SPECS.items()}


def spec_for(api: int, version: int) -> ApiSpec | None:
    """The operation with key ``api`` in protocol ``version``, or None if it has none."""
    try:
        spec = _SPECS_BY_INT.get(api)
    except TypeError:  # unhashable: no api key
        return None
    return spec if spec is not None and spec.since_version <= version else None


def push_spec_for(api: int, version: int) -> type[PushBody] | None:
    """The body type of PUSH frames with key ``api`` in protocol ``version``, or None."""
    spec = spec_for(api, version)
    return None if spec is None else PUSH_SPECS.get(spec.key)


def body_codec(body_type: type[msgspec.Struct]) -> BodyCodec:
    """How a frame body type goes to and from a head plus data (``decode(head, data)``)."""
    return _CODECS[body_type]


def encode_body(body: msgspec.Struct, *, check: bool = True) -> tuple[bytes, list[Any]]:
    """The msgpack head and the data buffers of a body. ``check``: decode the head again
    against the body's own schema, so a field holding a value of the wrong type raises
    (TypeError, ValueError, msgspec.ValidationError) here rather than at the peer."""
    codec = _CODECS[type(body)]
    head_value, data = codec.split(body)
    head = _encoder.encode(head_value)
    if check:
        codec.decoder.decode(head)  # what we send must be what the peer can decode
    return head, data


def decode_body(body_type: type[msgspec.Struct], head: bytes | memoryview, data: bytes) -> Any:
    """The body from a frame's head and data; raises msgspec.DecodeError or ValueError."""
    return _CODECS[body_type].decode(head, data)


def invoke(service: BrokerService, request: RequestBody) -> ResponseBody:
    """Run a request against a service the plain way (no long polling); the response body.

    Exceptions of the service propagate: the caller turns them into error responses.
    """
    spec = API_SPECS[request.api]
    if spec.method is None:
        if spec.key in STREAM_APIS:
            from headwater.errors import UsageError

            raise UsageError(f"{spec.key.name} acts on a connection's push streams: only a server serves it")
        return spec.response.from_result(None)
    args = msgspec.structs.asdict(request)
    if spec.key is ApiKey.FETCH or spec.key is ApiKey.KEYED_FETCH:
        del args["max_wait_ms"]
    return spec.response.from_result(getattr(service, spec.method)(**args))
