"""The Headwater wire protocol, sans-IO: a frame codec and a connection state machine.

No sockets here: the broker's server and the network client own the transport and drive a
:class:`Connection` (bytes in with ``receive_data``, events out with ``next_event``, events
in with ``send``). The specification, precise enough to write a client in another language,
is ``docs/protocol.md``.
"""

from headwater.protocol._state import Role, State
from headwater.protocol.connection import (
    CLIENT,
    ERROR_MESSAGE_CHARS_MAX,
    REQUESTS_IN_FLIGHT_MAX_DEFAULT,
    SERVER,
    Connection,
    choose_version,
)
from headwater.protocol.errors import (
    FrameTooLargeError,
    LocalProtocolError,
    ProtocolError,
    RemoteProtocolError,
    UnsupportedVersionError,
    error_for_code,
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
from headwater.protocol.frames import FRAME_BYTES_MAX_DEFAULT, FRAME_BYTES_MIN, HEADER_SIZE, FrameType
from headwater.protocol.messages import *  # noqa: F403 - every body type is public API
from headwater.protocol.messages import __all__ as _messages_all

__all__ = [
    "Connection",
    "Role",
    "State",
    "CLIENT",
    "SERVER",
    "choose_version",
    "NEED_DATA",
    "NeedData",
    "Event",
    "Handshake",
    "HandshakeAccepted",
    "Request",
    "Response",
    "ErrorResponse",
    "ConnectionClosed",
    "Push",
    "ProtocolError",
    "LocalProtocolError",
    "RemoteProtocolError",
    "FrameTooLargeError",
    "UnsupportedVersionError",
    "error_for_code",
    "FrameType",
    "HEADER_SIZE",
    "FRAME_BYTES_MAX_DEFAULT",
    "FRAME_BYTES_MIN",
    "REQUESTS_IN_FLIGHT_MAX_DEFAULT",
    "ERROR_MESSAGE_CHARS_MAX",
    *_messages_all,
]
