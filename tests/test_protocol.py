"""The wire protocol: a client and a server Connection wired back to back, no sockets."""

from __future__ import annotations

import inspect
import random
import struct
from pathlib import Path

import crc32c
import msgspec
import pytest

import headwater.errors as errors_mod
from headwater.errors import (
    HeadwaterError,
    InvalidArgumentError,
    MessageTooLargeError,
    QueueNotFoundError,
    UnavailableError,
)
from headwater.model.batch import encode_batch
from headwater.model.cluster import BrokerAddress, ClusterMetadata, PartitionMove, QueueLocations
from headwater.model.config import QueueConfig, QueuePage
from headwater.model.keyed import KeyedFetchResult
from headwater.model.service import BrokerService, FetchResult, MetricsExposition, ProduceResult
from headwater.model.shared import (
    SharedDeliveries,
)
from headwater.protocol import (
    API_SPECS,
    CLIENT,
    FRAME_BYTES_MIN,
    HEADER_SIZE,
    NEED_DATA,
    SERVER,
    VERSION_MAX,
    VERSION_MIN,
    AddPartitionsRequest,
    AlterQueueRequest,
    ApiKey,
    CancelDelayedRequest,
    Connection,
    ConnectionClosed,
    CreateQueueRequest,
    DelayStatsRequest,
    DeleteQueueRequest,
    DescribeQueueRequest,
    DescribeQueueResponse,
    ErrorResponse,
    FetchRequest,
    FetchResponse,
    FrameTooLargeError,
    FrameType,
    Handshake,
    HandshakeAccepted,
    ListQueuesRequest,
    LocalProtocolError,
    LookupIdRequest,
    LookupKeyRequest,
    OffsetForTimeRequest,
    OffsetForTimeResponse,
    PingRequest,
    PingResponse,
    ProduceRequest,
    ProduceResponse,
    ProtocolError,
    RemoteProtocolError,
    Request,
    Response,
    SetQueueEnabledRequest,
    State,
    TruncateQueueRequest,
    UnsupportedVersionError,
    choose_version,
    error_for_code,
    invoke,
)
from headwater.protocol._state import TRANSITIONS, Direction, Kind
from headwater.protocol.events import Push
from headwater.protocol.frames import HEADER
from headwater.protocol.messages import (
    AddSubscriberRequest,
    CheckpointSubscriberRequest,
    ClaimSubscriberRequest,
    CloseStreamRequest,
    CommitOffsetsRequest,
    DecommissionRequest,
    DeleteGroupRequest,
    DeleteSubscriberRequest,
    DescribeGroupRequest,
    DescribeSubscriberRequest,
    FetchOffsetsRequest,
    FetchStreamRequest,
    HandshakeAcceptedBody,
    HandshakeBody,
    HeartbeatGroupRequest,
    JoinGroupRequest,
    KeyedCommitRequest,
    KeyedFetchRequest,
    KeyedGroupRequest,
    KeyedResizeRequest,
    LeaveGroupRequest,
    ListGroupsRequest,
    ListSubscribersRequest,
    MetadataRequest,
    MetricsRequest,
    RebalanceRequest,
    SharedAckRequest,
    SharedDescribeRequest,
    SharedExtendRequest,
    SharedNackRequest,
    SharedReceiveRequest,
    StatusRequest,
    StreamCreditRequest,
    StreamPush,
    SubscribeRequest,
    SubscriptionPush,
)
from tests.support.frames import raw
from tests.support.protocol_samples import (
    BATCH,
    CONFIG,
    DELAY_STATS,
    DELAYED_OFFSET,
    GROUP_ASSIGNMENT,
    GROUP_DESCRIPTION,
    GROUP_SUMMARY,
    INFO,
    KEYED,
    REFUSED,
    SAMPLES,
    SHARED_INFO,
    SHARED_LEASES,
    STORED,
    STORED2,
    SUBSCRIBER,
)

DOC = Path(__file__).resolve().parent.parent / "docs" / "protocol.md"

# fixtures and helpers --------------------------------------------------------------------


def feed(conn: Connection, data: bytes) -> list:
    """Give ``data`` to ``conn`` and collect its events up to NEED_DATA."""
    conn.receive_data(data)
    return drain(conn)


def drain(conn: Connection) -> list:
    out = []
    for _ in range(10_000):
        ev = conn.next_event()
        if ev is NEED_DATA:
            return out
        out.append(ev)
        if isinstance(ev, ConnectionClosed):
            return out
    raise AssertionError("next_event never asked for data")


def pair(**server_settings) -> tuple[Connection, Connection]:
    """A client and a server after a successful handshake."""
    client = Connection(CLIENT)
    server = Connection(SERVER, **server_settings)
    [hs] = feed(server, client.send(Handshake("test-client")))
    [acc] = feed(client, server.send(HandshakeAccepted(choose_version(hs), "test-server")))
    assert isinstance(acc, HandshakeAccepted)
    return client, server


def raises_remote(conn: Connection, data: bytes, match: str, exc=RemoteProtocolError) -> None:
    conn.receive_data(data)
    with pytest.raises(exc, match=match):
        conn.next_event()
    assert conn.state is State.ERROR
    with pytest.raises(RemoteProtocolError, match="already failed"):
        conn.next_event()


# round trips -----------------------------------------------------------------------------


def test_samples_cover_every_api():
    assert {req.api for req, _ in SAMPLES} == set(ApiKey) == set(API_SPECS)


@pytest.mark.parametrize("req,resp", SAMPLES, ids=lambda v: type(v).__name__)
def test_round_trip_in_one_piece(req, resp):
    client, server = pair()
    rid = client.next_request_id()
    [got] = feed(server, client.send(Request(rid, req)))
    assert got == Request(rid, req) and got.api is req.api
    [answer] = feed(client, server.send(Response(rid, resp)))
    assert answer == Response(rid, resp)
    assert not client.in_flight and not server.in_flight


