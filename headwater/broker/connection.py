"""One client connection of the broker's server, as an :class:`asyncio.Protocol`.

Bytes read go to the sans-IO :class:`~headwater.protocol.Connection`, and its requests are
served from ``data_received``, in arrival order, by the server that accepted the connection.
This module holds the transport side: bounds (byte budgets, answers the peer has not taken),
pausing and resuming reading, timeouts and closing. What it needs of the server is
:class:`ConnectionHost`, and nothing else. See :mod:`headwater.broker.server` for the whole
picture.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Protocol

from headwater._version import __version__
from headwater.broker.budget import ByteBudget, ServerBudget
from headwater.broker.log_limit import limited
from headwater.errors import UnavailableError
from headwater.protocol import (
    NEED_DATA,
    SERVER,
    Connection,
    ConnectionClosed,
    ErrorResponse,
    Handshake,
    HandshakeAccepted,
    ProtocolError,
    Request,
    UnsupportedVersionError,
    choose_version,
)

if TYPE_CHECKING:
    from headwater.broker.idle_spin import IdleSpin
    from headwater.broker.server import ServerConfig

__all__ = ["ClientConnection", "ConnectionHost", "CLOSE_LINGER_S"]

log = logging.getLogger("headwater.server")
# a peer that breaks the protocol is answered and closed; the line about it is limited, as
# a fuzzer or a client of another protocol retrying in a loop sends thousands of them
_protocol_errors = limited(log, logging.WARNING, every_s=10.0)

_SERVER_NAME = f"headwater/{__version__}"
_EOF_LINGER_S = 1.0  # after the peer's EOF, how long its unfinished requests may still answer
CLOSE_LINGER_S = 5.0  # after close, how long a peer may take to read the last bytes
_REQUESTS_PER_TURN = 64  # served from one connection before other connections get the loop
# A frame bigger than this reserves its announced size of the byte budgets as soon as its length
# is read, before its body is (smaller ones are bounded by one read per connection)
FRAME_RESERVE_MIN_BYTES = 64 * 1024
FRAME_RESERVE_STEP_BYTES = 1024 * 1024  # a big frame reserves this far ahead of its bytes in


class ConnectionHost(Protocol):
    """What a connection needs of the server that accepted it (:class:`BrokerServer`)."""

    config: ServerConfig
    loop: asyncio.AbstractEventLoop
    budget: ServerBudget  # the server's byte budget, over each connection's own
    idle_spin: IdleSpin  # the loop's spin before it blocks (idle_spin_us)

    def admit(self, conn: ClientConnection) -> str | None:
        """Count ``conn`` among the server's connections; or why it is refused."""
        ...

    def serve(self, conn: ClientConnection, request: Request) -> bool:
        """Answer ``request`` now or start a task for it; False (nothing done) when the byte
        budgets are short: the connection serves it again once woken."""
        ...

    def writable_again(self, conn: ClientConnection) -> None:
        """The peer took all its answers: what waited for that (fetch streams) may go on."""
        ...

    def connection_gone(self, conn: ClientConnection) -> None:
        """``conn`` is lost: forget it (its streams and subscriptions end)."""
        ...


