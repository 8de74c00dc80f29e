"""A protocol fuzzer that plays a bad peer against a real broker over TCP.

Each input is some bytes a peer might send after the handshake (or, for a few, instead of
it): random bytes, valid requests mutated (with the checksum left wrong or made right again,
so the damage reaches the body decoder), checksummed bodies of random msgpack, bodies nested
thousands deep, frames of the wrong type, flags or request id, and pipelines of valid
requests with a bad one among them. Inputs are made from a seed and their index, so a
failure names the input that caused it and can be replayed alone.

The oracle, after each input, sends a PING and reads frames until:
- the PING is answered: the broker took the input and goes on serving (the connection is
  reused for the next input);
- an ERROR frame for the whole connection (request id 0) arrives and then the connection
  closes: the broker refused the input and said why;
- the connection closes with no such frame first: a silent close, which is a failure;
- nothing comes within ``answer_timeout_s``: a hang, which is a failure.
The caller checks the broker's log for tracebacks and that the broker still serves.
"""

from __future__ import annotations

import random
import socket
import struct
import time
from collections import Counter
from dataclasses import dataclass, field

import crc32c
import msgspec

from headwater.model.batch import encode_batch
from headwater.protocol import CLIENT, ApiKey, Connection, Handshake
from headwater.protocol.frames import HEADER, FrameType, encode_frame
from headwater.protocol.messages import (
    DescribeQueueRequest,
    FetchRequest,
    ListQueuesRequest,
    LookupKeyRequest,
    OffsetForTimeRequest,
    PingRequest,
    ProduceRequest,
    encode_body,
)

FUZZ_QUEUE = "fuzz"
FRAME_BYTES_MAX = 2 << 20  # the fuzzed broker's limit, so a frame announced at random is cheap to complete
_PING_RID_BASE = 0x7FFF0000  # the oracle's PINGs; fuzzed frames keep their request ids below it
_INPUTS_PER_CONNECTION = 64  # then a new connection, so parked requests never pile up


_BATCH = bytes(encode_batch([b"fuzz", b"more"]))


def _valid_requests(rng: random.Random) -> list[tuple[int, msgspec.Struct]]:
    """Requests a well-behaved client sends, each harmless to repeat many times."""
    return [
        (ApiKey.PING, PingRequest()),
        (ApiKey.DESCRIBE_QUEUE, DescribeQueueRequest(FUZZ_QUEUE)),
        (ApiKey.LIST_QUEUES, ListQueuesRequest()),
        (ApiKey.FETCH, FetchRequest(FUZZ_QUEUE, 0, rng.randrange(0, 100), 4096)),
        (ApiKey.LOOKUP_KEY, LookupKeyRequest(FUZZ_QUEUE, b"k", None, None, 10)),
        (ApiKey.OFFSET_FOR_TIME, OffsetForTimeRequest(FUZZ_QUEUE, 0, rng.randrange(0, 2**40))),
        (ApiKey.PRODUCE, ProduceRequest(FUZZ_QUEUE, 0, _BATCH)),
    ]


def _frame(ftype: int, api: int, rid: int, head: bytes, data: bytes = b"", flags: int = 0) -> bytearray:
    out = bytearray(b"".join(encode_frame(ftype, api, rid, head, [data] if data else [])))
    if flags:
        out[9] = flags
        _reseal(out)
    return out


def _reseal(frame: bytearray) -> None:
    """Make the length and checksum right again after a mutation, so the body is decoded."""
    if len(frame) < 8:
        return  # cut inside its header: nothing to make right
    struct.pack_into("<I", frame, 0, len(frame) - 4)
    struct.pack_into("<I", frame, 4, crc32c.crc32c(bytes(frame[8:])))


def _request_frame(rng: random.Random, rid: int) -> bytearray:
    api, body = rng.choice(_valid_requests(rng))
    head, data = _encode(body)
    return _frame(FrameType.REQUEST, api, rid, head, data)


def _encode(body: msgspec.Struct) -> tuple[bytes, bytes]:
    head, data = encode_body(body)
    return bytes(head), b"".join(bytes(d) for d in data)


def _random_value(rng: random.Random, depth: int = 0) -> object:
    kind = rng.randrange(9 if depth < 4 else 6)
    if kind == 0:
        return rng.choice([0, -1, 1, 2**31, 2**63 - 1, -(2**63), 2**64 - 1, rng.randrange(-1000, 1000)])
    if kind == 1:
        return rng.choice(["", FUZZ_QUEUE, "x" * rng.randrange(0, 300), "\u00e9\u6f22", "a\x00b"])
    if kind == 2:
        return rng.randbytes(rng.randrange(0, 64))
    if kind == 3:
        return rng.choice([None, True, False])
    if kind == 4:
        return rng.random() * 10 ** rng.randrange(-5, 20)
    if kind == 5:
        return msgspec.msgpack.Ext(rng.randrange(-128, 128), rng.randbytes(rng.randrange(0, 8)))
    if kind in (6, 7):
        return [_random_value(rng, depth + 1) for _ in range(rng.randrange(0, 7))]
    return {str(_random_value(rng, depth + 1)): _random_value(rng, depth + 1) for _ in range(rng.randrange(0, 4))}