def receiver(role, rid: int, req) -> Connection:
    """A fresh connection ready to receive the request (server) or its answer (client)."""
    client, server = pair()
    if role is SERVER:
        return server
    client.send(Request(rid, req))
    return client


@pytest.mark.parametrize("req,resp", SAMPLES, ids=lambda v: type(v).__name__)
def test_round_trip_split_at_every_byte(req, resp):
    client, server = pair()
    rid = client.next_request_id()
    request = client.send(Request(rid, req))
    feed(server, request)
    response = server.send(Response(rid, resp))
    for event, data, role in ((Request(rid, req), request, SERVER), (Response(rid, resp), response, CLIENT)):
        for cut in range(1, len(data)):
            dst = receiver(role, rid, req)
            assert feed(dst, data[:cut]) == []
            assert feed(dst, data[cut:]) == [event]
        # and byte by byte
        dst = receiver(role, rid, req)
        events = []
        for i in range(len(data)):
            events += feed(dst, data[i : i + 1])
            assert events == ([] if i < len(data) - 1 else [event])


def test_batches_travel_unchanged_and_uncopied():
    client, server = pair()
    mv = memoryview(b"junk" + STORED)[4:]  # as the store hands out slices of a read
    chunks = server_answer_chunks(client, server, FetchResponse([mv, STORED2], 1, 0, 1))
    assert any(c is mv for c in chunks) and any(c is STORED2 for c in chunks)
    [got] = feed(client, b"".join(chunks))
    assert got.body.batches == [STORED, STORED2] and all(type(b) is bytes for b in got.body.batches)
    chunks = client.send_chunks(Request(client.next_request_id(), ProduceRequest("q", 0, BATCH)))
    assert chunks[-1] is BATCH


def server_answer_chunks(client, server, body):
    rid = client.next_request_id()
    feed(server, client.send(Request(rid, FetchRequest("q", 0, 0, 10))))
    return server.send_chunks(Response(rid, body))


def test_frame_header_layout():
    client, server = pair()
    data = client.send(Request(5, ProduceRequest("q", 3, BATCH)))
    length, crc, ftype, flags, api, rid, data_size = HEADER.unpack_from(data)
    assert HEADER_SIZE == 20 and length == len(data) - 4
    assert (ftype, flags, api, rid, data_size) == (FrameType.REQUEST, 0, 20, 5, len(BATCH))
    assert data.endswith(BATCH)
    head = data[HEADER_SIZE : len(data) - len(BATCH)]
    assert msgspec.msgpack.decode(head) == ["q", 3, len(BATCH)]
    assert crc == crc32c.crc32c(data[8:])


