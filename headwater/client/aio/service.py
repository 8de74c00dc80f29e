"""The broker's operations, awaitable: what the asyncio client talks to.

:class:`AsyncBrokerService` is :class:`~headwater.model.service.BrokerService` with every
method a coroutine (same names, same arguments, same results). Two implementations:

- :class:`AsyncService`: a broker across the network, over one pipelined
  :class:`~headwater.client.transport.async_transport.AsyncTransport` (``headwater.aio.connect``). It mirrors
  :class:`~headwater.client.transport.remote.RemoteService` method by method, and sends a call again
  by the same rules (:class:`~headwater.client.transport.remote.Tries`): within one deadline, a
  request that never left is sent again, one written before its connection was lost only
  if doing it twice is the same as once, and one that got no answer in time never.
- :class:`ThreadedService`: a synchronous service in this process (the embedded broker of
  ``headwater.aio.open``). Its calls may block on fsync, so each runs in a thread
  (``asyncio.to_thread``); the event loop never blocks. A long-polling fetch does not park a
  thread: it waits on the loop for an append notification, as the network server does.

Both are used from one event loop.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import Any, Protocol

from headwater.client.transport.async_transport import AsyncTransport
from headwater.client.transport.remote import Tries, check_arguments, define_calls
from headwater.errors import ClosedError, UnavailableError
from headwater.model.config import QueueConfig, QueueInfo
from headwater.model.delay import DelayStats
from headwater.model.groups import GroupAssignment, GroupDescription, GroupSummary
from headwater.model.keyed import KeyedFetchResult, KeyedGroupInfo
from headwater.model.service import BrokerService, FetchResult, ProduceResult
from headwater.model.shared import LeaseRefusal, SharedDeliveries, SharedGroupInfo
from headwater.model.subscription import SubscriberInfo
from headwater.protocol import messages as m

__all__ = ["AsyncBrokerService", "AsyncService", "ThreadedService"]

#: How long one blocking fetch may hold a thread when the service cannot notify appends.
FETCH_WAIT_SLICE_MS = 100


class AsyncBrokerService(Protocol):
    """:class:`~headwater.model.service.BrokerService`, awaitable."""

    async def create_queue(self, name: str, config: QueueConfig) -> QueueInfo: ...
    async def describe_queue(self, name: str) -> QueueInfo: ...
    async def list_queues(self) -> list[QueueInfo]: ...
    async def delete_queue(self, name: str) -> None: ...
    async def truncate_queue(self, name: str) -> QueueInfo: ...
    async def set_queue_enabled(self, name: str, enabled: bool) -> QueueInfo: ...
    async def add_partitions(self, name: str, partitions: int) -> QueueInfo: ...
    async def produce(self, queue: str, partition: int, batch: bytes) -> ProduceResult: ...
    async def fetch(
        self,
        queue: str,
        partition: int,
        offset: int,
        *,
        max_bytes: int,
        tag_mask: int = 0,
        end_offset: int | None = None,
        max_wait_ms: int = 0,
    ) -> FetchResult: ...
    async def lookup_id(self, queue_id: int, partition: int, offset: int) -> tuple[str, bytes]: ...
    async def lookup_key(
        self, queue: str, key: bytes, start_ms: int | None, end_ms: int | None, limit: int
    ) -> list[bytes]: ...
    async def offset_for_time(self, queue: str, partition: int, timestamp_ms: int) -> int: ...
    async def commit_offsets(
        self,
        group: str,
        queue: str,
        offsets: dict[int, int],
        member_id: str | None = None,
        generation: int | None = None,
    ) -> None: ...
    async def fetch_offsets(self, group: str, queue: str) -> dict[int, int]: ...
    async def join_group(
        self,
        group: str,
        member_id: str | None,
        client_id: str,
        queues: list[str],
        mode: str,
        strategy: str,
        session_timeout_ms: int,
    ) -> GroupAssignment: ...
    async def heartbeat_group(self, group: str, member_id: str, generation: int) -> GroupAssignment: ...
    async def leave_group(self, group: str, member_id: str) -> None: ...
    async def describe_group(self, group: str) -> GroupDescription: ...
    async def list_groups(self) -> list[GroupSummary]: ...
    async def shared_receive(
        self,
        group: str,
        queue: str,
        member: str,
        max_messages: int = 32,
        visibility_timeout_ms: int = 30_000,
        at_most_once: bool = False,
        settings: dict[str, int | float] | None = None,
        max_wait_ms: int = 0,
    ) -> SharedDeliveries: ...
    async def shared_ack(self, group: str, queue: str, member: str, lease_ids: list[str]) -> list[LeaseRefusal]: ...
    async def shared_nack(
        self, group: str, queue: str, member: str, lease_ids: list[str], reason: str = "", delay_ms: int | None = None
    ) -> list[LeaseRefusal]: ...
    async def shared_extend(
        self, group: str, queue: str, member: str, lease_ids: list[str], visibility_timeout_ms: int
    ) -> list[LeaseRefusal]: ...
    async def shared_describe(self, group: str, queue: str) -> SharedGroupInfo: ...
    async def cancel_delayed(self, queue_id: int, partition: int, offset: int) -> None: ...
    async def delay_stats(self) -> DelayStats: ...
    async def keyed_group(
        self, queue: str, group: str, key: str | None = None, size: int | None = None, start: str = "earliest"
    ) -> KeyedGroupInfo: ...
    async def keyed_fetch(
        self,
        queue: str,
        group: str,
        member: int,
        generation: int,
        partition: int,
        offset: int,
        *,
        max_bytes: int,
        max_wait_ms: int = 0,
    ) -> KeyedFetchResult: ...
    async def keyed_commit(
        self, queue: str, group: str, member: int, generation: int, offsets: dict[int, int]
    ) -> KeyedGroupInfo: ...
    async def keyed_resize(self, queue: str, group: str, size: int) -> KeyedGroupInfo: ...
    async def add_subscriber(
        self,
        queue: str,
        name: str,
        partitions: list[int] | None = None,
        tags: list[str] | None = None,
        start: str = "latest",
    ) -> SubscriberInfo: ...
    async def delete_subscriber(self, queue: str, name: str) -> None: ...
    async def list_subscribers(self, queue: str | None = None) -> list[SubscriberInfo]: ...
    async def describe_subscriber(self, queue: str, name: str) -> SubscriberInfo: ...
    async def checkpoint_subscriber(self, queue: str, name: str, offsets: dict[int, int]) -> None: ...
    async def status(self) -> dict[str, object]: ...
    async def ping(self) -> None: ...
    async def close(self) -> None: ...


@define_calls("return await self._call({request})", is_async=True)
class AsyncService(AsyncBrokerService):
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
                error = tries.after(e, sent.written, self._closed)
                if error is e:
                    raise
                if error is not None:
                    raise error from e

    def _submit(self, body: m.RequestBody, timeout_s: float | None = None) -> asyncio.Future[Any]:
        """Send ``body`` now, after everything submitted before it, without waiting (and never
        again): the future of its answer."""
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.transport.submit(body, fut, timeout_s)
        return fut

    # the calls that do not wait, for the producer and consumers that keep several in flight
    def produce_nowait(self, queue: str, partition: int, batch: bytes) -> asyncio.Future[ProduceResult]:
        """Send a batch now, after everything submitted before it, without waiting; the
        future holds the ProduceResult (the asyncio producer pipelines with it)."""
        return self._submit(m.ProduceRequest(queue, partition, batch))

    # fetch streams (the asyncio consumer drives them; see headwater.client.transport.fetch_stream)
    def open_fetch_stream(
        self,
        queue: str,
        positions: dict[int, int],
        handler: Any,
        *,
        credit_bytes: int,
        tag_mask: int = 0,
        push_bytes_max: int = 1 << 20,
    ) -> tuple[int, asyncio.Future[None]]:
        """Start opening a fetch stream over ``positions`` (``{partition: offset}``) of
        ``queue``, without waiting: the stream's id and the future of the broker's answer.
        ``handler`` gets each PUSH body on the event loop, and None once if the connection is
        lost."""
        answer: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        sid = self.transport.start_stream(
            lambda sid: m.FetchStreamRequest(sid, queue, dict(positions), credit_bytes, tag_mask, push_bytes_max),
            handler,
            answer,
        )
        return sid, answer

    def credit_fetch_stream(self, stream_id: int, credit_bytes: int) -> asyncio.Future[None]:
        """Let a fetch stream push ``credit_bytes`` more, without waiting."""
        return self._submit(m.StreamCreditRequest(stream_id, credit_bytes))

    def close_fetch_stream(self, stream_id: int) -> None:
        """Stop routing the stream's pushes here and ask the broker to end it, without waiting."""
        self.transport.unregister_push(stream_id)
        if self._closed:
            return
        fut = self._submit(m.CloseStreamRequest(stream_id))
        fut.add_done_callback(lambda f: f.cancelled() or f.exception())  # nothing worth waiting for

    # push streams (headwater.client.aio.subscriber drives them)
    async def open_push_stream(
        self,
        queue: str,
        name: str,
        handler: Callable[[m.PushBody | None], None],
        *,
        credit_messages: int,
        credit_bytes: int,
    ) -> tuple[int, SubscriberInfo]:
        """Open a push stream of subscriber ``name``: its id and the subscriber as it starts.
        ``handler`` gets each PUSH body on the event loop, and None once if the connection is
        lost."""
        return await self.transport.open_stream(
            lambda sid: m.SubscribeRequest(sid, queue, name, credit_messages, credit_bytes), handler
        )

    def ack_push_stream(
        self, stream_id: int, offsets: dict[int, int], credit_messages: int, credit_bytes: int
    ) -> asyncio.Future[None]:
        """Grant a stream more credit and checkpoint ``offsets`` (if any), without waiting."""
        return self._submit(m.SubscriptionAckRequest(stream_id, dict(offsets), credit_messages, credit_bytes))

    async def close_push_stream(self, stream_id: int) -> None:
        """Stop routing the stream's pushes here and ask the broker to end it."""
        self.transport.unregister_push(stream_id)
        if not self._closed:
            try:
                await self.transport.call(m.UnsubscribeRequest(stream_id))
            except (UnavailableError, ClosedError):
                pass  # the connection is gone, and the stream with it

    def start_shared_receive(
        self,
        group: str,
        queue: str,
        member: str,
        max_messages: int,
        visibility_timeout_ms: int,
        at_most_once: bool,
        settings: dict[str, int | float],
        max_wait_ms: int,
    ) -> asyncio.Future[SharedDeliveries]:
        """Send SHARED_RECEIVE without waiting: the future of its answer; :meth:`withdraw`
        takes it back while it is not written yet (see ``RemoteService.start_shared_receive``)."""
        return self._submit(
            m.SharedReceiveRequest(
                group,
                queue,
                member,
                max_messages,
                visibility_timeout_ms,
                at_most_once,
                dict(settings or {}),
                max_wait_ms,
            ),
            self.transport.request_timeout_s + max_wait_ms / 1000,
        )

    def withdraw(self, fut: asyncio.Future) -> bool:
        """Take back a request sent with a ``start_`` call if it is not written yet (True)."""
        return self.transport.withdraw(fut)

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


