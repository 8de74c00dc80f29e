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
limit) and changes nothing. When a connection ends (``ConnectionClosed``, an
``ErrorResponse`` with request id 0, or ``RemoteProtocolError``), the requests still in
:attr:`Connection.in_flight` will never be answered: fail them. Thread-safety: none; one
connection belongs to one task.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import msgspec

from headwater.errors import InvalidArgumentError, MessageTooLargeError
from headwater.protocol._state import Direction, Kind, Role, State, transition
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
    encode_frame,
)
from headwater.protocol.messages import (
    PROTOCOL_MAGIC,
    VERSION_MAX,
    VERSION_MIN,
    ApiKey,
    ErrorBody,
    HandshakeAcceptedBody,
    HandshakeBody,
    PushBody,
    RequestBody,
    ResponseBody,
    decode_body,
    encode_body,
    push_spec_for,
    spec_for,
)

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

_KIND_OF_FRAME = {
    FrameType.HANDSHAKE: Kind.HANDSHAKE,
    FrameType.HANDSHAKE_ACCEPTED: Kind.ACCEPT,
    FrameType.REQUEST: Kind.REQUEST,
    FrameType.RESPONSE: Kind.RESPONSE,
    FrameType.PUSH: Kind.PUSH,
}
_KIND_OF_EVENT = {
    Handshake: Kind.HANDSHAKE,
    HandshakeAccepted: Kind.ACCEPT,
    Request: Kind.REQUEST,
    Response: Kind.RESPONSE,
    Push: Kind.PUSH,
    ConnectionClosed: Kind.CLOSE,
}
# msgspec raises DecodeError/ValidationError (ValueErrors); the rest guard odd corners
_DECODE_ERRORS = (msgspec.MsgspecError, ValueError, TypeError, OverflowError, UnicodeError)


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
        self.frame_bytes_max = frame_bytes_max
        self._own_in_flight_max = requests_in_flight_max
        self._in_flight_max = requests_in_flight_max
        self._state = State.AWAIT_HANDSHAKE
        self._reader = FrameReader(frame_bytes_max, self._check_header)
        self._in_flight: dict[int, ApiKey] = {}
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
        if self._state in (State.CLOSED, State.ERROR):
            return  # nobody will read them; the transport is being closed
        if self._reader.eof and data:
            raise LocalProtocolError("data received after EOF")
        self._reader.feed(data)

    def next_event(self) -> Event | NeedData:
        """The next event, or :data:`NEED_DATA` if no whole frame is buffered.

        Raises :class:`RemoteProtocolError` (and only that) when the peer broke the
        protocol; the connection is then in state ERROR and must be closed.
        """
        if self._state is State.ERROR:
            raise RemoteProtocolError(f"the connection already failed: {self._error}")
        if self._state is State.CLOSED:
            return ConnectionClosed()
        try:
            frame = self._reader.next_frame()
            if frame is None:
                if not self._reader.eof:
                    return NEED_DATA
                self._state = self._receive_transition(Kind.CLOSE, "end of stream")
                return ConnectionClosed()
            return self._receive_frame(frame)
        except RemoteProtocolError as e:
            self._error = e
            self._state = State.ERROR
            raise

    def _kind_of_frame(self, h: FrameHeader) -> Kind:
        if h.frame_type == FrameType.ERROR:
            return Kind.FATAL if h.request_id == 0 else Kind.ERROR
        return _KIND_OF_FRAME[FrameType(h.frame_type)]

    def _receive_transition(self, kind: Kind, what: str) -> State:
        new = transition(self.role, self._state, Direction.RECEIVE, kind)
        if new is None:
            hint = ""
            if self._state is State.AWAIT_HANDSHAKE and self.role is SERVER:
                hint = ": the first frame of a connection is a HANDSHAKE"
            elif self._state is State.AWAIT_ACCEPT and self.role is SERVER:
                hint = ": the client must wait for HANDSHAKE_ACCEPTED before sending requests"
            raise RemoteProtocolError(
                f"unexpected {what} received by the {self.role.name.lower()} in state "
                f"{self._state.name}{hint}"
            )
        return new

    def _check_header(self, h: FrameHeader) -> None:
        """Refuse a frame from its header alone, before its body is buffered."""
        kind = self._kind_of_frame(h)
        self._receive_transition(kind, FrameType(h.frame_type).name + " frame")
        if kind is Kind.PUSH:
            assert self.version is not None  # READY implies a handshake
            if push_spec_for(h.api_key, self.version) is None:
                raise RemoteProtocolError(
                    f"api key {h.api_key} has no PUSH frames in protocol version {self.version}"
                )
            return
        if kind not in (Kind.REQUEST, Kind.RESPONSE, Kind.ERROR):
            return
        assert self.version is not None  # READY implies a handshake
        if spec_for(h.api_key, self.version) is None:
            raise RemoteProtocolError(
                f"unknown api key {h.api_key} (frame type {FrameType(h.frame_type).name}, "
                f"protocol version {self.version})"
            )
        rid = h.request_id
        if kind is Kind.REQUEST:
            if rid in self._in_flight:
                raise RemoteProtocolError(f"request id {rid} is already in flight")
            if len(self._in_flight) >= self._in_flight_max:
                raise RemoteProtocolError(
                    f"more than {self._in_flight_max} requests in flight (setting "
                    f"requests_in_flight_max, announced in the handshake)"
                )
        else:
            api = self._in_flight.get(rid)
            if api is None:
                raise RemoteProtocolError(f"a response to request id {rid}, which is not in flight")
            if api != h.api_key:
                raise RemoteProtocolError(
                    f"the response to request {rid} has api key {h.api_key}; the request had "
                    f"{int(api)} ({api.name})"
                )

    def _receive_frame(self, frame: Frame) -> Event:
        h = frame.header
        kind = self._kind_of_frame(h)
        new_state = self._receive_transition(kind, FrameType(h.frame_type).name + " frame")
        try:
            event = self._decode(kind, frame)
        except _DECODE_ERRORS as e:
            raise RemoteProtocolError(
                f"malformed body (frame type {FrameType(h.frame_type).name}, api key "
                f"{h.api_key}, request id {h.request_id}): {e}"
            ) from e
        if kind is Kind.REQUEST:
            self._in_flight[h.request_id] = ApiKey(h.api_key)
        elif kind in (Kind.RESPONSE, Kind.ERROR):
            del self._in_flight[h.request_id]
        self._state = new_state
        return event

    def _decode(self, kind: Kind, frame: Frame) -> Event:
        h = frame.header
        if kind is Kind.HANDSHAKE:
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
        if kind is Kind.ACCEPT:
            b = decode_body(HandshakeAcceptedBody, frame.head, frame.data)
            lo, hi = self._offered
            if not max(lo, VERSION_MIN) <= b.version <= min(hi, VERSION_MAX):
                raise RemoteProtocolError(
                    f"the server chose protocol version {b.version}, outside the {lo} to {hi} offered"
                )
            _check_peer_limit("frame_bytes_max", b.frame_bytes_max, FRAME_BYTES_MIN)
            _check_peer_limit("requests_in_flight_max", b.requests_in_flight_max, 1)
            self.version = b.version
            self.peer_name = b.server_name
            self.peer_frame_bytes_max = b.frame_bytes_max
            self._in_flight_max = min(self._own_in_flight_max, b.requests_in_flight_max)
            return HandshakeAccepted(b.version, b.server_name, b.frame_bytes_max, b.requests_in_flight_max)
        if kind in (Kind.ERROR, Kind.FATAL):
            b = decode_body(ErrorBody, frame.head, frame.data)
            return ErrorResponse(h.request_id, b.code, b.retriable, b.message)
        assert self.version is not None
        if kind is Kind.PUSH:
            push_type = push_spec_for(h.api_key, self.version)
            assert push_type is not None  # checked with the header
            return Push(decode_body(push_type, frame.head, frame.data))
        spec = spec_for(h.api_key, self.version)
        assert spec is not None  # checked with the header
        if kind is Kind.REQUEST:
            return Request(h.request_id, decode_body(spec.request, frame.head, frame.data))
        return Response(h.request_id, decode_body(spec.response, frame.head, frame.data))

    # sending ---------------------------------------------------------------------------

    def send(self, event: Event) -> bytes:
        """The bytes of ``event`` to write to the transport (b"" for ConnectionClosed:
        close the transport)."""
        return b"".join(self.send_chunks(event))

    def send_chunks(self, event: Event) -> list[Buffer]:
        """Like :meth:`send`, as a list of buffers to write in order (``writelines``):
        record batches are not copied into one frame."""
        kind = _KIND_OF_EVENT.get(type(event))
        if isinstance(event, ErrorResponse):
            kind = Kind.FATAL if event.request_id == 0 else Kind.ERROR
        if kind is None:
            raise LocalProtocolError(f"not a protocol event: {event!r}")
        new_state = transition(self.role, self._state, Direction.SEND, kind)
        if new_state is None:
            raise LocalProtocolError(
                f"the {self.role.name.lower()} cannot send {type(event).__name__} in state "
                f"{self._state.name}"
            )
        if kind is Kind.CLOSE:
            self._state = new_state
            return []
        ftype, api, rid, body = self._outgoing(kind, event)
        try:
            head, data = encode_body(body)
            chunks = encode_frame(ftype, api, rid, head, data)
        except (msgspec.MsgspecError, ValueError, TypeError, OverflowError) as e:
            raise LocalProtocolError(f"cannot encode {type(event).__name__}: {e}") from e
        size = sum(memoryview(c).nbytes for c in chunks)
        if size > self.peer_frame_bytes_max:
            raise MessageTooLargeError(
                f"a {type(event).__name__} frame of {size} bytes exceeds the peer's limit of "
                f"{self.peer_frame_bytes_max} bytes (its frame_bytes_max)"
            )
        self._commit_send(kind, event, new_state)
        return chunks

    def _outgoing(self, kind: Kind, event: Any) -> tuple[FrameType, int, int, msgspec.Struct]:
        """Check an event against the connection; its frame type, api key, request id, body."""
        if kind is Kind.HANDSHAKE:
            _check_own("frame_bytes_max", event.frame_bytes_max, self.frame_bytes_max)
            if not (isinstance(event.version_min, int) and isinstance(event.version_max, int)
                    and 0 < event.version_min <= event.version_max < 2**32):
                raise LocalProtocolError(
                    f"invalid version range {event.version_min!r} to {event.version_max!r}"
                )
            body = HandshakeBody(PROTOCOL_MAGIC, event.version_min, event.version_max,
                                 event.client_name, self.frame_bytes_max)
            return FrameType.HANDSHAKE, 0, 0, body
        if kind is Kind.ACCEPT:
            _check_own("frame_bytes_max", event.frame_bytes_max, self.frame_bytes_max)
            _check_own("requests_in_flight_max", event.requests_in_flight_max, self._own_in_flight_max)
            lo, hi = self._offered
            if not (isinstance(event.version, int)
                    and max(lo, VERSION_MIN) <= event.version <= min(hi, VERSION_MAX)):
                raise LocalProtocolError(
                    f"version {event.version!r} is not one both sides speak; use choose_version()"
                )
            body = HandshakeAcceptedBody(event.version, event.server_name, self.frame_bytes_max,
                                         self._own_in_flight_max)
            return FrameType.HANDSHAKE_ACCEPTED, 0, 0, body
        if kind is Kind.FATAL:
            return FrameType.ERROR, 0, 0, _error_body(event)
        if kind is Kind.PUSH:
            body = event.body
            assert self.version is not None
            if not isinstance(body, PushBody) or push_spec_for(body.api, self.version) is not type(body):
                raise LocalProtocolError(f"a push body is a PushBody of version {self.version}, got {body!r}")
            return FrameType.PUSH, int(body.api), 0, body
        rid = event.request_id
        if kind is Kind.REQUEST:
            if not isinstance(event.body, RequestBody):
                raise LocalProtocolError(f"a request body is a RequestBody, got {type(event.body).__name__}")
            assert self.version is not None
            if spec_for(event.api, self.version) is None:
                raise LocalProtocolError(f"{event.api.name} is not in protocol version {self.version}")
            if isinstance(rid, bool) or not isinstance(rid, int) or not 0 < rid <= _REQUEST_ID_MAX:
                raise LocalProtocolError(f"a request id is from 1 to 2**32 - 1, got {rid!r}")
            if rid in self._in_flight:
                raise LocalProtocolError(f"request id {rid} is already in flight")
            if len(self._in_flight) >= self._in_flight_max:
                raise LocalProtocolError(
                    f"{len(self._in_flight)} requests are in flight, the most this connection "
                    f"allows (requests_in_flight_max); wait for a response first"
                )
            return FrameType.REQUEST, int(event.api), rid, event.body
        api = self._in_flight.get(rid)
        if api is None:
            raise LocalProtocolError(f"no request with id {rid!r} is waiting for an answer")
        if kind is Kind.ERROR:
            return FrameType.ERROR, int(api), rid, _error_body(event)
        if not isinstance(event.body, ResponseBody) or event.api is not api:
            raise LocalProtocolError(
                f"request {rid} was {api.name}; it cannot be answered with "
                f"{type(event.body).__name__}"
            )
        return FrameType.RESPONSE, int(api), rid, event.body

    def _commit_send(self, kind: Kind, event: Any, new_state: State) -> None:
        if kind is Kind.HANDSHAKE:
            self._offered = (event.version_min, event.version_max)
        elif kind is Kind.ACCEPT:
            self.version = event.version
        elif kind is Kind.REQUEST:
            self._in_flight[event.request_id] = event.api
        elif kind in (Kind.RESPONSE, Kind.ERROR):
            del self._in_flight[event.request_id]
        self._state = new_state

    def __repr__(self) -> str:
        return (
            f"<Connection {self.role.name} {self._state.name} version={self.version} "
            f"in_flight={len(self._in_flight)}>"
        )


def _error_body(event: ErrorResponse) -> ErrorBody:
    message = event.message
    if isinstance(message, str) and len(message) > ERROR_MESSAGE_CHARS_MAX:
        message = message[: ERROR_MESSAGE_CHARS_MAX - 1] + "…"
    return ErrorBody(event.code, event.retriable, message)


def _check_own(name: str, given: int | None, own: int) -> None:
    if given is not None and given != own:
        raise LocalProtocolError(
            f"{name}={given} differs from this connection's setting {own}; leave it None"
        )


def _check_peer_limit(name: str, value: int, lo: int) -> None:
    if value < lo:
        raise RemoteProtocolError(f"the peer announced {name}={value}; the least allowed is {lo}")