def _near(rng: random.Random, value: object) -> object:
    """A value of about the same type as ``value``, at an edge a client would not send."""
    if isinstance(value, bool) or value is None:
        return _random_value(rng)
    if isinstance(value, int):
        return rng.choice([-1, -(2**63), 2**63 - 1, 2**64 - 1, 2**31, 0, rng.randrange(-(2**40), 2**40)])
    if isinstance(value, str):
        return rng.choice(["", "nope", "x" * 300, "../etc", "a/b", "\u0000", FUZZ_QUEUE + "\u00e9"])
    if isinstance(value, bytes):
        return rng.randbytes(rng.randrange(0, 40))
    return _random_value(rng)


def _nested(rng: random.Random) -> bytes:
    depth = rng.choice([2, 10, 100, 500, 1000, 5000, 50_000])
    opener = rng.choice([b"\x91", b"\x81\xa1k", b"\xdc\x00\x01", b"\x91\x91"])
    return opener * depth + rng.choice([b"\x90", b"\x80", b"\xc0", b""])


def make_input(seed: int, index: int) -> tuple[str, bytes, bool]:
    """Input number ``index`` of run ``seed``: (kind, bytes, sent before the handshake)."""
    rng = random.Random(seed * 1_000_003 + index)
    rid = rng.randrange(1, _PING_RID_BASE)
    kind = rng.choices(
        ["random", "mutated", "mutated-resealed", "near-schema", "msgpack-body", "nested", "wrong-frame", "pipeline"],
        weights=[8, 12, 15, 30, 12, 6, 5, 12],
    )[0]
    if kind == "random":
        data = rng.randbytes(rng.randrange(0, 200))
    elif kind in ("mutated", "mutated-resealed"):
        frame = _request_frame(rng, rid)
        for _ in range(rng.randrange(1, 5)):
            _mutate(rng, frame)
        if kind == "mutated-resealed":
            _reseal(frame)
        data = bytes(frame)
    elif kind == "near-schema":  # a valid request whose fields hold values a client would not send
        api, body = rng.choice(_valid_requests(rng))
        fields = list(msgspec.to_builtins(body))
        for _ in range(rng.randrange(1, 3)):
            at = rng.randrange(len(fields)) if fields else 0
            fields[at : at + 1] = [_near(rng, fields[at] if fields else None)]
        batch = _BATCH if api == ApiKey.PRODUCE and rng.random() < 0.5 else b""
        data = bytes(_frame(FrameType.REQUEST, api, rid, msgspec.msgpack.encode(fields), batch))
    elif kind == "msgpack-body":
        api = rng.choice([*list(ApiKey), rng.randrange(0, 65536)])
        value = _random_value(rng) if rng.random() < 0.5 else [_random_value(rng, 3) for _ in range(rng.randrange(6))]
        head = msgspec.msgpack.encode(value)
        data = bytes(_frame(FrameType.REQUEST, api, rid, head, rng.randbytes(rng.randrange(3))))
    elif kind == "nested":
        data = bytes(_frame(FrameType.REQUEST, rng.choice(list(ApiKey)), rid, _nested(rng)))
    elif kind == "wrong-frame":
        ftype = rng.choice([0, FrameType.HANDSHAKE, FrameType.RESPONSE, FrameType.ERROR, FrameType.PUSH, 7, 255])
        frame = _request_frame(rng, rng.choice([0, rid, 2**32 - 1]))
        frame[8] = ftype
        if rng.random() < 0.3:
            frame[9] = rng.randrange(1, 256)  # flags
        _reseal(frame)
        data = bytes(frame)
    else:  # a pipeline of valid requests, a bad one somewhere among them
        frames = [_request_frame(rng, rid + i) for i in range(rng.randrange(2, 12))]
        if rng.random() < 0.7:
            bad = rng.randrange(len(frames))
            _mutate(rng, frames[bad])
            if rng.random() < 0.5:
                _reseal(frames[bad])
        data = b"".join(bytes(f) for f in frames)
    return kind, data, rng.random() < 0.03


