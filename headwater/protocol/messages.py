"""API keys and the body of every frame: one msgspec struct per request and per response.

A body is a msgpack array of the struct's fields in the order declared here (nested model
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
"""

from __future__ import annotations

from collections.abc import Callable
from enum import IntEnum
from typing import Annotated, Any, ClassVar, NamedTuple

import msgspec

from headwater.model.config import QueueConfig, QueueInfo
from headwater.model.service import BrokerService, FetchResult, ProduceResult

__all__ = [
    "ApiKey",
    "ApiSpec",
    "API_SPECS",
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
    "StatusRequest",
    "StatusResponse",
    "spec_for",
    "invoke",
]

PROTOCOL_MAGIC = "headwater"
VERSION_MIN = 1  # oldest protocol version this code speaks
VERSION_MAX = 1  # newest protocol version this code speaks

Size = Annotated[int, msgspec.Meta(ge=0, le=2**32 - 1)]
U32 = Annotated[int, msgspec.Meta(ge=0, le=2**32 - 1)]


class ApiKey(IntEnum):
    """The operation a request names (u16 in the frame header). 0 is never an API."""

    PING = 1
    # queue administration
    CREATE_QUEUE = 10
    DESCRIBE_QUEUE = 11
    LIST_QUEUES = 12
    DELETE_QUEUE = 13
    TRUNCATE_QUEUE = 14
    SET_QUEUE_ENABLED = 15
    ADD_PARTITIONS = 16
    # data
    PRODUCE = 20
    FETCH = 21
    LOOKUP_ID = 22
    LOOKUP_KEY = 23
    OFFSET_FOR_TIME = 24
    # consumer group offsets
    COMMIT_OFFSETS = 30
    FETCH_OFFSETS = 31
    # status and metrics
    STATUS = 90


#: Key ranges held for later features, so their numbers never collide.
RESERVED_API_KEYS: dict[range, str] = {
    range(2, 10): "connection: authentication, metadata",
    range(17, 20): "more queue administration (subscribers)",
    range(25, 30): "more data operations",
    range(32, 40): "more consumer group offsets",
    range(40, 50): "consumer group membership: join, sync, heartbeat, leave",
    range(50, 60): "shared delivery: lease, ack, nack, dead letters",
    range(60, 70): "push subscriptions: subscribe, unsubscribe, checkpoint (PUSH frames)",
    range(70, 80): "delayed messages",
    range(80, 90): "transactions: prepare, commit, roll back, check back",
    range(91, 100): "more status and metrics",
    range(100, 200): "cluster: brokers, partition locations, replication",
    range(0x8000, 0x10000): "private extensions, never assigned by Headwater",
}


# connection-level bodies ---------------------------------------------------------------


class HandshakeBody(msgspec.Struct, frozen=True, array_like=True):
    """First frame of a connection, client to server."""

    magic: str  # always "headwater"
    version_min: U32
    version_max: U32
    client_name: str
    frame_bytes_max: U32  # the biggest frame this client accepts


class HandshakeAcceptedBody(msgspec.Struct, frozen=True, array_like=True):
    """The server's answer to a handshake it accepts."""

    version: U32
    server_name: str
    frame_bytes_max: U32  # the biggest frame this server accepts
    requests_in_flight_max: U32  # requests the client may have unanswered at once


class ErrorBody(msgspec.Struct, frozen=True, array_like=True):
    code: U32
    retriable: bool
    message: str


# operation bodies --------------------------------------------------------------------


class RequestBody(msgspec.Struct, frozen=True, array_like=True):
    """Base of request bodies. ``api`` is the key it travels under."""

    api: ClassVar[ApiKey]


class ResponseBody(msgspec.Struct, frozen=True, array_like=True):
    """Base of response bodies: :meth:`result` is what the BrokerService method returns."""

    api: ClassVar[ApiKey]

    def result(self) -> Any:
        raise NotImplementedError

    @classmethod
    def from_result(cls, value: Any) -> ResponseBody:
        raise NotImplementedError


class _NoResult(ResponseBody, frozen=True, array_like=True):
    def result(self) -> None:
        return None

    @classmethod
    def from_result(cls, value: Any) -> ResponseBody:
        return cls()


class _QueueInfoResult(ResponseBody, frozen=True, array_like=True):
    queue: QueueInfo

    def result(self) -> QueueInfo:
        return self.queue

    @classmethod
    def from_result(cls, value: QueueInfo) -> ResponseBody:
        return cls(value)


class PingRequest(RequestBody, frozen=True, array_like=True):
    api = ApiKey.PING


class PingResponse(_NoResult, frozen=True, array_like=True):
    api = ApiKey.PING


