"""API keys, the protocol's constants, the connection-level bodies (handshake, error) and the
bases of every operation's and every push's body."""

from __future__ import annotations

from enum import IntEnum
from typing import Annotated, Any, ClassVar

import msgspec

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
    ALTER_QUEUE = 17
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
    DELETE_GROUP = 32
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
    CLAIM_SUBSCRIBER = 68
    END_SUBSCRIBER_STREAMS = 69
    # shared groups: leases, acks, redelivery, dead letters
    SHARED_RECEIVE = 50
    SHARED_ACK = 51
    SHARED_NACK = 52
    SHARED_EXTEND = 53
    SHARED_DESCRIBE = 54
    # delayed messages
    CANCEL_DELAYED = 70
    DELAY_STATS = 71
    HANDOFF_DELAYED = 72  # broker to broker: a moving partition's delayed messages and shared state
    # status and metrics
    STATUS = 90
    METRICS = 91
    # cluster
    METADATA = 100
    REBALANCE = 101
    DECOMMISSION = 102


#: Key ranges held for later features, so their numbers never collide.
RESERVED_API_KEYS: dict[range, str] = {
    range(2, 10): "connection: authentication, metadata",
    range(18, 20): "more queue administration",
    range(28, 30): "more data operations",
    range(33, 40): "more consumer group offsets",
    range(45, 46): "more consumer group membership",
    range(55, 60): "more shared delivery",
    range(73, 80): "more delayed messages",
    range(80, 90): "transactions: prepare, commit, roll back, check back",
    range(92, 100): "more status and metrics",
    range(103, 200): "more cluster: brokers, partition moves, replication",
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


class PushBody(msgspec.Struct, frozen=True, array_like=True):
    """Base of PUSH frame bodies; ``api`` is the operation that opened the stream."""

    api: ClassVar[ApiKey]
