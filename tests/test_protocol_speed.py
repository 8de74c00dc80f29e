"""The codec's fast paths (int-keyed lookups, identity-hashed states, small frames copied
whole) give the same answers as the plain ones. No timing here: tests never assert speed."""

from __future__ import annotations

import array

import pytest

from headwater.errors import MessageTooLargeError
from headwater.model.batch import encode_batch
from headwater.protocol import (
    CLIENT,
    NEED_DATA,
    SERVER,
    Connection,
    ConnectionClosed,
    FrameType,
    Handshake,
    HandshakeAccepted,
    LocalProtocolError,
    RemoteProtocolError,
    Request,
    Response,
    State,
    choose_version,
)
from headwater.protocol._state import TRANSITIONS, Direction, Kind, Role, table_for
from headwater.protocol.frames import _SMALL_FRAME_BYTES, FRAME_BYTES_MIN, HEADER, encode_frame, encode_frame_sized
from headwater.protocol.messages import (
    API_SPECS,
    ApiKey,
    FetchRequest,
    FetchResponse,
    PingRequest,
    PingResponse,
    ProduceRequest,
    ProduceResponse,
    push_spec_for,
    spec_for,
)
from tests.support.protocol_samples import SAMPLES


def pair() -> tuple[Connection, Connection]:
    client, server = Connection(CLIENT), Connection(SERVER)
    server.receive_data(client.send(Handshake("c")))
    hs = server.next_event()
    client.receive_data(server.send(HandshakeAccepted(choose_version(hs), "s")))
    assert isinstance(client.next_event(), HandshakeAccepted)
    return client, server


def test_state_enums_hash_by_identity_and_the_per_role_tables_match_the_table():
    assert {State.READY: 1}[State.READY] == 1 and State("READY") is State.READY
    for role in Role:
        for direction in Direction:
            rows = {(s, k): new for (r, s, d, k), new in TRANSITIONS.items() if r is role and d is direction}
            assert table_for(role, direction) == rows
    assert table_for(Role.SERVER, Direction.RECEIVE)[State.READY, Kind.REQUEST] is State.READY


@pytest.mark.parametrize("api", [1, True, ApiKey.PING, 20, "1", 1.5, 0, 999, -1, [], None])
def test_spec_lookups_by_int_agree_with_enum_lookups(api):
    try:
        expected = API_SPECS[ApiKey(api)]
    except (ValueError, TypeError):
        expected = None
    assert spec_for(api, 1) is expected
    assert spec_for(api, 0) is None
    assert push_spec_for(api, 1) is (None if expected is None else push_spec_for(expected.key, 1))


@pytest.mark.parametrize("batch_bytes", [10, _SMALL_FRAME_BYTES, 5 * _SMALL_FRAME_BYTES])
def test_small_and_big_frames_round_trip_fed_a_byte_at_a_time(batch_bytes):
    batch = bytes(encode_batch([b"x" * batch_bytes]))
    client, server = pair()
    data = client.send(Request(7, ProduceRequest("q", 0, batch)))
    for i in range(len(data)):  # every partial state of the reader
        server.receive_data(data[i : i + 1])
        event = server.next_event()
        if i < len(data) - 1:
            assert event is NEED_DATA
    assert event == Request(7, ProduceRequest("q", 0, batch))
    assert type(event.body.batch) is bytes
    assert server.next_event() is NEED_DATA
    client.receive_data(server.send(Response(7, ProduceResponse(1, 0, 0, 1, 5))))
    assert client.next_event() == Response(7, ProduceResponse(1, 0, 0, 1, 5))
    assert client.next_event() is NEED_DATA and not client.in_flight and not server.in_flight


@pytest.mark.parametrize("batch_bytes", [10, 5 * _SMALL_FRAME_BYTES])
@pytest.mark.parametrize("damaged_at", [4, 21, -1])  # the crc itself, the head, the last data byte
def test_a_damaged_frame_is_refused_small_or_big(batch_bytes, damaged_at):
    batch = bytes(encode_batch([b"x" * batch_bytes]))
    client, server = pair()
    server.receive_data(client.send(Request(3, FetchRequest("q", 0, 0, 1 << 20))))
    assert isinstance(server.next_event(), Request)
    frame = bytearray(server.send(Response(3, FetchResponse([batch], 1, 0, 1))))
    assert (len(frame) > _SMALL_FRAME_BYTES) == (batch_bytes > _SMALL_FRAME_BYTES)
    frame[damaged_at] ^= 0xFF
    client.receive_data(bytes(frame))
    with pytest.raises(RemoteProtocolError, match="checksum mismatch"):
        client.next_event()
    assert client.state is State.ERROR


