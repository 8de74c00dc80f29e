"""BrokerServer: the broker behind TCP, speaking headwater.protocol over asyncio.

One task reads each connection and turns frames into requests; each request runs as its own
task, so a connection can pipeline many (responses go out as they finish, matched by id).
Blocking broker calls (appends that wait for fsync, admin operations that rewrite the
catalog) run on a bounded thread pool; fetches run on the event loop, and a fetch that finds
nothing waits up to its ``max_wait_ms`` for an append to that partition (long polling).

Every queue and buffer is bounded: requests in flight per connection, bytes of fetches in
flight per connection, frame size, connections, and the time a connection may take to
handshake or sit idle. When a bound is reached the server stops reading that connection,
and TCP pushes back on the client; other connections are not affected.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import resource
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import msgspec

from headwater._version import __version__
from headwater.broker.broker import Broker
from headwater.broker.push import PUSH_APIS, PushService
from headwater.errors import HeadwaterError, InvalidArgumentError
from headwater.protocol import (
    NEED_DATA,
    SERVER,
    ApiKey,
    Connection,
    ConnectionClosed,
    ErrorResponse,
    FetchRequest,
    FetchResponse,
    Handshake,
    ProduceRequest,
    ProduceResponse,
    HandshakeAccepted,
    ProtocolError,
    RemoteProtocolError,
    Request,
    Response,
    UnsupportedVersionError,
    choose_version,
    invoke,
)
from headwater.broker.shared import SharedWaiters
from headwater.protocol.messages import KeyedFetchRequest, KeyedFetchResponse
from headwater.protocol.messages import SharedReceiveRequest, SharedReceiveResponse, StatusResponse

__all__ = ["BrokerServer", "ServerConfig"]

log = logging.getLogger("headwater.server")


class ServerConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Settings of the network server (flags, environment HEADWATER_*, or a TOML file)."""

    host: str = "127.0.0.1"
    port: int = 7070
    connections_max: int = 20_000
    requests_in_flight_max: int = 256  # per connection
    connection_bytes_in_flight_max: int = 64 * 1024 * 1024  # requests + responses, per connection
    bytes_in_flight_max: int = 512 * 1024 * 1024  # the same, for the whole server
    fetch_bytes_max: int = 16 * 1024 * 1024  # one fetch response
    fetch_wait_ms_max: int = 30_000
    frame_bytes_max: int = 64 * 1024 * 1024 + 64 * 1024
    handshake_timeout_s: float = 10.0
    idle_timeout_s: float = 600.0
    worker_threads: int = 32
    read_bytes: int = 256 * 1024
    shutdown_grace_s: float = 10.0
    push_bytes_max: int = 1024 * 1024  # one PUSH frame of a subscription stream
    push_streams_max: int = 64  # subscription streams per connection

    def validated(self) -> ServerConfig:
        for name in ("connections_max", "requests_in_flight_max", "connection_bytes_in_flight_max",
                     "bytes_in_flight_max",
                     "fetch_bytes_max", "frame_bytes_max", "worker_threads", "read_bytes"):
            if getattr(self, name) < 1:
                raise InvalidArgumentError(f"{name} must be at least 1")
        if not 0 <= self.port <= 65535:
            raise InvalidArgumentError(f"port must be from 0 to 65535, got {self.port}")
        return self