class CreateQueueRequest(RequestBody, frozen=True, array_like=True):
    api = ApiKey.CREATE_QUEUE
    name: str
    config: QueueConfig


class CreateQueueResponse(_QueueInfoResult, frozen=True, array_like=True):
    api = ApiKey.CREATE_QUEUE


class DescribeQueueRequest(RequestBody, frozen=True, array_like=True):
    api = ApiKey.DESCRIBE_QUEUE
    name: str


class DescribeQueueResponse(_QueueInfoResult, frozen=True, array_like=True):
    api = ApiKey.DESCRIBE_QUEUE


class ListQueuesRequest(RequestBody, frozen=True, array_like=True):
    api = ApiKey.LIST_QUEUES


class ListQueuesResponse(ResponseBody, frozen=True, array_like=True):
    api = ApiKey.LIST_QUEUES
    queues: list[QueueInfo]

    def result(self) -> list[QueueInfo]:
        return list(self.queues)

    @classmethod
    def from_result(cls, value: list[QueueInfo]) -> ResponseBody:
        return cls(list(value))


class DeleteQueueRequest(RequestBody, frozen=True, array_like=True):
    api = ApiKey.DELETE_QUEUE
    name: str


class DeleteQueueResponse(_NoResult, frozen=True, array_like=True):
    api = ApiKey.DELETE_QUEUE


class TruncateQueueRequest(RequestBody, frozen=True, array_like=True):
    api = ApiKey.TRUNCATE_QUEUE
    name: str


class TruncateQueueResponse(_QueueInfoResult, frozen=True, array_like=True):
    api = ApiKey.TRUNCATE_QUEUE


class SetQueueEnabledRequest(RequestBody, frozen=True, array_like=True):
    api = ApiKey.SET_QUEUE_ENABLED
    name: str
    enabled: bool


class SetQueueEnabledResponse(_QueueInfoResult, frozen=True, array_like=True):
    api = ApiKey.SET_QUEUE_ENABLED


class AddPartitionsRequest(RequestBody, frozen=True, array_like=True):
    api = ApiKey.ADD_PARTITIONS
    name: str
    partitions: int


class AddPartitionsResponse(_QueueInfoResult, frozen=True, array_like=True):
    api = ApiKey.ADD_PARTITIONS


class ProduceRequest(RequestBody, frozen=True, array_like=True):
    """Append one record batch (as built by ``encode_batch``) to a partition."""

    api = ApiKey.PRODUCE
    queue: str
    partition: int
    batch: bytes  # data section; any bytes-like object when sending


class ProduceResponse(ResponseBody, frozen=True, array_like=True):
    api = ApiKey.PRODUCE
    queue_id: int
    partition: int
    base_offset: int
    count: int
    timestamp_ms: int

    def result(self) -> ProduceResult:
        return ProduceResult(*msgspec.structs.astuple(self))

    @classmethod
    def from_result(cls, value: ProduceResult) -> ResponseBody:
        return cls(*msgspec.structs.astuple(value))


class FetchRequest(RequestBody, frozen=True, array_like=True):
    """Stored batches of a partition from ``offset`` on, about ``max_bytes`` of them.

    When nothing is there yet the server may hold the request up to ``max_wait_ms`` for
    data to arrive (long polling); 0 answers at once.
    """

    api = ApiKey.FETCH
    queue: str
    partition: int
    offset: int
    max_bytes: int
    tag_mask: int = 0
    end_offset: int | None = None
    max_wait_ms: int = 0


class FetchResponse(ResponseBody, frozen=True, array_like=True):
    api = ApiKey.FETCH
    batches: list[bytes]  # data section; any bytes-like objects when sending
    next_offset: int
    start_offset: int
    end_offset: int

    def result(self) -> FetchResult:
        return FetchResult(list(self.batches), self.next_offset, self.start_offset, self.end_offset)

    @classmethod
    def from_result(cls, value: FetchResult) -> ResponseBody:
        return cls(list(value.batches), value.next_offset, value.start_offset, value.end_offset)


class LookupIdRequest(RequestBody, frozen=True, array_like=True):
    api = ApiKey.LOOKUP_ID
    queue_id: int
    partition: int
    offset: int


class LookupIdResponse(ResponseBody, frozen=True, array_like=True):
    """The queue's name and the stored batch holding the message."""

    api = ApiKey.LOOKUP_ID
    queue: str
    batch: bytes  # data section

    def result(self) -> tuple[str, bytes]:
        return self.queue, self.batch

    @classmethod
    def from_result(cls, value: tuple[str, bytes]) -> ResponseBody:
        return cls(*value)


