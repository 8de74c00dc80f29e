"""How :class:`~headwater.client.transport.async_transport.AsyncTransport` connects, reconnects
with backoff, shakes hands, and drops a connection (failing what was written to it or
waited for it, and ending its push streams). All of it runs on the transport's loop."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import math
import random
import socket
import threading
import time
from collections.abc import Callable

from headwater.client.transport.link import DEADLINE_SWEEP_S, _Call, _deliver, _describe, _fail, _Link
from headwater.errors import ClosedError, UnavailableError
from headwater.protocol import (
    NEED_DATA,
    ConnectionClosed,
    ErrorResponse,
    Handshake,
    HandshakeAccepted,
    ProtocolError,
    RemoteProtocolError,
)
from headwater.protocol.messages import PushBody

__all__ = ["Connecting"]

log = logging.getLogger("headwater.client")


class Connecting:
    """Connecting and dropping, a part of ``AsyncTransport`` (its state is set up in
    ``AsyncTransport.__init__``)."""

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
