"""One (request, response) sample per API of the wire protocol, with the values they carry:
shared by the protocol's round-trip tests and its encoding-speed tests."""

from __future__ import annotations

from headwater.model.batch import encode_batch, patch_batch
from headwater.model.cluster import BrokerAddress, ClusterMetadata, PartitionLocation, PartitionMove, QueueLocations
from headwater.model.config import PartitionInfo, QueueConfig, QueueInfo
from headwater.model.delay import DelayBucketStats, DelayStats, HandedOffBatch, HandoffPage
from headwater.model.groups import GroupAssignment, GroupDescription, GroupSummary, MemberDescription
from headwater.model.keyed import KeyedGroupInfo
from headwater.model.message import Message
from headwater.model.shared import (
    LeaseRefusal,
    SharedGroupInfo,
    SharedGroupSettings,
    SharedLease,
    SharedPartitionInfo,
)
from headwater.model.subscription import SubscriberInfo
from headwater.protocol import (
    AddPartitionsRequest,
    AddPartitionsResponse,
    AlterQueueRequest,
    AlterQueueResponse,
    CancelDelayedRequest,
    CancelDelayedResponse,
    CreateQueueRequest,
    CreateQueueResponse,
    DelayStatsRequest,
    DelayStatsResponse,
    DeleteQueueRequest,
    DeleteQueueResponse,
    DescribeQueueRequest,
    DescribeQueueResponse,
    EndSubscriberStreamsRequest,
    EndSubscriberStreamsResponse,
    FetchRequest,
    FetchResponse,
    HandoffDelayedRequest,
    HandoffDelayedResponse,
    ListQueuesRequest,
    ListQueuesResponse,
    LookupIdRequest,
    LookupIdResponse,
    LookupKeyRequest,
    LookupKeyResponse,
    OffsetForTimeRequest,
    OffsetForTimeResponse,
    PingRequest,
    PingResponse,
    ProduceRequest,
    ProduceResponse,
    SetQueueEnabledRequest,
    SetQueueEnabledResponse,
    TruncateQueueRequest,
    TruncateQueueResponse,
)
from headwater.protocol.messages import (
    AddSubscriberRequest,
    AddSubscriberResponse,
    CheckpointSubscriberRequest,
    CheckpointSubscriberResponse,
    ClaimSubscriberRequest,
    ClaimSubscriberResponse,
    CloseStreamRequest,
    CloseStreamResponse,
    CommitOffsetsRequest,
    CommitOffsetsResponse,
    DecommissionRequest,
    DecommissionResponse,
    DeleteGroupRequest,
    DeleteGroupResponse,
    DeleteSubscriberRequest,
    DeleteSubscriberResponse,
    DescribeGroupRequest,
    DescribeGroupResponse,
    DescribeSubscriberRequest,
    DescribeSubscriberResponse,
    FetchOffsetsRequest,
    FetchOffsetsResponse,
    FetchStreamRequest,
    FetchStreamResponse,
    HeartbeatGroupRequest,
    HeartbeatGroupResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    KeyedCommitRequest,
    KeyedCommitResponse,
    KeyedFetchRequest,
    KeyedFetchResponse,
    KeyedGroupRequest,
    KeyedGroupResponse,
    KeyedResizeRequest,
    KeyedResizeResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    ListGroupsRequest,
    ListGroupsResponse,
    ListSubscribersRequest,
    ListSubscribersResponse,
    MetadataRequest,
    MetadataResponse,
    MetricsRequest,
    MetricsResponse,
    RebalanceRequest,
    RebalanceResponse,
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
    StatusRequest,
    StatusResponse,
    StreamCreditRequest,
    StreamCreditResponse,
    SubscribeRequest,
    SubscribeResponse,
    SubscriptionAckRequest,
    SubscriptionAckResponse,
    UnsubscribeRequest,
    UnsubscribeResponse,
)

