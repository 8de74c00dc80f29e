"""The codec's fast paths (int-keyed lookups, identity-hashed states, small frames copied
whole) give the same answers as the plain ones. No timing here: tests never assert speed."""

from __future__ import annotations

import array

import pytest

from headwater.model.batch import encode_batch
from headwater.protocol import (
    CLIENT,
    NEED_DATA,
    SERVER,
    Connection,
    FrameType,
    Handshake,
    HandshakeAccepted,
    RemoteProtocolError,
    Request,
    Response,
    State,
    choose_version,
)
from headwater.protocol._state import TRANSITIONS, Direction, Kind, Role, table_for
from headwater.protocol.frames import _SMALL_FRAME_BYTES, HEADER, encode_frame, encode_frame_sized
from headwater.protocol.messages import (
    API_SPECS,
    ApiKey,
    FetchRequest,
    FetchResponse,
    ProduceRequest,
    ProduceResponse,
    push_spec_for,
    spec_for,
)


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
