"""Fuzzing the frame parser: garbage in gives events, NEED_DATA or RemoteProtocolError —
never another exception, never a hang."""

from __future__ import annotations

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headwater.model.batch import encode_batch
from headwater.protocol import (
    CLIENT,
    NEED_DATA,
    SERVER,
    ApiKey,
    Connection,
    ConnectionClosed,
    DescribeQueueRequest,
    FetchRequest,
    FetchResponse,
    FrameType,
    Handshake,
    HandshakeAccepted,
    LookupKeyRequest,
    PingRequest,
    ProduceRequest,
    Push,
    RemoteProtocolError,
    Request,
    Response,
    State,
    SubscriptionPush,
    choose_version,
)
from headwater.protocol.frames import encode_frame

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def handshaken(server_settings: dict | None = None) -> tuple[Connection, Connection]:
    client, server = Connection(CLIENT), Connection(SERVER, **(server_settings or {}))
    server.receive_data(client.send(Handshake("fuzz")))
    hs = server.next_event()
    client.receive_data(server.send(HandshakeAccepted(choose_version(hs), "fuzz")))
    assert isinstance(client.next_event(), HandshakeAccepted)
    return client, server


def chunked(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in zip(points, points[1:]) if b > a]


def pump(conn: Connection, chunks: list[bytes], *, eof: bool = True) -> list:
    """Feed chunks, draining events after each; stop at the first protocol error.

    Each drain is bounded: a frame takes at least 21 bytes, so a chunk can release at most
    a few events more than its length allows; looping longer would be a hang.
    """
    events: list = []
    total = sum(map(len, chunks))
    for chunk in [*chunks, *([b""] if eof else [])]:
        conn.receive_data(chunk)
        for _ in range(total // 21 + 3):
            try:
                ev = conn.next_event()
            except RemoteProtocolError:
                assert conn.state is State.ERROR
                return events
            if ev is NEED_DATA:
                assert conn.state is not State.CLOSED
                break
            events.append(ev)
            if isinstance(ev, ConnectionClosed):
                assert conn.state is State.CLOSED
                return events
        else:
            raise AssertionError("next_event kept returning events without new data")
        if conn.state is State.CLOSED:
            return events
    if eof:
        raise AssertionError("EOF was neither a close nor an error")
    return events


@FUZZ
@given(data=st.binary(max_size=400), cuts=st.lists(st.integers(0, 400), max_size=8))
def test_garbage_before_the_handshake(data, cuts):
    pump(Connection(SERVER), chunked(data, cuts))


@FUZZ
@given(data=st.binary(max_size=400), cuts=st.lists(st.integers(0, 400), max_size=8))
def test_garbage_after_the_handshake(data, cuts):
    _, server = handshaken()
    pump(server, chunked(data, cuts))


@FUZZ
@given(data=st.binary(max_size=400), cuts=st.lists(st.integers(0, 400), max_size=8))
def test_garbage_to_a_client_with_requests_in_flight(data, cuts):
    client, _ = handshaken()
    for rid in (1, 2, 3):
        client.send(Request(rid, PingRequest()))
    pump(client, chunked(data, cuts))


# frames with a valid header and checksum reach the body decoders -----------------------

msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.text(max_size=10)
    | st.binary(max_size=10)
    | st.floats(allow_nan=False),
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=20,
)
heads = st.one_of(msgpack_values.map(msgspec.msgpack.encode), st.binary(min_size=1, max_size=60))
frame_types = st.sampled_from([int(t) for t in FrameType] + [0, 7, 255])
api_keys = st.sampled_from([int(k) for k in ApiKey] + [0, 2, 30, 65535])


@st.composite
def checksummed_frames(draw) -> bytes:
    head = draw(heads)
    data = draw(st.lists(st.binary(max_size=30), max_size=3))
    rid = draw(st.sampled_from([0, 1, 2, 3, 4, 2**32 - 1]))
    return b"".join(encode_frame(draw(frame_types), draw(api_keys), rid, head, data))