@define_calls("return await self._run(self.service.{method}, {args})", is_async=True)
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

    # the long polls: each holds a thread a slice at a time, or waits on the loop
    async def shared_receive(
        self,
        group: str,
        queue: str,
        member: str,
        max_messages: int = 32,
        visibility_timeout_ms: int = 30_000,
        at_most_once: bool = False,
        settings: dict[str, int | float] | None = None,
        max_wait_ms: int = 0,
    ) -> SharedDeliveries:
        # a long poll holds a thread at most FETCH_WAIT_SLICE_MS at a time, like fetch without
        # append notifications: the default executor has few threads
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max_wait_ms / 1000
        while True:
            remaining_ms = max(0, int((deadline - loop.time()) * 1000))
            res = await self._run(
                self.service.shared_receive,
                group,
                queue,
                member,
                max_messages,
                visibility_timeout_ms,
                at_most_once,
                settings,
                min(remaining_ms, FETCH_WAIT_SLICE_MS),
            )
            if res.leases or remaining_ms <= FETCH_WAIT_SLICE_MS:
                return res

    async def keyed_fetch(
        self,
        queue: str,
        group: str,
        member: int,
        generation: int,
        partition: int,
        offset: int,
        *,
        max_bytes: int,
        max_wait_ms: int = 0,
    ) -> KeyedFetchResult:
        # a long poll holds a thread at most FETCH_WAIT_SLICE_MS at a time
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max_wait_ms / 1000
        while True:
            remaining_ms = int((deadline - loop.time()) * 1000)
            res = await self._run(
                functools.partial(
                    self.service.keyed_fetch,
                    queue,
                    group,
                    member,
                    generation,
                    partition,
                    offset,
                    max_bytes=max_bytes,
                    max_wait_ms=max(0, min(remaining_ms, FETCH_WAIT_SLICE_MS)),
                )
            )
            stopped = res.stop_offset is not None and offset >= res.stop_offset
            if res.batches or res.next_offset != offset or stopped or remaining_ms <= FETCH_WAIT_SLICE_MS:
                return res

    async def fetch(
        self,
        queue: str,
        partition: int,
        offset: int,
        *,
        max_bytes: int,
        tag_mask: int = 0,
        end_offset: int | None = None,
        max_wait_ms: int = 0,
    ) -> FetchResult:
        fetch = functools.partial(
            self.service.fetch, queue, partition, offset, max_bytes=max_bytes, tag_mask=tag_mask, end_offset=end_offset
        )
        if not max_wait_ms:
            return await self._run(fetch)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max_wait_ms / 1000
        if self._subscribe is None:
            while True:
                remaining_ms = int((deadline - loop.time()) * 1000)
                res = await self._run(fetch, max_wait_ms=max(0, min(remaining_ms, FETCH_WAIT_SLICE_MS)))
                if _answers(res, offset, end_offset) or remaining_ms <= FETCH_WAIT_SLICE_MS:
                    return res
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
