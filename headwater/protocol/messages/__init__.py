"""API keys and the body of every frame: one msgspec struct per request and per response.

A body is a msgpack array of the struct's fields in the order its class declares them (nested model
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

The bodies live in one file per area; this package re-exports them all, so
``headwater.protocol.messages`` is the one name importers use:

- ``base``: API keys, constants, handshake and error bodies, the bases of all bodies
- ``admin``: ping, queue administration, the broker's status
- ``data``: produce, fetch, lookups by id, key and time
- ``groups``: consumer groups' committed offsets and membership
- ``keyed``: keyed groups
- ``shared``: shared groups (leases, acks, redelivery)
- ``streams``: push subscriptions, fetch streams and their PUSH bodies
- ``delay``: delayed messages
- ``specs``: the table of operations (``API_SPECS``), ``Resend``, ``invoke``
- ``codec``: how a body goes to and from a frame's head and data
"""

from __future__ import annotations

from headwater.protocol.messages.admin import (
    AddPartitionsRequest,
    AddPartitionsResponse,
    AlterQueueRequest,
    AlterQueueResponse,
    CreateQueueRequest,
    CreateQueueResponse,
    DecommissionRequest,
    DecommissionResponse,
    DeleteQueueRequest,
    DeleteQueueResponse,
    DescribeQueueRequest,
    DescribeQueueResponse,
    ListQueuesRequest,
    ListQueuesResponse,
    MetadataRequest,
    MetadataResponse,
    MetricsRequest,
    MetricsResponse,
    PingRequest,
    PingResponse,
    RebalanceRequest,
    RebalanceResponse,
    SetQueueEnabledRequest,
    SetQueueEnabledResponse,
    StatusRequest,
    StatusResponse,
    TruncateQueueRequest,
    TruncateQueueResponse,
)
from headwater.protocol.messages.base import (
    PROTOCOL_MAGIC,
    RESERVED_API_KEYS,
    VERSION_MAX,
    VERSION_MIN,
    ApiKey,
    ErrorBody,
    HandshakeAcceptedBody,
    HandshakeBody,
    PushBody,
    RequestBody,
    ResponseBody,
)
from headwater.protocol.messages.base import (
    U32 as U32,
)
from headwater.protocol.messages.base import (
    Size as Size,
)
from headwater.protocol.messages.codec import (
    DATA_FIELDS as DATA_FIELDS,
)
from headwater.protocol.messages.codec import (
    BodyCodec as BodyCodec,
)
from headwater.protocol.messages.codec import (
    body_codec as body_codec,
)
from headwater.protocol.messages.codec import (
    decode_body as decode_body,
)
from headwater.protocol.messages.codec import (
    encode_body as encode_body,
)
from headwater.protocol.messages.data import (
    FetchRequest,
    FetchResponse,
    LookupIdRequest,
    LookupIdResponse,
    LookupKeyRequest,
    LookupKeyResponse,
    OffsetForTimeRequest,
    OffsetForTimeResponse,
    ProduceRequest,
    ProduceResponse,
)
from headwater.protocol.messages.delay import (
    CancelDelayedRequest,
    CancelDelayedResponse,
    DelayStatsRequest,
    DelayStatsResponse,
    HandoffDelayedRequest,
    HandoffDelayedResponse,
)
from headwater.protocol.messages.groups import (
    CommitOffsetsRequest,
    CommitOffsetsResponse,
    DeleteGroupRequest,
    DeleteGroupResponse,
    DescribeGroupRequest,
    DescribeGroupResponse,
    FetchOffsetsRequest,
    FetchOffsetsResponse,
    HeartbeatGroupRequest,
    HeartbeatGroupResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    ListGroupsRequest,
    ListGroupsResponse,
)
from headwater.protocol.messages.keyed import (
    KeyedCommitRequest,
    KeyedCommitResponse,
    KeyedFetchRequest,
    KeyedFetchResponse,
    KeyedGroupRequest,
    KeyedGroupResponse,
    KeyedResizeRequest,
    KeyedResizeResponse,
)
from headwater.protocol.messages.shared import (
    SharedAckRequest,
    SharedAckResponse,
    SharedDescribeRequest,
    SharedDescribeResponse,
    SharedExtendRequest,
    SharedExtendResponse,
    SharedNackRequest,
    SharedNackResponse,
    SharedReceiveRequest,
    SharedReceiveResponse,
)
from headwater.protocol.messages.specs import (
    API_SPECS,
    INTERNAL_APIS,
    PUSH_SPECS,
    STREAM_APIS,
    ApiSpec,
    Resend,
    invoke,
    push_spec_for,
    spec_for,
)
from headwater.protocol.messages.streams import (
    AddSubscriberRequest,
    AddSubscriberResponse,
    CheckpointSubscriberRequest,
    CheckpointSubscriberResponse,
    ClaimSubscriberRequest,
    ClaimSubscriberResponse,
    CloseStreamRequest,
    CloseStreamResponse,
    DeleteSubscriberRequest,
    DeleteSubscriberResponse,
    DescribeSubscriberRequest,
    DescribeSubscriberResponse,
    EndSubscriberStreamsRequest,
    EndSubscriberStreamsResponse,
    FetchStreamRequest,
    FetchStreamResponse,
    ListSubscribersRequest,
    ListSubscribersResponse,
    StreamCreditRequest,
    StreamCreditResponse,
    StreamPush,
    SubscribeRequest,
    SubscribeResponse,
    SubscriptionAckRequest,
    SubscriptionAckResponse,
    SubscriptionPush,
    UnsubscribeRequest,
    UnsubscribeResponse,
)

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
    "AlterQueueRequest",
    "AlterQueueResponse",
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
    "MetadataRequest",
    "MetadataResponse",
    "RebalanceRequest",
    "RebalanceResponse",
    "DecommissionRequest",
    "DecommissionResponse",
    "StatusRequest",
    "StatusResponse",
    "MetricsRequest",
    "MetricsResponse",
    "JoinGroupRequest",
    "JoinGroupResponse",
    "HeartbeatGroupRequest",
    "HeartbeatGroupResponse",
    "DeleteGroupRequest",
    "DeleteGroupResponse",
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
    "ClaimSubscriberRequest",
    "ClaimSubscriberResponse",
    "EndSubscriberStreamsRequest",
    "EndSubscriberStreamsResponse",
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
    "INTERNAL_APIS",
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
    "HandoffDelayedRequest",
    "HandoffDelayedResponse",
    "spec_for",
    "invoke",
]