@FUZZ
@given(
    frames=st.lists(checksummed_frames(), min_size=1, max_size=4),
    cuts=st.lists(st.integers(0, 600), max_size=6),
    role=st.sampled_from([CLIENT, SERVER]),
    handshake_done=st.booleans(),
)
def test_checksummed_garbage_bodies(frames, cuts, role, handshake_done):
    client, server = handshaken() if handshake_done else (Connection(CLIENT), Connection(SERVER))
    conn = client if role is CLIENT else server
    if role is CLIENT and handshake_done:
        for rid in (1, 2, 3):
            client.send(Request(rid, PingRequest()))
    elif role is CLIENT:
        client.send(Handshake("fuzz"))
    pump(conn, chunked(b"".join(frames), cuts))


# heads close to the schema: a valid head of some API with one element replaced ----------

SAMPLE_BODIES = [
    (ApiKey.PING, [], []),
    (ApiKey.DESCRIBE_QUEUE, ["q"], []),
    (ApiKey.CREATE_QUEUE, ["q", {"partitions": 2, "ttl_s": None, "settings": {"a": "b"}}], []),
    (ApiKey.SET_QUEUE_ENABLED, ["q", True], []),
    (ApiKey.PRODUCE, ["q", 0, 5], [b"12345"]),
    (ApiKey.FETCH, ["q", 0, 0, 100, 0, None, 10], []),
    (ApiKey.FETCH, [[5, 3], 8, 0, 8], [b"12345", b"abc"]),  # a response head
    (ApiKey.LOOKUP_KEY, ["q", b"k", None, 5, 3], []),
    (ApiKey.LOOKUP_KEY, [[2]], [b"xy"]),
    (ApiKey.LOOKUP_ID, ["q", 2], [b"xy"]),
    (
        ApiKey.LIST_QUEUES,
        [
            [
                {
                    "name": "q",
                    "queue_id": 1,
                    "config": {},
                    "enabled": True,
                    "created_ms": 5,
                    "partitions": [{"partition": 0, "start_offset": 0, "end_offset": 1}],
                }
            ]
        ],
        [],
    ),
]


@st.composite
def near_frames(draw) -> bytes:
    api, values, data = draw(st.sampled_from(SAMPLE_BODIES))
    values = list(values)
    if values and draw(st.booleans()):
        values[draw(st.integers(0, len(values) - 1))] = draw(msgpack_values)
    if draw(st.booleans()):
        values.append(draw(msgpack_values))
    if draw(st.booleans()):
        data = draw(st.lists(st.binary(max_size=8), max_size=3))
    ftype = draw(st.sampled_from([FrameType.REQUEST, FrameType.RESPONSE, FrameType.ERROR]))
    rid = draw(st.integers(1, 4))
    return b"".join(encode_frame(ftype, int(api), rid, msgspec.msgpack.encode(values), data))


@FUZZ
@given(
    frames=st.lists(near_frames(), min_size=1, max_size=4),
    cuts=st.lists(st.integers(0, 600), max_size=6),
    role=st.sampled_from([CLIENT, SERVER]),
)
def test_near_schema_bodies(frames, cuts, role):
    client, server = handshaken()
    if role is CLIENT:
        for rid, body in (
            (1, PingRequest()),
            (2, FetchRequest("q", 0, 0, 1)),
            (3, LookupKeyRequest("q", b"k", None, None, 1)),
        ):
            client.send(Request(rid, body))
    pump(client if role is CLIENT else server, chunked(b"".join(frames), cuts))


# damaged versions of a valid conversation --------------------------------------------------


def valid_stream() -> bytes:
    client = Connection(CLIENT)
    out = client.send(Handshake("fuzz"))
    # the requests are built on a handshaken twin so the stream is what a real client sends
    twin, _ = handshaken()
    batch = encode_batch([b"a", b"b"])
    for rid, body in enumerate(
        [
            PingRequest(),
            DescribeQueueRequest("q"),
            ProduceRequest("q", 0, batch),
            FetchRequest("q", 0, 0, 100, max_wait_ms=5),
            LookupKeyRequest("q", b"k", None, None, 3),
        ],
        start=1,
    ):
        out += twin.send(Request(rid, body))
    return out


VALID = valid_stream()


