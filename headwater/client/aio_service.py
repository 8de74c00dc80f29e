"""The broker's operations, awaitable: what the asyncio client talks to.

:class:`AsyncBrokerService` is :class:`~headwater.model.service.BrokerService` with every
method a coroutine (same names, same arguments, same results). Two implementations:

- :class:`AsyncService`: a broker across the network, over one pipelined
  :class:`~headwater.client.transport.AsyncTransport` (``headwater.aio.connect``). It mirrors
  :class:`~headwater.client.remote.RemoteService` method by method: reads and admin calls
  that lose the connection are retried once it is back; appends are retried by the producer,
  whose idempotent batches make that safe.
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

from headwater.errors import ClosedError, UnavailableError
from headwater.model.config import QueueConfig, QueueInfo
from headwater.model.service import BrokerService, FetchResult, ProduceResult
from headwater.protocol import messages as m
from headwater.client.transport import AsyncTransport

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
    async def fetch(self, queue: str, partition: int, offset: int, *, max_bytes: int, tag_mask: int = 0,
                    end_offset: int | None = None, max_wait_ms: int = 0) -> FetchResult: ...
    async def lookup_id(self, queue_id: int, partition: int, offset: int) -> tuple[str, bytes]: ...
    async def lookup_key(self, queue: str, key: bytes, start_ms: int | None, end_ms: int | None,
                         limit: int) -> list[bytes]: ...
    async def offset_for_time(self, queue: str, partition: int, timestamp_ms: int) -> int: ...
    async def commit_offsets(self, group: str, queue: str, offsets: dict[int, int]) -> None: ...
    async def fetch_offsets(self, group: str, queue: str) -> dict[int, int]: ...
    async def status(self) -> dict[str, object]: ...
    async def ping(self) -> None: ...
    async def close(self) -> None: ...


class AsyncService:
    """A broker over TCP, awaitable. ``retries``: how often a read or admin call that lost
    its connection is sent again (the transport reconnects, with backoff)."""

    def __init__(self, transport: AsyncTransport, *, retries: int = 3) -> None:
        self.transport = transport
        self.address = transport.address
        self._retries = retries
        self._closed = False

    async def _call(self, body: m.RequestBody, *, retry: bool = True, timeout_s: float | None = None) -> Any:
        attempts = self._retries if retry else 0
        while True:
            try:
                return await self.transport.call(body, timeout_s=timeout_s)
            except UnavailableError:
                if attempts <= 0 or self._closed:
                    raise
                attempts -= 1

    # admin
    async def create_queue(self, name: str, config: QueueConfig) -> QueueInfo:
        return await self._call(m.CreateQueueRequest(name, config), retry=False)

    async def describe_queue(self, name: str) -> QueueInfo:
        return await self._call(m.DescribeQueueRequest(name))

    async def list_queues(self) -> list[QueueInfo]:
        return await self._call(m.ListQueuesRequest())

    async def delete_queue(self, name: str) -> None:
        await self._call(m.DeleteQueueRequest(name), retry=False)

    async def truncate_queue(self, name: str) -> QueueInfo:
        return await self._call(m.TruncateQueueRequest(name))

    async def set_queue_enabled(self, name: str, enabled: bool) -> QueueInfo:
        return await self._call(m.SetQueueEnabledRequest(name, enabled))

    async def add_partitions(self, name: str, partitions: int) -> QueueInfo:
        return await self._call(m.AddPartitionsRequest(name, partitions), retry=False)

    # data
    async def produce(self, queue: str, partition: int, batch: bytes) -> ProduceResult:
        return await self._call(m.ProduceRequest(queue, partition, batch), retry=False)

    async def fetch(self, queue: str, partition: int, offset: int, *, max_bytes: int, tag_mask: int = 0,
                    end_offset: int | None = None, max_wait_ms: int = 0) -> FetchResult:
        # a long poll may rightly take max_wait_ms longer than any other request
        timeout = None if not max_wait_ms else self.transport.request_timeout_s + max_wait_ms / 1000
        return await self._call(m.FetchRequest(queue, partition, offset, max_bytes, tag_mask, end_offset,
                                               max_wait_ms), timeout_s=timeout)

    async def lookup_id(self, queue_id: int, partition: int, offset: int) -> tuple[str, bytes]:
        return await self._call(m.LookupIdRequest(queue_id, partition, offset))

    async def lookup_key(self, queue: str, key: bytes, start_ms: int | None, end_ms: int | None,
                         limit: int) -> list[bytes]:
        return await self._call(m.LookupKeyRequest(queue, key, start_ms, end_ms, limit))

    async def offset_for_time(self, queue: str, partition: int, timestamp_ms: int) -> int:
        return await self._call(m.OffsetForTimeRequest(queue, partition, timestamp_ms))

    async def commit_offsets(self, group: str, queue: str, offsets: dict[int, int]) -> None:
        await self._call(m.CommitOffsetsRequest(group, queue, dict(offsets)))

    async def fetch_offsets(self, group: str, queue: str) -> dict[int, int]:
        return await self._call(m.FetchOffsetsRequest(group, queue))

    async def status(self) -> dict[str, object]:
        return await self._call(m.StatusRequest())

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


class ThreadedService:
    """A synchronous BrokerService in this process, awaitable: each call runs in a thread.

    ``subscribe_appends(fn)``, when given, registers ``fn(queue, partition, end_offset)`` to
    be called after every append; long-polling fetches then wait on the event loop. Without
    it they poll the service, holding a thread at most ``FETCH_WAIT_SLICE_MS`` at a time.
    """

    def __init__(self, service: BrokerService, *,
                 subscribe_appends: Callable[[Callable[[str, int, int], None]], None] | None = None) -> None:
        self.service = service
        self._subscribe = subscribe_appends
        self._waiters: _AppendWaiters | None = None
        self._closed = False

    async def _run(self, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        if self._closed:
            raise ClosedError("this client is closed")
        return await asyncio.to_thread(fn, *args, **kw)

    # admin
    async def create_queue(self, name: str, config: QueueConfig) -> QueueInfo:
        return await self._run(self.service.create_queue, name, config)

    async def describe_queue(self, name: str) -> QueueInfo:
        return await self._run(self.service.describe_queue, name)

    async def list_queues(self) -> list[QueueInfo]:
        return await self._run(self.service.list_queues)

    async def delete_queue(self, name: str) -> None:
        await self._run(self.service.delete_queue, name)

    async def truncate_queue(self, name: str) -> QueueInfo:
        return await self._run(self.service.truncate_queue, name)

    async def set_queue_enabled(self, name: str, enabled: bool) -> QueueInfo:
        return await self._run(self.service.set_queue_enabled, name, enabled)

    async def add_partitions(self, name: str, partitions: int) -> QueueInfo:
        return await self._run(self.service.add_partitions, name, partitions)

    # data
    async def produce(self, queue: str, partition: int, batch: bytes) -> ProduceResult:
        return await self._run(self.service.produce, queue, partition, batch)

    async def lookup_id(self, queue_id: int, partition: int, offset: int) -> tuple[str, bytes]:
        return await self._run(self.service.lookup_id, queue_id, partition, offset)

    async def lookup_key(self, queue: str, key: bytes, start_ms: int | None, end_ms: int | None,
                         limit: int) -> list[bytes]:
        return await self._run(self.service.lookup_key, queue, key, start_ms, end_ms, limit)

    async def offset_for_time(self, queue: str, partition: int, timestamp_ms: int) -> int:
        return await self._run(self.service.offset_for_time, queue, partition, timestamp_ms)

    async def commit_offsets(self, group: str, queue: str, offsets: dict[int, int]) -> None:
        await self._run(self.service.commit_offsets, group, queue, dict(offsets))

    async def fetch_offsets(self, group: str, queue: str) -> dict[int, int]:
        return await self._run(self.service.fetch_offsets, group, queue)

    async def status(self) -> dict[str, object]:
        return await self._run(self.service.status)

    async def fetch(self, queue: str, partition: int, offset: int, *, max_bytes: int, tag_mask: int = 0,
                    end_offset: int | None = None, max_wait_ms: int = 0) -> FetchResult:
        fetch = functools.partial(self.service.fetch, queue, partition, offset, max_bytes=max_bytes,
                                  tag_mask=tag_mask, end_offset=end_offset)
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
                try:
                    await asyncio.wait_for(woken, remaining)
                except asyncio.TimeoutError:
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
