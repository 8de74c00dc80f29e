"""How a body goes to and from a frame: its msgpack head plus the record batches of its
data section (``DATA_FIELDS``), with one prepared decoder per body type."""

from __future__ import annotations

from typing import Any, NamedTuple

import msgspec

from headwater.protocol.messages.base import ErrorBody, HandshakeAcceptedBody, HandshakeBody, Size
from headwater.protocol.messages.data import FetchResponse, LookupIdResponse, LookupKeyResponse, ProduceRequest
from headwater.protocol.messages.keyed import KeyedFetchResponse
from headwater.protocol.messages.shared import SharedReceiveResponse
from headwater.protocol.messages.specs import API_SPECS, PUSH_SPECS
from headwater.protocol.messages.streams import StreamPush, SubscriptionPush

#: Fields that travel in the data section: name -> True for a list of batches, False for one.
DATA_FIELDS: dict[type[msgspec.Struct], dict[str, bool]] = {
    ProduceRequest: {"batch": False},
    FetchResponse: {"batches": True},
    LookupIdResponse: {"batch": False},
    LookupKeyResponse: {"batches": True},
    KeyedFetchResponse: {"batches": True},
    SubscriptionPush: {"batches": True},
    StreamPush: {"batches": True},
    SharedReceiveResponse: {"batches": True},
}


class BodyCodec(NamedTuple):
    """How one body type goes to and from a head (msgpack) plus data buffers."""

    type: type[msgspec.Struct]
    decoder: msgspec.msgpack.Decoder[Any]
    data: tuple[tuple[int, bool], ...]  # (field position, is a list) of data fields

    def split(self, body: msgspec.Struct) -> tuple[list[Any] | msgspec.Struct, list[Any]]:
        """The value to encode as the head, and the data buffers in order."""
        if not self.data:
            return body, []
        values = list(msgspec.structs.astuple(body))
        buffers: list[Any] = []
        for pos, many in self.data:
            value = values[pos]
            if many:
                sizes = []  # a loop, not a comprehension: one Python call fewer per frame
                for b in value:  # a store's batches are memoryviews: their nbytes without a call
                    t = type(b)
                    sizes.append(len(b) if t in _PLAIN_BYTES else b.nbytes if t is memoryview else _nbytes(b))
                values[pos] = sizes
                buffers.extend(value)
            else:
                values[pos] = len(value) if type(value) in _PLAIN_BYTES else _nbytes(value)
                buffers.append(value)
        return values, buffers

    def decode(self, head: bytes | memoryview, data: bytes) -> Any:
        """The body from a frame's head and data; raises msgspec.DecodeError or ValueError."""
        fields = self.data
        if not fields and not data:  # the usual answer: its head is the body (no join call)
            return self.decoder.decode(head)
        if len(fields) == 1 and not fields[0][1]:  # one batch (a produce): join's work, inline
            values = list(msgspec.structs.astuple(self.decoder.decode(head)))
            pos = fields[0][0]
            if values[pos] == len(data):
                values[pos] = data
                return self.type(*values)
        return self.join(self.decoder.decode(head), data)  # which says what is wrong, if anything

    def join(self, head: msgspec.Struct, data: bytes) -> msgspec.Struct:
        """The body from a decoded head and the frame's data (raises ValueError)."""
        if not self.data:
            if data:
                raise ValueError(f"{len(data)} bytes of batch data in a frame that carries none")
            return head
        values = list(msgspec.structs.astuple(head))
        at = 0
        for pos, many in self.data:
            sizes = values[pos] if many else [values[pos]]
            parts = []
            for size in sizes:
                if at + size > len(data):
                    raise ValueError(f"batch sizes add up to more than the {len(data)} bytes of batch data")
                parts.append(data[at : at + size])
                at += size
            values[pos] = parts if many else parts[0]
        if at != len(data):
            raise ValueError(f"batch sizes add up to {at}, the frame carries {len(data)} bytes")
        return self.type(*values)


_PLAIN_BYTES = frozenset((bytes, bytearray))  # whose len() is their size in bytes


def _nbytes(b: Any) -> int:
    if not isinstance(b, (bytes, bytearray, memoryview)):
        raise TypeError(f"a record batch is bytes-like, got {type(b).__name__}")
    return memoryview(b).nbytes


def _codec(body_type: type[msgspec.Struct]) -> BodyCodec:
    data = DATA_FIELDS.get(body_type, {})
    names = body_type.__struct_fields__
    if not data:
        return BodyCodec(body_type, msgspec.msgpack.Decoder(body_type), ())
    fields: list[tuple[Any, ...]] = []
    for name, info in zip(names, msgspec.structs.fields(body_type)):
        if name in data:
            fields.append((name, list[Size] if data[name] else Size))
        elif info.default is not msgspec.NODEFAULT:
            fields.append((name, info.type, info.default))
        elif info.default_factory is not msgspec.NODEFAULT:  # a mutable default, e.g. []
            fields.append((name, info.type, msgspec.field(default_factory=info.default_factory)))
        else:
            fields.append((name, info.type))
    head_type = msgspec.defstruct(body_type.__name__ + "Head", fields, array_like=True, frozen=True)
    positions = tuple((names.index(n), many) for n, many in data.items())
    return BodyCodec(body_type, msgspec.msgpack.Decoder(head_type), positions)


_BODY_TYPES: tuple[type[msgspec.Struct], ...] = (
    HandshakeBody,
    HandshakeAcceptedBody,
    ErrorBody,
    *(s.request for s in API_SPECS.values()),
    *(s.response for s in API_SPECS.values()),
    *PUSH_SPECS.values(),
)
_CODECS: dict[type[msgspec.Struct], BodyCodec] = {t: _codec(t) for t in _BODY_TYPES}
_encoder = msgspec.msgpack.Encoder()
#: The response bodies without batch data: their frame is the msgpack head alone.
PLAIN_RESPONSE_TYPES: frozenset[type[msgspec.Struct]] = frozenset(
    s.response for s in API_SPECS.values() if not _CODECS[s.response].data
)
#: The codec of each request body type (a client's send fast path looks it up directly).
REQUEST_CODECS: dict[type[msgspec.Struct], BodyCodec] = {s.request: _CODECS[s.request] for s in API_SPECS.values()}
#: A plain body's head (msgspec's encoder, called directly: no Python-level call).
encode_plain_head = _encoder.encode


def body_codec(body_type: type[msgspec.Struct]) -> BodyCodec:
    """How a frame body type goes to and from a head plus data (``decode(head, data)``)."""
    return _CODECS[body_type]


def encode_body(body: msgspec.Struct, *, check: bool = True) -> tuple[bytes, list[Any]]:
    """The msgpack head and the data buffers of a body. ``check``: decode the head again
    against the body's own schema, so a field holding a value of the wrong type raises
    (TypeError, ValueError, msgspec.ValidationError) here rather than at the peer."""
    codec = _CODECS[type(body)]
    head_value, data = codec.split(body) if codec.data else (body, [])
    head = _encoder.encode(head_value)
    if check:
        codec.decoder.decode(head)  # what we send must be what the peer can decode
    return head, data


def decode_body(body_type: type[msgspec.Struct], head: bytes | memoryview, data: bytes) -> Any:
    """The body from a frame's head and data; raises msgspec.DecodeError or ValueError."""
    return _CODECS[body_type].decode(head, data)