class FakeService:
    """Answers every BrokerService call with fixed values and records the calls."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def __getattr__(self, name):
        results = {
            "create_queue": INFO,
            "describe_queue": INFO,
            "list_queues": QueuePage([INFO], "orders"),
            "delete_queue": None,
            "truncate_queue": INFO,
            "set_queue_enabled": INFO,
            "add_partitions": INFO,
            "alter_queue": INFO,
            "produce": ProduceResult(7, 1, 1000, 2, 5),
            "fetch": FetchResult([STORED], 1003, 0, 1003),
            "lookup_id": ("orders", STORED),
            "lookup_key": [STORED, STORED2],
            "offset_for_time": 42,
            "status": {"version": "x"},
            "metrics": MetricsExposition("headwater_connections 1.0\n", "text/plain"),
            "metadata": ClusterMetadata(
                cluster_id="c",
                controller=1,
                brokers=[BrokerAddress(broker_id=1, host="h", port=1, epoch=9)],
                queues=[QueueLocations(name="orders", queue_id=7, partitions=[])],
            ),
            "rebalance": [PartitionMove(queue="orders", partition=1, source=1, target=3)],
            "decommission": [],
            "commit_offsets": None,
            "fetch_offsets": {1: 5},
            "join_group": GROUP_ASSIGNMENT,
            "heartbeat_group": GROUP_ASSIGNMENT,
            "leave_group": None,
            "describe_group": GROUP_DESCRIPTION,
            "list_groups": [GROUP_SUMMARY],
            "keyed_group": KEYED,
            "keyed_fetch": KeyedFetchResult([STORED], 1003, 0, 1003, 2, None),
            "keyed_commit": KEYED,
            "keyed_resize": KEYED,
            "add_subscriber": SUBSCRIBER,
            "delete_subscriber": None,
            "list_subscribers": [SUBSCRIBER],
            "describe_subscriber": SUBSCRIBER,
            "checkpoint_subscriber": None,
            "claim_subscriber": SUBSCRIBER,
            "shared_receive": SharedDeliveries([STORED], SHARED_LEASES),
            "shared_ack": REFUSED,
            "shared_nack": [],
            "shared_extend": REFUSED,
            "shared_describe": SHARED_INFO,
            "cancel_delayed": None,
            "delay_stats": DELAY_STATS,
            "delete_group": None,
        }
        if name not in results:
            raise AttributeError(name)

        def call(*args, **kwargs):
            self.calls.append((name, args, kwargs))
            if [*args, *kwargs.values()][:1] == ["missing"]:
                raise QueueNotFoundError("no queue named 'missing'")
            return results[name]

        return call


def _bound(name: str, args: tuple, kwargs: dict) -> tuple[str, dict]:
    sig = inspect.signature(getattr(BrokerService, name))
    bound = sig.bind(None, *args, **kwargs)
    bound.apply_defaults()
    return name, dict(list(bound.arguments.items())[1:])


class Remote:
    """A BrokerService over the protocol, as the network client will be (minus sockets)."""

    def __init__(self, service) -> None:
        self.client, self.server = pair()
        self.service = service

    def call(self, body):
        [req] = feed(self.server, self.client.send(Request(self.client.next_request_id(), body)))
        try:
            answer = Response(req.request_id, invoke(self.service, req.body))
        except HeadwaterError as e:
            answer = ErrorResponse.from_exception(req.request_id, e)
        [ev] = feed(self.client, self.server.send(answer))
        if isinstance(ev, ErrorResponse):
            raise ev.exception()
        return ev.result()


def test_every_service_method_crosses_the_wire():
    fake, local = FakeService(), FakeService()
    remote = Remote(fake)
    cases = [
        (CreateQueueRequest("orders", CONFIG), lambda s: s.create_queue("orders", CONFIG)),
        (DescribeQueueRequest("orders"), lambda s: s.describe_queue("orders")),
        (ListQueuesRequest("a", 10), lambda s: s.list_queues("a", 10)),
        (DeleteQueueRequest("orders"), lambda s: s.delete_queue("orders")),
        (TruncateQueueRequest("orders"), lambda s: s.truncate_queue("orders")),
        (SetQueueEnabledRequest("orders", True), lambda s: s.set_queue_enabled("orders", True)),
        (AddPartitionsRequest("orders", 3), lambda s: s.add_partitions("orders", 3)),
        (AlterQueueRequest("orders", {"ttl_s": 60}), lambda s: s.alter_queue("orders", {"ttl_s": 60})),
        (ProduceRequest("orders", 1, BATCH), lambda s: s.produce("orders", 1, BATCH)),
        (
            FetchRequest("orders", 1, 5, 1000, 3, None, 250),
            lambda s: s.fetch("orders", 1, 5, max_bytes=1000, tag_mask=3, end_offset=None),
        ),
        (LookupIdRequest(7, 1, 1001), lambda s: s.lookup_id(7, 1, 1001)),
        (LookupKeyRequest("orders", b"k", 1, None, 5), lambda s: s.lookup_key("orders", b"k", 1, None, 5)),
        (OffsetForTimeRequest("orders", 1, 99), lambda s: s.offset_for_time("orders", 1, 99)),
        (StatusRequest(), lambda s: s.status()),
        (MetricsRequest(), lambda s: s.metrics()),
        (MetadataRequest(["orders"]), lambda s: s.metadata(["orders"])),
        (RebalanceRequest(True), lambda s: s.rebalance(dry_run=True)),
        (DecommissionRequest(3, False), lambda s: s.decommission(3, dry_run=False)),
        (CommitOffsetsRequest("g", "orders", {1: 5}), lambda s: s.commit_offsets("g", "orders", {1: 5})),
        (FetchOffsetsRequest("g", "orders"), lambda s: s.fetch_offsets("g", "orders")),
        (DeleteGroupRequest("g", None), lambda s: s.delete_group("g", None)),
        (
            CommitOffsetsRequest("g", "orders", {1: 5}, "m-1", 3),
            lambda s: s.commit_offsets("g", "orders", {1: 5}, member_id="m-1", generation=3),
        ),
        (
            JoinGroupRequest("g", None, "c", ["orders"], "clustering", "sticky", 5000),
            lambda s: s.join_group("g", None, "c", ["orders"], "clustering", "sticky", 5000),
        ),
        (HeartbeatGroupRequest("g", "m-1", 2), lambda s: s.heartbeat_group("g", "m-1", 2)),
        (LeaveGroupRequest("g", "m-1"), lambda s: s.leave_group("g", "m-1")),
        (DescribeGroupRequest("g"), lambda s: s.describe_group("g")),
        (ListGroupsRequest(), lambda s: s.list_groups()),
        (KeyedGroupRequest("orders", "g", "key", 3), lambda s: s.keyed_group("orders", "g", "key", 3)),
        (KeyedGroupRequest("orders", "g"), lambda s: s.keyed_group("orders", "g")),
        (
            KeyedFetchRequest("orders", "g", 1, 2, 0, 5, 1000, 250),
            lambda s: s.keyed_fetch("orders", "g", 1, 2, 0, 5, max_bytes=1000),
        ),
        (KeyedCommitRequest("orders", "g", 1, 2, {0: 5}), lambda s: s.keyed_commit("orders", "g", 1, 2, {0: 5})),
        (KeyedResizeRequest("orders", "g", 4), lambda s: s.keyed_resize("orders", "g", 4)),
        (
            AddSubscriberRequest("orders", "audit", [0], ["paid"], "earliest"),
            lambda s: s.add_subscriber("orders", "audit", [0], ["paid"], "earliest"),
        ),
        (DeleteSubscriberRequest("orders", "audit"), lambda s: s.delete_subscriber("orders", "audit")),
        (ListSubscribersRequest(None), lambda s: s.list_subscribers()),
        (DescribeSubscriberRequest("orders", "audit"), lambda s: s.describe_subscriber("orders", "audit")),
        (
            CheckpointSubscriberRequest("orders", "audit", {0: 3}),
            lambda s: s.checkpoint_subscriber("orders", "audit", {0: 3}),
        ),
        (
            CheckpointSubscriberRequest("orders", "audit", {0: 3}, 2),
            lambda s: s.checkpoint_subscriber("orders", "audit", {0: 3}, epoch=2),
        ),
        (ClaimSubscriberRequest("orders", "audit"), lambda s: s.claim_subscriber("orders", "audit")),
        (
            SharedReceiveRequest("g", "orders", "m-1", 8, 500, False, {"max_attempts": 2}, 250),
            lambda s: s.shared_receive("g", "orders", "m-1", 8, 500, False, {"max_attempts": 2}, 250),
        ),
        (
            SharedAckRequest("g", "orders", "m-1", ["7:1:3e8:1:m-1"]),
            lambda s: s.shared_ack("g", "orders", "m-1", ["7:1:3e8:1:m-1"]),
        ),
        (
            SharedNackRequest("g", "orders", "m-1", ["7:1:3e8:1:m-1"], "bad", None),
            lambda s: s.shared_nack("g", "orders", "m-1", ["7:1:3e8:1:m-1"], "bad"),
        ),
        (
            SharedExtendRequest("g", "orders", "m-1", ["7:1:3e8:1:m-1"], 9000),
            lambda s: s.shared_extend("g", "orders", "m-1", ["7:1:3e8:1:m-1"], 9000),
        ),
        (SharedDescribeRequest("g", "orders"), lambda s: s.shared_describe("g", "orders")),
        (
            CancelDelayedRequest(7, 0x80000001, DELAYED_OFFSET),
            lambda s: s.cancel_delayed(7, 0x80000001, DELAYED_OFFSET),
        ),
        (DelayStatsRequest(), lambda s: s.delay_stats()),
    ]
    for body, direct in cases:
        assert remote.call(body) == direct(local)
        # the same arguments reach the service as in a direct call
        assert _bound(*fake.calls[-1]) == _bound(*local.calls[-1])
    assert remote.call(PingRequest()) is None
    assert {c[0] for c in fake.calls} == {s.method for s in API_SPECS.values() if s.method}


def test_service_errors_raise_the_same_class_on_the_client():
    remote = Remote(FakeService())
    with pytest.raises(QueueNotFoundError, match="no queue named 'missing'") as info:
        remote.call(DescribeQueueRequest("missing"))
    assert info.value.code == 7 and not info.value.retriable
    # the connection carries on after an error response
    assert remote.call(DescribeQueueRequest("orders")) == INFO


def test_against_a_real_broker(tmp_path):
    from headwater.broker import Broker
    from headwater.model.batch_reads import decode_records

    broker = Broker.open(tmp_path / "data")
    try:
        remote = Remote(broker)
        info = remote.call(CreateQueueRequest("orders", QueueConfig(partitions=2)))
        assert info == broker.describe_queue("orders")
        produced = remote.call(ProduceRequest("orders", 1, BATCH))
        assert isinstance(produced, ProduceResult) and produced.count == 2
        fetched = remote.call(FetchRequest("orders", 1, 0, 1 << 20))
        assert [r.body for b in fetched.batches for r in decode_records(b, "orders")] == [b"hello", b"world"]
        name, batch = remote.call(LookupIdRequest(info.queue_id, 1, 1))
        assert name == "orders" and decode_records(batch, name)[1].key == b"k1"
        assert remote.call(LookupKeyRequest("orders", b"k1", None, None, 10))
        assert remote.call(OffsetForTimeRequest("orders", 1, 0)) == 0
        assert remote.call(SetQueueEnabledRequest("orders", False)).enabled is False
        with pytest.raises(errors_mod.QueueDisabledError):
            remote.call(FetchRequest("orders", 1, 0, 100))
        assert len(remote.call(AddPartitionsRequest("orders", 3)).partitions) == 3
        assert [q.name for q in remote.call(ListQueuesRequest()).queues] == ["orders"]
        remote.call(TruncateQueueRequest("orders"))
        assert remote.call(DeleteQueueRequest("orders")) is None
        with pytest.raises(QueueNotFoundError):
            remote.call(DescribeQueueRequest("orders"))
    finally:
        broker.close()


# pipelining and flow control -------------------------------------------------------------


def test_pipelining_out_of_order():
    client, server = pair()
    sent = {}
    wire = b""
    for i in range(100):
        rid = client.next_request_id()
        sent[rid] = OffsetForTimeRequest("q", i, i * 10)
        wire += client.send(Request(rid, sent[rid]))
    assert len(client.in_flight) == 100
    requests = feed(server, wire)  # one read holding all of them
    assert [r.body for r in requests] == list(sent.values())
    random.Random(7).shuffle(requests)
    answers = b""
    for r in requests:
        if r.body.partition % 10 == 3:
            answers += server.send(ErrorResponse.from_exception(r.request_id, UnavailableError("later")))
        else:
            answers += server.send(Response(r.request_id, OffsetForTimeResponse(r.body.timestamp_ms)))
    events = feed(client, answers)
    assert [e.request_id for e in events] == [r.request_id for r in requests]
    for e in events:
        if isinstance(e, ErrorResponse):
            assert sent[e.request_id].partition % 10 == 3 and e.retriable
            assert isinstance(e.exception(), UnavailableError)
        else:
            assert e.result() == sent[e.request_id].timestamp_ms
    assert not client.in_flight and not server.in_flight


def test_requests_in_flight_bound():
    client, server = pair(requests_in_flight_max=3)
    assert client.requests_in_flight_max == 3  # the smaller of client's 256 and server's 3
    assert client.request_room() == 3
    wire = b"".join(client.send(Request(client.next_request_id(), PingRequest())) for _ in range(3))
    assert client.request_room() == 0
    with pytest.raises(LocalProtocolError, match="wait for a response"):
        client.send(Request(client.next_request_id(), PingRequest()))
    assert client.state is State.READY and len(client.in_flight) == 3  # unchanged
    reqs = feed(server, wire)
    feed(client, server.send(Response(reqs[1].request_id, PingResponse())))
    assert client.request_room() == 1
    rid = client.next_request_id()
    assert rid not in client.in_flight
    assert feed(server, client.send(Request(rid, PingRequest())))[0].request_id == rid
    # a client ignoring the announced bound is refused by the server, from the header
    raises_remote(server, raw(FrameType.REQUEST, 1, 999, PingRequest())[:HEADER_SIZE], "more than 3 requests in flight")


def test_request_ids_are_unique_among_in_flight():
    client, server = pair()
    client.send(Request(9, PingRequest()))
    with pytest.raises(LocalProtocolError, match="already in flight"):
        client.send(Request(9, PingRequest()))
    for bad in (0, -1, 2**32, True):
        with pytest.raises(LocalProtocolError, match="request id"):
            client.send(Request(bad, PingRequest()))
    feed(server, raw(FrameType.REQUEST, 1, 9, PingRequest()))
    raises_remote(server, raw(FrameType.REQUEST, 1, 9, PingRequest()), "already in flight")


def test_next_request_id_wraps_and_skips_in_flight():
    client, _ = pair()
    client._next_id = 2**32 - 1
    assert client.next_request_id() == 2**32 - 1
    client.send(Request(1, PingRequest()))
    assert client.next_request_id() == 2


def test_frame_too_large_for_the_peer_is_refused_before_sending():
    client, server = pair(frame_bytes_max=FRAME_BYTES_MIN)
    assert client.peer_frame_bytes_max == FRAME_BYTES_MIN
    big = encode_batch([b"x" * 10_000])
    with pytest.raises(MessageTooLargeError, match="frame_bytes_max"):
        client.send(Request(1, ProduceRequest("q", 0, big)))
    assert client.state is State.READY and not client.in_flight
    assert feed(server, client.send(Request(1, PingRequest())))[0].request_id == 1


# handshake -------------------------------------------------------------------------------


def test_handshake_exchanges_names_versions_and_limits():
    client = Connection(CLIENT, frame_bytes_max=1 << 20, requests_in_flight_max=64)
    server = Connection(SERVER, requests_in_flight_max=16)
    assert client.state is server.state is State.AWAIT_HANDSHAKE
    [hs] = feed(server, client.send(Handshake("app/1.0")))
    assert hs == Handshake("app/1.0", VERSION_MIN, VERSION_MAX, 1 << 20)
    assert server.state is State.AWAIT_ACCEPT and server.peer_name == "app/1.0"
    assert server.peer_frame_bytes_max == 1 << 20
    [acc] = feed(client, server.send(HandshakeAccepted(choose_version(hs), "hw/0.1")))
    assert acc.version == 1 and acc.server_name == "hw/0.1" and acc.requests_in_flight_max == 16
    assert client.state is server.state is State.READY
    assert client.version == server.version == 1 and client.peer_name == "hw/0.1"
    assert client.requests_in_flight_max == 16


def test_unsupported_version_is_refused_with_an_error_then_closed():
    client, server = Connection(CLIENT), Connection(SERVER)
    [hs] = feed(server, client.send(Handshake("future", version_min=VERSION_MAX + 1, version_max=9)))
    with pytest.raises(UnsupportedVersionError, match="speaks protocol versions 2 to 9") as info:
        choose_version(hs)
    with pytest.raises(LocalProtocolError, match="choose_version"):
        server.send(HandshakeAccepted(1, "s"))  # not a version the client offered
    data = server.send(ErrorResponse.from_exception(0, info.value))
    assert server.state is State.CLOSED
    [err, closed] = feed(client, data)
    assert client.state is State.CLOSED and closed == ConnectionClosed()
    assert err.request_id == 0 and err.code == 54
    exc = err.exception()
    assert type(exc) is UnsupportedVersionError and isinstance(exc, ProtocolError)
    assert isinstance(client.next_event(), ConnectionClosed)


def test_server_refusing_before_the_handshake():
    client, server = Connection(CLIENT), Connection(SERVER)
    [err, _] = feed(client, server.send(ErrorResponse.from_exception(0, UnavailableError("busy"))))
    assert client.state is State.CLOSED and err.retriable


def test_handshake_garbage():
    raises_remote(
        Connection(SERVER),
        raw(FrameType.HANDSHAKE, 0, 0, HandshakeBody("http", 1, 1, "x", 1 << 20)),
        "not a Headwater client",
    )
    raises_remote(
        Connection(SERVER),
        raw(FrameType.HANDSHAKE, 0, 0, HandshakeBody("headwater", 3, 2, "x", 1 << 20)),
        "empty version range",
    )
    raises_remote(
        Connection(SERVER),
        raw(FrameType.HANDSHAKE, 0, 0, HandshakeBody("headwater", 1, 1, "x", 10)),
        "frame_bytes_max=10",
    )
    raises_remote(Connection(SERVER), raw(FrameType.HANDSHAKE, 0, 0, msgspec.msgpack.encode(["x"])), "malformed body")
    # an HTTP client: its first four bytes read as an absurd length
    raises_remote(Connection(SERVER), b"GET / HTTP/1.1\r\n", "frame of .* bytes", FrameTooLargeError)


def test_request_before_handshake_is_refused_from_the_header():
    server = Connection(SERVER)
    frame = raw(FrameType.REQUEST, 1, 1, PingRequest())
    raises_remote(server, frame[:HEADER_SIZE], "first frame of a connection is a HANDSHAKE")
    client = Connection(CLIENT)
    with pytest.raises(LocalProtocolError, match="cannot send Request in state AWAIT_HANDSHAKE"):
        client.send(Request(1, PingRequest()))
    client.send(Handshake("c"))
    with pytest.raises(LocalProtocolError, match="AWAIT_ACCEPT"):
        client.send(Request(1, PingRequest()))
    server = Connection(SERVER)
    feed(server, Connection(CLIENT).send(Handshake("eager")))
    raises_remote(server, frame, "must wait for HANDSHAKE_ACCEPTED")


def test_client_rejects_a_version_it_did_not_offer():
    client = Connection(CLIENT)
    client.send(Handshake("c"))
    raises_remote(
        client,
        raw(FrameType.HANDSHAKE_ACCEPTED, 0, 0, HandshakeAcceptedBody(7, "s", 1 << 20, 8)),
        "chose protocol version 7",
    )


# garbage from the peer -------------------------------------------------------------------


def test_oversized_frame_is_refused_from_four_bytes():
    _, server = pair(frame_bytes_max=FRAME_BYTES_MIN)
    server.receive_data(struct.pack("<I", 1 << 30)[:3])
    assert server.next_event() is NEED_DATA
    raises_remote(server, b"\x40", "announced; the limit is 4096", FrameTooLargeError)
    assert server._reader.buffered_bytes == 4  # nothing of the body was waited for


def test_unknown_api_key():
    _, server = pair()
    raises_remote(server, raw(FrameType.REQUEST, 999, 1, PingRequest())[:HEADER_SIZE], "unknown api key 999")
    _, server = pair()
    raises_remote(server, raw(FrameType.REQUEST, 33, 1, PingRequest()), "unknown api key 33")  # reserved


def test_truncated_frame_needs_data_then_eof_is_an_error():
    client, _ = pair()
    data = client.send(Request(1, DescribeQueueRequest("orders")))
    for cut in (1, HEADER_SIZE - 1, HEADER_SIZE, len(data) - 1):
        _, probe = pair()
        assert feed(probe, data[:cut]) == []
        assert probe.next_event() is NEED_DATA
        raises_remote(probe, b"", "closed in the middle of a frame")


def test_clean_eof_closes():
    client, server = pair()
    client.send(Request(1, PingRequest()))
    assert feed(client, b"") == [ConnectionClosed()]
    assert client.state is State.CLOSED
    assert isinstance(client.next_event(), ConnectionClosed)
    client.receive_data(b"ignored after close")
    assert client.send(ConnectionClosed()) == b""
    with pytest.raises(LocalProtocolError):
        client.send(Request(2, PingRequest()))
    # frames that arrived before the EOF are still delivered, then the close
    server.receive_data(raw(FrameType.REQUEST, 1, 1, PingRequest()))
    server.receive_data(b"")
    assert [type(e) for e in drain(server)] == [Request, ConnectionClosed]
    assert server.state is State.CLOSED


def test_data_after_eof_is_a_local_error():
    _, server = pair()
    server.receive_data(raw(FrameType.REQUEST, 1, 1, PingRequest()))
    server.receive_data(b"")
    with pytest.raises(LocalProtocolError, match="after EOF"):
        server.receive_data(b"x")


def test_checksum_mismatch():
    client, server = pair()
    data = bytearray(client.send(Request(1, DescribeQueueRequest("orders"))))
    data[-1] ^= 0x01
    raises_remote(server, bytes(data), "checksum mismatch")


@pytest.mark.parametrize(
    "mutate,match",
    [
        (lambda h: h[:8] + b"\x09" + h[9:], "unknown frame type 9"),
        (lambda h: h[:8] + b"\x06" + h[9:], "PUSH frames have request id 0"),
        (lambda h: h[:9] + b"\x01" + h[10:], "unknown frame flags"),
        (lambda h: h[:16] + struct.pack("<I", 10_000) + h[20:], "no room for the msgpack head"),
        (lambda h: struct.pack("<I", 16) + h[4:], "too small"),
    ],
)
def test_bad_headers(mutate, match):
    _, server = pair()
    frame = raw(FrameType.REQUEST, 1, 1, PingRequest())
    raises_remote(server, mutate(frame)[:HEADER_SIZE], match)


def test_body_that_does_not_match_the_schema():
    _, server = pair()
    raises_remote(server, raw(FrameType.REQUEST, 11, 1, msgspec.msgpack.encode([42])), "malformed body.*str")
    _, server = pair()
    raises_remote(
        server, raw(FrameType.REQUEST, 20, 1, msgspec.msgpack.encode(["q", 0, 10]), [b"x" * 5]), "batch sizes add up"
    )
    _, server = pair()
    raises_remote(
        server,
        raw(FrameType.REQUEST, 11, 1, msgspec.msgpack.encode(["q"]), [b"xx"]),
        "batch data in a frame that carries none",
    )


def test_extra_trailing_fields_are_ignored():
    """Versioning rule: a newer peer may append fields; an older reader skips them."""
    _, server = pair()
    [req] = feed(server, raw(FrameType.REQUEST, 11, 1, msgspec.msgpack.encode(["orders", "future", 1])))
    assert req.body == DescribeQueueRequest("orders")
    [req] = feed(server, raw(FrameType.REQUEST, 21, 2, msgspec.msgpack.encode(["q", 0, 5, 100])))
    assert req.body == FetchRequest("q", 0, 5, 100, 0, None, 0)  # missing trailing: defaults


def test_client_rejects_stray_and_mismatched_responses():
    client, server = pair()
    raises_remote(client, raw(FrameType.RESPONSE, 1, 77, PingResponse()), "request id 77, which is not in flight")
    client, server = pair()
    client.send(Request(5, PingRequest()))
    raises_remote(client, raw(FrameType.RESPONSE, 11, 5, DescribeQueueResponse(INFO)), "the request had 1")
    client, server = pair()
    raises_remote(client, raw(FrameType.REQUEST, 1, 5, PingRequest()), "unexpected REQUEST frame")


# push frames -------------------------------------------------------------------------------

PUSH = SubscriptionPush(3, 1, [STORED, STORED2], 1003, 1010)


def test_push_frames_reach_the_client_whole_and_split():
    client, server = pair()
    data = server.send(Push(PUSH))
    length, _, ftype, flags, api, rid, data_size = HEADER.unpack_from(data)
    assert (ftype, flags, api, rid, data_size) == (FrameType.PUSH, 0, 60, 0, len(STORED) + len(STORED2))
    assert data.endswith(STORED + STORED2)
    assert feed(client, data) == [Push(PUSH)]
    assert client.state is State.READY and not client.in_flight
    for cut in range(1, len(data)):
        c, _ = pair()
        assert feed(c, data[:cut]) == [] and feed(c, data[cut:]) == [Push(PUSH)]
    ended = SubscriptionPush(3, 0, [], 5, 5, ended="another connection took the subscriber over")
    [ev] = feed(client, server.send(Push(ended)))
    assert ev.body == ended and ev.api is ApiKey.SUBSCRIBE


def test_fetch_stream_pushes_carry_their_batches_in_the_data_section():
    client, server = pair()
    push = StreamPush(4, 1, [STORED, STORED2], 1003, 5, 1010)
    data = server.send(Push(push))
    _, _, ftype, _, api, rid, data_size = HEADER.unpack_from(data)
    assert (ftype, api, rid, data_size) == (FrameType.PUSH, 25, 0, len(STORED) + len(STORED2))
    assert feed(client, data) == [Push(push)]
    ended = StreamPush(4, 0, [], 5, 0, 5, ended="queue 'orders' was deleted", ended_code=7)
    [ev] = feed(client, server.send(Push(ended)))
    assert ev.body == ended and ev.api is ApiKey.FETCH_STREAM


def test_pushes_interleave_with_responses():
    client, server = pair()
    rid = client.next_request_id()
    feed(server, client.send(Request(rid, FetchRequest("q", 0, 0, 10, max_wait_ms=100))))
    out = server.send(Push(PUSH)) + server.send(Response(rid, FetchResponse([], 0, 0, 0)))
    out += server.send(Push(PUSH))
    events = feed(client, out)
    assert [type(e) for e in events] == [Push, Response, Push]
    assert events[1].request_id == rid and not client.in_flight


def test_push_batches_are_not_copied():
    client, server = pair()
    mv = memoryview(b"junk" + STORED)[4:]
    chunks = server.send_chunks(Push(SubscriptionPush(1, 0, [mv], 2, 2)))
    assert any(c is mv for c in chunks)


def test_only_the_server_pushes():
    client, server = pair()
    with pytest.raises(LocalProtocolError, match="client cannot send Push"):
        client.send(Push(PUSH))
    raises_remote(
        server, raw(FrameType.PUSH, 60, 0, PUSH, [STORED, STORED2]), "unexpected PUSH frame received by the server"
    )
    fresh = Connection(CLIENT)
    fresh.send(Handshake("c"))
    raises_remote(
        fresh,
        raw(FrameType.PUSH, 60, 0, PUSH, [STORED, STORED2]),
        "unexpected PUSH frame received by the client in state AWAIT_ACCEPT",
    )
    _, early = Connection(CLIENT), Connection(SERVER)
    with pytest.raises(LocalProtocolError, match="server cannot send Push in state AWAIT_HANDSHAKE"):
        early.send(Push(PUSH))


def test_bad_push_frames():
    client, _ = pair()
    raises_remote(client, raw(FrameType.PUSH, 11, 0, PUSH, [STORED, STORED2]), "api key 11 has no PUSH frames")
    client, _ = pair()
    raises_remote(
        client, raw(FrameType.PUSH, 60, 4, PUSH, [STORED, STORED2])[:HEADER_SIZE], "PUSH frames have request id 0"
    )
    client, _ = pair()
    raises_remote(
        client,
        raw(FrameType.PUSH, 0, 0, PUSH, [STORED, STORED2])[:HEADER_SIZE],
        "PUSH frames have request id 0 and the api key",
    )
    client, _ = pair()
    raises_remote(client, raw(FrameType.PUSH, 60, 0, msgspec.msgpack.encode(["x"])), "malformed body")
    client, _ = pair()
    raises_remote(
        client, raw(FrameType.PUSH, 60, 0, msgspec.msgpack.encode([1, 0, [9], 0, 0]), [b"abc"]), "batch sizes add up"
    )
    _, server = pair()
    with pytest.raises(LocalProtocolError, match="a push body is a PushBody"):
        server.send(Push(PingRequest()))  # type: ignore[arg-type]  # the wrong type is what the test checks
    assert server.state is State.READY


def test_server_handled_apis_are_not_invoked_on_a_service():
    with pytest.raises(HeadwaterError, match="only a server serves it"):
        invoke(FakeService(), SubscribeRequest(1, "q", "s", 10, 10))
    for body in (FetchStreamRequest(1, "q", {0: 0}, 10), StreamCreditRequest(1, 10), CloseStreamRequest(1)):
        with pytest.raises(HeadwaterError, match="only a server serves it"):
            invoke(FakeService(), body)
    assert invoke(FakeService(), PingRequest()) == PingResponse()


# the sending side ------------------------------------------------------------------------


def test_send_is_all_or_nothing():
    client, server = pair()
    with pytest.raises(LocalProtocolError, match="cannot encode"):
        client.send(Request(1, DescribeQueueRequest(42)))  # type: ignore[arg-type]  # the wrong type is what the test checks
    with pytest.raises(LocalProtocolError, match="cannot encode"):
        client.send(Request(1, ProduceRequest("q", 0, "text")))  # type: ignore[arg-type]  # the wrong type is what the test checks
    with pytest.raises(LocalProtocolError, match="not a protocol event"):
        client.send("ping")  # type: ignore[arg-type]  # the wrong type is what the test checks
    assert client.state is State.READY and not client.in_flight
    rid = client.next_request_id()
    feed(server, client.send(Request(rid, PingRequest())))
    with pytest.raises(LocalProtocolError, match="no request with id 99"):
        server.send(Response(99, PingResponse()))
    with pytest.raises(LocalProtocolError, match="was PING; it cannot be answered with DescribeQueueResponse"):
        server.send(Response(rid, DescribeQueueResponse(INFO)))
    with pytest.raises(LocalProtocolError, match="server cannot send Request"):
        server.send(Request(3, PingRequest()))
    with pytest.raises(LocalProtocolError, match="client cannot send ErrorResponse"):
        client.send(ErrorResponse(rid, 1, False, "clients do not answer"))
    assert server.in_flight == {rid: ApiKey.PING}
    [ev] = feed(client, server.send(Response(rid, PingResponse())))
    assert ev.result() is None


def test_a_server_sends_its_own_bodies_unchecked_and_a_client_refuses_a_wrong_one():
    """The client checks what it sends (the application's values); the server does not
    decode its own answers again, and a wrong one it sent is garbage to the client."""
    client, server = pair()
    rid = client.next_request_id()
    feed(server, client.send(Request(rid, DescribeQueueRequest("q"))))
    wrong = server.send(Response(rid, DescribeQueueResponse("not a queue info")))  # type: ignore[arg-type]  # the wrong type is what the test checks
    assert server.state is State.READY and not server.in_flight
    raises_remote(client, wrong, "malformed body .frame type RESPONSE")


def test_after_garbage_only_a_last_error_can_be_sent():
    _, server = pair()
    with pytest.raises(RemoteProtocolError) as info:
        feed(server, b"\x10\x00\x00\x00" + b"\x00" * 16)
    last = server.send(ErrorResponse.from_exception(0, info.value))
    assert server.state is State.ERROR
    with pytest.raises(LocalProtocolError):
        server.send(Response(1, PingResponse()))
    assert server.send(ConnectionClosed()) == b""
    client, _ = pair()
    [err, _] = feed(client, last)
    assert type(err.exception()) is RemoteProtocolError and err.code == 52
    assert client.state is State.CLOSED


def test_long_error_messages_are_cut():
    client, server = pair(frame_bytes_max=FRAME_BYTES_MIN)
    feed(server, client.send(Request(1, PingRequest())))
    [err] = feed(client, server.send(ErrorResponse(1, 2, False, "é" * 5000)))
    assert len(err.message) == 900 and err.message.endswith("…")


# errors ----------------------------------------------------------------------------------


def _all_classes(root=HeadwaterError):
    out, stack = [], [root]
    while stack:
        cls = stack.pop()
        out.append(cls)
        stack.extend(cls.__subclasses__())
    return out


def test_error_codes_are_unique_and_all_map_back():
    classes = [c for c in _all_classes() if c.__module__.startswith("headwater.")]
    codes = [c.code for c in classes]
    assert len(codes) == len(set(codes)), codes
    client, server = pair()
    for cls in classes:
        rid = client.next_request_id()
        feed(server, client.send(Request(rid, PingRequest())))
        [err] = feed(client, server.send(ErrorResponse.from_exception(rid, cls("boom"))))
        exc = err.exception()
        assert type(exc) is cls and exc.code == cls.code and exc.retriable == cls.retriable
        assert str(exc) == "boom" and error_for_code(cls.code) is cls
    assert {c.code for c in classes if c.__module__ == "headwater.protocol.errors"} == {50, 51, 52, 53, 54}


def test_core_error_for_code_agrees():
    for cls in _all_classes():
        assert errors_mod.error_for_code(cls.code) is error_for_code(cls.code)
    assert errors_mod.error_for_code(54) is UnsupportedVersionError


def test_docstring_examples():
    import doctest

    import headwater.protocol.errors

    result = doctest.testmod(headwater.protocol.errors)
    assert result.failed == 0 and result.attempted > 0


def test_unknown_code_keeps_code_and_flag():
    exc = ErrorResponse(1, 4242, True, "from a newer server").exception()
    assert type(exc) is HeadwaterError and exc.code == 4242 and exc.retriable
    assert HeadwaterError.code == 0 and HeadwaterError.retriable is False  # class untouched


def test_protocol_errors_sit_in_the_tree():
    assert issubclass(LocalProtocolError, ProtocolError) and issubclass(RemoteProtocolError, ProtocolError)
    assert issubclass(FrameTooLargeError, RemoteProtocolError)
    assert issubclass(ProtocolError, HeadwaterError)
    assert not issubclass(RemoteProtocolError, ValueError)


def test_settings_are_validated():
    for bad in ({"frame_bytes_max": 100}, {"requests_in_flight_max": 0}, {"frame_bytes_max": "big"}):
        with pytest.raises(InvalidArgumentError):
            Connection(SERVER, **bad)
    with pytest.raises(InvalidArgumentError):
        Connection("client")  # type: ignore[arg-type]  # the wrong type is what the test checks


# the state table ---------------------------------------------------------------------------


def test_state_table_shape():
    for (_role, state, direction, kind), new in TRANSITIONS.items():
        if state is State.ERROR:
            assert direction is Direction.SEND and new is State.ERROR
        if state is State.CLOSED:
            assert kind is Kind.CLOSE
        if kind is Kind.FATAL or kind is Kind.CLOSE:
            assert new in (State.CLOSED, State.ERROR)
    # nothing but the handshake can open a connection
    opening = {k for (r, s, d, k) in TRANSITIONS if s is State.AWAIT_HANDSHAKE}
    assert opening == {Kind.HANDSHAKE, Kind.FATAL, Kind.CLOSE}


# the specification stays exact ---------------------------------------------------------------


def doc_examples() -> dict[str, bytes]:
    """The byte exchanges shown in docs/protocol.md, regenerated with the codec."""
    client = Connection(CLIENT)
    server = Connection(SERVER)
    out = {"handshake": client.send(Handshake("example/1.0"))}
    [hs] = feed(server, out["handshake"])
    out["accepted"] = server.send(HandshakeAccepted(choose_version(hs), "headwater/0.1.0"))
    feed(client, out["accepted"])
    out["ping"] = client.send(Request(1, PingRequest()))
    feed(server, out["ping"])
    out["pong"] = server.send(Response(1, PingResponse()))
    feed(client, out["pong"])
    batch = encode_batch([b"hi"])
    out["batch"] = batch
    out["produce"] = client.send(Request(2, ProduceRequest("orders", 0, batch)))
    feed(server, out["produce"])
    out["produced"] = server.send(Response(2, ProduceResponse(1, 0, 0, 1, 1_800_000_000_000)))
    feed(client, out["produced"])
    out["describe"] = client.send(Request(3, DescribeQueueRequest("nope")))
    feed(server, out["describe"])
    out["not_found"] = server.send(ErrorResponse(3, 7, False, "no queue named 'nope'"))
    return out


def hexdump(data: bytes) -> str:
    return "\n".join(data[i : i + 16].hex(" ") for i in range(0, len(data), 16))


def test_spec_examples_are_exact():
    text = DOC.read_text()
    for name, data in doc_examples().items():
        assert hexdump(data) in text, f"the {name} example in docs/protocol.md is stale:\n{hexdump(data)}"


def test_spec_lists_every_api_and_error_code():
    text = DOC.read_text()
    for key in ApiKey:
        assert f"| {int(key)} | {key.name} |" in text, key
    for cls in _all_classes():
        if cls.__module__.startswith("headwater."):
            assert f"| {cls.code} | {cls.__name__} |" in text, cls