class ClientConnection(asyncio.Protocol):
    """One client connection: the transport, its sans-IO :class:`Connection`, what it holds.

    Bytes read go to the Connection, and its events are served at once, in order, from
    ``data_received``: a request that needs no wait (a produce with async flush, a fetch
    that finds data, a ping) is answered inline; one that must wait runs as a task. Since
    every produce is appended inline, in the order read, a connection's produces reach the
    log in the order it sent them (pipelined batches and idempotent sequences rely on it).

    When a bound is reached (byte budget, or more than ``write_buffer_bytes_max`` of answers
    not yet taken by the peer) serving stops and reading pauses; TCP pushes back on the
    client. The event that did not fit is kept in ``held`` and served first on resume.

    The transport's write buffer limits are 0/0, so ``pause_writing``/``resume_writing``
    say exactly "bytes are buffered"/"all bytes went out": the budget held by answers
    written is released when they are out. ``writer``, ``write_lock`` and ``conn`` are what
    :class:`PushService` uses to send PUSH frames (``writelines``, ``await drain()``).
    """

    __slots__ = (
        "host",
        "loop",
        "transport",
        "conn",
        "peer",
        "budget",
        "tasks",
        "parked",
        "write_lock",
        "out",
        "unsent",
        "held",
        "blocked",
        "wake_scheduled",
        "write_paused",
        "drain_waiters",
        "handshaken",
        "last_data_s",
        "timer",
        "closing",
        "lost",
        "eof",
        "counted",
        "reserved",
        "frame_held",
        "stall_timer",
        "stall_mark",
        "frame_since",
        "off_loop",
    )

    def __init__(self, host: ConnectionHost) -> None:
        cfg = host.config
        self.host = host
        self.loop = host.loop
        self.transport: asyncio.Transport | None = None
        self.conn = Connection(
            SERVER, frame_bytes_max=cfg.frame_bytes_max, requests_in_flight_max=cfg.requests_in_flight_max
        )
        self.peer = "?"
        self.budget = ByteBudget(cfg.connection_bytes_in_flight_max)  # batches and answers in flight
        self.tasks: set[asyncio.Task] = set()
        self.parked: set = set()  # fetches parked without a task (the server's _ParkedFetch)
        self.write_lock = asyncio.Lock()  # PUSH frames: one stream writes (and drains) at a time
        self.out: list = []  # answers served inline, written once the events read are served
        self.unsent = 0  # budget bytes held by answers written but perhaps not sent yet
        self.held: Request | None = None  # the request that waits for budget
        self.blocked = False  # serving stopped at a bound; reading paused
        self.wake_scheduled = False
        self.write_paused = False  # the transport holds bytes not sent yet
        self.drain_waiters: list[asyncio.Future[None]] = []
        self.handshaken = False
        self.last_data_s = 0.0
        self.timer: asyncio.TimerHandle | None = None
        self.closing = False
        self.lost = False
        self.eof = False
        self.counted = False  # in the server's connections (not refused)
        self.reserved = 0  # budget bytes reserved for the big frame being received
        self.frame_held = 0  # the same, once that frame is a request being served (a produce takes it)
        self.off_loop: tuple[object, asyncio.Future] | None = None  # a produce appended in a decode thread
        self.stall_timer: asyncio.TimerHandle | None = None  # checks that a paused peer takes its answers
        self.stall_mark = 0  # the answers buffered for it when last checked
        self.frame_since: float | None = None  # loop time the first byte of a frame not yet whole came

    @property
    def writer(self) -> ClientConnection:
        return self  # writelines and drain, as on a StreamWriter

    # -- transport callbacks -------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]  # uvloop's transport is not an asyncio.Transport subclass
        self.transport = transport  # an asyncio.Transport (uvloop's is not a subclass)
        address, port = (transport.get_extra_info("peername") or ("?", "?"))[:2]
        self.peer = f"{address}:{port}"
        why = self.host.admit(self)
        if why is not None:
            self.closing = True
            with contextlib.suppress(ProtocolError):  # said before the handshake: the client reports it
                transport.writelines(
                    self.conn.send_chunks(ErrorResponse.from_exception(0, UnavailableError(f"{why}; try again later")))
                )
            transport.close()
            return
        self.counted = True
        transport.set_write_buffer_limits(high=0, low=0)
        self.last_data_s = self.loop.time()
        self.timer = self.loop.call_later(self.host.config.handshake_timeout_s, self._on_timer)

    def data_received(self, data: bytes) -> None:
        self.last_data_s = self.loop.time()
        self.conn.receive_data(data)
        if not self.blocked and not self.closing:
            self._serve_events()
        spin = self.host.idle_spin
        if spin.enabled:
            spin.after_serve(self.loop)

    def eof_received(self) -> bool:
        self.conn.receive_data(b"")
        if not self.blocked and not self.closing:
            self._serve_events()
        return True  # answers still being served go out; we close once they are

    def pause_writing(self) -> None:
        self.write_paused = True
        if self.stall_timer is None and not self.closing:
            self.stall_mark = self.transport.get_write_buffer_size()
            self.stall_timer = self.loop.call_later(self.host.config.send_timeout_s, self._check_stall)

    def resume_writing(self) -> None:
        self.write_paused = False
        if self.stall_timer is not None:
            self.stall_timer.cancel()
            self.stall_timer = None
        self.host.writable_again(self)
        if self.unsent:
            n, self.unsent = self.unsent, 0
            self.host.budget.release_answer(self, n)
        if self.drain_waiters:
            waiters, self.drain_waiters = self.drain_waiters, []
            for fut in waiters:
                if not fut.done():
                    fut.set_result(None)
        self.wake()  # may be called from inside a write: never serve from here directly

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = self.closing = True
        if not self.counted:
            return
        self.host.connection_gone(self)
        budget = self.host.budget
        if self.timer is not None:
            self.timer.cancel()
        for t in self.tasks:
            t.cancel()
        for pf in list(self.parked):
            pf.drop()
        self.parked.clear()
        budget.forget(self)
        if self.unsent:  # the bytes will never go out: their budget is free
            n, self.unsent = self.unsent, 0
            budget.release_answer(self, n)
        if self.reserved:  # a big frame that will never be whole
            n, self.reserved = self.reserved, 0
            budget.drop_frame(self, n)
        self._release_frame()
        if self.stall_timer is not None:
            self.stall_timer.cancel()
            self.stall_timer = None
        self.out.clear()
        self.resume_writing()  # wakes drain() waiters, which then see the connection lost

    # -- serving -------------------------------------------------------------------------

    def _serve_events(self) -> None:
        """Serve the events the Connection holds, in order, until it needs data or a bound
        is reached; then write the answers served inline, in one go."""
        conn, host = self.conn, self.host
        unframed = conn.unframed
        write_max = host.config.write_buffer_bytes_max
        turn = _REQUESTS_PER_TURN
        try:
            while not self.closing:
                if not turn:  # a long pipelined burst: let other connections in, go on soon
                    self._block()
                    self.wake_scheduled = True
                    self.loop.call_soon(self._unblock)
                    break
                if self.write_paused and self.transport.get_write_buffer_size() > write_max:
                    self._block()  # the peer is not taking its answers: read no more from it
                    break
                ev = self.held
                if ev is not None:
                    self.held = None
                else:
                    try:
                        ev = conn.next_event()
                    except ProtocolError as e:
                        _protocol_errors("closing %s: %s", self.peer, e)
                        with contextlib.suppress(ProtocolError):
                            self.out += conn.send_chunks(ErrorResponse.from_exception(0, e))
                        self.close()
                        break
                    if ev is NEED_DATA:
                        if not conn.receiving_frame:  # the usual case: every frame read was whole
                            self.frame_since = None
                            break
                        self._frame_pending()
                        if conn.frame_in_progress_bytes > FRAME_RESERVE_MIN_BYTES and not self._reserve_frame():
                            self._block()  # its body stays in the kernel until the budget has room
                        break
                self.frame_since = None
                kind = type(ev)
                if kind is Request:
                    turn -= 1
                    if self.reserved:  # the big frame reserved as it came in is this request
                        self.frame_held, self.reserved = self.reserved, 0
                        host.budget.frame_arrived(self, self.frame_held)
                    if not host.serve(self, ev):
                        self._release_frame()  # it waits for budget of its own
                        self.held = ev
                        self._block()
                        break
                    if self.frame_held:  # a produce took it over; any other request is served
                        self._release_frame()
                    if not unframed and not conn.ended:  # nothing more came: no NEED_DATA round trip
                        break
                elif kind is Handshake:
                    if not self._accept(ev):
                        break
                elif kind is ConnectionClosed:
                    self._peer_closed()
                    break
                else:  # the state machine lets nothing else through; be safe
                    self.close()
                    break
        except Exception:  # noqa: BLE001 - a bug must not take the server down
            log.exception("connection %s failed", self.peer)
            self.close()
        self._flush()

    def _frame_pending(self) -> None:
        """A frame that has begun must be whole within ``frame_timeout_s``: a peer that
        trickles its bytes keeps the idle timeout from firing, and a big frame's reservation
        of the byte budget from going back. Start that clock, and the timer that checks it."""
        if not self.conn.receiving_frame:
            self.frame_since = None
            return
        if self.frame_since is not None or not self.handshaken:  # before: the handshake's timeout
            return
        self.frame_since = now = self.loop.time()
        due = now + self.host.config.frame_timeout_s
        if self.timer is None or self.timer.when() > due:
            if self.timer is not None:
                self.timer.cancel()
            self.timer = self.loop.call_at(due, self._on_timer)

    def _reserve_frame(self) -> bool:
        """Keep the big frame being received reserved a step ahead of its bytes (see
        :meth:`ServerBudget.reserve_frame`); False: stop reading until woken."""
        conn = self.conn
        want = min(conn.frame_in_progress_bytes, conn.frame_received_bytes + FRAME_RESERVE_STEP_BYTES)
        if want <= self.reserved:
            return True
        if not self.host.budget.reserve_frame(self, want - self.reserved, self.reserved):
            return False
        self.reserved = want
        return True

    def _release_frame(self) -> None:
        if self.frame_held:
            n, self.frame_held = self.frame_held, 0
            self.host.budget.release(self, n)

    def _accept(self, ev: Handshake) -> bool:
        try:
            version = choose_version(ev)
        except UnsupportedVersionError as e:
            self.out += self.conn.send_chunks(ErrorResponse.from_exception(0, e))
            _protocol_errors("closing %s: %s", self.peer, e)
            self.close()
            return False
        self.out += self.conn.send_chunks(HandshakeAccepted(version, _SERVER_NAME))
        self.handshaken = True
        if self.timer is not None:  # from now on the idle timeout applies
            self.timer.cancel()
        self.timer = self.loop.call_later(self.host.config.idle_timeout_s, self._on_timer)
        return True

    def _flush(self) -> None:
        out = self.out
        if out and not self.lost:
            self.transport.writelines(out)
            out.clear()
            if self.unsent and not self.write_paused:  # all went out at once
                n, self.unsent = self.unsent, 0
                self.host.budget.release_answer(self, n)

    def send(self, chunks: list, charge: int = 0) -> None:
        """Write one answer from a task; ``charge`` (budget bytes it holds) is released once
        the answer is out."""
        if self.lost or self.closing:
            if charge:
                self.host.budget.release_answer(self, charge)
            raise ConnectionResetError("the connection closed")
        self.unsent += charge
        self.out += chunks
        self._flush()

    def writelines(self, chunks: list) -> None:
        """Write a PUSH frame (see :class:`PushService`)."""
        self.send(chunks)

    async def drain(self) -> None:
        """Wait until the peer has taken most of what was written (PUSH flow control)."""
        if (
            self.write_paused
            and not self.lost
            and (self.transport.get_write_buffer_size() > self.host.config.write_buffer_bytes_max)
        ):
            fut = self.loop.create_future()
            self.drain_waiters.append(fut)
            await fut
        if self.lost:
            raise ConnectionResetError("the connection closed")

    def task_done(self, task: asyncio.Task) -> None:
        self.tasks.discard(task)
        if self.eof and not self.tasks:
            self.close()

    # -- bounds, timeouts, closing ------------------------------------------------------

    def _block(self) -> None:
        self.blocked = True
        self.transport.pause_reading()

    def wake(self) -> None:
        """Serve again soon (a bound may have cleared); never inline, so a release made while
        serving another connection, or a write, does not recurse into serving."""
        if self.blocked and not self.wake_scheduled and not self.closing:
            self.wake_scheduled = True
            self.loop.call_soon(self._unblock)

    def _unblock(self) -> None:
        self.wake_scheduled = False
        if self.closing or not self.blocked:
            return
        self.blocked = False
        self.transport.resume_reading()
        self._serve_events()

    def _check_stall(self) -> None:
        """The peer has had answers waiting since the last check: cut it off if it took none
        of them (it holds the server's memory and reads nothing), else look again later."""
        self.stall_timer = None
        if self.lost or not self.write_paused:
            return
        buffered = self.transport.get_write_buffer_size()
        if buffered < self.stall_mark or self.closing:  # it takes them, slowly; or it is closing anyway
            self.stall_mark = buffered
            self.stall_timer = self.loop.call_later(self.host.config.send_timeout_s, self._check_stall)
            return
        log.warning(
            "closing %s: it took none of the %d bytes of answers waiting for it in %g s (send_timeout_s)",
            self.peer,
            buffered,
            self.host.config.send_timeout_s,
        )
        self.close()
        self.transport.abort()  # what it holds is freed now, not when it reads

    def _on_timer(self) -> None:
        self.timer = None
        if self.lost:
            return
        if self.closing:  # closed, but the peer does not take the last bytes: drop them
            self.transport.abort()
            return
        cfg = self.host.config
        if not self.handshaken:
            log.info("closing %s: no handshake in time", self.peer)
            self.close()
            return
        now = self.loop.time()
        if self.frame_since is not None and now - self.frame_since >= cfg.frame_timeout_s:
            why = f"a frame was not whole {cfg.frame_timeout_s:g} s after its first byte (frame_timeout_s)"
            _protocol_errors("closing %s: %s", self.peer, why)
            self.close(why)
            return
        left = self.last_data_s + cfg.idle_timeout_s - now
        if self.frame_since is not None:
            left = min(left, self.frame_since + cfg.frame_timeout_s - now)
        if left > 0:
            self.timer = self.loop.call_later(left, self._on_timer)
        elif self.held is not None and not self.write_paused:
            # it waits for the server's budget, not for the peer: that is not idleness
            self.timer = self.loop.call_later(cfg.idle_timeout_s, self._on_timer)
        else:
            log.info("closing %s: idle too long", self.peer)
            self.close()

    def _peer_closed(self) -> None:
        """The peer sent EOF: answers it may still read are finished briefly; parked long
        polls would only hold resources for nobody, so they are cancelled after that."""
        self.eof = True
        if not self.tasks:
            self.close()
        else:
            if self.timer is not None:
                self.timer.cancel()
            self.timer = self.loop.call_later(_EOF_LINGER_S, self.close)

    def close(self, why: str | None = None) -> None:
        """Write what is served, close (the transport sends what it holds first), cancel the
        tasks; a peer that does not take the last bytes is cut off after a while. ``why``:
        tell the peer first (an ERROR with request id 0, code 40: it may connect again)."""
        if self.closing:
            return
        if why is not None and self.handshaken and not self.lost:
            with contextlib.suppress(ProtocolError):
                self.out += self.conn.send_chunks(ErrorResponse.from_exception(0, UnavailableError(why)))
        self._flush()
        self.closing = True
        for t in self.tasks:
            t.cancel()
        if self.transport is not None:
            self.transport.close()
        if self.timer is not None:
            self.timer.cancel()
        self.timer = self.loop.call_later(CLOSE_LINGER_S, self._on_timer)
