"""BrokerServer: the broker behind TCP, speaking headwater.protocol over asyncio.

Each connection is an :class:`asyncio.Protocol`: bytes read go to the sans-IO
:class:`Connection`, and its requests are served right there, in the order they arrive. A
request that needs no wait (a produce with async flush, a fetch that finds data, a ping) is
answered inline, with no task; only one that must wait gets a task, so a connection can
pipeline many (responses go out as they finish, matched by id). Blocking broker calls (the
wait for the fsync of sync flush, admin operations that rewrite the catalog) run on a bounded
thread pool; a fetch that finds nothing waits up to its ``max_wait_ms`` for an append to that
partition (long polling). Produces are appended inline, so those of one connection reach the
log in the order it sent them. Fetch streams (:mod:`headwater.broker.streams`) and push
subscriptions (:mod:`headwater.broker.push`) send PUSH frames on the connection that opened
them, without a request per answer.

Every queue and buffer is bounded: requests in flight per connection, bytes of fetches in
flight per connection and in all, answers buffered for a peer that does not read them,
frame size, connections, and the time a connection may take to handshake or sit idle. When
a bound is reached the server stops reading that connection, and TCP pushes back on the
client; other connections are not affected.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import resource
import time
from collections.abc import Coroutine
from time import perf_counter
from typing import TYPE_CHECKING

from headwater._version import __version__
from headwater.broker.allocator import kept_bytes, memory_usage
from headwater.broker.append_waiters import AppendWaiters
from headwater.broker.broker import Broker
from headwater.broker.budget import ServerBudget
from headwater.broker.connection import CLOSE_LINGER_S, ClientConnection
from headwater.broker.delay import DelayTicket
from headwater.broker.durable_acks import DurableAcks
from headwater.broker.idle_spin import CountedExecutor, IdleSpin, transport_fd
from headwater.broker.log_limit import limited
from headwater.broker.long_polls import GroupLongPolls
from headwater.broker.push import PUSH_APIS, PushService
from headwater.broker.server_config import ServerConfig
from headwater.broker.shared import SharedWaiters
from headwater.broker.streams import FETCH_STREAM_APIS, FetchStreams
from headwater.errors import HeadwaterError, UnavailableError, UsageError
from headwater.model.batch import stated_payload_bytes
from headwater.model.service import FetchResult
from headwater.protocol import (
    ApiKey,
    ErrorResponse,
    FetchRequest,
    FetchResponse,
    HandoffDelayedResponse,
    ProduceResponse,
    ProtocolError,
    Request,
    Response,
    invoke,
)
from headwater.protocol.messages import (
    PingResponse,
    StatusResponse,
)

if TYPE_CHECKING:  # (prometheus-client is imported only when metrics are on)
    from headwater.broker.metrics import BrokerMetrics

__all__ = ["BrokerServer", "ServerConfig"]

log = logging.getLogger("headwater.server")

_PING = PingResponse()
# what a broker still joining its cluster answers (Broker.joining): its health, not its data
_WHILE_JOINING = frozenset({ApiKey.PING, ApiKey.STATUS, ApiKey.METRICS})
FETCH_BYTES_FLOOR = 64 * 1024  # a fetch short of memory reads what there is room for, but not less than this
_REFUSALS_LOG_EVERY_S = 10.0  # refused connections are logged at most once per this, with a count
INLINE_DECODE_BYTES = 1024 * 1024  # an append whose payload expands past this is decoded off the loop
FETCH_BUDGET_WAIT_S = 1.0  # the least a fetch waits for memory before an empty answer


class _ParkedFetch:
    """A fetch that found nothing, waiting without a task: an append to its partition (or
    its deadline) calls :meth:`wake`, which reads and answers right there, on the loop (the
    appending connection's turn), or parks it again. When the byte budget is short it
    falls back to a task that waits for it."""

    __slots__ = ("srv", "st", "ev", "deadline", "timer", "done", "started_s")

    def __init__(
        self, srv: BrokerServer, st: ClientConnection, ev: Request, deadline: float, started_s: float = 0.0
    ) -> None:
        self.srv, self.st, self.ev, self.deadline = srv, st, ev, deadline
        self.started_s = started_s  # perf_counter when the request was read (0: metrics off)
        self.timer: asyncio.TimerHandle | None = None
        self.done = False

    def wake(self) -> None:
        if not self.done:
            self.srv.unpark(self)

    def drop(self) -> None:
        """The connection is gone: forget the fetch, answer nothing."""
        self.done = True
        if self.timer is not None:
            self.timer.cancel()
        req = self.ev.body
        self.srv._waiters.discard(req.queue, req.partition, self)


class BrokerServer:
    """Serve a :class:`Broker` on TCP. ``await start()``, then ``await serve_until_stopped()``."""

    def __init__(self, broker: Broker, config: ServerConfig | None = None) -> None:
        self.broker = broker
        self.config = (config or ServerConfig()).validated()
        self._pool = CountedExecutor(self.config.worker_threads, thread_name_prefix="headwater-worker")
        # appends whose payload expands past INLINE_DECODE_BYTES: decoded off the event loop, two at a time
        self._decode_pool = CountedExecutor(2, thread_name_prefix="headwater-decode")
        self._server: asyncio.base_events.Server | None = None
        self._conns: set[ClientConnection] = set()
        self._closing = False
        self._stopping: asyncio.Event | None = None
        self._all_closed: asyncio.Future[None] | None = None  # set by stop(): the last one went
        self.loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]  # set by start(), before any use
        self._started = time.monotonic()
        self.requests = 0
        self.connections_total = 0
        self.port = self.config.port
        self._refusals = limited(log, logging.WARNING, _REFUSALS_LOG_EVERY_S)
        self._metrics = self._enable_metrics()
        self.idle_spin = IdleSpin(self.config.idle_spin_us, self._threads_busy)
        if self._metrics is not None:
            spin = self.idle_spin
            self._metrics.watch_idle_spin(lambda: (spin.spins, spin.hits))

    def _threads_busy(self) -> bool:
        """Whether requests' work runs on other threads now (the loop must not spin then)."""
        return bool(self._pool.busy or self._decode_pool.busy or self._acks.pending)  # spins only once started

    def _enable_metrics(self) -> BrokerMetrics | None:
        """The broker's metrics, fed by this server too (request latency and errors,
        connections); None when the ``metrics`` setting is off or prometheus-client is missing
        (METRICS then answers why, and the hot path pays nothing)."""
        if not self.config.metrics:
            self.broker.metrics_off_why = (
                "metrics are off on this broker (it runs with the setting metrics=false): restart it "
                "without --set metrics=false (or HEADWATER_METRICS=false) to keep them"
            )
            return None
        try:
            m = self.broker.enable_metrics()
        except UsageError as e:
            log.warning("%s", e)
            return None
        m.watch_connections(lambda: (len(self._conns), self.connections_total))
        return m

    async def start(self) -> int:
        """Listen; return the port (useful with port 0)."""
        loop = self.loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        self._waiters = AppendWaiters(loop)
        self.budget = ServerBudget(self.config.bytes_in_flight_max)
        self._acks = DurableAcks(loop, self.broker.wait_durable)
        self.broker.add_append_listener(self._waiters.notify)
        # the members written before a stop or a crash come back, and are written from now on
        self.broker.groups.keep_members(write=not self.broker.store.read_only)
        self.broker.groups.hold_grants_after_restart()  # members from before a restart may still read
        self._shared_waiters = SharedWaiters(loop)
        self.broker.shared.add_listener(self._shared_waiters.notify)
        self._long_polls = GroupLongPolls(
            self.broker, self._pool, self._waiters, self._shared_waiters, self.config, lambda: self._closing
        )
        # a connection's stream ids are unique among its subscriptions and fetch streams
        self._push = PushService(
            self.broker,
            self._pool,
            push_bytes_max=self.config.push_bytes_max,
            streams_per_connection_max=self.config.push_streams_max,
            taken=lambda st, sid: self._streams.has_stream(st, sid),
        )
        self._streams = FetchStreams(
            self.broker.store,
            self._waiters,
            push_bytes_max=self.config.push_bytes_max,
            streams_per_connection_max=self.config.push_streams_max,
            taken=self._push.has_stream,
        )
        if self._metrics is not None:
            self._streams.on_pushed = self._metrics.sent_batches
        _raise_fd_limit(self.config.connections_max + 256)
        self._server = await loop.create_server(
            lambda: ClientConnection(self),
            self.config.host,
            self.config.port,
            backlog=4096,
        )
        self.port = self._server.sockets[0].getsockname()[1]
        self.broker.advertised = (self.config.advertised_address, self.port)
        log.info("headwater %s serving %s on %s:%d", __version__, self.broker.store.path, self.config.host, self.port)
        return self.port

    @property
    def connections(self) -> frozenset[ClientConnection]:
        """The connections open now."""
        return frozenset(self._conns)

    # -- what a connection needs of its server (headwater.broker.connection.ConnectionHost)

    def admit(self, conn: ClientConnection) -> str | None:
        if self._closing:
            return "the broker is stopping"
        if len(self._conns) >= self.config.connections_max:
            why = f"the broker has {len(self._conns)} connections open, its limit (connections_max)"
            self.refused(conn.peer, why)
            return why
        self.connections_total += 1
        self._conns.add(conn)
        if self.idle_spin.enabled:
            self.idle_spin.watch(transport_fd(conn.transport), conn)
        return None

    def writable_again(self, conn: ClientConnection) -> None:
        if self._streams.has_streams(conn):  # fetch streams held back by this peer go on (not from inside a write)
            self.loop.call_soon(self._streams.resumed, conn)

    def connection_gone(self, conn: ClientConnection) -> None:
        self._conns.discard(conn)
        if self.idle_spin.enabled:
            self.idle_spin.forget(conn)
        self._push.connection_closed(conn)
        self._streams.connection_closed(conn)
        if self._all_closed is not None and not self._conns and not self._all_closed.done():
            self._all_closed.set_result(None)

    def refused(self, peer: str, why: str) -> None:
        """Log a refused connection: the first at once, then at most a line per
        ``_REFUSALS_LOG_EVERY_S`` with how many were refused meanwhile (a client retrying
        in a loop must not flood the log)."""
        self._refusals("refusing %s: %s", peer, why)

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
        busy = sum(len(c.tasks) + len(c.parked) for c in self._conns)
        log.info("stopping: %d connections, %d requests waiting; no new connections", len(self._conns), busy)
        self._streams.stop()  # each fetch stream's client hears why it ended
        self._waiters.wake_all()  # parked long polls answer now, with what there is
        self._shared_waiters.wake_all()
        await self._push.stop()  # each subscriber hears why its stream ended
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.shutdown_grace_s
        while (tasks := [t for c in self._conns for t in c.tasks]) and loop.time() < deadline:
            await asyncio.wait(tasks, timeout=deadline - loop.time())
        await self._acks.drain(max(0.1, deadline - loop.time()))
        await loop.run_in_executor(None, self._acks.stop)
        if self._conns:  # closing sends what is written; a peer that does not read is cut off
            self._all_closed = loop.create_future()
            for c in list(self._conns):
                c.close("the broker is stopping")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(CLOSE_LINGER_S + 1):
                    await self._all_closed
        for c in list(self._conns):
            c.transport.abort()
        stuck = [t for c in self._conns for t in c.tasks]
        if stuck:  # cancelled by close(); wait for them to unwind
            await asyncio.gather(*stuck, return_exceptions=True)
        await loop.run_in_executor(None, self._pool.shutdown, True)
        await loop.run_in_executor(None, self._decode_pool.shutdown, True)
        self.idle_spin.close()
        await loop.run_in_executor(None, self.broker.close)
        log.info("headwater stopped cleanly")

    # -- requests ------------------------------------------------------------------------

    def serve(self, st: ClientConnection, ev: Request) -> bool:
        """Serve a request read from ``st``: answer it now if it needs no wait, else start a
        task. False (nothing done) when the byte budget is short: serve it again later."""
        body = ev.body
        api = body.api
        m = self._metrics
        t0 = perf_counter() if m is not None else 0.0  # one pair per request: its latency
        try:
            if self.broker.joining is not None and api not in _WHILE_JOINING:
                raise UnavailableError(self.broker.joining)
            if api is ApiKey.PRODUCE:
                if st.off_loop is not None and st.off_loop[0] is ev:  # appended by a decode thread
                    if not st.off_loop[1].done():
                        return False  # still decoding: the connection stays paused
                    done, st.off_loop = st.off_loop[1], None
                    result, durable_at = done.result()
                elif (stated := stated_payload_bytes(body.batch)) is None or (
                    stated > INLINE_DECODE_BYTES and stated > len(body.batch)
                ):
                    # too dear to decode on the loop: a payload not stored as it came that says
                    # it expands past INLINE_DECODE_BYTES. A small compressed batch may expand
                    # to 64 MiB (a compression bomb): decoding that inline stalled every
                    # connection for a third of a second. (Tested inline: once per produce.)
                    self._append_off_loop(st, ev)
                    return False  # held, the connection paused: its later requests wait, in order
                elif st.frame_held:  # a big frame's bytes, reserved as it was read: the batch's now
                    n, st.frame_held = st.frame_held, 0
                    try:  # the append, inline: this is what keeps a connection's produces in order
                        result, durable_at = self.broker.produce_nowait(body.queue, body.partition, body.batch)
                    finally:
                        self.budget.release(st, n)  # appended: the batch is no longer held
                else:
                    # held only while it is appended, inline: it must fit the budgets, as if taken
                    if not self.budget.fits(st, len(body.batch)):
                        return False
                    result, durable_at = self.broker.produce_nowait(body.queue, body.partition, body.batch)
                if type(durable_at) is int:  # sync flush: answered once the fsync is done
                    self._acks.add(durable_at, functools.partial(self._answer_durable, st, ev, result, started_s=t0))
                    return True
                if durable_at is not None:  # a delayed batch: once its schedule is durable
                    self._spawn(st, ev, self._wait_durable(result, durable_at), t0)
                    return True
                answer: object = ProduceResponse.from_result(result)
            elif api is ApiKey.FETCH:
                if (answer := self._serve_fetch(st, ev, t0)) is None:
                    return True  # answered with its batches, parked, or waiting in a task
            elif api is ApiKey.PING:
                answer = _PING
            elif api in FETCH_STREAM_APIS:
                answer = self._streams.serve(st, body)
            elif api is ApiKey.COMMIT_OFFSETS and self.broker.offsets.answers_at_once(len(body.offsets)):
                # offsets_flush async, a broker alone, no compaction due: it waits for nothing, so no
                # hop to a worker thread (a commit round trip p50 146 -> 90 us)
                answer = invoke(self.broker, body)
            else:
                self._spawn(st, ev, self._serve_waiting(st, body), t0)
                return True
            chunks = st.conn.send_response(ev.request_id, answer)
        except Exception as e:  # noqa: BLE001 - answer, log, keep serving
            chunks = self._error_chunks(st, ev, e)
        self.requests += 1
        st.out += chunks
        if m is not None:
            m.request_done(api, t0)
        return True

    def _serve_fetch(self, st: ClientConnection, ev: Request, t0: float) -> FetchResponse | None:
        """Serve a FETCH on the loop: answer it with what it finds (its batches' bytes held
        until they are out), park it until an append, or wait for memory in a task (None);
        or return the empty answer for ``serve`` to send."""
        body = ev.body
        want = self._fetch_want(st, body)
        if not self.budget.answer_fits(st, want):
            # short of memory: it waits in a task, and the requests behind it are served
            self._spawn(st, ev, self._fetch_in_task(st, body, self.loop.time() + self._fetch_wait_s(body)), t0)
            return None
        self.budget.take_answer(st, want)
        res = self._read(st, body, want)
        if res.batches:
            held = self._hold_read(st, want, res)
            try:
                chunks = st.conn.send_chunks(Response(ev.request_id, FetchResponse.from_result(res)))
            except BaseException:
                self.budget.release_answer(st, held)
                raise
            self.requests += 1
            st.out += chunks
            st.unsent += held  # released once the answer is out
            if self._metrics is not None:
                self._metrics.request_done(ApiKey.FETCH, t0)
            return None
        self.budget.release_answer(st, want)
        if self._fetch_parks(body, res):
            self._park(st, ev, started_s=t0)
            return None
        return FetchResponse.from_result(res)

    def _append_off_loop(self, st: ClientConnection, ev: Request) -> None:
        """Append ``ev``'s batch in a decode thread; the connection serves nothing else
        until it is done (its produces stay in order), every other connection goes on."""
        body = ev.body
        fut = self.loop.run_in_executor(
            self._decode_pool, self.broker.produce_nowait, body.queue, body.partition, body.batch
        )
        st.off_loop = (ev, fut)
        fut.add_done_callback(lambda _f: st.wake())

    def _spawn(
        self, st: ClientConnection, ev: Request, work: Coroutine[object, object, object], started_s: float = 0.0
    ) -> None:
        task = self.loop.create_task(self._serve_task(st, ev, work, started_s))
        st.tasks.add(task)
        task.add_done_callback(st.task_done)
        # a task cancelled before its first step (its connection closed at once) never ran
        # _serve_task's finally: close the work there, or it is reported as never awaited
        task.add_done_callback(lambda _t: work.close())

    async def _serve_task(
        self, st: ClientConnection, ev: Request, work: Coroutine[object, object, object], started_s: float = 0.0
    ) -> None:
        """Await ``work`` (a response body, or a fetch's (body, budget bytes held)), answer;
        ``started_s``: when the request was read (perf_counter; 0: metrics off)."""
        self.requests += 1
        charge = 0
        try:
            try:
                result = await work
                if type(result) is tuple:
                    result, charge = result
                chunks = st.conn.send_chunks(Response(ev.request_id, result))
            except Exception as e:  # noqa: BLE001 - answer, log, keep serving
                chunks = self._error_chunks(st, ev, e)
            charge, held = 0, charge
            st.send(chunks, held)  # the budget held goes with the answer
            if started_s and self._metrics is not None:
                self._metrics.request_done(ev.body.api, started_s)
        except (ConnectionError, ProtocolError):
            pass
        finally:
            work.close()  # a task cancelled before its first step never started it
            if charge:
                self.budget.release_answer(st, charge)

    def _error_chunks(self, st: ClientConnection, ev: Request, e: Exception) -> list:
        if not isinstance(e, HeadwaterError):
            log.error("request %s from %s failed", ev.body.api.name, st.peer, exc_info=e)
            e = HeadwaterError(f"internal error in {ev.body.api.name}: {e}")
        if self._metrics is not None:
            self._metrics.request_failed(ev.body.api, e.code)
        return st.conn.send_chunks(ErrorResponse.from_exception(ev.request_id, e))

    async def _serve_waiting(self, st: ClientConnection, body: object) -> object:
        """The requests that wait (on a worker thread, a long poll, a push stream)."""
        api = body.api
        if api is ApiKey.STATUS:
            return StatusResponse.from_result(await self._status())
        if api is ApiKey.SHARED_RECEIVE:
            return await self._long_polls.shared_receive(body, st)
        if api is ApiKey.KEYED_FETCH:
            return await self._long_polls.keyed_fetch(body)
        if api in PUSH_APIS:
            return await self._push.handle(st, body)
        if api is ApiKey.HANDOFF_DELAYED:  # broker to broker: no client service has it
            page = await self.loop.run_in_executor(
                self._pool,
                self.broker.hand_off_delayed,
                body.queue,
                body.partition,
                body.leader_epoch,
                body.after,
                body.max_bytes,
                body.shared,
                body.groups,
            )
            return HandoffDelayedResponse(page)
        return await self.loop.run_in_executor(self._pool, invoke, self.broker, body)

    def _answer_durable(
        self, st: ClientConnection, ev: Request, result: object, error: BaseException | None, started_s: float = 0.0
    ) -> None:
        """A sync-flush produce's fsync is done (or failed): answer it (``started_s``: when
        it was read, perf_counter; 0: metrics off)."""
        self.requests += 1
        try:
            if error is None:
                chunks = st.conn.send_chunks(Response(ev.request_id, ProduceResponse.from_result(result)))
            else:
                chunks = self._error_chunks(
                    st, ev, error if isinstance(error, Exception) else HeadwaterError(f"fsync failed: {error!r}")
                )
            st.send(chunks)
            if started_s and self._metrics is not None:
                self._metrics.request_done(ApiKey.PRODUCE, started_s)
        except (ConnectionError, ProtocolError):
            pass  # the client is gone; the message is stored all the same

    async def _wait_durable(self, result: object, durable_at: DelayTicket) -> ProduceResponse:
        """A delayed batch under sync flush: wait on a worker thread until its schedule is
        durable."""
        await self.loop.run_in_executor(self._pool, self.broker.wait_durable, durable_at)
        return ProduceResponse.from_result(result)

    def _read(self, st: ClientConnection, req: FetchRequest, want: int) -> FetchResult:
        """Read for a fetch whose ``want`` bytes of budget are taken (given back if it fails)."""
        try:
            return self.broker.fetch(
                req.queue, req.partition, req.offset, max_bytes=want, tag_mask=req.tag_mask, end_offset=req.end_offset
            )
        except BaseException:
            self.budget.release_answer(st, want)
            raise

    def _fetch_want(self, st: ClientConnection, req: FetchRequest) -> int:
        """The most bytes a fetch may return: its ask, the server's cap, the peer's frame limit;
        and when the byte budgets are short, what they have left (at least
        ``FETCH_BYTES_FLOOR``): a fetch reads less rather than wait while there is room."""
        want = max(1, min(req.max_bytes, self.config.fetch_bytes_max, st.conn.peer_frame_bytes_max - 4096))
        room = self.budget.answer_room(st)
        if room < want:
            want = max(room, min(want, FETCH_BYTES_FLOOR))
        return want

    def _fetch_wait_s(self, req: FetchRequest) -> float:
        """How long a fetch may wait: its long poll, and at least ``FETCH_BUDGET_WAIT_S`` for
        the byte budgets to have room for it."""
        return max(min(req.max_wait_ms, self.config.fetch_wait_ms_max) / 1000, FETCH_BUDGET_WAIT_S)

    def _hold_read(self, st: ClientConnection, want: int, res: object) -> int:
        """The budget a read holds: the ``want`` taken becomes the size read (the store may go
        one batch past the ask; the excess is counted even above the limit, so the next
        request waits)."""
        size = sum(map(len, res.batches))  # memoryviews of bytes: len() is their size
        if size < want:
            self.budget.release_answer(st, want - size)
        elif size > want:
            self.budget.charge_answer(st, size - want)
        return size

    def _fetch_parks(self, req: FetchRequest, res: object) -> bool:
        """Whether a fetch that read nothing waits for an append (long polling)."""
        return not (
            res.settles(req.offset, req.end_offset)
            or min(req.max_wait_ms, self.config.fetch_wait_ms_max) <= 0
            or self._closing
        )

    def _park(self, st: ClientConnection, ev: Request, pf: _ParkedFetch | None = None, started_s: float = 0.0) -> None:
        """Park a fetch that found nothing until an append to its partition or its deadline."""
        req = ev.body
        loop = self.loop
        if pf is None:
            wait_s = min(req.max_wait_ms, self.config.fetch_wait_ms_max) / 1000
            pf = _ParkedFetch(self, st, ev, loop.time() + wait_s, started_s)
            st.parked.add(pf)
        pf.timer = loop.call_at(pf.deadline, pf.wake)
        self._waiters.park(req.queue, req.partition, req.offset, pf)
        # appends from other threads (delayed messages) notify only registered waiters: one
        # that landed between the read and the registration must not be missed
        if self.broker.store.end_offset(req.queue, req.partition) > req.offset:
            pf.wake()

    def unpark(self, pf: _ParkedFetch) -> None:
        """An append (or the deadline) woke a parked fetch: read and answer, or park again."""
        st, ev = pf.st, pf.ev
        req = ev.body
        pf.drop()
        st.parked.discard(pf)
        if st.lost or st.closing:
            return
        want = self._fetch_want(st, req)
        if not self.budget.answer_fits(st, want):
            self._spawn(st, ev, self._fetch_in_task(st, req, pf.deadline), pf.started_s)  # waits for budget
            return
        self.budget.take_answer(st, want)
        try:
            res = self._read(st, req, want)
            held = 0
            if res.batches:
                held = self._hold_read(st, want, res)
            else:
                self.budget.release_answer(st, want)
                if self.loop.time() < pf.deadline and self._fetch_parks(req, res):
                    pf.done = False
                    st.parked.add(pf)
                    self._park(st, ev, pf)
                    return
            try:
                chunks = st.conn.send_chunks(Response(ev.request_id, FetchResponse.from_result(res)))
            except BaseException:
                if held:
                    self.budget.release_answer(st, held)
                raise
        except Exception as e:  # noqa: BLE001 - answer, log, keep serving
            held, chunks = 0, self._error_chunks(st, ev, e)
        self.requests += 1
        try:
            st.send(chunks, held)  # the budget held goes with the answer
            if pf.started_s and self._metrics is not None:
                self._metrics.request_done(req.api, pf.started_s)
        except (ConnectionError, ProtocolError):
            pass

    async def _fetch_in_task(
        self, st: ClientConnection, req: FetchRequest, deadline: float
    ) -> tuple[FetchResponse, int] | FetchResponse:
        """A woken parked fetch whose read did not fit the byte budgets: wait for them in a
        task, read, and while nothing is there wait for an append until ``deadline`` (the
        parked fetch's, loop time).

        Returns the response, with the bytes it holds of the budgets when it holds any
        (released once the response is out)."""
        while True:
            want = self._fetch_want(st, req)
            try:
                async with asyncio.timeout_at(max(deadline, self.loop.time() + FETCH_BUDGET_WAIT_S)):
                    await self.budget.acquire_answer(st, want)
            except TimeoutError:  # no room all that time: an empty answer (read up to where it
                # starts, so nothing), with the partition's range; the client asks again
                return FetchResponse.from_result(
                    self.broker.fetch(
                        req.queue, req.partition, req.offset, max_bytes=1, tag_mask=req.tag_mask, end_offset=req.offset
                    )
                )
            res = self._read(st, req, want)
            if res.batches:
                return FetchResponse.from_result(res), self._hold_read(st, want, res)
            self.budget.release_answer(st, want)  # nothing read: hold nothing while parked
            if self.loop.time() >= deadline or not self._fetch_parks(req, res):
                return FetchResponse.from_result(res)
            fut = self._waiters.wait(req.queue, req.partition, req.offset)
            try:
                # check after registering: an append may have landed since the read
                if self.broker.store.end_offset(req.queue, req.partition) <= req.offset:
                    async with asyncio.timeout_at(deadline):
                        await fut
            except TimeoutError:
                pass
            finally:
                self._waiters.discard(req.queue, req.partition, fut)

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
            **self._streams.stats(),
            **memory_usage(),
            allocator_cache_bytes=kept_bytes(),
        )
        return status


def _raise_fd_limit(wanted: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
