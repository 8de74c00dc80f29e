"""Headwater for asyncio: the shape of :mod:`headwater`, with coroutines where it waits.

``await connect("host:port")`` and ``await open(path)`` return an :class:`AsyncClient` with
the names of :class:`headwater.Client`: ``admin``, ``producer()``, ``consumer()``,
``shared_consumer()``, ``keyed_consumer()``, ``subscribe()``, ``scanner()``, ``get``,
``find``, ``offset_for_time``, ``cancel``, ``delay_stats``, ``status``, ``send``,
``send_batch``, ``close``. Errors are the classes of :mod:`headwater.errors`.
The guide is ``docs/asyncio.md``.

>>> import asyncio, tempfile
>>> import headwater.aio
>>> async def main():
...     async with await headwater.aio.open(tempfile.mkdtemp()) as hw:
...         await hw.admin.create_queue("events", partitions=2)
...         await hw.send("events", b"hello", key=b"user-1", tag="greeting")
...         return [r.body async for r in hw.scanner("events", tags="greeting")]
>>> asyncio.run(main())
[b'hello']
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

from headwater.client.aio.client import AsyncAdmin, AsyncClient
from headwater.client.aio.consumer import AsyncConsumer
from headwater.client.aio.group_consumer import AsyncGroupConsumer
from headwater.client.aio.keyed_consumer import AsyncKeyedConsumer
from headwater.client.aio.producer import AsyncProducer
from headwater.client.aio.routing import open_async_service
from headwater.client.aio.scanner import AsyncScanner
from headwater.client.aio.service import ThreadedService
from headwater.client.aio.shared_consumer import AsyncSharedConsumer
from headwater.client.aio.subscriber import AsyncSubscriber
from headwater.storage import StoreConfig

__all__ = [
    "connect",
    "open",
    "AsyncAdmin",
    "AsyncClient",
    "AsyncConsumer",
    "AsyncGroupConsumer",
    "AsyncKeyedConsumer",
    "AsyncProducer",
    "AsyncScanner",
    "AsyncSharedConsumer",
    "AsyncSubscriber",
]


async def connect(
    address: str, *, connect_timeout_s: float = 10.0, request_timeout_s: float = 60.0, retries: int = 3
) -> AsyncClient:
    """Connect to a broker (``headwater serve``) at ``"host:port"``, or to a cluster through
    a bootstrap list ``"host1:port1,host2:port2,..."`` (the first that answers says where
    each partition's leader is; docs/cluster.md, "Clients").

    Raises :class:`~headwater.errors.UnavailableError` if nothing answers within
    ``connect_timeout_s``. ``request_timeout_s`` bounds each call, its tries included.
    ``retries``: how often a call whose connection was lost is sent again once it is back,
    if that is safe (it never left, or repeating it changes nothing: docs/design/client.md,
    "What a blocking call sends again").
    """
    service = await open_async_service(
        address, connect_timeout_s=connect_timeout_s, request_timeout_s=request_timeout_s, retries=retries
    )
    return AsyncClient(service)


async def open(
    path: str | Path,
    config: StoreConfig | None = None,
    *,  # noqa: A001 - like headwater.open
    clock: Callable[[], float] = time.time,
    **settings,
) -> AsyncClient:
    """Open (or create) a data directory with an in-process broker, for asyncio code.

    The arguments are :func:`headwater.open`'s. The broker's calls can block (on fsync,
    on recovery when opening), so each runs in a worker thread and the event loop never
    blocks; consumers' long polls wait on the loop, not in threads.
    """
    import headwater

    client = await asyncio.to_thread(headwater.open, path, config, clock=clock, **settings)
    broker = client.service
    return AsyncClient(ThreadedService(broker, subscribe_appends=broker.add_append_listener))
