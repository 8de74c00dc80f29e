"""The network transport: one TCP connection speaking headwater.protocol, pipelined.

:class:`AsyncTransport` is the asyncio core: ``await call(body)`` sends a request and waits
for the response with the same id, while any number of other calls are in flight on the
same connection. A lost connection fails every call in flight with
:class:`~headwater.errors.UnavailableError` (retriable); the next call reconnects, with
backoff, until ``connect_timeout_s`` passes.

PUSH frames (deliveries of a push subscription's stream) are routed by their stream id to
the handler registered with :meth:`AsyncTransport.register_push`, called on the loop (keep
it quick: hand the body to another thread). When the connection is lost, every handler is
called once with None and dropped: the streams died with the connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable
from typing import Any

from headwater._version import __version__
from headwater.errors import InvalidArgumentError, UnavailableError
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
    Request,
    Response,
)
from headwater.protocol.messages import PushBody, RequestBody

__all__ = ["AsyncTransport", "parse_address"]

log = logging.getLogger("headwater.client")


def parse_address(address: str) -> tuple[str, int]:
    """``"host:port"`` (or ``"port"``) to a (host, port) pair, with a clear error."""
    if not isinstance(address, str) or not address:
        raise InvalidArgumentError(f"a server address is 'host:port', got {address!r}")
    host, sep, port = address.rpartition(":")
    if not sep:
        host, port = "127.0.0.1", address
    host = host.strip("[]") or "127.0.0.1"
    try:
        p = int(port)
    except ValueError:
        raise InvalidArgumentError(f"{address!r} is not 'host:port': the port must be a number") from None
    if not 0 < p < 65536:
        raise InvalidArgumentError(f"{address!r}: the port must be from 1 to 65535")
    return host, p


class AsyncTransport:
    """A pipelined connection to one broker. Use from one event loop."""

    def __init__(self, address: str, *, client_name: str = f"headwater-python/{__version__}",
                 connect_timeout_s: float = 10.0, request_timeout_s: float = 60.0,
                 read_bytes: int = 256 * 1024) -> None:
        self.host, self.port = parse_address(address)
        self.address = f"{self.host}:{self.port}"
        self.client_name = client_name
        self.connect_timeout_s = connect_timeout_s
        self.request_timeout_s = request_timeout_s
        self._read_bytes = read_bytes
        self._conn: Connection | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task | None = None
        self._pending: dict[int, asyncio.Future] = {}
        self._connecting: asyncio.Lock | None = None
        self._slots: asyncio.Semaphore | None = None
        self._closed = False
        self.server_name = ""
        self._push_handlers: dict[int, Callable[[PushBody | None], None]] = {}
        self._next_stream_id = 1

    async def _ensure_connected(self) -> Connection:
        if self._conn is not None:
            return self._conn
        if self._closed:
            from headwater.errors import ClosedError

            raise ClosedError(f"the client of {self.address} is closed")
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:
            if self._conn is not None:
                return self._conn
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self.connect_timeout_s
            delay = 0.05
            while True:
                try:
                    return await asyncio.wait_for(self._connect_once(), max(0.01, deadline - loop.time()))
                except (OSError, asyncio.TimeoutError, UnavailableError) as e:
                    if loop.time() + delay >= deadline:
                        raise UnavailableError(
                            f"cannot reach the broker at {self.address} ({_describe(e)}); is "
                            f"'headwater serve' running there?"
                        ) from e
                    await asyncio.sleep(delay * (0.5 + random.random()))
                    delay = min(delay * 2, 1.0)

    async def _connect_once(self) -> Connection:
        reader, writer = await asyncio.open_connection(self.host, self.port, limit=self._read_bytes)
        conn = Connection(CLIENT)
        writer.write(conn.send(Handshake(self.client_name)))
        while True:
            ev = conn.next_event()
            if ev is NEED_DATA:
                data = await reader.read(self._read_bytes)
                if not data:
                    writer.close()
                    raise UnavailableError("the broker closed the connection during the handshake")
                conn.receive_data(data)
                continue
            if isinstance(ev, HandshakeAccepted):
                self.server_name = ev.server_name
                break
            writer.close()
            if isinstance(ev, ErrorResponse):
                raise ev.exception()
            raise UnavailableError(f"unexpected answer to the handshake: {ev!r}")
        self._conn, self._writer = conn, writer
        self._reader_task = asyncio.create_task(self._read_loop(conn, reader))
        return conn

    async def _read_loop(self, conn: Connection, reader: asyncio.StreamReader) -> None:
        why: BaseException = UnavailableError(f"the connection to {self.address} was lost")
        try:
            while True:
                ev = conn.next_event()
                if ev is NEED_DATA:
                    data = await reader.read(self._read_bytes)
                    conn.receive_data(data)
                    continue
                if isinstance(ev, Response):
                    fut = self._pending.pop(ev.request_id, None)
                    if fut is not None and not fut.done():
                        fut.set_result(ev.result())
                elif isinstance(ev, ErrorResponse):
                    fut = self._pending.pop(ev.request_id, None)
                    if fut is not None and not fut.done():
                        fut.set_exception(ev.exception())
                    elif ev.request_id == 0:
                        why = UnavailableError(f"the broker closed the connection: {ev.message}")
                        break
                elif isinstance(ev, Push):
                    handler = self._push_handlers.get(getattr(ev.body, "subscription_id", 0))
                    if handler is not None:  # else: a stream closed here, a push already in flight
                        handler(ev.body)
                elif isinstance(ev, ConnectionClosed):
                    break
        except ProtocolError as e:
            why = UnavailableError(f"protocol error from {self.address}: {e}")
            log.warning("%s", why)
        except (ConnectionError, OSError) as e:
            why = UnavailableError(f"the connection to {self.address} was lost: {e}")
        except asyncio.CancelledError:
            why = UnavailableError(f"the client of {self.address} was closed")
        finally:
            self._drop(conn, why)

    def _drop(self, conn: Connection, why: BaseException) -> None:
        if self._conn is conn:
            self._conn = None
            if self._writer is not None:
                self._writer.close()
                self._writer = None
        pending, self._pending = self._pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(why)
        if self._conn is None:  # not when a newer connection already carries new streams
            handlers, self._push_handlers = self._push_handlers, {}
            for handler in handlers.values():
                handler(None)

    def register_push(self, handler: Callable[[PushBody | None], None]) -> int:
        """A new stream id whose PUSH frames go to ``handler`` (None: the connection was lost)."""
        sid = self._next_stream_id
        while sid in self._push_handlers:
            sid = sid % (2**32 - 1) + 1
        self._next_stream_id = sid % (2**32 - 1) + 1
        self._push_handlers[sid] = handler
        return sid

    def unregister_push(self, stream_id: int) -> None:
        self._push_handlers.pop(stream_id, None)

    async def call(self, body: RequestBody, *, timeout_s: float | None = None) -> Any:
        """Send one request and return its result (raises the broker's error, if any).

        Past ``requests_in_flight_max`` calls in flight, a call waits for a free slot."""
        if self._slots is None:
            self._slots = asyncio.Semaphore(Connection(CLIENT).requests_in_flight_max)
        async with self._slots:
            return await self._call(body, timeout_s)

    async def _call(self, body: RequestBody, timeout_s: float | None) -> Any:
        conn = await self._ensure_connected()
        rid = conn.next_request_id()
        try:
            chunks = conn.send_chunks(Request(rid, body))
        except LocalProtocolError as e:  # an argument of the wrong type: the caller's mistake
            raise InvalidArgumentError(f"{body.api.name.lower()}: {e}") from e
        fut = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        writer = self._writer
        assert writer is not None
        writer.writelines(chunks)
        try:
            await writer.drain()
            return await asyncio.wait_for(fut, timeout_s or self.request_timeout_s)
        except asyncio.TimeoutError:
            self._pending.pop(rid, None)
            raise UnavailableError(
                f"{body.api.name} to {self.address} got no answer in {timeout_s or self.request_timeout_s} s"
            ) from None
        except (ConnectionError, OSError) as e:
            self._drop(conn, UnavailableError(f"the connection to {self.address} was lost: {e}"))
            raise UnavailableError(f"the connection to {self.address} was lost: {e}") from e

    async def close(self) -> None:
        self._closed = True
        if self._reader_task is not None:
            self._reader_task.cancel()
            with contextlib.suppress(BaseException):
                await self._reader_task
        if self._writer is not None:
            self._writer.close()


def _describe(e: BaseException) -> str:
    if isinstance(e, asyncio.TimeoutError):
        return "timed out"
    return str(e) or type(e).__name__