BATCH = encode_batch([b"hello", Message(b"world", key=b"k1", tag="greeting")])
STORED = bytes(patch_batch(BATCH, 7, 1, 1000, 1_800_000_000_000))
STORED2 = bytes(patch_batch(encode_batch([b"x" * 50]), 7, 1, 1002, 1_800_000_000_001))
CONFIG = QueueConfig(partitions=2, ttl_s=3600, flush="sync", settings={"owner": "team-a"})
INFO = QueueInfo(
    name="orders",
    queue_id=7,
    config=CONFIG,
    enabled=True,
    created_ms=1_800_000_000_000,
    partitions=[PartitionInfo(0, 0, 10), PartitionInfo(1, 5, 1003)],
)
KEYED = KeyedGroupInfo(
    queue="orders",
    group="billing",
    key="property:user",
    size=3,
    generation=2,
    base={0: 10, 1: 1003},
    positions={0: {0: 12}, 2: {1: 1003}},
    resizing_to=4,
    barrier={0: 20, 1: 1010},
)
SUBSCRIBER = SubscriberInfo(
    queue="orders",
    name="audit",
    partitions=[0, 1],
    tags=["paid"],
    created_ms=1_800_000_000_000,
    checkpoints={0: 4, 1: 1003},
)
SHARED_LEASES = [
    SharedLease(1, 1000, 1, "7:1:3e8:1:m-1", 1_800_000_030_000),
    SharedLease(1, 1002, 3, "7:1:3ea:3:m-1", 1_800_000_030_000),
]
SHARED_INFO = SharedGroupInfo(
    group="workers",
    queue="orders",
    settings=SharedGroupSettings(max_attempts=3, backoff_multiplier=2.0),
    dead_letter_queue="orders.dlq",
    partitions=[
        SharedPartitionInfo(
            partition=1,
            start_offset=5,
            end_offset=1003,
            committed_offset=990,
            delivered_offset=1003,
            leased=2,
            awaiting_retry=1,
            acked_ahead=4,
            dead_lettered=1,
            members={"m-1": 2},
            next_lease_deadline_ms=1_800_000_030_000,
        )
    ],
)
REFUSED = [LeaseRefusal("7:1:3e8:1:m-1", 71, "lease 7:1:3e8:1:m-1 expired")]

GROUP_ASSIGNMENT = GroupAssignment(member_id="m-1", generation=4, assignment={"orders": [0, 1]}, pending=True)
GROUP_DESCRIPTION = GroupDescription(
    group="billing",
    state="reconciling",
    mode="clustering",
    strategy="sticky",
    generation=4,
    members=[
        MemberDescription(
            member_id="m-1",
            client_id="host-1",
            queues=["orders"],
            state="waiting",
            assignment={"orders": [0, 1]},
            pending={"orders": [2]},
            acked_generation=4,
            session_timeout_ms=10_000,
            heartbeat_age_ms=120,
        )
    ],
    offsets={"orders": {0: 17, 1: 5}},
)
GROUP_SUMMARY = GroupSummary(
    group="billing", state="stable", mode="clustering", strategy="sticky", generation=4, members=2, queues=["orders"]
)