def test_encode_frame_counts_bytes_not_items_and_reports_the_size():
    items = array.array("I", [1, 2, 3])  # 12 bytes in 3 items
    data = [memoryview(items), b"ab", bytearray(b"c")]
    chunks, size = encode_frame_sized(FrameType.RESPONSE, 21, 1, b"\x90", data)
    assert chunks == encode_frame(FrameType.RESPONSE, 21, 1, b"\x90", data)
    assert size == sum(memoryview(c).nbytes for c in chunks) == 20 + 1 + 12 + 3
    length, _, ftype, flags, api, rid, data_size = HEADER.unpack(chunks[0])
    assert (length, ftype, flags, api, rid, data_size) == (size - 4, 4, 0, 21, 1, 15)
    with pytest.raises(TypeError):
        encode_frame_sized(FrameType.RESPONSE, 21, 1, b"\x90", ["not bytes"])


# the one-message round trip's fast paths: send_request, send_response, unframed ---------------


@pytest.mark.parametrize("req,resp", SAMPLES, ids=lambda v: type(v).__name__)
def test_send_request_and_send_response_give_send_chunks_bytes(req, resp):
    fast_c, fast_s = pair()
    slow_c, slow_s = pair()
    fast = fast_c.send_request(7, req)
    slow = slow_c.send_chunks(Request(7, req))
    assert b"".join(fast) == b"".join(slow)
    assert fast_c.in_flight == slow_c.in_flight == {7: req.api}
    for server, data in ((fast_s, fast), (slow_s, slow)):
        server.receive_data(b"".join(data))
        assert server.next_event() == Request(7, req)
    fast = fast_s.send_response(7, resp)
    slow = slow_s.send_chunks(Response(7, resp))
    assert b"".join(fast) == b"".join(slow)
    assert not fast_s.in_flight and fast_s.state is slow_s.state is State.READY
    fast_c.receive_data(b"".join(fast))
    assert fast_c.next_event() == Response(7, resp) and not fast_c.unframed and not fast_c.ended
    assert fast_c.next_event() is NEED_DATA


def test_the_fast_sends_refuse_what_send_chunks_refuses():
    client, server = pair()
    client.send_request(1, PingRequest())
    with pytest.raises(LocalProtocolError, match="already in flight"):
        client.send_request(1, PingRequest())
    for rid in (0, True, 2**32):
        with pytest.raises(LocalProtocolError, match="request id"):
            client.send_request(rid, PingRequest())
    with pytest.raises(LocalProtocolError, match="cannot encode"):  # the body's schema is checked
        client.send_request(2, ProduceRequest("q", "zero", encode_batch([b"x"])))  # a partition of the wrong type
    with pytest.raises(LocalProtocolError, match="is waiting for an answer"):  # nothing asked: nothing to answer
        server.send_response(5, PingResponse())
    server.receive_data(b"".join(client.send_request(3, FetchRequest("q", 0, 0, 10))))
    server.next_event()
    with pytest.raises(LocalProtocolError, match="cannot be answered"):
        server.send_response(3, ProduceResponse(1, 0, 0, 1, 1))
    assert client.in_flight == {1: ApiKey.PING, 3: ApiKey.FETCH} and set(server.in_flight) == {3}
    big_c, big_s = Connection(CLIENT), Connection(SERVER, frame_bytes_max=FRAME_BYTES_MIN)
    big_s.receive_data(big_c.send(Handshake("c")))
    big_c.receive_data(big_s.send(HandshakeAccepted(choose_version(big_s.next_event()), "s")))
    big_c.next_event()
    with pytest.raises(MessageTooLargeError, match="frame_bytes_max"):
        big_c.send_request(1, ProduceRequest("q", 0, encode_batch([b"x" * 10_000])))
    assert not big_c.in_flight and big_c.state is State.READY


def test_unframed_and_ended_tell_when_next_event_needs_data():
    client, server = pair()
    data = b"".join(client.send_request(1, PingRequest()))
    server.receive_data(data[:5])
    assert server.unframed and server.next_event() is NEED_DATA  # a frame begun
    server.receive_data(data[5:] + data[:3])  # its end, and the start of another
    assert server.next_event() == Request(1, PingRequest()) and len(server.unframed) == 3
    server.receive_data(b"")
    assert server.ended
    with pytest.raises(RemoteProtocolError, match="middle of a frame"):
        server.next_event()
    client2, server2 = pair()
    server2.receive_data(b"")
    assert server2.ended and not server2.unframed and isinstance(server2.next_event(), ConnectionClosed)
