"""Helpers for testing code that uses Headwater, without a data directory or a server.

>>> from headwater.testing import open_memory
>>> hw = open_memory()
>>> _ = hw.admin.create_queue("jobs", partitions=2)
>>> hw.send("jobs", b"work", key=b"a").offset
0
>>> hw.close()

The client is the same as ``headwater.open(path)``'s, over the same broker: only its store
keeps the queues in memory (:class:`~headwater.storage.memory.MemoryStore`, which passes
the same store tests as the data directory's). So code tested against it behaves the same
against a real broker, except for durability: nothing survives ``close()``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from headwater.broker import Broker
from headwater.client import Client
from headwater.storage.memory import MemoryStore
from headwater.testing.clock import FakeClock

if TYPE_CHECKING:
    from headwater.client.aio.client import AsyncClient

__all__ = ["FakeClock", "open_memory", "open_memory_async"]


def _memory_broker(clock: Callable[[], float]) -> Broker:
    """The real broker over a fresh store in memory, timed by ``clock``."""
    return Broker(MemoryStore(clock=clock))


def open_memory(*, clock: Callable[[], float] = time.time) -> Client:
    """A client over a fresh broker that keeps its queues in memory; close it when done.

    ``clock`` is the broker's wall clock (seconds since the epoch): pass a movable one to
    test TTL, delays and leases without waiting."""
    return Client(_memory_broker(clock))


def open_memory_async(*, clock: Callable[[], float] = time.time) -> AsyncClient:
    """An asyncio client (the :class:`~headwater.client.aio.client.AsyncClient` of
    ``headwater.aio``) over a fresh broker in memory: for testing asyncio code. A plain
    call, as nothing waits; close it with ``await hw.close()`` or ``async with``.

    >>> import asyncio
    >>> from headwater.testing import open_memory_async
    >>> async def main():
    ...     async with open_memory_async() as hw:
    ...         await hw.admin.create_queue("jobs")
    ...         return (await hw.send("jobs", b"work")).offset
    >>> asyncio.run(main())
    0
    """
    from headwater.client.aio.client import AsyncClient  # here: sync tests need not import the asyncio client
    from headwater.client.aio.service import ThreadedService

    broker = _memory_broker(clock)
    return AsyncClient(ThreadedService(broker, subscribe_appends=broker.add_append_listener))