DELAY_STATS = DelayStats(
    now_ms=1_800_000_000_000,
    pending_messages=12,
    pending_batches=3,
    next_due_ms=1_800_000_060_000,
    accepted_total=20,
    delivered_total=7,
    cancelled_total=1,
    dropped_total=0,
    delivered_per_s=0.7,
    lateness_p50_ms=2.0,
    lateness_p99_ms=31.0,
    lateness_max_ms=40,
    loaded_batches=3,
    bucket_ms=3_600_000,
    buckets=[
        DelayBucketStats(1_799_996_400_000, 1_800_000_000_000, 2, True),
        DelayBucketStats(1_830_000_000_000, 1_830_003_600_000, 10, False),
    ],
)
DELAYED_OFFSET = (1_800_000_000_000 // 60_000) << 35 | 7  # a delayed id's offset (headwater.model.delay)

# one (request, response) per API: the whole surface of BrokerService plus ping
SAMPLES = [
    (PingRequest(), PingResponse()),
    (CreateQueueRequest("orders", CONFIG), CreateQueueResponse(INFO)),
    (DescribeQueueRequest("orders"), DescribeQueueResponse(INFO)),
    (ListQueuesRequest(), ListQueuesResponse([INFO, INFO])),
    (DeleteQueueRequest("orders"), DeleteQueueResponse()),
    (TruncateQueueRequest("orders"), TruncateQueueResponse(INFO)),
    (SetQueueEnabledRequest("orders", False), SetQueueEnabledResponse(INFO)),
    (AddPartitionsRequest("orders", 4), AddPartitionsResponse(INFO)),
    (ProduceRequest("orders", 1, BATCH), ProduceResponse(7, 1, 1000, 2, 1_800_000_000_000)),
    (
        FetchRequest("orders", 1, 1000, 1 << 20, tag_mask=1 << 63, end_offset=2000, max_wait_ms=500),
        FetchResponse([STORED, STORED2], 1003, 0, 1003),
    ),
    (FetchRequest("orders", 1, 0, 100), FetchResponse([], 0, 0, 0)),
    (LookupIdRequest(7, 1, 1001), LookupIdResponse("orders", STORED)),
    (LookupKeyRequest("orders", b"k1", None, 1_900_000_000_000, 10), LookupKeyResponse([STORED, STORED2])),
    (OffsetForTimeRequest("orders", 1, 1_800_000_000_000), OffsetForTimeResponse(1000)),
    (StatusRequest(), StatusResponse({"version": "0.1.0", "uptime_s": 1.5, "recovery": []})),
    (MetricsRequest(), MetricsResponse("headwater_connections 3.0\n", "text/plain; version=0.0.4; charset=utf-8")),
    (
        MetadataRequest(["orders"]),
        MetadataResponse(
            ClusterMetadata(
                cluster_id="c1",
                controller=2,
                brokers=[BrokerAddress(broker_id=2, host="10.0.0.2", port=7070, epoch=41)],
                queues=[
                    QueueLocations(
                        name="orders",
                        queue_id=5,
                        partitions=[PartitionLocation(partition=0, leader=2, leader_epoch=3, replicas=[2])],
                    )
                ],
                moves=[PartitionMove(queue="orders", partition=0, source=2, target=3, phase="copy")],
            )
        ),
    ),
    (RebalanceRequest(), RebalanceResponse([PartitionMove(queue="orders", partition=1, source=1, target=3)])),
    (RebalanceRequest(True), RebalanceResponse([])),
    (
        DecommissionRequest(2, False),
        DecommissionResponse([PartitionMove(queue="orders", partition=0, source=2, target=1, phase="planned")]),
    ),
    (MetadataRequest(None), MetadataResponse(ClusterMetadata(cluster_id="", controller=-1, brokers=[], queues=[]))),
    (CommitOffsetsRequest("billing", "orders", {0: 17, 3: 2}), CommitOffsetsResponse()),
    (AlterQueueRequest("orders", {"ttl_s": None, "flush": "sync"}), AlterQueueResponse(INFO)),
    (FetchOffsetsRequest("billing", "orders"), FetchOffsetsResponse({0: 17, 3: 2})),
    (DeleteGroupRequest("billing", "orders"), DeleteGroupResponse()),
    (CommitOffsetsRequest("billing", "orders", {0: 17}, "m-1", 4), CommitOffsetsResponse()),
    (
        JoinGroupRequest("billing", None, "host-1", ["orders", "refunds"], "clustering", "sticky", 10_000),
        JoinGroupResponse(GROUP_ASSIGNMENT),
    ),
    (
        JoinGroupRequest("billing", "m-1", "host-1", ["orders"], "broadcast", "average", 500),
        JoinGroupResponse(GroupAssignment(member_id="m-1", generation=1, assignment={})),
    ),
    (HeartbeatGroupRequest("billing", "m-1", 3), HeartbeatGroupResponse(GROUP_ASSIGNMENT)),
    (LeaveGroupRequest("billing", "m-1"), LeaveGroupResponse()),
    (DescribeGroupRequest("billing"), DescribeGroupResponse(GROUP_DESCRIPTION)),
    (DescribeGroupRequest("billing"), DescribeGroupResponse(GroupDescription(group="billing", state="empty"))),
    (ListGroupsRequest(), ListGroupsResponse([GROUP_SUMMARY, GroupSummary(group="old", state="empty")])),
    (KeyedGroupRequest("orders", "billing", "key", 3, "latest"), KeyedGroupResponse(KEYED)),
    (KeyedGroupRequest("orders", "billing"), KeyedGroupResponse(KEYED)),
    (
        KeyedFetchRequest("orders", "billing", 2, 7, 1, 1000, 1 << 20, 250),
        KeyedFetchResponse([STORED, STORED2], 1003, 0, 1003, 7, 1010),
    ),
    (KeyedCommitRequest("orders", "billing", 2, 7, {0: 5, 1: 1003}), KeyedCommitResponse(KEYED)),
    (KeyedResizeRequest("orders", "billing", 4), KeyedResizeResponse(KEYED)),
    (FetchStreamRequest(4, "orders", {0: 10, 1: 1003}, 1 << 22, 0b101, 1 << 16), FetchStreamResponse()),
    (StreamCreditRequest(4, 1 << 21), StreamCreditResponse()),
    (CloseStreamRequest(4), CloseStreamResponse()),
    (SubscribeRequest(3, "orders", "audit", 1000, 1 << 22), SubscribeResponse(SUBSCRIBER)),
    (SubscribeRequest(3, "orders", "audit", 1000, 1 << 22, 4, {0: 17, 2: 0}, ["paid"]), SubscribeResponse(SUBSCRIBER)),
    (UnsubscribeRequest(3), UnsubscribeResponse()),
    (SubscriptionAckRequest(3, {0: 5}, 10, 4096), SubscriptionAckResponse()),
    (SubscriptionAckRequest(3, {}, 1, 0), SubscriptionAckResponse()),
    (
        AddSubscriberRequest("orders", "audit", [0, 1], ["paid"], "time:1800000000000"),
        AddSubscriberResponse(SUBSCRIBER),
    ),
    (AddSubscriberRequest("orders", "audit"), AddSubscriberResponse(SUBSCRIBER)),
    (DeleteSubscriberRequest("orders", "audit"), DeleteSubscriberResponse()),
    (ListSubscribersRequest("orders"), ListSubscribersResponse([SUBSCRIBER, SUBSCRIBER])),
    (ListSubscribersRequest(), ListSubscribersResponse([])),
    (DescribeSubscriberRequest("orders", "audit"), DescribeSubscriberResponse(SUBSCRIBER)),
    (CheckpointSubscriberRequest("orders", "audit", {1: 1003}), CheckpointSubscriberResponse()),
    (CheckpointSubscriberRequest("orders", "audit", {1: 1003}, 4), CheckpointSubscriberResponse()),
    (ClaimSubscriberRequest("orders", "audit"), ClaimSubscriberResponse(SUBSCRIBER)),
    (EndSubscriberStreamsRequest("orders", "audit", 4), EndSubscriberStreamsResponse()),
    (EndSubscriberStreamsRequest("orders", "audit", 0, True), EndSubscriberStreamsResponse()),
    (
        SharedReceiveRequest(
            "workers", "orders", "m-1", 32, 30_000, False, {"max_attempts": 3, "backoff_multiplier": 2.0}, 1000
        ),
        SharedReceiveResponse([STORED, STORED2], SHARED_LEASES),
    ),
    (SharedReceiveRequest("workers", "orders", "m-1", 1, 100, True), SharedReceiveResponse([], [])),
    (SharedAckRequest("workers", "orders", "m-1", ["7:1:3e8:1:m-1"]), SharedAckResponse(REFUSED)),
    (SharedNackRequest("workers", "orders", "m-1", ["7:1:3ea:3:m-1"], "boom", 500), SharedNackResponse([])),
    (SharedNackRequest("workers", "orders", "m-1", ["7:1:3ea:3:m-1"]), SharedNackResponse([])),
    (SharedExtendRequest("workers", "orders", "m-1", ["7:1:3ea:3:m-1"], 60_000), SharedExtendResponse(REFUSED)),
    (SharedDescribeRequest("workers", "orders"), SharedDescribeResponse(SHARED_INFO)),
    (CancelDelayedRequest(7, 0x80000001, DELAYED_OFFSET), CancelDelayedResponse()),
    (
        HandoffDelayedRequest("orders", 1, 4, -1, 1 << 20),
        HandoffDelayedResponse(
            HandoffPage([HandedOffBatch(DELAYED_OFFSET, 12, 1_700_000_000_000, bytes(BATCH), [1], [(0, 17)])], True)
        ),
    ),
    (HandoffDelayedRequest("orders", 1, 4, DELAYED_OFFSET, 1), HandoffDelayedResponse(HandoffPage([], False))),
    (DelayStatsRequest(), DelayStatsResponse(DELAY_STATS)),
    (
        DelayStatsRequest(),
        DelayStatsResponse(
            DelayStats(
                now_ms=0,
                pending_messages=0,
                pending_batches=0,
                next_due_ms=None,
                accepted_total=0,
                delivered_total=0,
                cancelled_total=0,
                dropped_total=0,
                delivered_per_s=0.0,
                lateness_p50_ms=None,
                lateness_p99_ms=None,
                lateness_max_ms=None,
                loaded_batches=0,
                bucket_ms=60_000,
            )
        ),
    ),
    (LookupIdRequest(7, 0x80000001, DELAYED_OFFSET), LookupIdResponse("orders", STORED)),
]