class _PartitionWaiters:
    """Fetches parked until their partition grows past an offset (long polling).

    ``notify`` is called from the threads that append; it only crosses into the event loop
    when someone waits on that partition, so appends nobody waits for cost a dict lookup.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._loop_thread = threading.get_ident()  # created on the loop's thread
        self._waiting: dict[tuple[str, int], list[tuple[int, asyncio.Future[None]]]] = {}

    def wait(self, queue: str, partition: int, offset: int) -> asyncio.Future[None]:
        fut = self._loop.create_future()
        self._waiting.setdefault((queue, partition), []).append((offset, fut))
        return fut

    def discard(self, queue: str, partition: int, fut: asyncio.Future[None]) -> None:
        lst = self._waiting.get((queue, partition))
        if lst:
            lst[:] = [(o, f) for o, f in lst if f is not fut]
            if not lst:
                del self._waiting[(queue, partition)]

    def wake_all(self) -> None:
        """Answer every parked fetch now (the server is stopping)."""
        for lst in self._waiting.values():
            for _, fut in lst:
                if not fut.done():
                    fut.set_result(None)
        self._waiting.clear()

    def notify(self, queue: str, partition: int, end_offset: int) -> None:
        if (queue, partition) in self._waiting:
            if threading.get_ident() == self._loop_thread:  # appended on the loop: wake now
                self._wake(queue, partition, end_offset)
            else:
                self._loop.call_soon_threadsafe(self._wake, queue, partition, end_offset)

    def _wake(self, queue: str, partition: int, end_offset: int) -> None:
        lst = self._waiting.get((queue, partition))
        if not lst:
            return
        keep = []
        for offset, fut in lst:
            if end_offset > offset:
                if not fut.done():
                    fut.set_result(None)
            else:
                keep.append((offset, fut))
        if keep:
            lst[:] = keep
        else:
            del self._waiting[(queue, partition)]


class _ByteBudget:
    """Bytes in flight, bounded: ``acquire`` waits until they fit (one oversized request is
    let through alone, so nothing waits forever)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._cond = asyncio.Condition()

    async def acquire(self, n: int) -> None:
        async with self._cond:
            await self._cond.wait_for(lambda: self.used + n <= self.limit or self.used == 0)
            self.used += n

    async def release(self, n: int) -> None:
        async with self._cond:
            self.used -= n
            self._cond.notify_all()


class _ConnState:
    __slots__ = ("conn", "writer", "peer", "slots", "budget", "tasks", "write_lock")

    def __init__(self, conn: Connection, writer: asyncio.StreamWriter, peer: str, slots: int) -> None:
        self.conn = conn
        self.writer = writer
        self.peer = peer
        self.slots = asyncio.Semaphore(slots)
        self.budget: _ByteBudget | None = None  # produce batches and fetch responses in flight
        self.tasks: set[asyncio.Task] = set()
        # one response is written (and drained) at a time, so a client that stops reading
        # holds at most the responses in flight, never an unbounded transport buffer
        self.write_lock = asyncio.Lock()


