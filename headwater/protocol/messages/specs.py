"""The table of operations: for each API key its request and response bodies, the
:class:`~headwater.model.service.BrokerService` method it maps to, whether a client may send
it again (:class:`Resend`) and whether the server may hold it (a long poll); the PUSH bodies
by key; and :func:`invoke`, which runs a request against a service."""

from __future__ import annotations

from collections.abc import Callable
from enum import IntEnum
from typing import Any, NamedTuple

import msgspec

from headwater.model.service import BrokerService
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
from headwater.protocol.messages.base import ApiKey, PushBody, RequestBody, ResponseBody
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
        ApiSpec(ApiKey.ALTER_QUEUE, AlterQueueRequest, AlterQueueResponse, "alter_queue"),
        ApiSpec(ApiKey.PRODUCE, ProduceRequest, ProduceResponse, "produce", resend=Resend.NEVER),
        ApiSpec(ApiKey.FETCH, FetchRequest, FetchResponse, "fetch", waits=True),
        ApiSpec(ApiKey.LOOKUP_ID, LookupIdRequest, LookupIdResponse, "lookup_id"),
        ApiSpec(ApiKey.LOOKUP_KEY, LookupKeyRequest, LookupKeyResponse, "lookup_key"),
        ApiSpec(ApiKey.OFFSET_FOR_TIME, OffsetForTimeRequest, OffsetForTimeResponse, "offset_for_time"),
        ApiSpec(ApiKey.COMMIT_OFFSETS, CommitOffsetsRequest, CommitOffsetsResponse, "commit_offsets"),
        ApiSpec(ApiKey.FETCH_OFFSETS, FetchOffsetsRequest, FetchOffsetsResponse, "fetch_offsets"),
        # a second delete of a group deleted meanwhile says GroupNotFound, not done
        ApiSpec(ApiKey.DELETE_GROUP, DeleteGroupRequest, DeleteGroupResponse, "delete_group", resend=_ONCE),
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
        # each claim bumps the epoch: a second one (after a lost answer) only bumps it again
        ApiSpec(ApiKey.CLAIM_SUBSCRIBER, ClaimSubscriberRequest, ClaimSubscriberResponse, "claim_subscriber"),
        # broker to broker (INTERNAL_APIS): a coordinator ends the older or deleted streams
        ApiSpec(ApiKey.END_SUBSCRIBER_STREAMS, EndSubscriberStreamsRequest, EndSubscriberStreamsResponse, None),
        # cancelling twice is fine (the second finds it cancelled)
        ApiSpec(ApiKey.CANCEL_DELAYED, CancelDelayedRequest, CancelDelayedResponse, "cancel_delayed"),
        ApiSpec(ApiKey.DELAY_STATS, DelayStatsRequest, DelayStatsResponse, "delay_stats"),
        # broker to broker (INTERNAL_APIS): a page of a moving partition's delayed messages
        ApiSpec(ApiKey.HANDOFF_DELAYED, HandoffDelayedRequest, HandoffDelayedResponse, None),
        ApiSpec(ApiKey.STATUS, StatusRequest, StatusResponse, "status"),
        ApiSpec(ApiKey.METRICS, MetricsRequest, MetricsResponse, "metrics"),
        ApiSpec(ApiKey.METADATA, MetadataRequest, MetadataResponse, "metadata"),
        # a second plan would plan again over the moves the first started
        ApiSpec(ApiKey.REBALANCE, RebalanceRequest, RebalanceResponse, "rebalance", resend=_ONCE),
        ApiSpec(ApiKey.DECOMMISSION, DecommissionRequest, DecommissionResponse, "decommission", resend=_ONCE),
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

#: The requests one broker of a cluster sends another: only a server serves them, and no
#: client service has them.
INTERNAL_APIS = frozenset({ApiKey.HANDOFF_DELAYED, ApiKey.END_SUBSCRIBER_STREAMS})

for _s in API_SPECS.values():
    assert _s.request.api is _s.key and _s.response.api is _s.key, _s
    assert not _s.waits or "max_wait_ms" in _s.request.__struct_fields__, _s
del _s


#: The body of a PUSH frame, by the api key in its header.
PUSH_SPECS: dict[ApiKey, type[PushBody]] = {ApiKey.SUBSCRIBE: SubscriptionPush, ApiKey.FETCH_STREAM: StreamPush}


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


def invoke(service: BrokerService, request: RequestBody) -> ResponseBody:
    """Run a request against a service the plain way (no long polling); the response body.

    Exceptions of the service propagate: the caller turns them into error responses.
    """
    spec = API_SPECS[request.api]
    if spec.method is None:
        if spec.key in STREAM_APIS or spec.key in INTERNAL_APIS:
            from headwater.errors import UsageError

            what = "acts on a connection's push streams" if spec.key in STREAM_APIS else "is broker to broker"
            raise UsageError(f"{spec.key.name} {what}: only a server serves it")
        return spec.response.from_result(None)
    args = msgspec.structs.asdict(request)
    if spec.key is ApiKey.FETCH or spec.key is ApiKey.KEYED_FETCH:
        del args["max_wait_ms"]
    return spec.response.from_result(getattr(service, spec.method)(**args))
