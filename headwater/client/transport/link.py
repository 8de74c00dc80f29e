"""The parts of :mod:`~headwater.client.transport.async_transport` that every other part uses:
one connection (``_Link``), one request (``_Call``), where an outcome goes (``Sink``) and
how outcomes are handed over outside the lock (``_deliver``), and parsing an address.

Nothing here waits or takes the transport's lock: a ``_Link`` is guarded by the lock of the
transport that owns it."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import socket
from collections import deque
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

from headwater.errors import ClosedError, InvalidArgumentError
from headwater.model.config import DEFAULT_PORT
from headwater.protocol import CLIENT, Connection, ErrorResponse, Response
from headwater.protocol.messages import PushBody, RequestBody, StreamPush, SubscriptionPush

__all__ = ["DEADLINE_SWEEP_S", "WRITE_BUFFER_BYTES_MAX", "Sink", "parse_address", "settle_from"]

log = logging.getLogger("headwater.client")

#: Unsent bytes past which new requests wait in the backlog instead of being written.
WRITE_BUFFER_BYTES_MAX = 256 * 1024
#: While connected, the longest the loop goes without looking for missed deadlines.
DEADLINE_SWEEP_S = 1.0

_INVALID_STATE = (asyncio.InvalidStateError, concurrent.futures.InvalidStateError)


def parse_address(address: str) -> tuple[str, int]:
    """``"host:port"`` (or ``"port"``, on 127.0.0.1; an IPv6 host in brackets) to a
    (host, port) pair, with a clear error.

    >>> parse_address("broker-1:7070"), parse_address("7171"), parse_address("[::1]:7070")
    (('broker-1', 7070), ('127.0.0.1', 7171), ('::1', 7070))
    >>> parse_address("localhost")
    Traceback (most recent call last):
    headwater.errors.InvalidArgumentError: 'localhost' has no port: write 'localhost:7070' (7070 is ...)
    """
    if not isinstance(address, str) or not address:
        raise InvalidArgumentError(f"a server address is 'host:port', got {address!r}")
    host, sep, port = address.rpartition(":")
    if not sep or (address.startswith("[") and address.endswith("]")):
        if not address.strip().isdigit():
            raise InvalidArgumentError(
                f"{address!r} has no port: write '{address}:{DEFAULT_PORT}' ({DEFAULT_PORT} is where "
                f"'headwater serve' listens by default)"
            )
        host, port = "127.0.0.1", address
    if ":" in host and not (host.startswith("[") and host.endswith("]")):
        raise InvalidArgumentError(
            f"{address!r}: an IPv6 address goes in brackets before the port, like '[::1]:{DEFAULT_PORT}'"
        )
    host = host.strip("[]") or "127.0.0.1"
    try:
        p = int(port)
    except ValueError:
        raise InvalidArgumentError(f"{address!r} is not 'host:port': the port must be a number") from None
    if not 0 < p < 65536:
        raise InvalidArgumentError(f"{address!r}: the port must be from 1 to 65535")
    return host, p


class Sink(Protocol):
    """Where a request's outcome goes: a ``concurrent.futures.Future``, or an
    ``asyncio.Future`` of the transport's loop."""

    def done(self) -> bool: ...
    def set_result(self, result: Any) -> None: ...
    def set_exception(self, exception: BaseException) -> None: ...
    def cancelled(self) -> bool: ...
    def exception(self) -> BaseException | None: ...
    def add_done_callback(self, fn: Callable[[Any], object]) -> None: ...


def _settle(sink: Sink, result: Any) -> None:
    try:
        sink.set_result(result)
    except _INVALID_STATE:  # its caller cancelled it
        pass


def _fail(sink: Sink, exc: BaseException) -> None:
    try:
        sink.set_exception(exc)
    except _INVALID_STATE:
        pass


def settle_from(sink: Sink, fut: Any) -> None:
    """Hand the outcome of ``fut``, a done future, to ``sink``, unless ``sink`` is settled
    already (a waiter given up, say); a cancelled ``fut`` is a ClosedError. Meant as its
    done-callback: ``fut.add_done_callback(functools.partial(settle_from, sink))``."""
    if fut.cancelled():
        _fail(sink, ClosedError("the request was cancelled before its answer came: the client is closing"))
    elif (exc := fut.exception()) is not None:
        _fail(sink, exc)
    else:
        _settle(sink, fut.result())