class LookupKeyRequest(RequestBody, frozen=True, array_like=True):
    api = ApiKey.LOOKUP_KEY
    queue: str
    key: bytes
    start_ms: int | None
    end_ms: int | None
    limit: int


class LookupKeyResponse(ResponseBody, frozen=True, array_like=True):
    """Stored batches that may hold messages with the key (the reader keeps exact matches)."""

    api = ApiKey.LOOKUP_KEY
    batches: list[bytes]  # data section

    def result(self) -> list[bytes]:
        return list(self.batches)

    @classmethod
    def from_result(cls, value: list[bytes]) -> ResponseBody:
        return cls(list(value))


class OffsetForTimeRequest(RequestBody, frozen=True, array_like=True):
    api = ApiKey.OFFSET_FOR_TIME
    queue: str
    partition: int
    timestamp_ms: int


class OffsetForTimeResponse(ResponseBody, frozen=True, array_like=True):
    api = ApiKey.OFFSET_FOR_TIME
    offset: int

    def result(self) -> int:
        return self.offset

    @classmethod
    def from_result(cls, value: int) -> ResponseBody:
        return cls(value)


# the table ---------------------------------------------------------------------------

#: Fields that travel in the data section: name -> True for a list of batches, False for one.
DATA_FIELDS: dict[type[msgspec.Struct], dict[str, bool]] = {
    ProduceRequest: {"batch": False},
    FetchResponse: {"batches": True},
    LookupIdResponse: {"batch": False},
    LookupKeyResponse: {"batches": True},
}


class CommitOffsetsRequest(RequestBody, frozen=True, array_like=True):
    """Store a consumer group's positions: ``{partition: offset}`` (next offset to read)."""

    api = ApiKey.COMMIT_OFFSETS
    group: str
    queue: str
    offsets: dict[int, int]


class CommitOffsetsResponse(_NoResult, frozen=True, array_like=True):
    api = ApiKey.COMMIT_OFFSETS


class FetchOffsetsRequest(RequestBody, frozen=True, array_like=True):
    api = ApiKey.FETCH_OFFSETS
    group: str
    queue: str


class FetchOffsetsResponse(ResponseBody, frozen=True, array_like=True):
    api = ApiKey.FETCH_OFFSETS
    offsets: dict[int, int]

    def result(self) -> dict[int, int]:
        return dict(self.offsets)

    @classmethod
    def from_result(cls, value: dict[int, int]) -> ResponseBody:
        return cls(dict(value))


class StatusRequest(RequestBody, frozen=True, array_like=True):
    """Facts about the broker for operators (``headwater status``)."""

    api = ApiKey.STATUS


class StatusResponse(ResponseBody, frozen=True, array_like=True):
    api = ApiKey.STATUS
    status: dict[str, Any]

    def result(self) -> dict[str, Any]:
        return dict(self.status)

    @classmethod
    def from_result(cls, value: dict[str, Any]) -> ResponseBody:
        return cls(dict(value))


class _Codec(NamedTuple):
    """How one body type goes to and from a head (msgpack) plus data buffers."""

    type: type[msgspec.Struct]
    decoder: msgspec.msgpack.Decoder
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
                values[pos] = [_nbytes(b) for b in value]
                buffers.extend(value)
            else:
                values[pos] = _nbytes(value)
                buffers.append(value)
        return values, buffers

    def join(self, head: Any, data: bytes) -> msgspec.Struct:
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
                    raise ValueError(
                        f"batch sizes add up to more than the {len(data)} bytes of batch data"
                    )
                parts.append(data[at : at + size])
                at += size
            values[pos] = parts if many else parts[0]
        if at != len(data):
            raise ValueError(f"batch sizes add up to {at}, the frame carries {len(data)} bytes")
        return self.type(*values)


def _nbytes(b: Any) -> int:
    if not isinstance(b, (bytes, bytearray, memoryview)):
        raise TypeError(f"a record batch is bytes-like, got {type(b).__name__}")
    return memoryview(b).nbytes


def _codec(body_type: type[msgspec.Struct]) -> _Codec:
    data = DATA_FIELDS.get(body_type, {})
    names = body_type.__struct_fields__
    if not data:
        return _Codec(body_type, msgspec.msgpack.Decoder(body_type), ())
    fields = []
    for name, info in zip(names, msgspec.structs.fields(body_type)):
        if name in data:
            fields.append((name, list[Size] if data[name] else Size))
        elif info.default is not msgspec.NODEFAULT:
            fields.append((name, info.type, info.default))
        else:
            fields.append((name, info.type))
    head_type = msgspec.defstruct(
        body_type.__name__ + "Head", fields, array_like=True, frozen=True
    )
    positions = tuple((names.index(n), many) for n, many in data.items())
    return _Codec(body_type, msgspec.msgpack.Decoder(head_type), positions)


