"""RemoteService: the BrokerService of a broker across the network, for synchronous code.

An event loop runs in a daemon thread and owns one :class:`AsyncTransport`; every method
submits its request to that loop and waits for the answer. Calls from many threads share
the connection and are pipelined. ``*_async`` variants return a
``concurrent.futures.Future`` instead of waiting, which is how the producer keeps several
batches in flight.

Reads and admin calls that fail because the connection was lost are retried once the
connection is back (they change nothing twice); appends are retried by the producer, whose
idempotent batches make a retry safe.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from typing import Any

from headwater.errors import UnavailableError
from headwater.model.config import QueueConfig, QueueInfo
from headwater.model.service import FetchResult, ProduceResult
from headwater.protocol import messages as m
from headwater.client.transport import AsyncTransport

__all__ = ["RemoteService", "new_event_loop"]


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's loop when installed (the ``server`` extra), else asyncio's."""
    try:
        import uvloop

        return uvloop.new_event_loop()
    except ImportError:
        return asyncio.new_event_loop()


class RemoteService:
    """A BrokerService over TCP. Thread-safe."""

    def __init__(self, address: str, *, connect_timeout_s: float = 10.0,
                 request_timeout_s: float = 60.0, retries: int = 3) -> None:
        self._loop = new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="headwater-client", daemon=True)
        self._thread.start()
        self.transport = AsyncTransport(address, connect_timeout_s=connect_timeout_s,
                                        request_timeout_s=request_timeout_s)
        self.address = self.transport.address
        self._retries = retries
        self._closed = False
        self._call(m.PingRequest())  # fail fast, with a clear error, if nobody is there

    def _submit(self, body: m.RequestBody, timeout_s: float | None = None) -> concurrent.futures.Future:
        return asyncio.run_coroutine_threadsafe(self.transport.call(body, timeout_s=timeout_s), self._loop)

    def _call(self, body: m.RequestBody, *, retry: bool = True, timeout_s: float | None = None) -> Any:
        attempts = self._retries if retry else 0
        while True:
            try:
                return self._submit(body, timeout_s).result()
            except UnavailableError:
                if attempts <= 0 or self._closed:
                    raise
                attempts -= 1

    # admin
    def create_queue(self, name: str, config: QueueConfig) -> QueueInfo:
        return self._call(m.CreateQueueRequest(name, config), retry=False)

    def describe_queue(self, name: str) -> QueueInfo:
        return self._call(m.DescribeQueueRequest(name))

    def list_queues(self) -> list[QueueInfo]:
        return self._call(m.ListQueuesRequest())

    def delete_queue(self, name: str) -> None:
        self._call(m.DeleteQueueRequest(name), retry=False)

    def truncate_queue(self, name: str) -> QueueInfo:
        return self._call(m.TruncateQueueRequest(name))

    def set_queue_enabled(self, name: str, enabled: bool) -> QueueInfo:
        return self._call(m.SetQueueEnabledRequest(name, enabled))

    def add_partitions(self, name: str, partitions: int) -> QueueInfo:
        return self._call(m.AddPartitionsRequest(name, partitions), retry=False)

    # data
    def produce(self, queue: str, partition: int, batch: bytes) -> ProduceResult:
        return self._call(m.ProduceRequest(queue, partition, batch), retry=False)

    def produce_async(self, queue: str, partition: int, batch: bytes) -> concurrent.futures.Future:
        """Send a batch without waiting; the future holds the ProduceResult."""
        return self._submit(m.ProduceRequest(queue, partition, batch))

    def fetch(self, queue: str, partition: int, offset: int, *, max_bytes: int, tag_mask: int = 0,
              end_offset: int | None = None, max_wait_ms: int = 0) -> FetchResult:
        timeout = None if not max_wait_ms else self.transport.request_timeout_s + max_wait_ms / 1000
        return self._call(m.FetchRequest(queue, partition, offset, max_bytes, tag_mask, end_offset,
                                          max_wait_ms), timeout_s=timeout)

    def lookup_id(self, queue_id: int, partition: int, offset: int) -> tuple[str, bytes]:
        return self._call(m.LookupIdRequest(queue_id, partition, offset))

    def lookup_key(self, queue: str, key: bytes, start_ms: int | None, end_ms: int | None,
                   limit: int) -> list[bytes]:
        return self._call(m.LookupKeyRequest(queue, key, start_ms, end_ms, limit))

    def offset_for_time(self, queue: str, partition: int, timestamp_ms: int) -> int:
        return self._call(m.OffsetForTimeRequest(queue, partition, timestamp_ms))

    def commit_offsets(self, group: str, queue: str, offsets: dict[int, int]) -> None:
        self._call(m.CommitOffsetsRequest(group, queue, dict(offsets)))

    def fetch_offsets(self, group: str, queue: str) -> dict[int, int]:
        return self._call(m.FetchOffsetsRequest(group, queue))

    def fetch_async(self, queue: str, partition: int, offset: int, *, max_bytes: int, tag_mask: int = 0,
                    end_offset: int | None = None, max_wait_ms: int = 0) -> concurrent.futures.Future:
        """Fetch without waiting; the future holds the FetchResult."""
        timeout = self.transport.request_timeout_s + max_wait_ms / 1000
        return self._submit(m.FetchRequest(queue, partition, offset, max_bytes, tag_mask, end_offset,
                                           max_wait_ms), timeout)

    def status(self) -> dict[str, object]:
        return self._call(m.StatusRequest())

    def ping(self) -> None:
        self._call(m.PingRequest())

    async def _shutdown(self) -> None:
        """Close the transport, then cancel and await every task left on the loop, so none
        is destroyed while pending when the loop stops."""
        await self.transport.close()
        me = asyncio.current_task()
        rest = [t for t in asyncio.all_tasks() if t is not me]
        for t in rest:
            t.cancel()
        await asyncio.gather(*rest, return_exceptions=True)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        fut = asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop)
        try:
            fut.result(timeout=5)
        except Exception:  # noqa: BLE001 - closing: nothing left to tell anyone
            pass
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._loop.close()
