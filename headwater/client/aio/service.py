"""The broker's operations, awaitable: what the asyncio client talks to.

:class:`AsyncBrokerService` is :class:`~headwater.model.service.BrokerService` with every
method a coroutine (same names, same arguments, same results). Two implementations:

- :class:`AsyncService`: a broker across the network, over one pipelined
  :class:`~headwater.client.transport.async_transport.AsyncTransport` (``headwater.aio.connect``). It is
  :class:`~headwater.client.transport.remote.RemoteService`, awaitable: the same generated methods
  and stream calls, and a call is sent again by the same rules
  (:class:`~headwater.client.transport.remote.Tries`, told in that module).
- :class:`ThreadedService`: a synchronous service in this process (the embedded broker of
  ``headwater.aio.open``). Its calls may block on fsync, so each runs in a thread
  (``asyncio.to_thread``); the event loop never blocks. A long-polling fetch does not park a
  thread: it waits on the loop for an append notification, as the network server does.

Both are used from one event loop.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from headwater.client.transport.async_transport import AsyncTransport, Sink
from headwater.client.transport.remote import (
    StreamCalls,
    Tries,
    answer_timeout_s,
    call_arguments,
    check_arguments,
    define_calls,
    takes_request,
)
from headwater.errors import ClosedError, UnavailableError
from headwater.model.keyed import KeyedFetchResult
from headwater.model.service import BrokerService, FetchResult, PushHandler, PushStreamSpec
from headwater.model.shared import SharedDeliveries
from headwater.model.subscription import SubscriberInfo
from headwater.protocol import messages as m

__all__ = ["AsyncBrokerService", "AsyncService", "ThreadedService"]

#: How long one blocking fetch may hold a thread when the service cannot notify appends.
FETCH_WAIT_SLICE_MS = 100


class AsyncBrokerService(Protocol):
    """:class:`~headwater.model.service.BrokerService`, awaitable: every one of its methods,
    with the same name, arguments and result, is a coroutine here (and ``ping()`` besides).

    Declared by reference rather than signature by signature: a second copy of some 40
    signatures would drift from the one the broker implements. Both implementations take
    theirs from BrokerService (:func:`~headwater.client.transport.remote.define_calls`), and
    a test holds them to it. To a type checker, each attribute is an awaitable callable."""

    if TYPE_CHECKING:  # only for type checkers: at run time a missing name must stay missing

        def __getattr__(self, name: str) -> Callable[..., Awaitable[Any]]: ...


@define_calls("_call")
class AsyncService(StreamCalls, AsyncBrokerService):
    """A broker over TCP, awaitable. ``retries``: how often a call that lost its connection
    may be sent again within its ``request_timeout_s`` (the transport reconnects, with
    backoff); see :mod:`headwater.client.transport.remote` for which calls, and when.

    Each AsyncBrokerService method not written out here is made from its operation's entry
    in ``API_SPECS`` (:func:`~headwater.client.transport.remote.define_calls`)."""

    def __init__(self, transport: AsyncTransport, *, retries: int = 3) -> None:
        self.transport = transport
        self.address = transport.address
        self._retries = retries
        self._closed = False

    _pushes_any_thread = False

    def _new_future(self) -> asyncio.Future[Any]:
        return asyncio.get_running_loop().create_future()

    async def _call(self, body: m.RequestBody) -> Any:
        """Send ``body`` and await its answer, within ``request_timeout_s`` (a long poll: plus
        its ``max_wait_ms``) in all, sending it again as
        :class:`~headwater.client.transport.remote.Tries` allows (as ``RemoteService`` does)."""
        check_arguments(body)
        tries = Tries(self.transport, body, retries=self._retries)
        loop = asyncio.get_running_loop()
        while True:
            fut = loop.create_future()
            sent = self.transport.submit(body, fut, tries.next_timeout_s())
            try:
                return await fut
            except UnavailableError as e:
                tries.again(e, sent.written, self._closed)

    def _submit(self, body: m.RequestBody, timeout_s: float | None = None) -> asyncio.Future[Any]:
        """Send ``body`` now, after everything submitted before it, without waiting (and never
        again): the future of its answer."""
        fut = self._new_future()
        self.transport.submit(body, fut, timeout_s)
        return fut

    # the calls that do not wait, for the producer and consumers that keep several in flight
    def produce_into(self, queue: str, partition: int, batch: bytes, sink: Sink) -> None:
        """Send a batch now, after everything submitted before it, without waiting, and hand
        its outcome to ``sink`` (``set_result(ProduceResult)`` or ``set_exception``), called
        on the event loop as the answer is read: the asyncio producer's way, without a
        future and the turn of the loop its done-callback would take."""
        self.transport.submit(m.ProduceRequest(queue, partition, batch), sink)

    # push streams (headwater.client.aio.subscriber drives them)
    async def open_push_stream(self, spec: PushStreamSpec, handler: PushHandler) -> tuple[int, SubscriberInfo]:
        """Open a push stream: its id and the subscriber as it starts. ``handler`` gets each
        PUSH body on the event loop, and None once if the connection is lost."""
        return await self.transport.open_stream(lambda sid: m.SubscribeRequest.opening(sid, spec), handler)

    async def close_push_stream(self, stream_id: int) -> None:
        """Stop routing the stream's pushes here and ask the broker to end it."""
        self.transport.unregister_push(stream_id)
        if not self._closed:
            try:
                await self.transport.call(m.UnsubscribeRequest(stream_id))
            except (UnavailableError, ClosedError):
                pass  # the connection is gone, and the stream with it

    @takes_request("shared_receive")
    def start_shared_receive(self, request: m.SharedReceiveRequest) -> asyncio.Future[SharedDeliveries]:
        """Send SHARED_RECEIVE (BrokerService.shared_receive's arguments) without waiting:
        the future of its answer; :meth:`withdraw` takes it back while it is not written yet
        (see ``RemoteService.start_shared_receive``)."""
        return self._submit(request, answer_timeout_s(self.transport, request))

    async def ping(self) -> None:
        await self._call(m.PingRequest())

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self.transport.close()
        await asyncio.sleep(0)  # let the socket's close callbacks run before the loop may end