def completed(data: bytes) -> bytes:
    """``data`` with zeros added so that its last frame is whole, as its length field
    announces; otherwise the broker rightly waits for the rest (until frame_timeout_s)
    and the oracle's PING would be read as part of it."""
    out = bytearray(data)
    pos = 0
    while pos < len(out):
        if len(out) - pos < 4:
            out.extend(bytes(4 - (len(out) - pos)))
        (length,) = struct.unpack_from("<I", out, pos)
        if 4 + length > FRAME_BYTES_MAX or length < HEADER.size - 4 + 1:
            break  # refused from its length alone
        pos += 4 + length
        if pos > len(out):
            out.extend(bytes(pos - len(out)))
    return bytes(out)


def _mutate(rng: random.Random, frame: bytearray) -> None:
    if not frame:
        frame.extend(rng.randbytes(4))
        return
    op = rng.randrange(5)
    at = rng.randrange(len(frame))
    if op == 0:
        frame[at] ^= 1 << rng.randrange(8)
    elif op == 1:
        frame[at] = rng.choice([0x00, 0xFF, 0x7F, 0x80, 0xC1, 0xDC, 0xDD, 0xCF])
    elif op == 2:
        frame[at:at] = rng.randbytes(rng.randrange(1, 9))
    elif op == 3:
        del frame[at : at + rng.randrange(1, 9)]
    else:
        del frame[at:]


@dataclass
class FuzzReport:
    inputs: int = 0
    outcomes: Counter = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0


class _Peer:
    """One raw connection: write bytes, read whole frames (header fields only)."""

    def __init__(self, port: int, timeout_s: float, handshake: bool) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout_s)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray()
        self.used = 0
        if handshake:
            self.sock.sendall(Connection(CLIENT).send(Handshake("fuzz")))
            ftype, _rid = self.frame()
            assert ftype == FrameType.HANDSHAKE_ACCEPTED, f"handshake answered with frame type {ftype}"

    def frame(self) -> tuple[int, int]:
        """The next frame's (type, request id); (-1, 0) when the broker closed the connection."""
        while True:
            if len(self.buf) >= 4:
                (length,) = struct.unpack_from("<I", self.buf)
                if len(self.buf) >= 4 + length:
                    _len, _crc, ftype, _flags, _api, rid, _data = HEADER.unpack_from(self.buf)
                    del self.buf[: 4 + length]
                    return ftype, rid
            try:
                chunk = self.sock.recv(1 << 16)
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                return -1, 0
            self.buf += chunk

    def close(self) -> None:
        self.sock.close()


def run(port: int, *, seed: int, count: int, answer_timeout_s: float = 10.0, start: int = 0) -> FuzzReport:
    """Send inputs ``start`` .. ``start + count`` of run ``seed``; classify what the broker did."""
    report = FuzzReport()
    t0 = time.monotonic()
    peer: _Peer | None = None
    ping_rid = _PING_RID_BASE
    for index in range(start, start + count):
        kind, data, before_handshake = make_input(seed, index)
        if before_handshake and peer is not None:
            peer.close()
            peer = None
        if peer is None or peer.used >= _INPUTS_PER_CONNECTION:
            if peer is not None:
                peer.close()
            peer = _Peer(port, answer_timeout_s, handshake=not before_handshake)
        peer.used += 1
        ping_rid += 1
        ping = bytes(_frame(FrameType.REQUEST, ApiKey.PING, ping_rid, _encode(PingRequest())[0]))
        try:
            peer.sock.sendall(completed(data) + ping)
            outcome = _outcome(peer, ping_rid)
        except TimeoutError:
            outcome = "hang"
        except (BrokenPipeError, ConnectionResetError):
            outcome = _outcome(peer, ping_rid)  # closed while we wrote: what did it say first?
        report.outcomes[f"{kind}: {outcome}"] += 1
        if outcome in ("silent close", "hang"):
            report.failures.append(f"seed {seed} input {index} ({kind}, {outcome}): {data[:120].hex()}")
        if outcome != "served":
            peer.close()
            peer = None
        if before_handshake and peer is not None:
            peer.close()  # it was handshaken by the input itself, perhaps: start clean
            peer = None
        report.inputs += 1
    if peer is not None:
        peer.close()
    report.seconds = time.monotonic() - t0
    return report


def _outcome(peer: _Peer, ping_rid: int) -> str:
    said_why = False
    try:
        while True:
            ftype, rid = peer.frame()
            if ftype == -1:
                return "refused with an error frame" if said_why else "silent close"
            if rid == ping_rid and ftype in (FrameType.RESPONSE, FrameType.ERROR):
                return "served"
            if ftype == FrameType.ERROR and rid == 0:
                said_why = True
    except TimeoutError:
        return "hang"
    except (ConnectionResetError, BrokenPipeError):
        return "refused with an error frame" if said_why else "silent close"
