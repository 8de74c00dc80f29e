"""Errors of the wire protocol, a branch of the tree in :mod:`headwater.errors`::

    HeadwaterError
    └── ProtocolError                    50  no    the conversation broke the protocol's rules
        ├── LocalProtocolError           51  no    this side tried something the protocol forbids
        ├── RemoteProtocolError          52  no    the peer sent bytes that break the protocol
        │   └── FrameTooLargeError       53  no    a frame header announced more than the limit
        └── UnsupportedVersionError      54  no    no protocol version both sides speak

As in h11, "we used it wrong" (:class:`LocalProtocolError`, raised by ``Connection.send``;
nothing was sent and the connection is unchanged) is kept apart from "the peer sent garbage"
(:class:`RemoteProtocolError`, raised by ``Connection.next_event``; the connection is in
state ``ERROR`` and must be closed). A code names the failure as seen by the side that
detected it: a server that closes a connection because the client sent garbage reports
code 52 in its last error frame.

:func:`headwater.errors.error_for_code` finds these classes too (it rescans the tree when
a code is missing), but only once this module has been imported; :func:`error_for_code`
here is the same lookup with that import guaranteed.
"""

from __future__ import annotations

from headwater.errors import HeadwaterError
from headwater.errors import error_for_code as _base_error_for_code

__all__ = [
    "ProtocolError",
    "LocalProtocolError",
    "RemoteProtocolError",
    "FrameTooLargeError",
    "UnsupportedVersionError",
    "error_for_code",
]


class ProtocolError(HeadwaterError):
    """The conversation broke the rules of the wire protocol."""

    code = 50


class LocalProtocolError(ProtocolError):
    """This side asked for something the protocol forbids (a bug in the caller).

    Raised by ``Connection.send`` before anything is encoded: nothing was sent and the
    connection is unchanged.
    """

    code = 51


class RemoteProtocolError(ProtocolError):
    """The peer sent bytes that break the protocol; the connection cannot be trusted any more.

    Raised by ``Connection.next_event``; the connection is then in state ``ERROR``.
    """

    code = 52


class FrameTooLargeError(RemoteProtocolError):
    """A frame header announced more bytes than ``frame_bytes_max`` allows."""

    code = 53


class UnsupportedVersionError(ProtocolError):
    """The client and the server have no protocol version in common."""

    code = 54


_BY_CODE: dict[int, type[HeadwaterError]] = {
    cls.code: cls
    for cls in (
        ProtocolError,
        LocalProtocolError,
        RemoteProtocolError,
        FrameTooLargeError,
        UnsupportedVersionError,
    )
}


def error_for_code(code: int) -> type[HeadwaterError]:
    """The error class for a numeric code, protocol codes included.

    >>> error_for_code(7).__name__, error_for_code(54).__name__, error_for_code(999).__name__
    ('QueueNotFoundError', 'UnsupportedVersionError', 'HeadwaterError')
    """
    found = _BY_CODE.get(code)
    return found if found is not None else _base_error_for_code(code)
