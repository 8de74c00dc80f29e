"""A client written from docs/protocol.md alone talks to a real broker.

The issue asks for a specification "precise enough that someone could write a client in
another language from it alone". This test is that client, in miniature: it uses nothing of
``headwater`` but the broker process it starts, only a socket, ``struct``, a generic
MessagePack library and a CRC32C function, and follows the document's sections (cited as §):
the frame header (§3.1), the handshake (§4), pipelined requests (§5.2), errors (§5.3, §5.4),
CREATE_QUEUE, PRODUCE and FETCH (§7.2, §7.3) and a record batch built byte by byte (§8).
If the document and the broker drift apart, this fails.
"""

from __future__ import annotations

import socket
import struct

import crc32c
import msgspec
import pytest

from tests.support.broker_process import BrokerProcess

pack, unpack = msgspec.msgpack.encode, msgspec.msgpack.decode

HANDSHAKE, HANDSHAKE_ACCEPTED, REQUEST, RESPONSE, ERROR = 1, 2, 3, 4, 5  # §3.2
PING, CREATE_QUEUE, DESCRIBE_QUEUE, PRODUCE, FETCH = 1, 10, 11, 20, 21  # §7.1
HEADER = struct.Struct("<IIBBHII")  # §3.1: length, crc, frame_type, flags, api_key, request_id, data_size


def frame(frame_type: int, api_key: int, request_id: int, head: list, data: bytes = b"") -> bytes:
    body = pack(head) + data
    rest = struct.pack("<BBHII", frame_type, 0, api_key, request_id, len(data)) + body
    return struct.pack("<II", 16 + len(body), crc32c.crc32c(rest)) + rest


def read_frame(sock: socket.socket) -> tuple[int, int, int, list, bytes]:
    """(frame_type, api_key, request_id, head, data) of the next frame."""
    header = _read(sock, HEADER.size)
    length, crc, frame_type, flags, api_key, request_id, data_size = HEADER.unpack(header)
    body = _read(sock, length - 16)
    assert crc == crc32c.crc32c(header[8:] + body) and flags == 0
    head_bytes, data = body[: len(body) - data_size], body[len(body) - data_size :]
    return frame_type, api_key, request_id, unpack(head_bytes), data


def _read(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise EOFError(f"closed after {len(out)} of {n} bytes")
        out += chunk
    return out


def tag_bit(tag: str) -> int:
    return 1 << (crc32c.crc32c(tag.encode()) & 63)  # §8


def record_batch(bodies: list[bytes], tags: list[str | None]) -> bytes:
    """§8: a batch as a producer builds it, the broker-owned bytes 4 to 40 left zero."""
    payload = pack([bodies, None, tags, None])  # [bodies, keys, tags, properties]
    tag_mask = 0
    for t in tags:
        tag_mask |= tag_bit(t) if t else 0
    flags = 0x08  # no compression, has tags
    producer_part = (
        struct.pack("<BBHIIqqihHQQ", 1, flags, 96, len(bodies), len(payload), 0, -1, -1, -1, 0, tag_mask, 0) + payload
    )
    return (
        struct.pack("<I", 92 + len(payload))
        + bytes(36)
        + struct.pack("<I", crc32c.crc32c(producer_part))
        + producer_part
    )


@pytest.fixture
def broker(tmp_path):
    b = BrokerProcess(tmp_path / "data").start()
    yield b
    b.kill()


def test_a_client_written_from_the_specification(broker):
    sock = socket.create_connection(("127.0.0.1", broker.port), timeout=10)
    try:
        # §4.1 / §4.2: the handshake
        sock.sendall(frame(HANDSHAKE, 0, 0, ["headwater", 1, 1, "spec-test/1", 1 << 20]))
        frame_type, _, request_id, head, _ = read_frame(sock)
        assert (frame_type, request_id) == (HANDSHAKE_ACCEPTED, 0)
        version, server_name, frame_bytes_max, in_flight_max = head[:4]
        assert version == 1 and server_name.startswith("headwater") and frame_bytes_max >= 4096
        assert in_flight_max >= 3

        # §7.2 CREATE_QUEUE with a QueueConfig map (§7.3)
        config = {"partitions": 2, "ttl_s": None, "flush": None, "message_bytes_max": 1 << 20, "settings": {}}
        sock.sendall(frame(REQUEST, CREATE_QUEUE, 1, ["orders", config]))
        frame_type, api_key, request_id, head, _ = read_frame(sock)
        assert (frame_type, api_key, request_id) == (RESPONSE, CREATE_QUEUE, 1)
        info = head[0]
        assert info["name"] == "orders" and len(info["partitions"]) == 2 and info["config"]["ttl_s"] is None

        # §7.2 PRODUCE: the batch's size in the head, its bytes in the data section (§3.3)
        batch = record_batch([b"order 1", b"order 2", b"order 3"], ["paid", None, "paid"])
        sock.sendall(frame(REQUEST, PRODUCE, 2, ["orders", 1, len(batch)], batch))
        frame_type, api_key, request_id, head, _ = read_frame(sock)
        assert (frame_type, api_key, request_id) == (RESPONSE, PRODUCE, 2)
        queue_id, partition, base_offset, count, timestamp_ms = head[:5]
        assert (queue_id, partition, base_offset, count) == (info["queue_id"], 1, 0, 3) and timestamp_ms > 0

        # §5.2: two requests in flight at once, answered by id, in any order
        sock.sendall(
            frame(REQUEST, FETCH, 3, ["orders", 1, 0, 1 << 20])  # defaults for fields 4-6
            + frame(REQUEST, DESCRIBE_QUEUE, 4, ["nope"])
        )
        answers = {}
        for _ in range(2):
            frame_type, api_key, request_id, head, data = read_frame(sock)
            answers[request_id] = (frame_type, api_key, head, data)

        # §5.3: an ERROR frame answers request 4 alone; code 7 is QueueNotFoundError (§10)
        frame_type, api_key, (code, retriable, message), _ = answers[4]
        assert (frame_type, api_key, code, retriable) == (ERROR, DESCRIBE_QUEUE, 7, False) and "nope" in message

        # the FETCH answer: [sizes], next_offset, start_offset, end_offset, then the stored batch
        frame_type, api_key, (sizes, next_offset, start_offset, end_offset), data = answers[3]
        assert (frame_type, api_key, next_offset, start_offset, end_offset) == (RESPONSE, FETCH, 3, 0, 3)
        assert sizes == [len(batch)] and len(data) == len(batch)
        # §8: the broker patched its own fields, checksummed them, and left the producer's bytes as sent
        header_crc, qid, part, base, ts, reserved = struct.unpack_from("<IIIqqq", data, 4)
        assert header_crc == crc32c.crc32c(data[8:40])
        assert (qid, part, base, ts, reserved) == (queue_id, 1, 0, timestamp_ms, 0)
        assert data[40:] == batch[40:]
        bodies, keys, tags, properties = unpack(data[96:])
        assert bodies == [b"order 1", b"order 2", b"order 3"] and tags == ["paid", None, "paid"]

        # §5.4: a frame with a wrong CRC is a protocol error: one ERROR with id 0, code 52, then the end
        bad = bytearray(frame(REQUEST, PING, 5, []))
        bad[4] ^= 0xFF
        sock.sendall(bytes(bad))
        frame_type, _, request_id, (code, retriable, message), _ = read_frame(sock)
        assert (frame_type, request_id, code) == (ERROR, 0, 52), message
        assert sock.recv(1) == b""  # closed
    finally:
        sock.close()