class _Call:
    """One request, from its submission to its answer or its deadline."""

    __slots__ = ("body", "dead", "deadline", "lead", "sink", "timeout_s", "written")

    def __init__(self, body: RequestBody, sink: Sink, timeout_s: float, lead: bool = False) -> None:
        self.body = body
        self.sink = sink
        self.timeout_s = timeout_s
        self.lead = lead  # its caller reads the answer itself (see AsyncTransport.lead)
        self.deadline = 0.0  # time.monotonic() past which it fails; 0 until it counts
        self.dead = False  # failed by its deadline while in the backlog: never write it
        #: Handed to a connection (encoded, some of its bytes maybe sent): it may have reached
        #: the broker. False: it never left this process, so sending it again is safe.
        self.written = False


class _Link:
    """One TCP connection: a non-blocking socket, its protocol state, the calls written
    to it and the bytes not sent yet. Guarded by the transport's lock."""

    __slots__ = (
        "accepted",
        "broken",
        "conn",
        "fd",
        "flushed",
        "lost",
        "out",
        "out_bytes",
        "paused",
        "pending",
        "poller",
        "read_at",
        "sock",
        "why",
        "writing",
    )

    def __init__(self, sock: socket.socket, loop: asyncio.AbstractEventLoop) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.conn = Connection(CLIENT)
        self.pending: dict[int, _Call] = {}
        self.out: deque[memoryview] = deque()  # written but not sent, in order
        self.out_bytes = 0
        self.writing = False  # the loop waits for the socket to take ``out``
        self.paused = False  # the loop's reader stood aside for a leading caller
        self.read_at = 0.0  # time.monotonic() of the last read of the socket, by anyone
        self.broken = False  # a write failed; the loop drops the link soon
        self.lost = False  # dropped: the socket is closed
        self.why: BaseException | None = None
        #: The handshake's outcome: set when the server accepts it, failed when it does not.
        self.accepted: asyncio.Future[None] = loop.create_future()
        self.flushed: asyncio.Future[None] | None = None  # close() waits for ``out`` to go
        self.poller: Any = None  # a leading caller's select.poll() of this socket and the wake pipe

    def can_send(self) -> bool:
        conn = self.conn
        return not self.broken and self.out_bytes < WRITE_BUFFER_BYTES_MAX and conn.request_room() > 0


def _deliver(outcomes: list, handlers: dict[int, Callable[[PushBody | None], None]] | None = None) -> None:
    """Settle futures and call push handlers, in the order their frames came, outside the lock."""
    for sink, what in outcomes:
        if sink is None and type(what) is _LinkLost:
            _call_push_handler(what.handler, None)
        elif sink is None:  # a push body
            handler = handlers.get(_stream_of(what)) if handlers else None
            if handler is not None:  # else: a stream closed here, a push already in flight
                _call_push_handler(handler, what)
        elif type(what) is Response:
            try:
                result = what.body.result()  # Response.result(), one call fewer
            except Exception as e:  # noqa: BLE001 - that call's problem, not the connection's
                _fail(sink, e)
            else:
                _settle(sink, result)
        elif type(what) is ErrorResponse:
            _fail(sink, what.exception())
        else:  # an exception that failed the request before it was written
            _fail(sink, what)


class _LinkLost(NamedTuple):
    """In a list of outcomes: tell a push stream's handler its connection is gone."""

    handler: Callable[[PushBody | None], None]


def _stream_of(push: PushBody) -> int:
    """The stream a PUSH body belongs to (a fetch stream's or a subscription's)."""
    if type(push) is StreamPush:
        return push.stream_id
    return push.subscription_id if type(push) is SubscriptionPush else 0


def _call_push_handler(handler: Callable[[PushBody | None], None], body: PushBody | None) -> None:
    try:
        handler(body)
    except Exception:
        log.exception("a push handler failed")


def _describe(e: BaseException) -> str:
    if isinstance(e, asyncio.TimeoutError):
        return "timed out"
    # "Connection refused", not sock_connect's "Connect call failed ('host', port)"
    if type(e) is not socket.gaierror and isinstance(e, OSError) and (e.errno or 0) > 0:
        return f"[Errno {e.errno}] {os.strerror(e.errno)}"
    return str(e) or type(e).__name__
