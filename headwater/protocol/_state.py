"""The connection's states and every legal transition, in one table.

A connection is in one of five states. Each frame sent or received is classified into a
:class:`Kind`; ``TRANSITIONS[role, state, direction, kind]`` is the state after it, and a
missing entry means the protocol forbids that frame now (a :class:`LocalProtocolError` when
sending, a :class:`RemoteProtocolError` when receiving). ``ERROR`` is entered only on
receiving garbage, outside this table, and never left: the stream cannot be trusted any
more. A refused ``send`` leaves the state as it was (nothing went out).

::

    AWAIT_HANDSHAKE --Handshake--> AWAIT_ACCEPT --HandshakeAccepted--> READY
          |                              |                              |  requests,
          +--------- fatal error or EOF -+------------------------------+  responses
                                         v                                 and errors
                                       CLOSED                              stay READY

In READY the server may also send PUSH frames (deliveries of a push subscription the client
opened); the client receives them, never sends them.
"""

from __future__ import annotations

from enum import Enum

__all__ = ["Role", "State", "Kind", "Direction", "TRANSITIONS", "table_for"]


class _IdentityHashEnum(Enum):
    """An Enum hashed by identity: Enum's own ``__hash__`` is Python code (it hashes the
    member's name), and these members key the transition table, looked up for every frame.
    Members are singletons compared by identity, so identity hashing keeps dicts correct."""

    __hash__ = object.__hash__


class Role(_IdentityHashEnum):
    CLIENT = "CLIENT"
    SERVER = "SERVER"


class State(_IdentityHashEnum):
    AWAIT_HANDSHAKE = "AWAIT_HANDSHAKE"  # client: must send the handshake; server: waits for it
    AWAIT_ACCEPT = "AWAIT_ACCEPT"  # the handshake crossed; the server owes its answer
    READY = "READY"  # requests and responses flow, many in flight
    CLOSED = "CLOSED"  # ended cleanly: EOF, a connection-level error frame, or closed here
    ERROR = "ERROR"  # the peer broke the protocol; close the transport


class Kind(_IdentityHashEnum):
    """What a frame or event is, as far as the state machine cares."""

    HANDSHAKE = "HANDSHAKE"
    ACCEPT = "ACCEPT"
    REQUEST = "REQUEST"
    RESPONSE = "RESPONSE"
    ERROR = "ERROR"  # an error response to one request (request id != 0)
    FATAL = "FATAL"  # a connection-level error (request id 0); its sender closes
    PUSH = "PUSH"  # a server-pushed delivery (request id 0), on a stream the client opened
    CLOSE = "CLOSE"  # end of stream: EOF received, or ConnectionClosed sent


class Direction(_IdentityHashEnum):
    SEND = "SEND"
    RECEIVE = "RECEIVE"


C, S = Role.CLIENT, Role.SERVER
SEND, RECV = Direction.SEND, Direction.RECEIVE
AWAIT_HANDSHAKE, AWAIT_ACCEPT, READY, CLOSED, ERROR = (
    State.AWAIT_HANDSHAKE,
    State.AWAIT_ACCEPT,
    State.READY,
    State.CLOSED,
    State.ERROR,
)

TRANSITIONS: dict[tuple[Role, State, Direction, Kind], State] = {
    # client: handshake first, then wait for the answer before any request
    (C, AWAIT_HANDSHAKE, SEND, Kind.HANDSHAKE): AWAIT_ACCEPT,
    (C, AWAIT_HANDSHAKE, RECV, Kind.FATAL): CLOSED,  # refused at once (e.g. overloaded)
    (C, AWAIT_ACCEPT, RECV, Kind.ACCEPT): READY,
    (C, AWAIT_ACCEPT, RECV, Kind.FATAL): CLOSED,  # e.g. unsupported version
    (C, READY, SEND, Kind.REQUEST): READY,
    (C, READY, RECV, Kind.RESPONSE): READY,
    (C, READY, RECV, Kind.ERROR): READY,
    (C, READY, RECV, Kind.PUSH): READY,
    (C, READY, SEND, Kind.FATAL): CLOSED,
    (C, READY, RECV, Kind.FATAL): CLOSED,
    # server: the mirror image
    (S, AWAIT_HANDSHAKE, RECV, Kind.HANDSHAKE): AWAIT_ACCEPT,
    (S, AWAIT_HANDSHAKE, SEND, Kind.FATAL): CLOSED,
    (S, AWAIT_ACCEPT, SEND, Kind.ACCEPT): READY,
    (S, AWAIT_ACCEPT, SEND, Kind.FATAL): CLOSED,
    (S, READY, RECV, Kind.REQUEST): READY,
    (S, READY, SEND, Kind.RESPONSE): READY,
    (S, READY, SEND, Kind.ERROR): READY,
    (S, READY, SEND, Kind.PUSH): READY,
    (S, READY, SEND, Kind.FATAL): CLOSED,
    (S, READY, RECV, Kind.FATAL): CLOSED,
}

for _role in Role:
    # after garbage, a last error frame may still explain why before the transport closes
    TRANSITIONS[_role, ERROR, SEND, Kind.FATAL] = ERROR
    TRANSITIONS[_role, ERROR, SEND, Kind.CLOSE] = ERROR
    TRANSITIONS[_role, CLOSED, SEND, Kind.CLOSE] = CLOSED
    for _state in (AWAIT_HANDSHAKE, AWAIT_ACCEPT, READY):
        # either side may end the stream at any time; in-flight requests are then lost
        TRANSITIONS[_role, _state, SEND, Kind.CLOSE] = CLOSED
        TRANSITIONS[_role, _state, RECV, Kind.CLOSE] = CLOSED
del _role, _state


def table_for(role: Role, direction: Direction) -> dict[tuple[State, Kind], State]:
    """The rows of :data:`TRANSITIONS` for one role and direction, keyed by (state, kind):
    what a connection looks up for each frame, without building the four-part key."""
    return {(s, k): new for (r, s, d, k), new in TRANSITIONS.items() if r is role and d is direction}
