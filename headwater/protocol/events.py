"""Events: what ``Connection.next_event`` hands out and ``Connection.send`` takes in.

Each event is one frame (``ConnectionClosed`` is the end of the stream). They are plain
immutable values; the connection fills in what only it knows (limits, version ranges).
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Literal

import msgspec

from headwater.errors import HeadwaterError
from headwater.protocol.errors import error_for_code
from headwater.protocol.messages import (
    VERSION_MAX,
    VERSION_MIN,
    ApiKey,
    PushBody,
    RequestBody,
    ResponseBody,
)

__all__ = [
    "Event",
    "Handshake",
    "HandshakeAccepted",
    "Request",
    "Response",
    "ErrorResponse",
    "ConnectionClosed",
    "Push",
    "NEED_DATA",
    "NeedData",
]


class NeedData(Enum):
    """``next_event`` found no whole frame: feed more bytes with ``receive_data``."""

    NEED_DATA = "NEED_DATA"

    def __repr__(self) -> str:
        return "NEED_DATA"

    __str__ = __repr__


NEED_DATA: Literal[NeedData.NEED_DATA] = NeedData.NEED_DATA


class Handshake(msgspec.Struct, frozen=True):
    """The client's first frame: who it is and which protocol versions it speaks.

    ``frame_bytes_max`` is filled by the connection: when sending, leave it None (the
    connection's own setting goes out); when received, it is the client's limit.
    """

    client_name: str
    version_min: int = VERSION_MIN
    version_max: int = VERSION_MAX
    frame_bytes_max: int | None = None


class HandshakeAccepted(msgspec.Struct, frozen=True):
    """The server's answer: the version chosen and its limits.

    ``frame_bytes_max`` and ``requests_in_flight_max`` are filled by the connection like
    :attr:`Handshake.frame_bytes_max`. Choose ``version`` with
    :func:`~headwater.protocol.connection.choose_version`.
    """

    version: int
    server_name: str
    frame_bytes_max: int | None = None
    requests_in_flight_max: int | None = None


class Request(msgspec.Struct, frozen=True):
    """One operation, client to server. ``request_id`` (1 to 2**32 - 1) is unique among the
    client's requests in flight; ``Connection.next_request_id`` hands out free ones."""

    request_id: int
    body: RequestBody

    @property
    def api(self) -> ApiKey:
        return self.body.api


class Response(msgspec.Struct, frozen=True):
    """The successful answer to the request with the same id."""

    request_id: int
    body: ResponseBody

    @property
    def api(self) -> ApiKey:
        return self.body.api

    def result(self) -> Any:  # the matching BrokerService method's return type
        """What the matching BrokerService method returns (e.g. a QueueInfo)."""
        return self.body.result()


class ErrorResponse(msgspec.Struct, frozen=True):
    """A failed request (``request_id`` != 0), or the end of the whole connection
    (``request_id`` == 0: a refused handshake, a protocol violation); after the latter
    its sender closes the connection."""

    request_id: int
    code: int
    retriable: bool
    message: str

    @classmethod
    def from_exception(cls, request_id: int, exc: HeadwaterError) -> ErrorResponse:
        """The error frame that makes the client raise the same error class."""
        return cls(request_id, int(exc.code), bool(exc.retriable), str(exc) or type(exc).__name__)

    def exception(self) -> HeadwaterError:
        """The exception the embedded broker would have raised, ready to raise.

        An unknown code gives a plain :class:`HeadwaterError` that keeps the code and the
        retriable flag of the frame.
        """
        cls = error_for_code(self.code)
        exc = cls(self.message)
        if exc.code != self.code:
            exc.code = self.code
        if exc.retriable != self.retriable:
            exc.retriable = self.retriable
        return exc


class Push(msgspec.Struct, frozen=True):
    """A delivery the server pushes on a stream the client opened (e.g. SUBSCRIBE); the
    body names the stream. Server to client only, in state READY."""

    body: PushBody

    @property
    def api(self) -> ApiKey:
        return self.body.api


class ConnectionClosed(msgspec.Struct, frozen=True):
    """The stream ended: received as EOF, or sent to close this side (``send`` returns b"")."""


Event = Handshake | HandshakeAccepted | Request | Response | ErrorResponse | Push | ConnectionClosed