class ApiSpec(NamedTuple):
    """One operation: its key, body types, the BrokerService method it maps to, and the
    first protocol version that has it."""

    key: ApiKey
    request: type[RequestBody]
    response: type[ResponseBody]
    method: str | None  # None: handled by the server itself (ping)
    since_version: int = 1


API_SPECS: dict[ApiKey, ApiSpec] = {
    s.key: s
    for s in (
        ApiSpec(ApiKey.PING, PingRequest, PingResponse, None),
        ApiSpec(ApiKey.CREATE_QUEUE, CreateQueueRequest, CreateQueueResponse, "create_queue"),
        ApiSpec(ApiKey.DESCRIBE_QUEUE, DescribeQueueRequest, DescribeQueueResponse, "describe_queue"),
        ApiSpec(ApiKey.LIST_QUEUES, ListQueuesRequest, ListQueuesResponse, "list_queues"),
        ApiSpec(ApiKey.DELETE_QUEUE, DeleteQueueRequest, DeleteQueueResponse, "delete_queue"),
        ApiSpec(ApiKey.TRUNCATE_QUEUE, TruncateQueueRequest, TruncateQueueResponse, "truncate_queue"),
        ApiSpec(ApiKey.SET_QUEUE_ENABLED, SetQueueEnabledRequest, SetQueueEnabledResponse,
                "set_queue_enabled"),
        ApiSpec(ApiKey.ADD_PARTITIONS, AddPartitionsRequest, AddPartitionsResponse, "add_partitions"),
        ApiSpec(ApiKey.PRODUCE, ProduceRequest, ProduceResponse, "produce"),
        ApiSpec(ApiKey.FETCH, FetchRequest, FetchResponse, "fetch"),
        ApiSpec(ApiKey.LOOKUP_ID, LookupIdRequest, LookupIdResponse, "lookup_id"),
        ApiSpec(ApiKey.LOOKUP_KEY, LookupKeyRequest, LookupKeyResponse, "lookup_key"),
        ApiSpec(ApiKey.OFFSET_FOR_TIME, OffsetForTimeRequest, OffsetForTimeResponse,
                "offset_for_time"),
        ApiSpec(ApiKey.COMMIT_OFFSETS, CommitOffsetsRequest, CommitOffsetsResponse, "commit_offsets"),
        ApiSpec(ApiKey.FETCH_OFFSETS, FetchOffsetsRequest, FetchOffsetsResponse, "fetch_offsets"),
        ApiSpec(ApiKey.STATUS, StatusRequest, StatusResponse, "status"),
    )
}

for _s in API_SPECS.values():
    assert _s.request.api is _s.key and _s.response.api is _s.key, _s
del _s

_CODECS: dict[type[msgspec.Struct], _Codec] = {
    t: _codec(t)
    for t in (
        HandshakeBody,
        HandshakeAcceptedBody,
        ErrorBody,
        *(s.request for s in API_SPECS.values()),
        *(s.response for s in API_SPECS.values()),
    )
}
_encoder = msgspec.msgpack.Encoder()


def spec_for(api: int, version: int) -> ApiSpec | None:
    """The operation with key ``api`` in protocol ``version``, or None if it has none."""
    try:
        spec = API_SPECS[ApiKey(api)]
    except ValueError:
        return None
    return spec if spec.since_version <= version else None


def encode_body(body: msgspec.Struct) -> tuple[bytes, list[Any]]:
    """The msgpack head and the data buffers of a body, checked against its own schema
    (raises TypeError or ValueError if a field holds a value of the wrong type)."""
    codec = _CODECS[type(body)]
    head_value, data = codec.split(body)
    head = _encoder.encode(head_value)
    codec.decoder.decode(head)  # what we send must be what the peer can decode
    return head, data


def decode_body(body_type: type[msgspec.Struct], head: memoryview, data: bytes) -> Any:
    """The body from a frame's head and data; raises msgspec.DecodeError or ValueError."""
    codec = _CODECS[body_type]
    return codec.join(codec.decoder.decode(head), data)


def invoke(service: BrokerService, request: RequestBody) -> ResponseBody:
    """Run a request against a service the plain way (no long polling); the response body.

    Exceptions of the service propagate: the caller turns them into error responses.
    """
    spec = API_SPECS[request.api]
    if spec.method is None:
        return spec.response.from_result(None)
    args = msgspec.structs.asdict(request)
    if spec.key is ApiKey.FETCH:
        del args["max_wait_ms"]
    return spec.response.from_result(getattr(service, spec.method)(**args))