class _AppendWaiters:
    """Long-polling fetches parked until their partition grows past an offset.

    ``notify`` runs in whichever thread appended; it crosses into the loop only when someone
    waits on that partition (a dict lookup otherwise), as the server's waiters do.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
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

    def notify(self, queue: str, partition: int, end_offset: int) -> None:
        if (queue, partition) in self._waiting:
            try:
                self._loop.call_soon_threadsafe(self._wake, queue, partition, end_offset)
            except RuntimeError:  # the loop is closed: nobody is left to wake
                pass

    def _wake(self, queue: str, partition: int, end_offset: int) -> None:
        for offset, fut in self._waiting.get((queue, partition), ()):
            if end_offset > offset and not fut.done():
                fut.set_result(None)

    def wake_all(self) -> None:
        for lst in self._waiting.values():
            for _, fut in lst:
                if not fut.done():
                    fut.set_result(None)


@define_calls("_run_request")
class ThreadedService(AsyncBrokerService):
    """A synchronous BrokerService in this process, awaitable: each call runs in a thread
    (the methods not written out here are made from ``API_SPECS`` by
    :func:`~headwater.client.transport.remote.define_calls`; a caller's lists and mappings are
    copied, since other tasks run while the thread reads them).

    ``subscribe_appends(fn)``, when given, registers ``fn(queue, partition, end_offset)`` to
    be called after every append; long-polling fetches then wait on the event loop. Without
    it they poll the service, holding a thread at most ``FETCH_WAIT_SLICE_MS`` at a time.
    """

    def __init__(
        self,
        service: BrokerService,
        *,
        subscribe_appends: Callable[[Callable[[str, int, int], None]], None] | None = None,
    ) -> None:
        self.service = service
        self._subscribe = subscribe_appends
        self._waiters: _AppendWaiters | None = None
        self._closed = False

    async def _run(self, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        if self._closed:
            raise ClosedError("this client is closed")
        return await asyncio.to_thread(fn, *args, **kw)

    async def _run_request(self, request: m.RequestBody) -> Any:
        """The service's method of ``request``'s operation, called with its fields, in a thread."""
        args, kwargs = call_arguments(request)
        return await self._run(getattr(self.service, m.API_SPECS[request.api].method), *args, **kwargs)

    # the long polls: each holds a thread a slice at a time, or waits on the loop; each takes
    # BrokerService's arguments (takes_request) and reads them from the request they make
    @takes_request("shared_receive")
    async def shared_receive(self, r: m.SharedReceiveRequest) -> SharedDeliveries:
        return await self._in_slices(self.service.shared_receive, r, lambda res: bool(res.leases))

    @takes_request("keyed_fetch")
    async def keyed_fetch(self, r: m.KeyedFetchRequest) -> KeyedFetchResult:
        def answers(res: KeyedFetchResult) -> bool:
            stopped = res.stop_offset is not None and r.offset >= res.stop_offset
            return bool(res.batches) or res.next_offset != r.offset or stopped

        return await self._in_slices(self.service.keyed_fetch, r, answers)

    @takes_request("fetch")
    async def fetch(self, r: m.FetchRequest) -> FetchResult:
        queue, partition, offset, end_offset = r.queue, r.partition, r.offset, r.end_offset
        if not r.max_wait_ms or self._subscribe is None:
            return await self._in_slices(self.service.fetch, r, lambda res: _answers(res, offset, end_offset))
        args, kwargs = call_arguments(msgspec.structs.replace(r, max_wait_ms=0))
        fetch = functools.partial(self.service.fetch, *args, **kwargs)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + r.max_wait_ms / 1000
        waiters = self._append_waiters(loop)
        while True:
            # register before fetching, so an append landing in between is not missed
            woken = waiters.wait(queue, partition, offset)
            try:
                res = await self._run(fetch)
                remaining = deadline - loop.time()
                if _answers(res, offset, end_offset) or remaining <= 0:
                    return res
                try:  # asyncio.timeout: wait_for may swallow a cancellation on Python 3.11
                    async with asyncio.timeout(remaining):
                        await woken
                except TimeoutError:
                    pass
            finally:
                waiters.discard(queue, partition, woken)

    async def _in_slices(self, fn: Callable[..., Any], r: Any, answers: Callable[[Any], bool]) -> Any:
        """Call ``fn`` with the arguments of request ``r``, a long poll, holding a thread at
        most FETCH_WAIT_SLICE_MS at a time (the default executor has few threads), until a
        result ``answers`` or ``r.max_wait_ms`` has passed (a poll without a wait: once)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + r.max_wait_ms / 1000
        while True:
            remaining_ms = max(0, int((deadline - loop.time()) * 1000))
            args, kwargs = call_arguments(
                msgspec.structs.replace(r, max_wait_ms=min(remaining_ms, FETCH_WAIT_SLICE_MS))
            )
            res = await self._run(fn, *args, **kwargs)
            if answers(res) or remaining_ms <= FETCH_WAIT_SLICE_MS:
                return res

    def _append_waiters(self, loop: asyncio.AbstractEventLoop) -> _AppendWaiters:
        if self._waiters is None:
            self._waiters = _AppendWaiters(loop)
            assert self._subscribe is not None
            self._subscribe(self._waiters.notify)
        return self._waiters

    async def ping(self) -> None:
        if self._closed:
            raise ClosedError("this client is closed")

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._waiters is not None:
            self._waiters.wake_all()  # parked fetches end (with ClosedError)
        await asyncio.to_thread(self.service.close)


def _answers(res: FetchResult, offset: int, end_offset: int | None) -> bool:
    """Whether a fetch result is the answer (not "nothing yet, keep waiting")."""
    return bool(res.batches) or res.next_offset != offset or (end_offset is not None and offset >= end_offset)
