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

Files. The class is cut along its seams into parts it inherits from, so a call costs no
extra layer (a method found on a base class is as quick to call as one of its own): this
module holds the calls, writing and deadlines; :mod:`.connecting` connecting, reconnecting
and dropping; :mod:`.reading` the loop's reader and parsing; :mod:`.leading` the
lead/thread hand-off; :mod:`.push` the push streams; :mod:`.link` the connection and
request records they share. They share one lock and the state ``__init__`` sets up.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import math
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from headwater._version import __version__
from headwater.client.transport.connecting import Connecting
from headwater.client.transport.leading import SPIN_PAUSE_LEADS, Leading, check_lead_spin_us, default_lead_spin_us
from headwater.client.transport.link import (
    DEADLINE_SWEEP_S,
    WRITE_BUFFER_BYTES_MAX,
    Sink,
    _Call,
    _deliver,
    _fail,
    _Link,
    parse_address,
)
from headwater.client.transport.push import PushStreams
from headwater.client.transport.reading import Reading
from headwater.errors import ClosedError, HeadwaterError, InvalidArgumentError, UnavailableError
from headwater.model.spinning import SpinGate
from headwater.protocol import LocalProtocolError
from headwater.protocol.messages import PushBody, RequestBody

__all__ = ["AsyncTransport", "Sink", "parse_address"]

#: Buffers handed to one sendmsg() (Linux's IOV_MAX is 1024).
SEND_BUFFERS_MAX = 512
#: How long close() lets unsent requests go out before it drops the connection.
CLOSE_FLUSH_S = 1.0
#: A connection nobody has read for this long is read before the next request is written to
#: it (a broker that closed it meanwhile is then seen first); one read within it is recent
#: enough, which spares a steadily polling consumer a recv() per request.
UNREAD_CHECK_S = 0.1


class AsyncTransport(Connecting, Reading, Leading, PushStreams):
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
        lead_spin_us: int | None = None,
    ) -> None:
        self.lead_spin_us = default_lead_spin_us() if lead_spin_us is None else check_lead_spin_us(lead_spin_us)
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
        # what a thread other than the loop read (answers, PUSH frames), in the order read, for
        # the loop to deliver (Reading._deliver_read): the loop delivers what it reads itself
        # behind it, so a stream's pushes reach its handler in the order the broker sent them
        self._undelivered: deque[Any] = deque()
        # the leader's only (one thread at a time): the spin's back-off
        self._spin_gate = SpinGate(SPIN_PAUSE_LEADS)
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

    # submitting ---------------------------------------------------------------------------

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
                self._undelivered.extend(unread)
            if self._closed:
                error = ClosedError(f"the client of {self.address} is closed")
            elif (  # link.can_send(), inline: once per call
                link is not None
                and not self._backlog
                and not link.broken
                and link.out_bytes < WRITE_BUFFER_BYTES_MAX
                and link.conn.request_room() > 0
            ):
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
            self._loop.call_soon_threadsafe(self._deliver_read)
        if error is not None:
            _fail(sink, error)
        return call

    def _send_locked(self, link: _Link, call: _Call) -> BaseException | None:
        """Encode and write one request; the error that fails it instead, if any."""
        conn = link.conn
        rid = conn.next_request_id()
        try:
            chunks = conn.send_request(rid, call.body)
        except LocalProtocolError as e:  # an argument of the wrong type: the caller's mistake
            return InvalidArgumentError(f"{call.body.api.name.lower()}: {e}")
        except HeadwaterError as e:  # e.g. a frame past the broker's frame_bytes_max
            return e
        link.pending[rid] = call
        call.written = True
        if not call.deadline:  # _set_deadline_locked's work; its call only when the timer must move
            call.deadline = deadline = time.monotonic() + call.timeout_s
            if deadline < self._sweep_at:
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

    # the loop: deadlines ------------------------------------------------------------------

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

    # taking back and closing --------------------------------------------------------------

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