@FUZZ
@given(
    flips=st.lists(st.tuples(st.integers(0, len(VALID) - 1), st.integers(1, 255)), max_size=3),
    cut=st.integers(0, len(VALID)),
    cuts=st.lists(st.integers(0, len(VALID)), max_size=5),
)
def test_damaged_conversation(flips, cut, cuts):
    data = bytearray(VALID[:cut])
    for pos, xor in flips:
        if pos < len(data):
            data[pos] ^= xor
    server = Connection(SERVER)
    events = []
    # answer the handshake as a server would, so damage deeper in the stream is reached
    for chunk in chunked(bytes(data), cuts) + [b""]:
        server.receive_data(chunk)
        for _ in range(50):
            try:
                ev = server.next_event()
            except RemoteProtocolError:
                return
            if ev is NEED_DATA or isinstance(ev, ConnectionClosed):
                break
            events.append(ev)
            if isinstance(ev, Handshake):
                try:
                    server.send(HandshakeAccepted(choose_version(ev), "fuzz"))
                except Exception:  # noqa: BLE001 - a damaged version range is refused
                    return
        else:
            raise AssertionError("hang")
    if not flips and cut == len(VALID):
        assert len(events) == 6


# valid values of every shape survive the trip ---------------------------------------------

u64 = st.integers(0, 2**64 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)


@settings(max_examples=150, deadline=None)
@given(
    queue=st.text(max_size=30),
    partition=i64,
    offset=i64,
    max_bytes=i64,
    tag_mask=u64,
    end_offset=st.none() | i64,
    wait=i64,
    batches=st.lists(st.binary(max_size=200), max_size=5),
    cuts=st.lists(st.integers(0, 2000), max_size=5),
)
def test_fetch_round_trip(queue, partition, offset, max_bytes, tag_mask, end_offset, wait, batches, cuts):
    client, server = handshaken()
    req = Request(7, FetchRequest(queue, partition, offset, max_bytes, tag_mask, end_offset, wait))
    assert pump(server, chunked(client.send(req), cuts), eof=False) == [req]
    resp = Response(7, FetchResponse(batches, offset, partition, max_bytes))
    assert pump(client, chunked(server.send(resp), cuts), eof=False) == [resp]


# push frames (server to client) -------------------------------------------------------------

PUSH_HEADS = [
    [3, 0, [5], 8, 9],
    [3, 0, [5, 3], 8, 9, "", 0],
    [3, 0, [5], 8, 9, "taken over", 1, [[2, 4, 6]]],
    [0, 0, [], 0, 0, "ended", 40],
]


@st.composite
def near_push_frames(draw) -> bytes:
    values = list(draw(st.sampled_from(PUSH_HEADS)))
    if draw(st.booleans()):
        values[draw(st.integers(0, len(values) - 1))] = draw(msgpack_values)
    if draw(st.booleans()):
        values.append(draw(msgpack_values))
    data = draw(st.lists(st.binary(max_size=8), max_size=3))
    api = draw(st.sampled_from([int(ApiKey.SUBSCRIBE), int(ApiKey.SUBSCRIBE), 0, 11, 61, 65535]))
    rid = draw(st.sampled_from([0, 0, 0, 1, 7]))
    return b"".join(encode_frame(FrameType.PUSH, api, rid, msgspec.msgpack.encode(values), data))


@FUZZ
@given(
    frames=st.lists(near_push_frames(), min_size=1, max_size=4),
    cuts=st.lists(st.integers(0, 400), max_size=6),
    role=st.sampled_from([CLIENT, SERVER]),
)
def test_push_frames_near_the_schema(frames, cuts, role):
    """Damaged pushes give a client Push events or a protocol error; a server refuses them all."""
    client, server = handshaken()
    conn = client if role is CLIENT else server
    events = pump(conn, chunked(b"".join(frames), cuts), eof=False)
    if role is SERVER:
        assert events == []
    for ev in events:
        assert isinstance(ev, Push) and isinstance(ev.body, SubscriptionPush)


@settings(max_examples=150, deadline=None)
@given(
    sid=st.integers(0, 2**32 - 1),
    partition=i64,
    next_offset=i64,
    end_offset=i64,
    batches=st.lists(st.binary(max_size=100), max_size=4),
    ended=st.text(max_size=20),
    code=st.integers(0, 2**32 - 1),
    cuts=st.lists(st.integers(0, 600), max_size=5),
    with_sel=st.booleans(),
)
def test_push_round_trip(sid, partition, next_offset, end_offset, batches, ended, code, cuts, with_sel):
    client, server = handshaken()
    selections = [[i, i + 2] for i in range(len(batches))] if with_sel else []
    ev = Push(SubscriptionPush(sid, partition, batches, next_offset, end_offset, ended, code, selections))
    assert pump(client, chunked(server.send(ev), cuts), eof=False) == [ev]
