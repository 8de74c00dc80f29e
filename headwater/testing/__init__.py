"""Helpers for testing code that uses Headwater, without a data directory or a server.

>>> from headwater.testing import open_memory
>>> hw = open_memory()
>>> _ = hw.admin.create_queue("jobs", partitions=2)
>>> hw.send("jobs", b"work", key=b"a").offset
0

The in-memory broker passes the same contract tests as the real one (tests/test_queues.py
runs against both), so code tested against it behaves the same against a real broker,
except for durability: nothing survives ``close()``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from headwater.client import Client
from headwater.testing.clock import FakeClock
from headwater.testing.memory import MemoryBroker

if TYPE_CHECKING:
    from headwater.client.aio import AsyncClient

__all__ = ["FakeClock", "MemoryBroker", "open_memory", "open_memory_async"]


def open_memory(*, clock: Callable[[], float] = time.time) -> Client:
    """A client over a fresh in-memory broker (see :class:`MemoryBroker`)."""
    return Client(MemoryBroker(clock=clock))


def open_memory_async(*, clock: Callable[[], float] = time.time) -> AsyncClient:
    """An asyncio client (the :class:`~headwater.client.aio.AsyncClient` of
    ``headwater.aio``) over a fresh in-memory broker: for testing asyncio code. A plain
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
    from headwater.client.aio import AsyncClient  # here: sync tests need not import the asyncio client
    from headwater.client.aio_service import ThreadedService

    broker = MemoryBroker(clock=clock)
    return AsyncClient(ThreadedService(broker, subscribe_appends=broker.add_append_listener))