class BrokerServer:
    """Serve a :class:`Broker` on TCP. ``await start()``, then ``await serve_until_stopped()``."""

    def __init__(self, broker: Broker, config: ServerConfig | None = None) -> None:
        self.broker = broker
        self.config = (config or ServerConfig()).validated()
        self._pool = ThreadPoolExecutor(self.config.worker_threads, thread_name_prefix="headwater-worker")
        self._server: asyncio.base_events.Server | None = None
        self._conns: set[_ConnState] = set()
        self._handlers: set[asyncio.Task] = set()
        self._closing = False
        self._stopping: asyncio.Event | None = None
        self._started = time.monotonic()
        self.requests = 0
        self.connections_total = 0
        self.port = self.config.port

    async def start(self) -> int:
        """Listen; return the port (useful with port 0)."""
        loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        self._waiters = _PartitionWaiters(loop)
        self._budget = _ByteBudget(self.config.bytes_in_flight_max)
        self.broker.add_append_listener(self._waiters.notify)
        self.broker.groups.hold_grants_after_restart()  # members from before a restart may still read
        self._shared_waiters = SharedWaiters(loop)
        self.broker.shared.add_listener(self._shared_waiters.notify)
        self._push = PushService(self.broker, self._pool, push_bytes_max=self.config.push_bytes_max,
                                 streams_per_connection_max=self.config.push_streams_max)
        _raise_fd_limit(self.config.connections_max + 256)
        self._server = await asyncio.start_server(
            self._handle, self.config.host, self.config.port, limit=self.config.read_bytes,
            backlog=4096,
        )
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("headwater %s serving %s on %s:%d", __version__, self.broker.store.path,
                 self.config.host, self.port)
        return self.port

    def request_stop(self) -> None:
        """Begin a graceful stop (safe to call from a signal handler in the loop)."""
        if self._stopping is not None:
            self._stopping.set()

    async def serve_until_stopped(self) -> None:
        assert self._stopping is not None, "start() first"
        await self._stopping.wait()
        await self.stop()

    async def stop(self) -> None:
        """Stop accepting, let in-flight requests finish (up to the grace), close, flush."""
        if self._server is not None:
            self._server.close()
            self._server = None
        self._closing = True
        self._waiters.wake_all()  # parked long polls answer now, with what there is
        self._shared_waiters.wake_all()
        await self._push.stop()  # each subscriber hears why its stream ended
        tasks = [t for c in self._conns for t in c.tasks]
        if tasks:
            await asyncio.wait(tasks, timeout=self.config.shutdown_grace_s)
        for c in list(self._conns):
            c.writer.close()
        # whatever is still stuck (a client that stopped reading) is cancelled, not abandoned
        stuck = [t for t in self._handlers if not t.done()] + [t for c in self._conns for t in c.tasks]
        for t in stuck:
            t.cancel()
        if stuck:
            await asyncio.gather(*stuck, return_exceptions=True)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self._pool.shutdown, True)
        await loop.run_in_executor(None, self.broker.close)
        log.info("headwater stopped cleanly")

    # -- connections ------------------------------------------------------------------

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = "%s:%s" % (writer.get_extra_info("peername") or ("?", "?"))[:2]
        if len(self._conns) >= self.config.connections_max:
            log.warning("refusing %s: %d connections open (connections_max)", peer, len(self._conns))
            writer.close()
            return
        self.connections_total += 1
        me = asyncio.current_task()
        if me is not None:
            self._handlers.add(me)
            me.add_done_callback(self._handlers.discard)
        cfg = self.config
        conn = Connection(SERVER, frame_bytes_max=cfg.frame_bytes_max,
                          requests_in_flight_max=cfg.requests_in_flight_max)
        st = _ConnState(conn, writer, peer, cfg.requests_in_flight_max)
        st.budget = _ByteBudget(cfg.connection_bytes_in_flight_max)
        self._conns.add(st)
        try:
            await self._read_loop(st, reader)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except Exception:  # noqa: BLE001 - a bug must not take the server down
            log.exception("connection %s failed", peer)
        finally:
            self._conns.discard(st)
            self._push.connection_closed(st)
            for t in list(st.tasks):
                t.cancel()
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _read_loop(self, st: _ConnState, reader: asyncio.StreamReader) -> None:
        conn, cfg = st.conn, self.config
        handshaken = False
        while True:
            try:
                ev = conn.next_event()
            except ProtocolError as e:
                log.warning("closing %s: %s", st.peer, e)
                with contextlib.suppress(ProtocolError):
                    st.writer.write(conn.send(ErrorResponse.from_exception(0, e)))
                return
            if ev is NEED_DATA:
                timeout = cfg.idle_timeout_s if handshaken else cfg.handshake_timeout_s
                try:
                    async with asyncio.timeout(timeout):  # no extra task per read, unlike wait_for
                        data = await reader.read(cfg.read_bytes)
                except TimeoutError:
                    log.info("closing %s: %s", st.peer,
                             "idle too long" if handshaken else "no handshake in time")
                    return
                conn.receive_data(data)
                continue
            if isinstance(ev, Handshake):
                try:
                    version = choose_version(ev)
                except UnsupportedVersionError as e:
                    st.writer.write(conn.send(ErrorResponse.from_exception(0, e)))
                    log.warning("closing %s: %s", st.peer, e)
                    return
                st.writer.write(conn.send(HandshakeAccepted(version, f"headwater/{__version__}")))
                handshaken = True
            elif isinstance(ev, Request):
                await st.slots.acquire()  # bound on requests in flight: stop reading when full
                cost = self._cost(st, ev.body)
                if cost:  # bytes of batches and responses in flight: per connection, then in all
                    await st.budget.acquire(cost)
                    await self._budget.acquire(cost)
                task = asyncio.create_task(self._serve_request(st, ev, cost))
                st.tasks.add(task)
                task.add_done_callback(st.tasks.discard)
            elif isinstance(ev, ConnectionClosed):
                # the peer is gone: answers it may still read are finished briefly; parked
                # long polls would only hold resources for nobody, so they are cancelled
                if st.tasks:
                    await asyncio.wait(list(st.tasks), timeout=1.0)
                return
            else:
                return

    async def _serve_request(self, st: _ConnState, ev: Request, cost: int = 0) -> None:
        self.requests += 1
        body = ev.body
        try:
            try:
                if body.api is ApiKey.FETCH:
                    result, cost = await self._fetch(st, body)
                elif body.api is ApiKey.STATUS:
                    result = StatusResponse.from_result(await self._status())
                elif body.api is ApiKey.SHARED_RECEIVE:
                    result = await self._shared_receive(body)
                elif body.api is ApiKey.KEYED_FETCH:
                    result = await self._keyed_fetch(body)
                elif body.api in PUSH_APIS:
                    result = await self._push.handle(st, body)
                elif body.api is ApiKey.PRODUCE:
                    result = await self._produce(body)
                else:
                    loop = asyncio.get_running_loop()
                    result = await loop.run_in_executor(self._pool, invoke, self.broker, body)
                out = st.conn.send_chunks(Response(ev.request_id, result))
            except HeadwaterError as e:
                out = st.conn.send_chunks(ErrorResponse.from_exception(ev.request_id, e))
            except Exception as e:  # noqa: BLE001 - answer, log, keep serving
                log.exception("request %s from %s failed", body.api.name, st.peer)
                err = HeadwaterError(f"internal error in {body.api.name}: {e}")
                out = st.conn.send_chunks(ErrorResponse.from_exception(ev.request_id, err))
            async with st.write_lock:
                st.writer.writelines(out)
                await st.writer.drain()
        except (ConnectionError, ProtocolError):
            pass
        finally:
            if cost:
                await self._release(st, cost)
            st.slots.release()

    async def _produce(self, req: ProduceRequest) -> ProduceResponse:
        """Append on the event loop (a validation and a pwritev: short, never waits on the
        disk); only the wait for the fsync of sync flush goes to a worker thread, where
        concurrent appends share one fsync."""
        result, durable_at = self.broker.produce_nowait(req.queue, req.partition, req.batch)
        if durable_at is not None:
            await asyncio.get_running_loop().run_in_executor(self._pool, self.broker.wait_durable, durable_at)
        return ProduceResponse.from_result(result)

    def _fetch_want(self, st: _ConnState, req: FetchRequest) -> int:
        """The most bytes a fetch may return: its ask, the server's cap, the peer's frame limit."""
        return max(1, min(req.max_bytes, self.config.fetch_bytes_max, st.conn.peer_frame_bytes_max - 4096))

    def _cost(self, st: _ConnState, body: object) -> int:
        """Bytes a request holds from the moment it is read: a produced batch. (A fetch
        reserves its response's bytes only while it reads; a parked long poll holds none.)"""
        if isinstance(body, ProduceRequest):
            return len(body.batch)
        return 0

    async def _fetch(self, st: _ConnState, req: FetchRequest) -> tuple[FetchResponse, int]:
        """Fetch; when nothing is there, park until an append or ``max_wait_ms`` passes.

        Returns the response and the bytes it holds of the budgets (released by the caller
        once the response is written)."""
        want = self._fetch_want(st, req)
        deadline = time.monotonic() + min(req.max_wait_ms, self.config.fetch_wait_ms_max) / 1000
        while True:
            await st.budget.acquire(want)
            await self._budget.acquire(want)
            try:
                res = self.broker.fetch(req.queue, req.partition, req.offset, max_bytes=want,
                                        tag_mask=req.tag_mask, end_offset=req.end_offset)
            except BaseException:
                await self._release(st, want)
                raise
            remaining = deadline - time.monotonic()
            if res.batches:
                return FetchResponse.from_result(res), want
            await self._release(st, want)  # nothing read: hold nothing while parked
            if res.next_offset != req.offset or remaining <= 0 or self._closing or (
                req.end_offset is not None and req.offset >= req.end_offset
            ):
                return FetchResponse.from_result(res), 0
            fut = self._waiters.wait(req.queue, req.partition, req.offset)
            try:
                # re-check after registering: an append may have landed in between
                if self.broker.store.end_offset(req.queue, req.partition) > req.offset:
                    continue
                await asyncio.wait_for(fut, remaining)
            except asyncio.TimeoutError:
                pass
            finally:
                self._waiters.discard(req.queue, req.partition, fut)

    async def _release(self, st: _ConnState, n: int) -> None:
        await st.budget.release(n)
        await self._budget.release(n)

    async def _keyed_fetch(self, req: KeyedFetchRequest) -> KeyedFetchResponse:
        """A keyed member's fetch (filtering runs in a worker); when nothing is there, park on
        the loop until an append to the partition or ``max_wait_ms`` passes."""
        loop = asyncio.get_running_loop()
        deadline = time.monotonic() + min(max(req.max_wait_ms, 0), self.config.fetch_wait_ms_max) / 1000
        want = max(1, min(req.max_bytes, self.config.fetch_bytes_max))
        while True:
            fut = self._waiters.wait(req.queue, req.partition, req.offset)  # before reading: no lost wake
            try:
                res = await loop.run_in_executor(
                    self._pool, functools.partial(
                        self.broker.keyed_fetch, req.queue, req.group, req.member, req.generation,
                        req.partition, req.offset, max_bytes=want))
                remaining = deadline - time.monotonic()
                if res.batches or res.next_offset != req.offset or remaining <= 0 or self._closing or (
                    res.stop_offset is not None and req.offset >= res.stop_offset
                ):
                    return KeyedFetchResponse.from_result(res)
                try:
                    await asyncio.wait_for(fut, remaining)
                except asyncio.TimeoutError:
                    pass
            finally:
                self._waiters.discard(req.queue, req.partition, fut)

    async def _shared_receive(self, req: SharedReceiveRequest) -> SharedReceiveResponse:
        """A shared receive; when nothing can be leased, park on the loop (no thread held)
        until an append or an ack on the queue, a lease expiry or backoff end, or
        ``max_wait_ms``."""
        loop = asyncio.get_running_loop()
        deadline = time.monotonic() + min(max(req.max_wait_ms, 0), self.config.fetch_wait_ms_max) / 1000
        while True:
            woken = self._shared_waiters.wait(req.queue)  # before trying: a change in between wakes it
            try:
                res, hint_ms = await loop.run_in_executor(
                    self._pool, self.broker.shared_receive_now, req.group, req.queue, req.member,
                    req.max_messages, req.visibility_timeout_ms, req.at_most_once, req.settings)
                remaining = deadline - time.monotonic()
                if res.leases or remaining <= 0 or self._closing:
                    return SharedReceiveResponse.from_result(res)
                timeout = remaining if hint_ms is None else min(remaining, hint_ms / 1000)
                try:
                    await asyncio.wait_for(woken, timeout)
                except asyncio.TimeoutError:
                    pass
            finally:
                self._shared_waiters.discard(req.queue, woken)

    async def _status(self) -> dict[str, object]:
        loop = asyncio.get_running_loop()
        status = await loop.run_in_executor(self._pool, self.broker.status)
        status.update(
            mode="server",
            address=f"{self.config.host}:{self.port}",
            uptime_s=round(time.monotonic() - self._started, 3),
            connections=len(self._conns),
            connections_total=self.connections_total,
            requests_total=self.requests,
            **self._push.stats(),
        )
        return status


def _raise_fd_limit(wanted: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
