"""The network transport: one TCP connection speaking headwater.protocol, pipelined.

:class:`AsyncTransport` sends requests and settles their futures when the answers come,
with any number of requests in flight on the one connection. ``await call(body)`` is the
asyncio face; :meth:`AsyncTransport.submit` is the thread-safe one the sync client uses.

Threads. The event loop reads the socket (``add_reader``) and owns everything that waits:
connecting, the deadlines, the PUSH handlers. Writing is a plain call from any thread: the
caller encodes its request and sends it on the non-blocking socket itself, under one lock
that also guards the sans-IO :class:`~headwater.protocol.Connection`. So a request costs
no task and no hop to the loop's thread: on a small machine each hop (a wake-up of the
loop, then of the caller) costs about what the request's own work does. Futures are
settled and handlers called outside the lock, since they run the caller's callbacks.

Order. Requests are written in the order they are submitted. One that cannot be written
at once (no connection yet, ``requests_in_flight_max`` answers outstanding, or
``WRITE_BUFFER_BYTES_MAX`` unsent bytes) waits in a FIFO backlog, and while the backlog
holds anything every later request queues behind it; the loop writes the backlog as room
appears. So what one thread or task submits reaches the wire in submission order (a
producer pipelining batches of a partition relies on it). The backlog holds only requests
whose callers wait on them, so the callers bound it (the producer: ``max_in_flight``
batches of a partition).

Failures. Each request has a deadline, ``request_timeout_s`` (or its own ``timeout_s``)
after it is written or queued on a live connection; a reconnection is bounded by
``connect_timeout_s`` instead. Past it the call fails with
:class:`~headwater.errors.UnavailableError`. The loop checks deadlines in one timer armed
for the earliest of them (at least every ``DEADLINE_SWEEP_S`` while connected), so
submitting from a thread does not touch the loop. A lost connection fails every call
written to it or waiting for it with :class:`~headwater.errors.UnavailableError`
(retriable): nothing submitted before the loss is carried over to the next connection,
where it could overtake a retry. The next call reconnects, with backoff, until
``connect_timeout_s`` passes. Whether a failed request may be sent again is the caller's
to decide (``headwater.client.transport.remote.Tries``); :meth:`AsyncTransport.submit` tells it
whether the request was written, and so may have reached the broker.

Reading. The loop reads the socket, except while a blocking caller reads it for itself:
:meth:`AsyncTransport.lead` lets a thread that is about to wait for its own answers (the
sync client's blocking calls and its consumer's polls) read and parse the frames on its
own thread, so its answer costs no wake-up of the loop and no hand-off back to the caller
(on a small machine, about half of a sync consumer's latency). One thread leads at a time,
chosen under the lock; every read happens under the lock too, so the byte stream is never
split between two readers. The answer of a call submitted with ``lead=True`` is settled
under the lock by whichever thread reads it; other answers (their futures may have
callbacks) and PUSH frames that a leader reads are handed to the loop, which settles them
in order, as if it had read them. The loop's reader stands aside (removes itself) when the
socket is readable while a thread leads, or was read by one and nobody waits for anything.
It reads again once a leader is done while any call waits for its answer (a caller that
found another thread leading waits for the loop, or the leader, to read it), or when a
request is submitted with ``lead=False`` (the default). A connection that went unread for
``UNREAD_CHECK_S`` is read by the next submitter before it writes, so a broker that closed it
meanwhile is seen first.

PUSH frames (a push subscription's or a fetch stream's deliveries) are routed by their
stream id to the handler registered with :meth:`AsyncTransport.register_push` (or
:meth:`AsyncTransport.open_stream`), called on the loop (keep it quick: hand the body to
another thread), or, registered ``any_thread``, on whichever thread reads them as they are
parsed; the loop does not read for those (their consumer reads when it polls). When the
connection is lost, every handler is called once with None and dropped: the streams died
with the connection.

The loop must support ``add_reader`` (asyncio's and uvloop's loops on Unix do).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import ipaddress
import itertools
import logging
import math
import os
import random
import select
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

from headwater._version import __version__
from headwater.errors import (
    ClosedError,
    HeadwaterError,
    InvalidArgumentError,
    UnavailableError,
)
from headwater.model.config import DEFAULT_PORT
from headwater.protocol import (
    CLIENT,
    NEED_DATA,
    Connection,
    ConnectionClosed,
    ErrorResponse,
    Handshake,
    HandshakeAccepted,
    LocalProtocolError,
    ProtocolError,
    Push,
    RemoteProtocolError,
    Request,
    Response,
)
from headwater.protocol.messages import PushBody, RequestBody, StreamPush, SubscriptionPush

__all__ = ["AsyncTransport", "Sink", "parse_address"]

log = logging.getLogger("headwater.client")

#: Bytes asked of each recv(). Kept under glibc's mmap threshold (128 KiB): a bigger
#: buffer makes every read, however small, map fresh pages (15 µs a read instead of 3).
READ_BYTES = 64 * 1024
#: Unsent bytes past which new requests wait in the backlog instead of being written.
WRITE_BUFFER_BYTES_MAX = 256 * 1024
#: Buffers handed to one sendmsg() (Linux's IOV_MAX is 1024).
SEND_BUFFERS_MAX = 512
#: While connected, the longest the loop goes without looking for missed deadlines.
DEADLINE_SWEEP_S = 1.0
#: How long close() lets unsent requests go out before it drops the connection.
CLOSE_FLUSH_S = 1.0
#: The longest a leading caller blocks in poll() before it looks at its answers again. The
#: loop wakes a leader when it fails a call (a deadline, a lost connection), and so does a
#: caller's ``interrupt``; this bounds the wait for anything else that settles an answer.
LEAD_SLICE_S = 0.25
#: A connection nobody has read for this long is read before the next request is written to
#: it (a broker that closed it meanwhile is then seen first); one read within it is recent
#: enough, which spares a steadily polling consumer a recv() per request.
UNREAD_CHECK_S = 0.1

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


class AsyncTransport:
    """A pipelined connection to one broker. ``call`` from the loop it runs on, ``submit``
    from any thread; ``loop`` is that loop (default: the running loop of the first call)."""

    def __init__(
        self,
        address: str,
        *,
        client_name: str = f"headwater-python/{__version__}",
        connect_timeout_s: float = 10.0,
        request_timeout_s: float = 60.0,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self.host, self.port = parse_address(address)
        self.address = f"{self.host}:{self.port}"
        self.client_name = client_name
        self.connect_timeout_s = connect_timeout_s
        self.request_timeout_s = request_timeout_s
        self.server_name = ""
        self._loop = loop
        self._lock = threading.Lock()
        # guarded by _lock:
        self._link: _Link | None = None  # the connection in use, once its handshake is accepted
        self._backlog: deque[_Call] = deque()
        self._connect_wanted = False  # a connection is being made, or the loop was asked to
        self._closed = False
        self._sweep_at = math.inf  # when the deadline timer should fire next
        self._leader: int | None = None  # the thread reading the connection for itself, if any
        self._lead_free: concurrent.futures.Future | None = None  # done when the leader stops
        self._wake_pair: tuple[socket.socket, socket.socket] | None = None  # pokes a leader's poll()
        self._loop_thread: int | None = None  # set on the loop when it first connects
        # loop only:
        self._connecting: asyncio.Task[None] | None = None
        self._sweep_timer: asyncio.TimerHandle | None = None
        self._sweep_timer_at = math.inf
        self._push_handlers: dict[int, Callable[[PushBody | None], None]] = {}
        self._push_anywhere: set[int] = set()  # streams whose handler runs on whichever thread reads
        self._next_stream_id = 1
        # written on the loop, read by any thread (one float: gave_up_connecting_since)
        self._failed_connect_began = -math.inf  # time.monotonic() when the last attempt given up began
        self.connect_failure: UnavailableError | None = None  # why the last attempt given up gave up

    # submitting ------------------------------------------------------------------------

    async def call(self, body: RequestBody, *, timeout_s: float | None = None) -> Any:
        """Send one request and return its result (raises the broker's error, if any).

        Past ``requests_in_flight_max`` calls in flight, a call waits, in order, for a free slot."""
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self.submit(body, fut, timeout_s)
        return await fut

    def submit(self, body: RequestBody, sink: Sink, timeout_s: float | None = None, *, lead: bool = False) -> _Call:
        """Send one request now, or queue it behind those waiting; ``sink`` gets its outcome.

        Thread-safe. Requests submitted one after another are written in that order.
        ``lead=True`` promises that the caller calls :meth:`lead` for ``sink`` next (else the
        answer may wait in the socket until someone does). Returns the request's record:
        once ``sink`` failed, its ``written`` says whether the request may have reached the
        broker (the client's retries rely on it)."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        call = _Call(body, sink, timeout_s or self.request_timeout_s, lead)
        error: BaseException | None = None
        unread: list = []
        with self._lock:
            link = self._link
            if (
                link is not None
                and link.paused
                and self._leader is None
                and time.monotonic() - link.read_at >= UNREAD_CHECK_S
            ):
                link = self._check_unread_locked(link, unread)
            if self._closed:
                error = ClosedError(f"the client of {self.address} is closed")
            elif link is not None and not self._backlog and link.can_send():
                error = self._send_locked(link, call)
                if link.paused and not lead:
                    self._resume_reading_locked(link)
            else:
                self._backlog.append(call)
                if link is not None:  # waiting on a live connection counts towards the deadline
                    self._set_deadline_locked(call)
                    if link.paused:  # the answers that free its way must be read
                        self._resume_reading_locked(link)
                elif not self._connect_wanted:
                    self._connect_wanted = True
                    self._loop.call_soon_threadsafe(self._start_connecting)
        if unread:
            self._loop.call_soon_threadsafe(self._deliver_read, unread)
        if error is not None:
            _fail(sink, error)
        return call

    def _check_unread_locked(self, link: _Link, outcomes: list) -> _Link | None:
        """``link`` went unread since its last leader: read what came meanwhile, so a broker
        that closed the connection is seen before a request is written to it. The link to
        write to: ``link``, or None when it is gone (the request then waits for the next)."""
        why = self._read_locked(link, outcomes)
        if why is None:
            return link
        self._lose_locked(link, why)
        if self._link is link:  # its push streams end with it (_drop will not see it current)
            self._link = None
            handlers, self._push_handlers = self._push_handlers, {}
            self._push_anywhere = set()
            for handler in handlers.values():
                outcomes.append((None, _LinkLost(handler)))
        return None

    def _lose_locked(self, link: _Link, why: BaseException) -> None:
        """A thread other than the loop found ``link`` gone: write nothing more to it, and
        have the loop drop it."""
        link.broken = True
        if link.why is None:
            link.why = why
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._drop, link, why)

    def _send_locked(self, link: _Link, call: _Call) -> BaseException | None:
        """Encode and write one request; the error that fails it instead, if any."""
        conn = link.conn
        rid = conn.next_request_id()
        try:
            chunks = conn.send_chunks(Request(rid, call.body))
        except LocalProtocolError as e:  # an argument of the wrong type: the caller's mistake
            return InvalidArgumentError(f"{call.body.api.name.lower()}: {e}")
        except HeadwaterError as e:  # e.g. a frame past the broker's frame_bytes_max
            return e
        link.pending[rid] = call
        call.written = True
        if not call.deadline:
            self._set_deadline_locked(call)
        self._write_locked(link, chunks)
        return None

    def _write_locked(self, link: _Link, chunks: list) -> None:
        """Send ``chunks`` as far as the socket takes them now; the loop sends the rest."""
        if link.broken:
            return
        if not link.out:
            try:
                if len(chunks) == 1:
                    sent = link.sock.send(chunks[0])
                else:
                    sent = link.sock.sendmsg(chunks[:SEND_BUFFERS_MAX])
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError as e:
                self._break_locked(link, e)
                return
        else:
            sent = 0
        for chunk in chunks:
            size = len(chunk) if type(chunk) is bytes else memoryview(chunk).nbytes
            if sent >= size:
                sent -= size
                continue
            # keep a copy of what the caller could change or resize (a bytearray) meanwhile
            view = memoryview(chunk if type(chunk) is bytes else bytes(chunk))
            if sent:
                view, sent = view[sent:], 0
            link.out.append(view)
            link.out_bytes += view.nbytes
        if link.out and not link.writing:
            link.writing = True
            assert self._loop is not None
            self._loop.call_soon_threadsafe(self._wait_writable, link)

    def _break_locked(self, link: _Link, e: OSError) -> None:
        link.broken = True
        link.why = UnavailableError(f"the connection to {self.address} was lost: {e}")
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._drop, link, link.why)

    def _drain_locked(self, link: _Link, outcomes: list) -> None:
        """Write what waits in the backlog, in order, as far as the connection allows."""
        backlog = self._backlog
        while backlog and link.can_send():
            call = backlog.popleft()
            if call.dead or call.sink.done():  # past its deadline, or its caller gave up
                continue
            error = self._send_locked(link, call)
            if error is not None:
                outcomes.append((call.sink, error))

    # the loop: writing what the socket did not take ---------------------------------------

    def _wait_writable(self, link: _Link) -> None:
        if not link.lost:
            assert self._loop is not None
            self._loop.add_writer(link.fd, self._writable, link)

    def _writable(self, link: _Link) -> None:
        outcomes: list = []
        with self._lock:
            if link.lost:
                return
            out = link.out
            while out:
                views = list(itertools.islice(out, SEND_BUFFERS_MAX))
                try:
                    sent = link.sock.sendmsg(views)
                except (BlockingIOError, InterruptedError):
                    break
                except OSError as e:
                    self._break_locked(link, e)
                    break
                link.out_bytes -= sent
                full = sent < sum(v.nbytes for v in views)
                while sent:
                    view = out[0]
                    if sent < view.nbytes:
                        out[0] = view[sent:]
                        break
                    sent -= view.nbytes
                    out.popleft()
                if full:
                    break
            if out and not link.broken:
                return  # the loop calls again when the socket has room
            assert self._loop is not None
            self._loop.remove_writer(link.fd)
            link.writing = False
            if self._link is link:
                self._drain_locked(link, outcomes)
        if link.flushed is not None and not link.flushed.done():
            link.flushed.set_result(None)
        _deliver(outcomes)

    # the loop: deadlines -----------------------------------------------------------------

    def _set_deadline_locked(self, call: _Call) -> None:
        call.deadline = deadline = time.monotonic() + call.timeout_s
        if deadline < self._sweep_at:  # rare: the timer is armed for the earliest deadline
            self._sweep_at = deadline
            assert self._loop is not None
            self._loop.call_soon_threadsafe(self._arm_sweep)

    def _arm_sweep(self) -> None:
        at = self._sweep_at
        if self._sweep_timer is not None:
            if self._sweep_timer_at <= at:
                return
            self._sweep_timer.cancel()
            self._sweep_timer = None
        if at < math.inf:
            assert self._loop is not None
            self._sweep_timer = self._loop.call_later(max(0.0, at - time.monotonic()), self._sweep)
            self._sweep_timer_at = at

    def _sweep(self) -> None:
        """Fail the calls past their deadline; arm the timer for the next deadline."""
        self._sweep_timer, self._sweep_timer_at = None, math.inf
        now = time.monotonic()
        expired: list[_Call] = []
        with self._lock:
            following = math.inf
            link = self._link
            if link is not None:
                following = now + DEADLINE_SWEEP_S
                late = [rid for rid, call in link.pending.items() if call.deadline <= now]
                for rid in late:
                    expired.append(link.pending.pop(rid))
                for call in link.pending.values():
                    following = min(following, call.deadline)
            for call in self._backlog:
                if call.deadline and not call.dead:
                    if call.deadline <= now:
                        call.dead = True
                        expired.append(call)
                    else:
                        following = min(following, call.deadline)
            self._sweep_at = following
        self._arm_sweep()
        for call in expired:
            _fail(
                call.sink,
                UnavailableError(f"{call.body.api.name} to {self.address} got no answer in {call.timeout_s} s"),
            )
        if expired:
            self._poke_leader()  # it may wait for one of them

    # the loop: connecting ----------------------------------------------------------------

    def _start_connecting(self) -> None:
        if self._connecting is not None:
            return
        if self._closed:
            self._fail_backlog(ClosedError(f"the client of {self.address} is closed"))
            return
        assert self._loop is not None
        self._connecting = self._loop.create_task(self._connect())

    async def _connect(self) -> None:
        """Connect (with backoff), then write the backlog; or fail the backlog."""
        began = time.monotonic()
        try:
            link = await self._connect_with_backoff()
        except BaseException as e:
            self._connecting = None
            if isinstance(e, asyncio.CancelledError):
                why: BaseException = UnavailableError(f"the client of {self.address} was closed")
            else:
                why = e
                self._failed_connect_began = max(self._failed_connect_began, began)
                if isinstance(e, UnavailableError):
                    self.connect_failure = e
            self._fail_backlog(why)
            if not isinstance(e, Exception):
                raise
            return
        self._connecting = None
        self._loop_thread = threading.get_ident()
        outcomes: list = []
        with self._lock:
            usable = not self._closed and not link.lost
            if usable:
                self._link = link
                self._connect_wanted = False
                now = time.monotonic()
                self._sweep_at = now + DEADLINE_SWEEP_S
                for call in self._backlog:  # their deadlines start now
                    call.deadline = now + call.timeout_s
                    self._sweep_at = min(self._sweep_at, call.deadline)
                self._drain_locked(link, outcomes)
        if not usable:
            if self._closed:
                self._drop(link, UnavailableError(f"the client of {self.address} was closed"))
                why = ClosedError(f"the client of {self.address} is closed")
            else:  # lost right after its handshake
                assert link.why is not None
                why = link.why
            self._fail_backlog(why)
            return
        self._arm_sweep()
        _deliver(outcomes)

    def gave_up_connecting_since(self, t: float) -> bool:
        """Whether an attempt to connect that began at or after ``t`` (``time.monotonic()``)
        has given up: the broker could not be reached for a whole ``connect_timeout_s``, so a
        call that failed for it would only wait as long again if it were sent again."""
        return self._failed_connect_began >= t

    def withdraw(self, sink: Sink) -> bool:
        """Take back a request not written yet (waiting for a connection, or behind others):
        True if it was still waiting, and now never will be sent (its sink is left as it is);
        False if it was written already (its answer will come) or is over."""
        with self._lock:
            for call in self._backlog:
                if call.sink is sink and not call.dead:
                    self._backlog.remove(call)
                    return True
        return False

    def _fail_backlog(self, why: BaseException) -> None:
        with self._lock:
            calls = [c for c in self._backlog if not c.dead]
            self._backlog.clear()
            self._connect_wanted = False
        for call in calls:
            _fail(call.sink, why)

    async def _connect_with_backoff(self) -> _Link:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.connect_timeout_s
        delay = 0.05
        while True:
            try:
                return await asyncio.wait_for(self._connect_once(), max(0.01, deadline - loop.time()))
            except (TimeoutError, OSError, UnavailableError) as e:
                if self._closed:
                    raise ClosedError(f"the client of {self.address} is closed") from e
                if loop.time() + delay >= deadline:
                    raise UnavailableError(
                        f"cannot reach the broker at {self.address} ({_describe(e)}); is "
                        f"'headwater serve' running there?"
                    ) from e
                await asyncio.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, 1.0)

    async def _connect_once(self) -> _Link:
        loop = asyncio.get_running_loop()
        sock = await self._open_socket(loop)
        link = _Link(sock, loop)
        try:
            loop.add_reader(link.fd, self._readable, link)
            with self._lock:
                self._write_locked(link, link.conn.send_chunks(Handshake(self.client_name)))
            await link.accepted
        except BaseException:
            link.accepted.cancel()  # nobody waits for it any more
            self._drop(link, UnavailableError(f"no handshake with {self.address}"))
            raise
        return link

    async def _open_socket(self, loop: asyncio.AbstractEventLoop) -> socket.socket:
        """A connected non-blocking TCP socket, trying each address of the host in turn."""
        try:
            ip = ipaddress.ip_address(self.host)
        except ValueError:
            infos = await loop.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
        else:  # no resolver thread for an address
            family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
            infos = [(family, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (self.host, self.port))]
        error: OSError | None = None
        for family, kind, proto, _, addr in infos:
            sock = socket.socket(family, kind, proto)
            try:
                sock.setblocking(False)
                await loop.sock_connect(sock, addr)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except BaseException as e:
                sock.close()
                if not isinstance(e, OSError):
                    raise
                error = e
                continue
            return sock
        raise error or OSError(f"{self.host} has no address")

    def _handshake(self, link: _Link, data: bytes) -> None:
        """Bytes before the handshake is accepted: accept it, or fail it."""
        conn = link.conn
        conn.receive_data(data)
        try:
            ev = conn.next_event()
        except ProtocolError as e:
            ev = e
        if ev is NEED_DATA:
            return
        if isinstance(ev, HandshakeAccepted):
            self.server_name = ev.server_name
            link.accepted.set_result(None)
            return
        if isinstance(ev, ErrorResponse):
            exc: BaseException = ev.exception()
        elif isinstance(ev, ConnectionClosed):
            exc = UnavailableError("the broker closed the connection during the handshake")
        elif isinstance(ev, ProtocolError):  # not a broker, or not ours: trying again would not help
            exc = RemoteProtocolError(
                f"something at {self.address} answered, but not as a Headwater broker (its first bytes: "
                f"{bytes(data[:24])!r}; {ev}); is that the broker's address and port?"
            )
        else:
            exc = UnavailableError(f"unexpected answer to the handshake: {ev!r}")
        link.accepted.set_exception(exc)
        self._drop(link, exc)

    # the loop: reading -------------------------------------------------------------------

    def _readable(self, link: _Link) -> None:
        if not link.accepted.done():
            got = self._recv(link)
            if isinstance(got, BaseException):
                self._drop(link, got)
            elif got is not None:
                self._handshake(link, got)
            return
        outcomes: list = []
        with self._lock:
            if link.lost:
                return
            if self._leader is not None:  # a caller reads for itself: stand aside until it is done
                self._stand_aside_locked(link)
                return
            got = self._recv(link)
            if got is None:  # nothing to read: a leader took it
                if not self._loop_needed_locked(link):  # and nobody waits for more
                    self._stand_aside_locked(link)
                return
            why = got if isinstance(got, BaseException) else self._parse_locked(link, got, outcomes)
        _deliver(outcomes, self._push_handlers)
        if why is not None:
            self._drop(link, why)

    def _recv(self, link: _Link) -> bytes | BaseException | None:
        """What the socket holds (b"" at EOF: the connection then says how it ended), the
        error that lost the connection, or None when there is nothing to read yet."""
        try:
            data = link.sock.recv(READ_BYTES)
        except (BlockingIOError, InterruptedError):
            link.read_at = time.monotonic()
            return None
        except OSError as e:
            return UnavailableError(f"the connection to {self.address} was lost: {e}")
        link.read_at = time.monotonic()
        return data

    def _read_locked(self, link: _Link, outcomes: list) -> BaseException | None:
        """Read what the socket holds, if anything, and parse it (see :meth:`_parse_locked`)."""
        got = self._recv(link)
        if got is None or isinstance(got, BaseException):
            return got
        return self._parse_locked(link, got, outcomes)

    def _parse_locked(self, link: _Link, data: bytes, outcomes: list) -> BaseException | None:
        """Parse ``data`` into ``outcomes`` (then write what the backlog may now send); the
        reason to drop the connection, if it must go.

        The answer of a call whose caller leads is settled here, under the lock, whoever
        reads it: a caller that takes the lead after this sees its answer, instead of
        blocking in poll() on a socket already read (so a led sink takes no callbacks)."""
        why: BaseException | None = None
        conn = link.conn
        pending = link.pending
        try:
            conn.receive_data(data)
            while True:
                ev = conn.next_event()
                if ev is NEED_DATA:
                    break
                cls = type(ev)
                if cls is Response or cls is ErrorResponse:
                    call = pending.pop(ev.request_id, None)
                    if call is not None:  # else it timed out: the answer came too late
                        if call.lead:
                            _deliver([(call.sink, ev)])
                        else:
                            outcomes.append((call.sink, ev))
                    elif ev.request_id == 0:  # the broker's last word before it closes
                        why = UnavailableError(f"the broker closed the connection: {ev.message}")
                        break
                elif cls is Push:
                    body = ev.body
                    sid = _stream_of(body)
                    if sid in self._push_anywhere:  # handled on this thread, as it comes
                        handler = self._push_handlers.get(sid)
                        if handler is not None:
                            _call_push_handler(handler, body)
                    else:
                        outcomes.append((None, body))
                else:  # ConnectionClosed
                    why = UnavailableError(f"the connection to {self.address} was lost")
                    break
        except ProtocolError as e:
            why = UnavailableError(f"protocol error from {self.address}: {e}")
            log.warning("%s", why)
        if why is None and self._backlog and self._link is link:
            self._drain_locked(link, outcomes)
        return why

    def _loop_needed_locked(self, link: _Link) -> bool:
        """Whether anyone waits for what the connection brings. Once no thread leads, that
        includes callers who meant to lead but found another thread leading: they wait on
        their sinks, and only the loop would read their answers. Streams whose pushes any
        thread may take (a consumer's fetch streams) do not count: their consumer reads them
        when it polls, and until then they wait in the socket (their credit bounds them)."""
        return bool(link.pending or self._backlog or len(self._push_handlers) > len(self._push_anywhere))

    def _stand_aside_locked(self, link: _Link) -> None:
        """The loop stops reading ``link`` (on the loop): its callers read for themselves."""
        assert self._loop is not None
        self._loop.remove_reader(link.fd)
        link.paused = True

    def _resume_reading_locked(self, link: _Link) -> None:
        """Have the loop read ``link`` again (its reader stood aside for a leader)."""
        link.paused = False
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._resume_reading, link)

    def _resume_reading(self, link: _Link) -> None:
        if not link.lost:
            assert self._loop is not None
            self._loop.add_reader(link.fd, self._readable, link)

    # a blocking caller reading for itself ------------------------------------------------

    def lead(
        self, sinks: list, timeout_s: float | None = None, *, interrupt: concurrent.futures.Future | None = None
    ) -> concurrent.futures.Future | None:
        """Read the connection on this thread until one of ``sinks`` is done or ``timeout_s``
        passes (None: no limit; 0: read what is there, without blocking), if nobody else
        reads it; return at once otherwise. Either way the caller then waits on its sinks
        as usual: what this thread did not read, the loop or the current leader does.

        Returns None, or, when another thread leads, a future done once that thread stops
        leading: a caller whose sinks nobody else reads for (a fetch stream's pushes) waits
        on it too, and leads then (see ``polling.wait_any``).

        ``interrupt``: a future another thread completes to end the wait at once (a group
        consumer's new assignment); it is one of ``sinks`` too."""
        me = threading.get_ident()
        with self._lock:
            link = self._link
            if link is None or self._closed or me == self._loop_thread or self._leader == me:
                return None
            if self._leader is not None:  # another thread reads: the caller may lead once it stops
                if self._lead_free is None:
                    self._lead_free = concurrent.futures.Future()
                return self._lead_free
            if link.lost or link.broken:
                return None
            self._leader = me
            if self._wake_pair is None:
                self._wake_pair = socket.socketpair()
                for end in self._wake_pair:
                    end.setblocking(False)
        if interrupt is not None:
            interrupt.add_done_callback(self._poke_leader)
        try:
            self._lead(link, sinks, timeout_s)
        finally:
            with self._lock:
                self._leader = None
                free, self._lead_free = self._lead_free, None
                if link.paused and not link.lost and self._loop_needed_locked(link):
                    self._resume_reading_locked(link)  # others wait for answers: the loop reads
            if free is not None:
                free.set_result(None)  # callers waiting to lead may now
        return None

    def _lead(self, link: _Link, sinks: list, timeout_s: float | None) -> None:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        assert self._wake_pair is not None
        wake = self._wake_pair[0]
        poller = link.poller  # made once per connection: leaders take turns, one at a time
        if poller is None:
            poller = link.poller = select.poll()
            poller.register(link.fd, select.POLLIN)
            poller.register(wake.fileno(), select.POLLIN)
        while True:
            for sink in sinks:
                if sink.done():
                    return
            wait_s = LEAD_SLICE_S
            if deadline is not None:
                wait_s = min(wait_s, deadline - time.monotonic())
            for fd, _ in poller.poll(max(0, int(wait_s * 1000 + 0.999))):  # ms, rounded up
                if fd != link.fd:  # poked: look at the sinks again
                    with contextlib.suppress(OSError):
                        while wake.recv(64):
                            pass
                    continue
                outcomes: list = []
                with self._lock:
                    if link.lost or self._link is not link:
                        return
                    why = self._read_locked(link, outcomes)
                    if why is not None:
                        self._lose_locked(link, why)
                if outcomes:  # answers of callers who do not lead, PUSH frames: the loop's
                    assert self._loop is not None
                    self._loop.call_soon_threadsafe(self._deliver_read, outcomes)
                if why is not None:
                    return
            if deadline is not None and time.monotonic() >= deadline:
                return

    def _poke_leader(self, _: object = None) -> None:
        """Wake the leading caller from poll(), to look at its sinks (any thread)."""
        pair = self._wake_pair
        if pair is not None and self._leader is not None:
            with contextlib.suppress(OSError):  # full (a poke is pending) or closed
                pair[1].send(b"\0")

    def _deliver_read(self, outcomes: list) -> None:
        _deliver(outcomes, self._push_handlers)

    def _drop(self, link: _Link, why: BaseException) -> None:
        """Close ``link``, failing its calls; if it was the connection in use, also what
        waited for it, and end the push streams."""
        calls: list[_Call] = []
        handlers: dict[int, Callable[[PushBody | None], None]] = {}
        with self._lock:
            if link.lost:
                return
            link.lost = True
            if link.why is None:
                link.why = why
            why = link.why
            assert self._loop is not None
            self._loop.remove_reader(link.fd)
            if link.writing:
                self._loop.remove_writer(link.fd)
            if self._leader is not None:  # wake a caller blocked in poll() on this socket
                with contextlib.suppress(OSError):
                    link.sock.shutdown(socket.SHUT_RDWR)
            link.sock.close()
            calls.extend(link.pending.values())
            link.pending = {}
            link.out.clear()
            if self._link is link:
                self._link = None
                calls.extend(c for c in self._backlog if not c.dead)
                self._backlog.clear()
                self._sweep_at = math.inf
                handlers, self._push_handlers = self._push_handlers, {}
                self._push_anywhere = set()
        if not link.accepted.done():
            link.accepted.set_exception(why)
        if link.flushed is not None and not link.flushed.done():
            link.flushed.set_result(None)
        for call in calls:
            _fail(call.sink, why)
        for handler in handlers.values():
            try:
                handler(None)
            except Exception:
                log.exception("a push handler failed")

    # push streams ------------------------------------------------------------------------

    def register_push(self, handler: Callable[[PushBody | None], None], *, any_thread: bool = False) -> int:
        """A new stream id whose PUSH frames go to ``handler`` (None: the connection was lost),
        on the loop; with ``any_thread``, on whichever thread reads them (a caller that leads
        too), as they are parsed: the handler must then be quick and thread-safe. Thread-safe;
        a handler registered while no connection is up waits for the next one."""
        with self._lock:
            sid = self._next_stream_id
            while sid in self._push_handlers:
                sid = sid % (2**32 - 1) + 1
            self._next_stream_id = sid % (2**32 - 1) + 1
            self._push_handlers[sid] = handler
            if any_thread:
                self._push_anywhere.add(sid)
        return sid

    def unregister_push(self, stream_id: int) -> None:
        with self._lock:
            self._push_handlers.pop(stream_id, None)
            self._push_anywhere.discard(stream_id)

    def start_stream(
        self,
        request: Callable[[int], RequestBody],
        handler: Callable[[PushBody | None], None],
        sink: Sink,
        *,
        any_thread: bool = False,
    ) -> int:
        """Open a push stream without waiting (any thread): register ``handler`` under a new
        id, submit ``request(id)`` (SUBSCRIBE, FETCH_STREAM) with ``sink`` for the broker's
        answer, and return the id. The handler is dropped again if the answer is a failure."""
        sid = self.register_push(handler, any_thread=any_thread)
        sink.add_done_callback(functools.partial(self._stream_answered, sid))
        self.submit(request(sid), sink)
        return sid

    def _stream_answered(self, stream_id: int, sink: Sink) -> None:
        if sink.cancelled() or sink.exception() is not None:
            self.unregister_push(stream_id)

    async def open_stream(
        self,
        request: Callable[[int], RequestBody],
        handler: Callable[[PushBody | None], None],
        *,
        any_thread: bool = False,
    ) -> tuple[int, Any]:
        """:meth:`start_stream`, on the loop, and wait: the id and the answer's result."""
        fut = asyncio.get_running_loop().create_future()
        sid = self.start_stream(request, handler, fut, any_thread=any_thread)
        return sid, await fut

    async def close(self) -> None:
        """Fail every call in flight or waiting, and close the connection (on the loop)."""
        with self._lock:
            self._closed = True
            link = self._link
        if self._connecting is not None:
            self._connecting.cancel()
            with contextlib.suppress(BaseException):
                await self._connecting
        if link is not None:
            if link.out and not link.lost:  # let what is written go out, briefly
                link.flushed = asyncio.get_running_loop().create_future()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(asyncio.shield(link.flushed), CLOSE_FLUSH_S)
            self._drop(link, UnavailableError(f"the client of {self.address} was closed"))
        if self._sweep_timer is not None:
            self._sweep_timer.cancel()
            self._sweep_timer = None
        self._fail_backlog(ClosedError(f"the client of {self.address} is closed"))
        with self._lock:
            pair, leading = self._wake_pair, self._leader is not None
            if not leading:
                self._wake_pair = None
        if pair is not None and not leading:  # a leader still polling it leaves it to the GC
            for end in pair:
                end.close()


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
                result = what.result()
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
