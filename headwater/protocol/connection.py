"""The sans-IO connection: bytes in, events out; events in, bytes out. No sockets.

One class serves both ends, told apart by its :class:`Role`. The transport feeds whatever
it read with :meth:`Connection.receive_data` (``b""`` at EOF), drains events with
:meth:`Connection.next_event` until it returns :data:`NEED_DATA`, and writes whatever
:meth:`Connection.send` returns. Server loop, with a blocking socket for brevity::

    conn = Connection(SERVER)
    while True:
        event = conn.next_event()            # RemoteProtocolError: send a last error, close
        if event is NEED_DATA:
            conn.receive_data(sock.recv(65536))
        elif isinstance(event, Handshake):
            try:
                accept = HandshakeAccepted(choose_version(event), "headwater 0.1")
            except UnsupportedVersionError as e:
                sock.sendall(conn.send(ErrorResponse.from_exception(0, e)))
                break
            sock.sendall(conn.send(accept))
        elif isinstance(event, Request):
            try:
                answer = Response(event.request_id, invoke(broker, event.body))
            except HeadwaterError as e:
                answer = ErrorResponse.from_exception(event.request_id, e)
            sock.sendall(conn.send(answer))
        elif isinstance(event, (ErrorResponse, ConnectionClosed)):
            break

Client loop::

    conn = Connection(CLIENT)
    sock.sendall(conn.send(Handshake("my-app")))
    ...wait for HandshakeAccepted the same way...
    rid = conn.next_request_id()
    sock.sendall(conn.send(Request(rid, DescribeQueueRequest("orders"))))
    while (event := conn.next_event()) is NEED_DATA:
        conn.receive_data(sock.recv(65536))
    if isinstance(event, ErrorResponse):
        raise event.exception()              # e.g. QueueNotFoundError
    info = event.result()

Invariants: garbage from the peer raises :class:`RemoteProtocolError` (and nothing else)
and leaves the connection in ``ERROR``; partial input yields :data:`NEED_DATA`, never a
wait. ``send`` is all or nothing: it returns the bytes and advances the state, or raises
(:class:`LocalProtocolError`, or :class:`MessageTooLargeError` for a frame above the peer's
limit) and changes nothing. A client's ``send`` checks each body against its schema (a
field holding a value of the wrong type raises :class:`LocalProtocolError`); a server's
sends the bodies it built as they are. When a connection ends (``ConnectionClosed``, an
``ErrorResponse`` with request id 0, or ``RemoteProtocolError``), the requests still in
:attr:`Connection.in_flight` will never be answered: fail them. Thread-safety: none; one
connection belongs to one task.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from types import MappingProxyType
from typing import Any, NamedTuple

import msgspec

from headwater.errors import InvalidArgumentError, MessageTooLargeError
from headwater.protocol._state import Direction, Kind, Role, State, table_for
from headwater.protocol.errors import (
    LocalProtocolError,
    RemoteProtocolError,
    UnsupportedVersionError,
)
from headwater.protocol.events import (
    NEED_DATA,
    ConnectionClosed,
    ErrorResponse,
    Event,
    Handshake,
    HandshakeAccepted,
    NeedData,
    Push,
    Request,
    Response,
)
from headwater.protocol.frames import (
    FRAME_BYTES_MAX_DEFAULT,
    FRAME_BYTES_MIN,
    Buffer,
    Frame,
    FrameHeader,
    FrameReader,
    FrameType,
    encode_frame_sized,
    encode_plain_frame,
)
from headwater.protocol.messages import (
    PROTOCOL_MAGIC,
    PUSH_SPECS,
    VERSION_MAX,
    VERSION_MIN,
    ApiKey,
    BodyCodec,
    ErrorBody,
    HandshakeAcceptedBody,
    HandshakeBody,
    PushBody,
    RequestBody,
    ResponseBody,
    body_codec,
    decode_body,
    encode_body,
    spec_for,
)
from headwater.protocol.messages.codec import PLAIN_RESPONSE_TYPES, REQUEST_CODECS, encode_plain_head

__all__ = [
    "Connection",
    "CLIENT",
    "SERVER",
    "choose_version",
    "REQUESTS_IN_FLIGHT_MAX_DEFAULT",
    "ERROR_MESSAGE_CHARS_MAX",
]

CLIENT, SERVER = Role.CLIENT, Role.SERVER
#: Default bound on requests sent and not yet answered, per connection.
REQUESTS_IN_FLIGHT_MAX_DEFAULT = 256
#: Error messages longer than this are cut, so an error frame always fits the smallest limit.
ERROR_MESSAGE_CHARS_MAX = 900
_REQUEST_ID_MAX = 2**32 - 1

# The per-frame path below avoids Enum calls (``FrameType(x)``, ``ApiKey(x)``) and Python-
# level hashing: frame types and api keys stay plain ints, and module constants stand for
# the members it compares against.
_HANDSHAKE_T, _ACCEPTED_T, _REQUEST_T, _RESPONSE_T, _ERROR_T, _PUSH_T = (int(t) for t in FrameType)
_K_HANDSHAKE, _K_ACCEPT, _K_REQUEST, _K_RESPONSE = Kind.HANDSHAKE, Kind.ACCEPT, Kind.REQUEST, Kind.RESPONSE
_K_ERROR, _K_FATAL, _K_PUSH, _K_CLOSE = Kind.ERROR, Kind.FATAL, Kind.PUSH, Kind.CLOSE
_S_CLOSED, _S_ERROR = State.CLOSED, State.ERROR
#: the Kind of a frame, indexed by frame type (ERROR frames: FATAL or ERROR by request id)
_KIND_OF_FRAME: tuple[Kind | None, ...] = (
    None,
    _K_HANDSHAKE,
    _K_ACCEPT,
    _K_REQUEST,
    _K_RESPONSE,
    None,
    _K_PUSH,
)
assert all(_KIND_OF_FRAME[t] is not None for t in FrameType if t is not FrameType.ERROR)
_KIND_OF_EVENT = {
    Handshake: Kind.HANDSHAKE,
    HandshakeAccepted: Kind.ACCEPT,
    Request: Kind.REQUEST,
    Response: Kind.RESPONSE,
    Push: Kind.PUSH,
    ConnectionClosed: Kind.CLOSE,
}
# msgspec raises DecodeError/ValidationError (ValueErrors); the rest guard odd corners
# what decoding a malformed body can raise (RecursionError: a body nested thousands deep)
_DECODE_ERRORS = (msgspec.MsgspecError, ValueError, TypeError, OverflowError, UnicodeError, RecursionError)


class _Api(NamedTuple):
    """One operation of a protocol version, as the connection needs it for each frame."""

    key: ApiKey
    request: BodyCodec
    response: BodyCodec
    push: BodyCodec | None  # None: the operation has no PUSH frames


@cache  # one table per protocol version, shared by every connection speaking it
def _apis_of_version(version: int) -> dict[int, _Api]:
    """The operations of ``version``, keyed by api key as a plain int."""
    table = {}
    for key in ApiKey:
        spec = spec_for(key, version)
        if spec is not None:
            push = PUSH_SPECS.get(key)
            table[int(key)] = _Api(
                key, body_codec(spec.request), body_codec(spec.response), None if push is None else body_codec(push)
            )
    return table


def choose_version(handshake: Handshake) -> int:
    """The newest protocol version both the client and this code speak.

    Raises :class:`UnsupportedVersionError` (send it as ``ErrorResponse`` with request id
    0, then close) when there is none.
    """
    lo = max(handshake.version_min, VERSION_MIN)
    hi = min(handshake.version_max, VERSION_MAX)
    if lo > hi:
        raise UnsupportedVersionError(
            f"the client speaks protocol versions {handshake.version_min} to "
            f"{handshake.version_max}; this server speaks {VERSION_MIN} to {VERSION_MAX}"
        )
    return hi


class Connection:
    """One end of a Headwater protocol connection, for ``role`` CLIENT or SERVER.

    ``frame_bytes_max`` bounds each frame this end accepts (told to the peer in the
    handshake); ``requests_in_flight_max`` bounds the requests unanswered at once (a
    client uses the smaller of its own and the server's).
    """

    def __init__(
        self,
        role: Role,
        *,
        frame_bytes_max: int = FRAME_BYTES_MAX_DEFAULT,
        requests_in_flight_max: int = REQUESTS_IN_FLIGHT_MAX_DEFAULT,
    ) -> None:
        if not isinstance(role, Role):
            raise InvalidArgumentError(f"role must be CLIENT or SERVER, got {role!r}")
        for name, value, lo in (
            ("frame_bytes_max", frame_bytes_max, FRAME_BYTES_MIN),
            ("requests_in_flight_max", requests_in_flight_max, 1),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or not lo <= value < 2**32:
                raise InvalidArgumentError(f"{name} must be a whole number from {lo} to 2**32 - 1, got {value!r}")
        self.role = role
        # A client's bodies carry the application's values: each is checked against its
        # schema before it is sent. A server's are built from its own typed results (and
        # from requests already checked on the way in); checking them again cost a broker
        # two decodes per one-message produce with a consumer following (answer and push).
        self._check_bodies = role is Role.CLIENT
        self.frame_bytes_max = frame_bytes_max
        self._own_in_flight_max = requests_in_flight_max
        self._in_flight_max = requests_in_flight_max
        self._state = State.AWAIT_HANDSHAKE
        self._reader = FrameReader(frame_bytes_max, self._check_header)
        #: The bytes received and not yet cut into frames (read it, never write it). Empty,
        #: and :attr:`ended` False: :meth:`next_event` would return NEED_DATA and no frame
        #: is begun, which a hot loop may test without calling it.
        self.unframed: bytearray = self._reader.buffer
        #: Whether the peer closed its side (``receive_data(b"")``).
        self.ended = False
        self._in_flight: dict[int, ApiKey] = {}
        self._receive_next = table_for(role, Direction.RECEIVE)  # (state, kind) -> state
        self._send_next = table_for(role, Direction.SEND)
        self._apis: dict[int, _Api] = {}  # the operations of self.version, once agreed
        self._next_id = 1
        self._offered: tuple[int, int] = (VERSION_MIN, VERSION_MAX)
        self._error: RemoteProtocolError | None = None
        #: Protocol version agreed in the handshake; None before.
        self.version: int | None = None
        #: The peer's client_name or server_name; None before the handshake.
        self.peer_name: str | None = None
        #: The biggest frame the peer accepts; before the handshake, the smallest allowed.
        self.peer_frame_bytes_max = FRAME_BYTES_MIN

    # inspection ------------------------------------------------------------------------

    @property
    def state(self) -> State:
        return self._state

    @property
    def requests_in_flight_max(self) -> int:
        """Requests that may be unanswered at once on this connection (after the handshake,
        the client's value is the smaller of its own setting and the server's)."""
        return self._in_flight_max

    @property
    def in_flight(self) -> Mapping[int, ApiKey]:
        """Request ids sent (client) or received (server) and not answered yet."""
        return MappingProxyType(self._in_flight)

    @property
    def frame_in_progress_bytes(self) -> int:
        """The announced size of the frame being received, once its length is in and until it
        is whole (0 otherwise); ask after :meth:`next_event` returned :data:`NEED_DATA`."""
        return self._reader.frame_in_progress_bytes

    @property
    def frame_received_bytes(self) -> int:
        """How much of the frame being received is in (0 when none is begun)."""
        return self._reader.buffered_bytes

    @property
    def receiving_frame(self) -> bool:
        """Whether part of a frame is in and the rest is not (ask after :meth:`next_event`
        returned :data:`NEED_DATA`)."""
        return self._reader.buffered_bytes > 0

    def request_room(self) -> int:
        """How many more requests this end may send before a response comes (client side)."""
        return self._in_flight_max - len(self._in_flight)

    def next_request_id(self) -> int:
        """A request id not in flight (client side), counting up and wrapping past 2**32 - 1."""
        if len(self._in_flight) >= _REQUEST_ID_MAX:  # pragma: no cover - bounded far below
            raise LocalProtocolError("every request id is in flight")
        rid = self._next_id
        while rid in self._in_flight:
            rid = rid % _REQUEST_ID_MAX + 1
        self._next_id = rid % _REQUEST_ID_MAX + 1
        return rid

    # receiving -------------------------------------------------------------------------

    def receive_data(self, data: Buffer) -> None:
        """Bytes read from the transport; ``b""`` means the peer closed (EOF)."""
        state = self._state
        if state is _S_CLOSED or state is _S_ERROR:
            return  # nobody will read them; the transport is being closed
        if self._reader.eof and data:
            raise LocalProtocolError("data received after EOF")
        if data:
            self.unframed += data  # FrameReader.feed's work, one call fewer
        else:
            self.ended = True
            self._reader.feed(data)

    def next_event(self) -> Event | NeedData:
        """The next event, or :data:`NEED_DATA` if no whole frame is buffered.

        Raises :class:`RemoteProtocolError` (and only that) when the peer broke the
        protocol; the connection is then in state ERROR and must be closed.
        """
        state = self._state
        if state is _S_ERROR:
            raise RemoteProtocolError(f"the connection already failed: {self._error}")
        if state is _S_CLOSED:
            return ConnectionClosed()
        try:
            frame = self._reader.next_frame()
            if frame is None:
                if not self._reader.eof:
                    return NEED_DATA
                self._state = self._receive_transition(_K_CLOSE, None)
                return ConnectionClosed()
            return self._receive_frame(frame)
        except RemoteProtocolError as e:
            self._error = e
            self._state = State.ERROR
            raise

    def _receive_transition(self, kind: Kind, frame_type: int | None) -> State:
        """The state after receiving ``kind`` (a frame of ``frame_type``, or None: EOF)."""
        new = self._receive_next.get((self._state, kind))
        if new is None:
            what = "end of stream" if frame_type is None else FrameType(frame_type).name + " frame"
            hint = ""
            if self._state is State.AWAIT_HANDSHAKE and self.role is SERVER:
                hint = ": the first frame of a connection is a HANDSHAKE"
            elif self._state is State.AWAIT_ACCEPT and self.role is SERVER:
                hint = ": the client must wait for HANDSHAKE_ACCEPTED before sending requests"
            raise RemoteProtocolError(
                f"unexpected {what} received by the {self.role.name.lower()} in state {self._state.name}{hint}"
            )
        return new

    def _check_header(self, h: FrameHeader) -> None:
        """Refuse a frame from its header alone, before its body is buffered."""
        _, _, ftype, _, api_key, rid, _ = h
        kind = _KIND_OF_FRAME[ftype] or (_K_FATAL if rid == 0 else _K_ERROR)
        if (self._state, kind) not in self._receive_next:
            self._receive_transition(kind, ftype)  # raises: not expected in this state
        if kind is _K_PUSH:
            api = self._apis.get(api_key)
            if api is None or api.push is None:
                raise RemoteProtocolError(f"api key {api_key} has no PUSH frames in protocol version {self.version}")
            return
        if kind is not _K_REQUEST and kind is not _K_RESPONSE and kind is not _K_ERROR:
            return
        api = self._apis.get(api_key)
        if api is None:
            raise RemoteProtocolError(
                f"unknown api key {api_key} (frame type {FrameType(ftype).name}, protocol version {self.version})"
            )
        if kind is _K_REQUEST:
            if rid in self._in_flight:
                raise RemoteProtocolError(f"request id {rid} is already in flight")
            if len(self._in_flight) >= self._in_flight_max:
                raise RemoteProtocolError(
                    f"more than {self._in_flight_max} requests in flight (setting "
                    f"requests_in_flight_max, announced in the handshake)"
                )
        else:
            sent = self._in_flight.get(rid)
            if sent is None:
                raise RemoteProtocolError(f"a response to request id {rid}, which is not in flight")
            if sent != api_key:
                raise RemoteProtocolError(
                    f"the response to request {rid} has api key {api_key}; the request had {int(sent)} ({sent.name})"
                )

    def _receive_frame(self, frame: Frame) -> Event:
        """The event of a frame whose header passed :meth:`_check_header`."""
        h, head, data = frame
        ftype, rid = h[2], h[5]
        kind = _KIND_OF_FRAME[ftype] or (_K_FATAL if rid == 0 else _K_ERROR)
        new_state = self._receive_next.get((self._state, kind)) or self._receive_transition(kind, ftype)
        event: Event
        try:
            # requests and responses first: nearly every frame is one
            if kind is _K_REQUEST:
                api = self._apis[h[4]]
                event = Request(rid, api.request.decode(head, data))
                self._in_flight[rid] = api.key
            elif kind is _K_RESPONSE:
                event = Response(rid, self._apis[h[4]].response.decode(head, data))
                del self._in_flight[rid]
            else:
                event = self._decode(kind, frame)
                if kind is _K_ERROR:
                    del self._in_flight[rid]
        except _DECODE_ERRORS as e:
            raise RemoteProtocolError(
                f"malformed body (frame type {FrameType(ftype).name}, api key {h.api_key}, request id {rid}): {e}"
            ) from e
        self._state = new_state
        return event

    def _decode(self, kind: Kind, frame: Frame) -> Event:
        """The event of a frame other than a request or a response."""
        h = frame.header
        if kind is _K_PUSH:
            push = self._apis[h.api_key].push
            assert push is not None  # _check_header refused a push frame of an api without pushes
            return Push(push.decode(frame.head, frame.data))
        if kind is _K_ERROR or kind is _K_FATAL:
            b = decode_body(ErrorBody, frame.head, frame.data)
            return ErrorResponse(h.request_id, b.code, b.retriable, b.message)
        if kind is _K_HANDSHAKE:
            b = decode_body(HandshakeBody, frame.head, frame.data)
            if b.magic != PROTOCOL_MAGIC:
                raise RemoteProtocolError(f"not a Headwater client: handshake magic {b.magic!r}")
            if b.version_min > b.version_max:
                raise RemoteProtocolError(f"empty version range {b.version_min} to {b.version_max}")
            _check_peer_limit("frame_bytes_max", b.frame_bytes_max, FRAME_BYTES_MIN)
            self._offered = (b.version_min, b.version_max)
            self.peer_name = b.client_name
            self.peer_frame_bytes_max = b.frame_bytes_max
            return Handshake(b.client_name, b.version_min, b.version_max, b.frame_bytes_max)
        assert kind is _K_ACCEPT, kind
        b = decode_body(HandshakeAcceptedBody, frame.head, frame.data)
        lo, hi = self._offered
        if not max(lo, VERSION_MIN) <= b.version <= min(hi, VERSION_MAX):
            raise RemoteProtocolError(
                f"the server chose protocol version {b.version}, outside the {lo} to {hi} offered"
            )
        _check_peer_limit("frame_bytes_max", b.frame_bytes_max, FRAME_BYTES_MIN)
        _check_peer_limit("requests_in_flight_max", b.requests_in_flight_max, 1)
        self._agree_version(b.version)
        self.peer_name = b.server_name
        self.peer_frame_bytes_max = b.frame_bytes_max
        self._in_flight_max = min(self._own_in_flight_max, b.requests_in_flight_max)
        return HandshakeAccepted(b.version, b.server_name, b.frame_bytes_max, b.requests_in_flight_max)

    def _agree_version(self, version: int) -> None:
        self.version = version
        self._apis = _apis_of_version(version)

    # sending ---------------------------------------------------------------------------

    def send(self, event: Event) -> bytes:
        """The bytes of ``event`` to write to the transport (b"" for ConnectionClosed:
        close the transport)."""
        return b"".join(self.send_chunks(event))

    def send_chunks(self, event: Event) -> list[Buffer]:
        """Like :meth:`send`, as a list of buffers to write in order (``writelines``):
        record batches are not copied into one frame."""
        kind = _KIND_OF_EVENT.get(type(event))
        if kind is None:
            if not isinstance(event, ErrorResponse):
                raise LocalProtocolError(f"not a protocol event: {event!r}")
            kind = _K_FATAL if event.request_id == 0 else _K_ERROR
        new_state = self._send_next.get((self._state, kind))
        if new_state is None:
            raise LocalProtocolError(
                f"the {self.role.name.lower()} cannot send {type(event).__name__} in state {self._state.name}"
            )
        if kind is _K_CLOSE:
            self._state = new_state
            return []
        ftype, api, rid, body = self._outgoing(kind, event)
        try:
            head, data = encode_body(body, check=self._check_bodies)
            chunks, size = encode_frame_sized(ftype, api, rid, head, data)
        except (msgspec.MsgspecError, ValueError, TypeError, OverflowError) as e:
            raise LocalProtocolError(f"cannot encode {type(event).__name__}: {e}") from e
        if size > self.peer_frame_bytes_max:
            raise MessageTooLargeError(
                f"a {type(event).__name__} frame of {size} bytes exceeds the peer's limit of "
                f"{self.peer_frame_bytes_max} bytes (its frame_bytes_max)"
            )
        self._commit_send(kind, event, new_state)
        return chunks

    def send_response(self, request_id: int, body: ResponseBody) -> list[Buffer]:
        """``send_chunks(Response(request_id, body))``, in 2 Python calls instead of 6 when a
        server answers with a body without batch data (a produce's answer, a ping's). The
        same checks hold: any case this does not cover, or would refuse, goes the long way."""
        new_state = self._send_next.get((self._state, _K_RESPONSE))
        if (
            new_state is None
            or self._check_bodies
            or type(body) not in PLAIN_RESPONSE_TYPES
            or self._in_flight.get(request_id) is not body.api
        ):
            return self.send_chunks(Response(request_id, body))
        try:
            chunks, size = encode_plain_frame(_RESPONSE_T, body.api, request_id, encode_plain_head(body))
        except (msgspec.MsgspecError, ValueError, TypeError, OverflowError):
            return self.send_chunks(Response(request_id, body))  # raises the error that says why
        if size > self.peer_frame_bytes_max:
            return self.send_chunks(Response(request_id, body))
        del self._in_flight[request_id]
        self._state = new_state
        return chunks

    def send_request(self, request_id: int, body: RequestBody) -> list[Buffer]:
        """``send_chunks(Request(request_id, body))`` in 3 Python calls instead of 6 (a
        client's one-message produce). The same checks hold, the body's own schema check
        included; any case this does not cover, or would refuse, goes the long way."""
        new_state = self._send_next.get((self._state, _K_REQUEST))
        codec = REQUEST_CODECS.get(type(body))
        if (
            new_state is None
            or codec is None
            or body.api not in self._apis
            or type(request_id) is not int
            or not 0 < request_id <= _REQUEST_ID_MAX
            or request_id in self._in_flight
            or len(self._in_flight) >= self._in_flight_max
        ):
            return self.send_chunks(Request(request_id, body))
        try:
            head_value, data = codec.split(body) if codec.data else (body, [])
            head = encode_plain_head(head_value)
            if self._check_bodies:
                codec.decoder.decode(head)  # what we send must be what the peer can decode
            chunks, size = encode_frame_sized(_REQUEST_T, body.api, request_id, head, data)
        except (msgspec.MsgspecError, ValueError, TypeError, OverflowError):
            return self.send_chunks(Request(request_id, body))  # raises the error that says why
        if size > self.peer_frame_bytes_max:
            return self.send_chunks(Request(request_id, body))
        self._in_flight[request_id] = body.api
        self._state = new_state
        return chunks

    def _outgoing(self, kind: Kind, event: Any) -> tuple[int, int, int, msgspec.Struct]:
        """Check an event against the connection; its frame type, api key, request id, body."""
        if kind is _K_REQUEST:
            rid = event.request_id
            body = event.body
            if not isinstance(body, RequestBody):
                raise LocalProtocolError(f"a request body is a RequestBody, got {type(body).__name__}")
            api = body.api
            assert self.version is not None
            if api not in self._apis:
                raise LocalProtocolError(f"{api.name} is not in protocol version {self.version}")
            if isinstance(rid, bool) or not isinstance(rid, int) or not 0 < rid <= _REQUEST_ID_MAX:
                raise LocalProtocolError(f"a request id is from 1 to 2**32 - 1, got {rid!r}")
            if rid in self._in_flight:
                raise LocalProtocolError(f"request id {rid} is already in flight")
            if len(self._in_flight) >= self._in_flight_max:
                raise LocalProtocolError(
                    f"{len(self._in_flight)} requests are in flight, the most this connection "
                    f"allows (requests_in_flight_max); wait for a response first"
                )
            return _REQUEST_T, api, rid, body
        if kind is _K_RESPONSE or kind is _K_ERROR:
            rid = event.request_id
            answered = self._in_flight.get(rid)
            if answered is None:
                raise LocalProtocolError(f"no request with id {rid!r} is waiting for an answer")
            api = answered
            if kind is _K_ERROR:
                return _ERROR_T, api, rid, _error_body(event)
            body = event.body
            if not isinstance(body, ResponseBody) or body.api is not api:
                raise LocalProtocolError(
                    f"request {rid} was {api.name}; it cannot be answered with {type(body).__name__}"
                )
            return _RESPONSE_T, api, rid, body
        if kind is _K_PUSH:
            pushed = event.body
            assert self.version is not None
            if not isinstance(pushed, PushBody):
                raise LocalProtocolError(f"a push body is a PushBody of version {self.version}, got {pushed!r}")
            entry = self._apis.get(pushed.api)
            if entry is None or entry.push is None or entry.push.type is not type(pushed):
                raise LocalProtocolError(f"a push body is a PushBody of version {self.version}, got {pushed!r}")
            return _PUSH_T, pushed.api, 0, pushed
        if kind is _K_FATAL:
            return _ERROR_T, 0, 0, _error_body(event)
        if kind is _K_HANDSHAKE:
            _check_own("frame_bytes_max", event.frame_bytes_max, self.frame_bytes_max)
            if not (
                isinstance(event.version_min, int)
                and isinstance(event.version_max, int)
                and 0 < event.version_min <= event.version_max < 2**32
            ):
                raise LocalProtocolError(f"invalid version range {event.version_min!r} to {event.version_max!r}")
            body = HandshakeBody(
                PROTOCOL_MAGIC, event.version_min, event.version_max, event.client_name, self.frame_bytes_max
            )
            return _HANDSHAKE_T, 0, 0, body
        assert kind is _K_ACCEPT, kind
        _check_own("frame_bytes_max", event.frame_bytes_max, self.frame_bytes_max)
        _check_own("requests_in_flight_max", event.requests_in_flight_max, self._own_in_flight_max)
        lo, hi = self._offered
        if not (isinstance(event.version, int) and max(lo, VERSION_MIN) <= event.version <= min(hi, VERSION_MAX)):
            raise LocalProtocolError(f"version {event.version!r} is not one both sides speak; use choose_version()")
        body = HandshakeAcceptedBody(event.version, event.server_name, self.frame_bytes_max, self._own_in_flight_max)
        return _ACCEPTED_T, 0, 0, body

    def _commit_send(self, kind: Kind, event: Any, new_state: State) -> None:
        if kind is _K_REQUEST:
            self._in_flight[event.request_id] = event.body.api
        elif kind is _K_RESPONSE or kind is _K_ERROR:
            del self._in_flight[event.request_id]
        elif kind is _K_HANDSHAKE:
            self._offered = (event.version_min, event.version_max)
        elif kind is _K_ACCEPT:
            self._agree_version(event.version)
        self._state = new_state

    def __repr__(self) -> str:
        return (
            f"<Connection {self.role.name} {self._state.name} version={self.version} in_flight={len(self._in_flight)}>"
        )


def _error_body(event: ErrorResponse) -> ErrorBody:
    message = event.message
    if isinstance(message, str) and len(message) > ERROR_MESSAGE_CHARS_MAX:
        message = message[: ERROR_MESSAGE_CHARS_MAX - 1] + "…"
    return ErrorBody(event.code, event.retriable, message)


def _check_own(name: str, given: int | None, own: int) -> None:
    if given is not None and given != own:
        raise LocalProtocolError(f"{name}={given} differs from this connection's setting {own}; leave it None")


def _check_peer_limit(name: str, value: int, lo: int) -> None:
    if value < lo:
        raise RemoteProtocolError(f"the peer announced {name}={value}; the least allowed is {lo}")
