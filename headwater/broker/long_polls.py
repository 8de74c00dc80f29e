"""The long polls of keyed and shared group members, served off the request path.

A keyed member's fetch and a shared member's receive run the broker's call on a worker
thread (filtering, leasing), and while they find nothing wait on the event loop, without a
thread, for what could change that: an append to the partition (keyed), a change of the
shared queue (an append, an ack, a lease's end), up to the request's ``max_wait_ms`` (at
most ``fetch_wait_ms_max``) or until the server stops. Plain fetches park without a task
(:class:`~headwater.broker.server.BrokerServer`); these need the worker's answer first.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from headwater.broker.append_waiters import AppendWaiters
from headwater.broker.broker import Broker
from headwater.broker.connection import ClientConnection
from headwater.broker.server_config import ServerConfig
from headwater.broker.shared import SharedWaiters
from headwater.model.shared import SharedDeliveries
from headwater.protocol.messages import (
    KeyedFetchRequest,
    KeyedFetchResponse,
    SharedReceiveRequest,
    SharedReceiveResponse,
)

__all__ = ["GroupLongPolls"]


class GroupLongPolls:
    """KEYED_FETCH and SHARED_RECEIVE for a server: its broker, worker pool, waiters and
    limits; ``stopping()`` says the server is stopping (a poll then answers what it has)."""

    def __init__(
        self,
        broker: Broker,
        pool: ThreadPoolExecutor,
        appends: AppendWaiters,
        shared: SharedWaiters,
        config: ServerConfig,
        stopping: Callable[[], bool],
    ) -> None:
        self.broker = broker
        self._pool = pool
        self._appends, self._shared = appends, shared
        self._config = config
        self._stopping = stopping

    async def keyed_fetch(self, req: KeyedFetchRequest) -> KeyedFetchResponse:
        """A keyed member's fetch (filtering runs in a worker); when nothing is there, park on
        the loop until an append to the partition or ``max_wait_ms`` passes."""
        loop = asyncio.get_running_loop()
        deadline = time.monotonic() + min(max(req.max_wait_ms, 0), self._config.fetch_wait_ms_max) / 1000
        want = max(1, min(req.max_bytes, self._config.fetch_bytes_max))
        while True:
            fut = self._appends.wait(req.queue, req.partition, req.offset)  # before reading: no lost wake
            try:
                res = await loop.run_in_executor(
                    self._pool,
                    functools.partial(
                        self.broker.keyed_fetch,
                        req.queue,
                        req.group,
                        req.member,
                        req.generation,
                        req.partition,
                        req.offset,
                        max_bytes=want,
                    ),
                )
                remaining = deadline - time.monotonic()
                if (
                    res.batches
                    or res.next_offset != req.offset
                    or remaining <= 0
                    or self._stopping()
                    or (res.stop_offset is not None and req.offset >= res.stop_offset)
                ):
                    return KeyedFetchResponse.from_result(res)
                try:
                    await asyncio.wait_for(fut, remaining)
                except TimeoutError:
                    pass
            finally:
                self._appends.discard(req.queue, req.partition, fut)

    async def shared_receive(self, req: SharedReceiveRequest, st: ClientConnection) -> SharedReceiveResponse:
        """A shared receive; when nothing can be leased, park on the loop (no thread held)
        until an append or an ack on the queue, a lease expiry or backoff end, or
        ``max_wait_ms``. Once its peer has closed the connection it leases nothing more:
        nobody would read the answer, and its messages would wait out their leases (a
        client of a cluster leaves a receive parked at every leader when one answers)."""
        loop = asyncio.get_running_loop()
        deadline = time.monotonic() + min(max(req.max_wait_ms, 0), self._config.fetch_wait_ms_max) / 1000
        while True:
            if st.eof or st.closing:
                return SharedReceiveResponse.from_result(SharedDeliveries([], []))
            woken = self._shared.wait(req.queue)  # before trying: a change in between wakes it
            try:
                res, hint_ms = await loop.run_in_executor(
                    self._pool,
                    self.broker.shared_receive_now,
                    req.group,
                    req.queue,
                    req.member,
                    req.max_messages,
                    req.visibility_timeout_ms,
                    req.at_most_once,
                    req.settings,
                )
                remaining = deadline - time.monotonic()
                if res.leases or remaining <= 0 or self._stopping():
                    return SharedReceiveResponse.from_result(res)
                timeout = remaining if hint_ms is None else min(remaining, hint_ms / 1000)
                try:
                    await asyncio.wait_for(woken, timeout)
                except TimeoutError:
                    pass
            finally:
                self._shared.discard(req.queue, woken)
